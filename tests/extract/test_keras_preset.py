"""A KerasNLP/KerasHub preset (`GemmaCausalLM.from_preset("gemma_2b_en")` then `fit`) is a Keras
model, not a transformers one: the file is answered with one finding on the line that loads it,
saying so, never with a size guessed from a PyTorch model."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmmem.check import check_text

SCRIPT = """\
import keras
import {package}

model = {package}.models.GemmaCausalLM.from_preset("gemma_2b_en")
model.backbone.enable_lora(rank=4)
model.compile(optimizer=keras.optimizers.AdamW(5e-5))
model.fit(data, epochs=1, batch_size=1)
"""


@pytest.mark.parametrize("package", ["keras_nlp", "keras_hub"])
def test_a_keras_preset_is_said_to_be_keras_where_it_is_loaded(
    tmp_path: Path, package: str
) -> None:
    path = tmp_path / "train.py"
    text = SCRIPT.format(package=package)
    checked = check_text(path, text)
    assert checked.analysis.budget is None
    found = [f for f in checked.findings if f.code == "LLM010"]
    assert len(found) == 1
    assert "is a Keras model" in found[0].message and "gemma_2b_en" in found[0].message
    assert found[0].range is not None and found[0].range.start_line == 3  # 0-based: line 4


def test_a_from_preset_of_another_library_is_not_called_keras(tmp_path: Path) -> None:
    text = "from mylib import Model\nmodel = Model.from_preset('x')\nmodel.fit(data)\n"
    checked = check_text(tmp_path / "train.py", text)
    assert all("Keras" not in f.message for f in checked.findings)

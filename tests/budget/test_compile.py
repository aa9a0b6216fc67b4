"""torch.compile: the band's bracket, and a compiled step on the CPU that lands inside it.

The estimate keeps the eager step and the band reaches down to the step under gradient
checkpointing. The reason is what AOTAutograd's partitioner does: it recomputes cheap ops in
backward rather than save their outputs, so a compiled step saves no more than eager and
no less than the blocks' inputs. Measured for real (inductor on the CPU, torch 2.13).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from compile_saved import measure  # noqa: E402


def test_a_compiled_step_saves_between_checkpointing_and_eager() -> None:
    got = measure("llama", 2, 128)
    assert got["checkpointed"] < got["compiled"] <= got["eager"]


def test_the_band_reaches_down_to_the_checkpointed_step(
    lora_8b_json: Callable[..., dict[str, Any]],
) -> None:
    eager = lora_8b_json()
    compiled = lora_8b_json("--compile")
    checkpointed = lora_8b_json("--grad-ckpt")
    assert compiled["device_total_bytes"] == eager["device_total_bytes"]
    assert compiled["band_high_bytes"] == eager["band_high_bytes"]
    low_ratio = eager["band_low_bytes"] / eager["device_total_bytes"]
    expected = checkpointed["device_total_bytes"] * low_ratio
    assert compiled["band_low_bytes"] == pytest.approx(expected, rel=0.001)
    assert "torch.compile" in compiled["band_basis"]


def test_under_checkpointing_compile_moves_nothing(
    lora_8b_json: Callable[..., dict[str, Any]],
) -> None:
    plain = lora_8b_json("--grad-ckpt")
    compiled = lora_8b_json("--grad-ckpt", "--compile")
    assert compiled["band_low_bytes"] == plain["band_low_bytes"]
    assert compiled["device_total_bytes"] == plain["device_total_bytes"]


def test_a_script_that_compiles_says_so(tmp_path: Path) -> None:
    from llmmem.extract import extract_plan
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.spec import ModelSource
    from llmmem.scenario import setup_from_plan
    from llmmem.verify.grid import config_for

    script = tmp_path / "train.py"
    script.write_text(
        "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
        "model = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')\n"
        "args = TrainingArguments(output_dir='o', torch_compile=True)\n"
        "Trainer(model=model, args=args).train()\n",
        encoding="utf-8",
    )
    spec = spec_from_config(config_for("qwen2", "small"), model_id="q", source=ModelSource.LOCAL)
    assert setup_from_plan(extract_plan(script), spec).compile

"""The project's seed example: the HF "model memory anatomy" page (bert-large-uncased under
`AutoModelForSequenceClassification`, batch 4, fp32, the Trainer's defaults, a V100-16GB),
written as the page writes it in tests/fixtures/seed/, with the releases it ran beside it
(requirements.txt: transformers 4.15.0, torch 1.10.1+cu111). The page measured 14,949 MB on the
device (pynvml, MiB) after the training run. Each value llmmem reads is labelled with where it
came from, and the releases' own defaults apply: transformers' AdamW, eager attention, every
CUDA kernel loaded at start, BERT's 512 positions for a length the file does not state."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmmem.cli import main

SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed"
MEASURED = 14_949 * 2**20


def test_the_seed_example_within_10_percent_of_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("model_memory_anatomy.py", "requirements.txt"):
        shutil.copy(SEED / name, tmp_path / name)
    code = main(
        [
            "explain",
            str(tmp_path / "model_memory_anatomy.py"),
            "--gpu",
            "V100-16GB",
            "--format",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    budget = report["budget"]
    assert budget["model"]["architecture"] == "BertForSequenceClassification"
    error = (budget["device_total_bytes"] - MEASURED) / MEASURED
    assert abs(error) <= 0.10, error
    plan = report["plan"]
    # every value labelled with where it came from
    assert plan["per_device_train_batch_size"]["source"] == "explicit"
    assert plan["optim"]["value"] == "adamw_hf" and "4.15" in plan["optim"]["note"]
    assert plan["attn_implementation"]["value"] == "eager"
    assert plan["max_seq_length"]["value"] == 512
    notes = " ".join(budget["notes"])
    assert "CUDA kernels load eagerly" in notes
    # no vocabulary logits for a classifier: a head of 2 outputs
    assert budget["components"].get("logits", 0) < 2**20


def test_todays_releases_keep_todays_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(SEED / "model_memory_anatomy.py", tmp_path / "train.py")
    (tmp_path / "requirements.txt").write_text("transformers==5.24.0\ntorch==2.13.0\n")
    code = main(["explain", str(tmp_path / "train.py"), "--gpu", "V100-16GB", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["plan"]["optim"]["value"] == "adamw_torch_fused"
    assert report["plan"]["attn_implementation"]["value"] == "sdpa"

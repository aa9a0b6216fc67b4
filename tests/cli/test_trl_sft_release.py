"""A TRL SFTTrainer script, and `llmmem estimate --framework trl`, sized as the TRL release they
run: the release pinned beside the script (or given with --versions) picks the step
(llmmem.budget.stacks.trl). The installed commands run in a subprocess, each in a workspace of
its own with no environment beside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

GiB = 2**30

SFT_SCRIPT = """\
import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", dtype=torch.bfloat16)
args = SFTConfig(output_dir="out", per_device_train_batch_size=2, max_length=2048,
                 gradient_checkpointing=True, bf16=True)
trainer = SFTTrainer(model=model, args=args, train_dataset=load_dataset("trl-lib/Capybara"),
                     peft_config=LoraConfig(r=16, target_modules="all-linear"))
trainer.train()
"""

TRAINER_SCRIPT = """\
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", dtype=torch.bfloat16)
model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2,
                         gradient_checkpointing=True, bf16=True)
Trainer(model=model, args=args, train_dataset=rows_of_2048_tokens).train()
"""


def llmmem(*args: str, cwd: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "LLMMEM_RUN_ENV"}
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", *args, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def explain(tmp_path: Path, script: str, trl: str | None) -> dict[str, Any]:
    folder = tmp_path / (trl or "no-trl")
    (folder / ".git").mkdir(parents=True)
    (folder / "train.py").write_text(script)
    if trl is not None:
        (folder / "requirements.txt").write_text(f"trl=={trl}\n")
    budget: dict[str, Any] = llmmem("explain", "train.py", cwd=folder)["budget"]
    return budget


def test_an_sft_trainer_script_is_sized_as_the_trl_release_it_runs(tmp_path: Path) -> None:
    """Llama-3.1-8B LoRA, 2 × 2048, bf16: with TRL 1.16 pinned the loss is TRL's fused LM
    head (no 128,256-wide logits), GiBs under 1.14's step, whose SFTTrainer takes its metrics
    after the loss beside the fp32 logits; 0.29.1's does too."""
    at_116 = explain(tmp_path, SFT_SCRIPT, "1.16.0")
    at_114 = explain(tmp_path, SFT_SCRIPT, "1.14.0")
    at_029 = explain(tmp_path, SFT_SCRIPT, "0.29.1")
    assert any("from TRL's fused LM head" in note for note in at_116["notes"])
    assert at_114["allocated_peak_bytes"] - at_116["allocated_peak_bytes"] > 4.5 * GiB
    metrics = "after forward: the trainer's metrics on the outputs"
    assert at_114["phases"]["forward"]["moment"] == metrics
    assert at_029["phases"]["forward"]["moment"] == metrics
    assert at_116["phases"]["forward"]["moment"] == "end of forward, loss computed"
    # still the HF Trainer's calibration class
    assert at_116["band_basis"].startswith("hf lora")


def test_a_plain_trainer_beside_trl_is_not_sized_as_sft_trainer(tmp_path: Path) -> None:
    without = explain(tmp_path, TRAINER_SCRIPT, None)
    beside = explain(tmp_path, TRAINER_SCRIPT, "1.16.0")
    assert beside["allocated_peak_bytes"] == without["allocated_peak_bytes"]
    assert not any("fused LM head" in note for note in beside["notes"])


def test_estimate_framework_trl_takes_the_release_it_is_given(tmp_path: Path) -> None:
    args = ["estimate", "--offline", "--model", "meta-llama/Llama-3.1-8B", "--method", "lora"]
    args += ["--batch", "2", "--seq", "2048", "--grad-ckpt", "--framework", "trl"]
    at_116 = llmmem(*args, "--versions", "trl=1.16", cwd=tmp_path)
    at_114 = llmmem(*args, "--versions", "trl=1.14", cwd=tmp_path)
    assert at_116["setup"]["values"]["framework"] == "trl"
    assert at_114["allocated_peak_bytes"] - at_116["allocated_peak_bytes"] > 4.5 * GiB
    # a preference objective is TRL's own trainer, sized by its own budget, not SFTTrainer's
    dpo = llmmem(*args, "--versions", "trl=1.16", "--objective", "dpo", cwd=tmp_path)
    assert dpo["setup"]["values"]["framework"] == "hf"

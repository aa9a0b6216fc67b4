"""The common HF LoRA step: Llama-3.2-1B loaded with `torch_dtype=torch.bfloat16`, LoRA r=16 on
q, k, v and o, the Trainer's `bf16=True` (accelerate runs forward under bf16 autocast over the
bf16 weights), AdamW, no checkpointing.

A real CPU step, the simulated step and the estimate of the same script, each through the
installed command a user runs. The model keeps every proportion of Llama-3.2-1B (MLP 4× the
hidden size, a vocabulary 62.6× it, four query heads per K/V head of 64, tied embeddings, llama3
rotary scaling) at an eighth of its widths and half its depth, with 4 × 128 tokens: a real CPU
step in seconds, where the blocks still weigh what they weigh at full size against the logits
and the weights. (At full widths, fewer layers and a short sequence, the embedding and the logits
hide what the blocks keep: the estimate's error below shrinks to 0.5%.)

What the steps hold was settled on the full model (4 × 1024 tokens) with real CPU steps at 2 and
4 layers: equal to the simulated step to the byte, 503,193,632 B per block; the estimate's block
is 50,790,432 B short (6.05·N·h): peft's lora.Linear casts its bf16 input to the adapters' fp32
and autocast casts that back to bf16 for lora_A, one copy kept per adapter, where the estimate
shares the block's input between the three adapters of q, k, v and takes o's input for the
attention output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmmem.models.catalog import catalog_entry

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}
PHASES = ("forward", "backward", "optimizer_step")

SCRIPT = """\
import torch
from datasets import load_dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./llama-3.2-1b-narrow", torch_dtype=torch.bfloat16)
model = get_peft_model(
    model,
    LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, bf16=True, max_steps=10)
tokenizer = AutoTokenizer.from_pretrained("meta-llama/Llama-3.2-1B")
data = load_dataset("json", data_files="train.jsonl")["train"].map(
    lambda x: tokenizer(x["text"], truncation=True, max_length=128, padding="max_length")
)
Trainer(model=model, args=args, train_dataset=data).train()
"""


def narrow_config() -> dict[str, Any]:
    """Llama-3.2-1B's config at an eighth of its widths and half its depth."""
    entry = catalog_entry("meta-llama/Llama-3.2-1B")
    assert entry is not None
    config = dict(entry.config)
    config.update(
        hidden_size=2048 // 8,
        intermediate_size=8192 // 8,
        num_attention_heads=32 // 8,
        num_key_value_heads=8 // 8,
        vocab_size=128256 // 8,
        num_hidden_layers=16 // 2,
        bos_token_id=1,
        eos_token_id=2,
    )
    return config


def run(project: Path, *args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "llmmem", *args, "train.py", "--format", "json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The real CPU step, the simulated step and the estimate of one script."""
    project = tmp_path_factory.mktemp("bf16_autocast_lora")
    (project / ".git").mkdir()
    model = project / "llama-3.2-1b-narrow"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(narrow_config()))
    (project / "train.py").write_text(SCRIPT)
    return {
        "real": run(project, "verify", "--device", "cpu"),
        "simulated": run(project, "verify", "--simulate"),
        "estimate": run(project, "explain"),
    }


def phase_peaks(report: dict[str, Any]) -> dict[str, int]:
    if "measurement" in report:
        return {p["phase"]: p["peak_bytes"] for p in report["measurement"]["phases"]}
    return {name: p["allocated_bytes"] for name, p in report["budget"]["phases"].items()}


def test_the_script_is_read_as_bf16_weights_under_autocast(
    steps: dict[str, dict[str, Any]],
) -> None:
    plan = steps["estimate"]["plan"]
    assert plan["precision"]["value"] == "bf16-autocast"
    assert steps["real"]["measurement"]["device_name"] == "cpu"
    assert steps["simulated"]["measurement"]["device_name"].startswith("simulated")


def test_the_simulated_step_holds_what_the_real_cpu_step_holds(
    steps: dict[str, dict[str, Any]],
) -> None:
    real, simulated = phase_peaks(steps["real"]), phase_peaks(steps["simulated"])
    assert set(real) == set(simulated) == set(PHASES)
    for phase in PHASES:
        assert abs(simulated[phase] - real[phase]) <= 0.01 * real[phase], phase
    real_step, simulated_step = steps["real"]["measurement"], steps["simulated"]["measurement"]
    for held in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes"):
        assert simulated_step[held] == real_step[held], held


def test_the_estimate_is_within_2_percent_of_the_real_step(
    steps: dict[str, dict[str, Any]],
) -> None:
    real, predicted = phase_peaks(steps["real"]), phase_peaks(steps["estimate"])
    errors = {phase: (predicted[phase] - real[phase]) / real[phase] for phase in PHASES}
    assert all(abs(error) <= 0.02 for error in errors.values()), errors

"""ms-swift command lines and unsloth scripts reach their own stacks through `llmmem explain`,
as a user runs it: what each reader reads changes the budget where the framework's code does
(budget.stacks.swift, budget.stacks.unsloth)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SWIFT = """swift sft \\
    --model Qwen/Qwen2.5-7B-Instruct \\
    --torch_dtype bfloat16 \\
    --quant_method bnb --quant_bits 4 \\
    --per_device_train_batch_size 2 --max_length 2048{extra}
"""

UNSLOTH = """from unsloth import FastLanguageModel
from trl import SFTConfig, SFTTrainer

model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="unsloth/Llama-3.2-1B-bnb-4bit", max_seq_length=2048, load_in_4bit=True,
)
model = FastLanguageModel.get_peft_model(model, r=16{checkpointing})
args = SFTConfig(output_dir="out", per_device_train_batch_size=2, max_length=2048)
trainer = SFTTrainer(model=model, tokenizer=tokenizer, args=args)
trainer.train()
"""


def explain(folder: Path, name: str, text: str) -> dict[str, Any]:
    (folder / ".git").mkdir(exist_ok=True)
    (folder / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", "--format", "json", str(folder / name)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        cwd=folder,
    )
    assert done.returncode in (0, 1), done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def stack_note(report: dict[str, Any], start: str) -> str:
    notes = [note for note in report["budget"]["notes"] if note.startswith(start)]
    assert notes, report["budget"]["notes"]
    return str(notes[0])


def test_a_swift_qlora_line_is_swifts_stack(tmp_path: Path) -> None:
    report = explain(tmp_path, "run.sh", SWIFT.format(extra=""))
    assert report["plan"]["framework"] == "swift"
    note = stack_note(report, "ms-swift 4.6.0's stack")
    assert "no k-bit preparation" in note
    assert "fp32 adapters" in note
    # transformers 5 would checkpoint non-reentrant; swift's rule on one process: reentrant
    assert "reentrant checkpointing" in note and "non-reentrant" not in note


def test_swift_lora_dtype_and_checkpointing_kwargs_are_read(tmp_path: Path) -> None:
    fp32 = explain(tmp_path, "run.sh", SWIFT.format(extra=""))
    extra = " \\\n    --lora_dtype bfloat16"
    extra += " --gradient_checkpointing_kwargs '{\"use_reentrant\": false}'"
    bf16 = explain(tmp_path, "run.sh", SWIFT.format(extra=extra))
    note = stack_note(bf16, "ms-swift 4.6.0's stack")
    assert "bf16 adapters" in note and "non-reentrant checkpointing" in note
    # the adapters' weights, gradients and AdamW states in half the bytes
    fp32_weights = fp32["budget"]["components"]["weights"]
    assert bf16["budget"]["components"]["weights"] < fp32_weights
    # float16 adapters are trained in fp32 (swift's fp16 fix)
    half = explain(tmp_path, "run.sh", SWIFT.format(extra=" --lora_dtype float16"))
    assert "fp32 adapters" in stack_note(half, "ms-swift 4.6.0's stack")


def test_swift_bad_values_are_said_in_one_line(tmp_path: Path) -> None:
    extra = " --lora_dtype int4 --gradient_checkpointing_kwargs '{use_reentrant'"
    report = explain(tmp_path, "run.sh", SWIFT.format(extra=extra))
    problems = report["problems"]
    assert any("lora_dtype must be one of float16, bfloat16, float32" in p for p in problems)
    assert any("gradient_checkpointing_kwargs must be a JSON object" in p for p in problems)


def test_an_unsloth_script_is_unsloths_stack(tmp_path: Path) -> None:
    offloaded = explain(tmp_path, "train.py", UNSLOTH.format(checkpointing=""))
    note = stack_note(offloaded, "unsloth 2026.10.9's stack")
    assert "unmeasured here" in note
    assert "offloaded checkpointing" in note and "fused cross-entropy" in note
    assert "no k-bit preparation" in note
    # use_gradient_checkpointing=True is transformers' checkpointing: every layer input stays
    kept = explain(
        tmp_path, "train.py", UNSLOTH.format(checkpointing=", use_gradient_checkpointing=True")
    )
    assert "offloaded checkpointing" not in stack_note(kept, "unsloth 2026.10.9's stack")
    assert offloaded["budget"]["allocated_peak_bytes"] < kept["budget"]["allocated_peak_bytes"]

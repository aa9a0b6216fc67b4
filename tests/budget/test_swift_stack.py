"""ms-swift's optimizer, as bench/swift_steps.py measured its own `swift sft` step: swift sets no
`optim`, so HF's TrainingArguments default steps (adamw_torch_fused from transformers 4.54 with
torch 2.8: no parameter-sized temporary in the step). A `swift sft` line read as foreach AdamW
sized full fine-tuning's optimizer step 25% over swift's measured one (34.39 MiB against
27.52 MiB for the bench's tiny Llama, bf16).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swift_lines import TINY_LLAMA, llmmem

LINE = (
    "swift sft --model {model} --tuner_type full --torch_dtype bfloat16 --dataset train.jsonl "
    "--max_length 256 --per_device_train_batch_size 2 --gradient_accumulation_steps 1\n"
)


def project(tmp_path: Path, requirements: str = "") -> Path:
    (tmp_path / ".git").mkdir()
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**TINY_LLAMA, "torch_dtype": "bfloat16"}))
    (tmp_path / "train.sh").write_text(LINE.format(model=model))
    if requirements:
        (tmp_path / "requirements.txt").write_text(requirements)
    return tmp_path


def optimizer_step(report: dict[str, Any]) -> int:
    phases = report["budget"]["phases"] if "budget" in report else report["phases"]
    step: int = phases["optimizer_step"]["allocated_bytes"]
    return step


def test_a_swift_sft_line_steps_fused_adamw_as_swift_does(tmp_path: Path) -> None:
    folder = project(tmp_path, "ms-swift==4.6.0\ntransformers==5.19.0\ntorch==2.13.0\n")
    read = llmmem(folder, "explain", "train.sh")
    assert read["plan"]["optim"]["value"] == "adamw_torch_fused"
    flags = llmmem(
        folder,
        "estimate",
        "--model", str(folder / "tiny-llama"), "--framework", "swift", "--method", "full",
        "--precision", "bf16-autocast", "--batch", "2", "--seq", "256", "--grad-ckpt",
        "--optim", "adamw_torch_fused", "--offline",
    )  # fmt: skip
    # the bench's full bf16 cases: swift's optimizer step 27.52 MiB, the budget 27.51 MiB
    assert optimizer_step(read) == optimizer_step(flags)
    assert abs(optimizer_step(read) / 2**20 - 27.52) < 0.05


def test_before_fused_adamw_was_the_default_the_line_steps_foreach(tmp_path: Path) -> None:
    """transformers 4.46's TrainingArguments default is torch's foreach AdamW: the same line
    there holds a parameter-sized temporary more in the step."""
    old = llmmem(project(tmp_path, "transformers==4.46.0\ntorch==2.5.1\n"), "explain", "train.sh")
    assert old["plan"]["optim"]["value"] == "adamw_torch"
    assert abs(optimizer_step(old) / 2**20 - 27.52) > 3


def test_a_line_without_torch_dtype_trains_the_checkpoints_bf16_under_autocast(
    tmp_path: Path,
) -> None:
    """Without --torch_dtype ms-swift loads the checkpoint's dtype (bfloat16 here) and turns on
    bf16 mixed precision for it (ModelArguments._init_mixed_precision): the same budget as the
    line that names --torch_dtype bfloat16, not an fp32 model's."""
    folder = project(tmp_path, "ms-swift==4.6.0\ntransformers==5.19.0\ntorch==2.13.0\n")
    named = llmmem(folder, "explain", "train.sh")
    (folder / "train.sh").write_text(
        LINE.format(model=folder / "tiny-llama").replace(" --torch_dtype bfloat16", "")
    )
    unnamed = llmmem(folder, "explain", "train.sh")
    assert unnamed["budget"]["allocated_peak_bytes"] == named["budget"]["allocated_peak_bytes"]
    assert any("ms-swift loads the checkpoint's bfloat16" in n for n in unnamed["budget"]["notes"])

"""ms-swift's QLoRA (`--quant_method bnb --quant_bits 4`), as bench/swift_steps.py measured its
own `swift sft` step on the CPU (ms-swift 4.6.0, bitsandbytes 0.50.2, a tiny Llama, 2 x 256
tokens, checkpointing): swift computes a float32 checkpoint's 4-bit layers in fp32 and leaves
the head in fp32 (no k-bit preparation), and under fp16 autocast the head's matmul keeps a
16-bit cast of it until the head's backward. swift's step peaked at 33.16 MiB in forward; the
budget without that cast read 31.49 MiB (-5.0%).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swift_lines import TINY_LLAMA, llmmem

MIB = 2**20
# swift's own step, bench/swift_steps.py `qlora fp16 ckpt` and `qlora bf16 ckpt`: forward peak
MEASURED_FP32_CHECKPOINT = 33.16 * MIB
MEASURED_BF16_CHECKPOINT = 26.37 * MIB
HEAD_CAST = 2 * 4096 * 256  # V x h, 16 bits
LINE = (
    "swift sft --model {model} --dataset train.jsonl --tuner_type lora --torch_dtype float32 "
    "--max_length 256 --per_device_train_batch_size 2 --gradient_accumulation_steps 1 "
    "--gradient_checkpointing true --quant_method bnb --quant_bits 4\n"
)


def model(tmp_path: Path, dtype: str) -> Path:
    folder = tmp_path / f"tiny-llama-{dtype}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "torch_dtype": dtype}))
    return folder


def estimate(tmp_path: Path, dtype: str, precision: str, compute: str) -> dict[str, Any]:
    return llmmem(
        tmp_path,
        "estimate",
        "--model", str(model(tmp_path, dtype)), "--framework", "swift", "--method", "qlora",
        "--quant", "nf4", "--double-quant", "--quant-compute-dtype", compute,
        "--precision", precision, "--batch", "2", "--seq", "256", "--grad-ckpt",
        "--grad-accum", "1",  # as measured (ms-swift's own default would be 8 here)
        "--lora-r", "8", "--lora-alpha", "32", "--lora-targets", "all-linear",
        "--lora-dropout", "0.05", "--optim", "adamw_torch_fused", "--offline",
        "--versions", "transformers=5.19,torch=2.13,bitsandbytes=0.50.2",
    )  # fmt: skip


def forward(report: dict[str, Any]) -> dict[str, Any]:
    phases = report["budget"]["phases"] if "budget" in report else report["phases"]
    phase: dict[str, Any] = phases["forward"]
    return phase


def test_an_fp32_checkpoint_keeps_autocasts_cast_of_its_fp32_head(tmp_path: Path) -> None:
    report = estimate(tmp_path, "float32", "fp16", "fp32")
    phase = forward(report)
    assert phase["components"]["weight_copies"] >= HEAD_CAST
    assert abs(phase["allocated_bytes"] / MEASURED_FP32_CHECKPOINT - 1) < 0.02


def test_a_bf16_checkpoint_has_a_bf16_head_and_no_cast_of_it(tmp_path: Path) -> None:
    report = estimate(tmp_path, "bfloat16", "bf16-autocast", "bf16")
    phase = forward(report)
    assert phase["components"]["weight_copies"] < HEAD_CAST
    assert abs(phase["allocated_bytes"] / MEASURED_BF16_CHECKPOINT - 1) < 0.03


def test_the_swift_sft_line_of_an_fp32_checkpoint_counts_the_cast(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    folder = model(tmp_path, "float32")
    (tmp_path / "train.sh").write_text(LINE.format(model=folder))
    phase = forward(llmmem(tmp_path, "explain", "train.sh"))
    assert phase["components"]["weight_copies"] >= HEAD_CAST
    assert abs(phase["allocated_bytes"] / MEASURED_FP32_CHECKPOINT - 1) < 0.02


def test_a_swift_qlora_line_computes_in_its_model_dtype(tmp_path: Path) -> None:
    """swift takes bnb_4bit_compute_dtype from --torch_dtype (quant_args.py:116-121 in 4.6.0):
    bfloat16 computes in bfloat16, float16 in float32; a line that says nothing is read so,
    not with BitsAndBytesConfig's float32 default (which sized a bf16 line's step 67% over)."""
    from llmmem.extract import extract_plan
    from llmmem.scenario import analyze

    line = (
        "swift sft --model Qwen/Qwen2.5-0.5B-Instruct --quant_method bnb --quant_bits 4 "
        "--torch_dtype {dtype} --dataset d.jsonl --max_length 512{extra}\n"
    )
    peaks = {}
    for name, dtype, extra in (
        ("bf16", "bfloat16", ""),
        ("bf16 said", "bfloat16", " --bnb_4bit_compute_dtype bfloat16"),
        ("fp16", "float16", ""),
    ):
        script = tmp_path / f"{name.replace(' ', '_')}.sh"
        script.write_text(line.format(dtype=dtype, extra=extra))
        plan = extract_plan(script)
        assert plan.quantization is not None
        want = "float32" if dtype == "float16" else "bfloat16"
        assert plan.quantization.compute_dtype.value == want, name
        analysis = analyze(plan)
        assert analysis.budget is not None, analysis.problems
        peaks[name] = analysis.budget.allocated_peak_bytes
    assert peaks["bf16"] == peaks["bf16 said"]

"""FP8 training as a user asks for it: `--fp8 torchao` and accelerate's `mixed_precision: fp8`
with `fp8_config.backend: AO`. torchao's float8 Linears (torchao 0.18.0) keep no 16-bit copies
of the blocks' weights under autocast, only one matmul's float8 operands at a time; the head
stays a plain Linear with autocast's copy. TransformerEngine is refused (or said to be sized as
bf16 from a file), as is a GPU without FP8 tensor cores. CUDA-only: not measured here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmmem.cli import main

LLAMA = ("--model", "meta-llama/Llama-3.1-8B", "--seq", "2048", "--batch", "2", "--grad-ckpt")
# Llama-3.1-8B: 32 blocks of q, k, v, o (4096² + 2·4096·1024 + 4096²) and gate, up, down
# (3·4096·14336); the head 128256 × 4096
BLOCK_LINEARS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
HEAD = 128256 * 4096


def estimate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["estimate", "--offline", "--format", "json", "--gpu", "H100-80GB", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def copies_in_forward(report: dict[str, Any]) -> int:
    return int(report["phases"]["forward"]["components"].get("weight_copies", 0))


def test_torchao_float8_drops_autocasts_copies_of_the_blocks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bf16 = estimate(capsys, *LLAMA)
    fp8 = estimate(capsys, *LLAMA, "--fp8", "torchao")
    assert fp8["setup"]["values"]["float8"] is True
    # autocast's bf16 copies of the blocks' weights are gone; the head's copy stays, with one
    # Linear's float8 operands (at most the MLP's 4096 × 14336 weight and 4096 tokens' input)
    largest = 4096 * 14336 + 2 * 2048 * 14336 + 4096 * 14336 + 2 * 2048 * 4096
    assert copies_in_forward(fp8) <= 2 * HEAD + largest
    assert copies_in_forward(bf16) >= 2 * HEAD + 2 * BLOCK_LINEARS  # every Linear's, in forward
    assert (
        fp8["phases"]["forward"]["allocated_bytes"] < bf16["phases"]["forward"]["allocated_bytes"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--fp8", "te"), "TransformerEngine"),
        (("--fp8", "torchao", "--method", "lora"), "full fine-tuning"),
        (("--fp8", "torchao", "--gpu", "A100-80GB"), "no FP8 tensor cores"),
    ],
)
def test_fp8_that_is_not_sized_is_refused(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    code = main(["estimate", "--offline", "--model", "meta-llama/Llama-3.1-8B", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


SCRIPT = """\
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=torch.float32)
args = TrainingArguments(
    output_dir="o", per_device_train_batch_size=4, gradient_checkpointing=True, bf16=True
)
Trainer(model=model, args=args).train()
"""
CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: NO
mixed_precision: fp8
fp8_config:
  backend: {backend}
num_processes: 1
"""


def test_accelerates_fp8_config_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    launcher = tmp_path / "run.sh"
    launcher.write_text("accelerate launch --config_file fp8.yaml train.py\n")
    forward = {}
    for backend in ("AO", "TE"):
        (tmp_path / "fp8.yaml").write_text(CONFIG.format(backend=backend))
        code = main(["explain", str(launcher), "--format", "json", "--gpu", "H100-80GB"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0
        forward[backend] = report["budget"]["phases"]["forward"]["components"].get(
            "weight_copies", 0
        )
        said = [p for p in report["problems"] if "TE backend is not sized" in p]
        assert bool(said) == (backend == "TE"), report["problems"]
    # Llama-3.2-1B: 16 blocks of 2048-wide q, o, 512-wide k, v and 8192-wide MLP; under TE's
    # "sized as bf16" autocast keeps a bf16 copy of each, under torchao none
    blocks = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)
    assert forward["TE"] - forward["AO"] > blocks

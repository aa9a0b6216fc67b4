"""FP8 training as a user asks for it: `--fp8 torchao|te` and accelerate's `mixed_precision: fp8`
with `fp8_config.backend: AO|TE`. torchao's float8 Linears (torchao 0.18.0) keep no 16-bit copies
of the blocks' weights under autocast, only one matmul's float8 operands at a time; the head
stays a plain Linear with autocast's copy. TransformerEngine's te.Linear (accelerate 1.15.0's
convert_model, transformer_engine 2.20.2) is sized from a flag and from a file alike; what it
does not size is refused with the reason, as is a GPU without FP8 tensor cores. CUDA-only: not
measured here."""

from __future__ import annotations

import json
import subprocess
import sys
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


def llmmem(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = Path(sys.executable).with_name("llmmem")
    return subprocess.run(
        [str(command), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--gpu", "A100-80GB"),
            "llmmem: error: --fp8 te: A100-80GB has no FP8 tensor cores (float8 matmuls need "
            "compute capability 8.9 or newer: Ada, Hopper, Blackwell)",
        ),
        (("--gpu", "V100-32GB"), "--fp8 te: V100-32GB has no FP8 tensor cores"),
        (("--method", "lora"), "--fp8 te: FP8 training is sized for full fine-tuning"),
        (("--grad-ckpt",), "TransformerEngine's FP8: gradient checkpointing is not sized"),
        (
            ("--model", "meta-llama/Llama-3.2-1B"),
            "TransformerEngine's FP8: a tied LM head is not sized",
        ),
    ],
)
def test_te_that_is_not_sized_is_refused_in_one_line(args: tuple[str, ...], message: str) -> None:
    done = llmmem(
        "estimate", "--offline", "--model", "meta-llama/Llama-3.1-8B", "--fp8", "te", *args
    )
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and not done.stdout


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
        said = [
            p
            for p in report["problems"]
            if "TE backend (gradient checkpointing is not sized" in p
            and p.endswith("is not sized: the step is sized as bf16 autocast")
        ]
        assert bool(said) == (backend == "TE"), report["problems"]
    # Llama-3.2-1B: 16 blocks of 2048-wide q, o, 512-wide k, v and 8192-wide MLP; TE under
    # checkpointing is not sized, so the step is bf16's: autocast keeps a bf16 copy of each,
    # under torchao none
    blocks = 16 * (2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192)
    assert forward["TE"] - forward["AO"] > blocks


TE_SCRIPT = """\
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.float32)
args = TrainingArguments(output_dir="o", per_device_train_batch_size=2, bf16=True)
Trainer(model=model, args=args).train()
"""
NO_BACKEND = """\
compute_environment: LOCAL_MACHINE
distributed_type: NO
mixed_precision: fp8
num_processes: 1
"""


def explain_launcher(tmp_path: Path, config: str) -> dict[str, Any]:
    (tmp_path / "train.py").write_text(TE_SCRIPT)
    (tmp_path / "fp8.yaml").write_text(config)
    (tmp_path / "run.sh").write_text("accelerate launch --config_file fp8.yaml train.py\n")
    done = llmmem("explain", "run.sh", "--format", "json", "--gpu", "H100-80GB", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_accelerates_te_backend_reaches_the_budget_of_fp8_te(tmp_path: Path) -> None:
    """Llama-3.1-8B (its head untied, every Linear dividing by 16), no checkpointing: the file's
    TE backend and `estimate --fp8 te` at the file's settings give the same budget, phase by
    phase and term by term, and the breakdown names TransformerEngine's code it is read in."""
    report = explain_launcher(tmp_path, CONFIG.format(backend="TE"))
    assert report["problems"] == []
    seq = report["plan"]["max_seq_length"]["value"]
    done = llmmem(
        "estimate", "--offline", "--format", "json", "--gpu", "H100-80GB",
        "--model", "meta-llama/Llama-3.1-8B", "--batch", "2", "--seq", str(seq),
        "--fp8", "te",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    flag = json.loads(done.stdout)
    assert flag["setup"]["values"]["float8_te"] is True
    budget = report["budget"]
    assert budget["allocated_peak_bytes"] == flag["allocated_peak_bytes"]
    assert budget["peak_moment"] == flag["peak_moment"]
    for phase, parts in flag["phases"].items():
        assert budget["phases"][phase]["components"] == parts["components"], phase
    copies = budget["formulas"]["weight_copies"]
    assert copies.startswith("TransformerEngine FP8 (transformer_engine 2.20.2")
    assert "unmeasured: needs CUDA" in copies and "module/linear.py:575, :729" in copies


def test_fp8_without_a_backend_is_torchaos_as_accelerate_picks_it(tmp_path: Path) -> None:
    """accelerate 1.15.0 with no fp8_config.backend (ACCELERATE_FP8_BACKEND unset) takes
    torchao where it is installed: the budget is the AO backend's."""
    default = explain_launcher(tmp_path, NO_BACKEND)
    ao = explain_launcher(tmp_path, CONFIG.format(backend="AO"))
    te = explain_launcher(tmp_path, CONFIG.format(backend="TE"))
    assert default["problems"] == [] and ao["problems"] == []
    assert default["budget"]["phases"] == ao["budget"]["phases"] != te["budget"]["phases"]

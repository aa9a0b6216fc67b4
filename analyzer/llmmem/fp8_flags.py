"""The estimate flag of FP8 training: `--fp8 torchao` (torchao's float8 Linears,
llmmem.budget.float8) and `--fp8 te` (TransformerEngine's te.Linear as accelerate converts the
model, llmmem.budget.float8_te). Either is refused, in one line, on a GPU without FP8 tensor
cores, and under LoRA or k-bit weights."""

from __future__ import annotations

import argparse
from dataclasses import replace

from llmmem.budget.result import GpuTarget
from llmmem.budget.setup import Method, SetupError, TrainingSetup
from llmmem.errors import UsageError


def add_fp8_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fp8",
        choices=["torchao", "te"],
        default=None,
        help="FP8 training: torchao's float8 Linears in the blocks (convert_to_float8_training, "
        "accelerate's fp8 with the AO backend); te: TransformerEngine's te.Linear in place of "
        "every nn.Linear that divides by 16 (accelerate's fp8 with the TE backend; unmeasured: "
        "needs CUDA)",
    )


def fp8_from_args(
    args: argparse.Namespace, setup: TrainingSetup, gpu: GpuTarget | None, prov: dict[str, str]
) -> TrainingSetup:
    choice = getattr(args, "fp8", None)
    if choice is None:
        return setup
    if setup.method is not Method.FULL:
        raise UsageError(
            f"--fp8 {choice}: FP8 training is sized for full fine-tuning, not LoRA or QLoRA"
        )
    if gpu is not None:
        from llmmem.gpus import find_gpu

        try:
            known = find_gpu(gpu.name)
        except ValueError:
            known = None
        # a capacity given as a number has no architecture to check
        if known is not None and known.compute_capability is not None and not known.fp8:
            raise UsageError(
                f"--fp8 {choice}: {gpu.name} has no FP8 tensor cores (float8 matmuls need compute "
                "capability 8.9 or newer: Ada, Hopper, Blackwell)"
            )
    try:
        local = (
            replace(setup, float8=True) if choice == "torchao" else replace(setup, float8_te=True)
        )
    except SetupError as err:
        raise UsageError(f"--fp8 {choice}: {err}") from None
    prov["fp8"] = "flag"
    return local

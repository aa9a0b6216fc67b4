"""The estimate flag of FP8 training: `--fp8 torchao` (torchao's float8 Linears,
llmmem.budget.float8). `--fp8 te` (TransformerEngine) is refused with the reason: its cached
FP8 weights and FP8 saved inputs are not sized."""

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
        "accelerate's fp8 with the AO backend); te (TransformerEngine) is not sized",
    )


def fp8_from_args(
    args: argparse.Namespace, setup: TrainingSetup, gpu: GpuTarget | None, prov: dict[str, str]
) -> TrainingSetup:
    choice = getattr(args, "fp8", None)
    if choice is None:
        return setup
    if choice == "te":
        raise UsageError(
            "--fp8 te: TransformerEngine's FP8 is not sized (te.Linear caches FP8 copies of the "
            "weights between micro-batches and saves FP8 inputs for backward); --fp8 torchao is"
        )
    if setup.method is not Method.FULL:
        raise UsageError("--fp8: float8 training is sized for full fine-tuning, not LoRA or QLoRA")
    if gpu is not None:
        from llmmem.gpus import find_gpu

        try:
            known = find_gpu(gpu.name)
        except ValueError:
            known = None
        # a capacity given as a number has no architecture to check
        if known is not None and known.compute_capability is not None and not known.fp8:
            raise UsageError(
                f"--fp8: {gpu.name} has no FP8 tensor cores (float8 matmuls need compute "
                "capability 8.9 or newer: Ada, Hopper, Blackwell)"
            )
    try:
        local = replace(setup, float8=True)
    except SetupError as err:
        raise UsageError(f"--fp8: {err}") from None
    prov["fp8"] = "flag"
    return local

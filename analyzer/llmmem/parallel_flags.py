"""The estimate flags of parallelism beyond data parallelism: context parallelism (`--cp N`,
`--cp-scheme ring|ulysses`).

They become the setup's `DistributedSetup.cp_size` and `cp_scheme` (llmmem.budget.setup); the
budget's context-parallel rules are in llmmem.budget.context_parallel. Where the budget does
not model a flag's combination (a preference or RL objective, generation) the flag is
refused: an accepted flag that changes nothing would be a lie."""

from __future__ import annotations

import argparse
from dataclasses import replace

from llmmem.budget.setup import ContextParallel, Mode, SetupError, TrainingSetup
from llmmem.errors import UsageError

SUPERVISED = (None, "sft")


def _group(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text[:24]}'") from None
    if not 1 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"expected 1 to 4096 ranks, got {value}")
    return value


def add_parallel_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("context parallelism")
    group.add_argument(
        "--cp",
        type=_group,
        default=None,
        metavar="N",
        help="divide each sequence over N ranks (accelerate's ParallelismConfig cp_size, "
        "DeepSpeed's sequence_parallel_size, axolotl's sequence_parallel_degree); part of "
        "--world-size (default: N)",
    )
    group.add_argument(
        "--cp-scheme",
        choices=[scheme.value for scheme in ContextParallel],
        default=None,
        help="ring: torch's context_parallel, keys and values all-gathered (accelerate's "
        "cp_size; the default); ring-flash-attn: passed rank to rank (axolotl's "
        "sequence_parallel_degree); ulysses: all-to-all to whole sequences of a share of the "
        "heads (DeepSpeed's sequence_parallel_size)",
    )


def parallel_from_args(
    args: argparse.Namespace, setup: TrainingSetup, prov: dict[str, str]
) -> TrainingSetup:
    """The setup with the context-parallel group the flags ask for."""
    cp = getattr(args, "cp", None)
    scheme = getattr(args, "cp_scheme", None)
    if cp is None:
        if scheme is not None:
            raise UsageError("--cp-scheme: give the group's size with --cp N")
        return setup
    objective = getattr(args, "objective", None)
    method = getattr(args, "method", None)
    if objective not in SUPERVISED or method not in (None, "full", "lora", "qlora"):
        raise UsageError(
            "--cp: context parallelism is sized for supervised fine-tuning; the preference "
            "and RL budgets do not divide the sequence"
        )
    if setup.mode is Mode.GENERATE:
        raise UsageError("--cp: context parallelism is sized for training, not generation")
    d = setup.distributed
    world = d.world_size
    if getattr(args, "world_size", None) is None:
        world = cp
        prov["world_size"] = "the context-parallel group (--cp)"
    try:
        distributed = replace(
            d,
            world_size=world,
            cp_size=cp,
            cp_scheme=ContextParallel(scheme or "ring"),
        )
    except SetupError as err:
        raise UsageError(f"--cp: {err}") from None
    prov["cp"] = "flag" + ("" if scheme else " (ring, the default scheme)")
    return replace(setup, distributed=distributed)


def parallel_line(setup: TrainingSetup, prov: dict[str, str]) -> tuple[str, str, str] | None:
    d = setup.distributed
    if d.cp_size <= 1:
        return None
    return (
        "context parallel",
        f"{d.cp_size} ranks a sequence, {d.cp_scheme.value}; {d.data_parallel} data-parallel",
        prov.get("cp", ""),
    )

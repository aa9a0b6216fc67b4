"""The estimate flags of parallelism beyond data parallelism: context parallelism (`--cp N`,
`--cp-scheme ring|ring-flash-attn|ulysses`), tensor parallelism (`--tp N`) and expert
parallelism (`--ep N`).

They become the setup's `DistributedSetup.cp_size`, `cp_scheme`, `tp_size` and `ep_size`
(llmmem.budget.setup); the budget's rules are in llmmem.budget.context_parallel,
llmmem.budget.tensor_parallel and llmmem.budget.expert_parallel. Where the budget does
not model a flag's combination (a preference or RL objective, generation) the flag is
refused: an accepted flag that changes nothing would be a lie."""

from __future__ import annotations

import argparse
from dataclasses import replace

from llmmem.budget.setup import ContextParallel, FsdpShard, Mode, SetupError, TrainingSetup
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
    group = parser.add_argument_group("context, tensor and expert parallelism")
    group.add_argument(
        "--tp",
        type=_group,
        default=None,
        metavar="N",
        help="split each block's Linears over N ranks as transformers' tensor-parallel plan "
        "does (accelerate's ParallelismConfig tp_size, axolotl's tensor_parallel_size); part "
        "of --world-size (default: N × --cp), FSDP or ZeRO shard over the rest",
    )
    group.add_argument(
        "--ep",
        type=_group,
        default=None,
        metavar="N",
        help="divide a mixture of experts' routed experts over N of the data-parallel ranks, "
        "tokens exchanged all-to-all, as transformers' DistributedConfig(ep_size=N) does "
        "(FSDP2 full_shard over the ranks unless --fsdp says otherwise); part of --world-size "
        "(default: N × --cp × --tp)",
    )
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
    """The setup with the context- and tensor-parallel groups the flags ask for."""
    cp = getattr(args, "cp", None)
    tp = getattr(args, "tp", None)
    ep = getattr(args, "ep", None)
    scheme = getattr(args, "cp_scheme", None)
    if scheme is not None and cp is None:
        raise UsageError("--cp-scheme: give the group's size with --cp N")
    if cp is None and tp is None and ep is None:
        return setup
    flags = " and ".join(
        flag for flag, value in (("--cp", cp), ("--tp", tp), ("--ep", ep)) if value
    )
    objective = getattr(args, "objective", None)
    method = getattr(args, "method", None)
    if objective not in SUPERVISED or method not in (None, "full", "lora", "qlora"):
        raise UsageError(
            f"{flags}: context, tensor and expert parallelism are sized for supervised "
            "fine-tuning; the preference and RL budgets do not divide the model or the sequence"
        )
    if setup.mode is Mode.GENERATE:
        raise UsageError(f"{flags}: sized for training, not generation")
    if tp and setup.quant is not None:
        raise UsageError("--tp: tensor parallelism of k-bit (bitsandbytes) weights is not sized")
    if ep and setup.quant is not None:
        raise UsageError("--ep: expert parallelism with k-bit (bitsandbytes) weights is not sized")
    d = setup.distributed
    if ep and d.zero_stage:
        raise UsageError(
            "--ep: expert parallelism under DeepSpeed ZeRO is not sized (DeepSpeed's ep_size "
            "divides its own MoE layers, not a transformers model's); use --fsdp"
        )
    fsdp = d.fsdp
    if ep and fsdp is None:
        # transformers' DistributedConfig shards the model with FSDP2 beside its experts
        fsdp = FsdpShard.FULL_SHARD
        prov["fsdp"] = "--ep (transformers' DistributedConfig runs FSDP2 beside the experts)"
    world = d.world_size
    if getattr(args, "world_size", None) is None:
        world = (cp or 1) * (tp or 1) * (ep or 1)
        prov["world_size"] = f"the parallel groups ({flags})"
    try:
        distributed = replace(
            d,
            world_size=world,
            cp_size=cp or 1,
            cp_scheme=ContextParallel(scheme or "ring"),
            tp_size=tp or 1,
            ep_size=ep or 1,
            fsdp=fsdp,
        )
    except SetupError as err:
        raise UsageError(f"{flags}: {err}") from None
    if cp:
        prov["cp"] = "flag" + ("" if scheme else " (ring, the default scheme)")
    if tp:
        prov["tp"] = "flag"
    if ep:
        prov["ep"] = "flag"
    return replace(setup, distributed=distributed)


def parallel_line(setup: TrainingSetup, prov: dict[str, str]) -> tuple[str, str, str] | None:
    d = setup.distributed
    if d.cp_size <= 1 and d.tp_size <= 1 and d.ep_size <= 1:
        return None
    parts = []
    if d.cp_size > 1:
        parts.append(f"context {d.cp_size} ({d.cp_scheme.value})")
    if d.tp_size > 1:
        parts.append(f"tensor {d.tp_size}")
    if d.ep_size > 1:
        parts.append(f"expert {d.ep_size}")
    return (
        "parallel groups",
        ", ".join(parts) + f"; {d.data_parallel} data-parallel",
        ", ".join(prov[key] for key in ("cp", "tp", "ep") if key in prov),
    )

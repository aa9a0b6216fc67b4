"""The model's states on one device: weights, gradients, optimizer states and the optimizer
step's own buffers, as the setup's sharding, offload and optimizer leave them (DeepSpeed's fp32
master copy and its buckets, a paged optimizer's unified memory, the optimizer in backward).
Part of the one-step budget (budget.phases), which puts these terms at each moment.

DeepSpeed ZeRO-3's step on a GPU, read in DeepSpeed 0.19.8 (runtime/zero/stage3.py):

- `step` (:2873-2931) first frees every gathered parameter (`_partition_all_parameters`), checks
  an fp16 gradient for overflow (`has_overflow`, :3009-3019: `torch.isinf(flat).any()` and
  `isnan`, a bool per element of the rank's whole gradient partition, one at a time) and takes
  the gradient norm (`get_grad_norm_direct`, :2419-2460: each parameter's partition copied to
  fp64, `get_norm_dtype`, zero/utils.py:59-63, one tensor at a time);
- then one sub-group at a time (distributed.largest_sub_group): `_prepare_fp32_grad_for_sub_group`
  (:2683-2700) flattens the sub-group's 16-bit gradients into a new tensor and converts it to
  fp32 (both alive for a moment: 2 + 4 B per element), the optimizer steps the sub-group's flat
  fp32 master with that gradient (`_optimizer_step`, :1235-1262), and `_release_sub_group`
  (:2731-2739) frees the fp32 gradient; the flat 16-bit gradient partition stays for the step;
- the optimizer is DeepSpeed's own where the config has an `optimizer` section (engine.py
  :2476-2493, `get_optimizer_configuration` :2377-2409): `FusedAdam` on a GPU, which updates
  the parameter and both moments in place with one `multi_tensor_apply` kernel
  (ops/adam/fused_adam.py:129-193) and allocates nothing but its states (`zeros_like`, lazily
  in the first step); otherwise the trainer's own torch optimizer, whose foreach implementation
  makes a parameter-sized `_foreach_sqrt` of the sub-group (the CPU accelerator's checks run
  this one: bench/zero_grid.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from llmmem.budget.distributed import (
    Sharding,
    overlaps_communication,
    persistent_groups,
    reduce_bucket_elements,
    zero3_largest_sub_group,
)
from llmmem.budget.optimizers import OptimizerSpec
from llmmem.budget.result import Term
from llmmem.budget.setup import TrainingSetup
from llmmem.budget.weights import Inventory, ParameterGroup
from llmmem.budget.zero12_step import zero12_step_temporaries
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count


def bytes_by_storage(groups: list[ParameterGroup]) -> str:
    """`7.0e9 × 0.516 B (nf4) + 1.05e9 × 4 B` grouped by bytes per parameter."""
    by_size: dict[tuple[float, str], int] = {}
    for g in groups:
        label = "k-bit" if g.quantized else {"adapter": "LoRA", "buffer": "buffer"}.get(g.kind, "")
        key = (g.bytes_per_param, label)
        by_size[key] = by_size.get(key, 0) + g.params
    parts = []
    for (size, label), params in sorted(by_size.items(), key=lambda kv: -kv[1]):
        suffix = f" ({label})" if label else ""
        parts.append(f"{format_count(params)} × {size:.4g} B{suffix}")
    return " + ".join(parts) if parts else "0"


@dataclass
class StateTerms:
    weights: Term
    gradients: Term
    states: Term
    step_temporaries: Term
    head_gradient: int
    persistent_bytes: int = 0  # ZeRO-3's whole copies of small parameters, in the weights
    # a paged optimizer's states in CUDA unified memory: outside torch's allocator and the states
    unified_bytes: int = 0
    # ZeRO-3 over 16-bit weights: the step's temporaries are its largest sub-group's (in
    # step_temporaries), not a copy of the whole gradient partition
    zero3_sub_groups: bool = False


def model_state_terms(
    spec: ModelSpec, setup: TrainingSetup, inv: Inventory, optim: OptimizerSpec, shard: Sharding
) -> StateTerms:
    trainable = inv.trainable
    if shard.master_weights:
        # DeepSpeed casts the whole model (adapters too) to 16 bits and keeps the fp32 copy
        # with the optimizer
        trainable = [replace(g, bytes_per_param=2.0) for g in trainable]
        groups = [
            replace(g, bytes_per_param=2.0) if g.bytes_per_param == 4.0 else g for g in inv.groups
        ]
    else:
        groups = inv.groups
    weight_bytes = held_bytes(groups, shard, shard.weights, lambda g: g.bytes)
    weights_note = ""
    if shard.offload_params:
        weight_bytes = 0
        weights_note = "parameters live on the CPU; gathered blocks are counted as temporaries"
    weights = Term(
        bytes=round(weight_bytes),
        formula=bytes_by_storage(groups)
        + shard_suffix(shard.weights, shard, groups, lambda g: g.bytes),
        note=weights_note,
    )
    persistent = persistent_groups(setup, spec.hidden_size, groups)
    if persistent:
        # small parameters stay whole on every rank besides their partition
        weights.bytes += sum(g.bytes for g in persistent)
        weights.formula += (
            f" + {bytes_by_storage(persistent)} kept whole on every rank (parameters within "
            "stage3_param_persistence_threshold)"
        )
    gradients = Term(
        bytes=round(held_bytes(trainable, shard, shard.gradients, lambda g: g.bytes)),
        formula=f"{format_count(sum(g.params for g in trainable))} trainable × "
        f"{_bytes_per(trainable)} B"
        + shard_suffix(shard.gradients, shard, trainable, lambda g: g.bytes),
    )
    # DeepSpeed's optimizer steps the fp32 master partitions: its states follow them
    stepped = (
        [replace(g, bytes_per_param=4.0) for g in trainable] if shard.master_weights else trainable
    )
    state_bytes = held_bytes(stepped, shard, shard.states, optim.state_bytes)
    state_dtype = _state_dtype_text(optim)
    if shard.master_weights and optim.state_dtype == "param":
        state_dtype = "4 B (the fp32 master's dtype)"
    state_formula = (
        f"{optim.label}: {optim.states} state(s) × {state_dtype} × "
        f"{format_count(sum(g.params for g in trainable))} params"
    )
    if optim.factored:
        state_formula = f"{optim.label}: row + column statistics per matrix"
    if shard.master_weights:
        state_bytes += 4 * sum(g.params for g in trainable) * shard.states
        state_formula += " + 4 B fp32 master copy"
    unified = 0
    if shard.offload_states:
        states = Term(bytes=0, formula=state_formula + ", offloaded to the CPU")
    else:
        unified = round(held_bytes(stepped, shard, shard.states, optim.unified_bytes))
        states = Term(
            bytes=round(state_bytes) - unified,
            formula=state_formula + shard_suffix(shard.states, shard, stepped, optim.state_bytes),
        )
    if unified:
        states.formula += (
            f", less {format_bytes(unified)} paged into CUDA unified memory (the states of "
            "parameters of 1e5 values or more: outside torch's allocator)"
        )
        states.note = "paged: the large states live in unified memory, evicted to the host"
    # the step's buffers are the size of the rank's (padded) shards
    padding = held_bytes(stepped, shard, shard.states, lambda g: g.bytes) / max(
        sum(g.bytes for g in stepped) * shard.states, 1
    )
    step_temp = (
        0
        if shard.offload_states
        else round(optim.step_temporary_bytes(stepped) * shard.states * max(padding, 1.0))
    )
    step = Term(
        bytes=step_temp,
        formula=f"{optim.implementation} step buffers"
        + (
            " (one parameter-sized copy of the trainable set)"
            if optim.implementation == "foreach"
            else ""
        ),
    )
    zero3 = setup.distributed.zero_stage == 3 and shard.master_weights
    if zero3 and not shard.offload_states:
        step = zero3_step_temporaries(spec, setup, trainable, optim, shard)
    elif shard.master_weights and not shard.offload_states:
        # ZeRO-1/2: the fp32 gradient and the optimizer's buffers over each group's fp32 master
        # partition, beside the 16-bit gradient partition (budget.zero12_step)
        step = zero12_step_temporaries(
            trainable,
            optim,
            shard.shard_group,
            gradients.bytes,
            setup.distributed.contiguous_gradients,
        )
    # the gradients that exist once the head's backward is done: the head's own (an untied
    # embedding's comes only at the very end of backward; a tied one is the head's), and the
    # trainable copies of modules_to_save
    untied_head = any(g.kind == "head" for g in trainable)
    head_kinds = ("head", "saved_copy") if untied_head else ("embedding", "saved_copy")
    head = held_bytes(
        [g for g in trainable if g.kind in head_kinds], shard, shard.gradients, lambda g: g.bytes
    )
    return StateTerms(
        weights,
        gradients,
        states,
        step,
        round(head),
        sum(g.bytes for g in persistent),
        unified,
        zero3_sub_groups=zero3 and not shard.offload_states,
    )


def zero3_step_temporaries(
    spec: ModelSpec,
    setup: TrainingSetup,
    trainable: list[ParameterGroup],
    optim: OptimizerSpec,
    shard: Sharding,
) -> Term:
    """What ZeRO-3's step allocates besides the states, at its largest moment (see the module's
    docstring): the largest sub-group's flattened 16-bit gradient and its fp32 copy while it is
    prepared, or that fp32 gradient and the optimizer's own buffers over the sub-group while it
    steps; before them, an fp16 step's overflow check and the fp64 copy the norm makes of the
    largest parameter's partition."""
    sub_group_size = setup.distributed.sub_group_size
    sub = zero3_largest_sub_group(spec, setup, trainable, sub_group_size)
    world = max(1, shard.shard_group)
    partition = sum(math.ceil(g.numel / world) * g.tensors for g in trainable)
    largest_tensor = max((math.ceil(g.numel / world) for g in trainable), default=0)
    sub_group = ParameterGroup("sub-group", "linear", 1, sub, 1, 4.0, True)
    optimizer_buffers = optim.step_temporary_bytes([sub_group])
    prepare = (2 + 4) * sub
    stepping = 4 * sub + optimizer_buffers
    fp16 = not setup.precision.uses_bf16
    overflow = partition if fp16 else 0
    norm = 8 * largest_tensor
    moments = [
        (
            prepare,
            f"the largest sub-group's 16-bit gradients flattened and copied to fp32 "
            f"((2 + 4) B × {format_count(sub)}, sub_group_size "
            f"{format_count(sub_group_size)})",
        ),
        (
            stepping,
            f"the largest sub-group's fp32 gradient (4 B × {format_count(sub)}) + "
            + (
                f"the {optim.implementation} step's buffers over it "
                f"({format_bytes(optimizer_buffers)})"
                if optimizer_buffers
                else f"{optim.label}: nothing more (in place)"
            ),
        ),
        (
            overflow,
            f"the fp16 overflow check: a bool per element of the gradient partition "
            f"({format_count(partition)})",
        ),
        (
            norm,
            f"the norm's fp64 copy of the largest partition (8 B × {format_count(largest_tensor)})",
        ),
    ]
    biggest, text = max(moments, key=lambda m: m[0])
    return Term(bytes=biggest, formula="DeepSpeed ZeRO-3's step, one sub-group at a time: " + text)


def _state_dtype_text(optim: OptimizerSpec) -> str:
    return {
        "param": "the parameter's dtype",
        "fp32": "4 B",
        "int8": "1 B (+ fp32 absmax per 256, small tensors 4 B)",
    }[optim.state_dtype]


def _bytes_per(groups: list[ParameterGroup]) -> str:
    sizes = sorted({g.bytes_per_param for g in groups})
    return "/".join(f"{s:g}" for s in sizes) if sizes else "0"


def held_bytes(
    groups: list[ParameterGroup],
    shard: Sharding,
    fraction: float,
    size: Callable[[ParameterGroup], float],
) -> float:
    """The bytes of `groups` (each `size(group)` whole) one rank holds."""
    return sum(size(g) * shard.share(g, fraction) for g in groups)


def shard_suffix(
    fraction: float,
    shard: Sharding,
    groups: list[ParameterGroup],
    size: Callable[[ParameterGroup], float],
) -> str:
    if fraction >= 1:
        return ""
    text = f" ÷ {shard.shard_group} ({shard.label})"
    even = sum(size(g) for g in groups) * fraction
    padding = held_bytes(groups, shard, fraction, size) - even
    if shard.expert_group:
        # expert parallelism: this rank's own experts, sharded over the ranks holding the
        # same ones only; what that adds over an even share is not padding
        experts = [g for g in groups if g.shard_rows]
        beside = (
            held_bytes(experts, shard, fraction, size) - sum(size(g) for g in experts) * fraction
        )
        if beside > 0:
            text += (
                f" + {format_bytes(round(beside))}: its experts sharded over the "
                f"{shard.expert_group} rank(s) that hold the same ones"
            )
            padding -= beside
    if padding > 0.005 * even:
        text += (
            f" + {format_bytes(round(padding))} padding (FSDP gives every rank ceil(rows ÷ "
            "ranks) rows of each parameter)"
        )
    return text


@dataclass(frozen=True)
class ZeroBuffers:
    """DeepSpeed ZeRO's own buffers on the GPU."""

    bucket: int = 0  # the contiguous gradient reduction bucket(s)
    text: str = ""
    persistent: bool = False  # ZeRO-3: allocated with the optimizer, kept
    persistent_gradients: bool = False  # ZeRO-3: one flat gradient partition, kept
    grad_fp32: int = 0  # ZeRO-3 over its kept partition: the step's fp32 copy of it


def zero_buffers(
    spec: ModelSpec, setup: TrainingSetup, shard: Sharding, st: StateTerms
) -> ZeroBuffers:
    d = setup.distributed
    if not d.zero_stage:
        return ZeroBuffers()
    elements = reduce_bucket_elements(setup, spec.hidden_size)
    # the bucket holds gradients in the model's dtype: 16 bits beside fp32 master weights
    size = 2 if shard.master_weights else 4
    count = 2 if d.zero_stage < 3 and overlaps_communication(setup) else 1
    bucket = count * elements * size if d.contiguous_gradients else 0
    auto = " (auto: hidden_size²)" if d.reduce_bucket_size is None else ""
    text = (
        f"DeepSpeed gradient bucket{'s' if count > 1 else ''}: "
        + (f"{count} × " if count > 1 else "")
        + f"reduce_bucket_size {format_count(elements)}{auto} × {size} B"
    )
    stage3 = d.zero_stage == 3
    # ZeRO-1/2 copy each parameter group's 16-bit gradient partition to fp32 as the group
    # steps (budget.zero12_step), ZeRO-3 one sub-group at a time: both in the step's
    # temporaries
    grad_fp32 = (
        2 * st.gradients.bytes
        if stage3 and shard.master_weights and not shard.offload_states and not st.zero3_sub_groups
        else 0
    )
    return ZeroBuffers(
        bucket=bucket,
        text=text,
        persistent=stage3,
        persistent_gradients=stage3,
        grad_fp32=grad_fp32,
    )


def stepped_in_backward(st: StateTerms, inv: Inventory, optim: OptimizerSpec) -> StateTerms:
    """The optimizer in backward: each parameter is stepped by its own optimizer as soon as
    its gradient is complete, and the gradient is freed right after (`zero_grad` sets it to
    None). At most one gradient exists at a time, the largest parameter's, with its step's
    buffers; the states of every parameter stay."""
    largest = max(
        (replace(g, tensors=1) for g in inv.trainable),
        key=lambda g: g.bytes,
        default=None,
    )
    if largest is None:
        return st
    one = Term(
        bytes=largest.bytes,
        formula=f"one parameter's gradient at a time ({largest.name}, "
        f"{format_count(largest.numel)} × {largest.bytes_per_param:g} B): stepped and freed in "
        "its hook (optimizer in backward)",
    )
    step = Term(
        bytes=round(optim.step_temporary_bytes([largest])),
        formula=f"{optim.implementation} step buffers of that one parameter",
    )
    return replace(st, gradients=one, step_temporaries=step, head_gradient=0)


def step_temporaries(st: StateTerms, ddp_buckets: int, zero: ZeroBuffers, always: int) -> Term:
    step = st.step_temporaries
    parts = [step.formula] if step.bytes else []
    total = step.bytes
    if zero.grad_fp32 and zero.persistent_gradients:
        # ZeRO-3 copies its (kept) 16-bit gradient partition to fp32 for the optimizer
        total = zero.grad_fp32 + step.bytes
        parts = ["DeepSpeed's fp32 copy of the gradient partition"] + parts
    if ddp_buckets:
        total += ddp_buckets
        parts.append("DDP gradient buckets")
    if always:
        total += always
        parts.append(zero.text)
    return Term(bytes=total, formula=" + ".join(parts) if parts else "none")

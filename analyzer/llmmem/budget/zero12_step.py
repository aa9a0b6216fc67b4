"""DeepSpeed ZeRO-1/2's optimizer step over 16-bit weights with fp32 master partitions, as
DeepSpeed 0.19.8 runs it (runtime/zero/stage_1_and_2.py), one optimizer parameter group at a
time. Part of the model's states (budget.model_states), which puts the result in the step's
temporaries.

- backward copies each gradient of the rank's partition into one contiguous 16-bit buffer,
  `grads_in_partition` (`copy_grads_in_partition`, :2184-2203, with contiguous_gradients, the
  default), shared by every parameter group; each group's `averaged_gradients` are views of it
  (`get_flat_partition`, :1047-1054); without contiguous_gradients each gradient is its own
  tensor;
- `step` (:3013-3160) then walks the groups in order: it flattens the group's gradients into a
  new 16-bit tensor (`flatten`, :3113-3117), converts it to fp32 (:3118, both alive for a
  moment: 2 + 4 B per element), drops the group's views (:3127-3131) and runs the optimizer on
  the group's flat fp32 master with that gradient (`_optimizer_step`, :2967-2990, :3137); the
  fp32 gradient is freed after it (:3141). The contiguous buffer is freed only once no group
  holds a view of it: while the first group steps, the later groups' views keep all of it;
- the HF trainer hands DeepSpeed two groups, the weights and then the biases and norms it
  exempts from weight decay (`get_decay_parameter_names`), so the largest group steps while the
  whole 16-bit gradient partition is still alive; torch's foreach AdamW then makes its
  `_foreach_sqrt` over the group's fp32 master (4 B per element).
"""

from __future__ import annotations

import math

from llmmem.budget.distributed import NO_DECAY_KINDS
from llmmem.budget.optimizers import OptimizerSpec
from llmmem.budget.result import Term
from llmmem.budget.weights import ParameterGroup
from llmmem.units import format_bytes, format_count

GRADIENT_BYTES = 2  # the 16-bit gradients beside fp32 master weights
MASTER_BYTES = 4


def trainer_group_partitions(trainable: list[ParameterGroup], world: int) -> list[int]:
    """The elements of each optimizer parameter group's partition on one rank, in the
    trainer's order (the weights, then the biases and norms): ZeRO-1/2 flatten each group
    and split it evenly over the ranks (stage_1_and_2.py:501-512)."""
    decay = sum(g.params for g in trainable if g.kind not in NO_DECAY_KINDS)
    no_decay = sum(g.params for g in trainable if g.kind in NO_DECAY_KINDS)
    return [math.ceil(size / world) for size in (decay, no_decay) if size]


def zero12_step_temporaries(
    trainable: list[ParameterGroup],
    optim: OptimizerSpec,
    world: int,
    gradient_bytes: int,
    contiguous_gradients: bool,
) -> Term:
    """What the step holds beyond the weights, the states and the 16-bit gradient partition
    (`gradient_bytes`, in the step's gradients), at its largest moment: negative parts where
    that partition is already freed."""
    partitions = trainer_group_partitions(trainable, max(1, world))
    moments: list[tuple[int, str]] = []
    for index, elements in enumerate(partitions):
        later = partitions[index + 1 :]
        if contiguous_gradients:
            held_preparing = gradient_bytes
            held_stepping = gradient_bytes if later else 0
            kept = "the contiguous 16-bit gradient partition, which later groups' views keep"
        else:
            held_preparing = GRADIENT_BYTES * sum(partitions[index:])
            held_stepping = GRADIENT_BYTES * sum(later)
            kept = "the later groups' 16-bit gradients"
        group = ParameterGroup("partition", "linear", 1, elements, 1, float(MASTER_BYTES), True)
        buffers = optim.step_temporary_bytes([group])
        which = "the largest group" if len(partitions) > 1 and index == 0 else f"group {index}"
        moments.append(
            (
                held_preparing + (GRADIENT_BYTES + MASTER_BYTES) * elements,
                f"{which}'s gradients flattened and copied to fp32 "
                f"((2 + 4) B × {format_count(elements)})",
            )
        )
        buffer_text = (
            f"the {optim.implementation} step's buffers over its fp32 master "
            f"({format_bytes(buffers)})"
            if buffers
            else f"{optim.label}: nothing more (in place)"
        )
        moments.append(
            (
                held_stepping + MASTER_BYTES * elements + buffers,
                f"{which}'s fp32 gradient (4 B × {format_count(elements)}) + {buffer_text}"
                + (f", beside {kept}" if held_stepping else ", the 16-bit gradients freed"),
            )
        )
    if not moments:
        return Term(bytes=0, formula="none")
    peak, text = max(moments, key=lambda m: m[0])
    return Term(
        bytes=peak - gradient_bytes,
        formula="DeepSpeed ZeRO-1/2's step, one optimizer parameter group at a time "
        f"(the trainer's {len(partitions)}): " + text,
    )

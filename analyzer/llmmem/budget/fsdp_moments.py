"""FSDP's own moments of a step's backward: the blocks' backward with the block before prefetched,
the root unit's gradients and their reduce-scatter, and what FSDP1 keeps under reentrant
checkpointing. Part of the one-step budget (budget.phases), which adds these moments beside its
own where the setup shards with FSDP.
"""

from __future__ import annotations

from llmmem.budget.activations import dtypes_for
from llmmem.budget.distributed import Sharding
from llmmem.budget.model_states import StateTerms
from llmmem.budget.result import Component, Term
from llmmem.budget.setup import Framework, Method, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes

FSDP_GRAD_BLOCKS = 2


def fsdp1_retained_inputs(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, str]:
    """FSDP1 keeps every finished block's checkpoint input, and the gradient checkpointing
    gives it, until backward ends, when the blocks are FSDP units of frozen parameters only
    and reentrant checkpointing runs outside them.

    That is the HF Trainer's FSDP with a PEFT LoRA model (transformers 4.x
    `_fsdp_qlora_plugin_updates` wraps with peft's `fsdp_auto_wrap_policy`: the adapters are
    their own units) and transformers 4.x's reentrant `gradient_checkpointing_enable`, which
    checkpoints the wrapped block: its recompute re-runs FSDP's pre-forward on a detached
    input, and torch >= 2.1 FSDP1 (`_register_post_backward_reshard_only_hook`, frozen flat
    parameter) hangs a multi-grad hook on that input, whose AccumulateGrad keeps the input and
    the `.grad` `CheckpointFunction.backward` gives it until `_finalize_params` at the end of
    backward. Checked on the CPU (gloo, FSDP1, torch 2.13, frozen blocks): all finished blocks'
    inputs and their gradients alive at the first block's backward, none without FSDP, with
    the checkpoint inside the unit, or with trainable blocks. FSDP2 (transformers 5's default)
    is not affected; non-reentrant checkpointing (transformers 5, TRL >= 0.28) neither."""
    if not (
        setup.grad_ckpt
        and setup.distributed.fsdp is not None
        and setup.distributed.world_size > 1
        and setup.method is not Method.FULL
        and setup.framework in (Framework.HF, Framework.TRL)  # the HF Trainer's wrapping
        and setup.checkpoints_reentrant
        and setup.transformers_release < (5, 0)
    ):
        return 0, ""
    blocks = sum(g.count for g in spec.blocks)
    if blocks < 2:
        return 0, ""
    d = dtypes_for(setup).residual
    retained = (blocks - 1) * d * setup.tokens * spec.hidden_size
    return retained, (
        f"{blocks - 1} finished blocks' input gradients kept by FSDP1's hooks "
        f"({blocks - 1} × {d}·N·h, {format_bytes(retained)})"
    )


def fsdp_block_moments(
    spec: ModelSpec,
    st: StateTerms,
    *,
    blocks: int,
    saved: int,
    recompute: int,
    workspace: tuple[int, str],
    gathered: int,
    gathered_text: str,
    block_gathered: int,
    block_gradients: int,
    input_gradient: int,
    head_gradient: int,
    grads_between: Term,
) -> list[tuple[str, dict[Component, Term]]]:
    """FSDP: a block's backward with the block before it prefetched, as it starts and (full
    fine-tuning) as it ends, for the last block, the one before it and the second block.

    Going down the stack, each block leaves its gradient shard and frees its saved tensors, so
    the moment that peaks is at one end: the last block (no reduce-scatter input held yet), the
    one before it (the last block's reduce-scatter input held until the next one, as FSDP2
    does) or the second (every shard but two made: Mixtral-8x7B over 16 ranks, where padded
    experts make the shards large)."""
    per_block = max((g.params_per_block for g in spec.blocks), default=0)
    shard = st.gradients.bytes * per_block // max(spec.total_params, 1)
    rs_input = block_gathered if block_gradients else 0  # LoRA's is the adapters': negligible
    work_bytes, work_text = workspace
    positions = {0: "the last block", 1: "the last block but one"}
    positions.setdefault(blocks - 2, "the second block")
    moments: list[tuple[str, dict[Component, Term]]] = []
    for done, which in sorted(positions.items()):
        if done > blocks - 2 or done < 0:
            continue
        held = gathered + block_gathered + head_gradient + (rs_input if done else 0)
        held_text = (
            gathered_text
            + " (the block before, prefetched)"
            + (" + the reduce-scatter input of the block after" if done and rs_input else "")
            + (" + the head's whole gradient" if head_gradient else "")
        )
        gradients = Term(
            bytes=grads_between.bytes + done * shard,
            formula=grads_between.formula
            + (f" + the shards of the {done} block(s) after it" if done else ""),
        )
        moments.append(
            (
                f"backward of {which}, as it starts",
                {
                    Component.GRADIENTS: gradients,
                    Component.ACTIVATIONS: Term(
                        bytes=saved * (blocks - done) // blocks + recompute,
                        formula="the saved tensors of the blocks up to it"
                        + (", its own recomputed" if recompute else ""),
                    ),
                    Component.TEMPORARIES: Term(
                        bytes=work_bytes + held, formula=f"{work_text} + {held_text}"
                    ),
                },
            )
        )
        if block_gradients:
            moments.append(
                (
                    f"backward of {which}, as it ends",
                    {
                        Component.GRADIENTS: gradients,
                        Component.ACTIVATIONS: Term(
                            bytes=saved * (blocks - 1 - done) // blocks,
                            formula="the saved tensors of the blocks before it",
                        ),
                        Component.TEMPORARIES: Term(
                            bytes=held + block_gradients + input_gradient,
                            formula=f"{held_text} + the block's whole gradients + its input's "
                            "gradient",
                        ),
                    },
                )
            )
    return moments


def fsdp_last_moments(
    spec: ModelSpec,
    st: StateTerms,
    *,
    first_block: int,
    workspace: tuple[int, str],
    held: int,
    held_text: str,
    block_gradients: int,
    input_gradient: int,
    root_backward: int,
    root_text: str,
    tied: int,
    root_reduce: Term,
) -> list[tuple[str, dict[Component, Term]]]:
    """FSDP, full fine-tuning: the first block's backward as it starts and as it ends, then the
    root unit's backward (the embedding's), where backward ends.

    Only the blocks already reduce-scattered have their gradient shards: not the root unit's,
    reduced at the very end. Beside them stay the root unit gathered, the head's whole gradient
    and the reduce-scatter input of the block before (FSDP2 keeps it until the next
    reduce-scatter). As a block's backward starts, its saved tensors are all alive and none of
    its gradients; as it ends, its whole gradients exist and its saved tensors are gone:
    counting both at once read 8-19% high at small shapes. With tied embeddings the head's and
    the embedding's gradients are summed into a third tensor, as without FSDP."""
    in_blocks = sum(g.params_per_block * g.count for g in spec.blocks)
    per_block = max((g.params_per_block for g in spec.blocks), default=0)

    def block_shards(params: int, which: str) -> Term:
        share = params / spec.total_params if spec.total_params else 0.0
        return Term(
            bytes=int(st.gradients.bytes * share), formula=f"{st.gradients.formula}, {which}"
        )

    after_first = block_shards(max(in_blocks - per_block, 0), "the blocks' after the first")
    work_bytes, work_text = workspace
    return [
        (
            "backward of the first block, as it starts",
            {
                Component.GRADIENTS: after_first,
                Component.ACTIVATIONS: Term(
                    bytes=first_block, formula="the first block's saved tensors"
                ),
                Component.TEMPORARIES: Term(
                    bytes=work_bytes + held, formula=f"{work_text} + {held_text}"
                ),
            },
        ),
        (
            "backward of the first block, as it ends",
            {
                Component.GRADIENTS: after_first,
                Component.TEMPORARIES: Term(
                    bytes=block_gradients + input_gradient + held,
                    formula="the block's whole gradients + its input's gradient + " + held_text,
                ),
            },
        ),
        (
            "end of backward: the root unit's gradients, before their reduce-scatter",
            {
                Component.GRADIENTS: block_shards(in_blocks, "the blocks' (the root's to come)"),
                Component.TEMPORARIES: Term(
                    bytes=root_backward + tied,
                    formula=root_text
                    + (" + the tied weight's two gradients, summed into a third" if tied else ""),
                ),
            },
        ),
        (
            "end of backward: the root unit's reduce-scatter",
            {
                Component.GRADIENTS: block_shards(in_blocks, "the blocks' (the root's to come)"),
                Component.TEMPORARIES: root_reduce,
            },
        ),
    ]


def root_reduce_scatter(
    root: int, shard: Sharding, setup: TrainingSetup, whole_gradient: int
) -> Term:
    """FSDP's last reduce-scatter, the root unit's, after the root is resharded: its gradients
    copied into one flat input, the rank's reduced part, and under mixed precision that part
    cast to the parameters' dtype; one whole gradient of the root is still referenced (the
    head's or the embedding's, measured on a simulated rank)."""
    ranks = max(shard.shard_group, 1)
    output = root // ranks
    cast = 0
    if setup.precision.is_autocast:
        # the sharded parameters stay in their own dtype (fp32) under the 16-bit policy
        cast = output * setup.precision.weight_bytes // 2
    return Term(
        bytes=root + output + cast + whole_gradient,
        formula="the root unit's gradients as one reduce-scatter input + this rank's part"
        + (" + that part cast to the parameters' dtype" if cast else "")
        + (" + one whole gradient still referenced" if whole_gradient else ""),
    )

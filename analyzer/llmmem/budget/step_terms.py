"""The terms the moments of a training step are built from (llmmem.budget.phases): autocast's
weight copies, offloaded and recomputed activations, the temporaries' formulas, what only
forward holds, and the floors of the band where activation offload or torch.compile leave the
step open."""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import (
    ActivationEstimate,
    dtypes_for,
    head_input_dtype,
    linear_position,
)
from llmmem.budget.distributed import (
    Sharding,
)
from llmmem.budget.float8 import float8_weight_copy_terms
from llmmem.budget.float8_te import te_weight_copy_terms
from llmmem.budget.logits import LogitsMoments, logits_count
from llmmem.budget.overheads import (
    CachedAtLoss,
)
from llmmem.budget.result import Component, Phase, PhaseBudget, Term
from llmmem.budget.setup import Method, Mode, Precision, TrainingSetup
from llmmem.budget.weights import Inventory
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes


def weight_copy_terms(
    spec: ModelSpec, setup: TrainingSetup, inv: Inventory
) -> tuple[int, int, int]:
    """Bytes of weight copies alive (through forward, at the start of backward, while the last
    block is recomputed under checkpointing)."""
    dt = dtypes_for(setup)
    if setup.float8:
        return float8_weight_copy_terms(spec, setup)
    if setup.float8_te:
        return te_weight_copy_terms(spec, setup)
    # autocast copies weights only where they are fp32 (AMP); bf16 weights are used as they are
    if setup.precision.is_autocast and setup.method is Method.FULL:
        linear = sum(g.params for g in inv.groups if g.kind in ("linear", "head"))
        head = sum(g.params for g in inv.groups if g.kind == "head") or (
            spec.vocab_size * spec.hidden_size if spec.is_causal_lm else 0
        )
        if setup.grad_ckpt:
            block = max(
                (sum(lin.weight_params for lin in b.linears) for b in spec.blocks), default=0
            )
            forward = 2 * (linear + (head if not spec.params.head else 0))
            return forward, 2 * (head + block), 2 * (head + block)
        total = 2 * (linear + (head if not spec.params.head else 0))
        return total, total, total
    if setup.precision.is_autocast and setup.quant is None and setup.method is not Method.FULL:
        return frozen_autocast_copies(spec, setup)
    if setup.quant is not None:
        # a k-bit matmul dequantizes its weight to a 16-bit temporary (one at a time)
        largest = 2 * max(
            (
                lin.out_features * lin.in_features
                for g in spec.blocks
                for lin in g.linears
                if lin.role != "expert"
            ),
            default=0,
        )
        # the head stays out of bitsandbytes; prepared for k-bit training it is fp32, and
        # autocast's 16-bit cast of it (frozen: not cached) is kept for the input gradient
        # until the head's backward, before any checkpointed block is recomputed
        head = 0
        if dt.autocast and fp32_head(setup) and spec.is_causal_lm:
            head = 2 * spec.vocab_size * spec.hidden_size
        return largest + head, largest + head, largest
    return 0, 0, 0


def frozen_autocast_copies(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, int]:
    """Adapters over frozen fp32 weights under autocast: autocast casts each frozen weight to
    16 bits at every use without caching it (it caches only weights that need a gradient), and
    the matmul keeps that cast for its input's gradient whenever the input needs one: from the
    first adapter on, every Linear's 16-bit copy lives until backward reaches it. Only the
    first block's projections of the (frozen) embeddings escape. With checkpointing the copies
    live inside the one block being recomputed; the head's copy lives until the head's backward
    is done, before any block is recomputed."""
    head = spec.vocab_size * spec.hidden_size if spec.is_causal_lm else 0
    block_copies: list[int] = []
    for group in spec.blocks:
        plain = [lin for lin in group.linears if lin.role != "expert"]
        block_copies += [sum(lin.weight_params for lin in plain)] * group.count
    if setup.grad_ckpt:
        return 2 * head, 2 * head, 2 * max(block_copies, default=0)
    first_block = spec.blocks[0].linears if spec.blocks else []
    attention = [lin for lin in first_block if lin.role == "attention"]
    reads_embeddings = sum(lin.weight_params for lin in attention[:-1])
    total = 2 * (sum(block_copies) - reads_embeddings + head)
    return total, total, total


def compile_floor_text(floor_bytes: int | None) -> str:
    if floor_bytes is None:
        return (
            "torch.compile under checkpointing: the blocks keep only their inputs either way, "
            "and the loss is fused (the logits stay in their dtype)"
        )
    return (
        f"torch.compile can take the step down to {format_bytes(floor_bytes)}: the loss is "
        "fused (counted), and AOTAutograd's partitioner recomputes cheap ops in backward "
        "instead of saving their outputs, so the blocks save no more than in eager mode and "
        "no less than checkpointing keeps; the estimate counts the eager blocks (an H100 "
        "under torch 2.11 saved 29% less in them on Llama-3.2-1B with LoRA: "
        "bench/gpu/2026-11-26-h100)"
    )


def offload_floor_text(floor_bytes: int) -> str:
    return (
        f"activation offloading can take the step down to {format_bytes(floor_bytes)} (every "
        "saved tensor TRL's OffloadActivations may move on the host: all but the head's input, "
        "tensors under 1 KiB and parameters); how much a run keeps on the device depends on "
        "the release's storage deduplication (a second save of a storage being offloaded stays) "
        "and on the allocator's address reuse: on an H100, TRL 0.29.1's own hooks landed about "
        "0.4 of the way from this floor to the step without offloading (LoRA without "
        "checkpointing, bench/gpu/2026-11-26-h100), so the estimate is the step without it"
    )


def offloaded_activations(
    spec: ModelSpec, setup: TrainingSetup, acts: ActivationEstimate
) -> tuple[int, str]:
    """The saved activations left on the device when every tensor TRL's OffloadActivations
    may move has moved: the head's input (the head runs under a no-op hook manager)."""
    dt = dtypes_for(setup)
    n_h = setup.tokens * spec.hidden_size
    head_input = head_input_dtype(dt) * n_h if spec.is_causal_lm else 0
    return head_input, f"{format_bytes(head_input)} (the head's input, kept on the device)"


def fp32_head(setup: TrainingSetup) -> bool:
    """A k-bit model's head is fp32 once prepared for k-bit training, unless TRL cast it back
    to bf16 (autocast then copies it to 16 bits at each use)."""
    quant = setup.quant
    return quant is not None and quant.prepare_for_kbit_training and not quant.embeddings_16bit


def cached_at_the_loss(
    spec: ModelSpec,
    run: TrainingSetup,
    setup: TrainingSetup,
    phases: list[PhaseBudget],
    peak: PhaseBudget,
    recompute: int,
    acts: ActivationEstimate,
    logits: LogitsMoments,
) -> CachedAtLoss | None:
    """What the caching allocator holds, unused, when the loss is computed in a later step:
    blocks cut for earlier moments that are too small for the logits' tensors. Found by
    replaying simulated steps through the allocator's rules and checked against reserved peaks
    measured on an H100 (bench/allocator_replay.py):

    - with checkpointing, the recomputed block's tensors of the last backward, cached in blocks
      sized for them, are all free while the loss runs;
    - optimizer states made lazily in the first step (torch and bitsandbytes optimizers) are
      carved from the cached blocks that step freed, smallest first: what the activations'
      blocks cannot take lands in the loss's, which the next step's loss has to make again.
    """
    if not spec.is_causal_lm or setup.mode is Mode.GENERATE:
        return None
    at_loss = [p.allocated_bytes for p in phases if p.phase in (Phase.FORWARD, Phase.BACKWARD)]
    if not at_loss:
        return None
    recomputed = recompute if setup.grad_ckpt else 0
    states_term = peak.components.get(Component.OPTIMIZER_STATES)
    states = states_term.bytes if states_term is not None else 0
    lazy_states = not (
        setup.first_step or setup.optimizer_in_backward or setup.distributed.zero_stage
    )
    spill = 0
    if states and lazy_states:
        # the activations' blocks freed by the first backward: with checkpointing one block's
        # tensors and their gradients, without it every block's
        activation_blocks = 2 * recompute if setup.grad_ckpt else acts.full_bytes
        e = dtypes_for(run).compute
        loss_blocks = logits.backward_start + (e * logits_count(spec, run) if e != 4 else 0)
        spill = min(max(0, states - activation_blocks), loss_blocks)
    extra = max(at_loss) + recomputed + spill - peak.allocated_bytes
    if extra <= 0:
        return None
    return CachedAtLoss(extra, recomputed, spill)


def sixteen_bit(setup: TrainingSetup) -> TrainingSetup:
    """The same step with its weights, adapters too, in the 16-bit dtype autocast used."""
    if setup.precision.autocasts:
        sixteen = Precision.BF16_TRUE if setup.precision.uses_bf16 else Precision.FP16_TRUE
        setup = replace(setup, precision=sixteen)
    if setup.lora is not None and setup.lora.adapter_bytes != 2:
        setup = replace(setup, lora=replace(setup.lora, adapter_bytes=2))
    return setup


def fsdp_mixed_precision(setup: TrainingSetup) -> bool:
    """FSDP under bf16/fp16 mixed precision: accelerate (and so the HF trainer) gives FSDP a
    mixed-precision policy with param_dtype = the autocast dtype."""
    return setup.distributed.fsdp is not None and setup.precision.autocasts


def forward_only_terms(spec: ModelSpec, setup: TrainingSetup, inv: Inventory) -> list[Term]:
    """What lives during forward only and is gone before backward starts."""
    terms = []
    dt = dtypes_for(setup)
    if setup.use_cache and not setup.grad_ckpt:
        # the model builds a KV cache it never uses: per block, K and V concatenated into it,
        # in fp32 under autocast (the rotary output), until forward returns
        blocks = sum(g.count for g in spec.blocks if g.name != "encoder")
        per = 4 if dt.autocast else dt.compute
        terms.append(
            Term(
                bytes=blocks * setup.tokens * spec.kv_cache_dim * per,
                formula=(
                    f"use_cache=True: {blocks} blocks × N × {spec.kv_cache_dim} cached values "
                    f"× {per} B of unused KV cache"
                ),
            )
        )
    if setup.lora is not None and setup.lora.dora:
        # DoRA forms W + scale·B·A in fp32 to take its column norms, one Linear at a time
        largest = max((g.numel for g in inv.groups if g.kind == "linear"), default=0)
        terms.append(Term(bytes=4 * largest, formula="DoRA: one fp32 weight-sized W + B·A"))
    return terms


def temporaries_text(
    gathered: int, buckets: int, shard: Sharding, zero_text: str = "", *, blocks: bool = False
) -> str:
    parts = []
    if gathered and shard.label.startswith("DeepSpeed"):
        parts.append(
            "ZeRO-3's gathered parameters (within stage3_max_reuse_distance of their next use)"
        )
    elif blocks:
        parts.append(
            f"{shard.gathered_blocks} gathered blocks and the root unit (embeddings, head) "
            f"({shard.label})"
        )
    elif gathered:
        parts.append(f"a gathered block and the root unit (embeddings, head) ({shard.label})")
    if buckets:
        parts.append("DDP gradient buckets")
    if zero_text:
        parts.append(zero_text)
    return " + ".join(parts) if parts else "none"


def first_block_gradients_to_come(spec: ModelSpec, inv: Inventory) -> int:
    """The gradient bytes of the first block that do not exist yet while its MLP's backward
    runs: all its trainable Linears' and norms' but the MLP output projection's (made first)."""
    if not spec.blocks:
        return 0
    group = spec.blocks[0]
    per_param = {g.name: g.bytes_per_param for g in inv.trainable}
    norm_bytes = next((g.bytes_per_param for g in inv.trainable if g.kind == "norm"), 0.0)
    to_come = group.norm_params * norm_bytes
    for lin in group.linears:
        if linear_position(lin) == "mlp_out":
            continue
        to_come += lin.params * per_param.get(lin.name, 0.0)
    return round(to_come)


def plus_term(base: Term, extra: Term) -> Term:
    """Two terms of one component at one moment."""
    if not base.bytes:
        return extra
    return Term(bytes=base.bytes + extra.bytes, formula=f"{base.formula} + {extra.formula}")

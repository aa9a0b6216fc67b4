"""A reward model's step (a score head of hidden × num_labels, no vocabulary logits): the
moments that decide its peaks once nothing vocabulary-sized outweighs them.

In forward the running last block (its MLP, its eager attention), a checkpointed block's MLP
intermediates and the final norm; in backward the final norm's `pow` branch and the first
block's, whose token embedding's gradient is still to come. LLaMA-Factory's reward model is
TRL's value-head model instead: its LM head still makes the logits, unread.
llmmem.budget.preference picks the largest of them for its reward objective.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import (
    ABSOLUTE_POSITION_TYPES,
    BlockContext,
    Tally,
    dtypes_for,
    eager_mask_kinds,
    estimate_activations,
    linear_position,
    trainability_for,
)
from llmmem.budget.result import Component, Phase, PhaseBudget, Term
from llmmem.budget.setup import AttnImpl, Method, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


def checkpointed_block_moment(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> PhaseBudget | None:
    """With checkpointing a block's forward keeps nothing for backward, but its MLP's
    intermediates live while it runs: act(gate), up and their product for a gated MLP
    (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`), fc1's output and its activation for a
    plain one. Without vocabulary logits (a reward model's score head) this is the forward's
    peak."""
    if not setup.grad_ckpt or not spec.blocks:
        return None
    dt = dtypes_for(setup)
    n_i = setup.tokens * spec.intermediate_size
    alive = 3 if spec.mlp == "gated" else 2
    parts: dict[Component, Term] = {
        k: v for k, v in forward.components.items() if k is not Component.LOGITS
    }
    temporaries = forward.components.get(Component.TEMPORARIES)
    parts[Component.TEMPORARIES] = Term(
        bytes=alive * dt.linear_out_bytes * n_i + (temporaries.bytes if temporaries else 0),
        formula=f"{alive}·{dt.linear_out_bytes}·N·I (the running block's MLP intermediates)",
    )
    return PhaseBudget(
        phase=Phase.FORWARD, moment="forward of the last block (checkpointed)", components=parts
    )


def running_block_moments(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> list[PhaseBudget]:
    """Under a score head the forward can peak inside the last block, whose tensors that
    nothing keeps for backward are alive while it runs (transformers' decoder layers: the
    residual is a local, each sub-layer's input a local until it returns):

    - its MLP, as the down projection's output is made: the residual (not kept when the
      norm keeps an fp32 copy of a 16-bit one), the MLP's input and act(gate) · up where no
      Linear keeps them; under checkpointing nothing is kept, and act(gate), up and their
      product are alive together;
    - its eager attention, as the fp32 softmax is made: the masked scores and their fp32
      upcast (a 16-bit model), beside the masks transformers builds once per forward; under
      checkpointing the softmax's output and the block's q, k and v too.

    Below them every earlier block's saved tensors (without checkpointing), or the
    checkpointed inputs."""
    if not spec.blocks or spec.mlp != "gated":
        return []
    dt = dtypes_for(setup)
    train = trainability_for(spec, setup)
    ctx = BlockContext(spec, setup, dt, train)
    acts = estimate_activations(spec, setup)
    group = spec.blocks[-1]
    dims = acts.dims
    d, e = dt.residual, dt.linear_out_bytes
    n_h, n_i = dims["N·h"], dims["N·I"]
    ckpt = setup.grad_ckpt
    held: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k not in (Component.LOGITS, Component.TEMPORARIES, Component.ACTIVATIONS)
    }
    final = Tally()
    ctx.norm(final)
    final_norm = final.evaluate(dims)
    if ckpt:
        below = forward.components.get(Component.ACTIVATIONS, Term(0, "")).bytes - final_norm
        below_text = "the checkpointed blocks' inputs"
    else:
        below = acts.full_bytes - acts.outside.evaluate(dims)
        below_text = "every block's saved tensors"
    # the residual stream's tensor: kept when the norm's fp32 view of it is itself
    residual_kept = d == 4 and spec.norm != "layernorm" and not ckpt
    residual = 0 if residual_kept else d * n_h
    mlp_in = [lin for lin in group.linears if linear_position(lin) == "mlp_in"]
    down = [lin for lin in group.linears if linear_position(lin) == "mlp_out"]
    scratch = Tally()
    input_kept = not ckpt and ctx.consumers_save(scratch, d, "N·h", mlp_in)
    product_kept = not ckpt and ctx.consumers_save(scratch, e, "N·I", down)
    if ckpt:
        mlp_live = residual + d * n_h + 3 * e * n_i + e * n_h
        mlp_text = f"{d}·N·h residual + {d}·N·h MLP input + 3·{e}·N·I + {e}·N·h output"
    else:
        mlp_live = (
            residual + (0 if input_kept else d * n_h) + (0 if product_kept else e * n_i) + e * n_h
        )
        mlp_text = "the MLP's tensors no Linear keeps + its output"
    eager = setup.attn is AttnImpl.EAGER or not spec.supports_sdpa
    masks = eager_mask_kinds(spec) * d * dims["b·s²"] if eager else 0
    moments = [
        PhaseBudget(
            phase=Phase.FORWARD,
            moment="the last block's MLP (no vocabulary logits)",
            components={
                **held,
                Component.ACTIVATIONS: Term(bytes=round(below), formula=below_text),
                Component.TEMPORARIES: Term(
                    bytes=round(mlp_live + (0 if ckpt else masks)), formula=mlp_text
                ),
            },
        )
    ]
    if eager:
        c = dt.compute
        scores = dims["b·a·s²"]
        # the scores plus the mask: type promotion makes them fp32 under autocast over fp32
        # weights (an fp32 mask); softmax(dtype=float32) upcasts 16-bit ones first
        m = max(c, d)
        upcast = 4 if m != 4 else 0
        if ckpt:
            # the residual is the block's input, a checkpointed one; repeat_kv copies K and V
            # to every head where the model groups them
            # (rotary embeddings multiply q and k by cos and sin in the residual stream's
            # dtype: fp32 q and k under autocast over fp32 weights)
            r = max(c, d) if spec.model_type not in ABSOLUTE_POSITION_TYPES else c
            qkv = r * dims["N·q"] + r * dims["N·kvd"] + c * dims["N·kvd"]
            if spec.num_kv_heads < spec.num_attention_heads:
                qkv += (r + c) * dims["N·q"]
            live = d * n_h + qkv + (m + upcast + 4) * scores
            text = (
                "attention input, q, k, v (repeated per head) + the masked scores, upcast and "
                "softmax"
            )
        else:
            # the last block has kept only what comes before its softmax: its norm's, its
            # projections' inputs, q and the (repeated) K and V
            kv_width = "N·q" if spec.num_kv_heads < spec.num_attention_heads else "N·kvd"
            before = Tally()
            ctx.norm(before)
            attn_in = [lin for lin in group.linears if linear_position(lin) == "attn_in"]
            ctx.consumers_save(before, d, "N·h", attn_in)
            before.add(c, "N·q")
            before.add(2 * c, kv_width)
            below -= acts.per_block_bytes(group) - before.evaluate(dims)
            live = residual + masks + (m + upcast + 4) * scores
            text = "the masked scores, their fp32 upcast and softmax + the masks"
        moments.append(
            PhaseBudget(
                phase=Phase.FORWARD,
                moment="the last block's eager attention (no vocabulary logits)",
                components={
                    **held,
                    Component.ACTIVATIONS: Term(bytes=round(below), formula=below_text),
                    Component.TEMPORARIES: Term(bytes=round(live), formula=text),
                },
            )
        )
    return moments


def final_norm_moments(
    spec: ModelSpec, setup: TrainingSetup, forward: PhaseBudget
) -> tuple[PhaseBudget | None, PhaseBudget | None]:
    """Under a score head nothing vocabulary-sized outweighs the final RMSNorm, whose forward
    and backward are then the model's peaks outside the blocks. transformers' RMSNorm
    (Llama's, Qwen2's: `x.to(float32)`, `x * rsqrt(x.pow(2).mean(-1) + eps)`, `weight *
    x.to(input_dtype)`) runs written out:

    - forward, as its output is made: the input (still the caller's), its fp32 copy, the
      fp32 normalised tensor (the function's local), its cast back and the output; under
      autocast over fp32 weights, once it has returned, the output (the model's local until
      its forward returns) beside the score head's 16-bit cast of it;
    - backward, in the `pow` branch: the gradient of the fp32 input from the rsqrt product
      waits in autograd's buffer while the mean's expanded gradient, `x.pow(1)`, its double
      and their product are made: five fp32 tensors of N·h, beside every block's saved
      tensors and the fp32 input the `pow` keeps.

    Gemma's RMSNorm runs the same way in fp32 and casts its product back; LayerNorm's fused
    kernel is left to the blocks' moments."""
    if spec.norm == "layernorm" or not spec.blocks:
        return None, None
    dt = dtypes_for(setup)
    n_h = setup.tokens * spec.hidden_size
    d = dt.residual
    copies = d != 4  # x.to(float32) copies a 16-bit input; an fp32 one is returned as is
    trains = trainability_for(spec, setup).base_trains
    if spec.norm == "gemma_rmsnorm":
        # Gemma's `(x.float() normalised) * (1 + weight.float())`, then `.type_as(x)`: the
        # fp32 product and, for a 16-bit input, the input and the product's cast back
        making = d + 4 + d if copies else 4 + (0 if trains else 4)
        normalised = 4
    else:
        # (a frozen weight's product keeps no normalised tensor: alive only as it is read)
        making = (d + 4 if copies else 0) + d + (0 if trains else d)
        normalised = d
    returned = d + (2 if dt.autocast and not copies else 0)
    held: dict[Component, Term] = {
        k: v
        for k, v in forward.components.items()
        if k not in (Component.LOGITS, Component.TEMPORARIES)
    }
    in_forward = PhaseBudget(
        phase=Phase.FORWARD,
        moment="the final norm's forward (no vocabulary logits)",
        components={
            **held,
            Component.TEMPORARIES: Term(
                bytes=max(making, returned) * n_h,
                formula=(
                    f"{d}·N·h input + 4·N·h fp32 normalised + {d}·N·h output"
                    if making >= returned
                    else f"{d}·N·h output + 2·N·h the score head's cast of it"
                ),
            ),
        },
    )
    acts = forward.components.get(Component.ACTIVATIONS, Term(0, ""))
    # the weight product's backward has run: the normalised tensor it kept is gone
    saved = max(acts.bytes - (normalised * n_h if trains else 0), 0)
    in_backward = PhaseBudget(
        phase=Phase.BACKWARD,
        moment="the final norm's backward (no vocabulary logits)",
        components={
            **held,
            Component.ACTIVATIONS: Term(
                bytes=saved, formula=acts.formula + " (the norm's weight product done)"
            ),
            Component.TEMPORARIES: Term(
                bytes=5 * 4 * n_h, formula="5·4·N·h (the pow branch of the norm's backward)"
            ),
        },
    )
    return in_forward, in_backward


def embedding_last(phase: PhaseBudget, spec: ModelSpec, setup: TrainingSetup) -> PhaseBudget:
    """The token embedding is the last weight backward reaches: while the first block's
    gradients are computed its gradient does not exist yet, under a score head as under an LM
    head (the SFT step counts this for causal LMs)."""
    if phase.moment != "backward of the first block" or setup.method is not Method.FULL:
        return phase
    if setup.grad_accum > 1 or setup.distributed.is_multi_gpu:
        return phase
    gradients = phase.components.get(Component.GRADIENTS)
    if gradients is None:
        return phase
    embedding = spec.vocab_size * spec.hidden_size * setup.precision.weight_bytes
    parts = dict(phase.components)
    parts[Component.GRADIENTS] = Term(
        bytes=max(gradients.bytes - embedding, 0),
        formula=gradients.formula + " − the token embedding's (still to come)",
    )
    return PhaseBudget(phase=phase.phase, moment=phase.moment, components=parts)


def value_head_logits_moment(
    spec: ModelSpec, setup: TrainingSetup, forward_end: PhaseBudget
) -> PhaseBudget:
    """The end of the value-head model's forward (TRL 0.24, trl/models/modeling_value_head.py
    `AutoModelForCausalLMWithValueHead.forward`, as LLaMA-Factory 0.9.5's rm stage runs it): the
    causal LM's full logits in the compute dtype, the log_softmax of its own cross-entropy (the
    pairwise collator passes `labels`: transformers' ForCausalLMLoss upcasts and takes it, and
    the unread loss keeps it) and the logits' fp32 upcast (`lm_logits.float()`), all alive
    until it returns, beside every tensor the forward saved; with fp32 weights under autocast,
    autocast's 16-bit cast of the head's weight too."""
    compute = dtypes_for(setup).compute
    whole = setup.batch * setup.seq * spec.vocab_size
    logits = compute * whole + 4 * whole + (4 * whole if compute != 4 else 0)
    count = f"{setup.batch}×{setup.seq}×{format_count(spec.vocab_size)}"
    text = (
        f"{compute} B × L = {count} (the LM logits) + 4 B × L (the log_softmax of the causal "
        "LM's own cross-entropy over the collator's labels, kept by that unread loss)"
        + (" + 4 B × L (the logits' fp32 upcast)" if compute != 4 else "")
    )
    if spec.final_logit_softcapping is not None:
        # Gemma-2's capping keeps its tanh for a backward that never comes, until the logits go
        logits += compute * whole
        text += f" + {compute} B × L (the soft-capping's tanh, kept by the graph)"
    parts = dict(forward_end.components)
    parts[Component.LOGITS] = Term(bytes=logits, formula=text)
    # the value head's input: the last hidden state (kept by the output's hidden_states)
    # through dropout (CUDA's fused kernel: a 1-byte mask) in the hidden states' dtype, cast
    # to the head's fp32 where it differs, kept by the head's matmul
    tokens = setup.batch * setup.seq * spec.hidden_size
    residual = 4 if setup.precision.weight_bytes == 4 else 2
    head_input = tokens * (1 + residual + residual + (4 if residual != 4 else 0))
    temporaries = parts.get(Component.TEMPORARIES, Term(0, ""))
    parts[Component.TEMPORARIES] = Term(
        bytes=temporaries.bytes + head_input,
        formula=(temporaries.formula + " + " if temporaries.bytes else "")
        + "the value head's input: the last hidden state, its dropout mask and output"
        + (" and fp32 cast" if residual != 4 else ""),
    )
    if setup.precision.is_autocast and setup.precision.weight_bytes == 4:
        copies = parts.get(Component.WEIGHT_COPIES, Term(0, ""))
        head = 2 * spec.vocab_size * spec.hidden_size
        parts[Component.WEIGHT_COPIES] = Term(
            bytes=copies.bytes + head,
            formula=(copies.formula + " + " if copies.bytes else "")
            + "2 B × V × h (autocast's cast of the LM head)",
        )
    return PhaseBudget(
        phase=Phase.FORWARD,
        moment="end of the value-head model's forward: the LM logits made and upcast, unread",
        components=parts,
    )


def with_lm_head(phase: PhaseBudget, spec: ModelSpec, setup: TrainingSetup) -> PhaseBudget:
    """`phase` with the value-head model's LM head among the weights (untied: a tied head is
    the embedding, counted already): trainable in full fine-tuning, upcast with the rest, but
    never given a gradient, so neither gradients nor optimizer states."""
    weights = phase.components.get(Component.WEIGHTS)
    if weights is None or spec.tie_word_embeddings:
        return phase
    size = 2 if setup.quant is not None else setup.precision.weight_bytes
    head = size * spec.vocab_size * spec.hidden_size
    parts = dict(phase.components)
    parts[Component.WEIGHTS] = Term(
        bytes=weights.bytes + head,
        formula=weights.formula + f" + V × h × {size} B (the LM head, no gradient)",
    )
    return replace(phase, components=parts)

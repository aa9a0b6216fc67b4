"""PPO's rollout: generation and the forwards without gradient that score it.

Generation (the policy's, chunk by chunk, its KV cache and the fp32 scores TRL 0.29.1 keeps, or
the vLLM engines' reservation) and the rollout's forwards over query + response (the reference's
logits and log-softmax, beside every layer's hidden states; the value and reward models'
backbones), all outside autocast, in the weights' dtype. llmmem.budget.ppo puts them before the
update's training moments.
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.activations import dtypes_for, eager_mask_kinds
from llmmem.budget.generation import kv_cache_term
from llmmem.budget.ppo_models import PpoModels
from llmmem.budget.ppo_setup import PpoSetup
from llmmem.budget.preference_setup import Reference
from llmmem.budget.result import Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import AttnImpl, Precision, SetupError, TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes, format_count


def rollout_bytes(setup: TrainingSetup) -> int:
    """The dtype the rollout computes in: the weights' under mixed precision (the unwrapped
    models run outside autocast), the compute dtype otherwise."""
    dt = dtypes_for(setup)
    if setup.precision.is_autocast and setup.quant is None:
        return setup.precision.weight_bytes
    return dt.compute


def rollout_setup(setup: TrainingSetup) -> TrainingSetup:
    """The setup the rollout's models compute under: outside autocast."""
    if setup.precision is Precision.BF16_AUTOCAST and setup.quant is None:
        return replace(setup, precision=Precision.BF16_TRUE)
    if setup.precision.is_autocast and setup.quant is None:
        return replace(
            setup,
            precision=Precision.FP32 if setup.precision.weight_bytes == 4 else setup.precision,
        )
    return setup


def hidden_states_bytes(spec: ModelSpec, rows: int, seq: int, size: int) -> int:
    """`output_hidden_states=True`: the embeddings' output and every block's, the last one
    normalised: blocks + 1 tensors of rows × seq × hidden."""
    blocks = sum(g.count for g in spec.blocks if g.name != "encoder")
    return (blocks + 1) * rows * seq * spec.hidden_size * size


def eager_attention_bytes(
    spec: ModelSpec, setup: TrainingSetup, rows: int, seq: int, size: int
) -> int:
    """One layer's eager attention without gradient (0 under SDPA): the scores in `size`, their
    fp32 copy (16-bit) and fp32 softmax (`softmax(..., dtype=float32)`), the masks transformers
    builds once per forward and per kind of layer (Gemma-2: full and sliding), and grouped K/V
    heads repeated to every query head (`repeat_kv`)."""
    if setup.attn is not AttnImpl.EAGER and spec.supports_sdpa:
        return 0
    kinds = eager_mask_kinds(spec)
    square = rows * seq * seq
    scores = (size + (4 if size != 4 else 0) + 4) * spec.num_attention_heads * square
    grouped = spec.num_kv_heads < spec.num_attention_heads
    repeated = 2 * size * rows * seq * spec.q_dim if grouped else 0
    return scores + kinds * size * square + repeated


def block_bytes(spec: ModelSpec, rows: int, seq: int, size: int) -> int:
    """One block's intermediates without gradient."""
    return size * rows * seq * (3 * spec.intermediate_size + 4 * spec.hidden_size)


def decoder_blocks(spec: ModelSpec) -> int:
    return sum(g.count for g in spec.blocks if g.name != "encoder")


def vllm_engine_term(ppo: PpoSetup, gpu: GpuTarget | None) -> Term | None:
    """The colocated vLLM engines' reservation on this GPU (None: no engine here)."""
    if ppo.vllm != "colocate":
        return None
    if gpu is None:
        raise SetupError(
            "colocated vLLM engines reserve a fraction of the GPU's memory "
            "(vllm_gpu_memory_utilization): name the GPU (--gpu NAME or a capacity such as "
            "80GiB)"
        )
    return Term(
        bytes=int(ppo.vllm_gpu_memory_utilization * gpu.capacity_bytes),
        formula=f"vllm_gpu_memory_utilization {ppo.vllm_gpu_memory_utilization:g} × "
        f"{format_bytes(gpu.capacity_bytes)} ({gpu.name}): the colocated engines' weights and "
        "KV cache",
    )


def generation_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    ppo: PpoSetup,
    held: dict[Component, Term],
    kept: Term,
    first: bool,
    rows_local: int,
    chunk: int,
    last_chunk: int,
    padded_rows: int,
) -> PhaseBudget:
    """The larger of the last chunk's last generated token and the padding of the chunks'
    scores into one tensor."""
    q, r_len = ppo.query_length or setup.seq, ppo.response_length
    vocab = spec.vocab_size
    score_row = r_len * vocab * 4
    old = 0 if first else kept.bytes
    parts = dict(held)
    if not ppo.keep_scores:
        old = 0
    # the padding: the chunks' stacked scores, the padded copy, the update before's
    pad = (rows_local + padded_rows) * score_row if ppo.keep_scores else 0
    # the last chunk's scores stacked while `generate`'s output (its scores and its KV cache)
    # is alive; without kept scores, its last generated token
    blocks = decoder_blocks(spec)
    cached = max(q + r_len - 1, 1)
    kv = kv_cache_term(
        spec, replace(rollout_setup(setup), batch=last_chunk, seq=cached, new_tokens=0)
    )
    ids = 8 * last_chunk * (q + r_len) * 2
    before = (rows_local - last_chunk) * score_row if ppo.keep_scores else 0
    if ppo.keep_scores:
        own = 2 * last_chunk * score_row
        own_text = (
            f"2 × 4 B × {last_chunk} rows × {r_len} × {format_count(vocab)} (the chunk's scores "
            "and their stacked copy)"
        )
    else:
        one_layer = kv.bytes // max(2 * blocks, 1) if blocks else 0
        own = one_layer + 4 * last_chunk * vocab * 3
        own_text = "one layer's keys copied as the cache grows + 3 × 4 B × rows × V (the last "
        "position's fp32 logits, processed scores and sampling probabilities)"
    last = kv.bytes + ids + own + before
    # the last chunk's prefill: the queries' cache and one block's intermediates
    rollout = rollout_setup(setup)
    prefill_cache = kv_cache_term(spec, replace(rollout, batch=last_chunk, seq=q, new_tokens=0))
    block = block_bytes(spec, last_chunk, q, dtypes_for(rollout).compute)
    prefill = prefill_cache.bytes + block + before
    if prefill > max(pad, last):
        parts[Component.KV_CACHE] = Term(
            bytes=prefill_cache.bytes, formula=f"the queries' cache ({q} tokens)"
        )
        parts[Component.ACTIVATIONS] = Term(
            bytes=block, formula=f"N = {last_chunk}×{q}: one block's intermediates at the prefill"
        )
        if before + old:
            parts[Component.LOGITS] = Term(
                bytes=before + old,
                formula="the chunks before's scores" + (" and the update before's" if old else ""),
            )
        moment = f"prefill of the last chunk ({last_chunk} queries)"
    elif pad >= last:
        parts[Component.LOGITS] = Term(
            bytes=pad + old,
            formula=f"4 B × ({rows_local} + {padded_rows}) rows × {r_len} × "
            f"{format_count(vocab)} (the chunks' scores and their padded copy)"
            + (" + the update before's, still kept" if old else ""),
        )
        moment = "the generation scores padded into one tensor"
    else:
        parts[Component.KV_CACHE] = kv
        parts[Component.LOGITS] = Term(
            bytes=own + before + old,
            formula=own_text
            + (
                f" + 4 B × {rows_local - last_chunk} rows × {r_len} × V (the chunks before's)"
                if before
                else ""
            )
            + (" + the update before's scores, still kept" if old else ""),
        )
        parts[Component.TEMPORARIES] = Term(bytes=ids, formula="the token ids and mask (int64)")
        moment = (
            f"the last chunk's ({last_chunk} queries) scores stacked, its KV cache alive"
            if ppo.keep_scores
            else f"last generated token of the last chunk ({last_chunk} queries)"
        )
    return PhaseBudget(phase=Phase.GENERATE, moment=moment, components=parts)


def rollout_phase(
    spec: ModelSpec,
    setup: TrainingSetup,
    ppo: PpoSetup,
    models: PpoModels,
    reference: Reference,
    held: dict[Component, Term],
    kept: Term,
    chunk: int,
    residual: int,
) -> PhaseBudget:
    """The rollout's forwards without gradient, `chunk` queries at a time, at their largest: the
    reference's (or the actor's own) forward with its logits and their log-softmax, its
    soft-capped head or its eager attention, or the value or reward model's backbone. `ppo` is
    resolved; `residual` is the training step's residual stream's bytes."""
    seq = ppo.seq
    e_roll = rollout_bytes(setup)
    vocab = spec.vocab_size
    r_len = ppo.response_length
    rollout = dict(held)
    if kept.bytes:
        rollout[Component.LOGITS] = kept
    candidates: list[tuple[int, str, str]] = []
    ref_hidden = hidden_states_bytes(spec, chunk, seq, e_roll if residual != 4 else 4)
    ref_logits = chunk * seq * vocab * e_roll
    ref_cache = kv_cache_term(
        spec, replace(rollout_setup(setup), batch=chunk, seq=seq, new_tokens=0)
    )
    row_temp = r_len * vocab * (4 if e_roll == 4 else e_roll)
    row_text = "one row's " + ("fp32 logsumexp temporary" if e_roll == 4 else "log-softmax")
    if ppo.trainer == "llamafactory":
        # TRL 0.9.6's batched_forward_pass: the logits upcast to fp32 beside the model's, and
        # a whole fp32 log_softmax
        row_temp = 2 * 4 * chunk * seq * vocab
        row_text = "2 × 4 B × the logits (TRL 0.9: their fp32 upcast and whole log-softmax)"
    elif ppo.trainer == "openrlhf":
        # OpenRLHF 0.11.0 models/actor.py: `output["logits"].to(torch.float32)`, then a
        # chunked logsumexp or flash-attn's cross-entropy over them
        row_temp = 4 * chunk * seq * vocab
        row_text = "4 B × the logits (OpenRLHF's actor: their fp32 copy)"
    # OpenRLHF with the reference on GPUs of its own: the actor's own (old) log-probabilities
    whose = "the actor's" if reference is Reference.NONE else "the reference"
    candidates.append(
        (
            ref_hidden + ref_cache.bytes + ref_logits + row_temp,
            f"{whose} forward's logits: its hidden states, the whole sequence's logits "
            "and their log-softmax",
            f"({decoder_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states + "
            f"{e_roll} B × {chunk}×{seq}×{format_count(vocab)} logits + its unused KV cache ("
            + ref_cache.formula
            + ") + "
            + row_text,
        )
    )
    if spec.final_logit_softcapping is not None:
        # Gemma-2's soft-capped head (`logits / cap`, tanh, `* cap`): each step a new
        # whole-sequence tensor beside the one before; the first, the head's output beside its
        # division by the cap, can outweigh the log-softmax's moment
        candidates.append(
            (
                ref_hidden + ref_cache.bytes + 2 * ref_logits,
                f"{whose} forward's soft-capped head: its hidden states and two "
                "whole-sequence copies",
                f"({decoder_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states + "
                f"2 × {e_roll} B × {chunk}×{seq}×{format_count(vocab)} (the head's output and "
                f"its division by the cap) + its unused KV cache ({ref_cache.formula})",
            )
        )
    ref_eager = eager_attention_bytes(spec, setup, chunk, seq, e_roll)
    if ref_eager:
        candidates.append(
            (
                ref_hidden + ref_cache.bytes + ref_eager,
                f"{whose} forward's eager attention",
                f"({decoder_blocks(spec)} + 1) × {chunk}×{seq}×{spec.hidden_size} hidden states "
                f"+ its KV cache ({ref_cache.formula}) + one layer's scores, their fp32 softmax, "
                "the masks and K/V repeated to every head",
            )
        )
    for name, model in (("value", models.value), ("reward", models.reward)):
        if model is None:
            continue
        size = e_roll if residual != 4 else 4
        hidden = hidden_states_bytes(model, chunk, seq, size)
        block = block_bytes(model, chunk, seq, e_roll)
        eager = eager_attention_bytes(model, setup, chunk, seq, e_roll)
        candidates.append(
            (
                hidden + max(block, eager),
                f"the {name} model's backbone",
                f"({decoder_blocks(model)} + 1) hidden states of "
                f"{chunk}×{seq}×{model.hidden_size} + "
                + (
                    "one layer's eager attention (scores, fp32 softmax, masks, K/V repeated)"
                    if eager > block
                    else "one block's intermediates"
                ),
            )
        )
    best = max(candidates, key=lambda c: c[0])
    rollout[Component.ACTIVATIONS] = Term(bytes=best[0], formula=best[2])
    return PhaseBudget(
        phase=Phase.REFERENCE_FORWARD,
        moment=f"rollout, {chunk} queries at a time without gradient: {best[1]}",
        components=rollout,
    )

"""Inference and generation: the weights, the KV cache and one forward's transients.

KV cache = 2 (K and V) × blocks × kv_heads × head_dim × tokens × batch × bytes, where blocks with
a sliding window keep at most `sliding_window` tokens; multi-head latent attention caches its
compressed latent (kv_lora_rank + qk_rope_head_dim per token and block) instead of K and V.
"""

from __future__ import annotations

from llmmem.budget.activations import dtypes_for
from llmmem.budget.bands import band_class
from llmmem.budget.overheads import overhead_terms, reserved_and_device_total
from llmmem.budget.result import Budget, Component, GpuTarget, Phase, PhaseBudget, Term
from llmmem.budget.setup import TrainingSetup
from llmmem.budget.weights import build_inventory
from llmmem.models.spec import ModelSpec
from llmmem.units import format_count


def kv_cache_term(spec: ModelSpec, setup: TrainingSetup) -> Term:
    e = dtypes_for(setup).compute
    tokens = setup.seq + setup.new_tokens
    blocks = sum(g.count for g in spec.blocks if g.name != "encoder")
    sliding = min(spec.sliding_layers, blocks)
    window = spec.sliding_window or tokens
    full_blocks = blocks - sliding
    per_token_block = spec.kv_cache_dim * e * setup.batch
    total = per_token_block * (full_blocks * tokens + sliding * min(tokens, window))
    if spec.kv_cache_per_token is not None:  # multi-head latent attention caches its latent
        per_block = f"{full_blocks} blocks × a {spec.kv_cache_per_token}-wide latent"
    else:
        per_block = f"2 × {full_blocks} blocks × {spec.num_kv_heads} kv heads × {spec.head_dim}"
    formula = f"{per_block} × {format_count(tokens)} tokens × batch {setup.batch} × {e} B"
    if sliding:
        formula += (
            f" + the same for {sliding} sliding-window blocks at "
            f"{format_count(min(tokens, window))} tokens"
        )
    return Term(bytes=total, formula=formula)


def decode_attention_copies(spec: ModelSpec, setup: TrainingSetup, kv: Term) -> Term:
    """What one decoding step's attention adds beside the cache `kv` (a Term over every
    block) in the layer it runs: the layer's old keys beside the new ones while the cache
    grows (`torch.cat`); with eager attention (transformers' `repeat_kv`, always called there)
    grouped K/V heads are first repeated to every query head: the layer's K and V copied,
    query heads / kv heads times. SDPA packs the single query instead (`pack_gqa`): no copy."""
    blocks = sum(g.count for g in spec.blocks if g.name != "encoder")
    if not blocks:
        return Term(bytes=0, formula="none")
    one_layer = kv.bytes // (2 * blocks)
    eager = setup.attn.value == "eager" or not spec.supports_sdpa
    groups = spec.num_attention_heads // max(spec.num_kv_heads, 1)
    if eager and groups > 1 and spec.kv_cache_per_token is None:
        return Term(
            bytes=2 * groups * one_layer,
            formula=f"one layer's K and V repeated to the {spec.num_attention_heads} query "
            "heads (eager attention's repeat_kv)",
        )
    return Term(bytes=one_layer, formula="one layer's keys copied as the cache grows")


def estimate_generation(spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget | None) -> Budget:
    inv = build_inventory(spec, setup)
    e = dtypes_for(setup).compute
    weights = Term(
        bytes=inv.weight_bytes,
        formula=f"{format_count(inv.params)} params at {inv.base_bytes_per_param:g} B",
    )
    kv = kv_cache_term(spec, setup)
    n = setup.tokens  # the prompt, processed at once (prefill)
    prefill = e * n * (3 * spec.intermediate_size + 4 * spec.hidden_size)
    if setup.attn.value == "eager" or not spec.supports_sdpa:
        prefill += (4 + e) * setup.batch * spec.num_attention_heads * setup.seq**2
    logits = 4 * setup.batch * spec.vocab_size  # generate() keeps only the last position's logits
    phase = PhaseBudget(
        phase=Phase.GENERATE,
        moment="prefill of the prompt with a full cache",
        components={
            Component.WEIGHTS: weights,
            Component.KV_CACHE: kv,
            Component.ACTIVATIONS: Term(
                bytes=prefill,
                formula=f"{e}·N·(3·I + 4·h): one block's intermediates during prefill",
            ),
            Component.LOGITS: Term(bytes=logits, formula="4 B × batch × V (last position)"),
        },
    )
    overheads = overhead_terms(
        setup, prefill + logits, sum(g.tensors for g in inv.groups if g.numel > 2**19)
    )
    reserved, total = reserved_and_device_total(phase.allocated_bytes, overheads)
    return Budget(
        phases=[phase],
        peak_phase=Phase.GENERATE,
        allocated_peak_bytes=phase.allocated_bytes,
        overheads=overheads,
        reserved_peak_bytes=reserved,
        device_total_bytes=total,
        gpu=gpu,
        params=inv.params,
        trainable_params=0,
        notes=list(spec.notes),
        band_class=band_class(setup),
    )

"""Tensor parallelism: each block's Linears split over a group of ranks, as transformers' own
plan does it (transformers 5.24 `base_model_tp_plan`, `from_pretrained(tp_plan="auto")`, and
accelerate's `ParallelismConfig(tp_size=...)` with FSDP2 over the other ranks, torchtitan's
plan for Llama the same):

- the projections that read the residual stream are split by their outputs ("colwise": q, k,
  v, gate, up): each rank holds `out / tp` rows, and computes `heads / tp` query heads,
  `kv_heads / tp` key and value heads and `intermediate / tp` of the MLP;
- the projections back to it are split by their inputs ("rowwise": o, down): each rank holds
  `in / tp` columns and its partial sums are all-reduced, so the block's output, the residual
  stream and the norms (whole on every rank) are the full width;
- the LM head is split by the vocabulary and its output gathered ("colwise_gather_output"):
  each rank holds `vocab / tp` rows of it, and the whole logits; the embedding stays whole (a
  head tied to it then stays whole too).

So one rank's step is the step of a narrower model: this module gives that model, whose weights,
gradients and states (sharded again by FSDP or ZeRO over the data-parallel ranks), and whose
saved tensors inside attention and the MLP, are one rank's. Routed experts are split by expert
parallelism, not by this plan: a MoE model is refused."""

from __future__ import annotations

from dataclasses import replace

from llmmem.budget.result import Term
from llmmem.budget.setup import SetupError, TrainingSetup
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

COLWISE = ("attn_in", "mlp_in")
ROWWISE = ("attn_out", "mlp_out")


def _position(lin: LinearModule) -> str:
    from llmmem.budget.activations import linear_position

    return linear_position(lin)


def _split(lin: LinearModule, tp: int) -> LinearModule:
    position = _position(lin)
    if position in COLWISE:
        return replace(lin, out_features=lin.out_features // tp)
    if position in ROWWISE:
        # a rowwise Linear's bias is added once, after the all-reduce: kept whole
        return replace(lin, in_features=lin.in_features // tp)
    return lin


def tensor_parallel_spec(spec: ModelSpec, tp: int) -> tuple[ModelSpec, list[str]]:
    """The model one rank of a tensor-parallel group of `tp` computes."""
    if tp <= 1:
        return spec, []
    if spec.num_experts:
        raise SetupError(
            f"tensor parallelism of a mixture of experts ({spec.model_id}) splits its experts by "
            "expert parallelism, which llmmem does not size"
        )
    if spec.vision is not None:
        raise SetupError(
            f"tensor parallelism of a vision-language model ({spec.model_id}) is not sized: "
            "its vision encoder follows a plan of its own"
        )
    for what, count in (
        ("query heads", spec.num_attention_heads),
        ("key and value heads", spec.num_kv_heads),
        ("MLP width", spec.intermediate_size),
    ):
        if count % tp:
            raise SetupError(
                f"the {what} of {spec.model_id} ({count}) do not divide over a "
                f"tensor-parallel group of {tp}"
            )
    blocks: list[BlockGroup] = []
    for group in spec.blocks:
        for lin in group.linears:
            if _position(lin) not in (*COLWISE, *ROWWISE):
                raise SetupError(
                    f"{spec.model_id}'s {lin.path} has no place in the tensor-parallel plan "
                    "llmmem knows (q, k, v, o, gate, up, down)"
                )
        blocks.append(replace(group, linears=[_split(lin, tp) for lin in group.linears]))
    attention = sum(
        lin.params * group.count
        for group in blocks
        for lin in group.linears
        if _position(lin) in ("attn_in", "attn_out")
    )
    mlp = sum(
        lin.params * group.count
        for group in blocks
        for lin in group.linears
        if _position(lin) in ("mlp_in", "mlp_out")
    )
    head = spec.params.head // tp if not spec.tie_word_embeddings else spec.params.head
    params = replace(spec.params, attention=attention, mlp=mlp, head=head)
    local = replace(
        spec,
        num_attention_heads=spec.num_attention_heads // tp,
        num_kv_heads=spec.num_kv_heads // tp,
        intermediate_size=spec.intermediate_size // tp,
        params=params,
        blocks=blocks,
    )
    notes = [
        f"tensor parallelism over {tp} ranks: each holds 1/{tp} of every block's q, k, v, o, "
        f"gate, up and down projections ({spec.num_attention_heads // tp} query heads, "
        f"{spec.num_kv_heads // tp} key and value heads, {spec.intermediate_size // tp} of the "
        "MLP), the norms and the embedding whole, "
        + (
            "the LM head tied to it whole"
            if spec.tie_word_embeddings
            else f"1/{tp} of the LM head and the whole logits, gathered"
        )
    ]
    return local, notes


def logits_shard(spec: ModelSpec, setup: TrainingSetup, compute_bytes: int) -> list[Term]:
    """The LM head's own output on one rank, its share of the vocabulary, before the gather:
    alive through forward to the loss (measured on 2 and 4 CPU ranks, torch 2.13 DTensor)."""
    tp = setup.distributed.tp_size
    if tp <= 1 or not spec.is_causal_lm or spec.tie_word_embeddings:
        return []
    b, s = setup.attention_shape
    size = b * s * (spec.vocab_size // tp) * compute_bytes
    return [Term(bytes=size, formula=f"e·N·V/{tp} (the head's share of the logits, gathered)")]

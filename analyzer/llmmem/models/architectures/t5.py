"""T5 and mT5 as `T5ForConditionalGeneration` / `MT5ForConditionalGeneration`: an encoder and a
decoder stack sharing one embedding, RMS-style T5LayerNorm without bias, relative position biases
in the first block of each stack, decoder cross-attention, and an LM head that T5 v1.0 ties to
the embedding and T5 v1.1, Flan-T5 and mT5 keep separate."""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    attention_projections,
    build_spec,
    linear,
    plain_mlp,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

T5_DEFAULTS = {
    "d_kv": 64,
    "num_decoder_layers": None,
    "relative_attention_num_buckets": 32,
    "feed_forward_proj": "relu",
    "tie_word_embeddings": True,
}

MT5_DEFAULTS = {**T5_DEFAULTS, "feed_forward_proj": "gated-gelu"}


def _attention(prefix: str, dims: Dims) -> list[LinearModule]:
    return attention_projections(dims, prefix=prefix, names=("q", "k", "v", "o"))


def _feed_forward(prefix: str, *, d_model: int, d_ff: int, gated: bool) -> list[LinearModule]:
    if gated:  # T5 v1.1 / mT5: wo(act(wi_0 x) * wi_1 x)
        return [
            linear(f"{prefix}.wi_0", d_model, d_ff, role="mlp"),
            linear(f"{prefix}.wi_1", d_model, d_ff, role="mlp"),
            linear(f"{prefix}.wo", d_ff, d_model, role="mlp"),
        ]
    return plain_mlp(f"{prefix}.wi", f"{prefix}.wo", hidden=d_model, intermediate=d_ff, bias=False)


def _activation(feed_forward_proj: str) -> tuple[str, bool]:
    """(activation, gated) as T5Config derives them from `feed_forward_proj`."""
    parts = feed_forward_proj.split("-")
    gated = parts[0] == "gated"
    if feed_forward_proj == "gated-gelu":
        return "gelu_new", gated
    return parts[-1], gated


def _read_t5(view: ConfigView, origin: SpecOrigin, *, architecture: str) -> ModelSpec:
    d_model = view.required_int("d_model", "hidden_size")
    heads = view.required_int("num_heads", "num_attention_heads")
    d_kv = view.int_or(64, "d_kv")
    d_ff = view.required_int("d_ff")
    encoder_layers = view.required_int("num_layers", "num_hidden_layers")
    decoder_layers = view.int_or(encoder_layers, "num_decoder_layers")
    activation, gated = _activation(view.text("feed_forward_proj") or "relu")
    tied = view.flag("tie_word_embeddings")
    dims = Dims(
        hidden=d_model,
        layers=encoder_layers + decoder_layers,
        heads=heads,
        kv_heads=heads,
        head_dim=d_kv,
        intermediate=d_ff,
        vocab=view.required_int("vocab_size"),
        tie_embeddings=tied,
        max_positions=None,
    )
    encoder = BlockGroup(
        name="encoder",
        count=encoder_layers,
        linears=[
            *_attention("layer.0.SelfAttention", dims),
            *_feed_forward("layer.1.DenseReluDense", d_model=d_model, d_ff=d_ff, gated=gated),
        ],
        norm_params=2 * d_model,
    )
    decoder = BlockGroup(
        name="decoder",
        count=decoder_layers,
        linears=[
            *_attention("layer.0.SelfAttention", dims),
            *_attention("layer.1.EncDecAttention", dims),
            *_feed_forward("layer.2.DenseReluDense", d_model=d_model, d_ff=d_ff, gated=gated),
        ],
        norm_params=3 * d_model,
    )
    buckets = view.int_or(32, "relative_attention_num_buckets")
    # relative_attention_bias: an embedding of buckets x heads in block 0 of each stack only
    relative_bias = 2 * buckets * heads
    notes = [
        "relative position biases (first block of the encoder and of the decoder) counted under "
        "other",
    ]
    if not tied:
        notes.append(
            "tie_word_embeddings is false: the checkpoint's separate lm_head is counted; "
            "transformers 5 builds T5 tied from a config alone and unties it when loading such "
            "a checkpoint"
        )
    return build_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[encoder, decoder],
        embedding=dims.vocab * d_model,
        head=0 if tied else dims.vocab * d_model,
        model_norms=2 * d_model,  # final_layer_norm of the encoder and of the decoder
        model_other=relative_bias,
        norm="rmsnorm",
        mlp="gated" if gated else "plain",
        activation=activation,
        is_encoder_decoder=True,
        notes=notes,
    )


def read_t5(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_t5(view, origin, architecture="T5ForConditionalGeneration")


def read_mt5(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_t5(view, origin, architecture="MT5ForConditionalGeneration")


READERS = [
    ArchitectureReader("t5", "T5Config", T5_DEFAULTS, read_t5),
    ArchitectureReader("mt5", "MT5Config", MT5_DEFAULTS, read_mt5),
]

"""Any decoder-only model from its `config.json`, when its `model_type` has no reader of its own.

The sizes are read under the usual spellings (`hidden_size`/`n_embd`/`d_model`,
`num_hidden_layers`/`n_layer`/`num_layers`, `intermediate_size`/`n_inner`/`ffn_dim`/
`ffn_hidden_size`, heads and key/value heads, `multi_query`, `tie_word_embeddings`, routed experts)
and the model is laid out as the two shapes nearly every decoder takes:

- configs named the GPT-2 way (`n_embd`, `n_layer`): LayerNorm blocks with a fused query/key/value
  projection, a plain MLP (4·hidden unless stated) and learned positions;
- all others the Llama way: RMSNorm (LayerNorm where the config has `layer_norm_eps` and no
  `rms_norm_eps`), separate q/k/v/o projections with grouped-query heads, a gated MLP (a plain one
  where the activation is not SiLU), rotary positions, and routed experts per block where the
  config counts them.

Biases, extra norms and unusual projections are not known, so the count can differ by a few
parts in a thousand from the real class; the spec says it was read this way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    attention_projections,
    decoder_group,
    decoder_only_spec,
    fused_experts,
    gated_mlp,
    layer_norm_params,
    linear,
    plain_mlp,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec

HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "n_embed", "dim")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
INTERMEDIATE_KEYS = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
GATED_ACTIVATIONS = ("silu", "swish", "swiglu")

GENERIC_DEFAULTS: dict[str, object] = {}


def generic_reader(model_type: str, config: Mapping[str, Any]) -> ArchitectureReader | None:
    """The generic reader for a `model_type` without its own, where the config states a decoder's
    sizes and is not an encoder-decoder; None otherwise."""
    view = ConfigView(model_type=model_type, config_class="", values=config, defaults={})
    if config.get("is_encoder_decoder") or not is_decoder_config(view):
        return None
    return ArchitectureReader(
        model_type, "PretrainedConfig", GENERIC_DEFAULTS, read_generic_decoder
    )


def is_decoder_config(view: ConfigView) -> bool:
    """Whether the config states the sizes a decoder needs: width, depth, heads, vocabulary."""
    return all(
        view.is_saved(*keys) for keys in (HIDDEN_KEYS, LAYER_KEYS, HEAD_KEYS, ("vocab_size",))
    )


def read_generic_decoder(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    hidden = view.required_int(*HIDDEN_KEYS)
    heads = view.required_int(*HEAD_KEYS)
    gpt_named = view.is_saved("n_embd", "n_layer")
    if view.flag("multi_query"):
        kv_heads = 1
    else:
        kv_heads = view.int_or(heads, *KV_HEAD_KEYS)
    dims = Dims(
        hidden=hidden,
        layers=view.required_int(*LAYER_KEYS),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=view.int_or(hidden // heads, "head_dim"),
        intermediate=view.int_or(4 * hidden, *INTERMEDIATE_KEYS),
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings", "tie_embeddings")
        if view.is_saved("tie_word_embeddings", "tie_embeddings")
        else gpt_named,
        max_positions=view.optional_int(*POSITION_KEYS),
    )
    activation = (
        view.text("hidden_act", "activation_function", "activation")
        or ("gelu_new" if gpt_named else "silu")
    ).lower()
    architecture = (view.text_list("architectures") or [f"{view.model_type} (generic decoder)"])[0]
    note = (
        f"model_type {view.model_type!r} has no reader of its own: sized as a generic decoder "
        "from its config (the usual module layout; biases and extra norms are not known)"
    )
    if gpt_named:
        qkv = dims.heads * dims.head_dim + 2 * dims.kv_heads * dims.head_dim
        linears = [
            linear("attn.c_attn", hidden, qkv, bias=True, role="attention"),
            linear("attn.c_proj", hidden, hidden, bias=True, role="attention"),
            *plain_mlp(
                "mlp.c_fc", "mlp.c_proj", hidden=hidden, intermediate=dims.intermediate, bias=True
            ),
        ]
        return decoder_only_spec(
            view,
            origin,
            architecture=architecture,
            dims=dims,
            groups=[
                decoder_group(linears, layers=dims.layers, norm_params=4 * hidden),
            ],
            final_norms=layer_norm_params(hidden),
            learned_positions=dims.max_positions or 0,
            norm="layernorm",
            mlp="plain",
            activation=activation,
            notes=[note],
        )
    layer_norm = view.is_saved("layer_norm_eps", "layer_norm_epsilon") and not view.is_saved(
        "rms_norm_eps"
    )
    gated = activation in GATED_ACTIVATIONS
    experts = view.int_or(0, *EXPERT_KEYS)
    block: list[LinearModule] = attention_projections(dims)
    if experts:
        width = view.int_or(dims.intermediate, *EXPERT_WIDTH_KEYS)
        block += [
            linear("mlp.gate", hidden, experts, role="router"),
            *fused_experts("mlp.experts", hidden=hidden, intermediate=width, num_experts=experts),
        ]
    elif gated:
        block += gated_mlp("mlp", hidden=hidden, intermediate=dims.intermediate)
    else:
        block += plain_mlp(
            "mlp.up_proj",
            "mlp.down_proj",
            hidden=hidden,
            intermediate=dims.intermediate,
            bias=False,
        )
    norm_width = 2 * hidden if layer_norm else hidden
    top_k = view.int_or(0, "num_experts_per_tok", "moe_topk") if experts else 0
    group = BlockGroup(
        name="decoder",
        count=dims.layers,
        linears=block,
        norm_params=2 * norm_width,
        num_experts=experts,
        experts_per_token=top_k,
    )
    return decoder_only_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[group],
        final_norms=norm_width,
        norm="layernorm" if layer_norm else "rmsnorm",
        mlp="gated" if gated or experts else "plain",
        activation=activation,
        num_experts=experts,
        experts_per_token=top_k,
        notes=[note],
    )

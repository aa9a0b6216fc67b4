"""Mixture-of-experts decoders: Mixtral, Qwen1.5/2 MoE (with a shared expert), Qwen3 MoE, gpt-oss.

In transformers 5 the routed experts of these models are two fused 3-D parameters per layer
(`mlp.experts.gate_up_proj` and `mlp.experts.down_proj`), and the router is a bare weight
(`mlp.gate` or, in gpt-oss, `mlp.router` with a bias).
"""

from __future__ import annotations

from dataclasses import replace

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    alternating_layer_types,
    attention_projections,
    build_spec,
    count_sliding_layers,
    fused_experts,
    gated_mlp,
    linear,
    lm_head_params,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec


def _moe_dims(view: ConfigView, *, expert_width_key: str) -> Dims:
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    return Dims(
        hidden=hidden,
        layers=view.required_int("num_hidden_layers"),
        heads=heads,
        kv_heads=view.int_or(heads, "num_key_value_heads"),
        head_dim=view.int_or(hidden // heads, "head_dim"),
        intermediate=view.required_int(expert_width_key),
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=view.optional_int("max_position_embeddings"),
    )


def _num_experts(view: ConfigView, key: str) -> int:
    """Routed experts per sparse block (num_local_experts in Mixtral and gpt-oss, num_experts in
    Qwen)."""
    other = "num_experts" if key == "num_local_experts" else "num_local_experts"
    return view.int_or(0, key, other)


def _router(path: str, *, hidden: int, num_experts: int, bias: bool = False) -> LinearModule:
    return linear(path.rsplit(".", 1)[-1], path, hidden, num_experts, bias=bias, role="router")


def _moe_and_dense_groups(
    moe_linears: list[LinearModule],
    dense_linears: list[LinearModule],
    *,
    moe_layers: int,
    dense_layers: int,
    norm_params: int,
    num_experts: int,
    experts_per_token: int,
) -> list[BlockGroup]:
    groups = []
    if moe_layers:
        groups.append(
            BlockGroup(
                name="decoder",
                count=moe_layers,
                linears=moe_linears,
                norm_params=norm_params,
                num_experts=num_experts,
                experts_per_token=experts_per_token,
            )
        )
    if dense_layers:
        groups.append(
            BlockGroup(
                name="decoder_dense",
                count=dense_layers,
                linears=dense_linears,
                norm_params=norm_params,
            )
        )
    return groups


def _qwen_moe_layer_count(view: ConfigView, *, layers: int, num_experts: int) -> int:
    """Qwen MoE: block i is sparse unless listed in mlp_only_layers or off the sparse step."""
    dense_only = set(view.int_list("mlp_only_layers"))
    step = view.int_or(1, "decoder_sparse_step")
    if num_experts <= 0 or step <= 0:
        return 0
    return sum(1 for index in range(layers) if index not in dense_only and (index + 1) % step == 0)


# --- Mixtral -----------------------------------------------------------------------------------

MIXTRAL_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "sliding_window": None,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
}


def read_mixtral(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _moe_dims(view, expert_width_key="intermediate_size")
    num_experts = _num_experts(view, "num_local_experts")
    top_k = view.int_or(0, "num_experts_per_tok")
    linears = [
        *attention_projections(
            "self_attn",
            hidden=dims.hidden,
            heads=dims.heads,
            kv_heads=dims.kv_heads,
            head_dim=dims.head_dim,
            qkv_bias=False,
            output_bias=False,
        ),
        _router("mlp.gate", hidden=dims.hidden, num_experts=num_experts),
        *fused_experts(
            "mlp.experts",
            hidden=dims.hidden,
            intermediate=dims.intermediate,
            num_experts=num_experts,
        ),
    ]
    window = view.optional_int("sliding_window")
    return build_spec(
        view,
        origin,
        architecture="MixtralForCausalLM",
        dims=dims,
        groups=_moe_and_dense_groups(
            linears,
            [],
            moe_layers=dims.layers,
            dense_layers=0,
            norm_params=2 * dims.hidden,
            num_experts=num_experts,
            experts_per_token=top_k,
        ),
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=count_sliding_layers(None, layers=dims.layers, window=window),
        num_experts=num_experts,
        experts_per_token=top_k,
    )


# --- Qwen1.5-MoE / Qwen2-MoE -------------------------------------------------------------------

QWEN2_MOE_DEFAULTS = {
    "num_key_value_heads": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4,
    "num_experts": 60,
    "mlp_only_layers": None,
    "qkv_bias": True,
}


def _qwen2_moe_sliding(view: ConfigView, *, layers: int) -> tuple[int | None, int]:
    """Qwen2-MoE: with use_sliding_window, even-indexed blocks below max_window_layers slide."""
    if not view.flag("use_sliding_window"):
        return None, 0
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types")
    if layer_types is None:
        below = view.int_or(0, "max_window_layers")
        layer_types = [
            "sliding_attention" if (index + 1) % 2 and index < below else "full_attention"
            for index in range(layers)
        ]
    return window, count_sliding_layers(layer_types, layers=layers, window=window)


def read_qwen2_moe(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _moe_dims(view, expert_width_key="moe_intermediate_size")
    num_experts = _num_experts(view, "num_experts")
    top_k = view.int_or(0, "num_experts_per_tok")
    dense_width = view.required_int("intermediate_size")
    shared_width = view.int_or(0, "shared_expert_intermediate_size")
    attention = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=view.flag("qkv_bias"),
        output_bias=False,
    )
    moe_linears = [
        *attention,
        _router("mlp.gate", hidden=dims.hidden, num_experts=num_experts),
        *fused_experts(
            "mlp.experts",
            hidden=dims.hidden,
            intermediate=dims.intermediate,
            num_experts=num_experts,
        ),
        *gated_mlp(
            "mlp.shared_expert", hidden=dims.hidden, intermediate=shared_width, role="shared_expert"
        ),
        linear("shared_expert_gate", "mlp.shared_expert_gate", dims.hidden, 1, role="router"),
    ]
    dense_linears = [*attention, *gated_mlp("mlp", hidden=dims.hidden, intermediate=dense_width)]
    moe_layers = _qwen_moe_layer_count(view, layers=dims.layers, num_experts=num_experts)
    if not moe_layers:  # every block dense: the MLP width is the dense one
        dims = replace(dims, intermediate=dense_width)
    window, sliding_layers = _qwen2_moe_sliding(view, layers=dims.layers)
    return build_spec(
        view,
        origin,
        architecture="Qwen2MoeForCausalLM",
        dims=dims,
        groups=_moe_and_dense_groups(
            moe_linears,
            dense_linears,
            moe_layers=moe_layers,
            dense_layers=dims.layers - moe_layers,
            norm_params=2 * dims.hidden,
            num_experts=num_experts,
            experts_per_token=top_k,
        ),
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=sliding_layers,
        num_experts=num_experts,
        experts_per_token=top_k,
        notes=[
            "each sparse block also runs a shared expert, scaled by sigmoid(shared_expert_gate)"
        ],
    )


# --- Qwen3 MoE ---------------------------------------------------------------------------------

QWEN3_MOE_DEFAULTS = {
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "num_experts": 128,
    "mlp_only_layers": None,
}


def read_qwen3_moe(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _moe_dims(view, expert_width_key="moe_intermediate_size")
    num_experts = _num_experts(view, "num_experts")
    top_k = view.int_or(0, "num_experts_per_tok")
    dense_width = view.required_int("intermediate_size")
    bias = view.flag("attention_bias")
    attention = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=bias,
        output_bias=bias,
    )
    moe_linears = [
        *attention,
        _router("mlp.gate", hidden=dims.hidden, num_experts=num_experts),
        *fused_experts(
            "mlp.experts",
            hidden=dims.hidden,
            intermediate=dims.intermediate,
            num_experts=num_experts,
        ),
    ]
    dense_linears = [*attention, *gated_mlp("mlp", hidden=dims.hidden, intermediate=dense_width)]
    moe_layers = _qwen_moe_layer_count(view, layers=dims.layers, num_experts=num_experts)
    if not moe_layers:  # every block dense: the MLP width is the dense one
        dims = replace(dims, intermediate=dense_width)
    window = view.optional_int("sliding_window") if view.flag("use_sliding_window") else None
    return build_spec(
        view,
        origin,
        architecture="Qwen3MoeForCausalLM",
        dims=dims,
        groups=_moe_and_dense_groups(
            moe_linears,
            dense_linears,
            moe_layers=moe_layers,
            dense_layers=dims.layers - moe_layers,
            norm_params=2 * dims.hidden + 2 * dims.head_dim,
            num_experts=num_experts,
            experts_per_token=top_k,
        ),
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        qk_norm=True,
        sliding_window=window,
        sliding_layers=count_sliding_layers(None, layers=dims.layers, window=window),
        num_experts=num_experts,
        experts_per_token=top_k,
    )


# --- gpt-oss -----------------------------------------------------------------------------------

GPT_OSS_DEFAULTS = {
    "num_local_experts": 128,
    "head_dim": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "num_experts_per_tok": 4,
    "layer_types": None,
    "attention_bias": True,
}


def read_gpt_oss(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = _moe_dims(view, expert_width_key="intermediate_size")
    num_experts = _num_experts(view, "num_local_experts")
    top_k = view.int_or(0, "num_experts_per_tok")
    bias = view.flag("attention_bias")
    linears = [
        *attention_projections(
            "self_attn",
            hidden=dims.hidden,
            heads=dims.heads,
            kv_heads=dims.kv_heads,
            head_dim=dims.head_dim,
            qkv_bias=bias,
            output_bias=bias,
        ),
        _router("mlp.router", hidden=dims.hidden, num_experts=num_experts, bias=True),
        *fused_experts(
            "mlp.experts",
            hidden=dims.hidden,
            intermediate=dims.intermediate,
            num_experts=num_experts,
            bias=True,
        ),
    ]
    group = BlockGroup(
        name="decoder",
        count=dims.layers,
        linears=linears,
        norm_params=2 * dims.hidden,
        other_params=dims.heads,  # self_attn.sinks: one learned attention-sink logit per head
        num_experts=num_experts,
        experts_per_token=top_k,
    )
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(dims.layers, period=2)
    return build_spec(
        view,
        origin,
        architecture="GptOssForCausalLM",
        dims=dims,
        groups=[group],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        supports_sdpa=False,
        num_experts=num_experts,
        experts_per_token=top_k,
        notes=[
            "gpt-oss: attention sinks (one logit per head) counted under other; experts store "
            "gate_up_proj as (E, hidden, 2*intermediate) and use a clamped SwiGLU",
            "GptOssForCausalLM does not support SDPA in transformers 5 (attention sinks); it "
            "trains with eager attention unless flash or flex attention is asked for",
        ],
    )


READERS = [
    ArchitectureReader("mixtral", "MixtralConfig", MIXTRAL_DEFAULTS, read_mixtral),
    ArchitectureReader("qwen2_moe", "Qwen2MoeConfig", QWEN2_MOE_DEFAULTS, read_qwen2_moe),
    ArchitectureReader("qwen3_moe", "Qwen3MoeConfig", QWEN3_MOE_DEFAULTS, read_qwen3_moe),
    ArchitectureReader("gpt_oss", "GptOssConfig", GPT_OSS_DEFAULTS, read_gpt_oss),
]

"""Mixture-of-experts decoders: Mixtral, Qwen1.5/2 MoE (with a shared expert), Qwen3 MoE, gpt-oss,
Llama 4 (text decoder, with a shared expert and dense blocks between the sparse ones), GLM-4.5
(DeepSeek-V3's routing under grouped-query attention).

In transformers 5 the routed experts of these models are two fused 3-D parameters per layer
(`mlp.experts.gate_up_proj` and `mlp.experts.down_proj`), and the router is a bare weight
(`mlp.gate` or, in gpt-oss, `mlp.router` with a bias).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    alternating_layer_types,
    attention_projections,
    count_sliding_layers,
    fused_experts,
    gated_mlp,
    linear,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.architectures.dense_decoders import (
    every_layer_window,
    qwen_sliding_window,
    rmsnorm_decoder_spec,
)
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec


@dataclass(frozen=True)
class Routing:
    """How the sparse blocks route: the experts each holds and how many a token visits."""

    num_experts: int  # routed experts per sparse block
    experts_per_token: int


def _read_routing(view: ConfigView, experts_key: str) -> Routing:
    """`experts_key` is num_local_experts in Mixtral and gpt-oss, num_experts in Qwen; the other
    spelling is read when it is absent."""
    other = "num_experts" if experts_key == "num_local_experts" else "num_local_experts"
    return Routing(
        num_experts=view.int_or(0, experts_key, other),
        experts_per_token=view.int_or(0, "num_experts_per_tok"),
    )


def _routed_experts(
    dims: Dims, routing: Routing, *, router: str = "mlp.gate", bias: bool = False
) -> list[LinearModule]:
    """The router (a bare weight at `router`) and the fused experts under mlp.experts."""
    return [
        linear(router, dims.hidden, routing.num_experts, bias=bias, role="router"),
        *fused_experts(
            "mlp.experts",
            hidden=dims.hidden,
            intermediate=dims.intermediate,
            num_experts=routing.num_experts,
            bias=bias,
        ),
    ]


def _sparse_blocks(
    linears: list[LinearModule],
    routing: Routing,
    *,
    count: int,
    norm_params: int,
    other_params: int = 0,
) -> BlockGroup:
    """`count` blocks whose MLP is routed experts."""
    return BlockGroup(
        name="decoder",
        count=count,
        linears=linears,
        norm_params=norm_params,
        other_params=other_params,
        num_experts=routing.num_experts,
        experts_per_token=routing.experts_per_token,
    )


def _moe_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    routing: Routing,
    groups: list[BlockGroup],
    **features: Any,
) -> ModelSpec:
    """The Llama layout of `rmsnorm_decoder_spec`, with the routing stated on the spec."""
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=groups,
        num_experts=routing.num_experts,
        experts_per_token=routing.experts_per_token,
        **features,
    )


def _qwen_moe_layer_count(view: ConfigView, *, layers: int, num_experts: int) -> int:
    """Qwen MoE: block i is sparse unless listed in mlp_only_layers or off the sparse step."""
    dense_only = set(view.int_list("mlp_only_layers"))
    step = view.int_or(1, "decoder_sparse_step")
    if num_experts <= 0 or step <= 0:
        return 0
    return sum(1 for index in range(layers) if index not in dense_only and (index + 1) % step == 0)


def _qwen_moe_blocks(
    view: ConfigView,
    dims: Dims,
    routing: Routing,
    *,
    attention: list[LinearModule],
    shared_expert: list[LinearModule],
    dense_width: int,
    norm_params: int,
) -> tuple[Dims, list[BlockGroup]]:
    """Qwen MoE blocks: sparse ones (router, experts and `shared_expert`) and dense ones (a gated
    MLP `dense_width` wide). With no sparse block the dims carry the dense MLP width."""
    sparse_layers = _qwen_moe_layer_count(view, layers=dims.layers, num_experts=routing.num_experts)
    dense_layers = dims.layers - sparse_layers
    groups = []
    if sparse_layers:
        sparse = [*attention, *_routed_experts(dims, routing), *shared_expert]
        groups.append(_sparse_blocks(sparse, routing, count=sparse_layers, norm_params=norm_params))
    else:  # every block dense: the MLP width is the dense one
        dims = replace(dims, intermediate=dense_width)
    if dense_layers:
        dense = [*attention, *gated_mlp("mlp", hidden=dims.hidden, intermediate=dense_width)]
        groups.append(
            BlockGroup(
                name="decoder_dense", count=dense_layers, linears=dense, norm_params=norm_params
            )
        )
    return dims, groups


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
    dims = read_rope_decoder_dims(view)
    routing = _read_routing(view, "num_local_experts")
    linears = [*attention_projections(dims), *_routed_experts(dims, routing)]
    window, sliding_layers = every_layer_window(view, layers=dims.layers)
    return _moe_spec(
        view,
        origin,
        architecture="MixtralForCausalLM",
        dims=dims,
        routing=routing,
        groups=[_sparse_blocks(linears, routing, count=dims.layers, norm_params=2 * dims.hidden)],
        sliding_window=window,
        sliding_layers=sliding_layers,
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


def _even_blocks_below(index: int, max_window_layers: int) -> bool:
    return index % 2 == 0 and index < max_window_layers


def read_qwen2_moe(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view, intermediate_key="moe_intermediate_size")
    routing = _read_routing(view, "num_experts")
    dense_width = view.required_int("intermediate_size")
    shared_width = view.int_or(0, "shared_expert_intermediate_size")
    dims, groups = _qwen_moe_blocks(
        view,
        dims,
        routing,
        attention=attention_projections(dims, qkv_bias=view.flag("qkv_bias")),
        shared_expert=[
            *gated_mlp(
                "mlp.shared_expert",
                hidden=dims.hidden,
                intermediate=shared_width,
                role="shared_expert",
            ),
            linear("mlp.shared_expert_gate", dims.hidden, 1, role="router"),
        ],
        dense_width=dense_width,
        norm_params=2 * dims.hidden,
    )
    window, sliding_layers = qwen_sliding_window(
        view, layers=dims.layers, slides=_even_blocks_below
    )
    return _moe_spec(
        view,
        origin,
        architecture="Qwen2MoeForCausalLM",
        dims=dims,
        routing=routing,
        groups=groups,
        sliding_window=window,
        sliding_layers=sliding_layers,
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
    dims = read_rope_decoder_dims(view, intermediate_key="moe_intermediate_size")
    routing = _read_routing(view, "num_experts")
    dense_width = view.required_int("intermediate_size")
    bias = view.flag("attention_bias")
    dims, groups = _qwen_moe_blocks(
        view,
        dims,
        routing,
        attention=attention_projections(dims, qkv_bias=bias, output_bias=bias),
        shared_expert=[],
        dense_width=dense_width,
        norm_params=2 * dims.hidden + 2 * dims.head_dim,
    )
    window = view.optional_int("sliding_window") if view.flag("use_sliding_window") else None
    return _moe_spec(
        view,
        origin,
        architecture="Qwen3MoeForCausalLM",
        dims=dims,
        routing=routing,
        groups=groups,
        qk_norm=True,
        sliding_window=window,
        sliding_layers=count_sliding_layers(None, layers=dims.layers, window=window),
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
    dims = read_rope_decoder_dims(view)
    routing = _read_routing(view, "num_local_experts")
    bias = view.flag("attention_bias")
    linears = [
        *attention_projections(dims, qkv_bias=bias, output_bias=bias),
        *_routed_experts(dims, routing, router="mlp.router", bias=True),
    ]
    block = _sparse_blocks(
        linears,
        routing,
        count=dims.layers,
        norm_params=2 * dims.hidden,
        other_params=dims.heads,  # self_attn.sinks: one learned attention-sink logit per head
    )
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(dims.layers, period=2)
    return _moe_spec(
        view,
        origin,
        architecture="GptOssForCausalLM",
        dims=dims,
        routing=routing,
        groups=[block],
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        supports_sdpa=False,
        notes=[
            "gpt-oss: attention sinks (one logit per head) counted under other; experts store "
            "gate_up_proj as (E, hidden, 2*intermediate) and use a clamped SwiGLU",
            "GptOssForCausalLM does not support SDPA in transformers 5 (attention sinks); it "
            "trains with eager attention unless flash or flex attention is asked for",
        ],
    )


# --- Llama 4 ------------------------------------------------------------------------------------

LLAMA4_TEXT_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "moe_layers": None,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "no_rope_layers": None,
    "no_rope_layer_interval": 4,
    "layer_types": None,
}

LLAMA4_DEFAULTS = {"tie_word_embeddings": False}


def _llama4_sparse_layers(view: ConfigView, layers: int) -> set[int]:
    """`moe_layers` as saved, else every `interleave_moe_layer_step`-th block from step - 1."""
    if view.value("moe_layers") is not None:
        return {index for index in view.int_list("moe_layers") if 0 <= index < layers}
    step = view.int_or(1, "interleave_moe_layer_step")
    if step <= 0:
        return set()
    return set(range(step - 1, layers, step))


def _llama4_chunked_attention(view: ConfigView, layers: int) -> tuple[int | None, int]:
    """(attention_chunk_size, blocks attending in chunks): the blocks with RoPE, as
    `no_rope_layers` (1 = RoPE) or every block but each `no_rope_layer_interval`-th one, unless
    `layer_types` names them."""
    chunk = view.optional_int("attention_chunk_size")
    if not chunk:
        return None, 0
    layer_types = view.text_list("layer_types")
    if layer_types is None:
        uses_rope = view.int_list("no_rope_layers") or [
            int((index + 1) % max(view.int_or(4, "no_rope_layer_interval"), 1) != 0)
            for index in range(layers)
        ]
        layer_types = [
            "chunked_attention" if rope else "full_attention" for rope in uses_rope[:layers]
        ]
    return chunk, sum(1 for kind in layer_types[:layers] if kind == "chunked_attention")


def read_llama4_text(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Llama 4's text decoder: Llama attention (the blocks without RoPE hold the same
    projections; the L2 qk-norm has no weight) and, under `feed_forward`, either routed experts
    of `intermediate_size` beside a shared expert of the same width, or a dense MLP of
    `intermediate_size_mlp`."""
    dims = read_rope_decoder_dims(view)
    routing = _read_routing(view, "num_local_experts")
    bias = view.flag("attention_bias")
    attention = attention_projections(dims, qkv_bias=bias, output_bias=bias)
    sparse_layers = len(_llama4_sparse_layers(view, dims.layers)) if routing.num_experts else 0
    dense_layers = dims.layers - sparse_layers
    dense_width = view.int_or(dims.intermediate, "intermediate_size_mlp")
    norm_params = 2 * dims.hidden
    groups = []
    if sparse_layers:
        sparse = [
            *attention,
            linear("feed_forward.router", dims.hidden, routing.num_experts, role="router"),
            *fused_experts(
                "feed_forward.experts",
                hidden=dims.hidden,
                intermediate=dims.intermediate,
                num_experts=routing.num_experts,
            ),
            *gated_mlp(
                "feed_forward.shared_expert",
                hidden=dims.hidden,
                intermediate=dims.intermediate,
                role="shared_expert",
            ),
        ]
        groups.append(_sparse_blocks(sparse, routing, count=sparse_layers, norm_params=norm_params))
    else:  # every block dense: the MLP width is the dense one
        dims = replace(dims, intermediate=dense_width)
    if dense_layers:
        dense = [
            *attention,
            *gated_mlp("feed_forward", hidden=dims.hidden, intermediate=dense_width),
        ]
        groups.append(
            BlockGroup(
                name="decoder_dense", count=dense_layers, linears=dense, norm_params=norm_params
            )
        )
    window, chunked_layers = _llama4_chunked_attention(view, dims.layers)
    return _moe_spec(
        view,
        origin,
        architecture="Llama4ForCausalLM",
        dims=dims,
        routing=routing if sparse_layers else Routing(num_experts=0, experts_per_token=0),
        groups=groups,
        qk_norm=view.flag("use_qk_norm"),
        sliding_window=window,
        sliding_layers=chunked_layers,
        notes=[
            "Llama 4: each sparse block also runs a shared expert for every token; blocks "
            "without RoPE and the weightless L2 qk-norm change no parameter count",
            "the blocks with RoPE attend within chunks of attention_chunk_size tokens and "
            "cache at most that many: sized as a sliding window of that length",
        ],
    )


def read_llama4(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """A multimodal Llama 4 config: the text decoder inside `text_config` is what is counted."""
    text_config = view.value("text_config")
    if not isinstance(text_config, dict):
        raise ConfigFieldError("the llama4 config has no 'text_config' object")
    inner = ConfigView(
        model_type="llama4_text",
        config_class="Llama4TextConfig",
        values={"tie_word_embeddings": view.flag("tie_word_embeddings"), **text_config},
        defaults=LLAMA4_TEXT_DEFAULTS,
    )
    spec = read_llama4_text(inner, origin)
    view.defaulted.update({f"text_config.{key}": value for key, value in inner.defaulted.items()})
    return replace(
        spec,
        model_type=view.model_type,
        notes=[
            *spec.notes,
            "llama4 is multimodal: counted the text decoder of text_config as Llama4ForCausalLM; "
            "Llama4ForConditionalGeneration adds a vision encoder and a projector not counted "
            "here",
        ],
    )


# --- GLM-4.5 (glm4_moe) ---------------------------------------------------------------------------

GLM4_MOE_DEFAULTS = {
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "moe_intermediate_size": 1408,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_routed_experts": 128,
    "first_k_dense_replace": 1,
    "use_qk_norm": False,
}


def read_glm4_moe(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """GLM-4.5: q/k/v with biases (attention_bias), an output projection without, optional
    per-head q/k RMSNorm; the first `first_k_dense_replace` blocks dense, the others routing
    `n_routed_experts` beside `n_shared_experts` always-on ones, as in DeepSeek-V3 (the router's
    score-correction bias is a buffer). The multi-token prediction layer of the checkpoints is not
    built by transformers and not counted."""
    dims = read_rope_decoder_dims(view, intermediate_key="moe_intermediate_size")
    routing = Routing(
        num_experts=view.int_or(0, "n_routed_experts", "num_local_experts"),
        experts_per_token=view.int_or(0, "num_experts_per_tok"),
    )
    bias = view.flag("attention_bias")
    attention = attention_projections(dims, qkv_bias=bias)
    qk_norm = view.flag("use_qk_norm")
    norm_params = 2 * dims.hidden + (2 * dims.head_dim if qk_norm else 0)
    dense_width = view.required_int("intermediate_size")
    dense_layers = (
        min(view.int_or(0, "first_k_dense_replace"), dims.layers)
        if routing.num_experts
        else dims.layers
    )
    sparse_layers = dims.layers - dense_layers
    shared_width = dims.intermediate * view.int_or(0, "n_shared_experts")
    groups = []
    if sparse_layers:
        sparse = [*attention, *_routed_experts(dims, routing)]
        if shared_width:
            sparse += gated_mlp(
                "mlp.shared_experts",
                hidden=dims.hidden,
                intermediate=shared_width,
                role="shared_expert",
            )
        groups.append(_sparse_blocks(sparse, routing, count=sparse_layers, norm_params=norm_params))
    else:  # every block dense: the MLP width is the dense one
        dims = replace(dims, intermediate=dense_width)
    if dense_layers:
        dense = [*attention, *gated_mlp("mlp", hidden=dims.hidden, intermediate=dense_width)]
        groups.append(
            BlockGroup(
                name="decoder_dense", count=dense_layers, linears=dense, norm_params=norm_params
            )
        )
    notes = ["GLM-4.5: each sparse block also runs shared experts for every token"]
    if view.int_or(0, "num_nextn_predict_layers"):
        notes.append(
            "the checkpoint's multi-token prediction layer is not loaded by transformers and is "
            "not counted"
        )
    return _moe_spec(
        view,
        origin,
        architecture="Glm4MoeForCausalLM",
        dims=dims,
        routing=routing if sparse_layers else Routing(num_experts=0, experts_per_token=0),
        groups=groups,
        qk_norm=qk_norm,
        notes=notes,
    )


READERS = [
    ArchitectureReader("mixtral", "MixtralConfig", MIXTRAL_DEFAULTS, read_mixtral),
    ArchitectureReader("qwen2_moe", "Qwen2MoeConfig", QWEN2_MOE_DEFAULTS, read_qwen2_moe),
    ArchitectureReader("qwen3_moe", "Qwen3MoeConfig", QWEN3_MOE_DEFAULTS, read_qwen3_moe),
    ArchitectureReader("gpt_oss", "GptOssConfig", GPT_OSS_DEFAULTS, read_gpt_oss),
    ArchitectureReader("llama4_text", "Llama4TextConfig", LLAMA4_TEXT_DEFAULTS, read_llama4_text),
    ArchitectureReader("llama4", "Llama4Config", LLAMA4_DEFAULTS, read_llama4),
    ArchitectureReader("glm4_moe", "Glm4MoeConfig", GLM4_MOE_DEFAULTS, read_glm4_moe),
]

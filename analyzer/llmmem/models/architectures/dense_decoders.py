"""Dense RoPE decoders named the Llama way (self_attn.q_proj ... mlp.down_proj): Llama, Mistral,
Qwen2, Qwen3, OLMo, OLMo 2, Phi-3, StarCoder2 and StableLM."""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    attention_projections,
    build_spec,
    count_sliding_layers,
    decoder_group,
    gated_mlp,
    layer_norm_params,
    linear,
    lm_head_params,
    plain_mlp,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import ModelSpec


def read_rope_decoder_dims(view: ConfigView, *, honors_head_dim: bool = True) -> Dims:
    """Sizes as the Llama-style configs name them; `head_dim` falls back to hidden / heads."""
    hidden = view.required_int("hidden_size")
    heads = view.required_int("num_attention_heads")
    head_dim = view.int_or(hidden // heads, "head_dim") if honors_head_dim else hidden // heads
    return Dims(
        hidden=hidden,
        layers=view.required_int("num_hidden_layers"),
        heads=heads,
        kv_heads=view.int_or(heads, "num_key_value_heads"),
        head_dim=head_dim,
        intermediate=view.required_int("intermediate_size"),
        vocab=view.required_int("vocab_size"),
        tie_embeddings=view.flag("tie_word_embeddings"),
        max_positions=view.optional_int("max_position_embeddings"),
    )


def _qwen_sliding_window(view: ConfigView, *, layers: int) -> tuple[int | None, int]:
    """Qwen2/Qwen3: a window only with use_sliding_window, from block max_window_layers on."""
    if not view.flag("use_sliding_window"):
        return None, 0
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types")
    if layer_types is None:
        first = view.int_or(0, "max_window_layers")
        layer_types = [
            "sliding_attention" if index >= first else "full_attention" for index in range(layers)
        ]
    return window, count_sliding_layers(layer_types, layers=layers, window=window)


def _every_layer_window(view: ConfigView, *, layers: int) -> tuple[int | None, int]:
    window = view.optional_int("sliding_window")
    return window, count_sliding_layers(None, layers=layers, window=window)


# --- Llama -------------------------------------------------------------------------------------

LLAMA_DEFAULTS = {
    "num_key_value_heads": None,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


def read_llama(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    attention_bias = view.flag("attention_bias")
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=attention_bias,
        output_bias=attention_bias,
    ) + gated_mlp(
        "mlp", hidden=dims.hidden, intermediate=dims.intermediate, bias=view.flag("mlp_bias")
    )
    return build_spec(
        view,
        origin,
        architecture="LlamaForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
    )


# --- Mistral -----------------------------------------------------------------------------------

MISTRAL_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "tie_word_embeddings": False,
    "sliding_window": 4096,
}


def read_mistral(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=False,
        output_bias=False,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    window, sliding_layers = _every_layer_window(view, layers=dims.layers)
    return build_spec(
        view,
        origin,
        architecture="MistralForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


# --- Qwen2 and Qwen3 ---------------------------------------------------------------------------

QWEN2_DEFAULTS = {
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
}

QWEN3_DEFAULTS = {
    **QWEN2_DEFAULTS,
    "head_dim": 128,
    "attention_bias": False,
}


def read_qwen2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=True,
        output_bias=False,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    window, sliding_layers = _qwen_sliding_window(view, layers=dims.layers)
    return build_spec(
        view,
        origin,
        architecture="Qwen2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def read_qwen3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    attention_bias = view.flag("attention_bias")
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=attention_bias,
        output_bias=attention_bias,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    window, sliding_layers = _qwen_sliding_window(view, layers=dims.layers)
    qk_norms = 2 * dims.head_dim
    return build_spec(
        view,
        origin,
        architecture="Qwen3ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden + qk_norms)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        qk_norm=True,
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


# --- OLMo and OLMo 2 ---------------------------------------------------------------------------

OLMO_DEFAULTS = {
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
}

OLMO2_DEFAULTS = dict(OLMO_DEFAULTS)


def read_olmo(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    attention_bias = view.flag("attention_bias")
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=attention_bias,
        output_bias=attention_bias,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    return build_spec(
        view,
        origin,
        architecture="OlmoForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=0)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=0,
        norm="layernorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        notes=["OLMo's LayerNorm has no learnable weight or bias"],
    )


def read_olmo2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    attention_bias = view.flag("attention_bias")
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=attention_bias,
        output_bias=attention_bias,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    # q_norm and k_norm span all heads; the two block norms sit after attention and after the MLP
    qk_norms = (dims.heads + dims.kv_heads) * dims.head_dim
    return build_spec(
        view,
        origin,
        architecture="Olmo2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden + qk_norms)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        qk_norm=True,
        notes=["OLMo 2 normalizes after attention and after the MLP (post-norm blocks)"],
    )


# --- Phi-3 -------------------------------------------------------------------------------------

PHI3_DEFAULTS = {
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "sliding_window": None,
}


def read_phi3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    qkv_width = (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    linears = [
        linear("qkv_proj", "self_attn.qkv_proj", dims.hidden, qkv_width, role="attention"),
        linear(
            "o_proj", "self_attn.o_proj", dims.heads * dims.head_dim, dims.hidden, role="attention"
        ),
        linear("gate_up_proj", "mlp.gate_up_proj", dims.hidden, 2 * dims.intermediate, role="mlp"),
        linear("down_proj", "mlp.down_proj", dims.intermediate, dims.hidden, role="mlp"),
    ]
    window, sliding_layers = _every_layer_window(view, layers=dims.layers)
    return build_spec(
        view,
        origin,
        architecture="Phi3ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        sliding_window=window,
        sliding_layers=sliding_layers,
        notes=["Phi-3 fuses q, k, v into qkv_proj and gate, up into gate_up_proj"],
    )


# --- StarCoder2 --------------------------------------------------------------------------------

STARCODER2_DEFAULTS = {
    "num_key_value_heads": 2,
    "head_dim": None,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "sliding_window": None,
    "use_bias": True,
}


def read_starcoder2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    bias = view.flag("use_bias")
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=bias,
        output_bias=bias,
    ) + plain_mlp(
        "mlp.c_fc", "mlp.c_proj", hidden=dims.hidden, intermediate=dims.intermediate, bias=bias
    )
    window, sliding_layers = _every_layer_window(view, layers=dims.layers)
    return build_spec(
        view,
        origin,
        architecture="Starcoder2ForCausalLM",
        dims=dims,
        groups=[
            decoder_group(
                linears, layers=dims.layers, norm_params=2 * layer_norm_params(dims.hidden)
            )
        ],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=layer_norm_params(dims.hidden),
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "gelu_pytorch_tanh",
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


# --- StableLM ----------------------------------------------------------------------------------

STABLELM_DEFAULTS = {
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "use_qkv_bias": False,
    "qk_layernorm": False,
    "use_parallel_residual": False,
}


def read_stablelm(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view, honors_head_dim=False)
    linears = attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=view.flag("use_qkv_bias"),
        output_bias=False,
    ) + gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate)
    parallel = view.flag("use_parallel_residual")
    qk_norm = view.flag("qk_layernorm")
    block_norms = layer_norm_params(dims.hidden) * (1 if parallel else 2)
    if qk_norm:  # one bias-free LayerNorm per head, for queries and for keys
        block_norms += (dims.heads + dims.kv_heads) * dims.head_dim
    return build_spec(
        view,
        origin,
        architecture="StableLmForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=block_norms)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=layer_norm_params(dims.hidden),
        norm="layernorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        qk_norm=qk_norm,
        parallel_residual=parallel,
    )


READERS = [
    ArchitectureReader("llama", "LlamaConfig", LLAMA_DEFAULTS, read_llama),
    ArchitectureReader("mistral", "MistralConfig", MISTRAL_DEFAULTS, read_mistral),
    ArchitectureReader("qwen2", "Qwen2Config", QWEN2_DEFAULTS, read_qwen2),
    ArchitectureReader("qwen3", "Qwen3Config", QWEN3_DEFAULTS, read_qwen3),
    ArchitectureReader("olmo", "OlmoConfig", OLMO_DEFAULTS, read_olmo),
    ArchitectureReader("olmo2", "Olmo2Config", OLMO2_DEFAULTS, read_olmo2),
    ArchitectureReader("phi3", "Phi3Config", PHI3_DEFAULTS, read_phi3),
    ArchitectureReader("starcoder2", "Starcoder2Config", STARCODER2_DEFAULTS, read_starcoder2),
    ArchitectureReader("stablelm", "StableLmConfig", STABLELM_DEFAULTS, read_stablelm),
]

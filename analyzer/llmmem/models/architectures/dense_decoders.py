"""Dense RoPE decoders named the Llama way (self_attn.q_proj ... mlp.down_proj): Llama, InternLM3,
Granite, SmolLM3, Mistral, Qwen2, Qwen3, OLMo, OLMo 2, Phi-3, StarCoder2 and StableLM.

The Llama layout around the blocks (`rmsnorm_decoder_spec`), its block (`llama_block_linears`) and
the Qwen sliding-window rule are shared with the Gemma and mixture-of-experts readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    attention_projections,
    count_sliding_layers,
    decoder_group,
    decoder_only_spec,
    gated_mlp,
    layer_norm_params,
    linear,
    plain_mlp,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.spec import BlockGroup, LinearModule, ModelSpec, NormKind


def llama_block_linears(
    dims: Dims, *, qkv_bias: bool = False, output_bias: bool = False, mlp_bias: bool = False
) -> list[LinearModule]:
    """self_attn.{q,k,v,o}_proj and mlp.{gate,up,down}_proj."""
    return attention_projections(dims, qkv_bias=qkv_bias, output_bias=output_bias) + gated_mlp(
        "mlp", hidden=dims.hidden, intermediate=dims.intermediate, bias=mlp_bias
    )


def rmsnorm_decoder_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    groups: list[BlockGroup],
    norm: NormKind = "rmsnorm",
    activation: str | None = None,
    **features: Any,
) -> ModelSpec:
    """The Llama layout around the blocks: one final RMSNorm, gated MLPs, and the activation
    `hidden_act` names (silu by default) unless `activation` is given."""
    if activation is None:
        activation = view.text("hidden_act") or "silu"
    return decoder_only_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=groups,
        final_norms=dims.hidden,
        norm=norm,
        mlp="gated",
        activation=activation,
        **features,
    )


def every_layer_window(view: ConfigView, *, layers: int) -> tuple[int | None, int]:
    """`sliding_window` (null for none) on every block."""
    window = view.optional_int("sliding_window")
    return window, count_sliding_layers(None, layers=layers, window=window)


def qwen_sliding_window(
    view: ConfigView, *, layers: int, slides: Callable[[int, int], bool]
) -> tuple[int | None, int]:
    """Qwen configs: a window only with use_sliding_window, on the blocks `layer_types` names or,
    without it, on block i where `slides(i, max_window_layers)`."""
    if not view.flag("use_sliding_window"):
        return None, 0
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types")
    if layer_types is None:
        bound = view.int_or(0, "max_window_layers")
        layer_types = [
            "sliding_attention" if slides(index, bound) else "full_attention"
            for index in range(layers)
        ]
    return window, count_sliding_layers(layer_types, layers=layers, window=window)


def _from_max_window_layers_on(index: int, max_window_layers: int) -> bool:
    return index >= max_window_layers


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
    return _llama_shaped(view, origin, "LlamaForCausalLM")


def _llama_shaped(view: ConfigView, origin: SpecOrigin, architecture: str) -> ModelSpec:
    """Llama's blocks: GQA attention and a SwiGLU MLP, biases as the config says."""
    dims = read_rope_decoder_dims(view)
    bias = view.flag("attention_bias")
    linears = llama_block_linears(
        dims, qkv_bias=bias, output_bias=bias, mlp_bias=view.flag("mlp_bias")
    )
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
    )


# InternLM3: its hub code keeps Llama's modules, and transformers 5 builds its config as Llama
INTERNLM3_DEFAULTS = {
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


def read_internlm3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _llama_shaped(view, origin, "LlamaForCausalLM")


# --- Granite (IBM Granite 3.x, PowerLM) ---------------------------------------------------------

GRANITE_DEFAULTS = {
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
}


def read_granite(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Llama's modules and shapes; Granite only scales the embeddings, attention, residuals and
    logits by constants (embedding_multiplier, logits_scaling, ...), which hold no parameters."""
    return _llama_shaped(view, origin, "GraniteForCausalLM")


# --- SmolLM3 -----------------------------------------------------------------------------------

SMOLLM3_DEFAULTS = {
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "no_rope_layers": None,
    "no_rope_layer_interval": 4,
    "layer_types": None,
}


def read_smollm3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Llama's blocks; the blocks without RoPE (every `no_rope_layer_interval`-th one, or as
    `no_rope_layers` says) hold the same projections. With use_sliding_window those NoPE blocks
    attend through the window unless `layer_types` says otherwise."""
    dims = read_rope_decoder_dims(view)
    bias = view.flag("attention_bias")
    linears = llama_block_linears(
        dims, qkv_bias=bias, output_bias=bias, mlp_bias=view.flag("mlp_bias")
    )
    window = view.optional_int("sliding_window") if view.flag("use_sliding_window") else None
    layer_types = view.text_list("layer_types")
    if layer_types is None and window:
        uses_rope = view.int_list("no_rope_layers") or [
            int((index + 1) % max(view.int_or(4, "no_rope_layer_interval"), 1) != 0)
            for index in range(dims.layers)
        ]
        layer_types = [
            "full_attention" if rope else "sliding_attention" for rope in uses_rope[: dims.layers]
        ]
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="SmolLM3ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        notes=["SmolLM3 leaves out rotary embeddings in some blocks (NoPE); no parameters change"],
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
    linears = llama_block_linears(dims)
    window, sliding_layers = every_layer_window(view, layers=dims.layers)
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="MistralForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
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
    linears = llama_block_linears(dims, qkv_bias=True)
    window, sliding_layers = qwen_sliding_window(
        view, layers=dims.layers, slides=_from_max_window_layers_on
    )
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="Qwen2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def read_qwen3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    bias = view.flag("attention_bias")
    linears = llama_block_linears(dims, qkv_bias=bias, output_bias=bias)
    window, sliding_layers = qwen_sliding_window(
        view, layers=dims.layers, slides=_from_max_window_layers_on
    )
    qk_norms = 2 * dims.head_dim
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="Qwen3ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden + qk_norms)],
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
    bias = view.flag("attention_bias")
    linears = llama_block_linears(dims, qkv_bias=bias, output_bias=bias)
    return decoder_only_spec(
        view,
        origin,
        architecture="OlmoForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=0)],
        final_norms=0,
        norm="layernorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        notes=["OLMo's LayerNorm has no learnable weight or bias"],
    )


def read_olmo2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    bias = view.flag("attention_bias")
    linears = llama_block_linears(dims, qkv_bias=bias, output_bias=bias)
    # q_norm and k_norm span all heads; the two block norms sit after attention and after the MLP
    qk_norms = (dims.heads + dims.kv_heads) * dims.head_dim
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="Olmo2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden + qk_norms)],
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
        linear("self_attn.qkv_proj", dims.hidden, qkv_width, role="attention"),
        linear("self_attn.o_proj", dims.heads * dims.head_dim, dims.hidden, role="attention"),
        linear("mlp.gate_up_proj", dims.hidden, 2 * dims.intermediate, role="mlp"),
        linear("mlp.down_proj", dims.intermediate, dims.hidden, role="mlp"),
    ]
    window, sliding_layers = every_layer_window(view, layers=dims.layers)
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture="Phi3ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
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
    linears = attention_projections(dims, qkv_bias=bias, output_bias=bias) + plain_mlp(
        "mlp.c_fc", "mlp.c_proj", hidden=dims.hidden, intermediate=dims.intermediate, bias=bias
    )
    window, sliding_layers = every_layer_window(view, layers=dims.layers)
    block_norms = 2 * layer_norm_params(dims.hidden)
    return decoder_only_spec(
        view,
        origin,
        architecture="Starcoder2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=block_norms)],
        final_norms=layer_norm_params(dims.hidden),
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
    linears = llama_block_linears(dims, qkv_bias=view.flag("use_qkv_bias"))
    parallel = view.flag("use_parallel_residual")
    qk_norm = view.flag("qk_layernorm")
    block_norms = layer_norm_params(dims.hidden) * (1 if parallel else 2)
    if qk_norm:  # one bias-free LayerNorm per head, for queries and for keys
        block_norms += (dims.heads + dims.kv_heads) * dims.head_dim
    return decoder_only_spec(
        view,
        origin,
        architecture="StableLmForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=block_norms)],
        final_norms=layer_norm_params(dims.hidden),
        norm="layernorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
        qk_norm=qk_norm,
        parallel_residual=parallel,
    )


READERS = [
    ArchitectureReader("llama", "LlamaConfig", LLAMA_DEFAULTS, read_llama),
    ArchitectureReader("internlm3", "InternLM3Config", INTERNLM3_DEFAULTS, read_internlm3),
    ArchitectureReader("granite", "GraniteConfig", GRANITE_DEFAULTS, read_granite),
    ArchitectureReader("smollm3", "SmolLM3Config", SMOLLM3_DEFAULTS, read_smollm3),
    ArchitectureReader("mistral", "MistralConfig", MISTRAL_DEFAULTS, read_mistral),
    ArchitectureReader("qwen2", "Qwen2Config", QWEN2_DEFAULTS, read_qwen2),
    ArchitectureReader("qwen3", "Qwen3Config", QWEN3_DEFAULTS, read_qwen3),
    ArchitectureReader("olmo", "OlmoConfig", OLMO_DEFAULTS, read_olmo),
    ArchitectureReader("olmo2", "Olmo2Config", OLMO2_DEFAULTS, read_olmo2),
    ArchitectureReader("phi3", "Phi3Config", PHI3_DEFAULTS, read_phi3),
    ArchitectureReader("starcoder2", "Starcoder2Config", STARCODER2_DEFAULTS, read_starcoder2),
    ArchitectureReader("stablelm", "StableLmConfig", STABLELM_DEFAULTS, read_stablelm),
]

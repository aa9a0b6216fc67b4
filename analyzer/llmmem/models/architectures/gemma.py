"""Gemma, Gemma 2 and Gemma 3: RMSNorm scaled by (1 + weight) in fp32, GeGLU MLPs, tied embeddings;
Gemma 2 and 3 add a norm before and after the MLP and alternate sliding and global attention."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    alternating_layer_types,
    count_sliding_layers,
    decoder_group,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.architectures.dense_decoders import llama_block_linears, rmsnorm_decoder_spec
from llmmem.models.spec import ModelSpec

GEMMA_DEFAULTS = {
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
}

GEMMA2_DEFAULTS = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 4096,
    "layer_types": None,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}

GEMMA3_TEXT_DEFAULTS = {
    **GEMMA2_DEFAULTS,
    "num_attention_heads": 8,
    "vocab_size": 262_208,
    "max_position_embeddings": 131_072,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "sliding_window_pattern": 6,
}

GEMMA3_DEFAULTS = {"tie_word_embeddings": True}

# sizes a multimodal gemma3 config may leave out of its text_config
NESTED_TEXT_SIZES = ("num_attention_heads", "vocab_size")


def _gemma_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    block_norms: int,
    activation: str,
    **features: Any,
) -> ModelSpec:
    """Llama-layout blocks (attention_bias on all four projections) with Gemma's RMSNorm."""
    bias = view.flag("attention_bias")
    linears = llama_block_linears(dims, qkv_bias=bias, output_bias=bias)
    return rmsnorm_decoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=block_norms)],
        norm="gemma_rmsnorm",
        activation=activation,
        **features,
    )


def _sliding_gemma_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    block_norms: int,
    window: int | None,
    layer_types: list[str],
    **features: Any,
) -> ModelSpec:
    """Gemma 2 and 3: sliding and global blocks as `layer_types` says, logit softcapping, and the
    activation under `hidden_activation`."""
    return _gemma_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        block_norms=block_norms,
        activation=view.text("hidden_activation") or "gelu_pytorch_tanh",
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        attn_logit_softcapping=view.number("attn_logit_softcapping"),
        final_logit_softcapping=view.number("final_logit_softcapping"),
        **features,
    )


def read_gemma(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    activation = view.text("hidden_act") or "gelu_pytorch_tanh"
    if activation == "gelu":  # GemmaConfig rewrites the legacy value to the tanh approximation
        activation = "gelu_pytorch_tanh"
    return _gemma_spec(
        view,
        origin,
        architecture="GemmaForCausalLM",
        dims=dims,
        block_norms=2 * dims.hidden,
        activation=activation,
    )


def read_gemma2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(dims.layers, period=2)
    return _sliding_gemma_spec(
        view,
        origin,
        architecture="Gemma2ForCausalLM",
        dims=dims,
        block_norms=4 * dims.hidden,  # input, post-attention, pre- and post-feedforward norms
        window=window,
        layer_types=layer_types,
        supports_sdpa=False,
        notes=[
            "Gemma2ForCausalLM does not support SDPA in transformers 5 (attention softcapping); "
            "it trains with eager attention unless flash or flex attention is asked for"
        ],
    )


def read_gemma3_text(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(
        dims.layers, period=view.int_or(6, "sliding_window_pattern")
    )
    return _sliding_gemma_spec(
        view,
        origin,
        architecture="Gemma3ForCausalLM",
        dims=dims,
        block_norms=4 * dims.hidden + 2 * dims.head_dim,
        window=window,
        layer_types=layer_types,
        qk_norm=True,
    )


def read_gemma3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """A multimodal Gemma 3 config: the text decoder inside `text_config` is what is counted."""
    text_config = view.value("text_config")
    if not isinstance(text_config, dict):
        raise ConfigFieldError("the gemma3 config has no 'text_config' object")
    inner_values = {"tie_word_embeddings": view.flag("tie_word_embeddings"), **text_config}
    # hub text_configs of Gemma 3 leave heads and vocabulary to the Gemma3TextConfig defaults
    for key in NESTED_TEXT_SIZES:
        if inner_values.get(key) is None:
            inner_values[key] = GEMMA3_TEXT_DEFAULTS[key]
            view.defaulted[f"text_config.{key}"] = GEMMA3_TEXT_DEFAULTS[key]
    inner = ConfigView(
        model_type="gemma3_text",
        config_class="Gemma3TextConfig",
        values=inner_values,
        defaults=GEMMA3_TEXT_DEFAULTS,
    )
    spec = read_gemma3_text(inner, origin)
    view.defaulted.update({f"text_config.{key}": value for key, value in inner.defaulted.items()})
    return replace(
        spec,
        model_type=view.model_type,
        notes=[
            *spec.notes,
            "gemma3 is multimodal: counted the text decoder of text_config as "
            "Gemma3ForCausalLM; "
            "AutoModelForCausalLM builds Gemma3ForConditionalGeneration, which adds a SigLIP "
            "vision tower and a projector not counted here",
        ],
    )


READERS = [
    ArchitectureReader("gemma", "GemmaConfig", GEMMA_DEFAULTS, read_gemma),
    ArchitectureReader("gemma2", "Gemma2Config", GEMMA2_DEFAULTS, read_gemma2),
    ArchitectureReader("gemma3_text", "Gemma3TextConfig", GEMMA3_TEXT_DEFAULTS, read_gemma3_text),
    ArchitectureReader("gemma3", "Gemma3Config", GEMMA3_DEFAULTS, read_gemma3),
]

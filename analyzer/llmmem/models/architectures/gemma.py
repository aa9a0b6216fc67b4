"""Gemma, Gemma 2 and Gemma 3: RMSNorm scaled by (1 + weight) in fp32, GeGLU MLPs, tied embeddings;
Gemma 2 and 3 add a norm before and after the MLP and alternate sliding and global attention."""

from __future__ import annotations

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    alternating_layer_types,
    attention_projections,
    build_spec,
    count_sliding_layers,
    decoder_group,
    gated_mlp,
    lm_head_params,
)
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.architectures.dense_decoders import read_rope_decoder_dims
from llmmem.models.spec import LinearModule, ModelSpec

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


def _attention(view: ConfigView, dims: Dims) -> list[LinearModule]:
    bias = view.flag("attention_bias")
    return attention_projections(
        "self_attn",
        hidden=dims.hidden,
        heads=dims.heads,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        qkv_bias=bias,
        output_bias=bias,
    )


def read_gemma(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = _attention(view, dims) + gated_mlp(
        "mlp", hidden=dims.hidden, intermediate=dims.intermediate
    )
    activation = view.text("hidden_act") or "gelu_pytorch_tanh"
    if activation == "gelu":  # GemmaConfig rewrites the legacy value to the tanh approximation
        activation = "gelu_pytorch_tanh"
    return build_spec(
        view,
        origin,
        architecture="GemmaForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=2 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="gemma_rmsnorm",
        mlp="gated",
        activation=activation,
    )


def read_gemma2(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = _attention(view, dims) + gated_mlp(
        "mlp", hidden=dims.hidden, intermediate=dims.intermediate
    )
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(dims.layers, period=2)
    return build_spec(
        view,
        origin,
        architecture="Gemma2ForCausalLM",
        dims=dims,
        groups=[decoder_group(linears, layers=dims.layers, norm_params=4 * dims.hidden)],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="gemma_rmsnorm",
        mlp="gated",
        activation=view.text("hidden_activation") or "gelu_pytorch_tanh",
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        attn_logit_softcapping=view.number("attn_logit_softcapping"),
        final_logit_softcapping=view.number("final_logit_softcapping"),
        supports_sdpa=False,
        notes=[
            "Gemma2ForCausalLM does not support SDPA in transformers 5 (attention softcapping); "
            "it trains with eager attention unless flash or flex attention is asked for"
        ],
    )


def read_gemma3_text(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    dims = read_rope_decoder_dims(view)
    linears = _attention(view, dims) + gated_mlp(
        "mlp", hidden=dims.hidden, intermediate=dims.intermediate
    )
    window = view.optional_int("sliding_window")
    layer_types = view.text_list("layer_types") or alternating_layer_types(
        dims.layers, period=view.int_or(6, "sliding_window_pattern")
    )
    return build_spec(
        view,
        origin,
        architecture="Gemma3ForCausalLM",
        dims=dims,
        groups=[
            decoder_group(
                linears, layers=dims.layers, norm_params=4 * dims.hidden + 2 * dims.head_dim
            )
        ],
        embedding=dims.vocab * dims.hidden,
        head=lm_head_params(dims),
        model_norms=dims.hidden,
        norm="gemma_rmsnorm",
        mlp="gated",
        activation=view.text("hidden_activation") or "gelu_pytorch_tanh",
        qk_norm=True,
        sliding_window=window,
        sliding_layers=count_sliding_layers(layer_types, layers=dims.layers, window=window),
        attn_logit_softcapping=view.number("attn_logit_softcapping"),
        final_logit_softcapping=view.number("final_logit_softcapping"),
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
    return spec.model_copy(
        update={
            "model_type": view.model_type,
            "notes": [
                *spec.notes,
                "gemma3 is multimodal: counted the text decoder of text_config as "
                "Gemma3ForCausalLM; "
                "AutoModelForCausalLM builds Gemma3ForConditionalGeneration, which adds a SigLIP "
                "vision tower and a projector not counted here",
            ],
        }
    )


READERS = [
    ArchitectureReader("gemma", "GemmaConfig", GEMMA_DEFAULTS, read_gemma),
    ArchitectureReader("gemma2", "Gemma2Config", GEMMA2_DEFAULTS, read_gemma2),
    ArchitectureReader("gemma3_text", "Gemma3TextConfig", GEMMA3_TEXT_DEFAULTS, read_gemma3_text),
    ArchitectureReader("gemma3", "Gemma3Config", GEMMA3_DEFAULTS, read_gemma3),
]

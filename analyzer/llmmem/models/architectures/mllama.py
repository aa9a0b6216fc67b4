"""Llama 3.2 Vision (Mllama): a Llama language model in which some blocks attend to the image
instead of the text, and a tiled two-stage vision encoder (`vision_encoders.read_mllama_vision`).

The cross-attention blocks are a block group of the language model's own (`cross_attention`):
queries from the text, keys and values from the projected vision states, per-head q/k RMSNorms,
a gated MLP and two tanh gates.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    Dims,
    SpecOrigin,
    decoder_group,
    gated_mlp,
    linear,
    lm_head_params,
    read_rope_decoder_dims,
)
from llmmem.models.architectures.config_view import ConfigView
from llmmem.models.architectures.dense_decoders import (
    LLAMA_DEFAULTS,
    llama_block_linears,
    rmsnorm_decoder_spec,
)
from llmmem.models.architectures.vision_encoders import (
    MLLAMA_VISION_DEFAULTS,
    mllama_patches_per_tile,
    read_mllama_vision,
    side,
)
from llmmem.models.architectures.vision_language import (
    TEXT_SIZE_DEFAULTS,
    assemble,
    merge_vision_defaults,
    nested_config,
    projector_param_count,
    vision_view,
)
from llmmem.models.spec import BlockGroup, ImageGeometry, LinearModule, ModelSpec

MLLAMA_DEFAULTS: dict[str, Any] = {}
MLLAMA_CROSS_LAYERS = [3, 8, 13, 18, 23, 28, 33, 38]


def cross_attention_linears(dims: Dims) -> list[LinearModule]:
    """A cross-attention block's projections (queries from the text, keys and values from the
    vision states, both language-model wide) and its gated MLP."""
    q_width = dims.heads * dims.head_dim
    kv_width = dims.kv_heads * dims.head_dim
    return [
        linear("cross_attn.q_proj", dims.hidden, q_width, role="attention"),
        linear("cross_attn.k_proj", dims.hidden, kv_width, role="attention"),
        linear("cross_attn.v_proj", dims.hidden, kv_width, role="attention"),
        linear("cross_attn.o_proj", q_width, dims.hidden, role="attention"),
        *gated_mlp("mlp", hidden=dims.hidden, intermediate=dims.intermediate),
    ]


def read_mllama(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Llama 3.2 Vision: a Llama language model whose blocks at cross_attention_layers attend to
    the vision states instead of the text (each a gated cross-attention with per-head q/k
    RMSNorms and a gated MLP), 8 more embedding rows than the vocabulary, and a tiled encoder
    whose final and intermediate layers' outputs one Linear projects to the model's width."""
    text = {**TEXT_SIZE_DEFAULTS["mllama_text_model"], **nested_config(view, "text_config")}
    filled = {
        k: v
        for k, v in TEXT_SIZE_DEFAULTS["mllama_text_model"].items()
        if k not in nested_config(view, "text_config")
    }
    inner = ConfigView(
        model_type="mllama_text_model",
        config_class="MllamaTextConfig",
        values={**text, "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))},
        defaults=LLAMA_DEFAULTS,
    )
    dims = read_rope_decoder_dims(inner)
    cross_layers = inner.int_list("cross_attention_layers") or MLLAMA_CROSS_LAYERS
    cross = len([index for index in cross_layers if index < dims.layers])
    self_group = decoder_group(
        llama_block_linears(dims), layers=dims.layers - cross, norm_params=2 * dims.hidden
    )
    cross_group = BlockGroup(
        name="cross_attention",
        count=cross,
        linears=cross_attention_linears(dims),
        norm_params=2 * dims.hidden + 2 * dims.head_dim,  # and the q/k norms over one head
        other_params=2,  # cross_attn_attn_gate, cross_attn_mlp_gate
    )
    text_spec = rmsnorm_decoder_spec(
        inner,
        origin,
        architecture="MllamaForCausalLM",
        dims=dims,
        groups=[self_group, cross_group],
    )
    # the embedding table has 8 rows past the vocabulary; the head has the vocabulary's
    params = replace(
        text_spec.params, embedding=(dims.vocab + 8) * dims.hidden, head=lm_head_params(dims)
    )
    text_spec = replace(text_spec, params=params)
    view.defaulted.update({f"text_config.{k}": v for k, v in filled.items()})
    view.defaulted.update({f"text_config.{k}": v for k, v in inner.defaulted.items()})
    vision = vision_view(view, "mllama_vision_model", MLLAMA_VISION_DEFAULTS)
    encoder = read_mllama_vision(vision, origin)
    feature_width = vision.int_or(7680, "vision_output_dim")
    projector = [
        linear("multi_modal_projector", feature_width, dims.hidden, bias=True, role="other")
    ]
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="cross_attention",
        patch_size=side(vision, "patch_size"),
        image_size=side(vision, "image_size"),
        class_token=True,
        max_tiles=vision.int_or(4, "max_num_tiles"),
        tokens_per_image=1,
    )
    return assemble(
        view,
        text_spec,
        architecture="MllamaForConditionalGeneration",
        text_architecture="MllamaForCausalLM",
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector),
        geometry=geometry,
        feature_width=feature_width,
        notes=[
            f"Mllama: {cross} of {dims.layers} blocks are cross-attention blocks reading "
            f"{mllama_patches_per_tile(vision)} vision states per tile"
        ],
    )


VISION_LANGUAGE_READERS = [
    ArchitectureReader("mllama", "MllamaConfig", MLLAMA_DEFAULTS, read_mllama),
]

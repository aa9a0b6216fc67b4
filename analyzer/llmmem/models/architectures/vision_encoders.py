"""The vision encoders of the vision-language models, each read from a `vision_config` into a
ModelSpec of its own: exact parameter counts by role (the patch embedding and position tables as
`embedding`, no vocabulary, no head) and its blocks' Linears, named as PEFT sees them.

Qwen2-VL, Qwen2.5-VL and Qwen3-VL's ViTs; SigLIP (Gemma 3, Idefics3, SmolVLM); CLIP (LLaVA);
Pixtral (Mistral 3, Pixtral through LLaVA); InternViT (InternVL); and Mllama's tiled two-stage
encoder. The defaults are those of each transformers 5.24 vision config class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmmem.models.architectures.assembly import (
    Dims,
    SpecOrigin,
    build_spec,
    decoder_group,
    gated_mlp,
    layer_norm_params,
    linear,
    plain_mlp,
)
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.spec import BlockGroup, LinearModule, MlpKind, ModelSpec, NormKind


def side(view: ConfigView, key: str) -> int:
    """A size a vision config may give as one number or as a [height, width] pair (square)."""
    raw = view.value(key)
    if isinstance(raw, (list, tuple)) and raw:
        raw = raw[0]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or int(raw) <= 0:
        raise ConfigFieldError(f"the {view.model_type} config has no usable {key!r}: {raw!r}")
    return int(raw)


def encoder_dims(
    view: ConfigView,
    *,
    hidden: int,
    layers: int,
    heads: int,
    intermediate: int,
) -> Dims:
    return Dims(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        intermediate=intermediate,
        vocab=0,
        tie_embeddings=False,
    )


def vision_attention(
    dims: Dims, *, prefix: str, names: tuple[str, str, str, str], bias: bool, output_bias: bool
) -> list[LinearModule]:
    """Separate q, k, v and output projections, all as wide as the encoder."""
    q, k, v, o = names
    width = dims.hidden
    return [
        linear(f"{prefix}.{q}", width, width, bias=bias, role="attention"),
        linear(f"{prefix}.{k}", width, width, bias=bias, role="attention"),
        linear(f"{prefix}.{v}", width, width, bias=bias, role="attention"),
        linear(f"{prefix}.{o}", width, width, bias=output_bias, role="attention"),
    ]


def fused_qkv_attention(dims: Dims) -> list[LinearModule]:
    """The Qwen ViTs' attn.qkv and attn.proj, both with biases."""
    return [
        linear("attn.qkv", dims.hidden, 3 * dims.hidden, bias=True, role="attention"),
        linear("attn.proj", dims.hidden, dims.hidden, bias=True, role="attention"),
    ]


def encoder_spec(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    dims: Dims,
    groups: list[BlockGroup],
    embedding: int,
    norms: int,
    norm: NormKind,
    mlp: MlpKind,
    activation: str,
    other: int = 0,
    notes: list[str] | None = None,
) -> ModelSpec:
    """A vision encoder as a ModelSpec: no vocabulary, no LM head, not a causal LM; `embedding`
    holds the patch embedding and position tables, `norms` the norms outside the blocks."""
    return build_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=groups,
        embedding=embedding,
        head=0,
        model_norms=norms,
        model_other=other,
        norm=norm,
        mlp=mlp,
        activation=activation,
        is_causal_lm=False,
        notes=notes or [],
    )


# --- the Qwen ViTs -------------------------------------------------------------------------------

QWEN2_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "embed_dim": 1280,
    "hidden_size": 3584,
    "hidden_act": "quick_gelu",
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def qwen_patch_embedding(view: ConfigView, width: int, *, bias: bool) -> int:
    """Conv3d over (temporal_patch_size, patch, patch) pixels of each channel."""
    patch = side(view, "patch_size")
    temporal = view.int_or(2, "temporal_patch_size")
    channels = view.int_or(3, "in_channels", "in_chans")
    return channels * temporal * patch * patch * width + (width if bias else 0)


def read_qwen2_vl_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Qwen2-VL's ViT: LayerNorm blocks, fused qkv, fc1 -> quick_gelu -> fc2, 2-D rotary."""
    width = view.int_or(1280, "embed_dim")
    heads = view.int_or(16, "num_heads")
    dims = encoder_dims(
        view,
        hidden=width,
        layers=view.int_or(32, "depth"),
        heads=heads,
        intermediate=width * view.int_or(4, "mlp_ratio"),
    )
    linears = fused_qkv_attention(dims) + plain_mlp(
        "mlp.fc1", "mlp.fc2", hidden=width, intermediate=dims.intermediate, bias=True
    )
    group = decoder_group(linears, layers=dims.layers, norm_params=2 * layer_norm_params(width))
    return encoder_spec(
        view,
        origin,
        architecture="Qwen2VisionTransformerPretrainedModel",
        dims=dims,
        groups=[replace_name(group, "vision")],
        embedding=qwen_patch_embedding(view, width, bias=False),
        norms=0,
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "quick_gelu",
    )


QWEN2_5_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": [7, 15, 23, 31],
}


def read_qwen2_5_vl_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Qwen2.5-VL's ViT: RMSNorm blocks, fused qkv, a gated SiLU MLP with biases; most blocks
    attend within windows, those of fullatt_block_indexes over the whole image."""
    width = view.int_or(3584, "hidden_size")
    dims = encoder_dims(
        view,
        hidden=width,
        layers=view.int_or(32, "depth"),
        heads=view.int_or(16, "num_heads"),
        intermediate=view.int_or(3420, "intermediate_size"),
    )
    linears = fused_qkv_attention(dims) + gated_mlp(
        "mlp", hidden=width, intermediate=dims.intermediate, bias=True
    )
    group = decoder_group(linears, layers=dims.layers, norm_params=2 * width)
    return encoder_spec(
        view,
        origin,
        architecture="Qwen2_5_VisionTransformerPretrainedModel",
        dims=dims,
        groups=[replace_name(group, "vision")],
        embedding=qwen_patch_embedding(view, width, bias=False),
        norms=0,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "silu",
    )


QWEN3_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}


def read_qwen3_vl_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Qwen3-VL's ViT: a Conv3d with a bias, a learned position table interpolated to each
    image, LayerNorm blocks with fused qkv and linear_fc1 -> GELU -> linear_fc2."""
    width = view.int_or(1152, "hidden_size")
    dims = encoder_dims(
        view,
        hidden=width,
        layers=view.int_or(27, "depth"),
        heads=view.int_or(16, "num_heads"),
        intermediate=view.int_or(4304, "intermediate_size"),
    )
    linears = fused_qkv_attention(dims) + plain_mlp(
        "mlp.linear_fc1", "mlp.linear_fc2", hidden=width, intermediate=dims.intermediate, bias=True
    )
    group = decoder_group(linears, layers=dims.layers, norm_params=2 * layer_norm_params(width))
    positions = view.int_or(2304, "num_position_embeddings") * width
    return encoder_spec(
        view,
        origin,
        architecture="Qwen3VLVisionModel",
        dims=dims,
        groups=[replace_name(group, "vision")],
        embedding=qwen_patch_embedding(view, width, bias=True) + positions,
        norms=0,
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "gelu_pytorch_tanh",
    )


# --- SigLIP, CLIP --------------------------------------------------------------------------------

SIGLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": True,
}

# Idefics3's and SmolVLM's vision configs are SigLIP's with other defaults
IDEFICS3_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
}

CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "quick_gelu",
}


def _vit_dims(view: ConfigView, defaults: Mapping[str, Any]) -> Dims:
    return encoder_dims(
        view,
        hidden=view.int_or(int(defaults["hidden_size"]), "hidden_size"),
        layers=view.int_or(int(defaults["num_hidden_layers"]), "num_hidden_layers"),
        heads=view.int_or(int(defaults["num_attention_heads"]), "num_attention_heads"),
        intermediate=view.int_or(int(defaults["intermediate_size"]), "intermediate_size"),
    )


def _clip_style_block(dims: Dims) -> BlockGroup:
    """self_attn.{q,k,v,out}_proj and mlp.fc1/fc2, all with biases; two LayerNorms."""
    linears = vision_attention(
        dims,
        prefix="self_attn",
        names=("q_proj", "k_proj", "v_proj", "out_proj"),
        bias=True,
        output_bias=True,
    ) + plain_mlp(
        "mlp.fc1", "mlp.fc2", hidden=dims.hidden, intermediate=dims.intermediate, bias=True
    )
    return replace_name(
        decoder_group(linears, layers=dims.layers, norm_params=2 * layer_norm_params(dims.hidden)),
        "vision",
    )


def read_siglip_vision(
    view: ConfigView, origin: SpecOrigin, *, architecture: str = "SiglipVisionModel"
) -> ModelSpec:
    """SigLIP: a Conv2d with a bias, one learned position per patch (no class token), CLIP-style
    blocks and a final LayerNorm; `vision_use_head` adds an attention-pooling head."""
    defaults = (
        SIGLIP_VISION_DEFAULTS
        if architecture == "SiglipVisionModel"
        else (IDEFICS3_VISION_DEFAULTS)
    )
    dims = _vit_dims(view, defaults)
    width = dims.hidden
    patch = side(view, "patch_size")
    channels = view.int_or(3, "num_channels")
    positions = (side(view, "image_size") // patch) ** 2
    embedding = channels * patch * patch * width + width + positions * width
    other = 0
    notes = []
    if architecture == "SiglipVisionModel" and view.flag("vision_use_head"):
        # the probe, a MultiheadAttention (in_proj 3·w×w, out_proj), a LayerNorm and an MLP
        other = (
            width
            + 3 * width * width
            + 3 * width
            + width * width
            + width
            + layer_norm_params(width)
            + 2 * width * dims.intermediate
            + dims.intermediate
            + width
        )
        notes.append("SigLIP's attention-pooling head is counted in `other`")
    return encoder_spec(
        view,
        origin,
        architecture=architecture,
        dims=dims,
        groups=[_clip_style_block(dims)],
        embedding=embedding,
        norms=layer_norm_params(width),
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or str(defaults["hidden_act"]),
        other=other,
        notes=notes,
    )


def read_clip_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """CLIP's ViT: a class token, a Conv2d without bias, a position per patch and for the class
    token, a LayerNorm before the blocks (pre_layrnorm) and one after them."""
    dims = _vit_dims(view, CLIP_VISION_DEFAULTS)
    width = dims.hidden
    patch = side(view, "patch_size")
    channels = view.int_or(3, "num_channels")
    positions = (side(view, "image_size") // patch) ** 2 + 1
    embedding = width + channels * patch * patch * width + positions * width
    return encoder_spec(
        view,
        origin,
        architecture="CLIPVisionModel",
        dims=dims,
        groups=[_clip_style_block(dims)],
        embedding=embedding,
        norms=2 * layer_norm_params(width),
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "quick_gelu",
    )


# --- Pixtral -------------------------------------------------------------------------------------

PIXTRAL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 1024,
    "patch_size": 16,
    "hidden_act": "gelu",
}


def read_pixtral_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Pixtral's ViT: a Conv2d without bias, an RMSNorm before the blocks (ln_pre), RMSNorm
    blocks with bias-free q/k/v/o and a gated MLP, 2-D rotary positions (no table)."""
    dims = _vit_dims(view, PIXTRAL_VISION_DEFAULTS)
    width = dims.hidden
    patch = side(view, "patch_size")
    channels = view.int_or(3, "num_channels")
    linears = vision_attention(
        dims,
        prefix="attention",
        names=("q_proj", "k_proj", "v_proj", "o_proj"),
        bias=False,
        output_bias=False,
    ) + gated_mlp("feed_forward", hidden=width, intermediate=dims.intermediate)
    group = decoder_group(linears, layers=dims.layers, norm_params=2 * width)
    return encoder_spec(
        view,
        origin,
        architecture="PixtralVisionModel",
        dims=dims,
        groups=[replace_name(group, "vision")],
        embedding=channels * patch * patch * width,
        norms=width,
        norm="rmsnorm",
        mlp="gated",
        activation=view.text("hidden_act") or "gelu",
    )


# --- InternViT -----------------------------------------------------------------------------------

INTERNVL_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "attention_bias": False,
    "use_qk_norm": False,
    "intermediate_size": 4096,
    "hidden_act": "gelu",
    "norm_type": "layer_norm",
    "image_size": 448,
    "patch_size": 14,
    "num_channels": 3,
    "use_mask_token": False,
    "use_absolute_position_embeddings": True,
    "use_mean_pooling": True,
}


def read_internvl_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """InternViT: a class token, a Conv2d with a bias, a position per patch and for the class
    token, blocks with a per-channel layer scale (lambda_1, lambda_2), a projection_layer with a
    bias, and q/k RMSNorms over all heads where use_qk_norm."""
    dims = encoder_dims(
        view,
        hidden=view.int_or(1024, "hidden_size"),
        layers=view.int_or(24, "num_hidden_layers"),
        heads=view.int_or(16, "num_attention_heads"),
        intermediate=view.int_or(4096, "intermediate_size"),
    )
    width = dims.hidden
    patch = side(view, "patch_size")
    channels = view.int_or(3, "num_channels")
    linears = vision_attention(
        dims,
        prefix="attention",
        names=("q_proj", "k_proj", "v_proj", "projection_layer"),
        bias=view.flag("attention_bias"),
        output_bias=True,
    ) + plain_mlp("mlp.fc1", "mlp.fc2", hidden=width, intermediate=dims.intermediate, bias=True)
    layer_norm = (view.text("norm_type") or "layer_norm") == "layer_norm"
    block_norm = layer_norm_params(width) if layer_norm else width
    qk_norm = view.flag("use_qk_norm")
    group = decoder_group(
        linears,
        layers=dims.layers,
        norm_params=2 * block_norm + (2 * width if qk_norm else 0),
        other_params=2 * width,  # lambda_1 and lambda_2
    )
    embedding = width + channels * patch * patch * width + width  # class token, conv and bias
    if view.flag("use_absolute_position_embeddings"):
        embedding += ((side(view, "image_size") // patch) ** 2 + 1) * width
    if view.flag("use_mask_token"):
        embedding += width
    final_norm = 0 if view.flag("use_mean_pooling") else layer_norm_params(width)
    return encoder_spec(
        view,
        origin,
        architecture="InternVLVisionModel",
        dims=dims,
        groups=[replace_name(group, "vision")],
        embedding=embedding,
        norms=final_norm,
        norm="layernorm" if layer_norm else "rmsnorm",
        mlp="plain",
        activation=view.text("hidden_act") or "gelu",
    )


# --- Mllama (Llama 3.2 Vision) -------------------------------------------------------------------

MLLAMA_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 1280,
    "hidden_act": "gelu",
    "num_hidden_layers": 32,
    "num_global_layers": 8,
    "attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5120,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "max_num_tiles": 4,
    "intermediate_layers_indices": None,
    "supported_aspect_ratios": None,
}

MLLAMA_ASPECT_RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]


def mllama_patches_per_tile(view: ConfigView) -> int:
    """Patches of one tile and its class token."""
    return (side(view, "image_size") // side(view, "patch_size")) ** 2 + 1


def read_mllama_vision(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Mllama's encoder: tiles of image_size, each a class token and its patches, position
    tables gated per tile and per aspect ratio; a local transformer of num_hidden_layers and a
    gated global one of num_global_layers (gate_attn, gate_ffn), bias-free q/k/v/o."""
    width = view.int_or(1280, "hidden_size")
    heads = view.int_or(16, "attention_heads")
    intermediate = view.int_or(5120, "intermediate_size")
    local_layers = view.int_or(32, "num_hidden_layers")
    global_layers = view.int_or(8, "num_global_layers")
    dims = encoder_dims(
        view,
        hidden=width,
        layers=local_layers + global_layers,
        heads=heads,
        intermediate=intermediate,
    )
    linears = vision_attention(
        dims,
        prefix="self_attn",
        names=("q_proj", "k_proj", "v_proj", "o_proj"),
        bias=False,
        output_bias=False,
    ) + plain_mlp("mlp.fc1", "mlp.fc2", hidden=width, intermediate=intermediate, bias=True)
    norms = 2 * layer_norm_params(width)
    groups = [
        BlockGroup(name="vision", count=local_layers, linears=linears, norm_params=norms),
        BlockGroup(
            name="vision_global",
            count=global_layers,
            linears=linears,
            norm_params=norms,
            other_params=2,  # gate_attn, gate_ffn
        ),
    ]
    patch = side(view, "patch_size")
    channels = view.int_or(3, "num_channels")
    tiles = view.int_or(4, "max_num_tiles")
    ratios = view.value("supported_aspect_ratios") or MLLAMA_ASPECT_RATIOS
    aspect_ids = len(ratios) + 1
    per_tile = mllama_patches_per_tile(view)
    embedding = (
        channels * patch * patch * width  # patch_embedding, no bias
        + width  # class_embedding
        + per_tile * width  # gated_positional_embedding.embedding
        + aspect_ids * tiles * per_tile * width  # its tile_embedding
        + 2 * aspect_ids * tiles * width  # pre- and post-tile positional embeddings
    )
    return encoder_spec(
        view,
        origin,
        architecture="MllamaVisionModel",
        dims=dims,
        groups=groups,
        embedding=embedding,
        norms=2 * layer_norm_params(width),  # layernorm_pre, layernorm_post
        norm="layernorm",
        mlp="plain",
        activation=view.text("hidden_act") or "gelu",
        other=3,  # the three position embeddings' gates
        notes=[
            "Mllama's tile and aspect-ratio position tables are counted in `embedding`, "
            "their gates in `other`"
        ],
    )


def replace_name(group: BlockGroup, name: str) -> BlockGroup:
    return BlockGroup(
        name=name,
        count=group.count,
        linears=group.linears,
        norm_params=group.norm_params,
        other_params=group.other_params,
    )

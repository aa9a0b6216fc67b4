"""Vision-language models: a language model read by the reader of its own layout, and a
`VisionTower` beside it (the vision encoder, the projector into the language model's width, and
how images become tokens).

Qwen2-VL, Qwen2.5-VL and Qwen3-VL; Gemma 3 (SigLIP); LLaVA and LLaVA-NeXT (CLIP, or Pixtral's
encoder); Mistral 3 (Mistral-Small-3.1, Pixtral's encoder and a patch merger); InternVL
(InternViT); Idefics3 and SmolVLM (SigLIP and a pixel-shuffle connector). Llama 3.2 Vision, whose
language model has cross-attention blocks, is read in `mllama`.

The spec's own fields describe the language model: `params` counts the decoder, its embeddings
and its head, `architecture` names the causal-LM class with the same modules (the count is that
class's); `vision.params` counts the encoder and the projector, and `vision.architecture` names
the class `AutoModelForImageTextToText` builds. Counts are those of transformers 5.24's classes
built from the config, the defaults of absent keys those of its config classes.

These readers have a table of their own (`VISION_LANGUAGE_READERS`, registered in the package's
`VISION_FAMILY_OF_MODEL_TYPE`) and are looked up before the text-only readers: a gemma3 config
gets Gemma 3's text reader and the SigLIP tower.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from llmmem.models.architectures.assembly import (
    ArchitectureReader,
    SpecOrigin,
    linear,
)
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.architectures.vision_encoders import (
    CLIP_VISION_DEFAULTS,
    IDEFICS3_VISION_DEFAULTS,
    INTERNVL_VISION_DEFAULTS,
    PIXTRAL_VISION_DEFAULTS,
    QWEN2_5_VL_VISION_DEFAULTS,
    QWEN2_VL_VISION_DEFAULTS,
    QWEN3_VL_VISION_DEFAULTS,
    SIGLIP_VISION_DEFAULTS,
    read_clip_vision,
    read_internvl_vision,
    read_pixtral_vision,
    read_qwen2_5_vl_vision,
    read_qwen2_vl_vision,
    read_qwen3_vl_vision,
    read_siglip_vision,
    side,
)
from llmmem.models.spec import (
    ImageGeometry,
    LinearModule,
    ModelSpec,
    VisionTower,
)

# The transformers text-config class defaults of the sizes a nested text_config may leave out
# (transformers builds the language model with them), by the text model type each family reads.
TEXT_SIZE_DEFAULTS: dict[str, dict[str, int]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
    },
    # Qwen2VLTextConfig and Qwen2_5_VLTextConfig (the 72B's shapes)
    "qwen2_vl_text": {
        "vocab_size": 152064,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
    "qwen3_vl_text": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
    },
    "mllama_text_model": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 40,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}

# the causal-LM class whose modules and count the language model's spec matches
TEXT_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def nested_config(view: ConfigView, key: str) -> dict[str, Any]:
    raw = view.value(key)
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigFieldError(f"the {view.model_type} config has a malformed {key!r}")
    return dict(raw)


def _tie(view: ConfigView, text: Mapping[str, Any], class_default: bool) -> bool:
    """The head's tie: the composite config's own flag, else its text_config's, else the
    composite config class's default."""
    if view.is_saved("tie_word_embeddings"):
        return view.flag("tie_word_embeddings")
    if "tie_word_embeddings" in text and text["tie_word_embeddings"] is not None:
        return bool(text["tie_word_embeddings"])
    return class_default


def read_text_part(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    text: dict[str, Any],
    text_type: str,
    sizes_from: str,
    tie: bool,
) -> ModelSpec:
    """The language model of a composite config, read by the text reader of `text_type`; the
    sizes `text` leaves out are those of the transformers text-config class `sizes_from` names
    (they are what transformers builds), and are listed in the spec's notes."""
    from llmmem.models.architectures import architecture_reader

    reader = architecture_reader(text_type)
    if reader is None:
        raise ConfigFieldError(
            f"the {view.model_type} config's language model is a {text_type!r}, which llmmem "
            "does not read"
        )
    values = {**text, "model_type": text_type, "tie_word_embeddings": tie}
    filled = {
        key: value
        for key, value in TEXT_SIZE_DEFAULTS.get(sizes_from, {}).items()
        if values.get(key) is None
    }
    values.update(filled)
    inner = ConfigView(
        model_type=text_type,
        config_class=reader.config_class,
        values=values,
        defaults=reader.defaults,
    )
    spec = reader.read(inner, origin)
    view.defaulted.update({f"text_config.{key}": value for key, value in filled.items()})
    view.defaulted.update({f"text_config.{key}": value for key, value in inner.defaulted.items()})
    return spec


def vision_view(view: ConfigView, vision_type: str, defaults: Mapping[str, Any]) -> ConfigView:
    return ConfigView(
        model_type=vision_type,
        config_class=vision_type,
        values=nested_config(view, "vision_config"),
        defaults=defaults,
    )


def merge_vision_defaults(view: ConfigView, vision: ConfigView) -> None:
    view.defaulted.update({f"vision_config.{key}": v for key, v in vision.defaulted.items()})


def assemble(
    view: ConfigView,
    text: ModelSpec,
    *,
    architecture: str,
    text_architecture: str,
    encoder: ModelSpec,
    projector: list[LinearModule],
    projector_params: int,
    geometry: ImageGeometry,
    feature_width: int = 0,
    notes: list[str] | None = None,
) -> ModelSpec:
    """The language model's spec with the vision tower beside it."""
    tower = VisionTower(
        architecture=architecture,
        encoder=encoder,
        projector_linears=projector,
        projector_params=projector_params,
        feature_width=feature_width,
        geometry=geometry,
    )
    return replace(
        text,
        model_type=view.model_type,
        architecture=text_architecture,
        vision=tower,
        notes=[
            *text.notes,
            f"{architecture}: the language model is counted as {text_architecture} "
            f"({text.params.total:,} parameters), the vision encoder and projector apart "
            f"({tower.params:,})",
            *(notes or []),
        ],
    )


def projector_param_count(linears: list[LinearModule], extra: int = 0) -> int:
    return sum(lin.params for lin in linears) + extra


# --- Qwen2-VL, Qwen2.5-VL, Qwen3-VL --------------------------------------------------------------

QWEN_VL_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": False}
QWEN_TEXT_KEYS_SKIPPED = ("vision_config", "text_config", "architectures", "model_type")


def _qwen_text(view: ConfigView) -> dict[str, Any]:
    """Qwen2-VL and Qwen2.5-VL configs state the language model at the top level (older ones) or
    in text_config (transformers >= 4.53's saves)."""
    nested = nested_config(view, "text_config")
    if nested:
        return nested
    return {k: v for k, v in view.values.items() if k not in QWEN_TEXT_KEYS_SKIPPED}


def _qwen_merger(
    encoder: ModelSpec,
    vision: ConfigView,
    *,
    out: int,
    postshuffle_norm: bool,
    names: tuple[str, str],
    layer_norm: bool,
) -> tuple[list[LinearModule], int]:
    """A merger: a norm over each patch (or over the merged patches), merge² patches
    concatenated, two Linears with biases into the language model's width."""
    merge = vision.int_or(2, "spatial_merge_size")
    width = encoder.hidden_size
    merged = width * merge * merge
    first, second = names
    linears = [
        linear(first, merged, merged, bias=True, role="other"),
        linear(second, merged, out, bias=True, role="other"),
    ]
    normed = merged if postshuffle_norm else width
    norm = 2 * normed if layer_norm else normed
    return linears, projector_param_count(linears, norm)


def _read_qwen_vl(
    view: ConfigView,
    origin: SpecOrigin,
    *,
    architecture: str,
    vision_type: str,
    vision_defaults: Mapping[str, Any],
    read_encoder: Callable[[ConfigView, SpecOrigin], ModelSpec],
) -> ModelSpec:
    text = _qwen_text(view)
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type="qwen2",
        sizes_from="qwen2_vl_text",
        tie=_tie(view, text, False),
    )
    vision = vision_view(view, vision_type, vision_defaults)
    encoder = read_encoder(vision, origin)
    if view.model_type == "qwen2_vl":
        # Qwen2VLVisionConfig.hidden_size is the merger's output width
        out = vision.int_or(3584, "hidden_size")
        merger, merger_params = _qwen_merger(
            encoder,
            vision,
            out=out,
            postshuffle_norm=False,
            names=("merger.mlp.0", "merger.mlp.2"),
            layer_norm=True,
        )
        window, full = None, 0
    else:
        out = vision.int_or(3584, "out_hidden_size")
        merger, merger_params = _qwen_merger(
            encoder,
            vision,
            out=out,
            postshuffle_norm=False,
            names=("merger.mlp.0", "merger.mlp.2"),
            layer_norm=False,
        )
        window = vision.int_or(112, "window_size") // side(vision, "patch_size")
        full = len(vision.int_list("fullatt_block_indexes"))
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="grid",
        patch_size=side(vision, "patch_size"),
        merge=vision.int_or(2, "spatial_merge_size"),
        temporal_patch_size=vision.int_or(2, "temporal_patch_size"),
        window_patches=window,
        full_attention_blocks=full,
    )
    return assemble(
        view,
        text_spec,
        architecture=architecture,
        text_architecture="Qwen2ForCausalLM",
        encoder=encoder,
        projector=merger,
        projector_params=merger_params,
        geometry=geometry,
    )


def read_qwen2_vl(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_qwen_vl(
        view,
        origin,
        architecture="Qwen2VLForConditionalGeneration",
        vision_type="qwen2_vl_vision",
        vision_defaults=QWEN2_VL_VISION_DEFAULTS,
        read_encoder=read_qwen2_vl_vision,
    )


def read_qwen2_5_vl(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_qwen_vl(
        view,
        origin,
        architecture="Qwen2_5_VLForConditionalGeneration",
        vision_type="qwen2_5_vl_vision",
        vision_defaults=QWEN2_5_VL_VISION_DEFAULTS,
        read_encoder=read_qwen2_5_vl_vision,
    )


def read_qwen3_vl(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Qwen3-VL: a Qwen3 language model (q/k norms), a ViT with a learned position table, a
    merger and one more merger per deepstack layer, whose outputs are added to the language
    model's first blocks' hidden states at the image tokens."""
    text = nested_config(view, "text_config")
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type="qwen3",
        sizes_from="qwen3_vl_text",
        tie=_tie(view, text, False),
    )
    vision = vision_view(view, "qwen3_vl_vision", QWEN3_VL_VISION_DEFAULTS)
    encoder = read_qwen3_vl_vision(vision, origin)
    out = vision.int_or(3584, "out_hidden_size")
    merger, merger_params = _qwen_merger(
        encoder,
        vision,
        out=out,
        postshuffle_norm=False,
        names=("merger.linear_fc1", "merger.linear_fc2"),
        layer_norm=True,
    )
    deepstack = vision.int_list("deepstack_visual_indexes")
    for index in range(len(deepstack)):
        extra, extra_params = _qwen_merger(
            encoder,
            vision,
            out=out,
            postshuffle_norm=True,
            names=(
                f"deepstack_merger_list.{index}.linear_fc1",
                f"deepstack_merger_list.{index}.linear_fc2",
            ),
            layer_norm=True,
        )
        merger += extra
        merger_params += extra_params
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="grid",
        patch_size=side(vision, "patch_size"),
        merge=vision.int_or(2, "spatial_merge_size"),
        temporal_patch_size=vision.int_or(2, "temporal_patch_size"),
    )
    return assemble(
        view,
        text_spec,
        architecture="Qwen3VLForConditionalGeneration",
        text_architecture="Qwen3ForCausalLM",
        encoder=encoder,
        projector=merger,
        projector_params=merger_params,
        geometry=geometry,
        notes=[f"Qwen3-VL: {len(deepstack)} deepstack mergers feed the first blocks"]
        if deepstack
        else [],
    )


# --- Gemma 3 -------------------------------------------------------------------------------------

GEMMA3_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": True, "mm_tokens_per_image": 256}


def read_gemma3_vision_language(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Gemma 3: Gemma 3's text reader for text_config, a SigLIP encoder without its pooling
    head (vision_use_head false in every Gemma 3 config) and a projector that average-pools the
    patches to mm_tokens_per_image and multiplies them by one matrix after an RMSNorm."""
    from llmmem.models.architectures.gemma import read_gemma3

    text_spec = read_gemma3(view, origin)
    vision = vision_view(view, "siglip_vision_model", SIGLIP_VISION_DEFAULTS)
    encoder = read_siglip_vision(vision, origin)
    width = encoder.hidden_size
    tokens = view.int_or(256, "mm_tokens_per_image")
    patches_per_side = side(vision, "image_size") // side(vision, "patch_size")
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="fixed",
        patch_size=side(vision, "patch_size"),
        image_size=side(vision, "image_size"),
        merge=max(patches_per_side // max(int(tokens**0.5), 1), 1),
        tokens_per_image=tokens,
    )
    spec = assemble(
        view,
        text_spec,
        architecture="Gemma3ForConditionalGeneration",
        text_architecture=text_spec.architecture,
        encoder=encoder,
        projector=[],
        # mm_input_projection_weight and mm_soft_emb_norm
        projector_params=width * text_spec.hidden_size + width,
        geometry=geometry,
        notes=[
            "Gemma 3's projector is one bare matrix (mm_input_projection_weight), which "
            "PEFT's Linear targets do not reach"
        ],
    )
    # read_gemma3's note said the vision tower was not counted: it is now, apart
    kept = [note for note in spec.notes if "not counted here" not in note]
    return replace(spec, notes=kept)


# --- LLaVA, LLaVA-NeXT ---------------------------------------------------------------------------

LLAVA_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": False,
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "multimodal_projector_bias": True,
    "image_seq_length": 576,
}

LLAVA_NEXT_PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]


def _text_type(text: Mapping[str, Any], default: str) -> str:
    found = text.get("model_type")
    return str(found) if isinstance(found, str) and found else default


def _llava_encoder(view: ConfigView, origin: SpecOrigin) -> tuple[ModelSpec, ConfigView, str]:
    """LLaVA's encoder: CLIP's by default, Pixtral's (pixtral-12b) or SigLIP's where the
    vision_config says so."""
    raw = nested_config(view, "vision_config")
    kind = str(raw.get("model_type") or "clip_vision_model")
    if kind == "pixtral":
        vision = vision_view(view, kind, PIXTRAL_VISION_DEFAULTS)
        return read_pixtral_vision(vision, origin), vision, kind
    if kind == "siglip_vision_model":
        vision = vision_view(view, kind, SIGLIP_VISION_DEFAULTS)
        return read_siglip_vision(vision, origin), vision, kind
    if kind != "clip_vision_model":
        raise ConfigFieldError(
            f"the {view.model_type} config's vision encoder {kind!r} is not read"
        )
    vision = vision_view(view, kind, CLIP_VISION_DEFAULTS)
    return read_clip_vision(vision, origin), vision, kind


def _feature_layers(view: ConfigView) -> int:
    raw = view.value("vision_feature_layer")
    return len(raw) if isinstance(raw, list) else 1


def _read_llava(view: ConfigView, origin: SpecOrigin, *, next_: bool) -> ModelSpec:
    text = nested_config(view, "text_config")
    text_type = _text_type(text, "llama")
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type=text_type,
        sizes_from=text_type,
        tie=_tie(view, text, False),
    )
    encoder, vision, kind = _llava_encoder(view, origin)
    bias = view.flag("multimodal_projector_bias")
    hidden = text_spec.hidden_size
    projector = [
        linear(
            "linear_1", encoder.hidden_size * _feature_layers(view), hidden, bias=bias, role="other"
        ),
        linear("linear_2", hidden, hidden, bias=bias, role="other"),
    ]
    newline = hidden if next_ else 0  # LLaVA-NeXT's image_newline
    patch = side(vision, "patch_size")
    image_size = side(vision, "image_size")
    per_side = image_size // patch
    keeps_class = kind == "clip_vision_model"
    full = (view.text("vision_feature_select_strategy") or "default") == "full"
    merge_vision_defaults(view, vision)
    if kind == "pixtral":
        geometry = ImageGeometry(
            rule="grid", patch_size=patch, image_size=image_size, row_break=True
        )
    elif next_:
        geometry = ImageGeometry(
            rule="tiles",
            patch_size=patch,
            image_size=image_size,
            class_token=keeps_class,
            max_tiles=_llava_next_max_tiles(view, image_size),
            tokens_per_image=per_side * per_side + (1 if full and keeps_class else 0),
            row_break=True,
        )
    else:
        geometry = ImageGeometry(
            rule="fixed",
            patch_size=patch,
            image_size=image_size,
            class_token=keeps_class,
            tokens_per_image=per_side * per_side + (1 if full and keeps_class else 0),
        )
    return assemble(
        view,
        text_spec,
        architecture="LlavaNextForConditionalGeneration"
        if next_
        else "LlavaForConditionalGeneration",
        text_architecture=TEXT_ARCHITECTURES.get(text_type, text_spec.architecture),
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector, newline),
        geometry=geometry,
    )


def _llava_next_max_tiles(view: ConfigView, image_size: int) -> int:
    pinpoints = view.value("image_grid_pinpoints") or LLAVA_NEXT_PINPOINTS
    most = 1
    for point in pinpoints:
        if isinstance(point, (list, tuple)) and len(point) == 2:
            most = max(most, (int(point[0]) // image_size) * (int(point[1]) // image_size))
    return most


def read_llava(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_llava(view, origin, next_=False)


def read_llava_next(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_llava(view, origin, next_=True)


# --- Mistral 3 (Mistral-Small-3.1) ---------------------------------------------------------------

MISTRAL3_DEFAULTS: dict[str, Any] = {
    "multimodal_projector_bias": False,
    "spatial_merge_size": 2,
    "vision_feature_layer": -1,
}


def read_mistral3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """Mistral 3: a Mistral language model, Pixtral's encoder, and a projector (an RMSNorm, a
    patch merger folding 2×2 patches into one, two Linears). transformers 5.24's Mistral3Config
    ties the head unless the config says otherwise; every Mistral 3 checkpoint holds its own
    lm_head, which from_pretrained keeps: an unstated tie is read as untied."""
    text = nested_config(view, "text_config")
    untold = not view.is_saved("tie_word_embeddings") and "tie_word_embeddings" not in text
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type=_text_type(text, "mistral"),
        sizes_from=_text_type(text, "mistral"),
        tie=_tie(view, text, False),
    )
    vision = vision_view(view, "pixtral", PIXTRAL_VISION_DEFAULTS)
    encoder = read_pixtral_vision(vision, origin)
    width = encoder.hidden_size
    merge = view.int_or(2, "spatial_merge_size")
    bias = view.flag("multimodal_projector_bias")
    hidden = text_spec.hidden_size
    projector = [
        linear("patch_merger.merging_layer", width * merge * merge, width, role="other"),
        linear("linear_1", width * _feature_layers(view), hidden, bias=bias, role="other"),
        linear("linear_2", hidden, hidden, bias=bias, role="other"),
    ]
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="grid",
        patch_size=side(vision, "patch_size"),
        image_size=side(vision, "image_size"),
        merge=merge,
        row_break=True,
    )
    return assemble(
        view,
        text_spec,
        architecture="Mistral3ForConditionalGeneration",
        text_architecture="MistralForCausalLM",
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector, width),  # and the projector's norm
        geometry=geometry,
        notes=[
            "the config does not say whether the head is tied: read untied, as every "
            "Mistral 3 checkpoint loads"
        ]
        if untold
        else [],
    )


# --- InternVL ------------------------------------------------------------------------------------

INTERNVL_DEFAULTS: dict[str, Any] = {
    "downsample_ratio": 0.5,
    "image_seq_length": 256,
    "vision_feature_layer": -1,
}


def read_internvl(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    """InternVL (the -hf checkpoints transformers reads): InternViT, a pixel shuffle folding
    (1/downsample_ratio)² patches into one token, a LayerNorm and two Linears; tiles of
    image_size, up to 12 and a thumbnail (the processor's crop_to_patches)."""
    text = nested_config(view, "text_config")
    text_type = _text_type(text, "qwen2")
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type=text_type,
        sizes_from=text_type,
        tie=_tie(view, text, True),
    )
    vision = vision_view(view, "internvl_vision", INTERNVL_VISION_DEFAULTS)
    encoder = read_internvl_vision(vision, origin)
    ratio = view.number("downsample_ratio") or 0.5
    fold = int(1 / ratio)
    folded = encoder.hidden_size * fold * fold
    hidden = text_spec.hidden_size
    projector = [
        linear("linear_1", folded, hidden, bias=True, role="other"),
        linear("linear_2", hidden, hidden, bias=True, role="other"),
    ]
    patch = side(vision, "patch_size")
    image_size = side(vision, "image_size")
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="tiles",
        patch_size=patch,
        image_size=image_size,
        merge=fold,
        class_token=True,
        max_tiles=12,
        tokens_per_image=view.int_or(256, "image_seq_length"),
    )
    return assemble(
        view,
        text_spec,
        architecture="InternVLForConditionalGeneration",
        text_architecture=TEXT_ARCHITECTURES.get(text_type, text_spec.architecture),
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector, 2 * folded),  # and the LayerNorm
        geometry=geometry,
    )


# --- Idefics3, SmolVLM ---------------------------------------------------------------------------

IDEFICS3_DEFAULTS: dict[str, Any] = {"tie_word_embeddings": False, "scale_factor": 2}


def _read_idefics3(view: ConfigView, origin: SpecOrigin, *, architecture: str) -> ModelSpec:
    """Idefics3 and SmolVLM: SigLIP's encoder without a class token or pooling head, a pixel
    shuffle folding scale_factor² patches into one token and one bias-free Linear; images
    split into tiles of image_size and a downscaled whole image."""
    text = nested_config(view, "text_config")
    text_type = _text_type(text, "llama")
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type=text_type,
        sizes_from=text_type,
        tie=_tie(view, text, False),
    )
    vision_type = "smolvlm_vision" if architecture.startswith("SmolVLM") else "idefics3_vision"
    vision = vision_view(view, vision_type, IDEFICS3_VISION_DEFAULTS)
    encoder = read_siglip_vision(
        vision,
        origin,
        architecture="SmolVLMVisionTransformer"
        if vision_type == "smolvlm_vision"
        else "Idefics3VisionTransformer",
    )
    scale = view.int_or(2, "scale_factor")
    projector = [
        linear(
            "modality_projection.proj",
            encoder.hidden_size * scale * scale,
            text_spec.hidden_size,
            role="other",
        )
    ]
    patch = side(vision, "patch_size")
    image_size = side(vision, "image_size")
    per_side = image_size // patch
    merge_vision_defaults(view, vision)
    geometry = ImageGeometry(
        rule="tiles",
        patch_size=patch,
        image_size=image_size,
        merge=scale,
        max_tiles=16,
        tokens_per_image=(per_side // scale) ** 2,
    )
    return assemble(
        view,
        text_spec,
        architecture=architecture,
        text_architecture=TEXT_ARCHITECTURES.get(text_type, text_spec.architecture),
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector),
        geometry=geometry,
    )


def read_idefics3(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_idefics3(view, origin, architecture="Idefics3ForConditionalGeneration")


def read_smolvlm(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    return _read_idefics3(view, origin, architecture="SmolVLMForConditionalGeneration")


VISION_LANGUAGE_READERS = [
    ArchitectureReader("qwen2_vl", "Qwen2VLConfig", QWEN_VL_DEFAULTS, read_qwen2_vl),
    ArchitectureReader("qwen2_5_vl", "Qwen2_5_VLConfig", QWEN_VL_DEFAULTS, read_qwen2_5_vl),
    ArchitectureReader("qwen3_vl", "Qwen3VLConfig", QWEN_VL_DEFAULTS, read_qwen3_vl),
    ArchitectureReader("gemma3", "Gemma3Config", GEMMA3_DEFAULTS, read_gemma3_vision_language),
    ArchitectureReader("llava", "LlavaConfig", LLAVA_DEFAULTS, read_llava),
    ArchitectureReader("llava_next", "LlavaNextConfig", LLAVA_DEFAULTS, read_llava_next),
    ArchitectureReader("mistral3", "Mistral3Config", MISTRAL3_DEFAULTS, read_mistral3),
    ArchitectureReader("internvl", "InternVLConfig", INTERNVL_DEFAULTS, read_internvl),
    ArchitectureReader("idefics3", "Idefics3Config", IDEFICS3_DEFAULTS, read_idefics3),
    ArchitectureReader("smolvlm", "SmolVLMConfig", IDEFICS3_DEFAULTS, read_smolvlm),
]

__all__ = ["VISION_LANGUAGE_READERS"]

"""Phi-3-vision and Phi-3.5-vision (`phi3_v`, remote code: `modeling_phi3_v.py`,
`image_embedding_phi3_v.py`, `processing_phi3_v.py` in the checkpoints' repositories).

The config is a Phi-3 language model's with two more keys: `img_processor` (the image encoder:
`clip_vision_model`, OpenAI's CLIP ViT-L/14 at 336 pixels, built from a fixed CLIP config, its
features read from the second-to-last layer without the class token; `image_dim_out` 1024) and
`embd_layer` (the HD transform: each crop's 24×24 patch features folded 2×2 into 144 tokens of
4·1024 values, projected by an MLP of two Linears, 4096 → hidden → hidden, with GELU between;
two learnt separators, `glb_GN` and `sub_GN`, of 4096 values each).

Images: the processor (`Phi3VImageProcessor`, `num_crops` 4 in Phi-3.5-vision-instruct's
preprocessor_config.json) scales each image to a grid of 336-pixel crops and pads every image to
num_crops + 1 crops (the global image first), all of which go through CLIP; the language model
gets (rows·cols + 1)·144 + 1 + (rows + 1)·12 tokens per image (budget/image_tokens.py).

The language model is counted as Phi3ForCausalLM (transformers' class with the same modules);
the CLIP encoder and the projector apart. The class is not in transformers, so the counts are
checked against the published totals (tests/models/test_vision_language.py).
"""

from __future__ import annotations

from typing import Any

from llmmem.models.architectures.assembly import ArchitectureReader, SpecOrigin, linear
from llmmem.models.architectures.config_view import ConfigFieldError, ConfigView
from llmmem.models.architectures.vision_encoders import read_clip_vision
from llmmem.models.architectures.vision_language import (
    assemble,
    nested_config,
    projector_param_count,
    read_text_part,
)
from llmmem.models.spec import ImageGeometry, ModelSpec

# the CLIP ViT-L/14-336 config image_embedding_phi3_v.py builds its encoder from
PHI3_V_CLIP: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 336,
    "patch_size": 14,
    "hidden_act": "quick_gelu",
}
PHI3_V_CROPS = 4  # Phi-3.5-vision-instruct's preprocessor_config.json num_crops
PHI3_V_MERGE = 2  # 2×2 patch features folded into one token (the HD transform)
PHI3_V_KEYS_SKIPPED = ("img_processor", "embd_layer", "architectures", "model_type", "auto_map")


def read_phi3_v(view: ConfigView, origin: SpecOrigin) -> ModelSpec:
    processor = nested_config(view, "img_processor")
    embedding = nested_config(view, "embd_layer")
    encoder_name = str(processor.get("name") or "clip_vision_model")
    if encoder_name != "clip_vision_model":
        raise ConfigFieldError(
            f"the phi3_v config's image encoder {encoder_name!r} is not read (only CLIP's)"
        )
    if embedding and (
        embedding.get("projection_cls", "mlp") != "mlp"
        or not embedding.get("use_hd_transform", True)
    ):
        raise ConfigFieldError(
            "the phi3_v config's embd_layer is not the HD transform with an MLP projection"
        )
    text = {key: value for key, value in view.values.items() if key not in PHI3_V_KEYS_SKIPPED}
    text_spec = read_text_part(
        view,
        origin,
        text=text,
        text_type="phi3",
        sizes_from="phi3",
        tie=bool(view.value("tie_word_embeddings") or False),
    )
    clip = ConfigView(
        model_type="clip_vision_model",
        config_class="CLIPVisionConfig",
        values=dict(PHI3_V_CLIP),
        defaults=PHI3_V_CLIP,
    )
    encoder = read_clip_vision(clip, origin)
    features = int(processor.get("image_dim_out") or encoder.hidden_size)
    folded = features * PHI3_V_MERGE * PHI3_V_MERGE
    hidden = text_spec.hidden_size
    prefix = "model.vision_embed_tokens.img_projection"
    projector = [
        linear(f"{prefix}.0", folded, hidden, bias=True, role="other"),
        linear(f"{prefix}.2", hidden, hidden, bias=True, role="other"),
    ]
    separators = 2 * folded  # glb_GN and sub_GN
    per_side = PHI3_V_CLIP["image_size"] // PHI3_V_CLIP["patch_size"]
    geometry = ImageGeometry(
        rule="hd_crops",
        patch_size=PHI3_V_CLIP["patch_size"],
        image_size=PHI3_V_CLIP["image_size"],
        merge=PHI3_V_MERGE,
        class_token=True,
        max_tiles=PHI3_V_CROPS,
        tokens_per_image=(per_side // PHI3_V_MERGE) ** 2,
    )
    return assemble(
        view,
        text_spec,
        architecture="Phi3VForCausalLM",
        text_architecture="Phi3ForCausalLM",
        encoder=encoder,
        projector=projector,
        projector_params=projector_param_count(projector, separators),
        geometry=geometry,
        notes=[
            f"images: {PHI3_V_CROPS} crops of 336 pixels at most and a global image "
            "(Phi3VImageProcessor's num_crops in Phi-3.5-vision-instruct), every one of the "
            f"{PHI3_V_CROPS + 1} through CLIP"
        ],
    )


VISION_LANGUAGE_READERS = [
    ArchitectureReader("phi3_v", "Phi3VConfig", {"tie_word_embeddings": False}, read_phi3_v),
]

__all__ = ["VISION_LANGUAGE_READERS"]

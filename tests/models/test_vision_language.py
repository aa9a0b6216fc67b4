"""Vision-language models counted from their parts: each family is built from its config with
transformers on the meta device (no memory, no weights), its parameters split into the image
side (vision encoder, projector or merger) and the language model, and each part must equal
llmmem's count exactly, block by block where the blocks are Linears PEFT can reach.

The catalog's configs are the published ones; their totals are the published counts of the
checkpoints (the hub's safetensors totals), so a config copied wrong fails here too."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402

from llmmem.models.architectures import spec_from_config  # noqa: E402
from llmmem.models.catalog import catalog_entry  # noqa: E402
from llmmem.models.resolve import resolve_model  # noqa: E402
from llmmem.models.spec import ModelSource, ModelSpec  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

# the image side of each class, by the attribute paths transformers 5.24 gives it
VISION_PREFIXES = (
    "model.visual.",
    "model.vision_tower.",
    "model.vision_model.",
    "model.multi_modal_projector.",
    "model.connector.",
    "model.image_newline",
)
ENCODER_PREFIXES = ("model.visual.", "model.vision_tower.", "model.vision_model.")
# the Qwen mergers live inside model.visual but are the projector
MERGER_PREFIXES = ("model.visual.merger.", "model.visual.deepstack_merger_list.")
TEXT_BLOCKS = ("model.language_model.layers", "model.text_model.layers")
VISION_BLOCKS = (
    "model.visual.blocks",
    "model.vision_tower.encoder.layers",
    "model.vision_tower.encoder.layer",
    "model.vision_tower.transformer.layers",
    "model.vision_model.encoder.layers",
    "model.vision_model.transformer.layers",
    "model.vision_model.global_transformer.layers",
)

# the published count of each checkpoint (the hub's safetensors total), where one is known
PUBLISHED = {
    "Qwen/Qwen2-VL-2B-Instruct": 2_208_985_600,
    "Qwen/Qwen2-VL-7B-Instruct": 8_291_375_616,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,
    "Qwen/Qwen2.5-VL-32B-Instruct": 33_452_718_336,
    "Qwen/Qwen2.5-VL-72B-Instruct": 73_410_777_344,
    "Qwen/Qwen3-VL-2B-Instruct": 2_127_532_032,
    "Qwen/Qwen3-VL-4B-Instruct": 4_437_815_808,
    "Qwen/Qwen3-VL-8B-Instruct": 8_767_123_696,
    "meta-llama/Llama-3.2-11B-Vision-Instruct": 10_670_220_835,
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": 24_011_361_280,
    "mistral-community/pixtral-12b": 12_682_739_712,
    "llava-hf/llava-1.5-7b-hf": 7_063_427_072,
    "llava-hf/llava-v1.6-mistral-7b-hf": 7_566_747_648,
    "HuggingFaceTB/SmolVLM-Instruct": 2_246_272_880,
    "google/gemma-3-4b-it": 4_300_079_472,
}
CATALOG_VLMS = sorted(
    [
        *PUBLISHED,
        "HuggingFaceM4/Idefics3-8B-Llama3",
        "OpenGVLab/InternVL3-8B-hf",
        "google/gemma-3-12b-it",
        "google/gemma-3-27b-it",
    ]
)


def build_on_meta(config: dict[str, Any]) -> nn.Module:
    config = copy.deepcopy(config)
    model_type = config.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(hf_config)


def split(model: nn.Module) -> tuple[int, int, int]:
    """(language model, encoder, projector) parameters; tied ones counted once."""
    text = encoder = projector = 0
    for name, param in model.named_parameters():
        if name.startswith(ENCODER_PREFIXES) and not name.startswith(MERGER_PREFIXES):
            encoder += param.numel()
        elif name.startswith(VISION_PREFIXES):
            projector += param.numel()
        else:
            text += param.numel()
    return text, encoder, projector


def block_signatures(model: nn.Module, lists: tuple[str, ...]) -> Counter[Any]:
    found: Counter[Any] = Counter()
    for list_path in lists:
        try:
            blocks = model.get_submodule(list_path)
        except AttributeError:
            continue
        for block in blocks:
            linears = sorted(
                (path.rsplit(".", 1)[-1], path, m.in_features, m.out_features, m.bias is not None)
                for path, m in block.named_modules()
                if isinstance(m, nn.Linear)
            )
            found[(tuple(linears), sum(p.numel() for p in block.parameters()))] += 1
    return found


def spec_signatures(groups: list[Any]) -> Counter[Any]:
    expected: Counter[Any] = Counter()
    for group in groups:
        linears = sorted(
            (lin.name, lin.path, lin.in_features, lin.out_features, lin.bias)
            for lin in group.linears
        )
        expected[(tuple(linears), group.params_per_block)] += group.count
    return expected


def read(config: dict[str, Any]) -> ModelSpec:
    return spec_from_config(config, model_id="test/vlm", source=ModelSource.CONFIG)


def check_parts(config: dict[str, Any], spec: ModelSpec) -> nn.Module:
    model = build_on_meta(config)
    assert spec.vision is not None
    assert type(model).__name__ == spec.vision.architecture
    text, encoder, projector = split(model)
    assert spec.params.total == text
    assert spec.vision.encoder.params.total == encoder
    assert spec.vision.projector_params == projector
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    assert block_signatures(model, TEXT_BLOCKS) == spec_signatures(spec.blocks)
    assert block_signatures(model, VISION_BLOCKS) == spec_signatures(spec.vision.encoder.blocks)
    assert spec.vision.encoder.num_layers == sum(block_signatures(model, VISION_BLOCKS).values())
    return model


@pytest.mark.parametrize("model_id", CATALOG_VLMS)
def test_catalog_vlm_parts_match_transformers(model_id: str) -> None:
    entry = catalog_entry(model_id)
    assert entry is not None
    spec = spec_from_config(entry.config, model_id=model_id, source=ModelSource.CATALOG)
    check_parts(entry.config, spec)
    if model_id in PUBLISHED:
        assert spec.total_params == PUBLISHED[model_id]


@pytest.mark.parametrize(
    "model_id",
    [
        "Qwen/Qwen2.5-VL-7B-Instruct",
        "Qwen/Qwen3-VL-8B-Instruct",
        "meta-llama/Llama-3.2-11B-Vision-Instruct",
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    ],
)
def test_the_four_models_the_issue_names_resolve_with_their_vision_tower(model_id: str) -> None:
    """These were sized by a name guess as text-only Llamas: now the bundled config, the
    language model as its real class lays it out and the encoder apart."""
    spec = resolve_model(model_id)
    assert spec.source is ModelSource.CATALOG
    assert spec.vision is not None and spec.vision.params > 300_000_000
    assert spec.total_params == PUBLISHED[model_id]


def tiny_text(model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
        **extra,
    }


TINY = {
    "qwen2_vl-nested": {
        "model_type": "qwen2_vl",
        "text_config": tiny_text("qwen2_vl_text"),
        "vision_config": {
            "depth": 2,
            "embed_dim": 32,
            "num_heads": 4,
            "hidden_size": 64,
            "mlp_ratio": 2,
            "patch_size": 4,
        },
        "tie_word_embeddings": True,
    },
    "qwen2_5_vl-flat": {
        "model_type": "qwen2_5_vl",
        **{k: v for k, v in tiny_text().items() if k != "model_type"},
        "vision_config": {
            "depth": 3,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_heads": 4,
            "out_hidden_size": 64,
            "patch_size": 4,
            "fullatt_block_indexes": [2],
        },
    },
    "qwen3_vl-no-deepstack": {
        "model_type": "qwen3_vl",
        "text_config": tiny_text("qwen3_vl_text", head_dim=16),
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_heads": 4,
            "out_hidden_size": 64,
            "patch_size": 4,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [],
        },
    },
    "llava-two-feature-layers-no-bias": {
        "model_type": "llava",
        "text_config": tiny_text("mistral", head_dim=16),
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
        "vision_feature_layer": [-2, -1],
        "vision_feature_select_strategy": "full",
        "multimodal_projector_bias": False,
    },
    "llava-siglip": {
        "model_type": "llava",
        "text_config": tiny_text("qwen2"),
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
    },
    "llava_next": {
        "model_type": "llava_next",
        "text_config": tiny_text(),
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
        },
        "image_grid_pinpoints": [[32, 64], [64, 64]],
    },
    "gemma3-with-pooling-head": {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 300,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
            "vision_use_head": True,
        },
        "mm_tokens_per_image": 4,
    },
    "mistral3-tied": {
        "model_type": "mistral3",
        "text_config": tiny_text("mistral", head_dim=16),
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "head_dim": 8,
            "image_size": 64,
            "patch_size": 8,
        },
        "tie_word_embeddings": True,
        "multimodal_projector_bias": True,
    },
    "internvl-qk-norm-rmsnorm": {
        "model_type": "internvl",
        "text_config": tiny_text("qwen3", head_dim=16),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
            "use_qk_norm": True,
            "norm_type": "rms_norm",
            "use_mean_pooling": False,
            "attention_bias": True,
            "use_mask_token": True,
        },
    },
    "idefics3": {
        "model_type": "idefics3",
        "text_config": tiny_text(),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 4,
        },
        "scale_factor": 2,
    },
    "smolvlm-tied": {
        "model_type": "smolvlm",
        "text_config": tiny_text(tie_word_embeddings=True),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 4,
        },
        "tie_word_embeddings": True,
        "scale_factor": 4,
    },
    "mllama": {
        "model_type": "mllama",
        "text_config": tiny_text(
            "mllama_text_model", num_hidden_layers=5, cross_attention_layers=[1, 4], pad_token_id=0
        ),
        "vision_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 3,
            "num_global_layers": 2,
            "attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
            "max_num_tiles": 2,
            "intermediate_layers_indices": [0, 2],
            "vision_output_dim": 96,
            "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]],
        },
    },
}


@pytest.mark.parametrize("family", sorted(TINY))
def test_tiny_variants_match_transformers(family: str) -> None:
    config = TINY[family]
    check_parts(config, read(config))


def test_mllama_cross_attention_blocks_are_language_model_blocks() -> None:
    spec = read(TINY["mllama"])
    cross = next(group for group in spec.blocks if group.name == "cross_attention")
    assert cross.count == 2 and spec.num_layers == 5
    assert {lin.path for lin in cross.linears} >= {"cross_attn.q_proj", "cross_attn.k_proj"}
    assert spec.vision is not None and spec.vision.geometry.rule == "cross_attention"
    assert spec.vision.feature_width == 96


def test_qwen2_5_vl_windows_and_merge() -> None:
    spec = resolve_model("Qwen/Qwen2.5-VL-7B-Instruct")
    assert spec.vision is not None
    geometry = spec.vision.geometry
    assert (geometry.rule, geometry.patch_size, geometry.merge) == ("grid", 14, 2)
    assert geometry.window_patches == 8 and geometry.full_attention_blocks == 4
    assert spec.vision.encoder.num_layers == 32 and spec.vision.encoder.hidden_size == 1280


def test_llava_text_sizes_from_the_llama_defaults_are_noted() -> None:
    spec = resolve_model("llava-hf/llava-1.5-7b-hf")
    assert spec.hidden_size == 4096 and spec.num_layers == 32 and spec.vocab_size == 32064
    assert any("text_config.hidden_size=4096" in note for note in spec.notes)


def test_mistral3_without_a_stated_tie_is_read_untied() -> None:
    entry = catalog_entry("mistralai/Mistral-Small-3.1-24B-Instruct-2503")
    assert entry is not None
    config = {k: v for k, v in entry.config.items() if k != "tie_word_embeddings"}
    spec = read(config)
    assert not spec.tie_word_embeddings and spec.total_params == 24_011_361_280
    assert any("read untied" in note for note in spec.notes)


def test_a_vision_config_that_is_not_an_object_is_a_clear_error() -> None:
    from llmmem.models.spec import ModelSpecError

    with pytest.raises(ModelSpecError, match="malformed 'vision_config'"):
        read({**tiny_text(), "model_type": "qwen2_5_vl", "vision_config": [1, 2]})

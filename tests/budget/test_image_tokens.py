"""The image tokens of each family against transformers' own processors' sizing code.

The processors need PIL (and torchvision) to run, which the test environment does not have, so
their sizing functions are taken out of transformers 5.24's source files as they are written
(`ast`, decorators dropped) and run on plain numbers: the resize and tiling rules compared are
the processors' own, not a copy kept here."""

from __future__ import annotations

import ast
import functools
import math
from pathlib import Path
from typing import Any

import pytest

from llmmem.budget.image_tokens import image_tokens
from llmmem.budget.setup import SetupError, VisionSetup
from llmmem.models.resolve import resolve_model

transformers = pytest.importorskip("transformers")
np = pytest.importorskip("numpy")
MODELS = Path(transformers.__file__).parent / "models"

SIZES = [
    (448, 448),
    (700, 1000),
    (1080, 1920),
    (300, 200),
    (2048, 512),
    (56, 3000),
    (4000, 3000),
    (28, 28),
]


def functions_of(relative: str, *names: str, scope: dict[str, Any] | None = None) -> dict[str, Any]:
    """The named top-level functions (or methods, as plain functions) of a transformers source
    file, compiled as written but for their decorators."""
    tree = ast.parse((MODELS.parent / relative).read_text())
    wanted = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            wanted.append(node)
    module = ast.Module(body=wanted, type_ignores=[])
    namespace: dict[str, Any] = {"math": math, "np": np, "lru_cache": functools.lru_cache}
    namespace.update(scope or {})
    exec(compile(module, relative, "exec"), namespace)
    return namespace


def tokens(model_id: str, height: int, width: int, **extra: Any) -> Any:
    spec = resolve_model(model_id)
    assert spec.vision is not None
    return image_tokens(spec.vision, VisionSetup(height=height, width=width, **extra))


@pytest.mark.parametrize(("height", "width"), SIZES)
@pytest.mark.parametrize(
    ("model_id", "bounds"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", (3136, 12_845_056)),
        ("Qwen/Qwen2-VL-2B-Instruct", (3136, 12_845_056)),
        ("Qwen/Qwen3-VL-8B-Instruct", (65_536, 16_777_216)),
    ],
)
def test_qwen_grid_is_smart_resize(
    model_id: str, bounds: tuple[int, int], height: int, width: int
) -> None:
    smart_resize = functions_of("models/qwen2_vl/image_processing_pil_qwen2_vl.py", "smart_resize")[
        "smart_resize"
    ]
    spec = resolve_model(model_id)
    assert spec.vision is not None
    patch, merge = spec.vision.geometry.patch_size, spec.vision.geometry.merge
    for low, high in (bounds, (256 * 28 * 28, 1280 * 28 * 28)):
        h, w = smart_resize(height, width, factor=patch * merge, min_pixels=low, max_pixels=high)
        found = image_tokens(
            spec.vision,
            VisionSetup(images=2, height=height, width=width, min_pixels=low, max_pixels=high),
        )
        grid = (h // patch) * (w // patch)
        assert found.encoder_tokens == 2 * grid  # image_grid_thw: t=1, h, w
        assert found.lm_tokens == 2 * grid // (merge * merge)


def test_qwen_defaults_are_the_checkpoints_processor_bounds() -> None:
    """A 4000x3000 photo stays near full size under the published 12.8M-pixel bound (transformers'
    class default, 1280·28², would shrink it to 1280 tokens)."""
    found = tokens("Qwen/Qwen2.5-VL-7B-Instruct", 3000, 4000)
    assert found.lm_tokens == (3000 // 28) * (4004 // 28)
    assert found.lm_tokens > 15_000


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_mllama_tiles_are_its_processors_canvas(height: int, width: int) -> None:
    scope = functions_of(
        "models/mllama/image_processing_pil_mllama.py",
        "get_all_supported_aspect_ratios",
        "get_optimal_tiled_canvas",
    )
    canvas = scope["get_optimal_tiled_canvas"](height, width, 4, 560)
    tiles = int(canvas[0] // 560) * int(canvas[1] // 560)
    found = tokens("meta-llama/Llama-3.2-11B-Vision-Instruct", height, width)
    assert found.units == tiles and found.cross_states == tiles * 1601
    assert found.lm_tokens == 1


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_internvl_tiles_are_got_ocr2s_grid(height: int, width: int) -> None:
    scope = functions_of(
        "models/got_ocr2/image_processing_pil_got_ocr2.py",
        "get_all_supported_aspect_ratios",
        "get_optimal_tiled_canvas",
    )
    grid = scope["get_optimal_tiled_canvas"]((height, width), (448, 448), 1, 12)
    tiles = grid[0] * grid[1]
    tiles += 1 if tiles > 1 else 0  # the thumbnail
    found = tokens("OpenGVLab/InternVL3-8B-hf", height, width)
    assert found.units == tiles
    assert found.lm_tokens == 256 * tiles and found.encoder_tokens == 1025 * tiles


@pytest.mark.parametrize(("height", "width"), SIZES)
@pytest.mark.parametrize(
    ("model_id", "tile", "per_tile"),
    [("HuggingFaceTB/SmolVLM-Instruct", 384, 81), ("HuggingFaceM4/Idefics3-8B-Llama3", 364, 169)],
)
def test_idefics3_tiles_are_its_processors_split(
    model_id: str, tile: int, per_tile: int, height: int, width: int
) -> None:
    scope = functions_of(
        "models/idefics3/image_processing_pil_idefics3.py",
        "_resize_output_size_rescale_to_max_len",
        "_resize_output_size_scale_below_upper_bound",
        scope={"MAX_IMAGE_SIZE": 4096},
    )
    h, w = scope["_resize_output_size_rescale_to_max_len"](height, width, max_len=4 * tile)
    h, w = scope["_resize_output_size_scale_below_upper_bound"](h, w, max_len=4096)
    # resize_for_vision_encoder, then split_images
    h, w = math.ceil(h / tile) * tile, math.ceil(w / tile) * tile
    split = ((h - tile) // tile + 1) * ((w - tile) // tile + 1) if h > tile or w > tile else 0
    frames = split + 1 if split else 1
    found = tokens(model_id, height, width)
    assert found.units == frames and found.lm_tokens == frames * per_tile


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_pixtral_grid_is_its_processors_resize(height: int, width: int) -> None:
    scope = functions_of(
        "models/pixtral/image_processing_pil_pixtral.py",
        "_num_image_tokens",
        "get_resize_output_image_size",
        scope={"get_image_size": lambda image, _format: image},
    )
    h, w = scope["get_resize_output_image_size"]((height, width), 1540, 28)
    found = tokens("mistralai/Mistral-Small-3.1-24B-Instruct-2503", height, width)
    rows, cols = h // 28, w // 28
    assert found.encoder_tokens == (h // 14) * (w // 14)
    assert found.lm_tokens == rows * (cols + 1)  # [IMG] per token, [IMG_BREAK]/[IMG_END] per row


@pytest.mark.parametrize(("height", "width"), SIZES)
def test_llava_next_tokens_are_its_processors_count(height: int, width: int) -> None:
    from llmmem.budget.image_tokens import llava_next_features

    best = functions_of("image_processing_utils.py", "select_best_resolution")
    unpadded = functions_of("models/llava_next/processing_llava_next.py", "_get_unpadded_features")[
        "_get_unpadded_features"
    ]
    pinpoints = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    best_h, best_w = best["select_best_resolution"]([height, width], pinpoints)
    features, newlines = unpadded(None, height, width, 24, 24, best_h // 336, best_w // 336)
    spec = resolve_model("llava-hf/llava-v1.6-mistral-7b-hf")
    assert spec.vision is not None
    grid, lm = llava_next_features(
        height, width, spec.vision.geometry, [(a, b) for a, b in pinpoints]
    )
    assert grid == (best_h // 336) * (best_w // 336)
    assert lm == features + newlines + 576  # the base image's 576 (CLS dropped: "default")


def test_fixed_families() -> None:
    gemma = tokens("google/gemma-3-4b-it", 1080, 1920, images=3)
    assert gemma.lm_tokens == 3 * 256 and gemma.encoder_tokens == 3 * 64 * 64
    llava = tokens("llava-hf/llava-1.5-7b-hf", 1080, 1920)
    assert llava.lm_tokens == 576 and llava.encoder_tokens == 577


def test_impossible_images_are_refused_in_one_line() -> None:
    with pytest.raises(SetupError, match="more than 200 times"):
        VisionSetup(height=10, width=3000)
    with pytest.raises(SetupError, match="min_pixels"):
        VisionSetup(min_pixels=10_000, max_pixels=100)
    with pytest.raises(SetupError, match="images per sample must be at least 1"):
        VisionSetup(images=0)

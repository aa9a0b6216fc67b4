"""Phi-3.5-vision (remote code, not in transformers): its parts counted from the published
config against the published totals, and its images sized the way Phi3VImageProcessor sizes
them (HD_transform, num_crops + 1 crops through CLIP)."""

from __future__ import annotations

import pytest

from llmmem.budget.image_tokens import image_tokens, phi3_hd_size
from llmmem.budget.setup import VisionSetup
from llmmem.models.resolve import resolve_model

MODEL = "microsoft/Phi-3.5-vision-instruct"
PUBLISHED_TOTAL = 4_146_621_440  # the checkpoint's safetensors total
PUBLISHED_EMBEDDING = 98_500_608  # its token embedding: 32,064 × 3,072


def test_phi35_vision_is_counted_part_by_part_to_the_published_total() -> None:
    spec = resolve_model(MODEL, hub=False)
    assert spec.vision is not None
    assert spec.total_params == PUBLISHED_TOTAL
    assert spec.vocab_size * spec.hidden_size == PUBLISHED_EMBEDDING
    # CLIP ViT-L/14 at 336 pixels: patch conv, class token, 577 positions, two LayerNorms and
    # 24 blocks of 1024 (q, k, v, out with biases; MLP 1024 -> 4096 -> 1024; two LayerNorms)
    block = 4 * (1024 * 1024 + 1024) + (1024 * 4096 + 4096) + (4096 * 1024 + 1024) + 4 * 1024
    clip = 3 * 14 * 14 * 1024 + 1024 + 577 * 1024 + 2 * 2 * 1024 + 24 * block
    assert spec.vision.encoder.params.total == clip
    # the HD transform's MLP 4096 -> 3072 -> 3072 and its two 4096-value separators
    projector = (4096 * 3072 + 3072) + (3072 * 3072 + 3072) + 2 * 4096
    assert spec.vision.projector_params == projector
    assert spec.params.total == PUBLISHED_TOTAL - clip - projector


@pytest.mark.parametrize(
    ("height", "width", "crops", "hd"),
    [
        (672, 672, 4, (672, 672)),  # square: a 2×2 grid
        (1280, 1920, 4, (672, 672)),  # 3:2 landscape: 2 wide, 448 high padded to 672
        (1280, 1920, 16, (1008, 1344)),  # 4 wide, 896 high padded to 1008
        (1920, 1280, 16, (1344, 1008)),  # the same image upright: the sides swap back
        (300, 3000, 4, (336, 1344)),  # a strip: 4 crops wide, one high
    ],
)
def test_hd_transform_sizes(height: int, width: int, crops: int, hd: tuple[int, int]) -> None:
    assert phi3_hd_size(height, width, crops) == hd


def test_phi35_vision_image_tokens_follow_the_processor() -> None:
    spec = resolve_model(MODEL, hub=False)
    assert spec.vision is not None
    one = image_tokens(spec.vision, VisionSetup(images=1, height=1280, width=1920))
    # Phi3VImageProcessor: (rows·cols + 1)·144 + 1 + (rows + 1)·12 with a 2×2 grid
    assert one.lm_tokens == (2 * 2 + 1) * 144 + 1 + (2 + 1) * 12 == 757
    # every image is padded to num_crops + 1 = 5 crops of 577 CLIP tokens
    assert one.units == 5
    assert one.encoder_tokens == 5 * 577
    # HD_transform scales a small image up to the widest grid too: 336 pixels become 2×2 crops
    two = image_tokens(spec.vision, VisionSetup(images=2, height=336, width=336))
    assert two.lm_tokens == 2 * 757
    assert two.encoder_tokens == 2 * 5 * 577

"""How many tokens the images of one sample become: the vision encoder's tokens (patches, class
tokens, tiles) and the tokens that enter the language model.

Each family's processor sizes images its own way, restated here from transformers 5.24's image
processors (tests/budget/test_image_tokens.py runs the processors' own sizing functions against
these):

- Qwen2-VL, Qwen2.5-VL, Qwen3-VL (`smart_resize`): each side rounded to a multiple of
  patch·merge, the area brought within [min_pixels, max_pixels] keeping the aspect; a grid of
  (H/patch)·(W/patch) patches, merge² of them per language-model token;
- Pixtral, Mistral 3: the longest edge brought down to the encoder's image_size, each side
  rounded up to a multiple of patch·merge; a [IMG_BREAK] after each row of merged patches;
- Gemma 3, LLaVA: one square image_size image, a fixed number of tokens;
- LLaVA-NeXT (any resolution): the base image and the tiles of the best grid of
  image_grid_pinpoints, the tiles' features unpadded to the image's aspect, a newline per row;
- InternVL (`crop_to_patches`): the grid of 1 to 12 tiles closest to the image's aspect, and a
  thumbnail when there are several;
- Idefics3, SmolVLM: the longest edge brought to 4 tiles' length, each side rounded up to whole
  tiles, the tiles and a downscaled whole image;
- Phi-3-vision, Phi-3.5-vision (`HD_transform`): the image scaled to the widest grid of 336-pixel
  crops within num_crops that keeps its aspect, its height padded to whole crops; the crops and a
  336-pixel global image, every one of the num_crops + 1 crops through the encoder (the batch is
  padded to that many), 144 tokens per crop after a 2×2 merge, one separator after each row;
- Mllama: the canvas of at most max_num_tiles tiles that scales the image least; the text holds
  one token per image, the cross-attention blocks read every tile's patches and class token.

Pure arithmetic on the spec's `ImageGeometry` and the setup's `VisionSetup`: no torch, no PIL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmmem.budget.setup import VisionSetup
from llmmem.models.spec import ImageGeometry, VisionTower

# the processors' bounds on an image's area where the checkpoints' preprocessor_config.json
# set them (Qwen2-VL and Qwen2.5-VL: 3136 to 12,845,056 pixels, 56² to 16384·28²; Qwen3-VL:
# 65,536 to 16,777,216); transformers' own class defaults (56² to 1280·28²) are not what the
# published checkpoints load
QWEN_PIXELS = {
    "Qwen2VLForConditionalGeneration": (3136, 12_845_056),
    "Qwen2_5_VLForConditionalGeneration": (3136, 12_845_056),
    "Qwen3VLForConditionalGeneration": (65_536, 16_777_216),
}
INTERNVL_TILES = (1, 12)  # GotOcr2ImageProcessor's min_patches, max_patches
IDEFICS3_TILES_PER_EDGE = 4  # Idefics3's and SmolVLM's size.longest_edge: 4 tiles
IDEFICS3_MAX_SIDE = 4096  # MAX_IMAGE_SIZE


@dataclass(frozen=True)
class ImageTokens:
    """What the images of one sample become."""

    # the encoder's attention runs within each unit (an image, or a tile of one; Mllama's
    # local layers: a tile, its global layers: an image)
    units: int
    encoder_tokens: int  # every encoder token of the sample's images
    merged_tokens: int  # the projector's rows: encoder tokens after merging or pooling
    lm_tokens: int  # tokens the images take in the language model's sequence
    cross_states: int = 0  # Mllama: vision states each cross-attention block reads
    formula: str = ""
    # the longest run of tokens one attention call sees (an image, a tile)
    longest_unit: int = 0
    # Σ over the attention calls of their tokens²: what eager attention's scores scale with
    square: int = 0

    @property
    def tokens_per_unit(self) -> float:
        return self.encoder_tokens / max(self.units, 1)


def qwen_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen's smart_resize: sides multiples of `factor`, the area within the bounds."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def pixtral_resize(height: int, width: int, longest: int, step: int) -> tuple[int, int]:
    """Pixtral's resize: the longest edge down to `longest`, each side up to a multiple of
    `step` (patch · merge)."""
    ratio = max(height / longest, width / longest)
    if ratio > 1:
        height = int(math.floor(height / ratio))
        width = int(math.floor(width / ratio))
    return ((height - 1) // step + 1) * step, ((width - 1) // step + 1) * step


def mllama_tiles(height: int, width: int, max_tiles: int, tile: int) -> int:
    """Tiles of the canvas Mllama's processor picks: the least upscaling, else the least
    downscaling, then the smallest canvas."""
    canvases = [
        (across * tile, down * tile)
        for across in range(1, max_tiles + 1)
        for down in range(1, max_tiles + 1)
        if across * down <= max_tiles
    ]
    scales = [min(first / height, second / width) for first, second in canvases]
    upscaling = [scale for scale in scales if scale >= 1]
    chosen_scale = min(upscaling) if upscaling else max(scales)
    chosen = [c for c, scale in zip(canvases, scales, strict=True) if scale == chosen_scale]
    first, second = min(chosen, key=lambda c: c[0] * c[1])
    return (first // tile) * (second // tile)


def internvl_grid(height: int, width: int, tile: int, low: int, high: int) -> int:
    """Tiles of the grid GotOcr2's processor picks: the aspect closest to the image's; on a
    tie, more tiles while they cover less than twice the image."""
    grids = sorted(
        (
            (across, down)
            for across in range(1, high + 1)
            for down in range(1, high + 1)
            if low <= across * down <= high
        ),
        key=lambda grid: grid[0] * grid[1],
    )
    aspect = width / height
    area = width * height
    best_diff, best = float("inf"), (1, 1)
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best_diff, best = diff, grid
        elif diff == best_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best[0] * best[1]


def idefics3_tiles(height: int, width: int, tile: int) -> int:
    """Tiles Idefics3's processor cuts (0 for an image no larger than one tile)."""
    longest = IDEFICS3_TILES_PER_EDGE * tile
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    if max(height, width) > IDEFICS3_MAX_SIDE:
        aspect = width / height
        if width >= height:
            width, height = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE / aspect)
        else:
            height, width = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE * aspect)
    height, width = max(height, 1), max(width, 1)
    height = math.ceil(height / tile) * tile
    width = math.ceil(width / tile) * tile
    if height > tile or width > tile:
        return ((height - tile) // tile + 1) * ((width - tile) // tile + 1)
    return 0


def llava_next_features(
    height: int, width: int, geometry: ImageGeometry, pinpoints: list[tuple[int, int]]
) -> tuple[int, int]:
    """(tiles of the best grid, the image's language-model tokens) as LLaVA-NeXT's processor
    counts them: the base image's features, the grid's unpadded to the image's aspect, a
    newline per row."""
    best, best_effective, best_wasted = pinpoints[0], -1, float("inf")
    for grid_height, grid_width in pinpoints:
        scale = min(grid_width / width, grid_height / height)
        down_w, down_h = int(width * scale), int(height * scale)
        effective = min(down_w * down_h, width * height)
        wasted = grid_height * grid_width - effective
        if effective > best_effective or (effective == best_effective and wasted < best_wasted):
            best, best_effective, best_wasted = (grid_height, grid_width), effective, wasted
    size = geometry.image_size or 336
    rows_of_tiles, cols_of_tiles = best[0] // size, best[1] // size
    per_side = size // geometry.patch_size
    current_height, current_width = per_side * rows_of_tiles, per_side * cols_of_tiles
    if width / height > current_width / current_height:
        new_height = int(round(height * (current_width / width), 7))
        current_height -= 2 * ((current_height - new_height) // 2)
    else:
        new_width = int(round(width * (current_height / height), 7))
        current_width -= 2 * ((current_width - new_width) // 2)
    base = geometry.tokens_per_image or per_side * per_side
    return rows_of_tiles * cols_of_tiles, current_height * current_width + current_height + base


def phi3_hd_size(height: int, width: int, crops: int, crop: int = 336) -> tuple[int, int]:
    """(height, width) of an image after Phi-3-vision's HD_transform with at most `crops`
    crops: the longer side's grid as wide as `crops` allows at the image's aspect, the shorter
    side scaled with it and padded up to whole crops."""
    transposed = width < height
    if transposed:
        height, width = width, height
    ratio = width / height
    scale = 1
    while scale * math.ceil(scale / ratio) <= crops:
        scale += 1
    scale -= 1
    new_width = int(scale * crop)
    new_height = math.ceil(int(new_width / ratio) / crop) * crop
    return (new_width, new_height) if transposed else (new_height, new_width)


def image_tokens(
    tower: VisionTower,
    images: VisionSetup,
    *,
    pinpoints: list[tuple[int, int]] | None = None,
) -> ImageTokens:
    """What `images.images` images of `images.height` × `images.width` pixels become in one
    sample of a model with this vision tower."""
    g = tower.geometry
    count, height, width = images.images, images.height, images.width
    per_side = (g.image_size // g.patch_size) if g.image_size else 0
    cls = 1 if g.class_token else 0
    if g.rule == "grid" and g.row_break:
        longest = g.image_size or max(height, width)
        step = g.patch_size * g.merge
        h, w = pixtral_resize(height, width, longest, step)
        patches = (h // g.patch_size) * (w // g.patch_size)
        rows, cols = h // step, w // step
        return ImageTokens(
            units=count,
            encoder_tokens=count * patches,
            merged_tokens=count * rows * cols,
            lm_tokens=count * rows * (cols + 1),
            formula=f"{count} × ({h}×{w} px: {patches} patches of {g.patch_size}, "
            f"{rows}×{cols} tokens and a break per row)",
            longest_unit=patches,
            square=count * patches * patches,
        )
    if g.rule == "grid":
        low, high = QWEN_PIXELS.get(tower.architecture, (3136, 12_845_056))
        low = images.min_pixels if images.min_pixels is not None else low
        high = images.max_pixels if images.max_pixels is not None else high
        factor = g.patch_size * g.merge
        h, w = qwen_resize(height, width, factor, low, high)
        patches = (h // g.patch_size) * (w // g.patch_size)
        merged = patches // (g.merge * g.merge)
        windows = f"; windows of {g.window_patches}² patches" if g.window_patches else ""
        return ImageTokens(
            units=count,
            encoder_tokens=count * patches,
            merged_tokens=count * merged,
            lm_tokens=count * merged,
            formula=f"{count} × ({h}×{w} px: {h // g.patch_size}×{w // g.patch_size} patches of "
            f"{g.patch_size}, {g.merge}×{g.merge} per token{windows})",
            longest_unit=patches,
            square=count * patches * patches,
        )
    if g.rule == "fixed":
        tokens = g.tokens_per_image or per_side * per_side
        encoder = per_side * per_side + cls
        return ImageTokens(
            units=count,
            encoder_tokens=count * encoder,
            merged_tokens=count * tokens,
            lm_tokens=count * tokens,
            formula=f"{count} × {tokens} tokens ({g.image_size}-pixel image, {encoder} "
            "encoder tokens)",
            longest_unit=encoder,
            square=count * encoder * encoder,
        )
    if g.rule == "cross_attention":
        size = g.image_size or 560
        tiles = mllama_tiles(height, width, g.max_tiles, size)
        per_tile = per_side * per_side + cls
        padded = per_tile + (-per_tile) % 8  # the encoder pads each tile to a multiple of 8
        return ImageTokens(
            units=count * tiles,
            encoder_tokens=count * tiles * padded,
            merged_tokens=count * tiles * per_tile,
            lm_tokens=count,
            cross_states=count * tiles * per_tile,
            formula=f"{count} × {tiles} tiles of {per_tile} vision states (one image token "
            "each in the text)",
            longest_unit=tiles * padded,
            square=count * (tiles * padded) ** 2,
        )
    if g.rule == "hd_crops":
        size = g.image_size or 336
        h, w = phi3_hd_size(height, width, g.max_tiles, size)
        rows, cols = h // size, w // size
        crops = g.max_tiles + 1  # the processor pads every image to num_crops + 1 crops
        per_crop = per_side * per_side + cls
        merged_per_crop = g.tokens_per_image or 0
        side_tokens = per_side // g.merge
        lm_per_image = (rows * cols + 1) * merged_per_crop + 1 + (rows + 1) * side_tokens
        return ImageTokens(
            units=count * crops,
            encoder_tokens=count * crops * per_crop,
            merged_tokens=count * (rows * cols + 1) * merged_per_crop,
            lm_tokens=count * lm_per_image,
            formula=f"{count} × ({h}×{w} px: {rows}×{cols} crops of {size} and a global one, "
            f"{crops} through the encoder; {lm_per_image} tokens per image)",
            longest_unit=per_crop,
            square=count * crops * per_crop * per_crop,
        )
    # tiles
    size = g.image_size or 448
    if pinpoints is not None:
        grid, lm_per_image = llava_next_features(height, width, g, pinpoints)
        tiles = grid + 1
    elif g.max_tiles >= 16:  # Idefics3, SmolVLM
        split = idefics3_tiles(height, width, size)
        tiles = split + 1 if split else 1
        lm_per_image = tiles * (g.tokens_per_image or 0)
    else:  # InternVL
        grid = internvl_grid(height, width, size, *INTERNVL_TILES)
        tiles = grid + 1 if grid > 1 else 1
        lm_per_image = tiles * (g.tokens_per_image or 0)
    per_tile = per_side * per_side + cls
    merged = tiles * (g.tokens_per_image or 0) if pinpoints is not None else lm_per_image
    return ImageTokens(
        units=count * tiles,
        encoder_tokens=count * tiles * per_tile,
        merged_tokens=count * merged,
        lm_tokens=count * lm_per_image,
        formula=f"{count} × {tiles} tiles of {size} pixels ({per_tile} encoder tokens each), "
        f"{lm_per_image} tokens per image",
        longest_unit=per_tile,
        square=count * tiles * per_tile * per_tile,
    )

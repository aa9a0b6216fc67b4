"""The estimate flags of a vision-language model's images: how many each sample holds, their
size, the processor's bounds on their area, and what of the image side trains.

They become the setup's `VisionSetup` (llmmem.budget.setup); the budget's image side
(llmmem.budget.vision) sizes the encoder, the projector and the image tokens from it. Given for
a text-only model they are refused: an accepted flag that changes nothing would be a lie."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from llmmem.budget.setup import SetupError, TrainingSetup, VisionSetup
from llmmem.errors import UsageError
from llmmem.models.spec import ModelSpec

TRAIN_VISION = ("none", "projector", "all")


def _size(text: str) -> tuple[int, int]:
    """WxH in pixels (`448x448`, `1280X720`, or one number for a square)."""
    found = re.fullmatch(r"\s*(\d{1,6})\s*(?:[xX×]\s*(\d{1,6}))?\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"expected WIDTHxHEIGHT in pixels such as 448x448, got '{text[:24]}'"
        )
    width = int(found.group(1))
    height = int(found.group(2) or width)
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"an image needs at least one pixel a side: '{text}'")
    return width, height


def _images(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text[:24]}'") from None
    if not 0 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"expected 0 to 4096 images per sample, got {value}")
    return value


def _pixels(text: str) -> int:
    try:
        value = int(float(text)) if re.fullmatch(r"\d+(\.0*)?(e\d+)?", text.strip()) else None
    except (ValueError, OverflowError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of pixels, got '{text[:24]}'")
    return value


def add_vision_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "images (vision-language models: Qwen2/2.5/3-VL, Llama 3.2 Vision, Gemma 3, LLaVA, "
        "Pixtral, InternVL, Idefics3/SmolVLM)"
    )
    group.add_argument(
        "--images",
        type=_images,
        default=None,
        help="images in each sample (default: none, the vision tower counted as weights only)",
    )
    group.add_argument(
        "--image-size",
        type=_size,
        default=None,
        metavar="WxH",
        help="each image's size in pixels before the processor resizes it (default 448x448)",
    )
    group.add_argument(
        "--min-pixels",
        type=_pixels,
        default=None,
        help="the processor's lower bound on an image's area (Qwen's min_pixels; default: "
        "the checkpoint's processor's)",
    )
    group.add_argument(
        "--max-pixels",
        type=_pixels,
        default=None,
        help="the processor's upper bound on an image's area (Qwen's max_pixels, "
        "LLaMA-Factory's image_max_pixels; default: the checkpoint's processor's)",
    )
    group.add_argument(
        "--train-vision",
        choices=TRAIN_VISION,
        default=None,
        help="what of the image side trains: none (a frozen encoder and projector, "
        "LLaMA-Factory's freeze_vision_tower and freeze_multi_modal_projector, LoRA adapters "
        "kept in the language model), projector, or all (default: as the method says: full "
        "fine-tuning trains everything, LoRA puts adapters wherever its target names match)",
    )
    group.add_argument(
        "--seq-includes-images",
        action="store_true",
        default=None,
        help="--seq is the whole sequence's maximum length, image tokens included (TRL's "
        "max_length, LLaMA-Factory's cutoff_len); without it the image tokens come on top",
    )


VISION_DESTS = ("images", "image_size", "min_pixels", "max_pixels", "train_vision")


def vision_from_args(
    args: argparse.Namespace, spec: ModelSpec, setup: TrainingSetup, prov: dict[str, str]
) -> TrainingSetup:
    """The setup with the images the flags ask for; refused for a text-only model."""
    given = [name for name in VISION_DESTS if getattr(args, name, None) is not None]
    if getattr(args, "seq_includes_images", None):
        given.append("seq_includes_images")
    if not given:
        return setup
    flags = ", ".join("--" + name.replace("_", "-") for name in given)
    if spec.vision is None:
        raise UsageError(
            f"{flags}: {spec.model_id} is a text-only model (no vision encoder); give a "
            "vision-language model such as Qwen/Qwen2.5-VL-7B-Instruct"
        )
    images = getattr(args, "images", None)
    if images == 0:
        if len(given) > 1:
            raise UsageError(f"{flags}: --images 0 sizes no images, so the others say nothing")
        prov["images"] = "flag: no images (the vision tower counted as weights only)"
        return replace(setup, vision=None)
    if images is None:
        images = 1
        prov["images"] = "1 (default, as the image flags were given)"
    else:
        prov["images"] = "flag"
    width, height = getattr(args, "image_size", None) or (448, 448)
    train = getattr(args, "train_vision", None)
    try:
        vision = VisionSetup(
            images=images,
            height=height,
            width=width,
            min_pixels=getattr(args, "min_pixels", None),
            max_pixels=getattr(args, "max_pixels", None),
            encoder_trains=None if train is None else train == "all",
            projector_trains=None if train is None else train in ("all", "projector"),
            adapters_reach_vision=train != "none",
            seq_includes_images=bool(getattr(args, "seq_includes_images", None)),
        )
    except SetupError as err:
        raise UsageError(str(err)) from None
    return replace(setup, vision=vision)


def vision_line(setup: TrainingSetup, prov: dict[str, str]) -> tuple[str, str, str] | None:
    """The settings table's line for the images, where there are any."""
    vision = setup.vision
    if vision is None:
        return None
    trains = (
        "as the method says"
        if vision.encoder_trains is None
        else "all"
        if vision.encoder_trains
        else "projector"
        if vision.projector_trains
        else "none"
    )
    bounds = ""
    if vision.min_pixels is not None or vision.max_pixels is not None:
        bounds = f", pixels {vision.min_pixels or '…'}–{vision.max_pixels or '…'}"
    return (
        "images",
        f"{vision.images} × {vision.width}x{vision.height}{bounds}, vision trains: {trains}",
        prov.get("images", ""),
    )

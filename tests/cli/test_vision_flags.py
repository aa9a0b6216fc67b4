"""`llmmem estimate --images N --image-size WxH` as a user runs it on a vision-language model:
the image tokens lengthen the language model's sequence by the processor's own rule, the
encoder's tensors and (trained) its gradients and states add to the step, and the flags are
refused where they would change nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmmem.cli import main

QWEN_VL = ("--model", "Qwen/Qwen2.5-VL-7B-Instruct", "--gpu", "A100-80GB")


def estimate(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["estimate", "--offline", "--format", "json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def refused(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code = main(["estimate", "--offline", *args])
    except SystemExit as exit:  # argparse's own refusal of a flag's value
        code = int(exit.code or 0)
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    return err


def test_images_lengthen_the_sequence_by_qwens_own_resize(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Qwen2.5-VL's smart_resize: 1280×720 → 1288×728 (multiples of 28), 92×52 patches of 14,
    # 2×2 patches a token: 1196 tokens an image, two images 2392
    report = estimate(capsys, *QWEN_VL, "--images", "2", "--image-size", "1280x720")
    assert "sequence: 1024 text tokens + 2392 image tokens = 3416" in report["notes"]
    text_only = estimate(capsys, *QWEN_VL, "--images", "0")
    assert report["allocated_peak_bytes"] > 2 * text_only["allocated_peak_bytes"]
    assert any("no images given" in note for note in text_only["notes"])
    assert report["setup"]["values"]["vision"]["images"] == 2


def test_a_bound_on_the_area_shrinks_the_images(capsys: pytest.CaptureFixture[str]) -> None:
    large = estimate(capsys, *QWEN_VL, "--images", "1", "--image-size", "2048x2048")
    bounded = estimate(
        capsys, *QWEN_VL, "--images", "1", "--image-size", "2048x2048", "--max-pixels", "401408"
    )
    # at most 401,408 pixels (512 tokens of 28² pixels): a 2048² image becomes 616×616,
    # 22×22 tokens
    assert any("484 tokens of each sample" in note for note in bounded["notes"])
    assert bounded["allocated_peak_bytes"] < large["allocated_peak_bytes"]


def test_a_frozen_image_side_costs_less_than_a_trained_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = (*QWEN_VL, "--images", "1", "--batch", "1", "--method", "full")
    frozen = estimate(capsys, *args, "--train-vision", "none")
    trained = estimate(capsys, *args, "--train-vision", "all")
    # the ViT and merger hold 676,550,144 parameters: trained, their gradients and two AdamW
    # states (fp32 under bf16 autocast) come on top, 12 bytes each at least
    assert trained["trainable_params"] - frozen["trainable_params"] == 676_550_144
    gap = trained["allocated_peak_bytes"] - frozen["allocated_peak_bytes"]
    assert gap >= 12 * 676_550_144


def test_seq_that_already_counts_the_images_is_not_lengthened(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = estimate(capsys, *QWEN_VL, "--images", "1", "--seq-includes-images")
    assert not any(note.startswith("sequence:") for note in report["notes"])
    assert report["setup"]["values"]["seq"] == 1024


def test_the_settings_table_shows_the_images(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--offline", *QWEN_VL, "--images", "3", "--train-vision", "none"])
    out = capsys.readouterr().out
    assert code == 0
    assert "3 × 448x448" in out and "vision trains: none" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "Qwen/Qwen2.5-7B", "--images", "2"), "text-only model"),
        ((*QWEN_VL, "--image-size", "wide"), "WIDTHxHEIGHT"),
        ((*QWEN_VL, "--images", "-1"), "0 to 4096"),
        ((*QWEN_VL, "--images", "0", "--image-size", "448x448"), "--images 0"),
        ((*QWEN_VL, "--image-size", "20000x10"), "200 times"),
        ((*QWEN_VL, "--min-pixels", "9000", "--max-pixels", "100"), "above max_pixels"),
        ((*QWEN_VL, "--max-pixels", "many"), "number of pixels"),
    ],
)
def test_image_flags_that_would_say_nothing_are_refused(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    assert message in refused(capsys, *args)

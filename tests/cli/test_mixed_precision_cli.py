"""`llmmem estimate --mixed-precision`: whether the trainer's bf16=True hands the logits back in
fp32 (accelerate's convert_outputs_to_fp32), for the preference objectives only."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmmem.cli import main

DPO = [
    "estimate",
    "--model",
    "Qwen/Qwen2.5-0.5B",
    "--objective",
    "dpo",
    "--precision",
    "bf16-true",
    "--batch",
    "4",
    "--seq",
    "512",
    "--offline",
    "--format",
    "json",
]


def _peak(capsys: pytest.CaptureFixture[str], *extra: str) -> int:
    assert main([*DPO, *extra]) == 0
    return int(json.loads(capsys.readouterr().out)["allocated_peak_bytes"])


def test_bf16_weights_default_to_trls_bf16_true(
    capsys: pytest.CaptureFixture[str], trl_release: Callable[[str], Path]
) -> None:
    trl_release("0.29.1")  # the DPO step with the full logits (1.15 on: TRL's fused LM head)
    default = _peak(capsys)
    on = _peak(capsys, "--mixed-precision")
    off = _peak(capsys, "--no-mixed-precision")
    assert default == on
    # the policy's and the reference's 4 × 2 × 512 × 151936 logits and shifted copies, 2 bytes
    # more each: more than 2 GiB between the two
    assert on - off > 2 * 2**30


def test_sft_refuses_the_flag_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a for a in DPO if a not in ("--objective", "dpo")]
    assert main([*argv, "--no-mixed-precision"]) != 0
    assert "--mixed-precision needs a preference objective" in capsys.readouterr().err

"""Fixtures every test folder may use."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from llmmem.cli import main

LLAMA_8B_LORA = (
    "--model", "meta-llama/Llama-3.1-8B", "--method", "lora", "--batch", "4", "--seq", "4096",
)  # fmt: skip


@pytest.fixture
def estimate_json(capsys: pytest.CaptureFixture[str]) -> Callable[..., dict[str, Any]]:
    """`llmmem estimate --offline --format json ARGS`, run in process: its JSON report."""

    def run(*args: str) -> dict[str, Any]:
        code = main(["estimate", "--offline", "--format", "json", *args])
        out = capsys.readouterr().out
        assert code == 0, out
        report: dict[str, Any] = json.loads(out)
        return report

    return run


@pytest.fixture
def lora_8b_json(estimate_json: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """The JSON estimate of Llama-3.1-8B LoRA at 4 × 4096 on an A100-80GB, with ARGS added."""

    def run(*args: str) -> dict[str, Any]:
        return estimate_json(*LLAMA_8B_LORA, "--gpu", "A100-80GB", *args)

    return run

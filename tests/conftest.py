"""Fixtures every test folder may use."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
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


@pytest.fixture
def trl_release(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], Path]:
    """`trl_release("0.29.1")`: the files the test reads run with that TRL release. The tests'
    own environment has TRL (the release its trainers are tested at), and llmmem reads the
    release a file runs with from there: a test about another release says which, with an
    environment holding that release's metadata named by LLMMEM_RUN_ENV (the first source
    llmmem reads; the other libraries are then the workspace's and the tests' pins)."""

    def use(version: str) -> Path:
        environment = tmp_path_factory.mktemp(f"trl-{version}")
        info = environment / "lib" / "python3.11" / "site-packages" / f"trl-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {version}\n")
        (environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
        monkeypatch.setenv("LLMMEM_RUN_ENV", str(environment))
        return environment

    return use

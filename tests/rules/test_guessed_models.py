"""A model sized from its name gets no verdict: no "fits" (LLM002) and no "will not fit" (LLM001)
from one guessed shape, but LLM017, a warning with the range of every shape the name allows; the
same in `llmmem explain` (text and JSON) and in the editor's hover line. A model whose config was
read keeps its verdict."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmmem.check import check_text
from llmmem.report.markdown import verdict_line

SCRIPT = """\
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("{model}")
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size={batch},
    gradient_checkpointing=True,
    bf16=True,
)
Trainer(model=model, args=args).train()
"""

# a fine-tune no catalog, cache or hub has: only "Qwen2.5-Coder", "3B" in its name
GUESSED = "acme/Qwen2.5-Coder-3B-sft"


@pytest.fixture(autouse=True)
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LLMMEM_CACHE_DIR", str(tmp_path / "llmmem-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write(tmp_path: Path, model: str, batch: int = 1) -> Path:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(model=model, batch=batch), encoding="utf-8")
    return script


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def lint(script: Path, gpu: str) -> tuple[int, list[dict[str, Any]]]:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("llmmem-lint")),
            "--format",
            "json",
            "--gpu",
            gpu,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)
    return done.returncode, findings


def total_gib(script: Path) -> float:
    done = run("explain", "--format", "json", str(script))
    assert done.returncode == 0, done.stderr
    return float(json.loads(done.stdout)["budget"]["device_total_bytes"]) / 2**30


def test_a_guess_that_would_be_tight_is_no_fits_but_a_range(tmp_path: Path) -> None:
    script = write(tmp_path, GUESSED, batch=2)
    # a GPU a little larger than the guessed shape's total: "fits with little room" (LLM002)
    # were the guess the model
    gpu = f"{math.ceil(total_gib(script) * 1.04)}GB"
    code, findings = lint(script, gpu)
    codes = [finding["code"] for finding in findings]
    assert "LLM002" not in codes and "LLM001" not in codes, codes
    (guessed,) = [finding for finding in findings if finding["code"] == "LLM017"]
    assert guessed["severity"] == "warning"
    assert code == 1  # a warning fails the run by default
    message = guessed["message"]
    assert message.startswith(f"{GUESSED} is sized from its name only")
    # the bundled shape whose name is most like it: Qwen2.5-Coder-3B (Qwen2.5-3B's shapes)
    assert "the Qwen2/Qwen2.5 family: Qwen/Qwen2.5-Coder-3B" in message
    assert "whether it fits" in message and "is unknown" in message
    assert "model_config=" in message
    # on the model id, where the name is written
    assert guessed["range"]["start_line"] == 2


def test_a_guess_over_the_gpu_is_no_will_not_fit_either(tmp_path: Path) -> None:
    script = write(tmp_path, "acme/DeepSeek-R1-Distill-Qwen-7B-GRPO", batch=8)
    _, findings = lint(script, "RTX-4090")
    codes = [finding["code"] for finding in findings]
    assert "LLM001" not in codes and "LLM002" not in codes, codes
    (guessed,) = [finding for finding in findings if finding["code"] == "LLM017"]
    assert "Qwen2.5 (an R1 distill) family: Qwen/Qwen2.5-7B" in guessed["message"]
    assert "whichever shape it has" in guessed["message"]


def test_a_name_of_no_family_spans_every_family_of_its_size(tmp_path: Path) -> None:
    script = write(tmp_path, "acme/house-model-7B")
    _, findings = lint(script, "A100-80GB")
    (guessed,) = [finding for finding in findings if finding["code"] == "LLM017"]
    assert "a name that names no family" in guessed["message"]
    assert "and " in guessed["message"] and " more" in guessed["message"]


def test_explain_says_fit_unknown_with_the_range(tmp_path: Path) -> None:
    script = write(tmp_path, GUESSED, batch=2)
    done = run("explain", "--gpu", "A100-80GB", str(script))
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "on A100-80GB: fit unknown: the model is sized from its name only" in text
    assert "(the Qwen2/Qwen2.5 family: Qwen/Qwen2.5-Coder-3B)" in text
    assert "A100-80GB: fits" not in text and "headroom" not in text

    done = run("explain", "--format", "json", "--gpu", "A100-80GB", str(script))
    report = json.loads(done.stdout)
    assert report["budget"]["model"]["is_guess"] is True
    assert report["budget"]["fits"] is None and report["budget"]["verdict"] is None
    assert [f["code"] for f in report["findings"] if f["code"] in ("LLM001", "LLM002")] == []
    assert any(f["code"] == "LLM017" for f in report["findings"])


def test_the_hover_verdict_line_is_fit_unknown(tmp_path: Path) -> None:
    script = write(tmp_path, GUESSED)
    checked = check_text(script, script.read_text(), gpu="A100-80GB", hub=False)
    line = verdict_line(checked.analysis)
    assert "**fit unknown: the model is sized from its name only" in line
    assert "· fits" not in line


def test_a_model_whose_config_is_read_keeps_its_verdict(tmp_path: Path) -> None:
    script = write(tmp_path, "Qwen/Qwen2.5-3B")
    done = run("explain", "--gpu", "A100-80GB", str(script))
    assert "on A100-80GB: fits" in " ".join(done.stdout.split())
    _, findings = lint(script, "A100-80GB")
    assert "LLM017" not in [finding["code"] for finding in findings]
    checked = check_text(script, script.read_text(), gpu="A100-80GB", hub=False)
    assert "· fits" in verdict_line(checked.analysis)


def test_estimate_of_a_guessed_model_gives_no_verdict() -> None:
    done = run("estimate", "--model", "acme/mystery-7B", "--gpu", "A100-80GB")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "on A100-80GB: fit unknown" in text
    assert "does not fit" not in text and "A100-80GB: fits" not in text
    known = " ".join(run("estimate", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "A100-80GB")
                     .stdout.split())  # fmt: skip
    assert "A100-80GB: does not fit" in known

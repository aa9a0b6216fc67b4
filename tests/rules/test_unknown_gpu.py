"""LLM014: a GPU named in the file that no GPU is fails the check instead of turning it off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qlora_sft.py"


def lint(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmmem", "lint", str(path), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_gpu_typo_in_a_pragma_fails_lint_with_the_close_matches(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("# llmmem: gpu=A100-80B\n" + EXAMPLE.read_text())
    run = lint(script, "--format", "json")
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    found = [f for f in json.loads(run.stdout) if f["code"] == "LLM014"]
    assert len(found) == 1
    assert found[0]["severity"] == "error"
    assert "A100-80GB" in found[0]["message"]
    assert found[0]["range"]["start_line"] == 0


def test_the_close_match_fix_makes_the_check_run(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("# llmmem: gpu=A100-80B\n" + EXAMPLE.read_text())
    explained = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "fix: Use gpu=A100-80GB" in explained.stdout
    script.write_text("# llmmem: gpu=A100-80GB\n" + EXAMPLE.read_text())
    run = lint(script)
    assert "LLM014" not in run.stdout
    assert run.returncode == 0  # the QLoRA example fits an A100-80GB: only info findings


def test_a_known_gpu_or_a_flag_gets_no_finding(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("# llmmem: gpu=A100-80B\n" + EXAMPLE.read_text())
    assert "LLM014" not in lint(script, "--gpu", "H100").stdout  # the flag wins
    script.write_text("# llmmem: gpu=80GB\n" + EXAMPLE.read_text())
    assert "LLM014" not in lint(script).stdout  # a capacity is a GPU

"""A training file is never met with silence: a script that starts training through
subprocess (`['llamafactory-cli', 'train', path]`) with a model llmmem cannot read gets one finding
on the line of the command, naming what is missing and offering the pragma; a script that only
prints such a command in a usage text gets none."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from llmmem.check import check_text
from llmmem.extract import ProjectSettings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "longtail"
LINT = Path(sys.executable).parent / "llmmem-lint"


def checked(tmp_path: Path, name: str) -> Any:
    (tmp_path / ".git").mkdir(exist_ok=True)
    target = tmp_path / name
    shutil.copy(FIXTURES / name, target)
    return check_text(
        target, target.read_text(), gpu="A100-80GB", hub=False, settings=ProjectSettings()
    )


def test_a_command_run_through_subprocess_is_answered_on_its_line(tmp_path: Path) -> None:
    result = checked(tmp_path, "sweep_llamafactory.py")
    assert [finding.code for finding in result.findings] == ["LLM010"]
    finding = result.findings[0]
    assert finding.range.start_line + 1 == 26  # command = ["llamafactory-cli", "train", ...]
    assert "`llamafactory-cli train config_path` trains" in finding.message
    assert "# llmmem: model=org/name" in finding.message
    assert finding.fixes, "the pragma is offered as a fix"


def test_a_usage_text_is_not_a_launch(tmp_path: Path) -> None:
    result = checked(tmp_path, "usage_text_only.py")
    assert result.findings == []


def test_the_installed_linter_says_it_on_the_line(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    shutil.copy(FIXTURES / "sweep_llamafactory.py", tmp_path / "sweep.py")
    proc = subprocess.run(
        [str(LINT), "--gpu", "A100-80GB", "sweep.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert "sweep.py:26:" in proc.stdout and "LLM010" in proc.stdout, proc.stdout + proc.stderr

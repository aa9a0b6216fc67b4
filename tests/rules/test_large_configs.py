"""A config too large for its fixes to be checked gets its findings quickly, without fixes,
and says what would fit; a config of the usual size keeps its fixes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

AXOLOTL = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "axolotl_qlora.yml"


def lint(path: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "llmmem", "lint", str(path), "--format", "full"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, time.monotonic() - started


def test_a_large_config_gets_its_findings_without_fixes_in_seconds(tmp_path: Path) -> None:
    config = tmp_path / "big.yml"
    # 200 kB: the usual axolotl keys, then thousands more that nothing reads
    padding = "".join(f"extra_key_{i}: value_{i}\n" for i in range(8000))
    config.write_text("# llmmem: gpu=T4\n" + AXOLOTL.read_text() + padding)
    run, seconds = lint(config)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "LLM001" in run.stdout
    assert "fixes are not written in a config over 64 kB" in run.stdout
    assert "fix:" not in run.stdout
    # about 0.5 s here; each fix read the file again before and took about 8 s
    assert seconds < 5, seconds


def test_the_same_config_at_its_usual_size_keeps_its_fixes(tmp_path: Path) -> None:
    config = tmp_path / "qlora.yml"
    config.write_text("# llmmem: gpu=T4\n" + AXOLOTL.read_text())
    run, _ = lint(config)
    assert "LLM001" in run.stdout
    assert "fix:" in run.stdout

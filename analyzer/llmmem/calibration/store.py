"""The local calibration store: the rows real runs recorded, read back for the band.

`.llmmem/calibration.jsonl` (the nearest above a file, up to the workspace root; or the file
`LLMMEM_CALIBRATION` names) holds one JSON row per recorded run (`llmmem calibrate add`,
`LlmmemCallback`, `llmmem.watch`). A budget of the same setup (GPU, framework class, method,
sharding: `setup_key`) carries its rows' measured/predicted ratios (`LocalEvidence`), which
narrow its band. This module sits below the budget: it reads files and imports nothing of
llmmem's, so the accounting core can read it without importing a command.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CALIBRATION_DIR = ".llmmem"
CALIBRATION_NAME = "calibration.jsonl"
CALIBRATION_VARIABLE = "LLMMEM_CALIBRATION"
MAX_LEVELS = 12


@dataclass(frozen=True, slots=True)
class LocalEvidence:
    """The device-total ratios of the local runs of one setup, and the file they came from."""

    ratios: tuple[float, ...]
    path: str

    @property
    def runs(self) -> int:
        return len(self.ratios)


def framework_class(plan_framework: str | None, setup_framework: str) -> str:
    """torchtune and LitGPT run their own model code; every other stack runs transformers
    models (HF Trainer, TRL, axolotl, LLaMA-Factory, unsloth, plain loops): `hf`."""
    if plan_framework in ("torchtune", "litgpt"):
        return plan_framework
    return "litgpt" if setup_framework == "litgpt" else "hf"


def setup_key(gpu_name: str, framework: str, band_class: str) -> str:
    """`A100-80GB/hf/qlora/1 GPU`: the GPU, the framework class, then the band class's method
    and sharding (its framework and metric left out)."""
    parts = band_class.split("/")
    method, sharding = (parts[1], parts[3]) if len(parts) == 4 else ("?", "?")
    return f"{gpu_name}/{framework}/{method}/{sharding}"


def _folders(start: Path) -> list[Path]:
    folder = start if start.is_dir() else start.parent
    out = []
    for _ in range(MAX_LEVELS):
        out.append(folder)
        if (folder / ".git").exists() or folder.parent == folder:
            break
        folder = folder.parent
    return out


def find_calibration_file(start: Path) -> Path | None:
    """`LLMMEM_CALIBRATION`, else the nearest `.llmmem/calibration.jsonl` at or above `start`
    (up to the workspace root, the first folder holding `.git`)."""
    named = os.environ.get(CALIBRATION_VARIABLE)
    if named:
        return Path(named).expanduser()
    for folder in _folders(start.absolute()):
        candidate = folder / CALIBRATION_DIR / CALIBRATION_NAME
        if candidate.is_file():
            return candidate
    return None


_ROWS: dict[str, tuple[tuple[int, int], list[dict[str, Any]]]] = {}


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The file's rows (lines that are not JSON objects are skipped); cached by mtime."""
    try:
        st = path.stat()
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode):
        return []  # a FIFO or a device would block the read
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _ROWS.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    rows = []
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    rows.append(row)
    except OSError:
        rows = []
    _ROWS[str(path)] = (stamp, rows)
    return rows


def local_evidence(start: Path, key: str) -> LocalEvidence | None:
    """The local rows of setup `key` (see setup_key) found from `start`, or None."""
    path = find_calibration_file(start)
    if path is None:
        return None
    ratios = []
    for row in read_rows(path):
        ratio = row.get("device_ratio")
        if row.get("key") == key and isinstance(ratio, (int, float)) and ratio > 0:
            ratios.append(float(ratio))
    return LocalEvidence(tuple(ratios), str(path)) if ratios else None


def with_local_evidence(budget: Any, start: Path, plan_framework: str | None = None) -> Any:
    """`budget` (a Budget with a GPU) carrying the local rows of its setup, so its band
    narrows; the same budget where there are none."""
    if budget is None or budget.gpu is None or not budget.band_class:
        return budget
    framework = framework_class(plan_framework, budget.band_class.split("/")[0])
    try:
        evidence = local_evidence(start, setup_key(budget.gpu.name, framework, budget.band_class))
    except OSError:
        return budget
    if evidence is None:
        return budget
    from dataclasses import replace

    return replace(budget, local_evidence=evidence)

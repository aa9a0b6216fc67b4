"""`workspace/diagnostic`: the findings of every training file of the workspace's folders, open
or not, walked as `llmmem-lint DIR` walks a folder.

A file the editor has open is reported from its current analysis; a closed one is read from
disk and analysed once per state: its result id is a digest of what the analysis read (the
file's size and modification time, those of the configs its plan read and of the
`pyproject.toml` files above it, and the settings), so a client that sends it back gets
"unchanged" until one of those changes. Files that hold no training configuration (no model and
no trainer found, or not readable as a config) report nothing; notebooks are reported cell by
cell while open, not from disk.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types

MAX_WORKSPACE_FILES = 1000  # a folder with more is reported up to this many files


@dataclass
class DiskReport:
    key: str  # what the analysis read, as stat results and settings
    result_id: str
    items: list[types.Diagnostic]
    dependencies: frozenset[str]


def _stat_key(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return f"{path}:-"
    return f"{path}:{info.st_size}:{info.st_mtime_ns}"


def _project_files(path: Path) -> list[str]:
    """The pyproject.toml files whose `[tool.llmmem]` may apply to `path`."""
    out = []
    for directory in path.parents:
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            out.append(str(candidate))
        if (directory / ".git").exists():
            break
    return out


def state_key(path: Path, dependencies: frozenset[str], settings: str) -> str:
    parts = [_stat_key(str(path)), settings]
    parts += [_stat_key(dep) for dep in sorted(dependencies) if not dep.startswith("<")]
    parts += [_stat_key(project) for project in _project_files(path)]
    return "\n".join(parts)


def digest(key: str) -> str:
    return hashlib.sha1(key.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]


def _walk(root: Path) -> list[Path]:
    """The files `llmmem-lint ROOT` reads (`llmmem.lint_command.iter_files`: the linted
    suffixes, no hidden, `node_modules` or `__pycache__` folder on the way), sorted; hidden
    folders are not entered at all (a virtual environment is not read on every pull)."""
    from llmmem.lint_command import LINTED_SUFFIXES

    def skipped(name: str) -> bool:
        return name.startswith(".") or name in ("node_modules", "__pycache__")

    out: list[Path] = []
    if any(skipped(part) for part in root.parts):
        return out  # iter_files leaves out every file under such a folder
    for directory, folders, files in os.walk(root):
        folders[:] = [name for name in folders if not skipped(name)]
        for name in files:
            path = Path(directory) / name
            if path.suffix in LINTED_SUFFIXES and not skipped(name) and path.is_file():
                out.append(path)
    return sorted(out)


def training_files(roots: list[Path]) -> list[Path]:
    """The files `llmmem-lint` would lint under `roots` (notebooks left out), at most
    `MAX_WORKSPACE_FILES`."""
    from llmmem.lint_command import MAX_FILE_BYTES

    out: list[Path] = []
    seen: set[Path] = set()
    for root in roots:
        for path in _walk(root):
            if path.suffix == ".ipynb" or path in seen:
                continue
            try:
                if path.stat().st_size > MAX_FILE_BYTES:
                    continue
            except OSError:
                continue
            seen.add(path)
            out.append(path)
            if len(out) >= MAX_WORKSPACE_FILES:
                return out
    return out


def holds_training(checked: Any) -> bool:
    """Whether a file's analysis found something to report on: a model or a trainer."""
    plan = checked.analysis.plan
    if plan.unreadable:
        return False
    return bool(
        checked.findings
        or plan.model_id is not None
        or plan.trainer_range is not None
        or plan.model_range is not None
    )

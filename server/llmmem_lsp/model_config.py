"""The quick fix for a model sized by a guess from its name: a `# llmmem: model_config=...`
comment naming a model's `config.json` found beside the file.

A model id that is no local path, is not in the Hugging Face cache and cannot be read from the
hub is sized from the size its name states, in Llama shapes. The exact shapes are in the
model's `config.json`; where one lies in the file's folder or up to two folders below it (a
checkpoint saved with `save_pretrained`, a downloaded snapshot), the fix names it in a pragma,
relative to the file as the analyzer reads it. A `config.json` that is no model's (no
`model_type` or `architectures`) is not offered.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from llmmem_lsp.disk_documents import read_workspace_bytes

CONFIG_NAME = "config.json"
MAX_DEPTH = 2  # the file's folder, its folders and theirs
MAX_ENTRIES = 2_000  # directory entries looked at, at most: a request must stay cheap
MAX_CONFIG_BYTES = 1 << 20
MAX_FIXES = 3
SKIPPED_FOLDERS = frozenset({"node_modules", "__pycache__", "site-packages", "venv", "wandb"})
# a comment-less format cannot carry the pragma
NO_COMMENTS = frozenset({".json", ".ipynb"})

_SHEBANG_OR_CODING = re.compile(r"^#!|^[ \t\f]*#.*?coding[:=]")


def is_model_config(path: Path) -> bool:
    """Whether `path` is a model's `config.json` (what `save_pretrained` writes)."""
    try:
        config = json.loads(read_workspace_bytes(path, MAX_CONFIG_BYTES))
    except (OSError, ValueError):  # a FIFO, a device, too large, not JSON or not UTF-8
        return False
    return isinstance(config, dict) and ("model_type" in config or "architectures" in config)


def _config_files(folder: Path) -> list[Path]:
    """`config.json` files in `folder` and up to MAX_DEPTH folders below it, hidden folders
    and environments left out, at most MAX_ENTRIES entries read."""
    found: list[Path] = []
    seen = 0
    level = [folder]
    for depth in range(MAX_DEPTH + 1):
        below: list[Path] = []
        for current in level:
            try:
                with os.scandir(current) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > MAX_ENTRIES:
                            return found
                        name = entry.name
                        try:
                            if entry.is_dir(follow_symlinks=False):
                                if (
                                    depth < MAX_DEPTH
                                    and not name.startswith(".")
                                    and name not in SKIPPED_FOLDERS
                                ):
                                    below.append(Path(entry.path))
                            elif name == CONFIG_NAME and entry.is_file():
                                found.append(Path(entry.path))
                        except OSError:
                            continue
            except OSError:
                continue
        level = sorted(below)
    return found


def _written(path: Path, folder: Path) -> str:
    """`path` as the pragma writes it: relative to the file's folder, with forward slashes,
    quoted where it holds a blank."""
    relative = path.relative_to(folder).as_posix()
    return f'"{relative}"' if any(c.isspace() for c in relative) else relative


def config_candidates(document: Path, model_id: str) -> list[str]:
    """The model configs near `document`, as the pragma would write them; the folder named
    like the model first (`SuperLlama-7B/config.json` for `acme/SuperLlama-7B`), then the
    nearest."""
    if document.suffix.lower() in NO_COMMENTS:
        return []
    folder = document.parent
    name = model_id.rstrip("/").rsplit("/", 1)[-1].lower()

    def rank(path: Path) -> tuple[int, int, str]:
        parent = path.parent.name.lower()
        like = 0 if parent == name else 1 if name and (name in parent or parent in name) else 2
        return like, len(path.relative_to(folder).parts), path.as_posix()

    configs = sorted(_config_files(folder), key=rank)
    return [_written(p, folder) for p in configs if is_model_config(p)][:MAX_FIXES]


def pragma_line(lines: list[str]) -> int:
    """Where a new pragma line goes: at the top, below a `#!` line and an encoding
    declaration (which must stay in the first two lines)."""
    line = 0
    while line < min(2, len(lines)) and _SHEBANG_OR_CODING.match(lines[line]):
        line += 1
    return line


def fix_title(written: str) -> str:
    return f"Size the model from {written.strip(chr(34))} (# llmmem: model_config={written})"


def pragma_text(written: str) -> str:
    return f"# llmmem: model_config={written}\n"

"""What a Hugging Face repository id looks like, and where the Hugging Face cache and home are.

Kept apart from `hub.py` (the HTTP client and llmmem's disk copy of lookups) because model
resolution asks these on every call, also for bundled models that never reach the hub; this
module imports nothing beyond `os`, `re` and `pathlib`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# what the hub accepts: word characters, '-' and '.', starting and ending with a word character
_REPO_ID = re.compile(r"^(\w(?:[\w.-]{0,94}\w)?/)?\w(?:[\w.-]{0,94}\w)?$")


def is_hub_repo_id(ref: str) -> bool:
    """`org/name` or a legacy top-level `name`, as the hub spells repository ids."""
    return bool(_REPO_ID.match(ref)) and "--" not in ref and ".." not in ref


def hf_home() -> Path:
    """`$HF_HOME`, else `$XDG_CACHE_HOME/huggingface` or `~/.cache/huggingface`."""
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser()
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "huggingface"


def hf_hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.path.expandvars(os.environ[name])).expanduser()
    return hf_home() / "hub"

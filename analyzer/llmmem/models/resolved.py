"""A model's config and where it was found, before it is read into a ModelSpec.

Shared by the steps of resolution (`resolve.py`, `name_guess.py`, `model_paths.py`), which each
hand one back; kept apart so that none of them imports another to name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmmem.models.spec import ModelSource

PRAGMA_HINT = "add '# llmmem: model_config=path/to/config.json' or pass a local path"


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedConfig:
    """A model's config and where it was found, before it is read into a ModelSpec."""

    model_id: str
    config: dict[str, Any]
    source: ModelSource
    source_detail: str
    checkpoint_bytes_by_dtype: dict[str, int] | None = None
    notes: list[str] = field(default_factory=list)

"""The bundled catalog: the published `config.json` of popular hub models, so that the common
case works with no network and no Hugging Face cache.

The data lives in `catalog/*.json` beside this module, one file per family, each mapping a hub id
to `{"config": {...}, "params": <int or null>, "note": "...", "aliases": [...]}`. `config` holds
the architecture keys of the published config.json under their published names; `params` is the
model's published parameter count (of the class `architectures` names, tied weights counted
once) or null where no exact figure is known.

Lookups match, case-insensitively, the full hub id, then an alias ("gpt2",
"bert-large-uncased", "meta-llama/Meta-Llama-3.1-8B"), then, for a name without an org, the
bare repository name ("Llama-3.1-8B") when exactly one entry has it.

This module imports neither torch nor transformers, and reads the JSON files only on first use.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["CatalogEntry", "CatalogError", "catalog_entry", "catalog_ids", "close_catalog_ids"]


class CatalogError(RuntimeError):
    """The bundled catalog data is malformed (a packaging or editing mistake, never user input)."""


@dataclass(frozen=True)
class CatalogEntry:
    model_id: str  # the canonical hub id, e.g. "meta-llama/Llama-3.1-8B"
    config: dict[str, Any]  # the published config.json keys (a fresh copy per lookup)
    params: int | None  # the published exact parameter count, or None where unknown
    note: str = ""
    aliases: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class _Index:
    entries: dict[str, dict[str, Any]]  # canonical id -> raw entry
    by_name: dict[str, str]  # lower-cased id or alias -> canonical id
    by_bare: dict[str, tuple[str, ...]]  # lower-cased name after the org -> canonical ids

    @classmethod
    def from_raw(cls, raw: dict[str, dict[str, Any]], *, origin: str = "catalog") -> _Index:
        entries: dict[str, dict[str, Any]] = {}
        by_name: dict[str, str] = {}
        by_bare: dict[str, list[str]] = {}

        def claim(name: str, model_id: str) -> None:
            key = name.strip().lower()
            owner = by_name.get(key)
            if owner is not None and owner != model_id:
                raise CatalogError(f"{origin}: {name!r} names both {owner!r} and {model_id!r}")
            by_name[key] = model_id
            bare = key.rsplit("/", 1)[-1]
            ids = by_bare.setdefault(bare, [])
            if model_id not in ids:
                ids.append(model_id)

        for model_id, entry in raw.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
                raise CatalogError(f"{origin}: entry {model_id!r} has no 'config' object")
            params = entry.get("params")
            if params is not None and (not isinstance(params, int) or params <= 0):
                raise CatalogError(f"{origin}: entry {model_id!r} has a bad 'params': {params!r}")
            entries[model_id] = entry
            claim(model_id, model_id)
            for alias in entry.get("aliases") or ():
                claim(alias, model_id)
        return cls(entries, by_name, {k: tuple(v) for k, v in by_bare.items()})

    def resolve(self, name: str) -> str | None:
        key = name.strip().strip("/").lower()
        if not key:
            return None
        hit = self.by_name.get(key)
        if hit is not None:
            return hit
        if "/" in key:
            # "someorg/Llama-3.1-8B" is some other repo (a fine-tune, a mirror): never guess it
            return None
        ids = self.by_bare.get(key, ())
        return ids[0] if len(ids) == 1 else None

    def entry(self, name: str) -> CatalogEntry | None:
        model_id = self.resolve(name)
        if model_id is None:
            return None
        raw = self.entries[model_id]
        return CatalogEntry(
            model_id=model_id,
            config=copy.deepcopy(raw["config"]),
            params=raw.get("params"),
            note=raw.get("note", ""),
            aliases=tuple(raw.get("aliases") or ()),
        )

    def close(self, name: str, n: int) -> list[str]:
        import difflib

        key = name.strip().strip("/").lower()
        if not key or n <= 0:
            return []
        # compare like with like: a bare name against bare names, an org/name against full ids
        pool: dict[str, tuple[str, ...]]
        if "/" in key:
            pool = {k: (v,) for k, v in self.by_name.items() if "/" in k}
        else:
            pool = dict(self.by_bare)
        found: list[str] = []
        for match in difflib.get_close_matches(key, list(pool), n=4 * n, cutoff=0.6):
            for model_id in pool[match]:
                if model_id not in found:
                    found.append(model_id)
        return found[:n]


def _read_bundled() -> _Index:
    raw: dict[str, dict[str, Any]] = {}
    seen_in: dict[str, str] = {}
    # the package data beside this module (a plain path: importlib.resources alone would cost
    # the CLI more time to import than reading the whole catalog takes)
    folder = Path(__file__).with_name("catalog")
    try:
        files = sorted(item for item in folder.iterdir() if item.name.endswith(".json"))
    except OSError:
        files = []
    if not files:
        raise CatalogError("the bundled model catalog is missing (no catalog/*.json)")
    for item in files:
        try:
            data = json.loads(item.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CatalogError(f"catalog/{item.name}: cannot be read: {exc}") from exc
        if not isinstance(data, dict):
            raise CatalogError(f"catalog/{item.name}: the top level is not an object")
        for model_id, entry in data.items():
            if model_id in seen_in:
                raise CatalogError(
                    f"{model_id!r} is in both catalog/{seen_in[model_id]} and catalog/{item.name}"
                )
            seen_in[model_id] = item.name
            raw[model_id] = entry
    return _Index.from_raw(raw, origin="bundled catalog")


@lru_cache(maxsize=1)
def _index() -> _Index:
    return _read_bundled()


def catalog_entry(model_id: str) -> CatalogEntry | None:
    """The bundled entry for a hub id, alias or unambiguous bare name; None when not bundled."""
    return _index().entry(model_id)


def catalog_ids() -> list[str]:
    """Every canonical hub id in the catalog, sorted case-insensitively."""
    return sorted(_index().entries, key=str.lower)


def close_catalog_ids(name: str, n: int = 5) -> list[str]:
    """Up to `n` catalog ids that look like `name`, best first, for "did you mean" messages."""
    return _index().close(name, n)

"""From a model reference, as written in a script or config, to a ModelSpec.

`resolve_model(ref)` tries, in this order, and stops at the first that gives a config:

1. a local directory holding `config.json` (or, for a PEFT adapter folder, `adapter_config.json`
   naming its base model), or a path to a config file (also through the `local_model_paths`
   setting, id -> path);
2. for a path that is not on this machine: the hub id its Hugging Face cache layout names
   (`.../models--ORG--NAME/snapshots/<hash>`), resolved from here on as that id;
3. the Hugging Face cache on this machine (no network);
4. the catalog bundled with llmmem (verified copies of published configs: no network needed);
5. the hub, under one overall timeout, with an on-disk copy of earlier lookups (`hub.py`);
6. the bundled model whose name ends the reference (`models/Qwen2.5-7B-Instruct`, a re-upload
   such as `unsloth/Qwen2.5-7B-Instruct-bnb-4bit`), said in the spec's notes;
7. a guess from the family and size in the name ("Qwen2.5" and "7B"): the shapes of the
   family's bundled model of about that size, else of a Llama-family one (`name_guess.py`).

It raises `ModelResolutionError`, and nothing else, with a one-line message that says what was
tried and what to do, so it is safe to call from an editor on every change.

`hub.py` (the HTTP client and the disk copy of lookups) is imported only by the steps that use it,
so a bundled model resolves without loading it.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from llmmem.models.architectures import spec_from_config
from llmmem.models.hub_names import hf_hub_cache_dir, is_hub_repo_id
from llmmem.models.model_paths import (
    BNB_4BIT_QUANTIZATION,
    bundled_model_named_by,
    hub_id_of_cache_path,
)
from llmmem.models.name_guess import (  # noqa: F401 - the guess's names, as they were here
    GUESS_SIZE_TOLERANCE,
    LLAMA_SHAPES,
    LlamaShape,
    NameSize,
    guess_config_from_name,
    llama_config,
    nearest_llama_shape,
    size_from_name,
)
from llmmem.models.resolved import PRAGMA_HINT, ResolvedConfig
from llmmem.models.spec import ModelSource, ModelSpec, ModelSpecError

CONFIG_FILE = "config.json"
ADAPTER_CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_REDIRECTS = 3  # an adapter's base, a cache path's hub id: followed this many times at most


class ModelResolutionError(ValueError):
    """No config could be found for a model reference; the message is one actionable line."""

    def __init__(
        self,
        message: str,
        *,
        ref: str = "",
        close_matches: list[str] | None = None,
        hub_not_asked: bool = False,
    ) -> None:
        super().__init__(message)
        self.ref = ref
        self.close_matches = close_matches or []
        self.hub_not_asked = hub_not_asked  # a hub id the hub was not asked about (hub=False)


def resolve_model(
    ref: str,
    *,
    hub: bool = True,
    hub_timeout_s: float = 3.0,
    local_model_paths: dict[str, str] | None = None,
    cache_dir: Path | None = None,
    base_dir: Path | None = None,
) -> ModelSpec:
    """The ModelSpec of `ref` (a hub id, a local directory or a config.json path).

    `hub=False` keeps the network out (earlier hub lookups kept on disk are still used).
    `cache_dir` is where llmmem keeps hub lookups (default `$LLMMEM_CACHE_DIR` or
    `~/.cache/llmmem`); `base_dir` is where relative paths are looked up first (the directory of
    the file that names the model). Raises ModelResolutionError only.
    """
    try:
        resolved = resolve_model_config(
            ref,
            hub=hub,
            hub_timeout_s=hub_timeout_s,
            local_model_paths=local_model_paths,
            cache_dir=cache_dir,
            base_dir=base_dir,
        )
        return spec_from_resolved(resolved)
    except ModelResolutionError:
        raise
    except Exception as error:  # an editor must never see anything but a resolution error
        raise ModelResolutionError(
            f"could not resolve model '{ref}': {type(error).__name__}: {error}", ref=ref
        ) from error


def spec_from_resolved(resolved: ResolvedConfig) -> ModelSpec:
    """Read a resolved config into a ModelSpec, carrying over the checkpoint bytes and notes."""
    try:
        spec = spec_from_config(
            resolved.config,
            model_id=resolved.model_id,
            source=resolved.source,
            source_detail=resolved.source_detail,
        )
    except ModelSpecError as error:
        where = f"{resolved.source.value}: {resolved.source_detail}"
        raise ModelResolutionError(
            f"model '{resolved.model_id}' ({where}): {error}",
            ref=resolved.model_id,
        ) from error
    update: dict[str, Any] = {"notes": [*spec.notes, *resolved.notes]}
    if resolved.checkpoint_bytes_by_dtype is not None:
        update["checkpoint_bytes_by_dtype"] = resolved.checkpoint_bytes_by_dtype
    return replace(spec, **update)


def resolve_model_config(
    ref: str,
    *,
    hub: bool = True,
    hub_timeout_s: float = 3.0,
    local_model_paths: dict[str, str] | None = None,
    cache_dir: Path | None = None,
    base_dir: Path | None = None,
) -> ResolvedConfig:
    """The config of `ref` and where it came from; same order and arguments as resolve_model."""
    try:
        return _resolve_config(
            ref,
            hub=hub,
            hub_timeout_s=hub_timeout_s,
            local_model_paths=local_model_paths or {},
            cache_dir=cache_dir,
            base_dir=base_dir,
        )
    except ModelResolutionError:
        raise
    except Exception as error:
        raise ModelResolutionError(
            f"could not resolve model '{ref}': {type(error).__name__}: {error}", ref=ref
        ) from error


def _resolve_config(
    ref: str,
    *,
    hub: bool,
    hub_timeout_s: float,
    local_model_paths: dict[str, str],
    cache_dir: Path | None,
    base_dir: Path | None,
    redirects: int = 0,
) -> ResolvedConfig:
    ref = normalize_ref(ref)
    if not ref:
        raise ModelResolutionError(f"empty model reference; {PRAGMA_HINT}", ref=ref)
    not_found: list[str] = []  # why each step gave nothing, for the final message
    fallback_notes: list[str] = []  # what a catalog entry or a guess should say it stands in for

    def resolve_instead(target: str, note: str) -> ResolvedConfig:
        """`target` resolved in the place of `ref` (an adapter's base, the hub id a cache path
        names, the bundled model a path's name names), with `note` saying why."""
        if redirects >= MAX_REDIRECTS:
            raise ModelResolutionError(
                f"'{ref}' leads on to '{target}' after {MAX_REDIRECTS} steps already; "
                f"{PRAGMA_HINT}",
                ref=ref,
            )
        try:
            resolved = _resolve_config(
                target,
                hub=hub,
                hub_timeout_s=hub_timeout_s,
                local_model_paths=local_model_paths,
                cache_dir=cache_dir,
                base_dir=base_dir,
                redirects=redirects + 1,
            )
        except ModelResolutionError as error:
            raise ModelResolutionError(
                f"{error} ('{target}' stands for '{ref}': {note})",
                ref=ref,
                close_matches=error.close_matches,
                hub_not_asked=error.hub_not_asked,
            ) from error
        return replace(resolved, notes=[note, *resolved.notes])

    if ref in local_model_paths:
        mapped = Path(local_model_paths[ref]).expanduser()
        if not mapped.exists():
            raise ModelResolutionError(
                f"local_model_paths maps '{ref}' to '{mapped}', which does not exist; "
                "fix the setting or remove the entry",
                ref=ref,
            )
        return _from_local_path(mapped, model_id=ref, setting_note=f"local_model_paths['{ref}']")

    local_path = _existing_local_path(ref, base_dir)
    if local_path is not None:
        base = _adapter_base(local_path)
        if base is not None:
            return resolve_instead(
                base,
                f"'{ref}' is a PEFT adapter folder: sized as its base model '{base}' "
                f"(base_model_name_or_path in its {ADAPTER_CONFIG_FILE})",
            )
        if local_path.is_dir() and not (local_path / CONFIG_FILE).is_file():
            named = bundled_model_named_by(ref)
            if named is not None:
                return _from_named_model(
                    named, f"'{ref}' has no {CONFIG_FILE} here; {named.how}", fallback_notes
                )
        return _from_local_path(local_path, model_id=ref)
    not_found.append("not a local path")

    cache_id = hub_id_of_cache_path(ref)
    if cache_id is not None and cache_id != ref:
        return resolve_instead(
            cache_id,
            f"'{ref}' is not on this machine; it is the Hugging Face cache's folder of "
            f"{cache_id}, looked up as that hub id",
        )

    if is_hub_repo_id(ref):
        try:
            cached = _from_hf_cache(ref)
        except UnreadableHfCache as error:  # warned; the rest of the order may still size it
            not_found.append(error.note)
            fallback_notes.append(error.note)
        else:
            if cached is not None:
                return cached
            not_found.append("not in the HF cache")

        # a bundled model is answered without the network: its config is a verified copy of
        # the published one, and an editor or a CLI run should never wait on the hub for it
        bundled = _from_catalog(ref, fallback_notes)
        if bundled is not None:
            return bundled

        from llmmem.models.hub import HubLookupError, hub_model_files

        try:
            files = hub_model_files(
                ref, allow_network=hub, timeout_s=hub_timeout_s, cache_dir=cache_dir
            )
        except HubLookupError as error:
            not_found.append(f"hub: {error.reason}")
            fallback_notes.append(f"not read from the hub: {error.reason}")
        else:
            notes = []
            if files.served_from_disk:
                notes.append(
                    f"config read from llmmem's copy of an earlier hub lookup ({files.config_url})"
                )
            if files.checkpoint_bytes_by_dtype is None and files.checkpoint_note:
                notes.append(f"checkpoint bytes by dtype unknown: {files.checkpoint_note}")
            return ResolvedConfig(
                model_id=ref,
                config=files.config,
                source=ModelSource.HUB,
                source_detail=files.config_url,
                checkpoint_bytes_by_dtype=files.checkpoint_bytes_by_dtype,
                notes=notes,
            )
    elif _looks_like_path(ref):
        not_found[-1] = f"no such path '{ref}'"
    else:
        not_found.append("not a hub id")

    bundled = _from_catalog(ref, fallback_notes)
    if bundled is not None:
        return bundled
    not_found.append("not in the bundled catalog")

    named = bundled_model_named_by(ref)
    if named is not None:
        where = "not a local path here" if _looks_like_path(ref) else "not a hub id llmmem knows"
        return _from_named_model(named, f"'{ref}' is {where}; {named.how}", fallback_notes)

    guess = guess_config_from_name(ref)
    if guess is not None:
        return replace(guess, notes=[*guess.notes, *fallback_notes])
    not_found.append("no size like '8B' in the name")

    close = close_matches(ref)
    close_text = f"; close matches: {', '.join(close)}" if close else ""
    raise ModelResolutionError(
        f"unknown model '{ref}': {', '.join(not_found)}{close_text}; {PRAGMA_HINT}",
        ref=ref,
        close_matches=close,
        hub_not_asked=not hub and is_hub_repo_id(ref),
    )


def _from_catalog(ref: str, notes: list[str]) -> ResolvedConfig | None:
    from llmmem.models.catalog import catalog_entry

    entry = catalog_entry(ref)
    if entry is None:
        return None
    return ResolvedConfig(
        model_id=entry.model_id,
        config=dict(entry.config),
        source=ModelSource.CATALOG,
        source_detail="bundled catalog",
        notes=[*notes, entry.note] if entry.note else list(notes),
    )


def _from_named_model(named: Any, note: str, notes: list[str]) -> ResolvedConfig:
    """The bundled model a path or a re-upload names, quantized as a -bnb-4bit upload is."""
    resolved = _from_catalog(named.model_id, [note, *notes])
    assert resolved is not None  # named.model_id is a catalog id
    if named.bnb_4bit and "quantization_config" not in resolved.config:
        resolved.config["quantization_config"] = dict(BNB_4BIT_QUANTIZATION)
    return resolved


def normalize_ref(ref: str) -> str:
    """Strip quotes, blanks and a hub URL: 'https://huggingface.co/org/name' -> 'org/name'."""
    ref = ref.strip().strip("'\"").strip()
    match = re.match(r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/([^?#]+)", ref)
    if match:
        parts = [part for part in match.group(1).split("/") if part]
        if len(parts) >= 2 and parts[0] not in ("datasets", "spaces"):
            return "/".join(parts[:2])
    return ref.removeprefix("hf://")


# --- 1. local paths ---------------------------------------------------------------------------


def _looks_like_path(ref: str) -> bool:
    return (
        ref.startswith(("/", "./", "../", "~", "\\"))
        or "\\" in ref
        or ref.count("/") > 1
        or ref.endswith(".json")
        or bool(re.match(r"^[A-Za-z]:[\\/]", ref))
    )


def _existing_local_path(ref: str, base_dir: Path | None) -> Path | None:
    path = Path(ref).expanduser()
    candidates = [path] if path.is_absolute() else [*([base_dir / path] if base_dir else []), path]
    for candidate in candidates:
        try:
            if candidate.exists():
                return candidate
        except (OSError, ValueError):  # a name too long for a path, or one holding a NUL
            continue
    return None


def _adapter_base(path: Path) -> str | None:
    """The base model a PEFT adapter folder (no config.json, an adapter_config.json) names;
    None for anything else. An adapter_config.json that does not name one is said as such."""
    if not path.is_dir() or (path / CONFIG_FILE).is_file():
        return None
    adapter_file = path / ADAPTER_CONFIG_FILE
    if not adapter_file.is_file():
        return None
    base = read_config_file(adapter_file).get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise ModelResolutionError(
            f"{adapter_file} names no base model (base_model_name_or_path); {PRAGMA_HINT}",
            ref=str(path),
        )
    return base.strip()


def read_config_file(path: Path) -> dict[str, Any]:
    """A config.json read from disk; raises ModelResolutionError naming the file."""
    from llmmem.files import read_file_bytes

    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ModelResolutionError(
                f"{path} is larger than {MAX_CONFIG_BYTES} bytes; is it a config.json?"
            )
        text = read_file_bytes(path, MAX_CONFIG_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelResolutionError(f"cannot read {path}: {error}") from error
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelResolutionError(
            f"{path} is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno}"
        ) from error
    if not isinstance(config, dict):
        raise ModelResolutionError(f"{path} is not a JSON object (found {type(config).__name__})")
    return config


def _from_local_path(
    path: Path, *, model_id: str, setting_note: str | None = None
) -> ResolvedConfig:
    if path.is_dir():
        config_file = path / CONFIG_FILE
        if not config_file.is_file():
            raise ModelResolutionError(
                f"directory '{path}' has no {CONFIG_FILE}; point at a folder written by "
                f"save_pretrained or at its {CONFIG_FILE}",
                ref=model_id,
            )
    else:
        config_file = path
    from llmmem.models.hub import read_local_checkpoint_bytes

    config = read_config_file(config_file)
    notes = [f"found through {setting_note}"] if setting_note else []
    return ResolvedConfig(
        model_id=model_id,
        config=config,
        source=ModelSource.LOCAL,
        source_detail=str(config_file),
        checkpoint_bytes_by_dtype=read_local_checkpoint_bytes(config_file.parent),
        notes=notes,
    )


# --- 2. the Hugging Face cache ------------------------------------------------------------------


class UnreadableHfCache(Exception):
    """The HF cache exists in the environment's eyes but cannot be read (a HOME the user may
    not enter, or one that is a file); `note` is the warning already given."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


def _hf_cached_config_path(repo_id: str) -> Path | None:
    """config.json of `repo_id` in the HF cache: the snapshot `refs/main` points at, else the
    newest snapshot that has one. An OSError other than "no such file" is the caller's."""
    cache_dir = hf_hub_cache_dir()
    repo_dir = cache_dir / f"models--{repo_id.replace('/', '--')}"
    try:
        repo_is_dir = stat.S_ISDIR(os.stat(repo_dir).st_mode)
    except FileNotFoundError:
        repo_is_dir = False  # the cache, or this model in it, is simply not there
    if not repo_is_dir:
        return None  # not cached: skip importing the hub client (a fifth of a second)
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, CONFIG_FILE, cache_dir=cache_dir)
    except ValueError:  # an id the hub client does not accept cannot be in its cache
        return None
    if isinstance(found, str):
        return Path(found)
    snapshots = repo_dir / "snapshots"
    try:
        configs = [snapshot / CONFIG_FILE for snapshot in snapshots.iterdir()]
    except OSError:
        return None
    existing = [config for config in configs if config.is_file()]
    return max(existing, key=lambda config: config.stat().st_mtime) if existing else None


def _from_hf_cache(repo_id: str) -> ResolvedConfig | None:
    """The config of `repo_id` in the HF cache, None when it is not cached; raises
    UnreadableHfCache (after warning) when the cache cannot be read."""
    try:
        config_path = _hf_cached_config_path(repo_id)
        if config_path is None:
            return None
        config = read_config_file(config_path)
    except (OSError, RuntimeError, ModelResolutionError) as error:
        cause = error.__cause__ if isinstance(error, ModelResolutionError) else error
        if not isinstance(cause, (OSError, RuntimeError)):
            raise  # a cached config that is not valid JSON: said as it is
        from llmmem.models.unreadable_cache import reason_of, unreadable_cache

        try:
            where: Path | str = hf_hub_cache_dir()
        except RuntimeError:  # Path.home() with neither HOME nor a passwd entry
            where = "~/.cache/huggingface/hub"
        raise UnreadableHfCache(
            unreadable_cache("the Hugging Face cache", where, reason_of(cause))
        ) from None
    from llmmem.models.hub import read_local_checkpoint_bytes

    return ResolvedConfig(
        model_id=repo_id,
        config=config,
        source=ModelSource.CACHE,
        source_detail=str(config_path),
        checkpoint_bytes_by_dtype=read_local_checkpoint_bytes(config_path.parent),
    )


def _hf_cached_repo_ids() -> list[str]:
    try:
        names = os.listdir(hf_hub_cache_dir())
    except (OSError, RuntimeError):  # not there, unreadable (warned), or no home at all
        return []
    return [
        name.removeprefix("models--").replace("--", "/")
        for name in names
        if name.startswith("models--")
    ]


def close_matches(ref: str, n: int = 5) -> list[str]:
    """Known model ids that look like `ref`: the bundled catalog, then the HF cache."""
    import difflib

    from llmmem.models.catalog import close_catalog_ids

    matches = list(close_catalog_ids(ref, n=n))
    cached = _hf_cached_repo_ids()
    by_lower = {repo_id.lower(): repo_id for repo_id in cached}
    for lower in difflib.get_close_matches(ref.lower(), list(by_lower), n=n, cutoff=0.6):
        if by_lower[lower] not in matches:
            matches.append(by_lower[lower])
    return matches[:n]

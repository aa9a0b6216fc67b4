"""From a model reference, as written in a script or config, to a ModelSpec.

`resolve_model(ref)` tries, in this order, and stops at the first that gives a config:

1. a local directory holding `config.json`, or a path to a config file (also through the
   `local_model_paths` setting, id -> path);
2. the Hugging Face cache on this machine (no network);
3. the catalog bundled with llmmem (verified copies of published configs: no network needed);
4. the hub, under one overall timeout, with an on-disk copy of earlier lookups (`hub.py`);
5. a guess from a size in the name ("8B", "1.5B", "135M", "8x7B"): the shapes of a real
   Llama-family model of about that size.

It raises `ModelResolutionError`, and nothing else, with a one-line message that says what was
tried and what to do, so it is safe to call from an editor on every change.

`hub.py` (the HTTP client and the disk copy of lookups) is imported only by the steps that use it,
so a bundled model resolves without loading it.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmmem.models.architectures import spec_from_config
from llmmem.models.hub_names import hf_hub_cache_dir, is_hub_repo_id
from llmmem.models.spec import ModelSource, ModelSpec, ModelSpecError

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 16 * 1024 * 1024
PRAGMA_HINT = "add '# llmmem: model_config=path/to/config.json' or pass a local path"
GUESS_SIZE_TOLERANCE = 0.10  # a shape within 10% of the size in the name is used as it is


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


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedConfig:
    """A model's config and where it was found, before it is read into a ModelSpec."""

    model_id: str
    config: dict[str, Any]
    source: ModelSource
    source_detail: str
    checkpoint_bytes_by_dtype: dict[str, int] | None = None
    notes: list[str] = field(default_factory=list)


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
) -> ResolvedConfig:
    ref = normalize_ref(ref)
    if not ref:
        raise ModelResolutionError(f"empty model reference; {PRAGMA_HINT}", ref=ref)
    not_found: list[str] = []  # why each step gave nothing, for the final message
    fallback_notes: list[str] = []  # what a catalog entry or a guess should say it stands in for

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
        return _from_local_path(local_path, model_id=ref)
    not_found.append("not a local path")

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


# --- 5. a guess from the size in the name ------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    """The shapes of a real Llama-family model, used when only a size is known."""

    name: str
    params: int  # its published parameter count
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_theta: float


LLAMA_SHAPES: tuple[LlamaShape, ...] = (
    LlamaShape("SmolLM-135M", 134_515_008, 576, 30, 1536, 9, 3, 49152, True, 2048, 10_000.0),
    LlamaShape("SmolLM-360M", 361_821_120, 960, 32, 2560, 15, 5, 49152, True, 2048, 10_000.0),
    LlamaShape(
        "TinyLlama-1.1B", 1_100_048_384, 2048, 22, 5632, 32, 4, 32000, False, 2048, 10_000.0
    ),
    LlamaShape(
        "Llama-3.2-1B", 1_235_814_400, 2048, 16, 8192, 32, 8, 128256, True, 131072, 500_000.0
    ),
    LlamaShape("SmolLM2-1.7B", 1_711_376_384, 2048, 24, 8192, 32, 32, 49152, True, 8192, 130_000.0),
    LlamaShape(
        "Llama-3.2-3B", 3_212_749_824, 3072, 28, 8192, 24, 8, 128256, True, 131072, 500_000.0
    ),
    LlamaShape("Llama-2-7B", 6_738_415_616, 4096, 32, 11008, 32, 32, 32000, False, 4096, 10_000.0),
    LlamaShape(
        "Mistral-7B", 7_241_732_096, 4096, 32, 14336, 32, 8, 32000, False, 32768, 1_000_000.0
    ),
    LlamaShape(
        "Llama-3.1-8B", 8_030_261_248, 4096, 32, 14336, 32, 8, 128256, False, 131072, 500_000.0
    ),
    LlamaShape(
        "Llama-2-13B", 13_015_864_320, 5120, 40, 13824, 40, 40, 32000, False, 4096, 10_000.0
    ),
    LlamaShape(
        "Codestral-22B", 22_247_282_688, 6144, 56, 16384, 48, 8, 32768, False, 32768, 1_000_000.0
    ),
    LlamaShape(
        "CodeLlama-34B", 33_743_970_304, 8192, 48, 22016, 64, 8, 32000, False, 16384, 1_000_000.0
    ),
    LlamaShape(
        "Llama-3.1-70B", 70_553_706_496, 8192, 80, 28672, 64, 8, 128256, False, 131072, 500_000.0
    ),
    LlamaShape(
        "Llama-3.1-405B",
        405_853_388_800,
        16384,
        126,
        53248,
        128,
        8,
        128256,
        False,
        131072,
        500_000.0,
    ),
)

MIN_GUESS_PARAMS = 10_000_000
MAX_GUESS_PARAMS = 3_000_000_000_000

# a size not glued to another number: "8B", "7b", "1.5B", "135M", "0.5B"; not "4bit", not "v0.1"
_DENSE_SIZE = re.compile(r"(?<![0-9.])(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
_MOE_SIZE = re.compile(r"(?<![0-9.])(\d+)[xX](\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")


@dataclass(frozen=True, slots=True, kw_only=True)
class NameSize:
    """A parameter count read from a model name."""

    text: str  # as written: "8B", "8x7B"
    params: int  # of one expert-sized model for a MoE name
    num_experts: int = 0


def size_from_name(ref: str) -> NameSize | None:
    """The parameter count a model name states, the largest when it states several
    ("Qwen2.5-7B-Instruct-1M" -> 7B); None when it states none."""
    name = ref.rsplit("/", 1)[-1]
    moe = _MOE_SIZE.search(name)
    if moe:
        params = _params_of(moe.group(2), moe.group(3))
        if MIN_GUESS_PARAMS <= params <= MAX_GUESS_PARAMS:
            return NameSize(text=moe.group(0), params=params, num_experts=int(moe.group(1)))
    sizes = [
        NameSize(text=match.group(0), params=_params_of(match.group(1), match.group(2)))
        for match in _DENSE_SIZE.finditer(name)
    ]
    sizes = [size for size in sizes if MIN_GUESS_PARAMS <= size.params <= MAX_GUESS_PARAMS]
    return max(sizes, key=lambda size: size.params) if sizes else None


def _params_of(number: str, unit: str) -> int:
    return round(float(number) * (1e9 if unit.lower() == "b" else 1e6))


def nearest_llama_shape(params: int) -> LlamaShape:
    return min(LLAMA_SHAPES, key=lambda shape: abs(math.log(shape.params / params)))


def llama_config(shape: LlamaShape, *, num_layers: int | None = None) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": num_layers or shape.num_layers,
        "intermediate_size": shape.intermediate_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.hidden_size // shape.num_heads,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": shape.rope_theta,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    }


def _layers_for(shape: LlamaShape, target_params: int, model_id: str) -> int:
    """How many blocks of `shape` make about `target_params` (embeddings and head kept)."""
    spec = spec_from_config(llama_config(shape), model_id=model_id, source=ModelSource.GUESS)
    per_block = spec.blocks[0].params_per_block
    outside_blocks = spec.total_params - per_block * spec.num_layers
    return max(1, round((target_params - outside_blocks) / per_block))


def guess_config_from_name(ref: str) -> ResolvedConfig | None:
    """A Llama-shaped config of the size the name states, or None when it states none."""
    size = size_from_name(ref)
    if size is None:
        return None
    shape = nearest_llama_shape(size.params)
    if size.num_experts:
        return _guess_moe_config(ref, size, shape)
    num_layers = shape.num_layers
    shape_text = f"shapes of a {shape.name}-sized model"
    if abs(shape.params / size.params - 1) > GUESS_SIZE_TOLERANCE:
        num_layers = _layers_for(shape, size.params, ref)
        shape_text = f"shapes of {shape.name} with {num_layers} layers"
    detail = f"guessed from '{size.text}' in the name; {shape_text}"
    return ResolvedConfig(
        model_id=ref,
        config=llama_config(shape, num_layers=num_layers),
        source=ModelSource.GUESS,
        source_detail=detail,
        notes=[
            f"only the size '{size.text}' is known: the layer shapes are those of {shape.name} "
            f"({num_layers} layers); for exact numbers {PRAGMA_HINT}"
        ],
    )


def _guess_moe_config(ref: str, size: NameSize, shape: LlamaShape) -> ResolvedConfig:
    config = llama_config(shape)
    config.update(
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        num_local_experts=size.num_experts,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.02,
        sliding_window=None,
    )
    detail = (
        f"guessed from '{size.text}' in the name; {size.num_experts} experts in the shapes of a "
        f"{shape.name}-sized model, 2 per token"
    )
    return ResolvedConfig(
        model_id=ref,
        config=config,
        source=ModelSource.GUESS,
        source_detail=detail,
        notes=[
            f"only the size '{size.text}' is known: a Mixtral-style model with {size.num_experts} "
            f"experts of {shape.name} shapes, 2 per token; for exact numbers {PRAGMA_HINT}"
        ],
    )

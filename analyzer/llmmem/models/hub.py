"""A model's files on the Hugging Face hub, read over HTTP under one overall deadline.

Two things are read: `config.json`, and the headers of the safetensors shards, which give the
exact bytes the checkpoint stores per dtype (what a pre-quantized `*-bnb-4bit`, GPTQ or AWQ
checkpoint really weighs). A header is read with HTTP Range requests: the first bytes of a shard
hold an 8-byte little-endian header length followed by a JSON header listing every tensor's dtype,
shape and byte range, so no weights are downloaded.

Results are kept on disk (`HubCache`) so that the next lookup is instant and works offline; a
failed lookup is remembered for a few minutes so an editor does not retry on every keystroke. Only
the standard library does the HTTP, so importing this module stays cheap.

Layout of the disk cache, under `hub_cache_root()`:

    <endpoint key>/found/<org>--<name>.json    a HubModelFiles, fresh for POSITIVE_TTL_S
    <endpoint key>/failed/<org>--<name>.json   a HubLookupFailure, honored for NEGATIVE_TTL_S

where the endpoint key is the endpoint without its scheme (`huggingface.co`, `127.0.0.1_8080`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import re
import struct
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from collections.abc import Iterator

from llmmem.files import open_regular_file
from llmmem.models.hub_names import hf_home

if TYPE_CHECKING:  # the HTTP stack is imported only when the network is used
    import urllib.request
    from http.client import HTTPMessage

DEFAULT_ENDPOINT = "https://huggingface.co"
POSITIVE_TTL_S = 7 * 24 * 3600.0  # a config fetched from the hub is trusted this long
NEGATIVE_TTL_S = 10 * 60.0  # a failed lookup is not retried before this
BACKGROUND_BUDGET_S = 30.0  # a lookup the caller stopped waiting for may finish this late
RUN_DEADLINE_S = 10.0  # all the lookups of one command-line run together (`run_deadline`)
RUN_DEADLINE_ENV = "LLMMEM_HUB_DEADLINE_S"  # changes RUN_DEADLINE_S
MAX_SHARDS = 256  # more shards than this and the checkpoint bytes are not read
SHARD_READERS = 8  # shard headers read at the same time
HEADER_PREFIX_BYTES = 64 * 1024  # first Range request; most headers fit, larger ones take two
MAX_HEADER_BYTES = 32 * 1024 * 1024
MAX_JSON_BYTES = 16 * 1024 * 1024  # config.json, model.safetensors.index.json
SAFETENSORS_SINGLE_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
CACHE_FORMAT = 1

# bytes per element, for a header entry without `data_offsets`
SAFETENSORS_ITEMSIZE: dict[str, float] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F4": 0.5,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

CheckpointBytesStatus = Literal["read", "absent", "failed"]
CHECKPOINT_BYTES_STATUSES: tuple[CheckpointBytesStatus, ...] = ("read", "absent", "failed")


class HubLookupError(Exception):
    """The hub did not give a config; `reason` is a short phrase for the final error message."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class HubModelFiles:
    """What the hub said about one repository, as kept in the disk cache."""

    format: int = CACHE_FORMAT
    repo_id: str
    endpoint: str
    config_url: str
    config: dict[str, Any]
    checkpoint_bytes_by_dtype: dict[str, int] | None = None
    checkpoint_bytes_status: CheckpointBytesStatus = "absent"
    checkpoint_note: str | None = None  # why the bytes are missing, or where they came from
    fetched_at: float  # unix time
    expires_at: float
    served_from_disk: bool = False  # set on a copy read back from the cache, never stored as True

    def is_fresh(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) < self.expires_at

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> HubModelFiles | None:
        """The lookup a cache file holds; None for one that is not valid JSON or not this shape."""
        data = _json_object(text)
        if data is None:
            return None
        status = data.get("checkpoint_bytes_status", "absent")
        bytes_by_dtype = data.get("checkpoint_bytes_by_dtype")
        note = data.get("checkpoint_note")
        served = data.get("served_from_disk", False)
        if not (
            _is_int(data.get("format", CACHE_FORMAT))
            and all(isinstance(data.get(key), str) for key in ("repo_id", "endpoint", "config_url"))
            and isinstance(data.get("config"), dict)
            and (bytes_by_dtype is None or _is_bytes_by_dtype(bytes_by_dtype))
            and status in CHECKPOINT_BYTES_STATUSES
            and (note is None or isinstance(note, str))
            and _is_number(data.get("fetched_at"))
            and _is_number(data.get("expires_at"))
            and isinstance(served, bool)
        ):
            return None
        return cls(
            format=data.get("format", CACHE_FORMAT),
            repo_id=data["repo_id"],
            endpoint=data["endpoint"],
            config_url=data["config_url"],
            config=data["config"],
            checkpoint_bytes_by_dtype=bytes_by_dtype,
            checkpoint_bytes_status=cast(CheckpointBytesStatus, status),
            checkpoint_note=note,
            fetched_at=float(data["fetched_at"]),
            expires_at=float(data["expires_at"]),
            served_from_disk=served,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class HubLookupFailure:
    """A failed lookup, remembered so that it is not retried at once."""

    format: int = CACHE_FORMAT
    repo_id: str
    endpoint: str
    reason: str
    failed_at: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> HubLookupFailure | None:
        """The failure a cache file holds; None for one that is not valid JSON or not this shape."""
        data = _json_object(text)
        if data is None:
            return None
        if not (
            _is_int(data.get("format", CACHE_FORMAT))
            and all(isinstance(data.get(key), str) for key in ("repo_id", "endpoint", "reason"))
            and _is_number(data.get("failed_at"))
        ):
            return None
        return cls(
            format=data.get("format", CACHE_FORMAT),
            repo_id=data["repo_id"],
            endpoint=data["endpoint"],
            reason=data["reason"],
            failed_at=float(data["failed_at"]),
        )


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read
        return None
    return data if isinstance(data, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_bytes_by_dtype(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(dtype, str) and _is_int(size) for dtype, size in value.items()
    )


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def hub_offline_reason() -> str | None:
    """Why the network must not be used, or None."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if _env_flag(name):
            return f"{name} is set"
    return None


def hub_token() -> str | None:
    """The user's HF token: HF_TOKEN, else the file `huggingface-cli login` writes."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        token = os.environ.get(name, "").strip()
        if token:
            return token
    if _env_flag("HF_HUB_DISABLE_IMPLICIT_TOKEN"):
        return None
    token_path = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token").expanduser()
    try:
        token = token_path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def hub_cache_root(cache_dir: Path | None = None) -> Path:
    """Where hub lookups are kept: `<cache_dir>/hub`, `$LLMMEM_CACHE_DIR/hub` or
    `~/.cache/llmmem/hub`."""
    if cache_dir is not None:
        return Path(cache_dir) / "hub"
    if os.environ.get("LLMMEM_CACHE_DIR"):
        return Path(os.environ["LLMMEM_CACHE_DIR"]).expanduser() / "hub"
    xdg_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg_cache).expanduser() / "llmmem" / "hub"


def resolve_url(endpoint: str, repo_id: str, filename: str) -> str:
    return f"{endpoint}/{repo_id}/resolve/main/{urllib.parse.quote(filename)}"


# --- the disk cache ---------------------------------------------------------------------------


class HubCache:
    """Hub lookups on disk, one small JSON file per repository and endpoint."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, kind: str, endpoint: str, repo_id: str) -> Path:
        endpoint_key = re.sub(r"[^\w.-]+", "_", endpoint.split("://", 1)[-1]).strip("_")
        return self.root / (endpoint_key or "default") / kind / f"{repo_id.replace('/', '--')}.json"

    def _read_text(self, path: Path) -> str | None:
        """A cache file's text; None when there is none, or (warned once) when the cache
        cannot be read at all."""
        from llmmem.files import UnreadableFile, read_file_bytes

        try:
            return read_file_bytes(path, MAX_JSON_BYTES).decode("utf-8")
        except (FileNotFoundError, UnreadableFile, UnicodeDecodeError):
            return None  # not looked up before, or a damaged entry: looked up again
        except OSError as error:  # EACCES, ENOTDIR: a home the user cannot read
            from llmmem.models.unreadable_cache import reason_of, unreadable_cache

            unreadable_cache("llmmem's copy of hub lookups", self.root, reason_of(error))
            return None

    def read(self, endpoint: str, repo_id: str) -> HubModelFiles | None:
        """The stored lookup, fresh or not; None when there is none or it cannot be read."""
        text = self._read_text(self._path("found", endpoint, repo_id))
        if text is None:
            return None
        files = HubModelFiles.from_json(text)
        if files is None or files.format != CACHE_FORMAT or files.repo_id != repo_id:
            return None
        return replace(files, served_from_disk=True)

    def read_failure(
        self, endpoint: str, repo_id: str, now: float | None = None
    ) -> HubLookupFailure | None:
        """A failure recorded less than NEGATIVE_TTL_S ago, else None."""
        text = self._read_text(self._path("failed", endpoint, repo_id))
        if text is None:
            return None
        failure = HubLookupFailure.from_json(text)
        if failure is None:
            return None
        now = now if now is not None else time.time()
        if failure.repo_id != repo_id or not 0 <= now - failure.failed_at < NEGATIVE_TTL_S:
            return None
        return failure

    def write(self, files: HubModelFiles) -> None:
        stored = replace(files, served_from_disk=False)
        self._write(self._path("found", files.endpoint, files.repo_id), stored.to_json())
        self._remove(self._path("failed", files.endpoint, files.repo_id))

    def write_failure(self, failure: HubLookupFailure) -> None:
        self._write(self._path("failed", failure.endpoint, failure.repo_id), failure.to_json())

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Write through a temporary file and a rename, so a reader never sees half a file."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            pass  # a cache that cannot be written only costs a later lookup

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass


def _read_small_text(path: Path, limit: int = MAX_JSON_BYTES) -> str | None:
    from llmmem.files import read_file_bytes

    try:
        return read_file_bytes(path, limit).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


# --- safetensors headers ----------------------------------------------------------------------


def checkpoint_bytes_from_header(header: dict[str, Any]) -> dict[str, int]:
    """Bytes per dtype of the tensors one safetensors header lists."""
    bytes_by_dtype: dict[str, int] = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        dtype = str(entry.get("dtype", "?"))
        offsets = entry.get("data_offsets")
        if isinstance(offsets, list) and len(offsets) == 2:
            size = int(offsets[1]) - int(offsets[0])
        else:
            numel = 1
            for dim in entry.get("shape", []):
                numel *= int(dim)
            size = int(numel * SAFETENSORS_ITEMSIZE.get(dtype, 1))
        bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + size
    return bytes_by_dtype


def parse_header_length(prefix: bytes) -> int:
    if len(prefix) < 8:
        raise ValueError("shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > MAX_HEADER_BYTES:
        raise ValueError(f"header of {length} bytes is larger than {MAX_HEADER_BYTES}")
    return int(length)


def parse_header(header_bytes: bytes) -> dict[str, Any]:
    header = json.loads(header_bytes.decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def _sum_by_dtype(parts: list[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for part in parts:
        for dtype, size in part.items():
            total[dtype] = total.get(dtype, 0) + size
    return dict(sorted(total.items()))


def shard_names(index: dict[str, Any]) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError("no weight_map")
    return sorted({str(shard) for shard in weight_map.values()})


def read_local_checkpoint_bytes(directory: Path) -> dict[str, int] | None:
    """Bytes per dtype of the safetensors checkpoint in `directory` (read from the headers only),
    or None when it has no complete safetensors checkpoint."""
    try:
        index_path = directory / SAFETENSORS_INDEX_FILE
        if index_path.is_file():
            text = _read_small_text(index_path)
            if text is None:
                return None
            names = shard_names(json.loads(text))
        elif (directory / SAFETENSORS_SINGLE_FILE).is_file():
            names = [SAFETENSORS_SINGLE_FILE]
        else:
            return None
        if not names or len(names) > MAX_SHARDS:
            return None
        parts = []
        for name in names:
            with open_regular_file(directory / name, None) as shard:  # the header only
                length = parse_header_length(shard.read(8))
                parts.append(checkpoint_bytes_from_header(parse_header(shard.read(length))))
        return _sum_by_dtype(parts)
    except (OSError, ValueError):
        return None


# --- HTTP ------------------------------------------------------------------------------------


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    import urllib.request

    class KeepAuthOnSameHost(urllib.request.HTTPRedirectHandler):
        """Follow redirects; resend the token only to the host it was meant for (a renamed
        repo redirects on the hub itself, a large file to a CDN that must not see it)."""

        def redirect_request(
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: HTTPMessage,
            newurl: str,
        ) -> urllib.request.Request | None:
            new_request = super().redirect_request(req, fp, code, msg, headers, newurl)
            authorization = req.unredirected_hdrs.get("Authorization")
            if new_request is not None and authorization:
                same_host = (
                    urllib.parse.urlsplit(newurl).netloc
                    == urllib.parse.urlsplit(req.full_url).netloc
                )
                if same_host:
                    new_request.add_unredirected_header("Authorization", authorization)
            return new_request

    return urllib.request.build_opener(KeepAuthOnSameHost)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a failed connection or a broken response raises (imported on first use)."""
    from http.client import HTTPException

    return (OSError, HTTPException, ValueError)


class _HttpStatusError(Exception):
    def __init__(self, status: int, error_code: str | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.error_code = error_code  # the hub's X-Error-Code: RepoNotFound, GatedRepo, ...


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {self.seconds:g} s")
        return left


def _http_get(
    url: str,
    *,
    token: str | None,
    deadline: Deadline,
    byte_range: tuple[int, int] | None = None,
    limit: int = MAX_JSON_BYTES,
) -> bytes:
    """GET `url` (or bytes first..last of it), reading at most `limit` bytes."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, headers={"User-Agent": "llmmem", "Accept-Encoding": "identity"}
    )
    if token:
        request.add_unredirected_header("Authorization", f"Bearer {token}")
    if byte_range is not None:
        request.add_header("Range", f"bytes={byte_range[0]}-{byte_range[1]}")
    try:
        response = _opener().open(request, timeout=deadline.left())
    except urllib.error.HTTPError as error:
        error.close()
        raise _HttpStatusError(error.code, error.headers.get("X-Error-Code")) from None
    with response:
        wanted = limit
        if byte_range is not None:
            wanted = byte_range[1] - byte_range[0] + 1
            if response.status == 200 and byte_range[0] > 0:
                # the server ignored the range and sends the whole file: skip to the start
                _read_at_most(response, byte_range[0], deadline)
        body = _read_at_most(response, wanted + 1 if byte_range is None else wanted, deadline)
    if byte_range is None and len(body) > limit:
        raise ValueError(f"{url} is larger than {limit} bytes")
    return body


def _read_at_most(response: Any, size: int, deadline: Deadline) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        deadline.left()
        chunk = response.read(min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _http_get_json(url: str, *, token: str | None, deadline: Deadline) -> Any:
    return json.loads(_http_get(url, token=token, deadline=deadline).decode("utf-8"))


def _status_reason(error: _HttpStatusError, *, token: str | None) -> str:
    """Why the hub refused config.json, phrased to follow "hub: "."""
    if error.error_code == "GatedRepo" or error.status == 403:
        no_token = "" if token else "; no token was found"
        return (
            f"gated (HTTP {error.status}): accept the license on the model page and set "
            f"HF_TOKEN{no_token}"
        )
    if error.error_code == "EntryNotFound":
        return f"the repository has no config.json (HTTP {error.status})"
    if error.error_code == "RepoNotFound" or error.status in (401, 404):
        private = "" if token else ", or private and no token was found"
        return f"not found (HTTP {error.status}{private})"
    return f"HTTP {error.status}"


def _network_reason(error: BaseException, deadline: Deadline) -> str:
    if isinstance(error, TimeoutError) or "timed out" in str(error):
        return f"no answer within {deadline.seconds:g} s"
    import urllib.error

    if isinstance(error, urllib.error.URLError):
        return f"unreachable ({error.reason})"
    return f"unreachable ({type(error).__name__}: {error})"


def fetch_config(
    repo_id: str, *, endpoint: str, token: str | None, deadline: Deadline
) -> tuple[dict[str, Any], str]:
    """config.json of `repo_id` and its URL; raises HubLookupError."""
    config_url = resolve_url(endpoint, repo_id, "config.json")
    try:
        config = _http_get_json(config_url, token=token, deadline=deadline)
    except _HttpStatusError as error:
        raise HubLookupError(_status_reason(error, token=token)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise HubLookupError(f"its config.json is not valid JSON ({error})") from None
    except _transport_errors() as error:
        raise HubLookupError(_network_reason(error, deadline)) from None
    if not isinstance(config, dict):
        raise HubLookupError("its config.json is not a JSON object")
    return config, config_url


def fetch_checkpoint_bytes(
    repo_id: str, *, endpoint: str, token: str | None, deadline: Deadline
) -> tuple[dict[str, int] | None, CheckpointBytesStatus, str]:
    """Bytes per dtype read from the safetensors headers, whether they were read, and a note."""
    try:
        bytes_by_dtype, note = _fetch_checkpoint_bytes(
            repo_id, endpoint=endpoint, token=token, deadline=deadline
        )
    except (_HttpStatusError, *_transport_errors()) as error:  # type: ignore[misc]
        return None, "failed", f"safetensors headers not read: {error}"
    return bytes_by_dtype, ("read" if bytes_by_dtype is not None else "absent"), note


def _model_files(
    repo_id: str,
    *,
    endpoint: str,
    config: dict[str, Any],
    config_url: str,
    checkpoint: tuple[dict[str, int] | None, CheckpointBytesStatus, str],
) -> HubModelFiles:
    bytes_by_dtype, status, note = checkpoint
    now = time.time()
    # a transient failure to read the headers is retried sooner than a complete lookup
    ttl = NEGATIVE_TTL_S if status == "failed" else POSITIVE_TTL_S
    return HubModelFiles(
        repo_id=repo_id,
        endpoint=endpoint,
        config_url=config_url,
        config=config,
        checkpoint_bytes_by_dtype=bytes_by_dtype,
        checkpoint_bytes_status=status,
        checkpoint_note=note,
        fetched_at=now,
        expires_at=now + ttl,
    )


def _fetch_checkpoint_bytes(
    repo_id: str, *, endpoint: str, token: str | None, deadline: Deadline
) -> tuple[dict[str, int] | None, str]:
    try:
        index = _http_get_json(
            resolve_url(endpoint, repo_id, SAFETENSORS_INDEX_FILE), token=token, deadline=deadline
        )
        if not isinstance(index, dict):
            raise ValueError(f"{SAFETENSORS_INDEX_FILE} is not a JSON object")
        names = shard_names(index)
    except _HttpStatusError as error:
        if error.status not in (401, 403, 404):
            raise
        names = [SAFETENSORS_SINGLE_FILE]
    if len(names) > MAX_SHARDS:
        return None, f"{len(names)} safetensors shards, more than the {MAX_SHARDS} read"
    try:
        parts = _fetch_headers(repo_id, names, endpoint=endpoint, token=token, deadline=deadline)
    except _HttpStatusError as error:
        if names == [SAFETENSORS_SINGLE_FILE] and error.status in (401, 403, 404):
            return None, "no safetensors checkpoint on the hub"
        raise
    return _sum_by_dtype(parts), f"read from the headers of {len(names)} safetensors file(s)"


def _fetch_header(
    repo_id: str, filename: str, *, endpoint: str, token: str | None, deadline: Deadline
) -> dict[str, int]:
    url = resolve_url(endpoint, repo_id, filename)
    prefix = _http_get(url, token=token, deadline=deadline, byte_range=(0, HEADER_PREFIX_BYTES - 1))
    length = parse_header_length(prefix)
    if len(prefix) < 8 + length:
        rest = _http_get(
            url, token=token, deadline=deadline, byte_range=(len(prefix), 8 + length - 1)
        )
        prefix += rest
    if len(prefix) < 8 + length:
        raise ValueError(f"{filename}: header cut short")
    return checkpoint_bytes_from_header(parse_header(prefix[8 : 8 + length]))


def _fetch_headers(
    repo_id: str, names: list[str], *, endpoint: str, token: str | None, deadline: Deadline
) -> list[dict[str, int]]:
    """Read the shard headers, SHARD_READERS at a time, on daemon threads (a stuck socket must
    not keep the process alive past the deadline)."""
    results: dict[str, dict[str, int]] = {}
    errors: list[BaseException] = []
    pending = list(names)
    lock = threading.Lock()

    def read_shards() -> None:
        while True:
            with lock:
                if not pending or errors:
                    return
                name = pending.pop()
            try:
                part = _fetch_header(
                    repo_id, name, endpoint=endpoint, token=token, deadline=deadline
                )
            except BaseException as error:  # handed to the caller below
                with lock:
                    errors.append(error)
                return
            with lock:
                results[name] = part

    readers = [
        threading.Thread(target=read_shards, daemon=True)
        for _ in range(min(SHARD_READERS, len(names)))
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(max(0.0, deadline.at - time.monotonic()))
    if errors:
        raise errors[0]
    if len(results) < len(names):
        raise TimeoutError(f"no answer within {deadline.seconds:g} s")
    return [results[name] for name in names]


# --- lookups with the cache ------------------------------------------------------------------


class _Lookup:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.files: HubModelFiles | None = None
        self.config_only: HubModelFiles | None = None  # set once config.json is in, headers pending
        self.error: HubLookupError | None = None


_lookups_in_flight: dict[tuple[str, str, str], _Lookup] = {}
_lookups_lock = threading.Lock()


def _start_lookup(
    repo_id: str, *, endpoint: str, token: str | None, cache: HubCache, budget_s: float
) -> _Lookup:
    """Start a lookup on a daemon thread, or join the one already running for this repository.
    The thread writes its result (or its failure) to the cache, even after the caller gave up."""
    key = (str(cache.root), endpoint, repo_id)
    with _lookups_lock:
        running = _lookups_in_flight.get(key)
        if running is not None:
            return running
        lookup = _Lookup()
        _lookups_in_flight[key] = lookup

    def run() -> None:
        try:
            deadline = Deadline(budget_s)
            config, config_url = fetch_config(
                repo_id, endpoint=endpoint, token=token, deadline=deadline
            )
            pending_note = "safetensors headers not read yet (the lookup was still running)"
            lookup.config_only = _model_files(
                repo_id,
                endpoint=endpoint,
                config=config,
                config_url=config_url,
                checkpoint=(None, "failed", pending_note),
            )
            cache.write(lookup.config_only)  # the config is worth keeping even if the rest is slow
            checkpoint = fetch_checkpoint_bytes(
                repo_id, endpoint=endpoint, token=token, deadline=deadline
            )
            lookup.files = _model_files(
                repo_id,
                endpoint=endpoint,
                config=config,
                config_url=config_url,
                checkpoint=checkpoint,
            )
            cache.write(lookup.files)
        except Exception as error:  # any failure becomes a remembered reason
            reason = (
                error.reason
                if isinstance(error, HubLookupError)
                else f"{type(error).__name__}: {error}"
            )
            lookup.error = HubLookupError(reason)
            cache.write_failure(
                HubLookupFailure(
                    repo_id=repo_id, endpoint=endpoint, reason=reason, failed_at=time.time()
                )
            )
        finally:
            with _lookups_lock:
                _lookups_in_flight.pop(key, None)
            lookup.done.set()

    threading.Thread(target=run, name=f"llmmem-hub-{repo_id}", daemon=True).start()
    return lookup


# (monotonic time it ends, its length in seconds) of the run in progress, if one set it
_run_deadline: contextvars.ContextVar[tuple[float, float] | None] = contextvars.ContextVar(
    "llmmem_hub_run_deadline", default=None
)


def run_deadline_seconds() -> float:
    """RUN_DEADLINE_S, or `$LLMMEM_HUB_DEADLINE_S` when it holds a number above 0."""
    try:
        seconds = float(os.environ.get(RUN_DEADLINE_ENV, ""))
    except ValueError:
        return RUN_DEADLINE_S
    return seconds if 0 < seconds <= 3600 else RUN_DEADLINE_S


@contextlib.contextmanager
def run_deadline(seconds: float | None = None) -> Iterator[None]:
    """One deadline for every hub lookup made inside the block (a command-line run): each
    lookup still waits at most its own timeout, and none waits past the run's deadline; once it
    has passed, a model not on disk is not looked up. The language server sets none: its lookups
    run in the background, each under its own timeout."""
    length = run_deadline_seconds() if seconds is None else seconds
    token = _run_deadline.set((time.monotonic() + length, length))
    try:
        yield
    finally:
        _run_deadline.reset(token)


def hub_model_files(
    repo_id: str,
    *,
    allow_network: bool = True,
    timeout_s: float = 3.0,
    cache_dir: Path | None = None,
) -> HubModelFiles:
    """The hub's config (and checkpoint bytes) for `repo_id`, waiting at most `timeout_s`.

    Order: a fresh copy on disk; else the network (unless `allow_network` is False, HF_HUB_OFFLINE
    is set, or a lookup failed less than NEGATIVE_TTL_S ago); else a stale copy on disk. Raises
    HubLookupError with the reason when none of these gives a config.
    """
    endpoint = hub_endpoint()
    cache = HubCache(hub_cache_root(cache_dir))
    stored = cache.read(endpoint, repo_id)
    if stored is not None and stored.is_fresh():
        return stored

    offline_reason = None if allow_network else "lookups are off"
    offline_reason = offline_reason or hub_offline_reason()
    if offline_reason is not None:
        if stored is not None:
            return stored
        raise HubLookupError(f"{offline_reason} and it was never fetched")

    failure = cache.read_failure(endpoint, repo_id)
    if failure is not None:
        if stored is not None:
            return stored
        minutes_ago = max(0, int((time.time() - failure.failed_at) // 60))
        raise HubLookupError(
            f"{failure.reason}, {minutes_ago} min ago; retried after {NEGATIVE_TTL_S / 60:g} min"
        )

    wait_s = timeout_s
    run = _run_deadline.get()
    if run is not None:
        run_left = run[0] - time.monotonic()
        if run_left <= 0:
            if stored is not None:
                return stored
            raise HubLookupError(f"not looked up: the run's {run[1]:g} s for hub lookups are spent")
        wait_s = min(timeout_s, run_left)
    lookup = _start_lookup(
        repo_id,
        endpoint=endpoint,
        token=hub_token(),
        cache=cache,
        budget_s=max(timeout_s, BACKGROUND_BUDGET_S),
    )
    if not lookup.done.wait(max(0.0, wait_s)):
        if lookup.config_only is not None:
            return lookup.config_only
        if wait_s < timeout_s:  # cut short by the run: not a failure of this model to remember
            reason = f"no answer before the run's {run[1] if run else wait_s:g} s hub deadline"
        else:
            reason = f"no answer within {timeout_s:g} s"
            cache.write_failure(
                HubLookupFailure(
                    repo_id=repo_id, endpoint=endpoint, reason=reason, failed_at=time.time()
                )
            )
        if stored is not None:
            return stored
        raise HubLookupError(reason)
    if lookup.files is not None:
        return lookup.files
    if stored is not None:
        return stored
    raise lookup.error or HubLookupError("the lookup failed")

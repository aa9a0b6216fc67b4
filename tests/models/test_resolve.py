"""Model references resolved through real files, a real HF cache layout and a real HTTP server."""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmmem.models import hub as hub_module
from llmmem.models.architectures import spec_from_config
from llmmem.models.resolve import (
    LLAMA_SHAPES,
    ModelResolutionError,
    llama_config,
    normalize_ref,
    resolve_model,
    size_from_name,
)
from llmmem.models.spec import ModelSource

TINY_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

TINY_LLAMA_BNB_4BIT: dict[str, Any] = {
    **TINY_LLAMA,
    "quantization_config": {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": False,
        "bnb_4bit_compute_dtype": "bfloat16",
    },
}

ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "U8": 1, "I32": 4}

Tensors = dict[str, tuple[str, list[int]]]


# --- builders ------------------------------------------------------------------------------------


def safetensors_file(tensors: Tensors, metadata: dict[str, str] | None = None) -> bytes:
    """A valid safetensors file: 8-byte little-endian header length, JSON header, zeroed data."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * ITEMSIZE[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + bytes(offset)


def bytes_by_dtype(*shards: Tensors) -> dict[str, int]:
    total: dict[str, int] = {}
    for tensors in shards:
        for dtype, shape in tensors.values():
            total[dtype] = total.get(dtype, 0) + math.prod(shape) * ITEMSIZE[dtype]
    return total


def tiny_llama_linears(layer: int) -> dict[str, tuple[int, int]]:
    prefix = f"model.layers.{layer}"
    return {
        f"{prefix}.self_attn.q_proj.weight": (64, 64),
        f"{prefix}.self_attn.k_proj.weight": (32, 64),
        f"{prefix}.self_attn.v_proj.weight": (32, 64),
        f"{prefix}.self_attn.o_proj.weight": (64, 64),
        f"{prefix}.mlp.gate_proj.weight": (128, 64),
        f"{prefix}.mlp.up_proj.weight": (128, 64),
        f"{prefix}.mlp.down_proj.weight": (64, 128),
    }


def bnb_4bit_layer(layer: int) -> Tensors:
    """One block as a bnb-4bit checkpoint stores it: packed U8 weights, F32 absmax per 64 values."""
    tensors: Tensors = {}
    for name, (rows, cols) in tiny_llama_linears(layer).items():
        numel = rows * cols
        tensors[name] = ("U8", [numel // 2, 1])
        tensors[f"{name}.absmax"] = ("F32", [numel // 64])
        tensors[f"{name}.quant_map"] = ("F32", [16])
        tensors[f"{name}.quant_state.bitsandbytes__nf4"] = ("U8", [96])
    for norm in ("input_layernorm", "post_attention_layernorm"):
        tensors[f"model.layers.{layer}.{norm}.weight"] = ("BF16", [64])
    return tensors


def bf16_layer(layer: int) -> Tensors:
    tensors: Tensors = {
        name: ("BF16", [rows, cols]) for name, (rows, cols) in tiny_llama_linears(layer).items()
    }
    for norm in ("input_layernorm", "post_attention_layernorm"):
        tensors[f"model.layers.{layer}.{norm}.weight"] = ("BF16", [64])
    return tensors


EMBEDDINGS: Tensors = {
    "model.embed_tokens.weight": ("BF16", [256, 64]),
    "model.norm.weight": ("BF16", [64]),
    "lm_head.weight": ("BF16", [256, 64]),
}


def write_model_dir(directory: Path, config: dict[str, Any], shard: Tensors | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if shard is not None:
        (directory / "model.safetensors").write_bytes(safetensors_file(shard))
    return directory


def write_hf_cache_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A repository in the HF cache layout: blobs by hash, a snapshot of links, refs/main."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for index, (name, content) in enumerate(files.items()):
        blob = repo_dir / "blobs" / f"{index:040x}"
        blob.write_bytes(content)
        (snapshot / name).symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot


# --- a hub on 127.0.0.1 -------------------------------------------------------------------------


class LocalHub:
    """Serves `/{repo}/resolve/main/{file}` with Range support, counts requests, can be slow."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.authorizations: list[str | None] = []
        self.delay_s = 0.0
        self.delayed_suffix = ""  # only paths ending with this are delayed
        self.gated: set[str] = set()
        self._server: ThreadingHTTPServer | None = None

    def add_repo(self, repo_id: str, files: dict[str, bytes]) -> None:
        for name, content in files.items():
            self.files[f"/{repo_id}/resolve/main/{name}"] = content

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> None:
        local_hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                local_hub.requests.append((self.path, self.headers.get("Range")))
                local_hub.authorizations.append(self.headers.get("Authorization"))
                if local_hub.delay_s and self.path.endswith(local_hub.delayed_suffix):
                    time.sleep(local_hub.delay_s)
                repo = "/".join(self.path.split("/")[1:3])
                if repo in local_hub.gated:
                    self._send(401, b"gated", {"X-Error-Code": "GatedRepo"})
                    return
                content = local_hub.files.get(self.path)
                if content is None:
                    self._send(404, b"not found", {"X-Error-Code": "EntryNotFound"})
                    return
                byte_range = self.headers.get("Range")
                if byte_range:
                    first_text, last_text = byte_range.removeprefix("bytes=").split("-")
                    first, last = int(first_text), min(int(last_text), len(content) - 1)
                    headers = {"Content-Range": f"bytes {first}-{last}/{len(content)}"}
                    self._send(206, content[first : last + 1], headers)
                else:
                    self._send(200, content, {})

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client stopped waiting

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        self._server = server
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No real cache, token or hub: an empty HF cache, a private llmmem cache, a closed port."""
    for name in (
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN_PATH",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LLMMEM_CACHE_DIR", str(tmp_path / "llmmem-cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once


@pytest.fixture
def local_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    served = LocalHub()
    served.start()
    monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
    yield served
    served.stop()


BNB_SHARDS: dict[str, Tensors] = {
    "model-00001-of-00002.safetensors": {**EMBEDDINGS, **bnb_4bit_layer(0)},
    "model-00002-of-00002.safetensors": bnb_4bit_layer(1),
}


def bnb_4bit_repo_files() -> dict[str, bytes]:
    weight_map = {name: shard for shard, tensors in BNB_SHARDS.items() for name in tensors}
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    files = {"config.json": json.dumps(TINY_LLAMA_BNB_4BIT).encode()}
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    for shard, tensors in BNB_SHARDS.items():
        files[shard] = safetensors_file(tensors)
    return files


# --- 1. local paths ------------------------------------------------------------------------------


def test_local_directory(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "my-model", TINY_LLAMA)
    spec = resolve_model(str(model_dir), hub=False)
    assert spec.source is ModelSource.LOCAL
    assert spec.source_detail == str(model_dir / "config.json")
    assert spec.model_type == "llama"
    assert spec.num_layers == 2
    assert spec.checkpoint_bytes_by_dtype is None  # no weights in the folder


def test_config_file_path_and_relative_to_base_dir(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "configs" / "tiny", TINY_LLAMA)
    spec = resolve_model(str(model_dir / "config.json"), hub=False)
    assert spec.source is ModelSource.LOCAL
    relative = resolve_model("./tiny/config.json", hub=False, base_dir=tmp_path / "configs")
    assert relative.source_detail == str(model_dir / "config.json")


def test_local_directory_with_weights_reads_the_safetensors_header(tmp_path: Path) -> None:
    shard = {**EMBEDDINGS, **bf16_layer(0), **bf16_layer(1)}
    model_dir = write_model_dir(tmp_path / "with-weights", TINY_LLAMA, shard)
    spec = resolve_model(str(model_dir), hub=False)
    assert spec.checkpoint_bytes_by_dtype == bytes_by_dtype(shard)
    assert spec.checkpoint_bytes_by_dtype == {"BF16": 2 * spec.total_params}


def test_malformed_config_names_the_file_and_line(tmp_path: Path) -> None:
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        '{\n  "model_type": "llama",\n  "hidden_size": 64\n  "x": 1\n}'
    )
    with pytest.raises(ModelResolutionError) as caught:
        resolve_model(str(model_dir), hub=False)
    message = str(caught.value)
    assert str(model_dir / "config.json") in message
    assert "line 4" in message
    assert "\n" not in message


def test_directory_without_config(tmp_path: Path) -> None:
    empty = tmp_path / "checkpoint-500"
    empty.mkdir()
    with pytest.raises(ModelResolutionError, match="has no config.json"):
        resolve_model(str(empty), hub=False)


def test_local_model_paths_setting(tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "weights" / "internal", TINY_LLAMA)
    spec = resolve_model(
        "acme/internal-model", hub=False, local_model_paths={"acme/internal-model": str(model_dir)}
    )
    assert spec.source is ModelSource.LOCAL
    assert spec.model_id == "acme/internal-model"
    with pytest.raises(ModelResolutionError, match="local_model_paths"):
        resolve_model(
            "acme/gone", hub=False, local_model_paths={"acme/gone": str(tmp_path / "nowhere")}
        )


def test_unsupported_model_type_is_a_resolution_error(tmp_path: Path) -> None:
    model_dir = write_model_dir(
        tmp_path / "odd", {"model_type": "not-a-real-architecture", "hidden_size": 8}
    )
    with pytest.raises(ModelResolutionError, match="not-a-real-architecture"):
        resolve_model(str(model_dir), hub=False)


# --- 2. the Hugging Face cache -------------------------------------------------------------------


def test_hf_cache(tmp_path: Path) -> None:
    shard = {**EMBEDDINGS, **bf16_layer(0), **bf16_layer(1)}
    snapshot = write_hf_cache_repo(
        tmp_path / "hf-cache",
        "acme/tiny-llama",
        {
            "config.json": json.dumps(TINY_LLAMA).encode(),
            "model.safetensors": safetensors_file(shard),
        },
    )
    spec = resolve_model("acme/tiny-llama", hub=False)
    assert spec.source is ModelSource.CACHE
    assert spec.source_detail == str(snapshot / "config.json")
    assert spec.checkpoint_bytes_by_dtype == bytes_by_dtype(shard)


def test_hf_cache_from_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    write_hf_cache_repo(
        tmp_path / "hf-home" / "hub", "acme/other", {"config.json": json.dumps(TINY_LLAMA).encode()}
    )
    assert resolve_model("acme/other", hub=False).source is ModelSource.CACHE


# --- 3. the hub ----------------------------------------------------------------------------------


def test_hub_config_and_exact_checkpoint_bytes(local_hub: LocalHub) -> None:
    local_hub.add_repo("acme/tiny-llama-bnb-4bit", bnb_4bit_repo_files())
    spec = resolve_model("acme/tiny-llama-bnb-4bit", hub_timeout_s=5)
    assert spec.source is ModelSource.HUB
    assert (
        spec.source_detail
        == f"{local_hub.endpoint}/acme/tiny-llama-bnb-4bit/resolve/main/config.json"
    )
    expected = bytes_by_dtype(*BNB_SHARDS.values())
    assert spec.checkpoint_bytes_by_dtype == expected
    # 14 linears of 36_864 weights packed two per byte, plus 96 bytes of quant state each
    assert expected["U8"] == 73_728 // 2 + 14 * 96
    # absmax: one F32 per 64 weights; quant_map: 16 F32 per linear
    assert expected["F32"] == 4 * (73_728 // 64 + 14 * 16)
    shard_requests = [
        entry for entry in local_hub.requests if entry[0].endswith("-of-00002.safetensors")
    ]
    assert len(shard_requests) == 2
    assert all(
        range_header and range_header.startswith("bytes=0-") for _, range_header in shard_requests
    )


def test_hub_single_file_with_a_large_header_takes_two_ranges(local_hub: LocalHub) -> None:
    shard = {**EMBEDDINGS, **bf16_layer(0), **bf16_layer(1)}
    content = safetensors_file(shard, metadata={"format": "pt", "padding": "x" * 100_000})
    local_hub.add_repo(
        "acme/one-file",
        {"config.json": json.dumps(TINY_LLAMA).encode(), "model.safetensors": content},
    )
    spec = resolve_model("acme/one-file", hub_timeout_s=5)
    assert spec.checkpoint_bytes_by_dtype == bytes_by_dtype(shard)
    ranges = [
        range_header
        for path, range_header in local_hub.requests
        if path.endswith("/model.safetensors")
    ]
    assert len(ranges) == 2
    (header_length,) = struct.unpack("<Q", content[:8])
    assert ranges[1] == f"bytes={hub_module.HEADER_PREFIX_BYTES}-{8 + header_length - 1}"


def test_hub_without_safetensors_still_gives_the_config(local_hub: LocalHub) -> None:
    local_hub.add_repo("acme/bin-only", {"config.json": json.dumps(TINY_LLAMA).encode()})
    spec = resolve_model("acme/bin-only", hub_timeout_s=5)
    assert spec.source is ModelSource.HUB
    assert spec.checkpoint_bytes_by_dtype is None
    assert any("no safetensors" in note for note in spec.notes)


def test_hub_result_is_kept_on_disk_and_works_after_the_server_is_gone(
    local_hub: LocalHub, tmp_path: Path
) -> None:
    local_hub.add_repo("acme/tiny-llama-bnb-4bit", bnb_4bit_repo_files())
    first = resolve_model("acme/tiny-llama-bnb-4bit", hub_timeout_s=5)
    local_hub.stop()
    requests_before = len(local_hub.requests)
    started = time.monotonic()
    second = resolve_model("acme/tiny-llama-bnb-4bit", hub_timeout_s=5)
    assert time.monotonic() - started < 0.5
    assert len(local_hub.requests) == requests_before
    assert second.source is ModelSource.HUB
    assert second.checkpoint_bytes_by_dtype == first.checkpoint_bytes_by_dtype
    stored = list(
        (tmp_path / "llmmem-cache" / "hub").glob("*/found/acme--tiny-llama-bnb-4bit.json")
    )
    assert len(stored) == 1
    # offline, and with the hub switched off, the copy on disk is still used
    assert resolve_model("acme/tiny-llama-bnb-4bit", hub=False).source is ModelSource.HUB


def test_stale_disk_copy_is_used_when_the_hub_is_unreachable(
    local_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_hub.add_repo("acme/tiny-llama", {"config.json": json.dumps(TINY_LLAMA).encode()})
    resolve_model("acme/tiny-llama", hub_timeout_s=5)
    stored = next((tmp_path / "llmmem-cache" / "hub").glob("*/found/acme--tiny-llama.json"))
    entry = json.loads(stored.read_text())
    entry["expires_at"] = time.time() - 1
    stored.write_text(json.dumps(entry))
    local_hub.stop()
    spec = resolve_model("acme/tiny-llama", hub_timeout_s=1)
    assert spec.source is ModelSource.HUB
    assert any("earlier hub lookup" in note for note in spec.notes)


CORRUPT_CACHE_TEXTS = [
    "",
    '{"format": 1, "repo_id": ',
    "[]",
    "null",
    '{"repo_id": 3}',
    "[" * 100_000,
]


@pytest.mark.parametrize("text", CORRUPT_CACHE_TEXTS)
def test_a_corrupt_disk_copy_reads_as_no_copy(tmp_path: Path, text: str) -> None:
    cache = hub_module.HubCache(tmp_path)
    now = time.time()
    cache.write(
        hub_module.HubModelFiles(
            repo_id="acme/tiny-llama",
            endpoint="https://hub.test",
            config_url="https://hub.test/acme/tiny-llama/resolve/main/config.json",
            config=TINY_LLAMA,
            fetched_at=now,
            expires_at=now + 60,
        )
    )
    cache.write_failure(
        hub_module.HubLookupFailure(
            repo_id="acme/other", endpoint="https://hub.test", reason="404", failed_at=now
        )
    )
    assert cache.read("https://hub.test", "acme/tiny-llama") is not None
    assert cache.read_failure("https://hub.test", "acme/other") is not None
    for stored in tmp_path.glob("*/*/*.json"):
        stored.write_text(text)
    assert cache.read("https://hub.test", "acme/tiny-llama") is None
    assert cache.read_failure("https://hub.test", "acme/other") is None


def test_a_disk_copy_of_the_wrong_shape_reads_as_no_copy(tmp_path: Path) -> None:
    cache = hub_module.HubCache(tmp_path)
    now = time.time()
    files = hub_module.HubModelFiles(
        repo_id="acme/tiny-llama",
        endpoint="https://hub.test",
        config_url="https://hub.test/acme/tiny-llama/resolve/main/config.json",
        config=TINY_LLAMA,
        checkpoint_bytes_by_dtype={"BF16": 1024},
        checkpoint_bytes_status="read",
        fetched_at=now,
        expires_at=now + 60,
    )
    cache.write(files)
    (stored,) = tmp_path.glob("*/found/*.json")
    good = json.loads(stored.read_text())
    assert cache.read("https://hub.test", "acme/tiny-llama") == dataclasses.replace(
        files, served_from_disk=True
    )
    for key, value in [
        ("config", ["not", "an", "object"]),
        ("checkpoint_bytes_by_dtype", {"BF16": "1 KiB"}),
        ("checkpoint_bytes_status", "maybe"),
        ("expires_at", "tomorrow"),
        ("repo_id", None),
    ]:
        stored.write_text(json.dumps({**good, key: value}))
        assert cache.read("https://hub.test", "acme/tiny-llama") is None, key
    del good["config_url"]
    stored.write_text(json.dumps(good))
    assert cache.read("https://hub.test", "acme/tiny-llama") is None


def test_a_corrupt_disk_copy_falls_through_cleanly(local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub.add_repo("acme/tiny-llama", {"config.json": json.dumps(TINY_LLAMA).encode()})
    resolve_model("acme/tiny-llama", hub_timeout_s=5)
    stored = next((tmp_path / "llmmem-cache" / "hub").glob("*/found/acme--tiny-llama.json"))
    stored.write_text('{"format": 1, "repo_id": "acme/tiny-llama", "config": 7}')
    local_hub.stop()
    with pytest.raises(ModelResolutionError, match="hub: lookups are off"):
        resolve_model("acme/tiny-llama", hub=False)


def test_slow_hub_falls_through_within_the_timeout(local_hub: LocalHub, tmp_path: Path) -> None:
    local_hub.add_repo("acme/slow-llama-8B", {"config.json": json.dumps(TINY_LLAMA).encode()})
    local_hub.delay_s = 2.0
    timeout_s = 0.5
    started = time.monotonic()
    spec = resolve_model("acme/slow-llama-8B", hub_timeout_s=timeout_s)
    elapsed = time.monotonic() - started
    assert elapsed < timeout_s + 1.5
    assert spec.source is ModelSource.GUESS
    assert any("no answer within 0.5 s" in note for note in spec.notes)
    # the lookup goes on in the background and leaves its answer on disk for the next call
    stored = tmp_path / "llmmem-cache" / "hub"
    deadline = time.monotonic() + 5
    while not list(stored.glob("*/found/acme--slow-llama-8B.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert resolve_model("acme/slow-llama-8B", hub=False).source is ModelSource.HUB


def test_slow_safetensors_headers_do_not_hold_back_the_config(
    local_hub: LocalHub, tmp_path: Path
) -> None:
    local_hub.add_repo("acme/tiny-llama-bnb-4bit", bnb_4bit_repo_files())
    local_hub.delay_s = 1.0
    local_hub.delayed_suffix = ".safetensors"
    started = time.monotonic()
    spec = resolve_model("acme/tiny-llama-bnb-4bit", hub_timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + 1.5
    assert spec.source is ModelSource.HUB
    assert spec.checkpoint_bytes_by_dtype is None
    assert any("not read yet" in note for note in spec.notes)
    # the headers arrive in the background; the next lookup has them
    stored = next(
        (tmp_path / "llmmem-cache" / "hub").glob("*/found/acme--tiny-llama-bnb-4bit.json")
    )
    deadline = time.monotonic() + 5
    while '"checkpoint_bytes_status":"read"' not in stored.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    later = resolve_model("acme/tiny-llama-bnb-4bit", hub=False)
    assert later.checkpoint_bytes_by_dtype == bytes_by_dtype(*BNB_SHARDS.values())


@pytest.mark.parametrize("offline_value", ["1", "true", "TRUE"])
def test_offline_env_sends_no_request(
    local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch, offline_value: str
) -> None:
    local_hub.add_repo("acme/tiny-llama-1B", {"config.json": json.dumps(TINY_LLAMA).encode()})
    monkeypatch.setenv("HF_HUB_OFFLINE", offline_value)
    spec = resolve_model("acme/tiny-llama-1B")
    assert spec.source is ModelSource.GUESS
    assert local_hub.requests == []


def test_hub_false_sends_no_request(local_hub: LocalHub) -> None:
    local_hub.add_repo("acme/tiny-llama", {"config.json": json.dumps(TINY_LLAMA).encode()})
    with pytest.raises(ModelResolutionError, match="hub: lookups are off"):
        resolve_model("acme/tiny-llama", hub=False)
    assert local_hub.requests == []


def test_not_found_falls_through_and_is_not_retried_at_once(local_hub: LocalHub) -> None:
    with pytest.raises(ModelResolutionError) as caught:
        resolve_model("acme/missing-model", hub_timeout_s=5)
    assert "hub: the repository has no config.json (HTTP 404)" in str(caught.value)
    assert len(local_hub.requests) == 1
    # the failure is remembered: no second request, the reason is still given
    with pytest.raises(ModelResolutionError, match="retried after 10 min"):
        resolve_model("acme/missing-model", hub_timeout_s=5)
    assert len(local_hub.requests) == 1
    # a name with a size falls through to a guess
    spec = resolve_model("acme/missing-7b", hub_timeout_s=5)
    assert spec.source is ModelSource.GUESS


def test_gated_repo_reason_and_token(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> None:
    local_hub.gated.add("acme/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    with pytest.raises(ModelResolutionError) as caught:
        resolve_model("acme/gated", hub_timeout_s=5)
    assert "gated" in str(caught.value)
    assert "hf_secret_value" not in str(caught.value)
    assert local_hub.authorizations == ["Bearer hf_secret_value"]


def test_unreachable_hub_falls_through_to_a_guess() -> None:
    # HF_ENDPOINT points at a closed port (see isolated_environment)
    spec = resolve_model("my-org/cool-llama-8B-sft", hub_timeout_s=2)
    assert spec.source is ModelSource.GUESS
    assert any("unreachable" in note for note in spec.notes)


# --- 4. the bundled catalog ----------------------------------------------------------------------


def test_catalog() -> None:
    from llmmem.models.catalog import catalog_entry, catalog_ids

    model_id = next(iter(catalog_ids()))
    entry = catalog_entry(model_id)
    assert entry is not None
    spec = resolve_model(model_id, hub=False)
    assert spec.source is ModelSource.CATALOG
    assert spec.source_detail == "bundled catalog"
    assert spec.model_id == entry.model_id


def test_unknown_model_lists_close_matches() -> None:
    from llmmem.models.catalog import catalog_ids

    model_id = next(iter(catalog_ids()))
    misspelled = model_id[:-1] + ("x" if model_id[-1] != "x" else "y")
    with pytest.raises(ModelResolutionError) as caught:
        resolve_model(misspelled, hub=False)
    message = str(caught.value)
    assert "close matches:" in message
    assert model_id in caught.value.close_matches
    assert "model_config=" in message
    assert "\n" not in message


# --- 5. a guess from the name ---------------------------------------------------------------------


def test_guess_8b() -> None:
    spec = resolve_model("my-org/cool-llama-8B-sft", hub=False)
    assert spec.source is ModelSource.GUESS
    assert spec.is_guess
    assert abs(spec.total_params / 8e9 - 1) < 0.05
    assert spec.source_detail.startswith("guessed from '8B' in the name; the shapes of meta-llama/")
    assert spec.source_detail.endswith("(Llama family)")
    assert spec.vocab_size == 128256  # a Llama 3 of 8B: the nearest Llama the catalog has
    assert any("only the family (Llama) and the size '8B' are known" in n for n in spec.notes)


@pytest.mark.parametrize(
    ("ref", "params"),
    [
        ("someone/tiny-135M-chat", 135e6),
        ("someone/model-0.5B", 0.5e9),
        ("someone/model-1.5b-instruct", 1.5e9),
        ("someone/model-3b", 3e9),
        ("someone/model-7b-v0.1", 7e9),
        ("someone/model-13B", 13e9),
        ("someone/model-70B-Instruct", 70e9),
        ("someone/model-200B", 200e9),
    ],
)
def test_guess_sizes(ref: str, params: float) -> None:
    spec = resolve_model(ref, hub=False)
    assert spec.source is ModelSource.GUESS
    assert abs(spec.total_params / params - 1) < 0.10


def test_guess_mixture_of_experts() -> None:
    spec = resolve_model("someone/mixture-8x7B-instruct", hub=False)
    assert spec.source is ModelSource.GUESS
    assert spec.num_experts == 8
    assert spec.experts_per_token == 2
    assert abs(spec.total_params / 46.7e9 - 1) < 0.05  # Mixtral-8x7B


@pytest.mark.parametrize(
    ("ref", "text"),
    [
        ("unsloth/llama-3-8b-bnb-4bit", "8b"),
        ("Qwen/Qwen2.5-7B-Instruct-1M", "7B"),
        ("Qwen/Qwen3-30B-A3B", "30B"),
        ("mistralai/Mixtral-8x22B-v0.1", "8x22B"),
        ("HuggingFaceTB/SmolLM2-135M", "135M"),
        ("mistralai/Mistral-7B-v0.1", "7B"),
        ("gpt2-medium", None),
        ("some/model-4bit-v0.1", None),
    ],
)
def test_size_from_name(ref: str, text: str | None) -> None:
    size = size_from_name(ref)
    assert (size.text if size else None) == text


def test_guess_shapes_are_the_published_models() -> None:
    for shape in LLAMA_SHAPES:
        spec = spec_from_config(llama_config(shape), model_id=shape.name, source=ModelSource.GUESS)
        assert abs(spec.total_params / shape.params - 1) < 0.01, shape.name


def test_unknown_without_size_is_an_error() -> None:
    with pytest.raises(ModelResolutionError, match="unknown model 'acme/zzqqv'.*no size like '8B'"):
        resolve_model("acme/zzqqv", hub=False)


# --- safe to call from an editor -----------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    ["", "   ", "'", "a" * 500, "../../nowhere/model", "org/na me", "C:\\models\\x", "a/b/c/d"],
)
def test_only_resolution_errors_escape(ref: str) -> None:
    with pytest.raises(ModelResolutionError):
        resolve_model(ref, hub_timeout_s=1)


def test_normalize_ref() -> None:
    assert normalize_ref(" 'https://huggingface.co/org/name/tree/main' ") == "org/name"
    assert normalize_ref("hf://org/name") == "org/name"
    assert normalize_ref("./local/dir") == "./local/dir"


def test_import_does_not_load_torch_transformers_or_the_hub_client() -> None:
    code = (
        "import sys, llmmem.models.resolve; "
        "loaded = {'torch', 'transformers', 'huggingface_hub'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

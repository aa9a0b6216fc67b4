"""Local folders, Hugging Face cache snapshots, adapter folders and re-uploads: each read the way
the training run reads it (its own config.json where it is here), else mapped to the model its
path names, and said so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmmem.models.model_paths import bundled_model_named_by, hub_id_of_cache_path
from llmmem.models.resolve import ModelResolutionError, resolve_model
from llmmem.models.spec import ModelSource

# a config no bundled model has (6 layers of 320): a spec with these shapes was read from it
ODD_QWEN2: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 320,
    "intermediate_size": 1024,
    "num_hidden_layers": 6,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}
QWEN25_7B_PARAMS = 7_615_616_512
COMMIT = "a09a35458c702b33eeacc393d103063234e8bc28"


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty HF cache of the test's own, no token, and a hub on a closed port."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LLMMEM_CACHE_DIR", str(tmp_path / "llmmem-cache"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


def hf_snapshot(cache: Path, repo_id: str, config: dict[str, Any]) -> Path:
    """A repository as huggingface_hub lays it out: blobs, a snapshot of links, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    blob = repo / "blobs" / "3f1a2b"
    blob.write_text(json.dumps(config))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(Path("..", "..", "blobs", blob.name))
    return snapshot


# --- paths that are here: their own config -------------------------------------------------------


def test_an_hf_cache_snapshot_path_is_sized_from_its_config(tmp_path: Path) -> None:
    # a snapshot in some other cache (a shared disk), named after a bundled model: its own
    # config.json wins over the catalog's Qwen2.5-7B-Instruct
    snapshot = hf_snapshot(tmp_path / "shared-cache", "Qwen/Qwen2.5-7B-Instruct", ODD_QWEN2)
    spec = resolve_model(str(snapshot), hub=False)
    assert spec.source is ModelSource.LOCAL
    assert spec.source_detail == str(snapshot / "config.json")
    assert (spec.hidden_size, spec.num_layers) == (320, 6)
    assert spec.total_params < 100_000_000


def test_a_local_folder_named_like_a_bundled_model_is_sized_from_its_config(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "models" / "Qwen2.5-7B-Instruct"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(ODD_QWEN2))
    spec = resolve_model("models/Qwen2.5-7B-Instruct", hub=False, base_dir=tmp_path)
    assert spec.source is ModelSource.LOCAL
    assert spec.source_detail == str(folder / "config.json")
    assert (spec.hidden_size, spec.num_layers) == (320, 6)


def test_a_peft_adapter_folder_is_sized_as_its_base_model(tmp_path: Path) -> None:
    adapter = tmp_path / "outputs" / "checkpoint-500"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct",
                "r": 16,
                "target_modules": ["q_proj", "v_proj"],
            }
        )
    )
    spec = resolve_model(str(adapter), hub=False)
    assert spec.source is ModelSource.CATALOG
    assert spec.model_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.total_params == QWEN25_7B_PARAMS
    assert any(
        "PEFT adapter folder" in note and "Qwen/Qwen2.5-7B-Instruct" in note for note in spec.notes
    )

    # an adapter over a base in a local folder: the base's own config
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(ODD_QWEN2))
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    local = resolve_model(str(adapter), hub=False)
    assert local.source is ModelSource.LOCAL and local.num_layers == 6


def test_an_adapter_that_names_no_base_says_so(tmp_path: Path) -> None:
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA"}))
    with pytest.raises(ModelResolutionError, match="names no base model"):
        resolve_model(str(adapter), hub=False)


def test_an_adapter_naming_itself_stops(tmp_path: Path) -> None:
    adapter = tmp_path / "loop"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(adapter)})
    )
    with pytest.raises(ModelResolutionError, match="steps already"):
        resolve_model(str(adapter), hub=False)


# --- paths that are not here: the model they name -----------------------------------------------


def test_a_snapshot_path_from_another_machine_reads_as_its_hub_id() -> None:
    ref = f"/home/alice/.cache/huggingface/hub/models--Qwen--Qwen2.5-7B-Instruct/snapshots/{COMMIT}"
    spec = resolve_model(ref, hub=False)
    assert spec.source is ModelSource.CATALOG
    assert spec.model_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.total_params == QWEN25_7B_PARAMS
    assert any("Hugging Face cache's folder of Qwen/Qwen2.5-7B-Instruct" in n for n in spec.notes)


def test_a_snapshot_path_from_another_machine_finds_the_model_in_this_cache(
    tmp_path: Path,
) -> None:
    # the same model is in this machine's cache (HF_HUB_CACHE): read from there, as the run would
    snapshot = hf_snapshot(tmp_path / "hf-cache", "acme/odd-qwen", ODD_QWEN2)
    spec = resolve_model(f"/mnt/other/hub/models--acme--odd-qwen/snapshots/{COMMIT}", hub=False)
    assert spec.source is ModelSource.CACHE
    assert spec.source_detail == str(snapshot / "config.json")
    assert spec.num_layers == 6


@pytest.mark.parametrize(
    "ref",
    [
        "models/Qwen2.5-7B-Instruct",
        "./models/Qwen2.5-7B-Instruct/",
        "/data/llm/Qwen2.5-7B-Instruct",
        "/data/Qwen/Qwen2.5-7B-Instruct/config.json",
        "C:\\models\\Qwen2.5-7B-Instruct",
        "~/weights/qwen2.5-7b-instruct",
    ],
)
def test_a_missing_folder_named_after_a_bundled_model_is_that_model(ref: str) -> None:
    spec = resolve_model(ref, hub=False)
    assert spec.source is ModelSource.CATALOG
    assert spec.model_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.total_params == QWEN25_7B_PARAMS
    assert any("names Qwen/Qwen2.5-7B-Instruct" in note for note in spec.notes)


def test_an_empty_folder_named_after_a_bundled_model_is_that_model(tmp_path: Path) -> None:
    (tmp_path / "Meta-Llama-3.1-8B").mkdir()
    spec = resolve_model(str(tmp_path / "Meta-Llama-3.1-8B"), hub=False)
    assert spec.model_id == "meta-llama/Llama-3.1-8B"
    assert any("has no config.json here" in note for note in spec.notes)


def test_a_bnb_4bit_reupload_is_its_base_quantized() -> None:
    spec = resolve_model("unsloth/Qwen2.5-7B-Instruct-bnb-4bit", hub=False)
    assert spec.model_id == "Qwen/Qwen2.5-7B-Instruct"
    assert spec.total_params == QWEN25_7B_PARAMS
    quant = spec.checkpoint_quantization
    assert quant is not None and (quant.method, quant.bits, quant.quant_type) == (
        "bitsandbytes",
        4,
        "nf4",
    )


def test_a_folder_named_after_no_model_is_still_unknown() -> None:
    with pytest.raises(ModelResolutionError, match="unknown model"):
        resolve_model("outputs/my-finetune", hub=False)


@pytest.mark.parametrize(
    ("ref", "hub_id"),
    [
        (
            "/root/.cache/huggingface/hub/models--google--gemma-2b-it/snapshots/abc",
            "google/gemma-2b-it",
        ),
        ("C:\\Users\\a\\.cache\\huggingface\\hub\\models--gpt2\\snapshots\\abc", "gpt2"),
        ("hub/models--Qwen--Qwen2.5-7B/blobs", "Qwen/Qwen2.5-7B"),
        ("models/Qwen2.5-7B", None),
        ("my-models--are-here/x", None),
    ],
)
def test_hub_id_of_cache_path(ref: str, hub_id: str | None) -> None:
    assert hub_id_of_cache_path(ref) == hub_id


def test_bundled_model_named_by_wants_the_whole_last_part() -> None:
    assert bundled_model_named_by("models/Qwen2.5-7B-Instruct-sft") is None
    assert bundled_model_named_by("") is None
    named = bundled_model_named_by("unsloth/DeepSeek-R1-Distill-Qwen-7B")
    assert named is not None and named.model_id == "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"


# --- with the hub (a hub on 127.0.0.1) ------------------------------------------------------------


@pytest.fixture
def hub_serving(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, bytes], list[str]]]:
    """A hub on 127.0.0.1 serving `/{repo}/resolve/main/config.json` from the dict it yields,
    404 for anything else; the second item lists the paths asked for."""
    files: dict[str, bytes] = {}
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            asked.append(self.path)
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            if body is None:
                self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    host, port = server.server_address[:2]
    monkeypatch.setenv("HF_ENDPOINT", f"http://{host}:{port}")
    yield files, asked
    server.shutdown()
    server.server_close()


def test_a_snapshot_path_from_another_machine_is_read_from_the_hub_with_hub_on(
    hub_serving: tuple[dict[str, bytes], list[str]],
) -> None:
    files, asked = hub_serving
    files["/acme/odd-qwen/resolve/main/config.json"] = json.dumps(ODD_QWEN2).encode()
    ref = f"/home/alice/.cache/huggingface/hub/models--acme--odd-qwen/snapshots/{COMMIT}"
    spec = resolve_model(ref, hub=True, hub_timeout_s=5)
    assert spec.source is ModelSource.HUB
    assert spec.model_id == "acme/odd-qwen" and spec.num_layers == 6
    assert "/acme/odd-qwen/resolve/main/config.json" in asked
    assert any("Hugging Face cache's folder of acme/odd-qwen" in note for note in spec.notes)


def test_a_missing_folder_is_asked_of_the_hub_then_named_by_its_last_part(
    hub_serving: tuple[dict[str, bytes], list[str]],
) -> None:
    _, asked = hub_serving
    spec = resolve_model("models/Qwen2.5-7B-Instruct", hub=True, hub_timeout_s=5)
    assert asked and asked[0].startswith("/models/Qwen2.5-7B-Instruct/")  # a hub id it could be
    assert spec.source is ModelSource.CATALOG
    assert spec.model_id == "Qwen/Qwen2.5-7B-Instruct"


# --- what the user runs ---------------------------------------------------------------------------


def explain_json(script: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "llmmem", "explain", "--format", "json", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=script.parent,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_explain_sizes_a_script_from_the_snapshot_and_the_folder_it_names(tmp_path: Path) -> None:
    snapshot = hf_snapshot(tmp_path / "elsewhere", "Qwen/Qwen2.5-7B-Instruct", ODD_QWEN2)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    for name, where in [("snapshot", str(snapshot)), ("missing", "models/Qwen2.5-7B-Instruct")]:
        script = tmp_path / f"train_{name}.py"
        script.write_text(
            "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
            f"model = AutoModelForCausalLM.from_pretrained({where!r})\n"
            "args = TrainingArguments(output_dir='out', per_device_train_batch_size=1)\n"
            "Trainer(model=model, args=args).train()\n"
        )
        model = explain_json(script, env)["budget"]["model"]
        if name == "snapshot":
            assert model["source"] == "local"
            assert model["source_detail"] == str(snapshot / "config.json")
        else:
            assert model["source"] == "catalog"
            assert model["id"] == "Qwen/Qwen2.5-7B-Instruct"
            assert model["params"] == QWEN25_7B_PARAMS
        assert model["is_guess"] is False

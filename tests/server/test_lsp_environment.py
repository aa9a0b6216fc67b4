"""The server against its surroundings: a (slow) hub, a GPU on the machine, YAML configs, and
the verify command. Each test starts its own server with the environment it needs."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from lsp_helpers import (
    SERVER_ENV,
    apply_lsp_edits,
    make_client,
    open_document,
    options,
    published,
    resolved,
    start,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

REPO = Path(__file__).resolve().parents[2]
LLAMA_3B_CONFIG = (REPO / "tests" / "models" / "configs" / "llama-3.2-3b.json").read_bytes()
AXOLOTL = (REPO / "tests" / "fixtures" / "configs" / "axolotl_qlora.yml").read_text()


async def server_with(env: dict[str, str]) -> LanguageClient:
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "llmmem_lsp"],
        server_env={**SERVER_ENV, **env},
        client_factory=make_client,
    )
    return await config.start()  # type: ignore[return-value]


@pytest_asyncio.fixture
async def stopper() -> AsyncIterator[list[LanguageClient]]:
    started: list[LanguageClient] = []
    yield started
    for client in started:
        await client.shutdown_session()


class SlowHub:
    """`/{repo}/resolve/main/config.json` after a delay; records when it answered."""

    def __init__(self, files: dict[str, bytes], delay_s: float) -> None:
        self.files, self.delay_s = files, delay_s
        self.answered_at: list[float] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
                time.sleep(hub.delay_s)
                body = hub.files.get(self.path)
                try:
                    if body is None:
                        self.send_response(404)
                        self.send_header("X-Error-Code", "EntryNotFound")
                        body = b"not found"
                    else:
                        self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass
                hub.answered_at.append(time.monotonic())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


HOUSE_MODEL = """from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("acme/house-model")
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4, bf16=True)
"""


@pytest.mark.asyncio
async def test_a_slow_hub_never_holds_the_editor_and_its_answer_lands_later(
    workdir: Path, stopper: list[LanguageClient]
) -> None:
    hub = SlowHub({"/acme/house-model/resolve/main/config.json": LLAMA_3B_CONFIG}, delay_s=1.5)
    try:
        env = {
            "HF_ENDPOINT": hub.endpoint,
            "HF_HUB_OFFLINE": "0",
            "HF_HOME": str(workdir / "hf-home"),
            "HF_HUB_CACHE": str(workdir / "hf-cache"),
            "LLMMEM_CACHE_DIR": str(workdir / "llmmem-cache"),
        }
        client = await server_with(env)
        stopper.append(client)
        await start(client, "visual_studio_code", init=options(gpu="A100-80GB", hub=True))
        uri = open_document(client, workdir / "train.py", HOUSE_MODEL)

        await wait_until(lambda: any(p.uri == uri for p in published(client)))
        first_at = time.monotonic()
        first = [p for p in published(client) if p.uri == uri][0].diagnostics
        assert [d.code for d in first] == ["LLM010"]  # not sized yet: says so, does not wait
        assert not hub.answered_at or first_at < hub.answered_at[0]

        def sized() -> bool:
            last = [p for p in published(client) if p.uri == uri][-1].diagnostics
            return "LLM010" not in [d.code for d in last]

        await wait_until(sized, timeout=30)
        hover = await client.text_document_hover_async(
            types.HoverParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=2, character=55),
            )
        )
        assert hover is not None
        assert "**acme/house-model**" in str(hover.contents)
        assert "From: hub (" in str(hover.contents)
    finally:
        hub.stop()


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "0, NVIDIA L4, 23034, 22700"
"""


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
@pytest.mark.asyncio
async def test_with_no_gpu_set_the_machines_gpu_is_used(
    workdir: Path, stopper: list[LanguageClient]
) -> None:
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    client = await server_with({"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    stopper.append(client)
    await start(client, "visual_studio_code", init={"hub": False})
    uri = open_document(
        client,
        workdir / "train.py",
        HOUSE_MODEL.replace("acme/house-model", "meta-llama/Llama-3.1-8B"),
    )

    def on_l4() -> bool:
        return any(
            "Will not fit L4" in d.message
            for p in published(client)
            if p.uri == uri
            for d in p.diagnostics
        )

    await wait_until(on_l4)


@pytest.mark.asyncio
async def test_axolotl_yaml_gets_diagnostics_and_hovers_on_its_keys(
    client: LanguageClient, workdir: Path
) -> None:
    await start(client, "visual_studio_code", init=options(gpu="T4"))
    config = AXOLOTL.replace("micro_batch_size: 4", "micro_batch_size: 16")
    uri = open_document(client, workdir / "qlora.yml", config, language="yaml")
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    diagnostics = [p for p in published(client) if p.uri == uri][-1].diagnostics
    assert any(d.code == "LLM001" and "T4" in d.message for d in diagnostics)
    line = config.splitlines().index("micro_batch_size: 16")
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=3),  # on the key
        )
    )
    assert hover is not None and "on T4" in str(hover.contents)
    lora = config.splitlines().index("lora_r: 64")
    lora_hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=lora, character=2),
        )
    )
    assert lora_hover is not None and "**LoRA** r = 64" in str(lora_hover.contents)
    # the batch fix edits the YAML key where it stands
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0),
                end=types.Position(line=len(config.splitlines()), character=0),
            ),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    halve = next(
        a
        for a in actions or []
        if isinstance(a, types.CodeAction) and a.title.startswith("Halve the micro-batch")
    )
    halve = await resolved(client, halve)
    assert halve.edit is not None and halve.edit.document_changes
    change = halve.edit.document_changes[0]
    assert isinstance(change, types.TextDocumentEdit)
    edited_lines = {edit.range.start.line for edit in change.edits}
    assert line in edited_lines
    edited = apply_lsp_edits(config, [e for e in change.edits if isinstance(e, types.TextEdit)])
    document = yaml.safe_load(edited)
    # axolotl's own keys: half the micro-batch, twice the accumulation (2 in the file)
    assert document["micro_batch_size"] == 8
    assert document["gradient_accumulation_steps"] == 4
    assert edited.count("gradient_accumulation_steps") == 1


TINY_SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, bf16=True)
# llmmem: seq=128
"""


@pytest.mark.asyncio
async def test_verify_simulates_reports_progress_and_joins_the_hover(
    client: LanguageClient, workdir: Path
) -> None:
    from llmmem.verify.grid import SMALL_CONFIGS

    (workdir / "tiny").mkdir()
    (workdir / "tiny" / "config.json").write_text(json.dumps(SMALL_CONFIGS["llama"]))
    await start(client, "visual_studio_code")
    uri = open_document(client, workdir / "train.py", TINY_SCRIPT)
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    outcome = await asyncio.wait_for(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="llmmem.verify", arguments=[uri, {"simulate": True}])
        ),
        timeout=240,
    )
    assert outcome["ok"] is True, outcome
    assert outcome["message"].startswith("simulated: ")
    rows = {row["what"] for row in outcome["report"]["comparison"]}
    assert {"forward peak", "backward peak", "allocated peak"} <= rows
    # progress began and ended around the run, and the user was told the result
    kinds = [
        getattr(value, "kind", None)
        for values in client.progress_reports.values()
        for value in values
    ]
    assert kinds[0] == "begin" and kinds[-1] == "end"
    assert any(outcome["message"] in m.message for m in client.messages)
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=4, character=10),
        )
    )
    assert hover is not None and "**Verified** (simulated" in str(hover.contents)

    # on this machine's default device (CUDA) the answer says what to do instead
    default = await asyncio.wait_for(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="llmmem.verify", arguments=[uri])
        ),
        timeout=240,
    )
    if not default["ok"]:
        assert "--simulate" in default["message"]
    unknown = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="llmmem.verify", arguments=["file:///nowhere.py"])
    )
    assert unknown == {"ok": False, "message": "not an open document: file:///nowhere.py"}


@pytest.mark.asyncio
async def test_a_shell_launcher_gets_hovers_on_its_flags(
    client: LanguageClient, workdir: Path
) -> None:
    launcher = (REPO / "tests" / "fixtures" / "shell" / "launch_trl.sh").read_text()
    launcher = launcher.replace(
        "--per_device_train_batch_size=2", "--per_device_train_batch_size=64"
    )
    await start(client, "visual_studio_code", init=options(gpu="T4"))
    uri = open_document(client, workdir / "launch.sh", launcher, language="shellscript")
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    line = next(i for i, text in enumerate(launcher.splitlines()) if "batch_size=64" in text)
    column = launcher.splitlines()[line].index("per_device")
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=column + 3),
        )
    )
    assert hover is not None and "on T4" in str(hover.contents)
    diagnostics = [p for p in published(client) if p.uri == uri][-1].diagnostics
    assert any(d.code == "LLM001" for d in diagnostics)


# -- one slow document does not hold up the others ---------------------------------------------

# about four million steps of the script reader: many seconds, unless the analysis is abandoned
SLOW_SCRIPT = (
    "from transformers import AutoModelForCausalLM\n"
    'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
    "def grow(a, b=2):\n" + "    a = a * b + 1\n" * 6000 + "    return a\n" + "grow(1)\n" * 300
)
QUICK_SCRIPT = (
    "from transformers import AutoModelForCausalLM, TrainingArguments\n"
    'model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")\n'
    'args = TrainingArguments(output_dir="out", per_device_train_batch_size=2)\n'
)


@pytest.mark.asyncio
async def test_an_analysis_past_its_timeout_is_abandoned_and_shutdown_answers(
    tmp_path: Path,
) -> None:
    (tmp_path / ".git").mkdir()
    # the reader's step bound raised far past what the slow script needs: only the timeout
    # per analysis can stop it
    client = await server_with({"LLMMEM_MAX_STEPS": "1000000000"})
    shut_down = False
    try:
        await start(client, "visual_studio_code", options(gpu="RTX-4090", analysisTimeoutSeconds=1))
        slow = open_document(client, tmp_path / "slow.py", SLOW_SCRIPT)
        quick = open_document(client, tmp_path / "quick.py", QUICK_SCRIPT)
        await wait_until(lambda: quick in client.diagnostics, timeout=8)
        await wait_until(lambda: slow in client.diagnostics, timeout=8)
        (stopped,) = client.diagnostics[slow]
        assert "took longer than 1 s and was stopped" in stopped.message
        assert "analysisTimeoutSeconds" in stopped.message

        # an edit starts another long analysis; shutdown is answered meanwhile, exit ends it
        slow_again = open_document(client, tmp_path / "slow_again.py", SLOW_SCRIPT + "\n")
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await asyncio.wait_for(client.shutdown_session(), 5)
        shut_down = True
        assert time.monotonic() - started < 5
        assert slow_again not in client.diagnostics
    finally:
        if not shut_down:
            await client.shutdown_session()

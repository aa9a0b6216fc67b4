"""Helpers for the language server tests: documents, edits, waiting on the server."""

from __future__ import annotations

import asyncio
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.protocol import default_converter
from pytest_lsp import LanguageClient, client_capabilities

SERVER_ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",  # nothing in these tests may reach the network
    "PYTHONUNBUFFERED": "1",
    "LLMMEM_CACHE_DIR": tempfile.mkdtemp(prefix="llmmem-lsp-tests-"),
}

NOT_FITTING = '''"""Full fine-tuning of Llama-3.1-8B on one GPU."""
import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained(
    "meta-llama/Llama-3.1-8B",
    torch_dtype=torch.bfloat16,
)
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=8,
    gradient_accumulation_steps=2,
    bf16=True,
    optim="adamw_torch",
)
trainer = Trainer(model=model, args=args)
trainer.train()
'''

FITTING_LORA = '''"""LoRA on Qwen2.5-0.5B."""
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"]))
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=2,
    bf16=True,
)
'''


def uri_of(path: Path) -> str:
    return path.resolve().as_uri()


def options(**extra: Any) -> dict[str, Any]:
    """initializationOptions: no GPU detection (tests must not depend on the machine)."""
    return {"detectGpu": False, "hub": False, **extra}


async def start(
    client: LanguageClient,
    capabilities: str,
    init: dict[str, Any] | None = None,
    root: Path | None = None,
) -> None:
    params = types.InitializeParams(
        capabilities=client_capabilities(capabilities),
        initialization_options=init if init is not None else options(gpu="RTX-4090"),
        root_uri=root.resolve().as_uri() if root else None,
    )
    await client.initialize_session(params)


def open_document(
    client: LanguageClient, path: Path, text: str, language: str = "python", version: int = 1
) -> str:
    path.write_text(text, encoding="utf-8")
    uri = uri_of(path)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id=language, version=version, text=text
            )
        )
    )
    return uri


def replace_all(client: LanguageClient, uri: str, text: str, version: int) -> None:
    """One didChange that replaces the whole text (a range edit over everything)."""
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=0, character=0),
                        end=types.Position(line=10_000, character=0),
                    ),
                    text=text,
                )
            ],
        )
    )


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05
) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting for the server")
        await asyncio.sleep(interval)


def published(client: LanguageClient) -> list[types.PublishDiagnosticsParams]:
    return client.__dict__.setdefault("published_log", [])


def make_client() -> LanguageClient:
    """pytest-lsp's client, plus a log of every publishDiagnostics (with its version)."""
    from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features

    client = LanguageClient(converter_factory=default_converter)

    def on_diagnostics(client: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        client.diagnostics[params.uri] = params.diagnostics
        published(client).append(params)

    def on_request(method: str) -> Callable[[LanguageClient, Any], None]:
        def record(client: LanguageClient, params: Any) -> None:
            client.__dict__.setdefault("requests_log", []).append((method, params))

        return record

    features = {
        **DEFAULT_CLIENT_FEATURES,
        types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS: on_diagnostics,
        # what an editor answers, recorded
        types.CLIENT_REGISTER_CAPABILITY: on_request(types.CLIENT_REGISTER_CAPABILITY),
        types.WORKSPACE_CODE_LENS_REFRESH: on_request(types.WORKSPACE_CODE_LENS_REFRESH),
        types.WORKSPACE_INLAY_HINT_REFRESH: on_request(types.WORKSPACE_INLAY_HINT_REFRESH),
        types.WORKSPACE_DIAGNOSTIC_REFRESH: on_request(types.WORKSPACE_DIAGNOSTIC_REFRESH),
    }
    register_lsp_features(client, features)
    return client


async def resolved(client: LanguageClient, action: types.CodeAction) -> types.CodeAction:
    """The action with its edit, as an editor applies it: a quick fix comes without one to a
    client that resolves edits, and `codeAction/resolve` makes it."""
    if action.edit is None and action.data is not None:
        return await client.code_action_resolve_async(action)
    return action


def apply_lsp_edits(text: str, edits: list[types.TextEdit]) -> str:
    """The client's side of text edits (ASCII texts: columns are characters)."""
    from llmmem.rules.text_edits import offset

    spans = sorted(
        (
            (
                offset(text, e.range.start.line, e.range.start.character),
                offset(text, e.range.end.line, e.range.end.character),
                e.new_text,
            )
            for e in edits
        ),
        reverse=True,
    )
    for start_at, end_at, new_text in spans:
        text = text[:start_at] + new_text + text[end_at:]
    return text


SERVER_MODULE = [sys.executable, "-m", "llmmem_lsp"]
SERVER_SCRIPT = [str(Path(sys.executable).with_name("llmmem-lsp"))]  # the installed command


def frame(body: bytes, length: int | None = None) -> bytes:
    """A well-formed frame around `body` (with `length` as its Content-Length, if given)."""
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


class RawClient:
    """`python -m llmmem_lsp` (or another command) over stdio with Content-Length framed
    JSON-RPC written by hand, for requests a typed client refuses to send and bytes no client
    should send."""

    def __init__(
        self,
        cwd: Path | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        # the log goes to a file: a pipe no one reads while the server runs would fill up
        # (INFO logs each message sent) and block it
        self.log = tempfile.TemporaryFile()
        self.logged = ""
        self.process = subprocess.Popen(
            [*(command or SERVER_MODULE), "--log-level", "INFO"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=SERVER_ENV if env is None else env,
            cwd=cwd,
        )
        self.buffer = b""
        self.seen: list[dict[str, Any]] = []  # every message read, in order

    def write(self, data: bytes) -> None:
        """Bytes as they are, framed or not."""
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.write(frame(json.dumps({"jsonrpc": "2.0", **message}).encode()))

    def answer(self, ident: int | str | None, timeout: float = 5.0) -> dict[str, Any] | None:
        """The response with id `ident` (None: a null id), read now or before (None when none
        came within `timeout`)."""
        deadline = time.monotonic() + timeout
        for message in self.seen:
            if "method" not in message and message.get("id") == ident:
                self.seen.remove(message)
                return message
        while (message := self._next(deadline)) is not None:
            if "method" not in message and message.get("id") == ident:
                self.seen.remove(message)
                return message
        return None

    def _next(self, deadline: float) -> dict[str, Any] | None:
        assert self.process.stdout is not None
        while True:
            head, found, rest = self.buffer.partition(b"\r\n\r\n")
            if found:
                length = int(head.split(b"Content-Length:")[1].split(b"\r\n")[0])
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    parsed: dict[str, Any] = json.loads(rest[:length])
                    self.seen.append(parsed)
                    return parsed
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                return None
            self.buffer += chunk

    def request(self, ident: int, method: str, params: Any = None, timeout: float = 5.0) -> Any:
        """The answer to one request (None when none came within `timeout`)."""
        message: dict[str, Any] = {"id": ident, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        deadline = time.monotonic() + timeout
        while (answer := self._next(deadline)) is not None:
            if answer.get("id") == ident and "method" not in answer:
                return answer
        return None

    def notification(self, method: str, timeout: float) -> dict[str, Any] | None:
        """The next notification `method` the server sends (None when none came in time)."""
        deadline = time.monotonic() + timeout
        while (message := self._next(deadline)) is not None:
            if message.get("method") == method:
                return message
        return None

    def initialize(self) -> None:
        options = {"detectGpu": False, "hub": False}
        init = {"capabilities": {}, "initializationOptions": options}
        assert self.request(1, "initialize", init, timeout=30) is not None
        self.send({"method": "initialized", "params": {}})

    def close(self) -> str:
        """Ends the process if still running; returns what it logged."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)
        if not self.log.closed:
            self.log.seek(0)
            self.logged = self.log.read().decode(errors="replace")
            self.log.close()
        return self.logged

"""The server's lifecycle as a client sees it: a parse error for a body that is not JSON, an
exit when the editor's process is gone, `llmmem.verify` measuring the buffer (not the file on
disk), cancellable, importing nothing from the workspace, and a shutdown during a verify that is
quick and leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lsp_helpers import SERVER_ENV, RawClient, open_document, published, start, wait_until
from lsprotocol import types
from pytest_lsp import LanguageClient

TINY_SCRIPT = """import torch
from transformers import AutoModelForCausalLM, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("./tiny", dtype=torch.bfloat16)
args = TrainingArguments(output_dir="out", per_device_train_batch_size=2, bf16=True)
# llmmem: seq=128
"""

NOTHING_TO_VERIFY = "print('no training here')\n"


@pytest.fixture
def raw() -> Iterator[RawClient]:
    client = RawClient()
    yield client
    client.close()


def tiny_model(workdir: Path) -> None:
    from llmmem.verify.grid import SMALL_CONFIGS

    (workdir / "tiny").mkdir()
    (workdir / "tiny" / "config.json").write_text(json.dumps(SMALL_CONFIGS["llama"]))


# -- processes, read from /proc -------------------------------------------------------------


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state) of a process, None when there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1]), fields[0]


def running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] not in ("Z", "X")


def processes() -> dict[int, tuple[int, str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            found[int(entry.name)] = stat
    return found


def process_tree(root: int) -> set[int]:
    """`root` and the processes it started, and theirs."""
    table = processes()
    tree, grown = {root}, True
    while grown:
        more = {pid for pid, (parent, _) in table.items() if parent in tree} - tree
        grown = bool(more)
        tree |= more
    return tree


def verify_process(workdir: Path) -> int | None:
    """The `llmmem verify` process measuring a copy of a document in `workdir`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [part.decode(errors="replace") for part in command]
        if "verify" in words and any(w.startswith(str(workdir)) for w in words):
            if running(int(entry.name)):
                return int(entry.name)
    return None


def wait_for(predicate: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    return predicate()


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


# -- parse errors ---------------------------------------------------------------------------


def send_body(client: RawClient, body: bytes) -> dict[str, Any] | None:
    assert client.process.stdin is not None
    client.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    client.process.stdin.flush()
    return client._next(time.monotonic() + 1.0)


def test_a_body_that_is_not_json_gets_a_parse_error_with_its_id_or_null(raw: RawClient) -> None:
    raw.initialize()
    cut = b'{"jsonrpc": "2.0", "id": 5, "method": "textDocument/hover", "params": {'
    for body, ident in ((cut, 5), (b"\xff\xfe not json", None)):
        answer = send_body(raw, body)
        assert answer is not None, "no answer within 1 s"
        # the id where the body shows one (the client's request fails at once), else null
        assert answer["id"] == ident and answer["error"]["code"] == types.ErrorCodes.ParseError
    # JSON that is no JSON-RPC message: an invalid request (its id where it has one)
    answer = send_body(raw, b"[1, 2]")
    assert answer is not None and answer["id"] is None
    assert answer["error"]["code"] == types.ErrorCodes.InvalidRequest
    answer = send_body(raw, b'{"id": 7, "method": "shutdown"}')
    assert answer is not None and answer["id"] == 7
    assert answer["error"]["code"] == types.ErrorCodes.InvalidRequest
    # requests that break the envelope: each its error within 1 s
    broken = [
        (b'{"jsonrpc": "2.0", "id": 3, "method": 5}', 3, types.ErrorCodes.InvalidRequest),
        (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "shutdown"}', None, -32600),
        (b'{"jsonrpc": "1.0", "id": 4, "method": "shutdown"}', 4, -32600),
        (b'{"jsonrpc": "2.0", "id": 6, "method": "no/such"}', 6, types.ErrorCodes.MethodNotFound),
    ]
    for body, ident, code in broken:
        answer = send_body(raw, body)
        assert answer is not None, f"no answer within 1 s to {body!r}"
        assert answer["id"] == ident and answer["error"]["code"] == code, answer
    # a notification or a response that cannot be read is logged, not answered or shown
    assert send_body(raw, b'{"jsonrpc": "2.0", "method": "textDocument/didOpen"}') is None
    assert send_body(raw, b'{"jsonrpc": "2.0", "id": 70}') is None
    # the server carries on, and nothing was shown to the user or logged as a traceback
    assert raw.request(8, "shutdown", timeout=5) is not None
    raw.send({"method": "exit"})
    assert raw.process.wait(timeout=10) == 0
    log = raw.close()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert "window/showMessage" not in log


# -- the editor's process -------------------------------------------------------------------


def test_the_server_exits_when_the_editors_process_is_gone(raw: RawClient) -> None:
    # a process that ends when its stdin is closed
    editor = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    init = {
        "processId": editor.pid,
        "capabilities": {},
        "initializationOptions": {"detectGpu": False, "hub": False},
    }
    assert raw.request(1, "initialize", init, timeout=30) is not None
    raw.send({"method": "initialized", "params": {}})
    assert raw.request(2, "workspace/executeCommand", {"command": "llmmem.gpus"}) is not None
    time.sleep(1.5)  # more than the server's polling interval
    assert raw.process.poll() is None  # alive while the editor is
    assert editor.stdin is not None
    editor.stdin.close()
    editor.wait(timeout=10)
    # exit code 1: no shutdown came first
    assert raw.process.wait(timeout=5) == 1
    assert "is gone" in raw.close()


# -- verify ---------------------------------------------------------------------------------


async def verify_command(
    client: LanguageClient, uri: str, **options: Any
) -> asyncio.Task[dict[str, Any]]:
    return asyncio.ensure_future(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="llmmem.verify", arguments=[uri, options])
        )
    )


async def hover_text(client: LanguageClient, uri: str) -> str:
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=4, character=10),
        )
    )
    assert hover is not None
    return str(hover.contents)


@pytest.mark.asyncio
async def test_verify_measures_the_unsaved_buffer_and_its_table_leaves_with_an_edit(
    client: LanguageClient, workdir: Path
) -> None:
    tiny_model(workdir)
    await start(client, "visual_studio_code")
    path = workdir / "train.py"
    uri = open_document(client, path, TINY_SCRIPT)
    path.write_text(NOTHING_TO_VERIFY)  # on disk: nothing to verify; in the editor: a step
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    task = await verify_command(client, uri, simulate=True)
    outcome = await asyncio.wait_for(task, timeout=240)
    assert outcome["ok"] is True, outcome
    assert outcome["version"] == 1
    rows = {row["what"] for row in outcome["report"]["comparison"]}
    assert "allocated peak" in rows
    # the copy beside the document is gone, and the file on disk untouched
    assert sorted(p.name for p in workdir.iterdir()) == [".git", "tiny", "train.py"]
    assert path.read_text() == NOTHING_TO_VERIFY
    # progress was cancellable
    begins = [
        value
        for values in client.progress_reports.values()
        for value in values
        if getattr(value, "kind", None) == "begin"
    ]
    assert begins and begins[0].cancellable is True
    measured = await hover_text(client, uri)
    assert "**Verified** (" in measured and "version 1)" in measured
    # an edit: the hover no longer shows a table measured on another text
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=TINY_SCRIPT)],
        )
    )
    await wait_until(lambda: any(p.version == 2 for p in published(client)))
    assert "**Verified**" not in await hover_text(client, uri)


@pytest.mark.asyncio
async def test_a_cancelled_verify_ends_its_subprocess_within_2_s(
    client: LanguageClient, workdir: Path
) -> None:
    tiny_model(workdir)
    await start(client, "visual_studio_code")
    uri = open_document(client, workdir / "train.py", TINY_SCRIPT)
    await wait_until(lambda: any(p.uri == uri for p in published(client)))
    task = await verify_command(client, uri, simulate=True)
    await wait_until(lambda: verify_process(workdir) is not None, timeout=30, interval=0.02)
    pid = verify_process(workdir)
    assert pid is not None
    await wait_until(lambda: bool(client.progress_reports), timeout=10)
    tree = process_tree(pid)
    token = next(iter(client.progress_reports))
    client.protocol.notify(
        types.WINDOW_WORK_DONE_PROGRESS_CANCEL, types.WorkDoneProgressCancelParams(token=token)
    )
    cancelled_at = time.monotonic()
    await wait_until(lambda: not any(running(p) for p in tree), timeout=2, interval=0.02)
    assert time.monotonic() - cancelled_at < 2
    outcome = await asyncio.wait_for(task, timeout=5)
    assert outcome["ok"] is False and outcome.get("cancelled") is True
    assert not [p.name for p in workdir.iterdir() if "llmmem-verify" in p.name]


def test_a_cancelled_verify_request_and_a_shutdown_during_one_leave_no_process(
    workdir: Path,
) -> None:
    """$/cancelRequest on the command ends its subprocess; `shutdown` while another runs is
    answered at once, ends it, and the server exits 0 without a traceback."""
    tiny_model(workdir)
    client = RawClient()
    try:
        init = {
            "capabilities": {"window": {"workDoneProgress": True}},
            "initializationOptions": {"detectGpu": False, "hub": False},
        }
        assert client.request(1, "initialize", init, timeout=30) is not None
        client.send({"method": "initialized", "params": {}})
        uri = (workdir / "train.py").as_uri()
        (workdir / "train.py").write_text(TINY_SCRIPT)
        document = {"uri": uri, "languageId": "python", "version": 1, "text": TINY_SCRIPT}
        client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
        assert client.notification("textDocument/publishDiagnostics", timeout=60) is not None
        command = {"command": "llmmem.verify", "arguments": [uri, {"simulate": True}]}

        client.send({"id": 5, "method": "workspace/executeCommand", "params": command})
        create = client.notification("window/workDoneProgress/create", timeout=30)
        assert create is not None
        client.send({"id": create["id"], "result": None})
        token = create["params"]["token"]
        pid = wait_for(lambda: verify_process(workdir), timeout=30)
        assert pid is not None
        tree = process_tree(pid)
        client.send({"method": "$/cancelRequest", "params": {"id": 5}})
        assert wait_for(lambda: not any(running(p) for p in tree), timeout=2)
        # the request is answered as cancelled and the progress ends
        answer = client.request(99, "workspace/executeCommand", {"command": "llmmem.gpus"})
        assert answer is not None
        ended = [
            m
            for m in client.seen
            if m.get("method") == "$/progress"
            and m["params"]["token"] == token
            and m["params"]["value"]["kind"] == "end"
        ]
        assert ended, client.seen
        cancelled = [m for m in client.seen if m.get("id") == 5 and "method" not in m]
        assert cancelled and cancelled[0]["error"]["code"] == types.LSPErrorCodes.RequestCancelled

        client.send({"id": 6, "method": "workspace/executeCommand", "params": command})
        pid = wait_for(lambda: verify_process(workdir), timeout=30)
        assert pid is not None
        tree = process_tree(pid)
        asked = time.monotonic()
        assert client.request(7, "shutdown", timeout=2) is not None
        assert time.monotonic() - asked < 2
        assert wait_for(lambda: not any(running(p) for p in tree), timeout=2)
        client.send({"method": "exit"})
        assert client.process.wait(timeout=5) == 0
    finally:
        log = client.close()
    assert "Traceback" not in log and "ERROR" not in log, log
    assert not [p.name for p in workdir.iterdir() if "llmmem-verify" in p.name]


def open_tiny(client: RawClient, workdir: Path, capabilities: dict[str, Any]) -> str:
    """An initialized server with the tiny script open (saved as it is in the editor)."""
    init = {
        "capabilities": capabilities,
        "initializationOptions": {"detectGpu": False, "hub": False},
    }
    assert client.request(1, "initialize", init, timeout=30) is not None
    client.send({"method": "initialized", "params": {}})
    uri = (workdir / "train.py").as_uri()
    (workdir / "train.py").write_text(TINY_SCRIPT)
    document = {"uri": uri, "languageId": "python", "version": 1, "text": TINY_SCRIPT}
    client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    assert client.notification("textDocument/publishDiagnostics", timeout=60) is not None
    return uri


def test_verify_without_a_document_is_invalid_params(raw: RawClient) -> None:
    raw.initialize()
    for params in (
        {"command": "llmmem.verify"},
        {"command": "llmmem.verify", "arguments": []},
        {"command": "llmmem.verify", "arguments": [42]},
    ):
        answer = raw.request(3, "workspace/executeCommand", params, timeout=5)
        assert answer is not None, f"no answer to {params}"
        assert answer["error"]["code"] == types.ErrorCodes.InvalidParams, answer
        assert "URI" in answer["error"]["message"]
    assert "Traceback" not in raw.close()


def test_a_verify_reports_on_the_clients_token_and_its_cancel_ends_the_step(
    workdir: Path,
) -> None:
    """A client that creates the progress itself (VS Code's notification with Cancel) passes
    its `workDoneToken`: the server reports on it, creates none of its own, and a
    `window/workDoneProgress/cancel` of that token ends the subprocess."""
    tiny_model(workdir)
    client = RawClient()
    try:
        uri = open_tiny(client, workdir, {"window": {"workDoneProgress": True}})
        token = "the-client-s-token"
        command = {
            "command": "llmmem.verify",
            "arguments": [uri, {"simulate": True}],
            "workDoneToken": token,
        }
        client.send({"id": 5, "method": "workspace/executeCommand", "params": command})
        pid = wait_for(lambda: verify_process(workdir), timeout=30)
        assert pid is not None
        tree = process_tree(pid)
        begun = client.notification("$/progress", timeout=10)
        assert begun is not None and begun["params"]["token"] == token
        assert begun["params"]["value"]["kind"] == "begin"
        assert begun["params"]["value"]["cancellable"] is True
        client.send({"method": "window/workDoneProgress/cancel", "params": {"token": token}})
        assert wait_for(lambda: not any(running(p) for p in tree), timeout=2)
        answer = None
        deadline = time.monotonic() + 10
        while answer is None and time.monotonic() < deadline:
            answer = next((m for m in client.seen if m.get("id") == 5 and "method" not in m), None)
            if answer is None:
                client._next(time.monotonic() + 0.2)
        assert answer is not None and answer["result"]["cancelled"] is True
        methods = [m.get("method") for m in client.seen]
        assert "window/workDoneProgress/create" not in methods
        # the client shows the outcome itself: no second message
        assert "window/showMessage" not in methods
    finally:
        log = client.close()
    assert "Traceback" not in log


def test_an_unsaved_text_is_verified_from_a_copy_outside_the_workspace(workdir: Path) -> None:
    """While the step runs nothing appears in the workspace (an Explorer would show it); the
    copy's relative paths (`./tiny`) still read the workspace's."""
    tiny_model(workdir)
    client = RawClient()
    try:
        uri = open_tiny(client, workdir, {})
        before = sorted(p.name for p in workdir.iterdir())
        edited = TINY_SCRIPT.replace(
            "per_device_train_batch_size=2", "per_device_train_batch_size=1"
        )
        change = {
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": [{"text": edited}],
        }
        client.send({"method": "textDocument/didChange", "params": change})
        command = {"command": "llmmem.verify", "arguments": [uri, {"simulate": True}]}
        client.send({"id": 5, "method": "workspace/executeCommand", "params": command})
        seen: set[str] = set()
        answer = None
        deadline = time.monotonic() + 240
        while answer is None and time.monotonic() < deadline:
            seen |= {p.name for p in workdir.iterdir()}
            client._next(time.monotonic() + 0.05)
            answer = next((m for m in client.seen if m.get("id") == 5 and "method" not in m), None)
        assert answer is not None, "verify gave no answer"
        assert answer["result"]["ok"] is True, answer["result"]
        assert sorted(seen) == before, f"in the workspace while verify ran: {sorted(seen)}"
        assert (workdir / "train.py").read_text() == TINY_SCRIPT
        # the breakdown page of that text shows what was measured beside the prediction
        page = client.request(
            6, "workspace/executeCommand", {"command": "llmmem.breakdown", "arguments": [uri]}, 30
        )
        assert page is not None and page["result"]["version"] == 2
        assert "Measured beside predicted" in page["result"]["html"]
        assert "allocated peak" in page["result"]["html"]
    finally:
        client.close()


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="verify needs torch"
)
def test_without_cuda_the_answer_says_whether_a_simulated_step_can_run(workdir: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: verify runs the step")
    tiny_model(workdir)
    client = RawClient()
    try:
        uri = open_tiny(client, workdir, {})
        answer = client.request(
            5, "workspace/executeCommand", {"command": "llmmem.verify", "arguments": [uri]}, 240
        )
        assert answer is not None and answer["result"]["ok"] is False
        assert answer["result"]["simulate"] == {"possible": True}
        qlora = (Path(__file__).resolve().parents[2] / "examples" / "qlora_sft.py").read_text()
        path = workdir / "qlora.py"
        path.write_text(qlora)
        document = {"uri": path.as_uri(), "languageId": "python", "version": 1, "text": qlora}
        client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
        command = {"command": "llmmem.verify", "arguments": [path.as_uri()]}
        answer = client.request(6, "workspace/executeCommand", command, 240)
        assert answer is not None and answer["result"]["ok"] is False
        simulate = answer["result"]["simulate"]
        assert simulate["possible"] is False and "bitsandbytes" in simulate["why"], simulate
    finally:
        client.close()


WORKSPACE_MODULES = ("json", "typing", "datasets", "llmmem")


def shadowing_modules(workdir: Path) -> list[Path]:
    """Modules in the workspace named like those llmmem imports (and like llmmem itself), each
    leaving a marker when it is imported; returns the markers."""
    markers = []
    for name in WORKSPACE_MODULES:
        marker = workdir / f"{name}.imported"
        (workdir / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
        markers.append(marker)
    return markers


def open_raw(client: RawClient, path: Path, text: str) -> str:
    path.write_text(text)
    document = {"uri": path.as_uri(), "languageId": "python", "version": 1, "text": text}
    client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    return path.as_uri()


def test_verify_imports_nothing_from_the_workspace(workdir: Path) -> None:
    """The server runs in the workspace, as editors start it: the verify subprocess imports
    none of the workspace's `json.py`, `typing.py`, `datasets.py` or `llmmem.py`, and still
    runs llmmem (here it says the file has nothing to verify)."""
    markers = shadowing_modules(workdir)
    client = RawClient(cwd=workdir)
    try:
        client.initialize()
        uri = open_raw(client, workdir / "train.py", NOTHING_TO_VERIFY)
        command = {"command": "llmmem.verify", "arguments": [uri, {"simulate": True}]}
        answer = client.request(2, "workspace/executeCommand", command, timeout=60)
    finally:
        client.close()
    assert answer is not None, "no answer to verify"
    outcome = answer["result"]
    assert outcome["ok"] is False and "nothing to verify" in outcome["message"], outcome
    assert [m.name for m in markers if m.exists()] == []


def test_verify_runs_outside_the_workspace_offline(workdir: Path) -> None:
    """Its working directory is no folder of the workspace (what it writes relative to it
    does not land there), and with hub lookups off it runs with HF_HUB_OFFLINE=1, also when
    the editor's environment does not set it."""
    tiny_model(workdir)
    env = {k: v for k, v in SERVER_ENV.items() if k != "HF_HUB_OFFLINE"}
    client = RawClient(cwd=workdir, env=env)
    try:
        client.initialize()
        uri = open_raw(client, workdir / "train.py", TINY_SCRIPT)
        command = {"command": "llmmem.verify", "arguments": [uri, {"simulate": True}]}
        client.send({"id": 5, "method": "workspace/executeCommand", "params": command})
        pid = wait_for(lambda: verify_process(workdir), timeout=30)
        assert pid is not None
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        directory = Path(os.readlink(f"/proc/{pid}/cwd"))
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        client.send({"method": "$/cancelRequest", "params": {"id": 5}})
        assert client.answer(5, timeout=10) is not None
        # a directory of its own, removed once the run has ended
        assert wait_for(lambda: not directory.exists(), timeout=5), directory
    finally:
        client.close()
    assert b"HF_HUB_OFFLINE=1" in environment
    assert not directory.is_relative_to(workdir.resolve()), directory
    assert b"-I" in command_line


def test_process_tree_reads_children() -> None:
    """The /proc reading the tests above rely on."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert child.pid in process_tree(os.getpid())
        assert running(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not running(child.pid)


def test_a_process_id_that_is_no_process_here_is_not_watched(raw: RawClient) -> None:
    """An editor in another container or on another machine sends its own pid: the server
    stays (it ends with the connection)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    init = {
        "processId": gone.pid,
        "capabilities": {},
        "initializationOptions": {"detectGpu": False, "hub": False},
    }
    assert raw.request(1, "initialize", init, timeout=30) is not None
    raw.send({"method": "initialized", "params": {}})
    time.sleep(2.5)
    assert raw.process.poll() is None
    assert raw.request(2, "shutdown", timeout=5) is not None
    raw.send({"method": "exit"})
    assert raw.process.wait(timeout=5) == 0

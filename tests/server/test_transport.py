"""The transport as a client that writes bytes sees it: no frame wedges the server.

Each malformed frame below is written by hand to `python -m llmmem_lsp` (or the installed
`llmmem-lsp`), followed by a well-formed hover on a real document: the frame gets its error
(with its request's id where the body shows one) or its answer, and the hover after it is
answered, so the server reads every later frame. A request before `initialize` is refused with
ServerNotInitialized.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsp_helpers import FITTING_LORA, SERVER_ENV, SERVER_SCRIPT, RawClient, frame
from lsprotocol import types

PARSE_ERROR = types.ErrorCodes.ParseError
INVALID_REQUEST = types.ErrorCodes.InvalidRequest
MODEL_LINE = 4  # `model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-0.5B")`
IDS = count(1000)


def body(ident: int | None, method: str = "workspace/executeCommand", **params: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if ident is not None:
        message["id"] = ident
    message["params"] = params or {"command": "llmmem.gpus"}
    return json.dumps(message).encode()


class Served:
    """A server with one document open and analysed."""

    def __init__(self, client: RawClient, uri: str) -> None:
        self.client = client
        self.uri = uri

    def hover_frame(self, ident: int) -> bytes:
        params = {
            "textDocument": {"uri": self.uri},
            "position": {"line": MODEL_LINE, "character": 50},
        }
        return frame(body(ident, "textDocument/hover", **params))

    def assert_hover_answered(self, ident: int, timeout: float = 10.0) -> None:
        answer = self.client.answer(ident, timeout)
        assert answer is not None, f"no answer to the hover {ident}: {self.client.seen}"
        assert "Qwen2.5-0.5B" in json.dumps(answer["result"]), answer


def serve(folder: Path, command: list[str] | None = None) -> Served:
    client = RawClient(command=command)
    client.initialize()
    path = folder / "train.py"
    path.write_text(FITTING_LORA, encoding="utf-8")
    uri = path.as_uri()
    document = {"uri": uri, "languageId": "python", "version": 1, "text": FITTING_LORA}
    client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    assert client.notification("textDocument/publishDiagnostics", timeout=60) is not None
    return Served(client, uri)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = serve(tmp_path_factory.mktemp("transport"))
    yield server
    log = server.client.close()
    assert "Traceback" not in log, log


def deep(ident: int, levels: int) -> bytes:
    params = b"[" * levels + b"]" * levels
    head = b'{"jsonrpc": "2.0", "id": %d, "method": "textDocument/hover", "params": ' % ident
    return head + params + b"}"


# (what it is, the bytes, the id of the answer expected, its error code (None: a result))
MALFORMED: list[tuple[str, bytes, int | None, int | None]] = [
    ("Content-Length one byte too long", frame(body(11), len(body(11)) + 1), 11, PARSE_ERROR),
    ("Content-Length one byte too short", frame(body(12), len(body(12)) - 1), 12, PARSE_ERROR),
    ("Content-Length far too long", frame(body(13), len(body(13)) + 300), 13, PARSE_ERROR),
    (
        "a lowercase content-length",
        b"content-length: %d\r\n\r\n" % len(body(14)) + body(14),
        14,
        None,
    ),
    (
        "header lines ended by LF alone",
        b"Content-Length: %d\nContent-Type: application/vscode-jsonrpc; charset=utf-8\n\n"
        % len(body(15))
        + body(15),
        15,
        None,
    ),
    ("100,000 levels deep", frame(deep(16, 100_000)), 16, INVALID_REQUEST),
    ("a bare jsonrpc member", frame(b'{"jsonrpc":"2.0"}'), None, INVALID_REQUEST),
    (
        "no Content-Length header",
        b"Content-Type: application/vscode-jsonrpc\r\n\r\n" + body(17),
        17,
        PARSE_ERROR,
    ),
    ("a Content-Length that is no number", b"Content-Length: x\r\n\r\n" + body(18), 18, -32700),
    ("no header at all", body(19), 19, PARSE_ERROR),
    ("a body that is no JSON", frame(b'{"jsonrpc": "2.0", "id": 20, "method": }'), 20, -32700),
]


@pytest.mark.parametrize(
    ("data", "ident", "code"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_a_malformed_frame_is_answered_and_the_next_request_too(
    served: Served, data: bytes, ident: int | None, code: int | None
) -> None:
    hover = next(IDS)
    served.client.write(data + served.hover_frame(hover))
    answer = served.client.answer(ident, timeout=10)
    assert answer is not None, f"no answer with id {ident}: {served.client.seen}"
    if code is None:
        assert "result" in answer, answer
    else:
        assert answer["error"]["code"] == code, answer
    served.assert_hover_answered(hover)


def test_a_length_too_long_on_the_last_frame_is_answered_while_the_client_waits(
    served: Served,
) -> None:
    """The client sends nothing more until it has its answer: the missing byte never comes."""
    served.client.write(frame(body(21), len(body(21)) + 1))
    answer = served.client.answer(21, timeout=5)
    assert answer is not None and answer["error"]["code"] == PARSE_ERROR, answer
    hover = next(IDS)
    served.client.write(served.hover_frame(hover))
    served.assert_hover_answered(hover)


def test_a_message_over_the_size_limit_is_refused_unread(served: Served) -> None:
    text = "x" * (64 * 1024 * 1024)
    params = {"textDocument": {"uri": served.uri, "version": 2}, "text": text}
    big = body(22, "textDocument/willSaveWaitUntil", **params)
    hover = next(IDS)
    served.client.write(frame(big) + served.hover_frame(hover))
    answer = served.client.answer(22, timeout=30)
    assert answer is not None and answer["error"]["code"] == INVALID_REQUEST, answer
    assert "64 MiB" in answer["error"]["message"]
    served.assert_hover_answered(hover)


# -- frames cut, cased, ended and sized at random -------------------------------------------


@st.composite
def frames(draw: st.DrawFn, served: Served) -> tuple[bytes, list[int], int]:
    """Requests framed in every way a client gets wrong, cut into pieces, then a hover."""
    data, idents = b"", []
    for _ in range(draw(st.integers(1, 4))):
        ident = next(IDS)
        idents.append(ident)
        payload = body(ident, "workspace/executeCommand", command="llmmem.gpus")
        padding = draw(st.integers(0, 3000))
        payload = payload[:-1] + b', "pad": "%s"}' % (b"p" * padding)
        length = len(payload) + draw(st.sampled_from([0, 0, 0, -1, 1, -3, 2, 40]))
        name = draw(st.sampled_from([b"Content-Length", b"content-length", b"CONTENT-LENGTH"]))
        newline = draw(st.sampled_from([b"\r\n", b"\n"]))
        extra = draw(st.sampled_from([b"", b"Content-Type: application/vscode-jsonrpc" + newline]))
        data += extra + name + b": %d" % length + newline + newline + payload
    hover = next(IDS)
    data += served.hover_frame(hover)
    cuts = sorted(draw(st.lists(st.integers(1, len(data) - 1), max_size=6, unique=True)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return b"\0".join(pieces), idents, hover  # \0 marks where the writes are cut


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_request_is_answered_however_it_is_framed(
    served: Served, data: st.DataObject
) -> None:
    written, idents, hover = data.draw(frames(served))
    for piece in written.split(b"\0"):
        served.client.write(piece)
        time.sleep(0.002)  # separate reads on the server's side
    for ident in idents:
        assert served.client.answer(ident, timeout=5) is not None, (ident, written)
    served.assert_hover_answered(hover)


# -- the installed command and TCP ----------------------------------------------------------


def test_the_llmmem_lsp_command_reads_lowercase_and_lf_only_headers(tmp_path: Path) -> None:
    server = serve(tmp_path, command=SERVER_SCRIPT)
    try:
        hover = next(IDS)
        lowered = server.hover_frame(hover).replace(b"Content-Length", b"content-length")
        server.client.write(lowered.replace(b"\r\n", b"\n"))
        server.assert_hover_answered(hover)
    finally:
        server.client.close()


def test_tcp_reads_frames_as_stdio_does() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "llmmem_lsp", "--tcp", str(port)],
        env=SERVER_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not listen"
                time.sleep(0.1)
        with connection:
            initialize = body(1, "initialize", capabilities={})
            connection.sendall(
                frame(body(2), len(body(2)) + 1)  # too long by one: refused, and read past
                + b"content-length: %d\n\n" % len(initialize)
                + initialize
            )
            received = b""
            while b'"id": 1' not in received:
                piece = connection.recv(65536)
                assert piece, received
                received += piece
            assert b'"id": 2' in received and b"-32700" in received
    finally:
        process.kill()
        process.wait(timeout=10)


# -- before initialize ----------------------------------------------------------------------


def test_a_request_before_initialize_gets_server_not_initialized() -> None:
    client = RawClient()
    try:
        answer = client.request(1, "workspace/executeCommand", {"command": "llmmem.gpus"})
        assert answer is not None, "no answer within 5 s"
        assert answer["error"]["code"] == types.ErrorCodes.ServerNotInitialized, answer
        hover = {"textDocument": {"uri": "file:///x.py"}, "position": {"line": 0, "character": 0}}
        answer = client.request(2, "textDocument/hover", hover)
        assert answer is not None and answer["error"]["code"] == -32002, answer
        # a notification is dropped; initialize then works, and so does the request
        client.send({"method": "initialized", "params": {}})
        client.initialize()
        answer = client.request(3, "workspace/executeCommand", {"command": "llmmem.gpus"})
        assert answer is not None and isinstance(answer.get("result"), list), answer
    finally:
        log = client.close()
    assert "Traceback" not in log, log

"""Files the server reads that the editor has not opened: read bounded, never blocking.

A request on a document the editor has not opened makes the server read its file: a FIFO no one
writes to, `/dev/zero` or a notebook cell opened without its text (whose URI names the
notebook's path) must not hang it or fill its memory; it answers, and answers what comes next.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest
from lsp_helpers import FITTING_LORA, RawClient

pytestmark = pytest.mark.skipif(
    not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs FIFOs"
)

IDS = count(100)
MODEL_LINE = 4


class Served:
    def __init__(self, client: RawClient, folder: Path, uri: str) -> None:
        self.client, self.folder, self.uri = client, folder, uri

    def still_answers(self) -> None:
        """A hover on the open document is answered."""
        position = {"line": MODEL_LINE, "character": 50}
        params = {"textDocument": {"uri": self.uri}, "position": position}
        answer = self.client.request(next(IDS), "textDocument/hover", params, timeout=10)
        assert answer is not None, "the server no longer answers"
        assert "Qwen2.5-0.5B" in str(answer.get("result")), answer


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("reads")
    (folder / ".git").mkdir()
    client = RawClient()
    client.initialize()
    path = folder / "train.py"
    path.write_text(FITTING_LORA, encoding="utf-8")
    document = {"uri": path.as_uri(), "languageId": "python", "version": 1, "text": FITTING_LORA}
    client.send({"method": "textDocument/didOpen", "params": {"textDocument": document}})
    assert client.notification("textDocument/publishDiagnostics", timeout=60) is not None
    yield Served(client, folder, path.as_uri())
    client.close()


def peak_memory_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("method", ["textDocument/completion", "textDocument/documentLink"])
def test_a_request_on_an_unopened_fifo_is_answered(served: Served, method: str) -> None:
    fifo = served.folder / f"{method.rsplit('/', 1)[1]}.py"
    os.mkfifo(fifo)
    params: dict[str, object] = {"textDocument": {"uri": fifo.as_uri()}}
    if method.endswith("completion"):
        params["position"] = {"line": 0, "character": 0}
    asked = time.monotonic()
    answer = served.client.request(next(IDS), method, params, timeout=5)
    assert answer is not None, f"no answer to {method} on a FIFO within 5 s"
    assert time.monotonic() - asked < 5
    assert "error" not in answer, answer
    served.still_answers()


def test_a_completion_on_dev_zero_reads_a_bounded_amount(served: Served) -> None:
    params = {"textDocument": {"uri": "file:///dev/zero"}, "position": {"line": 0, "character": 3}}
    answer = served.client.request(next(IDS), "textDocument/completion", params, timeout=5)
    assert answer is not None, "no answer to a completion on /dev/zero within 5 s"
    link = served.client.request(
        next(IDS), "textDocument/documentLink", {"textDocument": {"uri": "file:///dev/zero"}}
    )
    assert link is not None and "error" not in link, link
    assert peak_memory_bytes(served.client.process.pid) < 1024**3
    served.still_answers()


def test_a_notebook_cell_opened_without_its_text_is_empty(served: Served) -> None:
    """The cell's `vscode-notebook-cell:` URI names the notebook's path, here a FIFO: the cell
    has no text of its own, and none is read from that path."""
    notebook = served.folder / "opened.ipynb"
    os.mkfifo(notebook)
    cell = f"vscode-notebook-cell:{notebook}#W0sZmlsZQ%3D%3D"
    params = {
        "notebookDocument": {
            "uri": notebook.as_uri(),
            "notebookType": "jupyter-notebook",
            "version": 1,
            "cells": [{"kind": 2, "document": cell}],
        },
        "cellTextDocuments": [],
    }
    served.client.send({"method": "notebookDocument/didOpen", "params": params})
    hover = {"textDocument": {"uri": cell}, "position": {"line": 0, "character": 0}}
    answer = served.client.request(next(IDS), "textDocument/hover", hover, timeout=5)
    assert answer is not None, "no answer to a hover on the cell within 5 s"
    served.still_answers()

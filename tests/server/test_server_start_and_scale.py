"""A server that starts without the analyzer and answers hovers on a long script from the index
of its text (how fast is measured in bench/lsp_latency.py, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lsp_helpers import (
    NOT_FITTING,
    SERVER_ENV,
    open_document,
    options,
    published,
    start,
    wait_until,
)
from lsprotocol import types
from pytest_lsp import LanguageClient

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("llmmem.check", "llmmem.budget", "llmmem.rules", "llmmem.extract.python", "llmmem.gpus")


def test_the_server_module_loads_no_analyzer_before_the_first_analysis() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, llmmem_lsp.server; print('\\n'.join(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        env=SERVER_ENV,
        check=True,
        timeout=60,
    ).stdout.split()
    assert not [name for name in loaded if name.startswith(HEAVY)]


PRELOAD_THEN_ANALYSE = """
import sys
from pathlib import Path
from llmmem_lsp.preload import preload
preload()
before = set(sys.modules)
from llmmem.check import check_text
names = sorted(Path("examples").iterdir()) + sorted(Path("tests/fixtures").rglob("*.py"))[:60]
for path in names:
    if path.is_file():
        check_text(path, path.read_text(), hub=False)
print("torch" in sys.modules)
print(" ".join(sorted(m for m in set(sys.modules) - before if m.startswith("llmmem"))))
"""


def test_initialized_leaves_no_first_import_of_the_analyzer_to_a_worker_thread() -> None:
    """Two threads importing a package and its submodule for the first time can deadlock in
    Python's import system (a completion request once failed so, racing an analysis thread).
    The server imports the analyzer on its own thread at `initialized` and before the first
    analysis; after that, analysing the examples and fixtures imports none of its modules
    for the first time, and the start has not loaded torch."""
    done = subprocess.run(
        [sys.executable, "-c", PRELOAD_THEN_ANALYSE],
        capture_output=True,
        text=True,
        env=SERVER_ENV,
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    torch_loaded, first_imports = (done.stdout.splitlines() + ["", ""])[:2]
    assert torch_loaded == "False"
    assert first_imports == ""


def vscode_initialization_options() -> dict[str, object]:
    """What the VS Code extension sends at start with nothing set: each server setting its
    manifest declares, at its default (an empty GPU name sent as null, as config.ts does)."""
    manifest = json.loads((ROOT / "vscode-extension" / "package.json").read_text())
    sections = manifest["contributes"]["configuration"]
    properties: dict[str, dict[str, object]] = {}
    for section in sections if isinstance(sections, list) else [sections]:
        properties.update(section["properties"])
    options: dict[str, object] = {}
    for key, declared in properties.items():
        name = key.removeprefix("llmmem.")
        if name in ("interpreter", "trace.server"):
            continue  # the extension's own, not sent
        default = declared.get("default")
        options[name] = None if default == "" else default
    return options


def test_the_settings_vscode_sends_at_start_load_no_extractor() -> None:
    """`initialize` carries VS Code's settings; reading them must not load the analyzer's
    extractors, or every start waits for them before the editor gets an answer."""
    options = vscode_initialization_options()
    assert options["worldSize"] is None and options["gpu"] is None
    script = (
        "import json, sys\n"
        "from llmmem_lsp.server import server\n"
        f"server.apply_settings(json.loads({json.dumps(json.dumps(options))}), check_gpu=False)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=SERVER_ENV,
        check=True,
        timeout=60,
    ).stdout.split()
    assert "llmmem_lsp.server" in loaded
    assert not [name for name in loaded if name.startswith(("llmmem.extract", *HEAVY))]


def long_script(filler_lines: int) -> tuple[str, int]:
    """NOT_FITTING after `filler_lines` lines of helpers; returns the text and the line of
    `per_device_train_batch_size=8`."""
    filler = []
    for index in range(filler_lines // 3):
        filler += [f"def helper_{index}(value):", f"    return value + {index}", ""]
    text = "\n".join(filler) + "\n" + NOT_FITTING
    line = text.splitlines().index("    per_device_train_batch_size=8,")
    return text, line


async def hover_at(client: LanguageClient, uri: str, line: int, col: int) -> types.Hover | None:
    return await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=col),
        )
    )


@pytest.mark.asyncio
async def test_hovers_at_the_end_of_a_long_script_find_their_setting(
    client: LanguageClient, workdir: Path
) -> None:
    # a long analysis is waited for: the hovers need its result
    await start(client, "visual_studio_code", options(gpu="RTX-4090", analysisTimeoutSeconds=300))
    text, line = long_script(3_000)
    uri = open_document(client, workdir / "train.py", text)
    await wait_until(lambda: any(p.uri == uri for p in published(client)), timeout=300)
    # on the keyword (not the value): the setting's range covers `name=value`
    on_keyword = await hover_at(client, uri, line, 6)
    assert on_keyword is not None and on_keyword.range is not None
    assert on_keyword.range.start == types.Position(line=line, character=4)
    assert "on RTX-4090" in str(on_keyword.contents)
    # the same text asked again (its index reused) gives the same answer; a helper gives none
    assert await hover_at(client, uri, line, 6) == on_keyword
    assert await hover_at(client, uri, 1, 4) is None
    # after an edit above it, the index is the new version's: the setting moved down a line
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        start=types.Position(line=0, character=0),
                        end=types.Position(line=0, character=0),
                    ),
                    text="# a comment\n",
                )
            ],
        )
    )
    await wait_until(lambda: any(p.version == 2 for p in published(client)), timeout=300)
    moved = await hover_at(client, uri, line + 1, 6)
    assert moved is not None and moved.range is not None
    assert moved.range.start == types.Position(line=line + 1, character=4)

"""The `llmmem.verify` command: one real (or simulated) step of a document, measured beside its
prediction, run by `verify_process` in a subprocess.

What it measures: the file itself where the editor's text is the file on disk (VS Code saves
before it verifies), else a copy of the editor's text in a temporary folder outside the
workspace whose other entries are links to the document's own (`./tiny`, `ds_config.json` and
the nearest `pyproject.toml` still read as beside the document); nothing is written into the
workspace. Its progress is the client's where the request carries a `workDoneToken` (VS Code's
notification with Cancel), else one the server creates; cancelling either, or the request
(`$/cancelRequest`), ends the subprocess. Where the step cannot run for want of CUDA, the
answer says whether a simulated step can (`simulate`: the plan's k-bit layers, 8-bit
optimizers, DeepSpeed and multi-rank DDP cannot run on fake tensors; a model sized from its
name has no config to build).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types

if TYPE_CHECKING:
    from llmmem.scenario import Analysis
    from llmmem_lsp.language_server import LlmmemServer

COPY_DIRECTORY_PREFIX = "llmmem-verify-"
MAX_LINKED_ENTRIES = 2_000  # a folder with more: only the copy (relative paths may not hold)


def simulation_blocker(analysis: Analysis | None) -> str | None:
    """Why a simulated step (`llmmem verify --simulate`) cannot run this plan here, or None."""
    import importlib.util

    if analysis is None or analysis.spec is None or analysis.setup is None:
        return "there is no step to simulate (no estimate)"
    if analysis.spec.is_guess:
        return "the model is sized from its name: a simulated step needs its config"
    setup = analysis.setup
    from llmmem.verify.building import runs_bitsandbytes

    if setup.quant is not None:
        return "its k-bit layers are bitsandbytes kernels, which do not run on fake tensors"
    if runs_bitsandbytes(setup.optim):
        return f"optim={setup.optim} runs bitsandbytes kernels, which do not run on fake tensors"
    dist = setup.distributed
    if dist.zero_stage:
        return "DeepSpeed ZeRO does not run on fake tensors"
    if dist.world_size > 1 and dist.fsdp is None:
        return "DDP's reducer needs real tensors"
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return (
                f"{module} is not installed for the server's Python: pip install 'llmmem[verify]'"
            )
    return None


def _nearest_project_file(folder: Path) -> Path | None:
    """The pyproject.toml at or above `folder` (up to the first folder holding `.git`)."""
    for candidate in (folder, *folder.parents):
        found = candidate / "pyproject.toml"
        if found.is_file():
            return found
        if (candidate / ".git").exists():
            return None
    return None


def buffer_copy(path: Path, text: str) -> Path | None:
    """The editor's text in a temporary folder outside the workspace, named as the document;
    the folder's other entries link to those beside the document (and to the nearest
    pyproject.toml) so that what the text names relative to itself reads the same."""
    try:
        directory = Path(tempfile.mkdtemp(prefix=COPY_DIRECTORY_PREFIX))
    except OSError:
        return None
    target = directory / path.name
    try:
        with open(target, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)
    except OSError:
        remove_copy(target)
        return None
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        entries = []
    if len(entries) <= MAX_LINKED_ENTRIES:
        for entry in entries:
            if entry.name != path.name:
                _link(Path(entry.path), directory / entry.name)
    project = _nearest_project_file(path.parent)
    if project is not None and not (directory / "pyproject.toml").exists():
        _link(project, directory / "pyproject.toml")
    return target


def _link(source: Path, link: Path) -> None:
    try:
        link.symlink_to(source, target_is_directory=source.is_dir())
    except OSError:  # no symlinks here (Windows without the privilege): the copy alone
        pass


def remove_copy(copy: Path) -> None:
    """The copy's temporary folder, its links (not what they point to) included."""
    import shutil

    folder = copy.parent
    if folder.name.startswith(COPY_DIRECTORY_PREFIX) and folder.parent == Path(
        tempfile.gettempdir()
    ):
        shutil.rmtree(folder, ignore_errors=True)  # removes links, never follows them
    else:
        copy.unlink(missing_ok=True)


def _on_disk(path: Path, text: str) -> bool:
    """Whether the file on disk holds exactly `text` (then it is verified itself)."""
    from llmmem_lsp.disk_documents import read_workspace_text

    try:
        return read_workspace_text(path) == text
    except (OSError, UnicodeError, ValueError):
        return False


async def verify(ls: LlmmemServer, arguments: list[Any]) -> dict[str, Any]:
    """See the module's doc. Arguments: [uri] or [uri, {"simulate": true}] or
    [uri, {"device": "cpu"}]; none, or no URI first, is refused with InvalidParams before
    this runs (`protocol`)."""
    from llmmem_lsp.protocol import uri_argument

    given = uri_argument(arguments)
    if given is None:
        return {"ok": False, "message": "no document to verify"}
    uri = ls.owner_uri(given)  # a cell's URI names its notebook
    state = ls.analyzer.documents.get(uri)
    snapshot = ls._text_of(uri) if state is not None else None
    if state is None or snapshot is None:
        return {"ok": False, "message": f"not an open document: {uri}"}
    text, version = snapshot
    options = arguments[1] if len(arguments) > 1 and isinstance(arguments[1], dict) else {}
    from llmmem_lsp.protocol import LlmmemProtocol

    assert isinstance(ls.protocol, LlmmemProtocol)
    ls.protocol.stop_with_request()
    client_token = ls.protocol.client_progress_token()
    loop = asyncio.get_running_loop()
    cancelled: asyncio.Future[None] = loop.create_future()
    token = await _progress(ls, state.path.name, cancelled, client_token)
    from llmmem_lsp import verify_process as run

    notebook = uri in ls.notebooks
    itself = not notebook and await loop.run_in_executor(None, _on_disk, state.path, text)
    copy = None if itself else await loop.run_in_executor(None, buffer_copy, state.path, text)
    measured = state.path if itself else copy
    process: asyncio.subprocess.Process | None = None
    directory: Path | None = None  # the subprocess's working directory
    outcome: dict[str, Any] = {"ok": False, "message": "verify stopped"}
    try:
        if measured is None:
            outcome = {"ok": False, "message": f"could not write {state.path.name} to verify it"}
        else:
            hub = ls.analyzer.settings.hub
            gpu = ls.analyzer.settings_for(state.path).gpu
            process, directory = await run.start_verify(
                measured, options, gpu, hub, ls.workspace_roots()
            )
            ls.verifying.add(process)
            outcome = await run.verify_run(
                process, cancelled, version, lambda: ls.shutdown_received
            )
            if copy is not None:
                outcome = run.named_as_document(outcome, copy, state.path)
    except OSError as err:
        outcome = {"ok": False, "message": f"could not start verify: {err}"}
    except asyncio.CancelledError:  # $/cancelRequest, or the server stops
        outcome = {"ok": False, "cancelled": True, "message": "verify cancelled"}
        raise
    finally:
        if process is not None:
            run.kill_process_group(process)
            ls.verifying.discard(process)
        if directory is not None:
            run.remove_run_directory(directory)
        if copy is not None:
            remove_copy(copy)
        ls.protocol.forget_progress_token()
        if token is not None:
            ls.work_done_progress.tokens.pop(token, None)
            ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=outcome["message"]))
    outcome["version"] = version
    if not outcome["ok"] and "--simulate" in outcome["message"] and not options.get("simulate"):
        analysis = state.result.checked.analysis if state.result is not None else None
        why = await loop.run_in_executor(None, simulation_blocker, analysis)
        outcome["simulate"] = {"possible": why is None, **({"why": why} if why else {})}
    if outcome.get("markdown"):
        state.measured = outcome["markdown"]
        state.measured_version = version
        report = outcome.get("report")
        state.measured_report = report if isinstance(report, dict) else None
    if not ls.shutdown_received and client_token is None:
        # a client that gave its own progress shows the outcome itself
        ls.window_show_message(
            types.ShowMessageParams(
                type=types.MessageType.Info if outcome["ok"] else types.MessageType.Warning,
                message=outcome["message"],
            )
        )
    return outcome


async def _progress(
    ls: LlmmemServer,
    title: str,
    cancelled: asyncio.Future[None],
    client_token: int | str | None,
) -> int | str | None:
    """A work-done progress the user can cancel (`cancelled` is set when they do): the
    client's own token where the request carried one, else one the server creates where the
    client shows server-initiated progress; None where neither."""
    token: int | str | None = client_token
    if token is None:
        window = ls.client_capabilities.window
        if not (window and window.work_done_progress):
            return None
        token = str(uuid.uuid4())
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=5)
        except Exception:
            return None
    ls.work_done_progress.begin(  # registers a client's token for its cancel too
        token, types.WorkDoneProgressBegin(title="llmmem verify", message=title, cancellable=True)
    )

    def on_cancel(_: object) -> None:
        if not cancelled.done():
            cancelled.get_loop().call_soon_threadsafe(_set_once, cancelled)

    ls.work_done_progress.tokens[token].add_done_callback(on_cancel)
    return token


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

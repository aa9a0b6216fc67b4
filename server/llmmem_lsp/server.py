"""The llmmem language server: a thin pygls adapter over `llmmem.check`.

Everything it shows is computed by the analyzer (`llmmem.check`, `llmmem.report.markdown`,
`llmmem.report.deltas`, the rules' fixes); the server's class (`language_server`) schedules
analyses (`documents.Analyzer`), and this module registers the protocol's features on one
instance of it, each answered by a module of its own (`hovers`, `lenses`, `code_actions`,
`verify_command`, `breakdown`, ...).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import to_fs_path

from llmmem_lsp.code_actions import FIX_ALL_KIND
from llmmem_lsp.completion import TRIGGER_CHARACTERS, completions
from llmmem_lsp.documents import DocumentState, Result, document_path
from llmmem_lsp.language_server import (
    CONFIG_FILE_GLOB,
    PULL_WAIT_S,
    LlmmemServer,
    log,
)
from llmmem_lsp.links import document_links
from llmmem_lsp.preload import PreloadingExecutor, preload
from llmmem_lsp.protocol import LlmmemProtocol
from llmmem_lsp.settings import ServerSettings, read_settings

server = LlmmemServer()


# -- lifecycle ------------------------------------------------------------------------------


@server.feature(types.INITIALIZE)
def initialize(ls: LlmmemServer, params: types.InitializeParams) -> None:
    caps = params.capabilities
    text = caps.text_document
    workspace = caps.workspace
    ls.pull_diagnostics = bool(text and text.diagnostic)
    ls.refresh_diagnostics = bool(
        workspace and workspace.diagnostics and workspace.diagnostics.refresh_support
    )
    ls.refresh_lenses = bool(
        workspace and workspace.code_lens and workspace.code_lens.refresh_support
    )
    ls.refresh_hints = bool(
        workspace and workspace.inlay_hint and workspace.inlay_hint.refresh_support
    )
    ls.versioned_edits = bool(
        workspace and workspace.workspace_edit and workspace.workspace_edit.document_changes
    )
    code_action_caps = text.code_action if text else None
    resolvable = code_action_caps.resolve_support if code_action_caps else None
    ls.resolve_edits = bool(
        code_action_caps
        and code_action_caps.data_support
        and resolvable
        and "edit" in resolvable.properties
    )
    hover_caps = text.hover if text else None
    formats = hover_caps.content_format if hover_caps else None
    # a client that names its formats and puts no Markdown among them gets plain text
    ls.hover_markdown = not formats or types.MarkupKind.Markdown in formats
    options = params.initialization_options
    command = options.get("breakdownCommand") if isinstance(options, dict) else None
    ls.breakdown_command = command if isinstance(command, str) and command.strip() else None
    ls.apply_settings(params.initialization_options, check_gpu=False)
    if params.process_id is not None:
        ls.watch_parent(params.process_id)
    # the jobs handlers hand to the loop's executor import nothing for the first time
    # beside another thread (see `preload`)
    asyncio.get_running_loop().set_default_executor(
        PreloadingExecutor(thread_name_prefix="llmmem-worker")
    )


@server.feature(types.INITIALIZED)
async def initialized(ls: LlmmemServer, params: types.InitializedParams) -> None:
    ls.show_settings_problems(ls.gpu_setting_problems())
    caps = ls.client_capabilities
    workspace = caps.workspace
    if workspace and workspace.configuration:
        await _pull_configuration(ls)
    watched = workspace.did_change_watched_files if workspace else None
    if watched and watched.dynamic_registration:
        registration = types.Registration(
            id=str(uuid.uuid4()),
            method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
            register_options=types.DidChangeWatchedFilesRegistrationOptions(
                watchers=[types.FileSystemWatcher(glob_pattern=CONFIG_FILE_GLOB)]
            ),
        )
        try:
            await ls.client_register_capability_async(
                types.RegistrationParams(registrations=[registration])
            )
        except Exception as err:
            log.info("client refused the file watcher: %s", err)
    # the analyzer imported on this thread before a worker thread imports any of it (see
    # `preload`; an analysis that starts earlier, while the settings are pulled, does it first)
    preload()
    if ls.analyzer.settings.detect_gpu and not ls.analyzer.settings.gpu:
        asyncio.get_running_loop().create_task(_detect_gpu(ls))


async def _pull_configuration(ls: LlmmemServer) -> None:
    """The window's settings, and each workspace folder's (`scopeUri`): a file is analysed
    with the settings of the folder that holds it."""
    folders: list[tuple[str, str]] = []
    for folder in ls.workspace.folders.values():
        path = to_fs_path(folder.uri)
        if path:
            folders.append((folder.uri, path))
    items = [types.ConfigurationItem(section="llmmem")] + [
        types.ConfigurationItem(section="llmmem", scope_uri=uri) for uri, _ in folders
    ]
    try:
        answer = await asyncio.wait_for(
            ls.workspace_configuration_async(types.ConfigurationParams(items=items)),
            timeout=5,
        )
    except Exception as err:
        log.info("workspace/configuration failed: %s", err)
        return
    if not answer:
        return
    analyzer = ls.analyzer
    before = {uri: analyzer.settings_for(doc.path) for uri, doc in analyzer.documents.items()}
    ls.apply_settings(answer[0])
    per_folder: dict[str, ServerSettings] = {}
    for (_, folder_path), raw in zip(folders, answer[1:], strict=False):
        if raw is None or raw == answer[0]:
            continue  # the folder says what the window says
        settings, problems = read_settings(raw, ls.analyzer.settings)
        ls.show_settings_problems(problems)
        try:
            per_folder[str(Path(folder_path).resolve())] = settings
        except (OSError, RuntimeError):
            continue
    analyzer.folder_settings = per_folder
    # a document opened while the settings were on their way was analysed without them
    for uri, settings in before.items():
        doc = analyzer.documents.get(uri)
        if doc is not None and analyzer.settings_for(doc.path) != settings:
            analyzer.schedule(doc, delay=0.0)


async def _detect_gpu(ls: LlmmemServer) -> None:
    """The GPU of this machine, in the background; used when no GPU is set anywhere."""
    from llmmem.gpus import GIB, detect_local_gpus

    loop = asyncio.get_running_loop()
    try:
        found = await loop.run_in_executor(None, detect_local_gpus)
    except Exception:
        return
    if not found:
        return
    gpu = found[0]
    ls.analyzer.detected_gpu = (
        gpu.spec.name if gpu.spec is not None else f"{gpu.total_bytes / GIB:.1f}GiB"
    )
    log.info("detected GPU %s", ls.analyzer.detected_gpu)
    ls.analyzer.reanalyse_all()


@server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(
    ls: LlmmemServer, params: types.DidChangeConfigurationParams
) -> None:
    caps = ls.client_capabilities.workspace
    if caps and caps.configuration:
        await _pull_configuration(ls)
    else:
        ls.apply_settings(params.settings)
    ls.analyzer.reanalyse_all()


@server.feature(types.WORKSPACE_DID_CHANGE_WORKSPACE_FOLDERS)
async def did_change_workspace_folders(
    ls: LlmmemServer, params: types.DidChangeWorkspaceFoldersParams
) -> None:
    """A folder added or removed (pygls has updated the workspace's list): its settings are
    asked for, or dropped, and the open files analysed again."""
    caps = ls.client_capabilities.workspace
    if caps and caps.configuration:
        await _pull_configuration(ls)
        ls.analyzer.reanalyse_all()


@server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def did_change_watched_files(ls: LlmmemServer, params: types.DidChangeWatchedFilesParams) -> None:
    for change in params.changes:
        path = to_fs_path(change.uri)
        if not path:
            continue
        if Path(path).name == "pyproject.toml":
            ls.analyzer.reanalyse_all()
            return
        ls.analyzer.reanalyse_dependents(path)


@server.feature(types.SHUTDOWN)
def shutdown(ls: LlmmemServer, params: None) -> None:
    ls.shutdown_received = True
    ls.stop_work()
    assert isinstance(ls.protocol, LlmmemProtocol)
    ls.protocol.cancel_pending_requests()


# -- documents ------------------------------------------------------------------------------


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: LlmmemServer, params: types.DidOpenTextDocumentParams) -> None:
    document = params.text_document
    path = document_path(document.uri, to_fs_path(document.uri), document.language_id)
    ls.analyzer.open(document.uri, path, document.version)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: LlmmemServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.analyzer.changed(params.text_document.uri, params.text_document.version)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: LlmmemServer, params: types.DidSaveTextDocumentParams) -> None:
    path = to_fs_path(params.text_document.uri)
    if path:
        ls.analyzer.reanalyse_dependents(path)
        if Path(path).name == "pyproject.toml":
            ls.analyzer.reanalyse_all()


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: LlmmemServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.analyzer.close(uri)
    if not ls.pull_diagnostics:
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, diagnostics=[])
        )


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
def notebook_did_open(ls: LlmmemServer, params: types.DidOpenNotebookDocumentParams) -> None:
    notebook = params.notebook_document
    ls.notebooks.add(notebook.uri)
    path = document_path(notebook.uri, to_fs_path(notebook.uri), "jupyter")
    if path.suffix != ".ipynb":
        path = path.with_suffix(".ipynb")
    ls.analyzer.open(notebook.uri, path, notebook.version)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
def notebook_did_change(ls: LlmmemServer, params: types.DidChangeNotebookDocumentParams) -> None:
    ls.analyzer.changed(params.notebook_document.uri, params.notebook_document.version)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
def notebook_did_close(ls: LlmmemServer, params: types.DidCloseNotebookDocumentParams) -> None:
    uri = params.notebook_document.uri
    ls.notebooks.discard(uri)
    ls.analyzer.close(uri)
    if not ls.pull_diagnostics:
        for cell in params.cell_text_documents:
            ls.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[])
            )


@server.feature(
    types.TEXT_DOCUMENT_DIAGNOSTIC,
    types.DiagnosticOptions(
        identifier="llmmem", inter_file_dependencies=True, workspace_diagnostics=True
    ),
)
async def pull_diagnostics(
    ls: LlmmemServer, params: types.DocumentDiagnosticParams
) -> types.DocumentDiagnosticReport:
    cell = ls.cell_of(params.text_document.uri)
    if cell is not None:
        state = cell[0]
        await ls.analyzer.wait_current(state, PULL_WAIT_S)
        items = ls.cell_diagnostics(state).get(params.text_document.uri, [])
        return types.RelatedFullDocumentDiagnosticReport(items=items)
    found = await ls.current(params.text_document.uri, PULL_WAIT_S)
    if found is None:
        return types.RelatedFullDocumentDiagnosticReport(items=[])
    state, result = found
    result_id = _result_id(result)
    if params.previous_result_id == result_id:
        return types.RelatedUnchangedDocumentDiagnosticReport(result_id=result_id)
    return types.RelatedFullDocumentDiagnosticReport(
        items=ls.diagnostics_for(state), result_id=result_id
    )


def _result_id(result: Result) -> str:
    """One analysis's id: a new version, setting or config re-analyses, and so changes it."""
    return f"{result.version}#{result.serial}"


@server.feature(types.WORKSPACE_DIAGNOSTIC)
async def workspace_diagnostic(
    ls: LlmmemServer, params: types.WorkspaceDiagnosticParams
) -> types.WorkspaceDiagnosticReport:
    """The findings of every training file in the workspace's folders (the files
    `llmmem-lint DIR` reads): an open document's from its analysis, a closed file's from disk,
    "unchanged" for a result id the client sent back that still holds. A client that gives a
    `partialResultToken` gets the reports as they come (`$/progress`, one after each file
    analysed afresh), and an empty final result."""
    from llmmem_lsp.workspace import training_files

    token = params.partial_result_token
    partial_sent = False

    previous = {item.uri: item.value for item in params.previous_result_ids}
    roots = [Path(p) for p in ls.workspace_roots()]
    loop = asyncio.get_running_loop()
    paths = await loop.run_in_executor(None, training_files, roots)
    open_by_path: dict[str, DocumentState] = {}
    for document in list(ls.analyzer.documents.values()):
        try:
            open_by_path[str(document.path.resolve())] = document
        except OSError:
            continue
    items: list[types.WorkspaceDocumentDiagnosticReport] = []
    for path in paths:
        resolved = str(path.resolve())
        state = open_by_path.get(resolved)
        if state is not None:
            if state.uri in ls.notebooks or state.result is None:
                continue
            result_id = _result_id(state.result)
            version = state.result.version
            if previous.get(state.uri) == result_id:
                items.append(
                    types.WorkspaceUnchangedDocumentDiagnosticReport(
                        uri=state.uri, result_id=result_id, version=version
                    )
                )
            else:
                items.append(
                    types.WorkspaceFullDocumentDiagnosticReport(
                        uri=state.uri,
                        items=ls.diagnostics_for(state),
                        result_id=result_id,
                        version=version,
                    )
                )
            continue
        before = ls.disk_reports.get(Path(resolved))
        report = await ls.disk_report(Path(resolved))
        if report is None:
            continue
        uri = Path(resolved).as_uri()
        if previous.get(uri) == report.result_id:
            items.append(
                types.WorkspaceUnchangedDocumentDiagnosticReport(
                    uri=uri, result_id=report.result_id, version=None
                )
            )
        else:
            items.append(
                types.WorkspaceFullDocumentDiagnosticReport(
                    uri=uri, items=report.items, result_id=report.result_id, version=None
                )
            )
        if token is not None and report is not before:  # analysed now: show what there is
            _send_partial(ls, token, items)
            items, partial_sent = [], True
    if partial_sent:
        if items:
            _send_partial(ls, token, items)
        return types.WorkspaceDiagnosticReport(items=[])
    return types.WorkspaceDiagnosticReport(items=items)


def _send_partial(
    ls: LlmmemServer, token: int | str | None, items: list[types.WorkspaceDocumentDiagnosticReport]
) -> None:
    if token is None:
        return
    ls.protocol.notify(
        types.PROGRESS,
        types.ProgressParams(
            token=token, value=types.WorkspaceDiagnosticReportPartialResult(items=items)
        ),
    )


# -- hover ----------------------------------------------------------------------------------


@server.feature(types.TEXT_DOCUMENT_HOVER)
async def hover(ls: LlmmemServer, params: types.HoverParams) -> types.Hover | None:
    from llmmem_lsp.hovers import hover as answer

    return await answer(ls, params)


# -- code actions ---------------------------------------------------------------------------


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND],
        resolve_provider=True,
    ),
)
async def code_actions(
    ls: LlmmemServer, params: types.CodeActionParams
) -> list[types.CodeAction] | None:
    from llmmem_lsp.code_actions import code_actions as answer

    return await answer(ls, params)


@server.feature(types.CODE_ACTION_RESOLVE)
async def resolve_code_action(ls: LlmmemServer, action: types.CodeAction) -> types.CodeAction:
    from llmmem_lsp.code_actions import resolve_code_action as resolve

    return await resolve(ls, action)


# -- code lens and inlay hints --------------------------------------------------------------


@server.feature(types.TEXT_DOCUMENT_CODE_LENS)
async def code_lens(ls: LlmmemServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
    from llmmem_lsp.lenses import code_lens as answer

    return await answer(ls, params)


@server.feature(types.TEXT_DOCUMENT_INLAY_HINT, types.InlayHintOptions(resolve_provider=False))
async def inlay_hints(
    ls: LlmmemServer, params: types.InlayHintParams
) -> list[types.InlayHint] | None:
    from llmmem_lsp.lenses import inlay_hints as answer

    return await answer(ls, params)


# -- completion and document links ---------------------------------------------------------


@server.feature(
    types.TEXT_DOCUMENT_COMPLETION,
    types.CompletionOptions(trigger_characters=TRIGGER_CHARACTERS, resolve_provider=False),
)
def completion(ls: LlmmemServer, params: types.CompletionParams) -> types.CompletionList | None:
    """GPU names, pragma keys, rule codes, optimizer and attention names: read from the line
    up to the cursor, with no analysis (a cell of a notebook is a text document too)."""
    try:
        document = ls.workspace.get_text_document(params.text_document.uri)
        text = document.source
    except Exception:
        return None
    uri = params.text_document.uri
    suffix = Path(to_fs_path(uri) or "").suffix
    quoted = (
        document.language_id in ("python", "json", "jsonc")
        or suffix in (".py", ".json")
        or ls.workspace.get_notebook_document(cell_uri=uri) is not None
    )

    lines = ls.lines(text)
    line, col = lines.server_position(params.position)
    path = to_fs_path(params.text_document.uri) or ""
    items = completions(
        lines.lines, line, col, lines.to_client_col, Path(path).name == "pyproject.toml", quoted
    )
    if items is None:
        return None
    return types.CompletionList(is_incomplete=False, items=items)


@server.feature(
    types.TEXT_DOCUMENT_DOCUMENT_LINK, types.DocumentLinkOptions(resolve_provider=False)
)
def document_link(
    ls: LlmmemServer, params: types.DocumentLinkParams
) -> list[types.DocumentLink] | None:
    """Links from `deepspeed=`/`--deepspeed`/`deepspeed:` values and `model_config=` pragmas to
    the files they name, relative to the document (a cell's: its notebook's folder)."""
    uri = params.text_document.uri
    try:
        text = ls.workspace.get_text_document(uri).source
    except Exception:
        return None
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    path = to_fs_path(notebook.uri if notebook is not None else uri)
    if not path:
        return None
    lines = ls.lines(text)
    return document_links(lines.lines, Path(path).parent, lines.to_client_col)


# -- commands -------------------------------------------------------------------------------


@server.command("llmmem.explain")
async def explain(ls: LlmmemServer, *arguments: Any) -> dict[str, Any]:
    """The full report of a document: Markdown for people, the budget and findings as JSON."""
    from llmmem_lsp.protocol import uri_argument

    given = uri_argument(list(arguments))
    uri = ls.owner_uri(given) if given else None  # a cell's URI names its notebook
    found = await ls.current(uri, PULL_WAIT_S) if uri else None
    if found is None:
        if uri in ls.analyzer.documents:
            return {
                "error": "the first analysis of this document is still running",
                "pending": True,
            }
        return {"error": f"not an open document: {given}"}
    _, result = found
    from llmmem.report import markdown
    from llmmem.report.json_report import budget_dict
    from llmmem_lsp.placement import guess_message

    analysis = result.checked.analysis
    budget = None
    if analysis.budget is not None and analysis.spec is not None:
        budget = budget_dict(analysis.budget, analysis.spec)
    return {
        "uri": given,
        **({"notebook": uri} if uri != given else {}),
        "version": result.version,
        "markdown": markdown.budget_hover(analysis),
        "model": markdown.model_hover(analysis),
        "budget": budget,
        "findings": [finding.to_json() for finding in result.checked.findings],
        "problems": analysis.problems
        + ([analysis.model_error] if analysis.model_error else [])
        + ([guess] if (guess := guess_message(result.checked)) else []),
    }


@server.command("llmmem.breakdown")
async def breakdown(ls: LlmmemServer, *arguments: Any) -> dict[str, Any]:
    """The document's whole breakdown as a self-contained HTML page (`breakdown`)."""
    from llmmem_lsp.breakdown import breakdown as page

    return await page(ls, list(arguments))


@server.command("llmmem.gpus")
def gpus(ls: LlmmemServer, *arguments: Any) -> list[dict[str, Any]]:
    """The GPU catalog, for an editor's GPU picker."""
    from llmmem.gpus import GIB, all_gpus

    return [
        {"name": gpu.name, "memoryGiB": round(gpu.capacity_bytes / GIB, 1), "bf16": gpu.bf16}
        for gpu in all_gpus()
    ]


@server.command("llmmem.verify")
async def verify(ls: LlmmemServer, *arguments: Any) -> dict[str, Any]:
    """One real (or simulated) step of the document, measured beside its prediction
    (`verify_command`); cancelling its progress or the request ends it."""
    from llmmem_lsp.verify_command import verify as run_verify

    return await run_verify(ls, list(arguments))

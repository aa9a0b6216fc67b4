"""The llmmem language server: a thin pygls adapter over `llmmem.check`.

Everything it shows is computed by the analyzer (`llmmem.check`, `llmmem.report.markdown`,
`llmmem.report.deltas`, the rules' fixes); this module only schedules analyses
(`documents.Analyzer`), converts positions and answers the protocol.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from llmmem import __version__
from llmmem_lsp.completion import TRIGGER_CHARACTERS, completions
from llmmem_lsp.convert import Lines, code_action, diagnostic, overlaps, workspace_edit
from llmmem_lsp.disk_documents import read_workspace_text
from llmmem_lsp.documents import Analyzer, DocumentState, Result, document_path
from llmmem_lsp.links import document_links
from llmmem_lsp.protocol import LlmmemProtocol
from llmmem_lsp.settings import ServerSettings, read_settings

if TYPE_CHECKING:  # the analyzer is imported on first use: the server answers `initialize` first
    from llmmem.check import Checked
    from llmmem_lsp.workspace import DiskReport

log = logging.getLogger("llmmem_lsp")

PARENT_POLL_S = 1.0  # how often the editor's process (initialize's processId) is looked for
HOVER_WAIT_S = 1.5  # how long a hover waits for the current version's analysis
PULL_WAIT_S = 3.0  # how long a pulled diagnostic report waits for it
CONFIG_FILE_GLOB = "**/*.{json,yaml,yml,toml}"


def unreadable_diagnostic(what: str, reason: str) -> types.Diagnostic:
    """One information diagnostic at the top: why a file that does not parse has no estimate."""
    start = types.Position(line=0, character=0)
    return types.Diagnostic(
        range=types.Range(start=start, end=start),
        severity=types.DiagnosticSeverity.Information,
        source="llmmem",
        message=f"llmmem cannot estimate this {what} yet: {reason}",
    )


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (PermissionError): it exists
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return True  # no /proc (macOS): os.kill said it exists
    fields = stat.rsplit(")", 1)[-1].split()
    return not fields or fields[0] not in ("Z", "X")


def abandoned_diagnostic(timeout_s: float) -> types.Diagnostic:
    """An information diagnostic at the top: the analysis ran past its timeout."""
    return unreadable_diagnostic(
        "file",
        f"its analysis took longer than {timeout_s:g} s and was stopped "
        "(the setting llmmem.analysisTimeoutSeconds)",
    )


class LlmmemServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "llmmem",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        notebook="jupyter-notebook",
                        cells=[types.NotebookCellLanguage(language="python")],
                    )
                ]
            ),
            protocol_cls=LlmmemProtocol,
        )
        self.shutdown_received = False  # `exit` before `shutdown` exits with code 1
        self.analyzer = Analyzer(self._text_of, self._publish, self._publish_abandoned)
        self.pull_diagnostics = False
        self.versioned_edits = True
        self.resolve_edits = False  # quick fixes carry no edit until `codeAction/resolve`
        self.hover_markdown = True  # False: the client renders hovers as plain text only
        # a client command that opens a file's whole breakdown (initializationOptions'
        # `breakdownCommand`): the step's hover links to it
        self.breakdown_command: str | None = None
        self.refresh_lenses = False
        self.refresh_hints = False
        self.refresh_diagnostics = False
        self.settings_problems_shown: set[str] = set()
        self.notebooks: set[str] = set()  # URIs of open notebook documents
        self.parent_watch: asyncio.Task[None] | None = None
        self.verifying: set[asyncio.subprocess.Process] = set()  # `llmmem verify` runs
        self.disk_reports: dict[Path, DiskReport] = {}  # closed files, for workspace/diagnostic

    def stop_work(self) -> None:
        """Stop what runs in the background: analyses and `llmmem verify` subprocesses."""
        self.analyzer.shutdown()
        if self.verifying:
            from llmmem_lsp.verify_process import kill_process_group

            for process in list(self.verifying):
                kill_process_group(process)

    def watch_parent(self, pid: int) -> None:
        """Exit (code 1, as without `shutdown`) once the editor's process is gone: an editor
        that crashed leaves no server behind. Not on Windows, where `os.kill(pid, 0)` would
        end the process it asks about."""
        if sys.platform == "win32" or pid <= 0 or pid == os.getpid():
            return
        if not process_alive(pid):  # an editor on another machine or in another container
            log.info("processId %d is no process here: the server does not watch it", pid)
            return

        async def watch() -> None:
            while process_alive(pid):
                await asyncio.sleep(PARENT_POLL_S)
            log.warning("the editor's process %d is gone: the server exits", pid)
            self.stop_work()
            logging.shutdown()
            os._exit(1)

        self.parent_watch = asyncio.get_running_loop().create_task(watch())

    # -- plumbing ---------------------------------------------------------------------------

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve over stdio through `transport` (pygls's reader is wedged by one bad frame)."""
        from llmmem_lsp.transport import serve_stdio

        serve_stdio(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> None:
        from llmmem_lsp.transport import serve_tcp

        serve_tcp(self, host, port)

    @property
    def encoding(self) -> str:
        encoding = self.workspace.position_encoding if self.workspace else None
        return str(getattr(encoding, "value", encoding) or "utf-16")

    def lines(self, text: str) -> Lines:
        """The line index of a text, built once per text (per document version)."""
        return Lines.of(text, self.encoding)

    def _text_of(self, uri: str) -> tuple[str, int | None] | None:
        notebook = self.workspace.get_notebook_document(notebook_uri=uri)
        if notebook is not None:
            return self.notebook_json(notebook), notebook.version
        try:
            document = self.workspace.get_text_document(uri)
        except Exception:
            return None
        return document.source, document.version

    def apply_settings(self, raw: Any, check_gpu: bool = True) -> None:
        """Take the editor's settings; a problem with one is shown once. `check_gpu=False`
        (in `initialize`, answered before the GPU catalog is loaded) leaves the GPU name to
        `gpu_setting_problems`, called in `initialized`."""
        settings, problems = read_settings(raw, self.analyzer.settings)
        old = self.analyzer.settings
        self.analyzer.settings = settings
        if check_gpu and settings.gpu and settings.gpu != old.gpu:
            problems += self.gpu_setting_problems()
        if settings.hub and not old.hub:
            self.analyzer.forget_hub_lookups()
        self.show_settings_problems(problems)

    def gpu_setting_problems(self) -> list[str]:
        gpu = self.analyzer.settings.gpu
        if not gpu:
            return []
        from llmmem.gpus import UnknownGpuError, find_gpu

        try:
            find_gpu(gpu)
        except UnknownGpuError as err:
            return [f"llmmem.gpu: {str(err).split(';')[0]}"]
        return []

    def show_settings_problems(self, problems: list[str]) -> None:
        for problem in problems:
            if problem not in self.settings_problems_shown:
                self.settings_problems_shown.add(problem)
                self.window_show_message(
                    types.ShowMessageParams(type=types.MessageType.Warning, message=problem)
                )

    def notebook_json(self, notebook: types.NotebookDocument) -> str:
        """The notebook as the `.ipynb` JSON the analyzer reads: its cells in order, with the
        editor's current text (unsaved edits included)."""
        cells = []
        for cell in notebook.cells:
            try:
                source = self.workspace.get_text_document(cell.document).source
            except Exception:
                source = ""
            kind = "code" if cell.kind == types.NotebookCellKind.Code else "markdown"
            cells.append({"cell_type": kind, "source": source, "metadata": {}})
        return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})

    def cell_of(self, uri: str) -> tuple[DocumentState, int, str] | None:
        """For a notebook cell's URI: its notebook's state, the cell's index, the cell's text."""
        notebook = self.workspace.get_notebook_document(cell_uri=uri)
        if notebook is None:
            return None
        state = self.analyzer.documents.get(notebook.uri)
        if state is None:
            return None
        for index, cell in enumerate(notebook.cells):
            if cell.document == uri:
                return state, index, self.workspace.get_text_document(uri).source
        return None

    def cell_diagnostics(self, state: DocumentState) -> dict[str, list[types.Diagnostic]]:
        """A notebook's diagnostics, per cell URI (every code cell present, maybe empty)."""
        notebook = self.workspace.get_notebook_document(notebook_uri=state.uri)
        result = state.result
        if notebook is None or result is None:
            return {}
        from llmmem.extract.notebook import cell_index
        from llmmem.report.findings import rule_url
        from llmmem_lsp.placement import narrowed

        plan_path = result.checked.analysis.plan.path
        out: dict[str, list[types.Diagnostic]] = {}
        texts: dict[int, Lines] = {}
        for index, cell in enumerate(notebook.cells):
            if cell.kind == types.NotebookCellKind.Code:
                out[cell.document] = []
                texts[index] = self.lines(self.workspace.get_text_document(cell.document).source)
        if not notebook.cells:
            return out
        first = notebook.cells[0].document
        if result.unreadable and not result.checked.findings:
            out.setdefault(first, []).append(unreadable_diagnostic("notebook", result.unreadable))
            return out
        for finding in result.checked.findings:
            found = cell_index(finding.range, plan_path)
            where = finding.range if found in texts else None
            index = found if found is not None and found in texts else next(iter(texts), 0)
            cell_uri = notebook.cells[index].document
            lines = texts.get(index) or self.lines("")
            located = narrowed(
                replace(finding, range=where, related=[]), result.checked.analysis.plan, lines
            )
            out.setdefault(cell_uri, []).append(
                diagnostic(located, lines, cell_uri, rule_url(finding.code))
            )
        from llmmem_lsp.diagnostic_merge import merged

        return {uri: merged(items) for uri, items in out.items()}

    def diagnostics_for(self, state: DocumentState) -> list[types.Diagnostic]:
        """The document's diagnostics: one per range (`diagnostic_merge`)."""
        from llmmem_lsp.diagnostic_merge import merged

        return merged(self.finding_diagnostics(state))

    def finding_diagnostics(self, state: DocumentState) -> list[types.Diagnostic]:
        """One diagnostic per finding and per problem the analysis reported."""
        result = state.result
        if result is None:
            return [abandoned_diagnostic(state.abandoned)] if state.abandoned else []
        from llmmem.report.findings import rule_url
        from llmmem_lsp.placement import narrowed, problem_diagnostics

        lines = self.lines(result.text)
        plan = result.checked.analysis.plan
        if result.unreadable:
            # no version has parsed yet: the parse error (LLM015, where the parser stopped)
            # says why there is no estimate; the plan's problems would only repeat it
            return [
                diagnostic(narrowed(finding, plan, lines), lines, state.uri, rule_url(finding.code))
                for finding in result.checked.findings
            ] or [unreadable_diagnostic("file", result.unreadable)]
        return [
            diagnostic(narrowed(finding, plan, lines), lines, state.uri, rule_url(finding.code))
            for finding in result.checked.findings
        ] + problem_diagnostics(result.checked, lines, self.analyzer.settings_for(state.path).gpu)

    async def _publish(self, state: DocumentState, result: Result) -> None:
        """A new analysis stands: push its diagnostics (or ask a pulling client to pull)."""
        if result.unreadable and state.result is not result:
            return  # keep what was shown for the last version that parsed
        if self.pull_diagnostics:
            if self.refresh_diagnostics:
                self.workspace_diagnostic_refresh(None)
        elif state.uri in self.notebooks:
            for cell_uri, items in self.cell_diagnostics(state).items():
                self.text_document_publish_diagnostics(
                    types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=items)
                )
        else:
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri=state.uri, version=result.version, diagnostics=self.diagnostics_for(state)
                )
            )
        if self.refresh_lenses:
            self.workspace_code_lens_refresh(None)
        if self.refresh_hints:
            self.workspace_inlay_hint_refresh(None)

    async def _publish_abandoned(self, state: DocumentState) -> None:
        """An analysis ran past its timeout: a document with an earlier result keeps it; one
        without says why it has no estimate."""
        if state.result is not None or state.uri in self.notebooks:
            return
        if self.pull_diagnostics:
            if self.refresh_diagnostics:
                self.workspace_diagnostic_refresh(None)
            return
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=state.uri, version=state.version, diagnostics=self.diagnostics_for(state)
            )
        )

    def owner_uri(self, uri: str) -> str:
        """The URI of the document analysed for `uri`: a notebook cell's notebook, else itself."""
        notebook = self.workspace.get_notebook_document(cell_uri=uri)
        return notebook.uri if notebook is not None else uri

    async def current_view(
        self, uri: str, wait_s: float
    ) -> tuple[DocumentState, Result, str, str | None, int | None] | None:
        """What a request on `uri` reads: the analysed document's state and result, the text of
        `uri` (a cell's own text), the `path` of the plan's ranges in that text (None for a
        file, the cell's `cell_path` for a notebook cell) and the cell's index."""
        cell = self.cell_of(uri)
        if cell is None:
            found = await self.current(uri, wait_s)
            if found is None:
                return None
            state, result = found
            return state, result, result.text, None, None
        state, index, text = cell
        await self.analyzer.wait_current(state, wait_s)
        if state.result is None:
            return None
        from llmmem.extract.notebook import cell_path

        result = state.result
        return state, result, text, cell_path(result.checked.analysis.plan.path, index), index

    def workspace_roots(self) -> list[str]:
        """The workspace's folders on disk (its root where the client names no folders)."""
        roots = [to_fs_path(folder.uri) for folder in self.workspace.folders.values()]
        found = [root for root in roots if root]
        if not found and self.workspace.root_path:
            found = [self.workspace.root_path]
        return found

    async def disk_report(self, path: Path) -> DiskReport | None:
        """A closed file's diagnostics, analysed again only when what it read has changed."""
        from llmmem_lsp.documents import plan_dependencies
        from llmmem_lsp.workspace import DiskReport, digest, holds_training, state_key

        settings = f"{self.analyzer.settings_for(path)!r} {self.analyzer.detected_gpu!r}"
        cached = self.disk_reports.get(path)
        if cached is not None and state_key(path, cached.dependencies, settings) == cached.key:
            return cached
        try:
            text = read_workspace_text(path)
        except OSError:
            self.disk_reports.pop(path, None)
            return None
        if self.analyzer._analysis_slot is None:
            self.analyzer._analysis_slot = asyncio.Lock()
        timeout = self.analyzer.settings.analysis_timeout_s
        async with self.analyzer._analysis_slot:  # open documents' analyses come in between
            try:
                checked = await self.analyzer._analyse_in_thread(path, text, timeout)
            except Exception:  # too slow, or a gap in the analyzer: nothing to say about it
                log.info("workspace analysis of %s failed", path, exc_info=True)
                checked = None
        dependencies = frozenset(plan_dependencies(checked)) if checked is not None else frozenset()
        key = state_key(path, dependencies, settings)
        items: list[types.Diagnostic] = []
        if checked is not None and holds_training(checked):
            state = DocumentState(uri=path.as_uri(), path=path)
            state.result = Result(version=None, text=text, checked=checked)
            items = self.diagnostics_for(state)
        report = DiskReport(key=key, result_id=digest(key), items=items, dependencies=dependencies)
        self.disk_reports[path] = report
        return report

    async def current(self, uri: str, wait_s: float) -> tuple[DocumentState, Result] | None:
        state = self.analyzer.documents.get(uri)
        if state is None:
            return None
        await self.analyzer.wait_current(state, wait_s)
        if state.result is None:
            return None
        return state, state.result


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


def _preload() -> None:
    """Load the analyzer while the editor opens its documents: `initialize` was answered
    without it, and the first analysis need not wait for the imports."""
    try:
        import llmmem.check  # noqa: F401
        import llmmem.report.markdown  # noqa: F401
        import llmmem_lsp.placement  # noqa: F401
    except Exception:  # the analysis that needs it will say what is wrong
        log.debug("preloading the analyzer failed", exc_info=True)


@server.feature(types.INITIALIZED)
async def initialized(ls: LlmmemServer, params: types.InitializedParams) -> None:
    threading.Thread(target=_preload, name="llmmem-preload", daemon=True).start()
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
    ls.analyzer.folder_settings = per_folder


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

FIX_ALL_KIND = "source.fixAll.llmmem"
FIX_ALL_TITLE = "Apply every safe llmmem fix (as llmmem-lint --fix)"


def _kind_wanted(kind: str, only: Sequence[str] | None) -> bool:
    """Whether a client's `context.only` asks for actions of `kind` (a kind includes the kinds
    below it: `source` asks for `source.fixAll.llmmem`)."""
    if not only:
        return True
    return any(kind == wanted or kind.startswith(f"{wanted}.") for wanted in only)


def _same_diagnostic(a: types.Diagnostic, b: types.Diagnostic) -> bool:
    return a.code == b.code and a.range == b.range and a.message == b.message


def _asked_diagnostics(
    ours: list[types.Diagnostic], asked: Sequence[types.Diagnostic], where: types.Range
) -> list[int]:
    """Indexes of our diagnostics that the client named in `context.diagnostics`; a
    diagnostic from an older version (moved by an edit) is matched by its code and message.
    A client that names none (some send an empty list) gets those overlapping the range."""
    if not asked:
        return [i for i, d in enumerate(ours) if overlaps(d.range, where)]
    from llmmem_lsp.diagnostic_merge import matches

    found: list[int] = []
    for wanted in asked:
        if wanted.source not in (None, "llmmem"):
            continue
        for i, d in enumerate(ours):  # a merged diagnostic: each finding in it
            if matches(wanted, d) and i not in found:
                found.append(i)
        index = next((i for i, d in enumerate(ours) if _same_diagnostic(d, wanted)), None)
        if index is None:
            index = next(
                (
                    i
                    for i, d in enumerate(ours)
                    if d.code == wanted.code and d.message == wanted.message
                ),
                None,
            )
        if index is not None and index not in found:
            found.append(index)
    return found


def _has_safe_fix(checked: Checked) -> bool:
    return any(
        fix.safe and all(edit.range.path is None for edit in fix.edits)
        for finding in checked.findings
        for fix in finding.fixes
    )


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
    """Quick fixes for the diagnostics the client names in `context.diagnostics` (each fix
    once, listing every diagnostic it answers; where it names none, those over the range),
    and `source.fixAll.llmmem`, whose edit is made by `codeAction/resolve` when it is chosen;
    `context.only` picks among these kinds."""
    if ls.cell_of(params.text_document.uri) is not None:
        return await _cell_code_actions(ls, params)
    found = await ls.current(params.text_document.uri, HOVER_WAIT_S)
    if found is None:
        return None
    state, result = found
    if result.unreadable:
        return None
    only = params.context.only
    actions: list[types.CodeAction] = []
    if _kind_wanted(types.CodeActionKind.QuickFix, only):
        fixes, silences = _quick_fixes(ls, state, result, params.context.diagnostics, params.range)
        actions += fixes
        actions += await _model_config_fixes(
            ls, state, result, params.context.diagnostics, params.range
        )
        actions += silences  # the last resort, after every fix
    if _kind_wanted(FIX_ALL_KIND, only) and _has_safe_fix(result.checked):
        actions.append(
            types.CodeAction(
                title=FIX_ALL_TITLE,
                kind=FIX_ALL_KIND,
                data={"uri": state.uri, "version": result.version, "action": "fixAll"},
            )
        )
    return actions


def _quick_fixes(
    ls: LlmmemServer,
    state: DocumentState,
    result: Result,
    asked: Sequence[types.Diagnostic],
    where: types.Range,
) -> tuple[list[types.CodeAction], list[types.CodeAction]]:
    """Each fix once, listing the diagnostics it answers, and a "silence" action per finding
    (returned apart, to be listed last). A client that resolves edits gets them without one:
    `codeAction/resolve` makes it."""
    from llmmem.report.findings import rule_url
    from llmmem_lsp.diagnostic_merge import shown_as
    from llmmem_lsp.placement import narrowed

    lines = ls.lines(result.text)
    plan = result.checked.analysis.plan
    findings = result.checked.findings
    ours = [
        diagnostic(narrowed(f, plan, lines), lines, state.uri, rule_url(f.code)) for f in findings
    ]
    published = shown_as(ls.finding_diagnostics(state))
    here = {"uri": state.uri, "version": result.version}
    by_key: dict[tuple[Any, ...], types.CodeAction] = {}
    for index in _asked_diagnostics(ours, asked, where):
        finding = findings[index]
        # the diagnostic the client was sent for it (merged with others of its range)
        diag = next((p for p in published if _key_of(p) == _key_of(ours[index])), ours[index])
        for fix in finding.fixes:
            key: tuple[Any, ...] = (
                "fix",
                fix.title,
                tuple((e.range, e.new_text) for e in fix.edits),
            )
            if key in by_key:
                by_key[key].diagnostics = [*(by_key[key].diagnostics or []), diag]
                continue
            if ls.resolve_edits:
                by_key[key] = types.CodeAction(
                    title=fix.title,
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diag],
                    is_preferred=bool(fix.fits),
                    data={**here, "action": "fix", "code": finding.code, "title": fix.title},
                )
            else:
                by_key[key] = code_action(
                    fix, state.uri, result.version, lines, [diag], ls.versioned_edits
                )
        if finding.code == "LLM014" and not finding.fixes:
            for match in _project_gpu_matches(result.checked):
                key = ("project-gpu", match)
                if key in by_key:
                    continue
                by_key[key] = types.CodeAction(
                    title=_project_gpu_title(match),
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diag],
                )
                if ls.resolve_edits:
                    by_key[key].data = {**here, "action": "projectGpu", "gpu": match}
                else:
                    by_key[key].edit = _project_gpu_edit(ls, result.checked, match)
        line = finding.range.start_line if finding.range else 0
        silence = _silence_edit(lines, line, finding.code, plan.kind)
        key = ("silence", finding.code, line)
        if silence is not None and key not in by_key:
            by_key[key] = types.CodeAction(
                title=f"Silence {finding.code} on this line (# llmmem: ignore[{finding.code}])",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diag],
            )
            if ls.resolve_edits:
                by_key[key].data = {**here, "action": "silence", "code": finding.code, "line": line}
            else:
                by_key[key].edit = workspace_edit(
                    [silence], state.uri, result.version, lines, ls.versioned_edits
                )
    actions = list(by_key.items())
    return (
        [action for key, action in actions if key[0] != "silence"],
        [action for key, action in actions if key[0] == "silence"],
    )


def _key_of(d: types.Diagnostic) -> tuple[int, int, int, int]:
    return (d.range.start.line, d.range.start.character, d.range.end.line, d.range.end.character)


async def _model_config_fixes(
    ls: LlmmemServer,
    state: DocumentState,
    result: Result,
    asked: Sequence[types.Diagnostic],
    where: types.Range,
) -> list[types.CodeAction]:
    """For a model sized by a guess from its name: a `# llmmem: model_config=` pragma naming
    each model `config.json` found beside the file (`model_config.config_candidates`)."""
    from llmmem_lsp.model_config import config_candidates, fix_title
    from llmmem_lsp.placement import guess_diagnostic

    guess = guess_diagnostic(result.checked, ls.lines(result.text))
    spec = result.checked.analysis.spec
    if guess is None or spec is None or not _asked_diagnostics([guess], asked, where):
        return []
    from llmmem_lsp.diagnostic_merge import shown_as

    guess = next(
        (d for d in shown_as(ls.finding_diagnostics(state)) if _key_of(d) == _key_of(guess)),
        guess,
    )
    loop = asyncio.get_running_loop()  # the folders are read off the protocol's loop
    found = await loop.run_in_executor(None, config_candidates, state.path, spec.model_id)
    actions: list[types.CodeAction] = []
    for written in found:
        action = types.CodeAction(
            title=fix_title(written), kind=types.CodeActionKind.QuickFix, diagnostics=[guess]
        )
        if ls.resolve_edits:
            action.data = {
                "uri": state.uri,
                "version": result.version,
                "action": "modelConfig",
                "config": written,
            }
        else:
            action.edit = _model_config_edit(ls, state, result, written)
        actions.append(action)
    return actions


def _model_config_edit(
    ls: LlmmemServer, state: DocumentState, result: Result, written: str
) -> types.WorkspaceEdit:
    """A new `# llmmem: model_config=...` line at the top (below a `#!` or encoding line)."""
    from llmmem_lsp.model_config import pragma_line, pragma_text

    lines = ls.lines(result.text).lines
    line = pragma_line(lines)
    text = pragma_text(written)
    if lines and lines[0].endswith("\r"):
        text = text.replace("\n", "\r\n")
    at = types.Position(line=line, character=0)
    edit = types.TextEdit(range=types.Range(start=at, end=at), new_text=text)
    if not ls.versioned_edits:
        return types.WorkspaceEdit(changes={state.uri: [edit]})
    document = types.OptionalVersionedTextDocumentIdentifier(uri=state.uri, version=result.version)
    return types.WorkspaceEdit(
        document_changes=[types.TextDocumentEdit(text_document=document, edits=[edit])]
    )


def _project_gpu_matches(checked: Checked) -> list[str]:
    """The catalog's close matches (three at most) for a GPU name the project's settings
    (`[tool.llmmem] gpu` in pyproject.toml) write and no GPU is; none for a name written
    elsewhere (a pragma in the file has LLM014's own fixes)."""
    gpu = checked.analysis.plan.gpu
    if gpu is None or gpu.range is None or gpu.range.path is None or checked.analysis.gpu:
        return []
    if Path(gpu.range.path).name != "pyproject.toml":
        return []
    from llmmem.gpus import UnknownGpuError, find_gpu

    try:
        find_gpu(str(gpu.value))
    except UnknownGpuError as err:
        return list(err.suggestions[:3])
    return []


def _project_gpu_title(match: str) -> str:
    return f'Use gpu = "{match}" in pyproject.toml'


def _project_gpu_edit(ls: LlmmemServer, checked: Checked, match: str) -> types.WorkspaceEdit | None:
    """`match` written over the GPU name in pyproject.toml (its text in the editor where it is
    open, else on disk); None where the file no longer has that name there."""
    gpu = checked.analysis.plan.gpu
    if gpu is None or gpu.range is None or gpu.range.path is None:
        return None
    path = Path(gpu.range.path)
    uri = path.as_uri()
    document = ls.workspace.text_documents.get(uri)
    try:
        text = document.source if document is not None else read_workspace_text(path)
    except OSError:
        return None
    lines = ls.lines(text)
    where = gpu.range
    if where.start_line != where.end_line or where.start_line >= len(lines.lines):
        return None
    written = lines.lines[where.start_line][where.start_col : where.end_col]
    name = str(gpu.value)
    if written.strip("\"'") != name:
        return None
    quote = written[0] if written[:1] in ('"', "'") else '"'
    edit = types.TextEdit(range=lines.range(where), new_text=f"{quote}{match}{quote}")
    if not ls.versioned_edits:
        return types.WorkspaceEdit(changes={uri: [edit]})
    version = document.version if document is not None else None
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(
                    uri=uri, version=version
                ),
                edits=[edit],
            )
        ]
    )


def _silence_edit(lines: Lines, line: int, code: str, kind: str) -> Any:
    """`llmmem.rules.edits.suppression_edit` on the one line it edits (not the whole text)."""
    from llmmem.rules.edits import suppression_edit

    if not 0 <= line < len(lines.lines):
        return None
    edit = suppression_edit(lines.lines[line].rstrip("\r"), 0, code, kind)
    if edit is None:
        return None
    return replace(edit, range=replace(edit.range, start_line=line, end_line=line))


def _resolve_quick_fix(
    ls: LlmmemServer, state: DocumentState, result: Result, data: dict[str, Any]
) -> types.WorkspaceEdit | None:
    """The edit of a quick fix listed without one, for the document's current text: the fix
    of the same finding with the same title (or the same line silenced), None where the text
    changed so that there is none."""
    lines = ls.lines(result.text)
    code = data.get("code")
    if data.get("action") == "silence":
        line = data.get("line")
        if not isinstance(line, int):
            return None
        silence = _silence_edit(lines, line, str(code), result.checked.analysis.plan.kind)
        if silence is None:
            return None
        return workspace_edit([silence], state.uri, result.version, lines, ls.versioned_edits)
    for finding in result.checked.findings:
        if finding.code != code:
            continue
        for fix in finding.fixes:
            if fix.title == data.get("title"):
                return workspace_edit(
                    fix.edits, state.uri, result.version, lines, ls.versioned_edits
                )
    return None


@server.feature(types.CODE_ACTION_RESOLVE)
async def resolve_code_action(ls: LlmmemServer, action: types.CodeAction) -> types.CodeAction:
    """The edit of an action offered without one, made now for the document's current
    version: a quick fix's own edits (in a file or in a notebook's cells), or for
    `source.fixAll.llmmem` every safe fix applied one at a time with a re-analysis after each,
    as `llmmem-lint --fix` does."""
    data = action.data if isinstance(action.data, dict) else {}
    uri = data.get("uri")
    if data.get("action") == "cellFix" and isinstance(uri, str):
        action.edit = await _resolve_cell_fix(ls, data)
        return action
    actions = ("fixAll", "fix", "silence", "modelConfig", "projectGpu")
    if data.get("action") not in actions or not isinstance(uri, str):
        return action
    found = await ls.current(uri, PULL_WAIT_S)
    if found is None:
        return action
    state, result = found
    if result.unreadable:
        return action
    if data["action"] == "projectGpu":
        match = data.get("gpu")
        if isinstance(match, str) and match in _project_gpu_matches(result.checked):
            action.edit = _project_gpu_edit(ls, result.checked, match)
        return action
    if data["action"] == "modelConfig":
        spec = result.checked.analysis.spec
        written = data.get("config")
        still_a_guess = spec is not None and spec.is_guess
        if still_a_guess and isinstance(written, str):
            action.edit = _model_config_edit(ls, state, result, written)
        return action
    if data["action"] != "fixAll":
        action.edit = _resolve_quick_fix(ls, state, result, data)
        return action
    from llmmem.lint_command import fix_file
    from llmmem.rules.edits import whole_change

    skipped: list[str] = []
    loop = asyncio.get_running_loop()
    fixed, _ = await loop.run_in_executor(
        None,
        lambda: fix_file(
            state.path,
            result.text,
            check=lambda text: ls.analyzer.analyse_now(state.path, text),
            skipped=skipped.append,
        ),
    )
    if skipped:
        log.info("fix all in %s: %s", uri, "; ".join(skipped))
    edits = [] if fixed == result.text else [whole_change(result.text, fixed)]
    action.edit = workspace_edit(
        edits, state.uri, result.version, ls.lines(result.text), ls.versioned_edits
    )
    return action


async def _cell_code_actions(
    ls: LlmmemServer, params: types.CodeActionParams
) -> list[types.CodeAction] | None:
    """Quick fixes in a notebook cell: each fix's edits go to the cells they name. As for a
    file, a client that resolves edits gets the list without them (`codeAction/resolve`
    makes each for the cells' current text)."""
    cell = ls.cell_of(params.text_document.uri)
    if cell is None:
        return None
    state, index, _ = cell
    await ls.analyzer.wait_current(state, HOVER_WAIT_S)
    result = state.result
    notebook = ls.workspace.get_notebook_document(notebook_uri=state.uri)
    if result is None or result.unreadable or notebook is None:
        return None
    if not _kind_wanted(types.CodeActionKind.QuickFix, params.context.only):
        return []
    from llmmem.extract.notebook import cell_index

    plan_path = result.checked.analysis.plan.path
    ours = ls.cell_diagnostics(state).get(params.text_document.uri, [])
    by_title: dict[str, types.CodeAction] = {}
    asked = _asked_diagnostics(ours, params.context.diagnostics, params.range)
    for diag in (ours[i] for i in asked):
        finding = next(
            (
                f
                for f in result.checked.findings
                if f.code == diag.code and cell_index(f.range, plan_path) in (index, None)
            ),
            None,
        )
        if finding is None:
            continue
        for fix in finding.fixes:
            if fix.title in by_title:
                by_title[fix.title].diagnostics = [*(by_title[fix.title].diagnostics or []), diag]
                continue
            if not _in_cells(notebook, plan_path, fix.edits):
                continue  # an edit outside the notebook's cells (a config file it names)
            action = types.CodeAction(
                title=fix.title,
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diag],
                is_preferred=bool(fix.fits),
            )
            if ls.resolve_edits:
                action.data = {
                    "uri": params.text_document.uri,
                    "action": "cellFix",
                    "code": finding.code,
                    "title": fix.title,
                }
            else:
                action.edit = _cell_edit(ls, notebook, plan_path, fix.edits)
            by_title[fix.title] = action
    return list(by_title.values())


def _in_cells(notebook: types.NotebookDocument, plan_path: str, edits: Any) -> bool:
    """Whether every edit lies in one of the notebook's cells (and there is one)."""
    from llmmem.extract.notebook import cell_index

    indexes = [cell_index(edit.range, plan_path) for edit in edits]
    return bool(indexes) and all(i is not None and i < len(notebook.cells) for i in indexes)


async def _resolve_cell_fix(ls: LlmmemServer, data: dict[str, Any]) -> types.WorkspaceEdit | None:
    """The edit of a notebook cell's quick fix listed without one, for the cells' current
    text: the fix of the same rule with the same title, None where the text changed so that
    there is none."""
    cell = ls.cell_of(str(data.get("uri")))
    if cell is None:
        return None
    state = cell[0]
    await ls.analyzer.wait_current(state, PULL_WAIT_S)
    result = state.result
    notebook = ls.workspace.get_notebook_document(notebook_uri=state.uri)
    if result is None or result.unreadable or notebook is None:
        return None
    plan_path = result.checked.analysis.plan.path
    for finding in result.checked.findings:
        if finding.code != data.get("code"):
            continue
        for fix in finding.fixes:
            if fix.title == data.get("title"):
                return _cell_edit(ls, notebook, plan_path, fix.edits)
    return None


def _cell_edit(
    ls: LlmmemServer, notebook: types.NotebookDocument, plan_path: str, edits: Any
) -> types.WorkspaceEdit | None:
    """A workspace edit over the notebook's cells, or None when an edit lies elsewhere."""
    from llmmem.extract.notebook import cell_index

    by_cell: dict[str, list[types.TextEdit]] = {}
    for edit in edits:
        index = cell_index(edit.range, plan_path)
        if index is None or index >= len(notebook.cells):
            return None
        uri = notebook.cells[index].document
        lines = ls.lines(ls.workspace.get_text_document(uri).source)
        by_cell.setdefault(uri, []).append(
            types.TextEdit(range=lines.range(edit.range), new_text=edit.new_text)
        )
    if not by_cell:
        return None
    if not ls.versioned_edits:
        return types.WorkspaceEdit(changes=by_cell)
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(
                    uri=uri, version=ls.workspace.get_text_document(uri).version
                ),
                edits=list(items),
            )
            for uri, items in by_cell.items()
        ]
    )


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
    from llmmem_lsp.verify_command import uri_argument

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

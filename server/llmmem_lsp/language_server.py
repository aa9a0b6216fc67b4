"""The llmmem language server's class: its state (the analyses, the client's capabilities,
the settings) and what every feature uses (the texts of documents and notebook cells, their
diagnostics, the wait for the current analysis). `server` registers the features on one
instance of it; the feature modules (`hovers`, `lenses`, `code_actions`, ...) take it as their
first argument.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from llmmem.version import __version__
from llmmem_lsp.convert import Lines, diagnostic
from llmmem_lsp.disk_documents import read_workspace_text
from llmmem_lsp.documents import Analyzer, DocumentState, Result
from llmmem_lsp.protocol import LlmmemProtocol
from llmmem_lsp.settings import read_settings

if TYPE_CHECKING:  # the analyzer is imported on first use: the server answers `initialize` first
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

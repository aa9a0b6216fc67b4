"""`textDocument/codeAction` and `codeAction/resolve`: the quick fixes of the diagnostics a
request names (each fix once, listing every diagnostic it answers; a merged diagnostic covers
each finding in it), the model-config and pyproject GPU fixes, the silencing comments (listed
last), `source.fixAll.llmmem`, and the same in notebook cells; a client that resolves edits gets
the list without them and each edit made for the text as it is when chosen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types

from llmmem_lsp.convert import Lines, code_action, diagnostic, overlaps, workspace_edit
from llmmem_lsp.disk_documents import read_workspace_text
from llmmem_lsp.documents import DocumentState, Result
from llmmem_lsp.language_server import HOVER_WAIT_S, PULL_WAIT_S, log

if TYPE_CHECKING:
    from llmmem.check import Checked
    from llmmem_lsp.language_server import LlmmemServer

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
        fix_all = types.CodeAction(
            title=FIX_ALL_TITLE,
            kind=FIX_ALL_KIND,
            data={"uri": state.uri, "version": result.version, "action": "fixAll"},
        )
        if not ls.resolve_edits:  # a client that cannot resolve gets the edit now
            fix_all.edit = await _fix_all_edit(ls, state, result)
        actions.append(fix_all)
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
    action.edit = await _fix_all_edit(ls, state, result)
    return action


async def _fix_all_edit(ls: LlmmemServer, state: DocumentState, result: Result) -> Any:
    """Every safe fix applied one at a time, with a re-analysis after each (as `llmmem-lint
    --fix` does), as one edit of the document's text."""
    from llmmem.lint_command import fix_file
    from llmmem.rules.text_edits import whole_change

    uri = state.uri
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
    return workspace_edit(
        edits, state.uri, result.version, ls.lines(result.text), ls.versioned_edits
    )


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

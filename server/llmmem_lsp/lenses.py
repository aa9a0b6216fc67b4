"""The code lens (the step's total against the GPU, and Verify) and the inlay hints (what each
setting written in the file costs).

The lens stands on the training configuration's call (else the model's loading, else the model
id); it names the newest local run of the setup beside the prediction, and it says so when its
numbers are of the text before the last edit (`freshness`). An inlay hint is given only behind a
value the file writes: a default's range is where it would be written (a call's closing
parenthesis), and a hint there read as garbage.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from lsprotocol import types

from llmmem_lsp.convert import overlaps
from llmmem_lsp.freshness import freshness, wait_for

if TYPE_CHECKING:
    from llmmem.check import Checked
    from llmmem.plan import SourceRange
    from llmmem_lsp.language_server import LlmmemServer


def lens_anchor(checked: Checked, notebook: bool = False) -> SourceRange | None:
    """Where the lens stands: the trainer call, else the model's loading, else the model id;
    in the file itself, or (`notebook`) in any of its cells."""
    from llmmem.extract.notebook import cell_index

    plan = checked.analysis.plan
    for where in (
        plan.trainer_range,
        plan.model_range,
        plan.model_id.range if plan.model_id else None,
    ):
        if where is None:
            continue
        if (where.path is None) if not notebook else cell_index(where, plan.path) is not None:
            return where
    return None


def _first_code_cell(ls: LlmmemServer, uri: str) -> bool:
    notebook = ls.workspace.get_notebook_document(cell_uri=uri)
    if notebook is None:
        return False
    code = (cell.document for cell in notebook.cells if cell.kind == types.NotebookCellKind.Code)
    return next(code, None) == uri


def lens_title(checked: Checked) -> str | None:
    """`≈ 29.8 GiB of 24.0 GiB on RTX-4090 (band 28.7–30.7 GiB)  ✗ does not fit`, and the
    newest local run of the setup; None without an estimate."""
    analysis = checked.analysis
    budget = analysis.budget
    if budget is None:
        return None
    from llmmem.budget.bands import band_range
    from llmmem.report.local_runs import latest_run_line
    from llmmem.units import format_bytes

    total = format_bytes(budget.device_total_bytes)
    band = "(band {} {})".format(*band_range(budget.device_total_bytes, budget.band))
    if analysis.gpu is not None:
        mark = {"tight": "  ⚠ tight: the band crosses the capacity"}.get(str(budget.verdict), "")
        if not budget.fits:
            mark = "  ✗ does not fit"
        capacity = format_bytes(analysis.gpu.capacity_bytes)
        title = f"≈ {total} of {capacity} on {analysis.gpu.name} {band}{mark}"
    else:
        unknown = next((p for p in analysis.problems if p.startswith("unknown GPU ")), None)
        why = unknown.split(" (", 1)[0] if unknown else "no GPU set"
        title = f"≈ {total} {band} peak ({why})"
    if analysis.spec is not None and analysis.spec.is_guess:
        title += " · model shapes guessed from its name"
    run = latest_run_line(analysis)
    if run is not None:
        title += f" · {run[0].lower()}{run[1:]}"
    return title


async def code_lens(ls: LlmmemServer, params: types.CodeLensParams) -> list[types.CodeLens] | None:
    uri = params.text_document.uri
    state = ls.analyzer.documents.get(ls.owner_uri(uri))
    found = await ls.current_view(uri, wait_for(state) if state else 0.0)
    if found is None:
        return None
    state, result, text, in_path, index = found
    anchor = lens_anchor(result.checked, notebook=index is not None)
    if index is not None:  # a notebook's lens is in the cell of its anchor, else the first one
        if anchor is None and not _first_code_cell(ls, uri):
            return []
        if anchor is not None and anchor.path != in_path:
            return []
    loop = asyncio.get_running_loop()  # the calibration file is read off the protocol's loop
    title = await loop.run_in_executor(None, lens_title, result.checked)
    if title is None:
        return None
    title += freshness(state, result).lens_mark()
    lines = ls.lines(text)
    start = lines.position(anchor.start_line, 0) if anchor else types.Position(line=0, character=0)
    where = types.Range(start=start, end=start)
    return [
        types.CodeLens(
            range=where,
            command=types.Command(title=title, command="llmmem.explain", arguments=[uri]),
        ),
        types.CodeLens(
            range=where,
            command=types.Command(title="Verify", command="llmmem.verify", arguments=[uri]),
        ),
    ]


async def inlay_hints(
    ls: LlmmemServer, params: types.InlayHintParams
) -> list[types.InlayHint] | None:
    uri = params.text_document.uri
    state = ls.analyzer.documents.get(ls.owner_uri(uri))
    found = await ls.current_view(uri, wait_for(state) if state else 0.0)
    if found is None:
        return None
    state, result, text, in_path, _ = found
    if result.unreadable or freshness(state, result).stale:
        return None  # a hint's place and number are the old text's: none until the new one
    from llmmem.report.deltas import setting_deltas

    lines = ls.lines(text)
    loop = asyncio.get_running_loop()
    deltas = await loop.run_in_executor(None, setting_deltas, result.checked.analysis, in_path)
    hints = []
    for delta in deltas:
        if not delta.written:
            continue
        end = lines.position(delta.range.end_line, delta.range.end_col)
        if not overlaps(types.Range(start=end, end=end), params.range):
            continue
        hints.append(
            types.InlayHint(
                position=end,
                label=delta.label,
                padding_left=True,
                tooltip=delta.detail,
            )
        )
    return hints

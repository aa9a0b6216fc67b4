"""The `llmmem.breakdown` command: a document's whole breakdown as the page of
`llmmem explain --format html` (`llmmem.report.html_report`), for an editor's panel.

The page is the document's current analysis: measured beside predicted after a verify of
the same text (its rows, and its device total as the chart's mark), the recorded local runs of
the setup, and a line saying so when the numbers are of the text before the last edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmmem_lsp.freshness import freshness

if TYPE_CHECKING:
    from llmmem_lsp.documents import DocumentState, Result
    from llmmem_lsp.language_server import LlmmemServer

DEVICE_ROW = "on the device (nvidia-smi)"  # the verify report's device total row
BREAKDOWN_WAIT_S = 3.0


def _page(state: DocumentState, result: Result, stale: str | None) -> str:
    from llmmem.report.html_report import Measured, breakdown_html
    from llmmem.report.local_runs import local_runs

    analysis = result.checked.analysis
    report = state.measured_report if state.measured_version == result.version else None
    rows = list(report.get("comparison") or []) if isinstance(report, dict) else []
    mark = None
    device = next((row for row in rows if row.get("what") == DEVICE_ROW), None)
    if device is not None and isinstance(device.get("measured_bytes"), (int, float)):
        where = report.get("device") if isinstance(report, dict) else None
        mark = Measured(f"verified on {where or 'this machine'}", int(device["measured_bytes"]))
    runs = local_runs(analysis, state.path)
    if mark is None and runs and runs[0].same_file and runs[0].metric == "device":
        mark = Measured(f"measured on {runs[0].gpu} on {runs[0].date}", runs[0].measured_bytes)
    return breakdown_html(
        analysis,
        result.checked.findings,
        title=f"llmmem: {Path(state.path).name}",
        measured=mark,
        measured_rows=rows,
        local_runs=[run.line() for run in runs[:5]],
        note=stale,
    )


async def breakdown(ls: LlmmemServer, arguments: list[Any]) -> dict[str, Any]:
    """{uri, version, html, stale} for [uri]; {error} where there is no analysis yet."""
    import asyncio

    from llmmem_lsp.protocol import uri_argument

    given = uri_argument(arguments)
    uri = ls.owner_uri(given) if given else None
    state = ls.analyzer.documents.get(uri) if uri else None
    if state is None:
        return {"error": f"not an open document: {given}"}
    found = await ls.current(state.uri, BREAKDOWN_WAIT_S)
    if found is None:
        return {"error": "the first analysis of this document is still running", "pending": True}
    state, result = found
    fresh = freshness(state, result)
    stale = fresh.hover_line()
    note = stale.strip("_").lstrip("⟳ ") if stale else None
    loop = asyncio.get_running_loop()
    html = await loop.run_in_executor(None, _page, state, result, note)
    return {"uri": given, "version": result.version, "stale": fresh.stale, "html": html}

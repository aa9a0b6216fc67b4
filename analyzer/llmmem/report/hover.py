"""The step's hover, short enough for an editor's hover box (about 250 px: a dozen short lines,
less where a diagnostic is shown above it).

It says the verdict with its band, the three largest terms at the peak, the newest local run of
the setup beside the prediction, and where the whole breakdown is (a link the editor opens,
or the command to run). The whole table, the phases and the formulas are in Explain and
`llmmem explain --format html`; nothing here knows about LSP.
"""

from __future__ import annotations

from llmmem.report.markdown import cell, nowrap, verdict_line
from llmmem.scenario import Analysis
from llmmem.units import format_bytes

LARGEST_TERMS = 3


def largest_terms(analysis: Analysis, count: int = LARGEST_TERMS) -> list[tuple[str, int]]:
    """The `count` largest terms of the device total at the peak (components and what sits
    beside them: slack, context, workspaces), largest first, as (name, bytes)."""
    budget = analysis.budget
    if budget is None:
        return []
    terms = [
        (component.value.replace("_", " "), term.bytes)
        for component, term in budget.peak.components.items()
    ]
    terms += [
        (overhead.value.replace("_", " "), term.bytes)
        for overhead, term in budget.overheads.items()
    ]
    terms = [item for item in terms if item[1] > 0]
    terms.sort(key=lambda item: item[1], reverse=True)
    return terms[:count]


def peak_line(analysis: Analysis) -> str:
    """`At the peak (backward): logits 11.7 GiB · weights 7.3 GiB · allocator slack 4.7 GiB`:
    one line in a hover box (the moment inside the phase is the breakdown's)."""
    budget = analysis.budget
    if budget is None:
        return ""
    terms = " · ".join(
        f"{name} {nowrap(format_bytes(size))}" for name, size in largest_terms(analysis)
    )
    return f"At the peak ({cell(budget.peak.phase.value.replace('_', ' '))}): {terms}"


def step_hover(
    analysis: Analysis,
    *,
    measured: str | None = None,
    local_run: str | None = None,
    breakdown_link: str | None = None,
    stale: str | None = None,
) -> str:
    """The hover of the trainer call and the training configuration: verdict and band, the
    three largest terms, the newest local run, the link to the whole breakdown.
    `measured`: the verify table of this very text (kept short: its first line);
    `breakdown_link`: a Markdown link target that opens the breakdown (else the command is
    named); `stale`: a line saying the numbers are of an older text."""
    budget, spec = analysis.budget, analysis.spec
    if budget is None or spec is None:
        reasons = [analysis.model_error] if analysis.model_error else []
        reasons += analysis.problems
        if not reasons:
            return ""
        return "**llmmem: no estimate**\n\n" + "\n".join(f"- {cell(r)}" for r in reasons[:4])
    parts = []
    if stale:
        parts.append(stale)
    parts.append(verdict_line(analysis))
    parts.append(peak_line(analysis))
    if measured:
        parts.append(measured.splitlines()[0])
    if local_run:
        parts.append(local_run)
    if breakdown_link:
        parts.append(f"[The whole breakdown]({breakdown_link}): phases, band, formulas")
    else:
        parts.append("_The whole breakdown: run llmmem: Explain (`llmmem explain FILE`)._")
    return "\n\n".join(part for part in parts if part)

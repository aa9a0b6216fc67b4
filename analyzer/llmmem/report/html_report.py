"""The breakdown as a picture: one self-contained HTML page (inline CSS and SVG, no script, no
fetch), for `llmmem explain --format html` and the editor's breakdown panel.

The chart stacks the memory of each moment of the step (the budget's phases: forward, backward,
optimizer step, ...) by term: weights, optimizer states, gradients, activations, logits, weight
copies and temporaries, then what sits beside allocated memory through the step (cuBLAS
workspaces, allocator slack, CUDA context, NCCL buffers). The GPU's capacity is a line, the
band of the device total a shaded span at the peak, a measured device total (a verify run, or
the newest local run) a mark beside it. Below: the per-moment table, the formulas of the peak,
what was not stated, the findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from llmmem.units import format_bytes

GIB = 2**30

# one colour per term, in the stacking order (bottom first); overheads after the components
TERM_COLOURS = {
    "weights": "#4c78a8",
    "reference_model": "#9ecae9",
    "weight_copies": "#72b7b2",
    "gradients": "#f58518",
    "optimizer_states": "#e45756",
    "activations": "#54a24b",
    "logits": "#b279a2",
    "temporaries": "#ff9da6",
    "kv_cache": "#9d755d",
    "vllm_engine": "#bab0ac",
    "cublas_workspaces": "#eeca3b",
    "allocator_slack": "#d8b5a5",
    "cuda_context": "#79706e",
    "nccl_buffers": "#439894",
    "unified_memory": "#88d27a",
}
CAPACITY_COLOUR = "#d62728"
MEASURED_COLOUR = "#111111"

CHART_WIDTH = 760
CHART_HEIGHT = 360
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 190, 20, 64


@dataclass(frozen=True)
class Measured:
    """A measured device total beside the prediction: `label` says where it was measured."""

    label: str
    device_bytes: int


def _label(name: str) -> str:
    return name.replace("_", " ")


def _stacks(budget: Any) -> list[tuple[str, list[tuple[str, int]]]]:
    """Per moment: (its label, [(term, bytes), ...] bottom first); the overheads are held
    through the whole step, so each moment carries them."""
    overheads = [(o.value, t.bytes) for o, t in budget.overheads.items() if t.bytes > 0]
    out = []
    for phase in budget.phases:
        terms = [(c.value, t.bytes) for c, t in phase.components.items() if t.bytes > 0]
        label = f"{_label(phase.phase.value)}: {phase.moment}"
        out.append((label, terms + overheads))
    return out


def _nice_top(value: float) -> float:
    """A round axis top at or above `value` (GiB)."""
    for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000):
        if value <= step * 8:
            return step * max(1, -(-value // step))
    return value


def chart_svg(budget: Any, measured: Measured | None = None) -> str:
    """The stacked chart of the step's moments, with the capacity, the band and the measured
    mark; an `<svg>` element with a `<title>` and an accessible description."""
    stacks = _stacks(budget)
    capacity = budget.gpu.capacity_bytes if budget.gpu is not None else 0
    band = budget.band
    highest = max(
        [sum(b for _, b in terms) for _, terms in stacks]
        + [capacity, band.high_bytes, measured.device_bytes if measured else 0]
    )
    top = _nice_top(highest / GIB * 1.05) * GIB
    plot_w = CHART_WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = CHART_HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def y(value: float) -> float:
        return MARGIN_TOP + plot_h * (1 - value / top)

    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" '
        f'style="width:100%;max-width:{CHART_WIDTH}px;height:auto" '
        'xmlns="http://www.w3.org/2000/svg" aria-labelledby="chart-title">',
        '<title id="chart-title">Memory of one training step by moment and term</title>',
    ]
    for i in range(6):  # the axis: six ticks
        value = top * i / 5
        parts.append(
            f'<line class="grid" x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" '
            f'y1="{y(value):.1f}" y2="{y(value):.1f}"/>'
            f'<text class="tick" x="{MARGIN_LEFT - 6}" y="{y(value) + 4:.1f}" '
            f'text-anchor="end">{value / GIB:g} GiB</text>'
        )
    slot = plot_w / max(len(stacks), 1)
    bar_w = min(90.0, slot * 0.6)
    peak_index = next(
        (i for i, p in enumerate(budget.phases) if p.phase == budget.peak_phase),
        0,
    )
    seen: list[str] = []
    for index, (label, terms) in enumerate(stacks):
        x = MARGIN_LEFT + slot * index + (slot - bar_w) / 2
        base = 0
        for name, size in terms:
            if name not in seen:
                seen.append(name)
            colour = TERM_COLOURS.get(name, "#999999")
            top_y, bottom_y = y(base + size), y(base)
            parts.append(
                f'<rect class="term" data-term="{name}" x="{x:.1f}" y="{top_y:.1f}" '
                f'width="{bar_w:.1f}" height="{max(bottom_y - top_y, 0.0):.1f}" '
                f'fill="{colour}"><title>{escape(_label(name))}: {format_bytes(size)} '
                f"({escape(label)})</title></rect>"
            )
            base += size
        parts.append(
            f'<text class="total" x="{x + bar_w / 2:.1f}" y="{y(base) - 5:.1f}" '
            f'text-anchor="middle">{format_bytes(base)}</text>'
        )
        short = escape(label.split(":", 1)[0])
        parts.append(
            f'<text class="moment" x="{x + bar_w / 2:.1f}" y="{MARGIN_TOP + plot_h + 16}" '
            f'text-anchor="middle">{short}{" (peak)" if index == peak_index else ""}'
            f"<title>{escape(label)}</title></text>"
        )
        if index == peak_index:  # the band of the device total, and what was measured
            x_band = x + bar_w + 4
            parts.append(
                f'<rect class="band" x="{x_band:.1f}" y="{y(band.high_bytes):.1f}" width="8" '
                f'height="{max(y(band.low_bytes) - y(band.high_bytes), 1.0):.1f}">'
                f"<title>band {format_bytes(band.low_bytes)} to "
                f"{format_bytes(band.high_bytes)}</title></rect>"
            )
            if measured is not None:
                parts.append(
                    f'<line class="measured" x1="{x - 6:.1f}" x2="{x + bar_w + 16:.1f}" '
                    f'y1="{y(measured.device_bytes):.1f}" y2="{y(measured.device_bytes):.1f}" '
                    f'stroke="{MEASURED_COLOUR}" stroke-width="3">'
                    f"<title>{escape(measured.label)}: "
                    f"{format_bytes(measured.device_bytes)}</title></line>"
                )
    if capacity:
        parts.append(
            f'<line class="capacity" x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" '
            f'y1="{y(capacity):.1f}" y2="{y(capacity):.1f}" stroke="{CAPACITY_COLOUR}" '
            'stroke-width="2" stroke-dasharray="6 4"/>'
            f'<text class="capacity-label" x="{MARGIN_LEFT + plot_w - 4}" '
            f'y="{y(capacity) - 6:.1f}" text-anchor="end" fill="{CAPACITY_COLOUR}">'
            f"{escape(budget.gpu.name)}: {format_bytes(capacity)}</text>"
        )
    legend_x = MARGIN_LEFT + plot_w + 16
    entries = [(TERM_COLOURS.get(n, "#999999"), _label(n)) for n in seen]
    entries.append(("band", "band of the device total"))
    if measured is not None:
        entries.append((MEASURED_COLOUR, escape(measured.label)))
    for i, (colour, name) in enumerate(entries):
        ly = MARGIN_TOP + 8 + i * 18
        swatch = (
            f'<rect class="band" x="{legend_x}" y="{ly - 9}" width="12" height="12"/>'
            if colour == "band"
            else f'<rect x="{legend_x}" y="{ly - 9}" width="12" height="12" fill="{colour}"/>'
        )
        parts.append(f'{swatch}<text class="legend" x="{legend_x + 18}" y="{ly + 1}">{name}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _phase_table(budget: Any) -> str:
    names: list[str] = []
    for phase in budget.phases:
        for component, term in phase.components.items():
            if term.bytes > 0 and component.value not in names:
                names.append(component.value)
    head = "".join(
        f"<th>{escape(_label(p.phase.value))}<br><small>{escape(p.moment)}</small></th>"
        for p in budget.phases
    )
    rows = []
    for name in names:
        cells = []
        for phase in budget.phases:
            term = next((t for c, t in phase.components.items() if c.value == name), None)
            cells.append(f"<td>{format_bytes(term.bytes) if term and term.bytes else '—'}</td>")
        rows.append(f"<tr><th>{escape(_label(name))}</th>{''.join(cells)}</tr>")
    totals = "".join(f"<td><b>{format_bytes(p.allocated_bytes)}</b></td>" for p in budget.phases)
    rows.append(f"<tr><th>allocated</th>{totals}</tr>")
    return f'<table class="phases"><tr><th></th>{head}</tr>{"".join(rows)}</table>'


def _formula_table(budget: Any) -> str:
    rows = []
    for component, term in budget.peak.components.items():
        if term.bytes:
            rows.append((_label(component.value), term.bytes, term.formula))
    rows.append(("allocated peak", budget.allocated_peak_bytes, "torch.cuda.max_memory_allocated"))
    for overhead, term in budget.overheads.items():
        rows.append((f"+ {_label(overhead.value)}", term.bytes, term.formula))
    rows.append(("device total", budget.device_total_bytes, "what nvidia-smi shows"))
    body = "".join(
        f"<tr><th>{escape(name)}</th><td>{format_bytes(size)}</td><td>{escape(formula)}</td></tr>"
        for name, size, formula in rows
    )
    return (
        '<table class="formulas"><tr><th>term</th><th>memory</th><th>formula</th></tr>'
        f"{body}</table>"
    )


STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 16px 24px;
  color: var(--vscode-editor-foreground, #1f1f1f);
  background: var(--vscode-editor-background, #fff); }
h1 { font-size: 18px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 22px 0 6px; }
.verdict { font-size: 15px; margin: 4px 0 12px; }
.over { color: #c62828; } .fits { color: #2e7d32; }
.chart text { fill: currentColor; font-size: 11px; } .chart .grid { stroke: #8884; }
.chart .band { fill: #8888; stroke: #555; } .stale { color: #b26a00; }
table { border-collapse: collapse; margin: 4px 0; } th, td { padding: 3px 8px; text-align: right;
  border-bottom: 1px solid #8884; vertical-align: top; } th:first-child { text-align: left; }
.formulas td:last-child { text-align: left; font-family: ui-monospace, monospace; font-size: 12px; }
ul { margin: 4px 0; padding-left: 20px; }
"""


def breakdown_html(
    analysis: Any,
    findings: list[Any] | None = None,
    *,
    title: str | None = None,
    measured: Measured | None = None,
    measured_rows: list[dict[str, Any]] | None = None,
    local_runs: list[str] | None = None,
    note: str | None = None,
) -> str:
    """The whole page. `measured`: a measured device total for the chart's mark;
    `measured_rows`: a verify report's comparison rows (what, predicted_bytes,
    measured_bytes); `local_runs`: lines naming recorded runs; `note`: a line above the
    verdict (the text has changed since, ...)."""
    from llmmem.report.markdown import verdict_line

    plan = analysis.plan
    heading = escape(title or f"llmmem: {plan.path}")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        f"<title>{heading}</title><style>{STYLE}</style></head><body>",
        f"<h1>{heading}</h1>",
    ]
    if note:
        parts.append(f'<p class="stale">{escape(note)}</p>')
    budget, spec = analysis.budget, analysis.spec
    if budget is None or spec is None:
        reasons = ([analysis.model_error] if analysis.model_error else []) + analysis.problems
        parts.append('<p class="verdict">No estimate for this file.</p>')
        parts.append("<ul>" + "".join(f"<li>{escape(r)}</li>" for r in reasons) + "</ul>")
    else:
        verdict = verdict_line(analysis).replace("**", "")
        css = "over" if budget.fits is False else ("fits" if budget.fits else "")
        parts.append(f'<p class="verdict {css}">{escape(verdict)}</p>')
        parts.append(
            f"<p>{escape(spec.model_id)}: {spec.total_params / 1e9:.2f}B parameters, "
            f"{budget.trainable_params / 1e6:,.1f}M trainable. Peak in "
            f"<b>{escape(_label(budget.peak.phase.value))}</b> ({escape(budget.peak.moment)}).</p>"
        )
        parts.append(chart_svg(budget, measured))
        if measured_rows:
            parts.append("<h2>Measured beside predicted</h2>")
            rows = "".join(
                f"<tr><th>{escape(str(row.get('what', '')))}</th>"
                f"<td>{_bytes(row.get('predicted_bytes'))}</td>"
                f"<td>{_bytes(row.get('measured_bytes'))}</td></tr>"
                for row in measured_rows
            )
            parts.append(
                f"<table><tr><th></th><th>predicted</th><th>measured</th></tr>{rows}</table>"
            )
        if local_runs:
            parts.append("<h2>Local runs of this setup</h2>")
            parts.append("<ul>" + "".join(f"<li>{escape(r)}</li>" for r in local_runs) + "</ul>")
        parts.append("<h2>By moment of the step</h2>")
        parts.append(_phase_table(budget))
        parts.append("<h2>At the peak, with the formulas</h2>")
        parts.append(_formula_table(budget))
        notes = list(budget.notes) + list(analysis.problems)
        if notes:
            parts.append("<h2>Notes</h2>")
            parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    if findings:
        parts.append("<h2>Findings</h2><ul>")
        for finding in findings:
            line = finding.range.start_line + 1 if finding.range else 1
            parts.append(
                f"<li><b>{escape(finding.code)}</b> ({escape(finding.severity.value)}, line "
                f"{line}): {escape(finding.message)}</li>"
            )
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _bytes(value: Any) -> str:
    return format_bytes(int(value)) if isinstance(value, (int, float)) and value else "—"

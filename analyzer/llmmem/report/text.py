"""The budget as a terminal table (rich): components at the peak, phases, overheads, the verdict."""

from __future__ import annotations

from typing import Any

from llmmem.budget.bands import format_with_band
from llmmem.budget.result import Budget
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes

BAR_WIDTH = 40
VERDICT_MARKUP = {
    "fits": "[green]fits[/green]",
    "tight": "[yellow]tight[/yellow]: the band crosses the capacity",
    "does not fit": "[red]does not fit[/red]",
}


def usage_bar(used: int, capacity: int, width: int = BAR_WIDTH) -> str:
    filled = min(width, round(width * used / capacity)) if capacity else width
    over = used > capacity
    return ("█" * filled + "░" * (width - filled)) + (" over" if over else "")


def render_budget(
    budget: Budget,
    spec: ModelSpec,
    *,
    setup_lines: list[tuple[str, str, str]],
    extra_lines: list[str] | None = None,
    console: Any = None,
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(emoji=False)
    origin = f"{spec.source.value}" + (f": {spec.source_detail}" if spec.source_detail else "")
    console.print(
        f"[bold]{escape(spec.model_id)}[/bold]  {spec.total_params / 1e9:.2f}B params "
        f"({escape(f'{spec.whole_architecture}, from {origin}')})"
    )
    if spec.is_guess:
        console.print("[yellow]the model's shapes are a guess from its name[/yellow]")
    setup = Table(show_header=False, box=None, pad_edge=False)
    for key, value, provenance in setup_lines:
        setup.add_row(f"  {escape(key)}", escape(value), f"[dim]{escape(provenance)}[/dim]")
    console.print(setup)

    peak = budget.peak
    table = Table(title=escape(f"peak: {peak.phase.value} — {peak.moment}"), title_justify="left")
    table.add_column("component")
    table.add_column("memory", justify="right")
    table.add_column("share", justify="right")
    table.add_column("formula", overflow="fold")
    total = peak.allocated_bytes or 1
    for component, term in peak.components.items():
        table.add_row(
            component.value,
            format_bytes(term.bytes),
            f"{100 * term.bytes / total:.0f}%",
            escape(term.formula),
        )
    table.add_row(
        "[bold]allocated peak[/bold]",
        f"[bold]{format_bytes(peak.allocated_bytes)}[/bold]",
        "",
        "torch.cuda.max_memory_allocated",
    )
    for overhead, term in budget.overheads.items():
        table.add_row(
            f"[dim]+ {overhead.value}[/dim]", format_bytes(term.bytes), "", escape(term.formula)
        )
    band = budget.band
    table.add_row(
        "[bold]device total[/bold]",
        f"[bold]{format_with_band(budget.device_total_bytes, band)}[/bold]",
        "",
        "what nvidia-smi shows (band in brackets)",
    )
    console.print(table)
    console.print(f"[dim]band: {escape(band.basis)}[/dim]")

    phases = Table(title="phases", title_justify="left", box=None)
    phases.add_column("phase")
    phases.add_column("allocated", justify="right")
    phases.add_column("moment")
    for phase in budget.phases:
        phases.add_row(phase.phase.value, format_bytes(phase.allocated_bytes), escape(phase.moment))
    console.print(phases)
    if budget.first_step_allocated_peak_bytes is not None:
        console.print(
            f"first step (no optimizer states yet): "
            f"{format_bytes(budget.first_step_allocated_peak_bytes)} allocated"
        )

    if budget.gpu is not None and spec.is_guess:  # no verdict from a guessed shape (LLM017)
        console.print(
            f"{format_with_band(budget.device_total_bytes, band)} with the guessed shapes, "
            f"against {format_bytes(budget.gpu.capacity_bytes)} on {escape(budget.gpu.name)}: "
            "fit unknown (name the model's config.json for a verdict)"
        )
    elif budget.gpu is not None:
        cap = budget.gpu.capacity_bytes
        headroom = budget.headroom_bytes or 0
        verdict = VERDICT_MARKUP[budget.verdict or "fits"]
        console.print(
            f"{usage_bar(budget.device_total_bytes, cap)} "
            f"{format_with_band(budget.device_total_bytes, band)} of {format_bytes(cap)} on "
            f"{escape(budget.gpu.name)}: {verdict} "
            f"({'headroom' if headroom >= 0 else 'short by'} {format_bytes(abs(headroom))})"
        )
    for line in extra_lines or []:
        console.print(escape(line))
    for note in budget.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")

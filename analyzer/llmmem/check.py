"""One file, start to finish: settings, plan, analysis, findings (suppressions and severities).

`check_text` is what `llmmem-lint`, `llmmem explain` and the language server run for a file, so
the three agree on every number. It never raises for bad input: what cannot be read becomes a
plan problem or a missing estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from llmmem.errors import UsageError
from llmmem.extract import ProjectSettings, extract_plan, find_project_settings
from llmmem.plan import Provenance, Sourced
from llmmem.rules.finding import Finding, Severity
from llmmem.scenario import Analysis, analyze

SEVERITY_NAMES = {"error": Severity.ERROR, "warning": Severity.WARNING, "info": Severity.INFO}


@dataclass
class Checked:
    analysis: Analysis
    findings: list[Finding]
    settings: ProjectSettings


def require_known_gpus(gpu: str | None, settings: ProjectSettings) -> None:
    """A command's `--gpu`, else `[tool.llmmem] gpu`, must name a GPU: an unknown one is a
    usage error (exit 2, one line with the close matches), not a problem line in a report. So is
    a `[tool.llmmem]` value of the wrong type (`settings.errors`: the key and the type)."""
    from llmmem.gpus import gpu_from_flag

    if settings.errors:
        raise UsageError("; ".join(settings.errors))

    if gpu is not None:
        gpu_from_flag(gpu)
    elif settings.gpu:
        gpu_from_flag(settings.gpu, where=f"{settings.path or 'pyproject.toml'} [tool.llmmem] gpu")


def check_text(
    path: Path,
    text: str,
    *,
    gpu: str | None = None,
    fallback_gpu: str | None = None,
    hub: bool = True,
    hub_timeout_s: float = 3.0,
    world_size: int | None = None,
    severity: dict[str, str] | None = None,
    select: set[str] | None = None,
    settings: ProjectSettings | None = None,
) -> Checked:
    """Lint one file's text.

    `gpu` (a command-line flag) wins over everything; `fallback_gpu` (an editor setting, the
    detected GPU) is used only when neither the file's pragma nor `[tool.llmmem]` names one.
    `world_size` likewise fills in only a world size nothing in the files set. `severity` maps a
    rule code to error/warning/info/off and applies after `[tool.llmmem] severity`.
    """
    if settings is None:
        settings = find_project_settings(path)
    plan = extract_plan(path, text, settings=settings)
    if world_size and plan.distributed.world_size.source in (
        Provenance.DEFAULT,
        Provenance.ASSUMED,
    ):
        plan.distributed.world_size = Sourced(
            value=world_size, source=Provenance.PRAGMA, note="the editor's world-size setting"
        )
    chosen_gpu = gpu or (None if plan.gpu is not None else fallback_gpu)
    analysis = analyze(
        plan,
        gpu=chosen_gpu,
        hub=hub and settings.hub,
        hub_timeout_s=hub_timeout_s,
        local_model_paths=settings.local_model_paths,
    )
    if chosen_gpu and not gpu and analysis.gpu is not None:
        analysis.gpu_source = "setting"

    from llmmem.extract.pragmas import parse_suppressions
    from llmmem.rules import run_rules

    levels = {**(settings.severity or {}), **(severity or {})}
    suppressed = parse_suppressions(text)
    kept = []
    for finding in run_rules(analysis, text):
        line = finding.range.start_line if finding.range else 0
        codes = suppressed.get(line)
        if codes is not None and (not codes or finding.code in codes):
            continue
        if select and finding.code not in select:
            continue
        level = levels.get(finding.code)
        if level == "off":
            continue
        if level in SEVERITY_NAMES:
            finding = replace(finding, severity=SEVERITY_NAMES[level])
        kept.append(finding)
    return Checked(analysis=analysis, findings=kept, settings=settings)

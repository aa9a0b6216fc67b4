"""The local runs of a prediction's setup, as a person reads them beside the prediction.

`llmmem calibrate add` (and the Trainer callback) append measured runs to the workspace's
`.llmmem/calibration.jsonl`; a budget whose setup has such rows carries them as its
`local_evidence` (ratios and the file). Here the rows themselves are read back for the line an
editor shows: `measured on H100 on 2026-11-02: 28.8 GiB (predicted 27.8 GiB)`. A run recorded
for this very file is preferred; a run of the same setup recorded for another file names its
model, as its numbers are that model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmem.units import format_bytes

# the figures a row may carry, the one nearest to what nvidia-smi shows first
METRICS = ("device", "reserved", "allocated")


@dataclass(frozen=True)
class LocalRun:
    gpu: str
    recorded: str  # ISO date and time of the record
    metric: str  # "device", "reserved" or "allocated"
    measured_bytes: int
    predicted_bytes: int
    model: str
    for_file: str  # the file the run was recorded for
    same_file: bool  # recorded for the file being shown

    @property
    def date(self) -> str:
        return self.recorded[:10]

    def line(self) -> str:
        """`measured on H100 on 2026-11-02: 28.8 GiB (predicted 27.8 GiB)`; the metric is named
        where it is not the device total, the model where the run was another file's."""
        what = "" if self.metric == "device" else f" {self.metric}"
        other = "" if self.same_file else f" ({self.model}, {Path(self.for_file).name})"
        return (
            f"measured on {self.gpu} on {self.date}{other}:{what} "
            f"{format_bytes(self.measured_bytes)} (predicted {format_bytes(self.predicted_bytes)})"
        )


def _same_path(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except (OSError, RuntimeError, ValueError):
        return False


def _figures(row: dict[str, Any]) -> tuple[str, int, int] | None:
    measured, predicted = row.get("measured"), row.get("predicted")
    if not isinstance(measured, dict) or not isinstance(predicted, dict):
        return None
    for metric in METRICS:
        m, p = measured.get(metric), predicted.get(metric)
        if isinstance(m, (int, float)) and isinstance(p, (int, float)) and m > 0 and p > 0:
            return metric, int(m), int(p)
    return None


def setup_key_of(analysis: Any) -> str | None:
    """The calibration key of the analysis's setup (GPU, framework class, method, sharding)."""
    budget = analysis.budget
    if budget is None or budget.gpu is None or not budget.band_class:
        return None
    from llmmem.calibration.store import framework_class, setup_key

    framework = framework_class(analysis.plan.framework, budget.band_class.split("/")[0])
    return setup_key(budget.gpu.name, framework, budget.band_class)


def local_runs(analysis: Any, path: Path | None = None) -> list[LocalRun]:
    """The recorded runs of the analysis's setup, newest first, those recorded for `path` (the
    plan's file when not given) before the others; none where the budget has no local
    evidence or the file cannot be read."""
    budget = analysis.budget
    evidence = getattr(budget, "local_evidence", None) if budget is not None else None
    key = setup_key_of(analysis)
    if evidence is None or key is None:
        return []
    from llmmem.calibration.store import read_rows

    target = path if path is not None else Path(analysis.plan.path)
    runs = []
    try:
        rows = read_rows(Path(evidence.path))
    except OSError:
        return []
    for row in rows:
        if row.get("key") != key:
            continue
        figures = _figures(row)
        if figures is None:
            continue
        metric, measured, predicted = figures
        for_file = str(row.get("for") or "")
        runs.append(
            LocalRun(
                gpu=str(row.get("gpu") or budget.gpu.name),
                recorded=str(row.get("recorded") or ""),
                metric=metric,
                measured_bytes=measured,
                predicted_bytes=predicted,
                model=str(row.get("model") or "another model"),
                for_file=for_file,
                same_file=bool(for_file) and _same_path(for_file, target),
            )
        )
    runs.sort(key=lambda run: run.recorded, reverse=True)
    runs.sort(key=lambda run: not run.same_file)  # stable: this file's first, newest first
    return runs


def latest_run_line(analysis: Any, path: Path | None = None) -> str | None:
    """The line for the most telling run (this file's newest, else the setup's newest), with
    how many more there are; None where there is none."""
    runs = local_runs(analysis, path)
    if not runs:
        return None
    more = len(runs) - 1
    tail = f" · {more} more local run{'s' * (more != 1)}" if more else ""
    line = runs[0].line()
    return line[0].upper() + line[1:] + tail

"""The error bands of the predictions, per class, from the measured evidence.

    python bench/bands.py            # print each class: rows, the band, its coverage
    python bench/bands.py --write    # and write analyzer/llmmem/budget/bands.json

The evidence: every case of the GPU runs under bench/gpu/ (default allocator settings; each
case gives its allocated peak, reserved peak and NVML's figure) and the published rows of
../shared/calibration/measured.jsonl and measured-wide.jsonl, each predicted with today's core.
A class is framework × method × metric × sharding (llmmem.budget.bands.band_class). For each
class the band is the central SHARE of its rows' measured / predicted ratios by order statistics:
with n rows, the floor((1 - SHARE) / 2 · n) lowest and highest ratios are left out. A class with
fewer than MIN_ROWS rows uses the default band: the lowest and the highest ratio of all rows of
every class, widened to whole 5% steps.

`tests/budget/test_bands.py` recomputes this and checks the shipped file is current.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "analyzer"))

from accuracy import SET_APART  # noqa: E402
from calibration import (  # noqa: E402
    CALIBRATION_FILE,
    WIDE_CALIBRATION_FILE,
    RowSkipped,
    case_from_row,
    load_rows,
    wide_case_from_row,
)

from llmmem.budget.bands import ALLOCATED, BANDS_FILE, DEVICE, RESERVED, band_class  # noqa: E402
from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.verify.grid import measured_cases, predict_case, setup_for  # noqa: E402

GPU_RUNS = HERE / "gpu"
SHARE = 0.8
MIN_ROWS = 5
METRICS = {
    "max_memory_allocated": ALLOCATED,
    "max_memory_reserved": RESERVED,
    "nvml_used": DEVICE,
}
VERSIONED = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "llmmem")


@dataclass(frozen=True)
class Residual:
    row_class: str
    row_id: str
    predicted: int
    measured: int

    @property
    def ratio(self) -> float:
        """measured / predicted: the band multiplies a prediction by these."""
        return self.measured / self.predicted


def gpu_residuals() -> list[Residual]:
    out = []
    # expandable segments are another allocator setting: not the default user's
    paths = [p for p in sorted(GPU_RUNS.glob("*/grid-*.json")) if "expandable" not in p.stem]
    for path, case, config, measurement in measured_cases(paths):
        if not case.measures_the_estimate:
            continue  # offloading, torch.compile: the band's floor is their evidence
        setup = setup_for(case)
        totals = predict_case(case, config, case.model or case.family)["totals"]
        workspaces = totals["overheads"].get("cublas_workspaces", {}).get("bytes", 0)
        row_id = f"{path.parent.name}/{case.name}"
        for metric, predicted, measured in (
            (
                ALLOCATED,
                totals["allocated_peak_bytes"] + workspaces,
                measurement["allocated_peak_bytes"],
            ),
            (RESERVED, totals["reserved_peak_bytes"], measurement.get("reserved_peak_bytes")),
            (DEVICE, totals["device_total_bytes"], measurement.get("device_used_peak_bytes")),
        ):
            if measured:
                out.append(Residual(band_class(setup, metric), row_id, predicted, measured))
    return out


def calibration_residuals() -> list[Residual]:
    out = []
    cases = [case_from_row(row) for row in load_rows(CALIBRATION_FILE)]
    if WIDE_CALIBRATION_FILE.exists():
        for row in load_rows(WIDE_CALIBRATION_FILE):
            try:
                cases.append(wide_case_from_row(row))
            except RowSkipped:
                continue
    for case in cases:
        if case.row_id in SET_APART:
            continue  # measured beyond the training step: not evidence of its error
        budget = estimate_budget(case.spec, case.setup, case.gpu)
        out.append(
            Residual(
                band_class(case.setup, METRICS[case.metric]),
                case.row_id,
                case.predicted_bytes(budget),
                case.measured_bytes,
            )
        )
    return out


def central(ratios: list[float], share: float = SHARE) -> tuple[float, float]:
    """The central `share` of the ratios by order statistics (the extremes left out)."""
    ordered = sorted(ratios)
    cut = math.floor((1 - share) / 2 * len(ordered))
    return ordered[cut], ordered[len(ordered) - 1 - cut]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _gpu_versions(folder: Path) -> dict[str, str]:
    log = folder / "run.log"
    if not log.exists():
        return {}
    text = log.read_text(encoding="utf-8", errors="replace")
    found = {}
    for name in VERSIONED:
        match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        if match:
            found[name] = match.group(1)
    gpu = re.search(r"^(NVIDIA [^,]+), ([\d.]+),", text, re.MULTILINE)
    if gpu:
        found["gpu"] = gpu.group(1)
        found["driver"] = gpu.group(2)
    return found


def evidence_description(residuals: list[Residual]) -> dict[str, Any]:
    runs = sorted({r.row_id.split("/")[0] for r in residuals if "/" in r.row_id})
    files = [CALIBRATION_FILE] + [WIDE_CALIBRATION_FILE] * WIDE_CALIBRATION_FILE.exists()
    return {
        "gpu_runs": {
            run: {
                "cases": len({r.row_id for r in residuals if r.row_id.startswith(run + "/")}),
                **_gpu_versions(GPU_RUNS / run),
            }
            for run in runs
        },
        "calibration_files": {
            path.name: {"rows": len(load_rows(path)), "sha256": _sha256(path)} for path in files
        },
        "rows": len(residuals),
        # rows whose measurement a moment outside the training step sets (bench/accuracy.py)
        "set_apart": dict(sorted(SET_APART.items())),
    }


def residuals() -> list[Residual]:
    return gpu_residuals() + calibration_residuals()


def compute(rows: list[Residual] | None = None) -> dict[str, Any]:
    residuals_ = rows if rows is not None else residuals()
    by_class: dict[str, list[float]] = defaultdict(list)
    for r in residuals_:
        by_class[r.row_class].append(r.ratio)
    every = [r.ratio for r in residuals_]
    classes = {}
    for name in sorted(by_class):
        ratios = by_class[name]
        low, high = central(ratios) if len(ratios) >= MIN_ROWS else (min(ratios), max(ratios))
        classes[name] = {
            "rows": len(ratios),
            "ratio_low": round(low, 4),
            "ratio_high": round(high, 4),
        }
    return {
        "about": (
            "measured / predicted per class (framework/method/metric/sharding): the central "
            f"{round(100 * SHARE)}% of the class's rows; written by bench/bands.py --write"
        ),
        "share": SHARE,
        "share_label": f"{round(100 * SHARE)}%",
        "min_rows": MIN_ROWS,
        "default": {
            "ratio_low": math.floor(min(every) * 20) / 20,
            "ratio_high": math.ceil(max(every) * 20) / 20,
        },
        "evidence": evidence_description(residuals_),
        "classes": classes,
    }


def coverage(rows: list[Residual], table: dict[str, Any]) -> dict[str, float]:
    """The share of each class's rows whose measured value the class's band holds."""
    held: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        entry = table["classes"][r.row_class]
        held[r.row_class].append(entry["ratio_low"] <= round(r.ratio, 4) <= entry["ratio_high"])
    return {name: sum(hits) / len(hits) for name, hits in held.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {BANDS_FILE.name}")
    args = parser.parse_args(argv)
    rows = residuals()
    table = compute(rows)
    covered = coverage(rows, table)
    print(f"{'class':<34} {'rows':>4} {'band (measured vs predicted)':>30} {'covers':>7}")
    for name, entry in table["classes"].items():
        note = "" if entry["rows"] >= MIN_ROWS else "  (few rows: the default band applies)"
        print(
            f"{name:<34} {entry['rows']:>4} {100 * (entry['ratio_low'] - 1):>+13.1f}% .. "
            f"{100 * (entry['ratio_high'] - 1):>+6.1f}%      {100 * covered[name]:>5.0f}%{note}"
        )
    default = table["default"]
    print(
        f"default band: {100 * (default['ratio_low'] - 1):+.0f}% .. "
        f"{100 * (default['ratio_high'] - 1):+.0f}% ({table['evidence']['rows']} rows in all)"
    )
    if args.write:
        BANDS_FILE.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {BANDS_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

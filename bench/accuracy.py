"""Predicted vs measured peaks on the published calibration rows.

    python bench/accuracy.py [--verbose]

Two files under ../shared/calibration/: `measured.jsonl` (21 rows with their full configs) and
`measured-wide.jsonl` (published tables of other teams: fms-acceleration's HF Trainer + TRL +
PEFT runs on an A100-80GB and Answer.AI's FSDP-QLoRA runs on two 24 GB GPUs). For each: one
line per row (predicted, measured, error against the row's own metric), the median and maximum
absolute error, and for the wide rows the rows within 10%, a table per class (method × metric ×
sharding) and the rows skipped, each with what the estimate cannot express yet. A row whose
measurement is set by a moment outside the training step (SET_APART, with the reason read in the
script that measured it) is printed, listed with its reason, and left out of its class's range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import (  # noqa: E402
    WIDE_CALIBRATION_FILE,
    CalibrationCase,
    RowSkipped,
    case_from_row,
    load_rows,
    wide_case_from_row,
    wide_class,
)

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.units import format_bytes  # noqa: E402

# Rows whose measured peak is not the training step's: the reason is read in the measuring
# script at the commit the row names, and the numbers are replayed through the caching-allocator
# rules (tests/budget/test_fsdp_qlora_wrap_floor.py). A row is set apart where that replayed
# floor is above the step's estimate by more than the replay's own error (2%); it stays in the
# listing and in the medians, only its class's range leaves it out.
#
# fsdp_qlora 50efa1e resets the peak statistics (train.py:789) after the FSDP1 wrap (704-717)
# with no empty_cache in between, so max_memory_reserved starts at what the wrap left reserved:
# rank 0 copies each unit's CPU weights to the GPU, broadcasts them in 250 MiB buckets,
# flattens them and keeps its half; the blocks it frees stay cached on the default stream. The
# step's all-gathers (FSDP1's unshard stream), its gradient shards (post-backward stream) and
# AdamW's state and foreach temporary (LoRA shards under 1 MiB: the small pool) cannot use those
# blocks. Replayed for Llama-2-7B batch 1: QLoRA 3.73 GiB after the wrap (the script's log:
# 3.72) + 0.71 + 0.14 + 0.42 = 5.01 GiB at 512 tokens (4.98 measured) and 5.25 at 2048, where
# the step's own tensors outgrow the cache by 0.24 (5.21 measured; the step's estimate, 5.2,
# lands on it); LoRA 8.53 + 1.28 + 0.14 + 0.42 = 10.37 GiB at 512 and 2048 alike (10.24 and
# 10.22 measured; the step's estimates 9.2 and 10.3). Larger batches outgrow the floor.
_WRAP_FLOOR = (
    "the peak is fsdp_qlora's FSDP1 wrap, not the step: train.py (50efa1e) resets the peak "
    "statistics (line 789) after the wrap with no empty_cache, and the step's all-gathers, "
    "gradient shards and optimizer states cannot use the blocks the wrap left cached"
)
SET_APART = {
    "aai-l2-7b-qlora-fsdp-ctx512-bs1": f"{_WRAP_FLOOR}: 3.73 + 0.71 + 0.14 + 0.42 = 5.01 GiB",
    "aai-l2-7b-lora-fsdp-ctx512-bs1": f"{_WRAP_FLOOR}: 8.53 + 1.28 + 0.14 + 0.42 = 10.37 GiB",
}


@dataclass(frozen=True)
class RowError:
    row_id: str
    row_class: str
    error: float  # predicted / measured - 1


@dataclass(frozen=True)
class WideSummary:
    errors: list[RowError]
    skipped: dict[str, str]  # row id -> why
    set_apart: dict[str, str] = field(default_factory=dict)  # row id -> why (in `errors` too)

    @property
    def median(self) -> float:
        return statistics.median(abs(e.error) for e in self.errors)

    @property
    def within_10(self) -> int:
        return sum(1 for e in self.errors if abs(e.error) <= 0.10)


def _row_line(case: CalibrationCase, verbose: bool) -> float:
    budget = estimate_budget(case.spec, case.setup, case.gpu)
    predicted = case.predicted_bytes(budget)
    error = predicted / case.measured_bytes - 1
    print(
        f"{case.row_id:<44} {case.metric:<21} {format_bytes(predicted):>10} "
        f"{format_bytes(case.measured_bytes):>10} {100 * error:>+6.1f}%  "
        f"{budget.peak_phase.value}"
    )
    if verbose:
        for component, term in budget.peak.components.items():
            print(f"    {component.value:<18} {format_bytes(term.bytes):>10}  {term.formula}")
        for overhead, term in budget.overheads.items():
            print(f"    + {overhead.value:<16} {format_bytes(term.bytes):>10}")
    return error


HEADER = f"{'row':<44} {'metric':<21} {'predicted':>10} {'measured':>10} {'error':>7}  peak"


def run(verbose: bool = False) -> tuple[float, float]:
    """measured.jsonl: (median, max) |error|."""
    errors: list[float] = []
    print(HEADER)
    print("-" * len(HEADER))
    for row in load_rows():
        errors.append(abs(_row_line(case_from_row(row), verbose)))
    median = statistics.median(errors)
    worst = max(errors)
    print("-" * len(HEADER))
    print(
        f"rows: {len(errors)}   median |error|: {100 * median:.1f}%   "
        f"max |error|: {100 * worst:.1f}%   (targets: 5% and 12%)"
    )
    return median, worst


def wide_errors(path: Path = WIDE_CALIBRATION_FILE, verbose: bool = False) -> WideSummary:
    """measured-wide.jsonl: each row's error and class, and the rows skipped with why."""
    errors: list[RowError] = []
    skipped: dict[str, str] = {}
    for row in load_rows(path):
        try:
            case = wide_case_from_row(row)
        except RowSkipped as why:
            skipped[str(row["id"])] = str(why)
            continue
        error = _row_line(case, verbose)
        errors.append(RowError(case.row_id, wide_class(case), error))
    set_apart = {e.row_id: SET_APART[e.row_id] for e in errors if e.row_id in SET_APART}
    return WideSummary(errors, skipped, set_apart)


def class_ranges(summary: WideSummary) -> dict[str, tuple[int, float, float, float, int]]:
    """Per class: (rows, median |error|, lowest, highest error, rows set apart); the range and
    the median leave out the rows set apart."""
    by_class: dict[str, list[float]] = defaultdict(list)
    apart: dict[str, int] = defaultdict(int)
    for e in summary.errors:
        if e.row_id in summary.set_apart:
            apart[e.row_class] += 1
        else:
            by_class[e.row_class].append(e.error)
    out = {}
    for name in sorted(set(by_class) | set(apart)):
        errs = by_class.get(name, [])
        if not errs:
            out[name] = (0, 0.0, 0.0, 0.0, apart[name])
            continue
        median = statistics.median(map(abs, errs))
        out[name] = (len(errs), median, min(errs), max(errs), apart[name])
    return out


def run_wide(verbose: bool = False) -> WideSummary:
    print()
    print(f"published tables of other teams ({WIDE_CALIBRATION_FILE.name})")
    print(HEADER)
    print("-" * len(HEADER))
    summary = wide_errors(verbose=verbose)
    print("-" * len(HEADER))
    for row_id, why in summary.skipped.items():
        print(f"skipped {row_id}: {why}")
    answered = len(summary.errors)
    print(
        f"rows: {answered} of {answered + len(summary.skipped)}   "
        f"median |error|: {100 * summary.median:.1f}%   "
        f"within 10%: {summary.within_10} of {answered}   "
        f"max |error|: {100 * max(abs(e.error) for e in summary.errors):.1f}%"
    )
    for row_id, why in summary.set_apart.items():
        print(f"set apart {row_id}: {why}")
    print()
    print(f"{'class (method metric sharding)':<32} {'rows':>4} {'median |err|':>12} {'range':>17}")
    for name, (rows, median, low, high, apart) in class_ranges(summary).items():
        note = f"   ({apart} set apart)" if apart else ""
        print(
            f"{name:<32} {rows:>4} {100 * median:>11.1f}% "
            f"{100 * low:>+7.1f}% .. {100 * high:>+5.1f}%{note}"
        )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="show each row's components")
    args = parser.parse_args()
    run(verbose=args.verbose)
    run_wide(verbose=args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

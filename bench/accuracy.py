"""Predicted vs measured peaks on the published calibration rows.

    python bench/accuracy.py [--verbose]

Prints one line per row (predicted, measured, error against the row's own metric) and the
median and maximum absolute error. Targets: median |error| <= 5%, max <= 12%.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import case_from_row, load_rows  # noqa: E402

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.units import format_bytes  # noqa: E402


def run(verbose: bool = False) -> tuple[float, float]:
    rows = load_rows()
    errors: list[float] = []
    header = f"{'row':<36} {'metric':<21} {'predicted':>10} {'measured':>10} {'error':>7}  peak"
    print(header)
    print("-" * len(header))
    for row in rows:
        case = case_from_row(row)
        budget = estimate_budget(case.spec, case.setup, case.gpu)
        predicted = case.predicted_bytes(budget)
        error = predicted / case.measured_bytes - 1
        errors.append(abs(error))
        print(
            f"{case.row_id:<36} {row['metric']:<21} {format_bytes(predicted):>10} "
            f"{format_bytes(case.measured_bytes):>10} {100 * error:>+6.1f}%  "
            f"{budget.peak_phase.value}"
        )
        if verbose:
            for component, term in budget.peak.components.items():
                print(f"    {component.value:<18} {format_bytes(term.bytes):>10}  {term.formula}")
            for overhead, term in budget.overheads.items():
                print(f"    + {overhead.value:<16} {format_bytes(term.bytes):>10}")
    median = statistics.median(errors)
    worst = max(errors)
    print("-" * len(header))
    print(
        f"rows: {len(errors)}   median |error|: {100 * median:.1f}%   "
        f"max |error|: {100 * worst:.1f}%   (targets: 5% and 12%)"
    )
    return median, worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="show each row's components")
    args = parser.parse_args()
    run(verbose=args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

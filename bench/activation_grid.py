"""Saved activations of one transformer block: autograd on the CPU against llmmem's tally.

    python bench/activation_grid.py [--all] [--family NAME]

Prints one row per case of `tests/budget/saved_tensors.py` (family, mode, attention, measured
bytes per block, predicted, error, llmmem's formula) and, for each case outside the tolerance of
the test (3% or 512 B), every tensor the block saved: its bytes, dtype, shape, the graph nodes
that keep it, and its size in the symbols of the formula. `--all` prints that list for every case.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "budget"))

from saved_tensors import (  # noqa: E402
    BATCH,
    CASES,
    FAMILY_CONFIGS,
    SEQ,
    BlockMeasurement,
    Prediction,
    measure_case,
    predict_case,
    tolerance,
)


def widths(dims: dict[str, float]) -> dict[str, float]:
    """Per-token widths of the symbols: N·h -> h, b·a·s² -> a·s, k·N·I -> k·I, ..."""
    n = BATCH * SEQ
    return {
        sym: dims[sym] / n
        for sym in ("N·h", "N·q", "N·kvd", "N·I", "N·r", "N·E", "b·a·s", "b·a·s²", "k·N·h", "k·N·I")
        if dims[sym]
    }


def symbol_of(nbytes: int, itemsize: int, dims: dict[str, float]) -> str:
    """A saved storage's size in the symbols of the formula, e.g. "4·N·h" or "2·(N·q|k·N·I)"."""
    per_token = nbytes / itemsize / (BATCH * SEQ)
    if per_token == 1:
        return f"{itemsize}·N"
    names = [sym for sym, w in widths(dims).items() if w == per_token and w != 1]
    if len(names) == 1:
        return f"{itemsize}·{names[0]}"
    if names:
        return f"{itemsize}·({'|'.join(names)})"
    return f"{nbytes / (BATCH * SEQ):g} B/token"


def breakdown(measured: BlockMeasurement, prediction: Prediction) -> list[str]:
    lines = []
    for s in measured.of_kind("activation"):
        label = symbol_of(s.nbytes, s.dtype.itemsize, prediction.dims)
        lines.append(f"      {s.describe()}  = {label}")
    others = {k: measured.bytes_of(k) for k in ("parameter", "weight_copy", "shared")}
    lines.append(
        "      not counted: "
        + ", ".join(f"{k} {v} B" for k, v in others.items())
        + "".join(
            f"\n        {k}: {s.describe()}"
            for k in ("weight_copy", "shared")
            for s in measured.of_kind(k)
        )
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print the saved tensors of every case")
    parser.add_argument("--family", choices=sorted(FAMILY_CONFIGS))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    cases = [c for c in CASES if args.family in (None, c.family)]
    header = (
        f"{'family':<10} {'mode':<10} {'attn':<6} {'measured':>10} {'predicted':>10} "
        f"{'error':>8}  formula"
    )
    print(f"one block, b={BATCH}, s={SEQ}; bytes per block")
    print(header)
    print("-" * 120)
    details: list[str] = []
    failures = 0
    for case in cases:
        measured = measure_case(case)
        prediction = predict_case(case)
        got = measured.activation_bytes
        error = (prediction.bytes - got) / got
        bad = abs(prediction.bytes - got) > tolerance(got)
        failures += bad
        flag = " <-- mismatch" if bad else ""
        print(
            f"{case.family:<10} {case.mode:<10} {case.attn:<6} {got:>10} {prediction.bytes:>10} "
            f"{100 * error:>+7.1f}%  {prediction.formula}{flag}"
        )
        if bad or args.all:
            details.append(f"\n{case.id}: measured {got}, predicted {prediction.bytes}")
            details.extend(breakdown(measured, prediction))
    print("\n".join(details))
    print(f"\n{failures} of {len(cases)} cases outside the tolerance (3% or 512 B)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tables of a GPU run (`bench/gpu_run.sh`): predicted against measured, per phase and in total.

    python bench/gpu_report.py [DIR ...] [--now]   # default: every run under bench/gpu/

For each grid case: the error of the allocated peak of each phase (max_memory_allocated), of the
reserved peak (max_memory_reserved: allocated plus the caching allocator's slack) and of what
is on the device (NVML, as nvidia-smi shows it: reserved plus the CUDA context); then the
allocator's slack and the context as measured beside the terms the core adds for them. The
predictions are the ones the run recorded (the core as it was when the run was made); with
`--now` they are made again with today's core, from the same cases.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

GIB = 2**30
HERE = Path(__file__).resolve().parent


def _error(predicted: int | None, measured: int | None) -> float | None:
    if not predicted or not measured:
        return None
    return (predicted - measured) / measured


def _cell(value: float | None) -> str:
    return f"{100 * value:+6.1f}%" if value is not None else "      —"


def _predict_now(row: dict[str, Any]) -> dict[str, Any]:
    """Today's core on the same case (the run's `predicted` is the core of its day)."""
    sys.path.insert(0, str(HERE.parent / "analyzer"))
    from llmmem.verify.grid import GridCase, config_for, predict_case

    case = GridCase.from_json(row)
    return predict_case(case, config_for(case.family, "real", case.model), case.model or "grid")


def grid_rows(path: Path, now: bool = False) -> list[dict[str, Any]]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for row in rows:
        measurement = row.get("measurement") or {}
        if row.get("error") or not measurement.get("phases"):
            out.append({"case": row["case"], "error": row.get("error") or "no phases"})
            continue
        if now:
            fresh = _predict_now(row)
            predicted_phases, predicted = fresh["phases"], fresh["totals"]
        else:
            predicted_phases, predicted = row["predicted_allocated_bytes"], row["predicted"]
        measured_phases = {p["phase"]: p["peak_bytes"] for p in measurement["phases"]}
        # on a GPU the allocated figures include the cuBLAS workspaces (a core that has the
        # term adds it; one that had none compares as it was)
        cublas = predicted["overheads"].get("cublas_workspaces", {}).get("bytes", 0)
        predicted_phases = {phase: got + cublas for phase, got in predicted_phases.items()}
        allocated = measurement["allocated_peak_bytes"]
        reserved = measurement.get("reserved_peak_bytes")
        device = measurement.get("device_used_peak_bytes")
        capacity = measurement.get("capacity_bytes") or 0
        before = capacity - (measurement.get("free_before_bytes") or capacity)
        out.append(
            {
                "case": row["case"],
                "method": row["method"],
                "phases": {
                    phase: _error(predicted_phases.get(phase), got)
                    for phase, got in measured_phases.items()
                },
                "allocated": _error(predicted["allocated_peak_bytes"] + cublas, allocated),
                "reserved": _error(predicted["reserved_peak_bytes"], reserved),
                "device": _error(predicted["device_total_bytes"], device),
                "measured_allocated": allocated,
                "measured_reserved": reserved,
                "measured_device": device,
                "device_source": measurement.get("device_used_source"),
                "slack_measured": (reserved - allocated) if reserved else None,
                "slack_predicted": predicted["overheads"]["allocator_slack"]["bytes"],
                "used_before_build": before,
                "seconds": row.get("seconds"),
                "floor": (predicted.get("floor") or {}).get("allocated_peak_bytes"),
                "estimate": predicted["allocated_peak_bytes"] + cublas,
                "cublas": cublas,
            }
        )
    return out


def band_table(rows: list[dict[str, Any]]) -> str:
    """Settings whose estimate is the top of a band (activation offloading, torch.compile):
    where the measured allocated peak lands between the floor (0) and the estimate (1)."""
    lines = [
        "| case | measured (GiB) | floor (GiB) | estimate (GiB) | where in the band |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r or r.get("floor") is None:
            continue
        floor = r["floor"] + r["cublas"]
        got, top = r["measured_allocated"], r["estimate"]
        where = f"{(got - floor) / (top - floor):.2f}" if top > floor else "(no band)"
        lines.append(
            f"| {r['case']} | {got / GIB:.2f} | {floor / GIB:.2f} | {top / GIB:.2f} | {where} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def grid_table(title: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"### {title}",
        "",
        "| case | fwd | bwd | step | allocated peak | reserved | on the device "
        "| measured alloc / reserved / device (GiB) | slack measured / predicted (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['error']} | | | | | | | |")
            continue
        phases = [_cell(r["phases"].get(p)) for p in ("forward", "backward", "optimizer_step")]
        measured = " / ".join(
            f"{v / GIB:.2f}" if v else "—"
            for v in (r["measured_allocated"], r["measured_reserved"], r["measured_device"])
        )
        slack = (
            f"{r['slack_measured'] / 2**20:.0f} / {r['slack_predicted'] / 2**20:.0f}"
            if r["slack_measured"] is not None
            else "—"
        )
        lines.append(
            f"| {r['case']} | {' | '.join(phases)} | {_cell(r['allocated'])} "
            f"| {_cell(r['reserved'])} | {_cell(r['device'])} | {measured} | {slack} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> str:
    ok = [r for r in rows if "error" not in r]
    lines = [f"{len(ok)} measured cases, {len(rows) - len(ok)} without a measurement"]
    for key, what in (
        ("allocated", "allocated peak"),
        ("reserved", "reserved peak"),
        ("device", "on the device"),
    ):
        errors = [abs(r[key]) for r in ok if r[key] is not None]
        signed = [r[key] for r in ok if r[key] is not None]
        if errors:
            within = sum(e <= 0.05 for e in errors)
            lines.append(
                f"- {what}: |error| median {100 * statistics.median(errors):.1f}%, "
                f"max {100 * max(errors):.1f}%, signed median "
                f"{100 * statistics.median(signed):+.1f}%, within 5%: {within} of {len(errors)}"
            )
    return "\n".join(lines)


def context_table(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    if "stages" not in data:
        return f"context: {data.get('error', 'no reading')}"
    lines = [
        f"### CUDA context on {data['device']} (torch {data['torch']}, CUDA {data['cuda']})",
        "",
        "| stage | NVML, this process (MiB) | device use since start (MiB) "
        "| allocated (MiB) | reserved (MiB) |",
        "|---|---|---|---|---|",
    ]
    for stage, reading in data["stages"].items():
        if stage == "start":
            continue

        def mib(key: str, reading: dict[str, Any] = reading) -> str:
            value = reading.get(key)
            return f"{value / 2**20:.0f}" if value is not None else "—"

        lines.append(
            f"| {stage} | {mib('nvml_process_bytes')} | {mib('nvml_device_minus_start_bytes')} "
            f"| {mib('allocated_bytes')} | {mib('reserved_bytes')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", nargs="*", help="runs' folders (default: every folder under bench/gpu)"
    )
    parser.add_argument("--now", action="store_true", help="predict with today's core")
    args = parser.parse_args(argv)
    folders = [Path(f) for f in args.folder] or sorted(
        p for p in (HERE / "gpu").iterdir() if p.is_dir()
    )
    if not folders:
        parser.error("no run under bench/gpu/")
    for context in (folder / "context.json" for folder in folders):
        if context.exists():
            print(context_table(context))
            print()
    everything = []
    paths = [path for folder in folders for path in sorted(folder.glob("grid-*.json"))]
    for path in paths:
        rows = grid_rows(path, now=args.now)
        banded = band_table(rows)
        if "expandable" not in path.stem and not banded:
            # another allocator setting, or an estimate that is the top of a band: shown,
            # not pooled
            everything += rows
        print(grid_table(f"{path.parent.name}/{path.stem}", rows))
        print()
        print(summary(rows))
        print()
        if banded:
            print(banded)
            print()
    if everything:
        print("### all grid cases (default allocator settings)")
        print(summary(everything))
    return 0


if __name__ == "__main__":
    sys.exit(main())

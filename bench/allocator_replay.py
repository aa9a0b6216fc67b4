"""Reserved memory from the step's own allocation order: a simulated step, replayed through the
caching allocator's rules, against the published reserved / nvidia-smi rows.

    python bench/allocator_replay.py [ROW_ID ...] [--transformers-loss]

For each measured-wide.jsonl row that a simulated step can run (no bitsandbytes, one process):
the step runs under FakeTensorMode at the row's real shapes with every storage's birth and death
recorded (`StorageTracker.events`), and `llmmem.verify.allocator.CachingAllocator` replays them.
Printed: the simulated allocated peak, the replayed reserved peak, their difference, and the
estimate's own allocator slack for the same row, beside the published value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calibration import (  # noqa: E402
    WIDE_CALIBRATION_FILE,
    RowSkipped,
    load_rows,
    wide_case_from_row,
)

from llmmem.budget.phases import estimate_budget  # noqa: E402
from llmmem.budget.result import Overhead  # noqa: E402
from llmmem.models.catalog import catalog_entry  # noqa: E402
from llmmem.units import GIB  # noqa: E402
from llmmem.verify import tracker as tracker_module  # noqa: E402
from llmmem.verify.allocator import replay_step  # noqa: E402
from llmmem.verify.compare import request_for  # noqa: E402
from llmmem.verify.runner import run_step  # noqa: E402

CUBLAS = 32 << 20  # a cuBLAS workspace on Hopper and Ampere (CUBLAS_WORKSPACE_CONFIG :4096:8)
VERBOSE = False
RECORDED: list[tracker_module.StorageTracker] = []


class RecordingTracker(tracker_module.StorageTracker):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.events = []
        RECORDED.append(self)


def replay_row(row: dict) -> str:
    case = wide_case_from_row(row)
    if case.setup.quant is not None:
        raise RowSkipped("bitsandbytes does not run on fake tensors")
    if case.setup.distributed.world_size > 1 and case.setup.distributed.fsdp is not None:
        if case.setup.distributed.fsdp.value != "no_shard":
            raise RowSkipped("sharded: FSDP's flat parameters are not replayed yet")
    setup = case.setup
    if setup.distributed.world_size > 1:
        from dataclasses import replace

        setup = replace(setup, distributed=replace(setup.distributed, world_size=1, fsdp=None))
    entry = catalog_entry(row["model"])
    assert entry is not None
    request = request_for(case.spec, setup, dict(entry.config), "fake")
    started = time.monotonic()
    measured, events = recorded_step(request)
    seconds = time.monotonic() - started
    allocator = replay_step(events, CUBLAS)
    budget = estimate_budget(case.spec, case.setup, case.gpu)
    slack = budget.overheads[Overhead.ALLOCATOR_SLACK].bytes
    gap = allocator.peak_reserved - measured.allocated_peak_bytes
    if VERBOSE:
        holes = [f"{size / GIB:.2f}" for size in allocator.free_at_peak[:8]]
        print(
            f"    peak reserved at event {allocator.peak_event} of {len(events)}, for a "
            f"{allocator.peak_request / GIB:.2f} GiB request; cached free blocks then "
            f"({sum(allocator.free_at_peak) / GIB:.2f} GiB): {', '.join(holes)} GiB"
        )
    return (
        f"{row['id']:<44} {row['metric']:<9} {measured.allocated_peak_bytes / GIB:>7.1f} "
        f"{allocator.peak_reserved / GIB:>8.1f} {gap / GIB:>6.2f} {slack / GIB:>6.2f} "
        f"{row['measured_bytes'] / GIB:>8.1f} {len(events):>7} {seconds:>5.0f}s"
    )


def recorded_step(request) -> tuple[object, list[tuple[object, int]]]:  # type: ignore[no-untyped-def]
    """Run a simulated step with its allocation events recorded; (measurement, events); the
    replay adds cuBLAS's workspaces (`replay_step`)."""
    RECORDED.clear()
    tracker_module.StorageTracker = RecordingTracker  # type: ignore[misc]
    try:
        measured = run_step(request)
    finally:
        tracker_module.StorageTracker = RecordingTracker.__mro__[1]  # type: ignore[misc]
    if measured.error or not RECORDED:
        raise RowSkipped(f"simulated step failed: {measured.error}")
    return measured, list(RECORDED[0].events)


def gpu_grids() -> None:
    """Our own H100 grids (bench/gpu/): the replayed reserved peak against the measured one."""
    import json

    from llmmem.verify.grid import GridCase, config_for, setup_for

    print(f"{'case':<52} {'alloc':>7} {'replayed':>8} {'measured':>8} {'error':>7} {'slack':>6}")
    errors = []
    for path in sorted((Path(__file__).resolve().parent / "gpu").glob("*/grid-*.json")):
        if "expandable" in path.name:
            # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps pages into one growing
            # segment per stream: another allocator, not replayed here
            continue
        for row in json.loads(path.read_text()):
            case = GridCase.from_json(row)
            measurement = row.get("measurement") or {}
            reserved = measurement.get("reserved_peak_bytes")
            if case.method == "qlora" or not reserved or row.get("error"):
                continue
            config = config_for(case.family, "real", case.model)
            from llmmem.models.architectures import spec_from_config
            from llmmem.models.spec import ModelSource

            spec = spec_from_config(config, model_id=case.model or "grid", source=ModelSource.LOCAL)
            request = request_for(spec, setup_for(case), config, "fake")
            try:
                measured, events = recorded_step(request)
            except RowSkipped as why:
                print(f"{case.name:<52} skipped: {why}")
                continue
            allocator = replay_step(events, CUBLAS)
            error = allocator.peak_reserved / reserved - 1
            errors.append(error)
            slack = (row.get("predicted") or {}).get("reserved_peak_bytes", 0)
            print(
                f"{path.parent.name[-8:] + ' ' + case.name:<52} "
                f"{measured.allocated_peak_bytes / GIB:>7.2f} "
                f"{allocator.peak_reserved / GIB:>8.2f} "
                f"{reserved / GIB:>8.2f} {100 * error:>+6.1f}% "
                f"{100 * (slack / reserved - 1) if slack else 0:>+5.1f}%",
                flush=True,
            )
    if errors:
        import statistics

        print(
            f"cases: {len(errors)}  median |error| of the replayed reserved peak: "
            f"{100 * statistics.median(map(abs, errors)):.1f}%  max: "
            f"{100 * max(map(abs, errors)):.1f}%  (last column: the estimate's reserved)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", nargs="*", help="row ids (default: every row it can run)")
    parser.add_argument("--gpu-grids", action="store_true", help="replay bench/gpu/ grids")
    parser.add_argument("--verbose", action="store_true", help="the holes at the peak")
    args = parser.parse_args()
    global VERBOSE
    VERBOSE = args.verbose
    if args.gpu_grids:
        gpu_grids()
        return 0
    print(
        f"{'row':<44} {'metric':<9} {'alloc':>7} {'replayed':>8} {'gap':>6} {'slack':>6} "
        f"{'measured':>8} {'events':>7} {'time':>6}"
    )
    for row in load_rows(WIDE_CALIBRATION_FILE):
        if args.rows and row["id"] not in args.rows:
            continue
        try:
            print(replay_row(row), flush=True)
        except RowSkipped as why:
            if args.rows:
                print(f"{row['id']:<44} skipped: {why}")
    print("GiB; gap = replayed reserved - simulated allocated; slack = the estimate's term")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The measured first steps beside the prediction: one log line, and one calibration row.

The row is what `llmmem calibrate add` writes (`calibrate.calibration_row`), for the running
script, in the nearest `.llmmem/calibration.jsonl` above it (`LLMMEM_CALIBRATION` or
`calibration=` name another). One measured step is compared with the first step's prediction
(no optimizer states before it); two or more with the steady step's. A CPU meter's figure is
compared with the allocated peak less cuBLAS's workspaces (a CPU has none) and says so.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

LOG = logging.getLogger("llmmem")


def finish_measurement(
    meter: Any,
    result: Any,
    steps: int,
    record: bool,
    calibration: str | None,
    script: str | None,
) -> tuple[str | None, dict[str, Any] | None]:
    """Stop `meter`; the comparison line (logged and printed) and the row written, if any."""
    peaks = meter.stop()
    budget = getattr(result, "budget", None)
    if peaks is None or budget is None or not steps:
        return None, None
    from llmmem.calibrate import predicted_metrics

    predicted = predicted_metrics(budget)
    if steps == 1 and budget.first_step_allocated_peak_bytes is not None:
        shift = budget.allocated_peak_bytes - budget.first_step_allocated_peak_bytes
        predicted = {metric: value - shift for metric, value in predicted.items()}
    on_cpu = meter.kind != "cuda"
    if on_cpu:
        predicted["allocated"] -= workspaces(budget)
    measured = peaks.metrics["allocated"]
    expected = predicted["allocated"]
    gap = 100 * (measured - expected) / expected if expected else 0.0
    where = peaks.device_name or "llmmem's CPU meter"
    line = (
        f"llmmem: measured {measured / 2**30:.3f} GiB allocated over {steps} "
        f"step{'s' * (steps != 1)} ({where}); predicted {expected / 2**30:.3f} GiB "
        f"({gap:+.1f}%)"
    )
    LOG.info(line)
    print(line, file=sys.stderr)
    row = None
    if record and budget.gpu is not None:
        row = record_row(result, peaks, predicted, on_cpu, script, calibration)
    return line, row


def workspaces(budget: Any) -> int:
    """cuBLAS's workspaces, which `calibrate.predicted_metrics` counts in the allocated peak."""
    for overhead, term in budget.overheads.items():
        if getattr(overhead, "value", overhead) == "cublas_workspaces":
            return int(term.bytes)
    return 0


def record_row(
    result: Any,
    peaks: Any,
    predicted: dict[str, int],
    on_cpu: bool,
    script: str | None,
    calibration: str | None,
) -> dict[str, Any]:
    from llmmem.calibrate import (
        CALIBRATION_VARIABLE,
        Measured,
        append_row,
        calibration_row,
        calibration_target,
    )
    from llmmem.integrations.preflight import running_script

    for_file = Path(script).absolute() if script else running_script()
    notes = ["measured by llmmem's CPU meter, not on the GPU named"] if on_cpu else []
    measured = Measured(
        metrics=dict(peaks.metrics),
        source=f"llmmem in the run: {peaks.source}",
        path=str(for_file),
        notes=notes,
        device_name=peaks.device_name,
    )
    row = calibration_row(result.analysis, measured, predicted, for_file)
    target = calibration_target(for_file, calibration or os.environ.get(CALIBRATION_VARIABLE))
    append_row(target, row)
    return row

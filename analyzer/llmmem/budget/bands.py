"""The error band of a prediction: how far measured peaks of its class fell from the core's.

A class is framework × method × metric × sharding (`hf/lora/device/1 GPU`). For each class with
measured rows, `bands.json` holds the spread of measured / predicted over its rows (a central
share of them, by order statistics); `bench/bands.py --write` computes it from the GPU runs under
`bench/gpu/` and the published calibration rows, and records how many rows and which evidence.
A class with fewer than `min_rows` rows gets the file's wide default band and says so.

The band reports the residuals; it never changes a prediction. The file is read once, when a
band is first asked for.

Local runs (`llmmem calibrate add`, `llmmem.calibration.store`) of the same GPU, stack, method and
sharding narrow it: with n local ratios (measured / predicted device total), the band is their
range widened on each side by the class band's half-width / sqrt(n + 1), the class band's
spread standing for what one more run may add; the basis says "band from n local runs".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmmem.budget.setup import TrainingSetup
    from llmmem.calibration.store import LocalEvidence

BANDS_FILE = Path(__file__).with_name("bands.json")

# the metrics a class can be about, in the words of the bands file
ALLOCATED = "allocated"  # torch.cuda.max_memory_allocated
RESERVED = "reserved"  # torch.cuda.max_memory_reserved
DEVICE = "device"  # what nvidia-smi shows for the process


@dataclass(frozen=True)
class Band:
    low_bytes: int
    high_bytes: int
    basis: str  # which class, how many measured rows (or why the default)
    rows: int  # measured rows behind the band; 0 for the default


def sharding_label(setup: TrainingSetup) -> str:
    distributed = setup.distributed
    if distributed.world_size <= 1:
        return "1 GPU"
    if distributed.fsdp is not None:
        return "FSDP"
    if distributed.zero_stage:
        return f"ZeRO-{distributed.zero_stage}"
    return "DDP"


def band_class(setup: TrainingSetup, metric: str = DEVICE) -> str:
    """The class of a prediction for `metric`: framework/method/metric/sharding."""
    method = "generate" if setup.mode.value == "generate" else setup.method.value
    # TRL's SFTTrainer runs the HF Trainer: its runs are the HF class's
    framework = "hf" if setup.framework.value == "trl" else setup.framework.value
    return f"{framework}/{method}/{metric}/{sharding_label(setup)}"


@cache
def _table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(BANDS_FILE.read_text(encoding="utf-8"))
    return data


def _describe(name: str) -> str:
    if name.count("/") != 3:
        return "an unclassified setup"
    framework, method, metric, sharding = name.split("/")
    where = "on the device" if metric == DEVICE else metric
    return f"{framework} {method}, {where}, {sharding}"


def band_for(name: str, predicted_bytes: int, local: LocalEvidence | None = None) -> Band:
    """The band around `predicted_bytes` for class `name` (see band_class); `local`, the
    local runs of the same setup, narrows it (see local_ratios)."""
    band = _class_band(name, predicted_bytes)
    if local is None or not local.ratios:
        return band
    class_low = band.low_bytes / predicted_bytes if predicted_bytes else 1.0
    class_high = band.high_bytes / predicted_bytes if predicted_bytes else 1.0
    low, high, margin = local_ratios(local.ratios, class_low, class_high)
    runs = len(local.ratios)
    basis = (
        f"band from {runs} local run{'s' * (runs != 1)} ({local.path}): measured "
        f"{100 * (min(local.ratios) - 1):+.1f}%..{100 * (max(local.ratios) - 1):+.1f}% of the "
        f"estimate, widened by ±{100 * margin:.1f}% (the class band's half-width / "
        f"√{runs + 1}); without them: {band.basis}"
    )
    return Band(round(predicted_bytes * low), round(predicted_bytes * high), basis, runs)


def local_ratios(
    ratios: tuple[float, ...], class_low: float, class_high: float
) -> tuple[float, float, float]:
    """(low, high, margin) of a band from local ratios: their range, widened on each side by
    the class band's half-width divided by sqrt(n + 1)."""
    margin = (class_high - class_low) / 2 / math.sqrt(len(ratios) + 1)
    return min(ratios) - margin, max(ratios) + margin, margin


def _class_band(name: str, predicted_bytes: int) -> Band:
    table = _table()
    entry = table["classes"].get(name)
    rows = int(entry["rows"]) if entry else 0
    if entry is None or rows < int(table["min_rows"]):
        default = table["default"]
        low, high = default["ratio_low"], default["ratio_high"]
        basis = (
            f"{_describe(name)}: {rows} measured row{'s' * (rows != 1)}, fewer than "
            f"{table['min_rows']}: the wide default band "
            f"({100 * (low - 1):+.0f}%..{100 * (high - 1):+.0f}%)"
        )
        return Band(round(predicted_bytes * low), round(predicted_bytes * high), basis, 0)
    low, high = entry["ratio_low"], entry["ratio_high"]
    basis = (
        f"{_describe(name)}: {rows} measured rows, {table['share_label']} of them within "
        f"{100 * (low - 1):+.1f}%..{100 * (high - 1):+.1f}% of the estimate"
    )
    return Band(round(predicted_bytes * low), round(predicted_bytes * high), basis, rows)


def band_range(total_bytes: int, band: Band) -> tuple[str, str]:
    """`("26.9–28.9", "GiB")`: the band's ends in the unit `format_bytes` gives the estimate."""
    from llmmem.units import format_bytes

    unit = format_bytes(total_bytes).rsplit(" ", 1)[-1]
    size = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}.get(unit, 1)

    def number(n: int) -> str:
        value = n / size
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"

    return f"{number(band.low_bytes)}–{number(band.high_bytes)}", unit


def format_with_band(total_bytes: int, band: Band) -> str:
    """`27.8 GiB (26.9–28.9)`: the estimate, then its band in the estimate's unit."""
    from llmmem.units import format_bytes

    return f"{format_bytes(total_bytes)} ({band_range(total_bytes, band)[0]})"

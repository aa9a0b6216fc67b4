"""The first steps of a real run, measured: CUDA's own peak counters, or llmmem's CPU meter.

On a GPU the meter is torch's: `max_memory_allocated` and `max_memory_reserved` from the moment
it starts (their peaks reset then), and NVML's figure for this process where `pynvml` is there.
Without CUDA, `meter="cpu"` counts the step's tensors with llmmem's storage meter
(`verify.tracker.StorageTracker`): every tensor alive when it starts (the weights, gradients
and optimizer states given) and every storage an operation creates until it dies. That is the
allocated peak a GPU would report for the same tensors (no allocator rounding, no CUDA context):
what the tests and a dry run on a laptop use, recorded as the CPU meter's, never as a GPU's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

METERS = ("auto", "cuda", "cpu", "off")


@dataclass
class StepPeaks:
    """What a meter saw: bytes per metric ("allocated", "reserved", "device") and its source."""

    metrics: dict[str, int]
    source: str
    device_name: str | None = None


class StepMeter:
    """Started before the first step, stopped after the steps to measure."""

    def __init__(self, meter: str = "auto") -> None:
        if meter not in METERS:
            raise ValueError(f"meter must be one of {', '.join(METERS)}, got {meter!r}")
        import torch

        if meter == "auto":
            meter = "cuda" if torch.cuda.is_available() else "off"
        if meter == "cuda" and not torch.cuda.is_available():
            raise ValueError("meter='cuda' needs a CUDA device; use meter='cpu' on the CPU")
        self.kind = meter
        self.tracker: Any = None
        self.running = False

    def start(self, tensors: list[Any]) -> None:
        """Begin: CUDA's peaks reset; the CPU meter counts `tensors` (the weights, gradients and
        optimizer states alive now) and every storage made from here on."""
        if self.kind == "off" or self.running:
            return
        import torch

        if self.kind == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            from llmmem.verify.tracker import StorageTracker

            self.tracker = StorageTracker()
            for tensor in tensors:
                self.tracker.track(tensor)
            self.tracker.reset_peak(self.tracker.new_category)
            self.tracker.__enter__()
        self.running = True

    def stop(self) -> StepPeaks | None:
        if not self.running:
            return None
        self.running = False
        import torch

        if self.kind == "cuda":
            torch.cuda.synchronize()
            device = torch.cuda.current_device()
            metrics = {
                "allocated": int(torch.cuda.max_memory_allocated(device)),
                "reserved": int(torch.cuda.max_memory_reserved(device)),
            }
            used = _nvml_process_bytes(device)
            if used is not None:
                metrics["device"] = used
            name = torch.cuda.get_device_name(device)
            return StepPeaks(metrics, "torch.cuda.max_memory_* of the first steps", name)
        tracker, self.tracker = self.tracker, None
        tracker.__exit__(None, None, None)
        return StepPeaks(
            {"allocated": int(tracker.peak)},
            "llmmem's CPU meter (tensors the step allocated; no CUDA)",
        )


def live_tensors(*objects: Any) -> list[Any]:
    """The tensors a model (parameters, their gradients, buffers) and an optimizer (its states)
    hold now."""
    import torch

    found: list[Any] = []
    for item in objects:
        if item is None:
            continue
        if isinstance(item, torch.nn.Module):
            for parameter in item.parameters():
                found.append(parameter)
                if parameter.grad is not None:
                    found.append(parameter.grad)
            found.extend(item.buffers())
            continue
        inner = getattr(item, "optimizer", item)
        state = getattr(inner, "state", None)
        if isinstance(state, dict):
            for per_parameter in state.values():
                if isinstance(per_parameter, dict):
                    found.extend(v for v in per_parameter.values() if isinstance(v, torch.Tensor))
    return found


def _nvml_process_bytes(device: int) -> int | None:
    """NVML's memory figure for this process on `device` (what nvidia-smi shows), if it can."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory)
    except Exception:  # NVML absent or refusing: the allocator's figures stand
        return None
    return None

"""Meters of a verified step: llmmem's storage tracker (CPU and fake steps), CUDA's own counters
and NVML, each recording a phase's peak by category."""

from __future__ import annotations

import abc
import contextlib
from typing import Any

from llmmem.budget.overheads import CUBLAS_WORKSPACE
from llmmem.verify.request import (
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER_STATES,
    TEMPORARIES,
    WEIGHTS,
    PhaseMeasurement,
    StepMeasurement,
    StepRequest,
)


class _Meter(contextlib.AbstractContextManager[Any]):
    """How a step is measured: a storage counter (CPU, simulated) or CUDA's statistics."""

    def __exit__(self, *exc: object) -> None:
        return None

    @abc.abstractmethod
    def begin(self, phase: str) -> None:
        """A phase starts: its peak is counted from now."""

    @abc.abstractmethod
    def end(self, phase: str) -> None:
        """A phase ends: keep its peak."""

    @abc.abstractmethod
    def size(self, tensors: list[Any]) -> int:
        """The bytes of these tensors' storages, each counted once."""

    def file(self, tensors: list[Any], category: str) -> None:
        """Say what these tensors are (a counter files new memory by phase otherwise)."""

    def watch_gradients(self, trainable: list[Any]) -> None:
        """File each gradient as such the moment autograd accumulates it."""

    @abc.abstractmethod
    def so_far(self) -> int:
        """The running phase's peak until now (what was allocated when a step runs out)."""

    @abc.abstractmethod
    def left_by_backward(self) -> int:
        """The memory backward created and left alive: the gradients a loop keeps itself."""

    def finish(self) -> None:
        """After the measured step (CUDA: reserved peak, free memory, snapshot)."""


class _TrackedMeter(_Meter):
    def __init__(self, tracker: Any, result: StepMeasurement) -> None:
        self.tracker = tracker
        self.result = result

    def __enter__(self) -> Any:
        return self.tracker.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.tracker.__exit__(*exc)

    def begin(self, phase: str) -> None:
        self.tracker.reset_peak(ACTIVATIONS if phase == "forward" else TEMPORARIES)

    def end(self, phase: str) -> None:
        tracker = self.tracker
        _record_phase(self.result, phase, tracker.peak, dict(tracker.peak_by_category))

    def size(self, tensors: list[Any]) -> int:
        return int(self.tracker.bytes_of(tensors))

    def file(self, tensors: list[Any], category: str) -> None:
        for t in tensors:
            self.tracker.track(t, category)

    def watch_gradients(self, trainable: list[Any]) -> None:
        tracker = self.tracker
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda param: tracker.track(param.grad, GRADIENTS))

    def so_far(self) -> int:
        return int(self.tracker.peak)

    def left_by_backward(self) -> int:
        return int(self.tracker.refile(TEMPORARIES, GRADIENTS))

    def finish(self) -> None:
        events = self.tracker.events
        if not events:
            return
        from llmmem.verify.allocator import OutOfMemory, replay_step

        try:
            allocator = replay_step(events, CUBLAS_WORKSPACE)
        except OutOfMemory:  # no capacity is given: cannot happen, but never fail a result
            return
        self.result.reserved_peak_bytes = allocator.peak_reserved
        self.result.notes.append(
            "reserved peak: this step's allocations, in their order, replayed through the CUDA "
            "caching allocator's rules (with two 32 MiB cuBLAS workspaces)"
        )


class _CudaMeter(_Meter):
    def __init__(self, torch: Any, request: StepRequest, result: StepMeasurement) -> None:
        self.torch = torch
        self.request = request
        self.result = result
        self.weights = 0
        self.before_forward = 0
        self.reserved = 0  # the caching allocator's peak over the measured phases
        # a paged bitsandbytes optimizer keeps its large states in CUDA managed memory, which
        # the caching allocator never sees: they sit on the GPU through the step all the same
        self.paged = 0
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        result.device_name = props.name
        result.capacity_bytes = int(props.total_memory)
        result.free_before_bytes = int(torch.cuda.mem_get_info()[0])
        self.nvml = _NvmlReader(props)
        if request.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=200_000)

    def begin(self, phase: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        if phase == "forward":
            self.before_forward = int(cuda.memory_allocated())
        cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        peak = int(cuda.max_memory_allocated()) + self.paged
        reserved = int(cuda.max_memory_reserved())
        self.reserved = max(self.reserved, reserved)
        used = self.nvml.used()
        _record_phase(self.result, phase, peak, {WEIGHTS: self.weights}, used, reserved)
        if used is not None:
            self.result.device_used_peak_bytes = max(self.result.device_used_peak_bytes or 0, used)
            self.result.device_used_source = self.nvml.source

    def size(self, tensors: list[Any]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            # a paged state is a host tensor over managed memory that lives on the GPU
            if t.is_cuda or getattr(t, "is_paged", False):
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = int(storage.nbytes())
        return sum(seen.values())

    def file(self, tensors: list[Any], category: str) -> None:
        if category == WEIGHTS:
            self.weights = self.size(tensors)
        elif category == OPTIMIZER_STATES:
            paged = self.size([t for t in tensors if getattr(t, "is_paged", False)])
            if paged and not self.paged:
                self.result.notes.append(
                    f"{paged / 2**20:.1f} MiB of paged optimizer states live in CUDA managed "
                    "memory, which torch's allocator does not count: added to each phase's peak"
                )
            self.paged = paged

    def so_far(self) -> int:
        return int(self.torch.cuda.max_memory_allocated()) + self.paged

    def left_by_backward(self) -> int:
        self.torch.cuda.synchronize()
        return max(0, int(self.torch.cuda.memory_allocated()) - self.before_forward)

    def finish(self) -> None:
        cuda = self.torch.cuda
        result = self.result
        result.reserved_peak_bytes = self.reserved or int(cuda.max_memory_reserved())
        result.free_after_bytes = int(cuda.mem_get_info()[0])
        if self.request.snapshot:
            cuda.memory._dump_snapshot(self.request.snapshot)
            result.snapshot = self.request.snapshot


class _NvmlReader:
    """What nvidia-smi shows for this process: NVML's line for our pid, else the whole device's
    use (a process in another PID namespace is listed under a pid we cannot match). Context,
    the caching allocator's reserved segments, and memory outside torch (NCCL, managed memory)
    are all in it. Nothing (None) where NVML (the nvidia-ml-py package) is not there."""

    def __init__(self, props: Any) -> None:
        self.handle: Any = None
        self.source: str | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = getattr(props, "uuid", None)
            try:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except pynvml.NVMLError:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML library, no driver binding: the readings are left out
            self.handle = None

    def used(self) -> int | None:
        if self.handle is None:
            return None
        import os

        import pynvml

        try:
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory:
                    self.source = "process"
                    return int(proc.usedGpuMemory)
            self.source = "device"
            return int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).used)
        except pynvml.NVMLError:
            return None


def _record_phase(
    result: StepMeasurement,
    phase: str,
    peak: int,
    by_category: dict[str, int],
    device_used: int | None = None,
    reserved: int | None = None,
) -> None:
    """Keep a phase's peak, unless an earlier micro-batch peaked higher in it (the device
    figures keep their own most over the micro-batches)."""
    previous = result.phase(phase)
    if previous is not None:
        if previous.device_used_bytes is not None:
            device_used = max(device_used or 0, previous.device_used_bytes)
        if previous.reserved_bytes is not None:
            reserved = max(reserved or 0, previous.reserved_bytes)
        if previous.peak_bytes >= peak:
            previous.device_used_bytes = device_used
            previous.reserved_bytes = reserved
            return
        result.phases.remove(previous)
    result.phases.append(
        PhaseMeasurement(
            phase=phase,
            peak_bytes=peak,
            by_category=by_category,
            device_used_bytes=device_used,
            reserved_bytes=reserved,
        )
    )
    result.phases.sort(key=lambda p: ("forward", "backward", "optimizer_step").index(p.phase))

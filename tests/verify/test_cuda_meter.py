"""The CUDA meter against torch.cuda's own API, with a scripted device standing in for the GPU.

No CUDA device can run here, so this is the one place a stand-in is used: `torch.cuda` is replaced
by an autospec of the real module (a call by a wrong name or with wrong arguments fails as it
would on a GPU), whose memory functions follow a small allocator with the caching allocator's
semantics: `max_memory_allocated` is the peak since the last `reset_peak_memory_stats`.
"""

from __future__ import annotations

import types
from unittest import mock

import pytest
import torch

from llmmem.verify.meters import _CudaMeter
from llmmem.verify.request import OPTIMIZER_STATES, StepMeasurement, StepRequest

GiB = 2**30


class ScriptedDevice:
    """An 80 GiB GPU whose allocations the test makes by hand."""

    def __init__(self) -> None:
        self.total = 80 * GiB
        self.context = 1 * GiB  # what the driver holds, never seen by the allocator
        self.allocated = 0
        self.peak = 0
        self.reserved = 0
        self.reserved_peak = 0
        self.recording = False
        self.snapshots: list[str] = []

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)
        # the caching allocator reserves in 2 MiB segments and keeps them
        self.reserved = max(self.reserved, -(-self.allocated // (2 * 2**20)) * 2 * 2**20)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, n: int) -> None:
        self.allocated -= n

    def cuda(self) -> types.ModuleType:
        cuda = mock.create_autospec(torch.cuda, spec_set=True)
        properties = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=self.total)
        cuda.get_device_properties.side_effect = lambda device=None: properties
        cuda.current_device.side_effect = lambda: 0
        cuda.mem_get_info.side_effect = lambda device=None: (
            self.total - self.context - self.reserved,
            self.total,
        )
        cuda.synchronize.side_effect = lambda device=None: None
        cuda.memory_allocated.side_effect = lambda device=None: self.allocated
        cuda.max_memory_allocated.side_effect = lambda device=None: self.peak
        cuda.max_memory_reserved.side_effect = lambda device=None: self.reserved_peak

        def reset(device: object = None) -> None:
            self.peak = self.allocated
            self.reserved_peak = self.reserved

        cuda.reset_peak_memory_stats.side_effect = reset

        def record(*args: object, **kwargs: object) -> None:
            self.recording = True

        cuda.memory._record_memory_history.side_effect = record
        cuda.memory._dump_snapshot.side_effect = lambda filename="": self.snapshots.append(filename)
        return cuda


def request(snapshot: str | None = None) -> StepRequest:
    return StepRequest(
        model_id="m",
        architecture="LlamaForCausalLM",
        config={},
        batch=1,
        seq=128,
        device="cuda",
        snapshot=snapshot,
    )


@pytest.mark.parametrize("snapshot", [None, "step.pickle"])
def test_the_cuda_meter_reads_each_phase_from_the_allocator(snapshot: str | None) -> None:
    device = ScriptedDevice()
    fake_torch = types.SimpleNamespace(cuda=device.cuda())
    result = StepMeasurement(device="cuda", device_name="cuda")
    meter = _CudaMeter(fake_torch, request(snapshot), result)
    assert result.device_name == "NVIDIA H100 80GB HBM3"
    assert result.capacity_bytes == 80 * GiB
    assert result.free_before_bytes == 79 * GiB  # the context is not free
    assert device.recording == (snapshot is not None)

    weights, states = 8 * GiB, 16 * GiB
    device.alloc(weights + states)  # the warm-up step left the states
    meter.begin("forward")
    device.alloc(20 * GiB)  # activations
    device.alloc(3 * GiB)  # a temporary of the head
    device.free(3 * GiB)
    meter.end("forward")
    meter.begin("backward")
    device.alloc(8 * GiB)  # gradients
    device.alloc(5 * GiB)  # a block's temporaries
    device.free(5 * GiB)
    device.free(20 * GiB)  # activations freed as backward goes
    meter.end("backward")
    gradients = meter.left_by_backward()
    meter.begin("optimizer_step")
    device.alloc(2 * GiB)  # foreach's intermediate list
    device.free(2 * GiB)
    meter.end("optimizer_step")
    meter.finish()

    peaks = {p.phase: p.peak_bytes for p in result.phases}
    # each phase's own peak, not the step's: the reset between phases took effect
    assert peaks == {
        "forward": (8 + 16 + 20 + 3) * GiB,
        "backward": (8 + 16 + 20 + 8 + 5) * GiB,
        "optimizer_step": (8 + 16 + 8 + 2) * GiB,
    }
    assert gradients == 8 * GiB
    # the reserved peak covers the whole measured step (the backward's 57 GiB of segments)
    assert result.reserved_peak_bytes == 57 * GiB
    assert result.free_after_bytes == (80 - 1 - 57) * GiB
    assert meter.so_far() == (8 + 16 + 8 + 2) * GiB
    if snapshot is None:
        assert device.snapshots == [] and result.snapshot is None
    else:
        assert device.snapshots == [snapshot] and result.snapshot == snapshot


def test_the_cuda_meter_sizes_only_device_tensors() -> None:
    """Offloaded states live in host memory: they are not GPU memory."""
    device = ScriptedDevice()
    meter = _CudaMeter(
        types.SimpleNamespace(cuda=device.cuda()), request(), StepMeasurement("cuda", "cuda")
    )
    host = torch.zeros(1024)
    assert meter.size([host, host[:10]]) == 0


def test_paged_optimizer_states_count_though_the_allocator_does_not_see_them() -> None:
    """bitsandbytes' paged optimizers keep large states in CUDA managed memory: host tensors
    over memory the GPU holds, which `max_memory_allocated` never counts."""
    device = ScriptedDevice()
    result = StepMeasurement(device="cuda", device_name="cuda")
    meter = _CudaMeter(types.SimpleNamespace(cuda=device.cuda()), request(), result)
    paged = torch.zeros(2**20, dtype=torch.uint8)  # 1 MiB, as bitsandbytes' get_paged makes it
    paged.is_paged = True  # type: ignore[attr-defined]
    small = torch.zeros(16)  # a host tensor that is not paged: not GPU memory
    device.alloc(8 * GiB)  # weights
    meter.file([paged, small], OPTIMIZER_STATES)  # after the warm-up step
    meter.begin("forward")
    device.alloc(4 * GiB)
    meter.end("forward")
    meter.finish()
    forward = result.phase("forward")
    assert forward is not None
    assert forward.peak_bytes == 12 * GiB + 2**20
    assert meter.size([paged, small]) == 2**20
    assert any("CUDA managed memory" in note for note in result.notes)


def test_a_gpu_measurement_is_compared_with_the_workspaces_and_nvidia_smi() -> None:
    """On a GPU, `max_memory_allocated` holds cuBLAS's workspaces (a CPU step has none), and
    NVML's figure for the process is compared with the predicted device total."""
    from llmmem.budget.phases import estimate_budget
    from llmmem.budget.result import Overhead
    from llmmem.budget.setup import Method, Precision, TrainingSetup
    from llmmem.models.architectures import spec_from_config
    from llmmem.models.catalog import catalog_entry
    from llmmem.models.spec import ModelSource
    from llmmem.verify.compare import compare
    from llmmem.verify.request import PhaseMeasurement

    entry = catalog_entry("Qwen/Qwen2.5-0.5B")
    assert entry is not None
    spec = spec_from_config(dict(entry.config), model_id="q", source=ModelSource.LOCAL)
    budget = estimate_budget(
        spec,
        TrainingSetup(method=Method.FULL, batch=1, seq=512, precision=Precision.BF16_TRUE),
        None,
    )
    workspaces = budget.overheads[Overhead.CUBLAS_WORKSPACES].bytes
    assert workspaces == 64 * 2**20

    def measured(device: str) -> StepMeasurement:
        result = StepMeasurement(device=device, device_name=device)
        for phase in budget.phases:
            result.phases.append(
                PhaseMeasurement(phase.phase.value, phase.allocated_bytes + workspaces, {})
            )
        result.allocated_peak_bytes = budget.allocated_peak_bytes + workspaces
        if device == "cuda":
            result.reserved_peak_bytes = budget.reserved_peak_bytes
            result.device_used_peak_bytes = budget.device_total_bytes + GiB
            result.device_used_source = "process"
        return result

    on_gpu = {row.what: row for row in compare(budget, measured("cuda"))}
    assert on_gpu["forward peak"].error == 0.0
    assert on_gpu["allocated peak"].error == 0.0
    assert on_gpu["reserved peak"].error == 0.0
    device = on_gpu["on the device (nvidia-smi)"]
    assert device.predicted_bytes == budget.device_total_bytes
    assert device.measured_bytes == budget.device_total_bytes + GiB
    assert "context included" in device.note

    on_cpu = {row.what: row for row in compare(budget, measured("cpu"))}
    assert on_cpu["forward peak"].predicted_bytes == budget.phases[0].allocated_bytes
    assert "on the device (nvidia-smi)" not in on_cpu and "reserved peak" not in on_cpu

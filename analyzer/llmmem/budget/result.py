"""What the accounting core returns: bytes per component per phase, with the formula of each.

These are plain frozen dataclasses: the core computes them, nothing parses them, so they skip
validation (and the import cost that comes with it); `report/` turns them into JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from llmmem.units import format_bytes

if TYPE_CHECKING:
    from llmmem.budget.bands import Band


class Phase(str, Enum):
    FORWARD = "forward"
    # preference training: the reference model's forward, under no_grad, after the policy's
    REFERENCE_FORWARD = "reference_forward"
    BACKWARD = "backward"
    OPTIMIZER_STEP = "optimizer_step"
    GENERATE = "generate"


class Component(str, Enum):
    """The named parts of allocated memory. Order is the order of the report."""

    WEIGHTS = "weights"
    REFERENCE_MODEL = "reference_model"  # preference training: a frozen copy of the weights
    WEIGHT_COPIES = "weight_copies"  # autocast's low-precision copies; dequantized k-bit weights
    GRADIENTS = "gradients"
    OPTIMIZER_STATES = "optimizer_states"
    ACTIVATIONS = "activations"
    LOGITS = "logits"
    TEMPORARIES = "temporaries"  # recompute of one layer, optimizer step buffers, collectives
    KV_CACHE = "kv_cache"
    VLLM_ENGINE = "vllm_engine"  # GRPO: a colocated vLLM engine's share of the GPU


class Overhead(str, Enum):
    """What sits beside allocated memory on the device."""

    CUBLAS_WORKSPACES = "cublas_workspaces"  # allocated by torch's allocator, on a GPU only
    ALLOCATOR_SLACK = "allocator_slack"  # reserved minus allocated (caching allocator)
    CUDA_CONTEXT = "cuda_context"
    NCCL_BUFFERS = "nccl_buffers"
    # a paged optimizer's states in CUDA unified memory (cudaMallocManaged): outside torch's
    # pool; the pages the driver keeps on the GPU, up to the room the rest leaves
    UNIFIED_MEMORY = "unified_memory"


@dataclass
class Term:
    """One number of the budget and how it was derived, values filled in."""

    bytes: int
    formula: str
    note: str = ""

    def describe(self) -> str:
        return f"{format_bytes(self.bytes)} = {self.formula}"


@dataclass(frozen=True)
class PhaseBudget:
    phase: Phase
    moment: str  # the instant inside the phase these bytes are for
    components: dict[Component, Term]
    # of these bytes, what a kernel allocates for itself (a contiguous copy of a strided
    # input, a reduction's temporary): the CUDA caching allocator counts it, a storage counter
    # above the kernels (a CPU or simulated step) cannot see it
    inside_kernels: int = 0

    @property
    def allocated_bytes(self) -> int:
        return sum(term.bytes for term in self.components.values())


@dataclass(frozen=True)
class GpuTarget:
    name: str
    capacity_bytes: int
    bf16: bool = True


@dataclass(frozen=True)
class Budget:
    """The memory of one step: phases, the peak, what the allocator and the driver add."""

    phases: list[PhaseBudget]
    peak_phase: Phase
    allocated_peak_bytes: int
    overheads: dict[Overhead, Term]
    reserved_peak_bytes: int  # allocated peak + cuBLAS workspaces + allocator slack
    device_total_bytes: int  # what nvidia-smi would show: reserved + context + NCCL
    params: int  # all parameters of the model
    trainable_params: int
    first_step_allocated_peak_bytes: int | None = None  # the first step, before optimizer states
    gpu: GpuTarget | None = None
    notes: list[str] = field(default_factory=list)  # assumptions and caveats, one line each
    # the class whose measured residuals give the device total its band (budget/bands.py)
    band_class: str = ""
    # the local runs of the same setup (llmmem.calibration.store.LocalEvidence) that narrow the band
    local_evidence: Any = None
    # a device total the step can reach below this one and why (activation offloading: every
    # saved tensor on the host); the band reaches down to it
    band_floor: tuple[int, str] | None = None
    # paged optimizer states in CUDA unified memory, in all: host-backed pages the driver moves
    # to the GPU while it has room (the device total counts those, Overhead.UNIFIED_MEMORY) and
    # back to the host when allocations need it, so they never decide whether the step fits
    unified_memory_bytes: int = 0

    def phase(self, phase: Phase) -> PhaseBudget:
        for item in self.phases:
            if item.phase is phase:
                return item
        raise KeyError(phase)

    @property
    def peak(self) -> PhaseBudget:
        return self.phase(self.peak_phase)

    @property
    def unified_resident_bytes(self) -> int:
        """The unified memory's pages the device total counts as on the GPU."""
        term = self.overheads.get(Overhead.UNIFIED_MEMORY)
        return term.bytes if term is not None else 0

    @property
    def pool_total_bytes(self) -> int:
        """The device total without the unified memory's pages: what must fit, since the
        driver gives those pages back to the host when the rest needs the room."""
        return self.device_total_bytes - self.unified_resident_bytes

    def _resident_at(self, pool_bytes: int) -> int:
        """The unified memory's pages on the GPU beside a pool of `pool_bytes`."""
        if not self.unified_memory_bytes:
            return 0
        if self.gpu is None:
            return self.unified_memory_bytes
        return min(self.unified_memory_bytes, max(self.gpu.capacity_bytes - pool_bytes, 0))

    @property
    def fits(self) -> bool | None:
        if self.gpu is None:
            return None
        return self.pool_total_bytes <= self.gpu.capacity_bytes

    def _pool_band(self) -> Band:
        from llmmem.budget.bands import Band, band_for

        total = self.pool_total_bytes
        band = band_for(self.band_class, total, self.local_evidence)
        if self.band_floor is None:
            return band
        floor, why = self.band_floor
        low_ratio = band.low_bytes / total if total else 1.0
        low = min(band.low_bytes, round(floor * low_ratio))
        return Band(low, band.high_bytes, f"{band.basis}; {why}", band.rows)

    @property
    def band(self) -> Band:
        """Where the device total of this step was measured to fall, for setups of its class
        (with unified memory: the band of the rest, each end with the pages that fit beside)."""
        from llmmem.budget.bands import Band

        band = self._pool_band()
        if not self.unified_memory_bytes:
            return band
        return Band(
            band.low_bytes + self._resident_at(band.low_bytes),
            band.high_bytes + self._resident_at(band.high_bytes),
            band.basis,
            band.rows,
        )

    @property
    def verdict(self) -> str | None:
        """fits, tight (the band crosses the capacity) or does not fit; None without a GPU.
        Unified memory never decides it: the driver evicts its pages to make room."""
        if self.gpu is None:
            return None
        band = self._pool_band()
        if band.high_bytes <= self.gpu.capacity_bytes:
            return "fits"
        if band.low_bytes > self.gpu.capacity_bytes:
            return "does not fit"
        return "tight"

    @property
    def headroom_bytes(self) -> int | None:
        """What the GPU has left for torch's allocator (unified memory's pages give way)."""
        if self.gpu is None:
            return None
        return self.gpu.capacity_bytes - self.pool_total_bytes

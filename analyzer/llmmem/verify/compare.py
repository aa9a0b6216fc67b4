"""Measured against predicted: phase by phase and component by component (no torch here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmmem.budget.distributed import deepspeed_zero_section
from llmmem.budget.result import Budget, Component, Overhead
from llmmem.budget.setup import TrainingSetup
from llmmem.models.spec import ModelSpec
from llmmem.units import format_bytes
from llmmem.verify.request import StepMeasurement, StepRequest


@dataclass
class Row:
    what: str  # "forward peak", "weights", ...
    predicted_bytes: int | None
    measured_bytes: int | None
    note: str = ""

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured; None where either side is missing."""
        if not self.predicted_bytes or not self.measured_bytes:
            return None
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes


def request_for(
    spec: ModelSpec,
    setup: TrainingSetup,
    config: dict[str, Any],
    device: str,
    *,
    trust_remote_code: bool = False,
    snapshot: str | None = None,
) -> StepRequest:
    lora = None
    if setup.lora is not None:
        lora = {
            "r": setup.lora.r,
            "alpha": setup.lora.alpha,
            "targets": setup.lora.targets,
            "modules_to_save": setup.lora.modules_to_save,
            "dora": setup.lora.dora,
            "dropout": setup.lora.dropout,
            "adapter_bytes": setup.lora.adapter_bytes,
        }
    quant = None
    if setup.quant is not None:
        quant = {
            "quant_type": setup.quant.quant_type.value,
            "double_quant": setup.quant.double_quant,
            "compute_dtype_bytes": setup.quant.compute_dtype_bytes,
            "prepare": setup.quant.prepare_for_kbit_training,
            "embeddings_16bit": setup.quant.embeddings_16bit,
        }
    return StepRequest(
        model_id=spec.model_id,
        architecture=spec.architecture,
        config=config,
        batch=setup.batch,
        seq=setup.seq,
        grad_accum=setup.grad_accum,
        grad_ckpt=setup.grad_ckpt,
        precision=setup.precision.value,
        optim=setup.optim,
        # where transformers refuses SDPA (gemma-2's softcapping) the model trains eager
        attn=setup.attn.value if spec.supports_sdpa or setup.attn.value != "sdpa" else "eager",
        lora=lora,
        quant=quant,
        use_cache=setup.use_cache,
        optimizer_in_backward=setup.optimizer_in_backward,
        world_size=setup.distributed.world_size,
        sharding=_sharding(setup),
        zero=deepspeed_zero_section(setup, spec.hidden_size)
        if setup.distributed.zero_stage
        else None,
        device=device,
        trust_remote_code=trust_remote_code,
        snapshot=snapshot,
        packing=setup.packing.value if setup.packing is not None else None,
        # TRL's rules in stream mode: a second save of a storage being offloaded stays
        activation_offload="dedupe" if setup.activation_offload else None,
    )


def _sharding(setup: TrainingSetup) -> str:
    if setup.distributed.zero_stage:
        return "zero"
    return "fsdp" if setup.distributed.fsdp is not None else "ddp"


def allocated_on(budget: Budget, measured: StepMeasurement) -> int:
    """What the allocated figures of a measurement include beyond the tensors of the step: on a
    GPU, the cuBLAS workspaces torch's allocator holds (a CPU or simulated step has none)."""
    if measured.device != "cuda":
        return 0
    term = budget.overheads.get(Overhead.CUBLAS_WORKSPACES)
    return term.bytes if term is not None else 0


def compare(budget: Budget, measured: StepMeasurement) -> list[Row]:
    rows: list[Row] = []
    workspaces = allocated_on(budget, measured)
    note = f"with {format_bytes(workspaces)} of cuBLAS workspaces" if workspaces else ""
    # a step counted above the kernels does not see what they allocate for themselves
    unseen = measured.device != "cuda"
    peak_inside = 0
    for phase in budget.phases:
        got = measured.phase(phase.phase.value)
        inside = phase.inside_kernels if unseen else 0
        if phase.allocated_bytes == budget.allocated_peak_bytes:
            peak_inside = max(peak_inside, inside)
        rows.append(
            Row(
                f"{phase.phase.value.replace('_', ' ')} peak",
                phase.allocated_bytes - inside + workspaces,
                got.peak_bytes if got else None,
                _joined(note, _inside_note(inside)),
            )
        )
    rows.append(
        Row(
            "allocated peak",
            budget.allocated_peak_bytes - peak_inside + workspaces,
            measured.allocated_peak_bytes or None,
            _joined(note, _inside_note(peak_inside)),
        )
    )
    peak = budget.peak.components

    def component(name: Component) -> int | None:
        term = peak.get(name)
        return term.bytes if term is not None else None

    rows.append(Row("weights", component(Component.WEIGHTS), measured.weights_bytes or None))
    rows.append(
        Row(
            "gradients",
            _phase_component(budget, Component.GRADIENTS),
            measured.gradients_bytes or None,
            "at the end of backward",
        )
    )
    rows.append(
        Row(
            "optimizer states",
            component(Component.OPTIMIZER_STATES),
            measured.optimizer_state_bytes or None,
        )
    )
    if measured.reserved_peak_bytes:
        rows.append(
            Row(
                "reserved peak",
                budget.reserved_peak_bytes,
                measured.reserved_peak_bytes,
                ""
                if measured.device == "cuda"
                else "replayed: the step's allocation order through the caching allocator's rules",
            )
        )
    if measured.device == "cuda" and measured.device_used_peak_bytes:
        whole = measured.device_used_source == "device"
        rows.append(
            Row(
                "on the device (nvidia-smi)",
                budget.device_total_bytes,
                measured.device_used_peak_bytes,
                "the whole GPU's use (this process is not listed by NVML)"
                if whole
                else "this process, CUDA context included",
            )
        )
    return rows


def _inside_note(inside: int) -> str:
    if not inside:
        return ""
    return f"less {format_bytes(inside)} a CUDA kernel allocates for itself (unseen here)"


def _joined(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _phase_component(budget: Budget, name: Component) -> int | None:
    """The largest value a component takes over the phases (gradients grow through backward)."""
    values = [p.components[name].bytes for p in budget.phases if name in p.components]
    return max(values) if values else None


def unseen_overheads(budget: Budget, measured: StepMeasurement) -> list[Row]:
    """What a simulated or CPU step cannot see, as the estimate has it."""
    if measured.device == "cuda":
        return []
    # a replayed reserved peak holds the allocator's slack and the cuBLAS workspaces
    in_replay = (Overhead.ALLOCATOR_SLACK, Overhead.CUBLAS_WORKSPACES)
    replayed = in_replay if measured.reserved_peak_bytes else ()
    return [
        Row(overhead.value.replace("_", " "), term.bytes, None, "estimated: " + term.formula)
        for overhead, term in budget.overheads.items()
        if overhead not in replayed
    ]


def summary(budget: Budget, measured: StepMeasurement) -> str:
    """One line: `measured 21.9 GiB allocated at backward; predicted 22.3 GiB (+1.8%)`."""
    if measured.oom is not None:
        return (
            f"OOM in {measured.oom.get('phase', '?')} at "
            f"{format_bytes(int(measured.oom.get('allocated_bytes') or 0))}; predicted "
            f"{format_bytes(budget.device_total_bytes)} on the device"
        )
    if measured.error:
        return f"no measurement: {measured.error}"
    peak_phase = max(measured.phases, key=lambda p: p.peak_bytes).phase if measured.phases else "?"
    predicted = budget.allocated_peak_bytes + allocated_on(budget, measured)
    error = (predicted - measured.allocated_peak_bytes) / max(measured.allocated_peak_bytes, 1)
    where = "simulated" if measured.device == "fake" else f"measured on {measured.device_name}"
    return (
        f"{where}: {format_bytes(measured.allocated_peak_bytes)} allocated at its peak "
        f"({peak_phase.replace('_', ' ')}); predicted {format_bytes(predicted)} "
        f"({100 * error:+.1f}%)"
    )


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [{**asdict(row), "error": row.error} for row in rows]

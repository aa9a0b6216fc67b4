"""The machine-readable budget: stable keys that the CLI, CI and the editor rely on."""

from __future__ import annotations

from typing import Any

from llmmem.budget.result import Budget
from llmmem.models.spec import ModelSpec


def model_dict(spec: ModelSpec) -> dict[str, Any]:
    return {
        "id": spec.model_id,
        "model_type": spec.model_type,
        "architecture": spec.whole_architecture,
        "params": spec.total_params,
        "source": spec.source.value,
        "source_detail": spec.source_detail,
        "is_guess": spec.is_guess,
    }


def budget_dict(budget: Budget, spec: ModelSpec) -> dict[str, Any]:
    peak = budget.peak
    band = budget.band
    return {
        "model": model_dict(spec),
        "trainable_params": budget.trainable_params,
        "allocated_peak_bytes": budget.allocated_peak_bytes,
        "reserved_peak_bytes": budget.reserved_peak_bytes,
        "device_total_bytes": budget.device_total_bytes,
        "band_low_bytes": band.low_bytes,
        "band_high_bytes": band.high_bytes,
        "band_basis": band.basis,
        "first_step_allocated_peak_bytes": budget.first_step_allocated_peak_bytes,
        "peak_phase": budget.peak_phase.value,
        "peak_moment": peak.moment,
        "components": {c.value: t.bytes for c, t in peak.components.items()},
        "formulas": {c.value: t.formula for c, t in peak.components.items()},
        "overheads": {
            o.value: {"bytes": t.bytes, "formula": t.formula} for o, t in budget.overheads.items()
        },
        "phases": {
            p.phase.value: {
                "moment": p.moment,
                "allocated_bytes": p.allocated_bytes,
                "components": {c.value: t.bytes for c, t in p.components.items()},
            }
            for p in budget.phases
        },
        "gpu": (
            {"name": budget.gpu.name, "capacity_bytes": budget.gpu.capacity_bytes}
            if budget.gpu
            else None
        ),
        "fits": budget.fits,
        "verdict": budget.verdict,
        "headroom_bytes": budget.headroom_bytes,
        "notes": budget.notes,
    }

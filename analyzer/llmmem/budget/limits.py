"""The questions users ask most: the largest micro-batch and the longest sequence that fit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from llmmem.budget.phases import estimate_budget
from llmmem.budget.result import Budget, GpuTarget
from llmmem.budget.setup import TrainingSetup
from llmmem.models.spec import ModelSpec

MAX_BATCH_SEARCH = 1 << 16
MAX_SEQ_SEARCH = 1 << 22


def _largest(fits: Callable[[int], bool], upper: int) -> int:
    """The largest n in [1, upper] with fits(n), given fits is monotone; 0 if none."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= upper and fits(high):
        low, high = high, high * 2
    high = min(high, upper + 1)
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


# how a step is sized: the SFT step's by default; a preference step's for preference training
Estimate = Callable[[ModelSpec, TrainingSetup, GpuTarget | None], Budget]


def _fits(spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget, estimate: Estimate | None) -> bool:
    # the search only needs the verdict: skip the first-step estimate each budget also makes
    if estimate is None:
        budget = estimate_budget(spec, setup, gpu, with_first_step=False)
    else:
        budget = estimate(spec, setup, gpu)
    return budget.device_total_bytes <= gpu.capacity_bytes


def largest_batch(
    spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget, estimate: Estimate | None = None
) -> tuple[int, Budget | None]:
    """The largest micro-batch that fits `gpu`, and its budget (None when not even 1 fits)."""
    best = _largest(lambda b: _fits(spec, replace(setup, batch=b), gpu, estimate), MAX_BATCH_SEARCH)
    if not best:
        return 0, None
    return best, (estimate or estimate_budget)(spec, replace(setup, batch=best), gpu)


def largest_seq(
    spec: ModelSpec, setup: TrainingSetup, gpu: GpuTarget, estimate: Estimate | None = None
) -> tuple[int, Budget | None]:
    """The longest sequence that fits `gpu` at the setup's micro-batch."""
    upper = MAX_SEQ_SEARCH
    best = _largest(lambda s: _fits(spec, replace(setup, seq=s), gpu, estimate), upper)
    if not best:
        return 0, None
    return best, (estimate or estimate_budget)(spec, replace(setup, seq=best), gpu)

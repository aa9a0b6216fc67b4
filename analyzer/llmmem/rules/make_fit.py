"""Make it fit: when no single fix brings the step under the GPU, the fewest known changes that
together do (checkpointing, bf16, an 8-bit optimizer, Liger's fused loss, LoRA -> QLoRA, the
micro-batch halved with the accumulation doubled so the effective batch stays), or the closest
they come.

The combinations are searched with the accounting core (a fraction of a millisecond each),
fewest changes first; the one chosen is then written into the text change by change, the file
analysed again after each, and its title states that last analysis' total.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from llmmem.budget.setup import SetupError, TrainingSetup
from llmmem.preference_plan import budget_for_plan
from llmmem.rules.finding import Fix
from llmmem.rules.fixes import (
    CANDIDATES,
    LARGEST_CONFIG_FIXED,
    Candidate,
    edited_text,
    fixes_left_out,
    reanalysed,
)
from llmmem.rules.text_edits import whole_change
from llmmem.scenario import Analysis
from llmmem.units import format_bytes

# the levers, in the order they are written; the micro-batch is last (halved `halvings` times)
LEVERS = ("grad-ckpt", "bf16", "optim-8bit", "liger", "qlora")
HALVE = "halve-batch"
NAMES = {
    "grad-ckpt": "gradient checkpointing",
    "bf16": "bf16",
    "optim-8bit": "8-bit AdamW",
    "liger": "Liger fused loss",
    "qlora": "QLoRA",
}
MAX_WRITTEN = 3  # combinations tried in the text before giving up on one that fits


@dataclass(frozen=True)
class Combination:
    keys: tuple[str, ...]  # from LEVERS
    halvings: int  # the micro-batch halved this many times (accumulation doubled as often)
    device_bytes: int  # the accounting core's total after all of them
    fits: bool
    unsafe: int  # how many of the levers change training's numerics or need a package

    def describe(self, setup: TrainingSetup) -> str:
        parts = [NAMES[key] for key in self.keys]
        if self.halvings:
            factor = 2**self.halvings
            parts.append(
                f"micro-batch {setup.batch // factor} × accumulation {setup.grad_accum * factor}"
            )
        return " + ".join(parts)


@dataclass(frozen=True)
class FitSearch:
    fix: Fix | None  # the combination that fits, written and verified
    closest: str | None  # when nothing fits: the combination that comes closest, and its total


def _candidate(key: str) -> Candidate:
    return next(candidate for candidate in CANDIDATES if candidate.key == key)


def _changed(setup: TrainingSetup, keys: tuple[str, ...], halvings: int) -> TrainingSetup | None:
    for key in keys:
        changed = _candidate(key).change(setup)
        if changed is None:
            return None
        setup = changed
    halve = _candidate(HALVE)
    for _ in range(halvings):
        changed = halve.change(setup)
        if changed is None:
            return None
        setup = changed
    return setup


def _evaluate(analysis: Analysis, keys: tuple[str, ...], halvings: int) -> Combination | None:
    assert analysis.spec is not None and analysis.setup is not None
    try:
        setup = _changed(analysis.setup, keys, halvings)
        if setup is None:
            return None
        budget = budget_for_plan(analysis.plan, analysis.spec, setup, analysis.gpu)
    except (SetupError, ValueError):
        return None
    unsafe = sum(not _candidate(key).safe for key in keys)
    return Combination(keys, halvings, budget.device_total_bytes, bool(budget.fits), unsafe)


def combinations_to_try(analysis: Analysis) -> tuple[list[Combination], Combination | None]:
    """Every combination with the fewest changes that fits, best first (fewer levers that
    change numerics, then the lower total), and the closest of all when none fits."""
    setup = analysis.setup
    if analysis.spec is None or setup is None or analysis.gpu is None:
        return [], None
    levers = [key for key in LEVERS if _evaluate(analysis, (key,), 0) is not None]
    most_halvings = max(setup.batch.bit_length() - 1, 0)
    closest: Combination | None = None
    for size in range(1, len(levers) + 2):
        fitting: list[Combination] = []
        for with_batch in (False, True) if most_halvings else (False,):
            count = size - 1 if with_batch else size
            if count > len(levers):
                continue
            for keys in combinations(levers, count):
                for halvings in range(1, most_halvings + 1) if with_batch else (0,):
                    found = _evaluate(analysis, keys, halvings)
                    if found is None:
                        continue
                    if closest is None or found.device_bytes < closest.device_bytes:
                        closest = found
                    if found.fits:
                        fitting.append(found)
                        break  # the least halving that fits
        if fitting:
            fitting.sort(key=lambda c: (c.unsafe, c.device_bytes))
            return fitting, closest
    return [], closest


def _written(
    analysis: Analysis, text: str, combination: Combination
) -> tuple[str, Analysis] | None:
    """The text with every change of the combination written, one at a time, and its
    analysis; None when a change cannot be written or does not lower the total."""
    steps = [_candidate(key) for key in combination.keys]
    steps += [_candidate(HALVE)] * combination.halvings
    current, current_text = analysis, text
    for step in steps:
        edits = step.edit(current, current_text)
        if not edits or any(edit.range.path is not None for edit in edits):
            return None  # notebook cells: one cell edit at a time is left to the quick fixes
        before = current.budget
        new_text = edited_text(current, current_text, edits)
        again = reanalysed(analysis, new_text) if new_text is not None else None
        if again is None or again.budget is None or before is None:
            return None
        if again.budget.device_total_bytes >= before.device_total_bytes:
            return None
        current, current_text = again, new_text  # type: ignore[assignment]
    return current_text, current


def make_it_fit(analysis: Analysis, text: str) -> FitSearch:
    """The fewest changes that make the step fit, as one fix titled with the total the file
    gives after them; or, when nothing in reach fits, what comes closest."""
    fitting, closest = combinations_to_try(analysis)
    gpu, setup = analysis.gpu, analysis.setup
    if gpu is None or setup is None:
        return FitSearch(None, None)
    if fitting and fixes_left_out(analysis.plan, text):
        best = fitting[0]  # too large a config to check what is written: say what would fit
        return FitSearch(
            None,
            f"{best.describe(setup)} would fit (about {format_bytes(best.device_bytes)}); "
            f"fixes are not written in a config over {LARGEST_CONFIG_FIXED // 1000} kB",
        )
    for combination in fitting[:MAX_WRITTEN]:
        written = _written(analysis, text, combination)
        if written is None:
            continue
        new_text, after = written
        if after.budget is None or not after.budget.fits:
            continue
        total = after.budget.device_total_bytes
        return FitSearch(
            Fix(
                title=f"Make it fit: {combination.describe(setup)} → {format_bytes(total)} "
                f"(fits {gpu.name})",
                edits=[whole_change(text, new_text)],
                predicted_device_bytes=total,
                fits=True,
                safe=False,  # several changes at once: the user (or --fix --fit) decides
                levers=combination.keys + (HALVE,) * combination.halvings,
            ),
            None,
        )
    if fitting:
        best = fitting[0]
        return FitSearch(
            None,
            f"{best.describe(setup)} would fit (about {format_bytes(best.device_bytes)}), "
            "but llmmem cannot write every one of these changes in this file",
        )
    if closest is None:
        return FitSearch(None, None)
    return FitSearch(
        None,
        f"nothing llmmem knows to change fits {gpu.name}; the closest is "
        f"{closest.describe(setup)}, about {format_bytes(closest.device_bytes)}",
    )

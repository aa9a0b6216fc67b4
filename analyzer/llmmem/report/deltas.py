"""What one setting costs: the memory a nearby value of it would add or save.

Shown by the editor as an inlay hint behind the setting (`per_device_train_batch_size=8` →
`≈ 1.9 GiB per sample`). Each delta is the accounting core run twice, not a rule of thumb.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmmem.budget.phases import estimate_budget
from llmmem.plan import Provenance, Sourced, SourceRange
from llmmem.scenario import Analysis
from llmmem.units import format_bytes

EIGHT_BIT = "adamw_bnb_8bit"
UNWRITTEN = (Provenance.DEFAULT, Provenance.ASSUMED, Provenance.CLI_DEFAULT)


@dataclass(frozen=True)
class SettingDelta:
    field: str  # the plan field: "per_device_train_batch_size", ...
    range: SourceRange  # the value it is written as
    label: str  # short: "≈ 1.9 GiB per sample"
    detail: str  # one sentence for the tooltip
    delta_bytes: int  # device total of the alternative minus the current one
    # False for a default or an assumption: its range is where it would be written (a call's
    # closing parenthesis), not a value in the text
    written: bool = True


def setting_deltas(
    analysis: Analysis, in_path: str | None = None, only: str | None = None
) -> list[SettingDelta]:
    """What changing each setting written in the file would do; `in_path` is the `path` of the
    ranges to consider (None: the file analysed; a notebook cell's `cell_path`: that cell);
    `only`: that one field's delta (a setting's hover needs no other estimate)."""
    spec, setup, budget, plan = analysis.spec, analysis.setup, analysis.budget, analysis.plan
    if spec is None or setup is None or budget is None:
        return []
    current = budget.device_total_bytes

    def total(update: dict[str, Any]) -> int | None:
        try:
            changed = replace(setup, **update)
            return estimate_budget(
                spec, changed, analysis.gpu, with_first_step=False
            ).device_total_bytes
        except ValueError:
            return None

    def here(sourced: Sourced[Any] | None) -> SourceRange | None:
        if sourced is None or sourced.range is None or sourced.range.path != in_path:
            return None
        return sourced.range

    out: list[SettingDelta] = []

    def add(field: str, sourced: Sourced[Any] | None, update: dict[str, Any], render: Any) -> None:
        if only is not None and field != only:
            return
        where = here(sourced)
        if where is None:
            return
        other = total(update)
        if other is None:
            return
        label, detail = render(other - current)
        written = sourced is not None and sourced.source not in UNWRITTEN
        out.append(SettingDelta(field, where, label, detail, other - current, written))

    add(
        "per_device_train_batch_size",
        plan.per_device_train_batch_size,
        {"batch": setup.batch + 1},
        lambda d: (
            f"≈ {format_bytes(d)} per sample",
            f"Each extra sequence in the micro-batch adds about {format_bytes(d)}.",
        ),
    )
    add(
        "max_seq_length",
        plan.max_seq_length,
        {"seq": setup.seq + 1024},
        lambda d: (
            f"≈ {format_bytes(d)} per 1k tokens",
            f"1,024 more tokens per sequence add about {format_bytes(d)}.",
        ),
    )
    if setup.grad_ckpt:
        add(
            "gradient_checkpointing",
            plan.gradient_checkpointing,
            {"grad_ckpt": False},
            lambda d: (
                f"saves {format_bytes(d)}",
                f"Without checkpointing the step would need {format_bytes(d)} more.",
            ),
        )
    else:
        add(
            "gradient_checkpointing",
            plan.gradient_checkpointing,
            {"grad_ckpt": True},
            lambda d: (
                f"checkpointing would save {format_bytes(-d)}",
                f"Checkpointing would bring the step down by {format_bytes(-d)}.",
            ),
        )
    if "8bit" not in setup.optim and setup.optim != EIGHT_BIT:
        add(
            "optim",
            plan.optim,
            {"optim": EIGHT_BIT},
            lambda d: (
                f"{EIGHT_BIT} would save {format_bytes(-d)}",
                f"The 8-bit AdamW would bring the step down by {format_bytes(-d)}.",
            ),
        )
    else:
        add(
            "optim",
            plan.optim,
            {"optim": "adamw_torch"},
            lambda d: (
                f"saves {format_bytes(d)}",
                f"A 32-bit AdamW would need {format_bytes(d)} more.",
            ),
        )
    return [item for item in out if item.delta_bytes != 0]

"""A training setup that is read but not sized is said, not passed over: LLM018."""

from __future__ import annotations

from llmmem.rules.finding import Finding, Severity
from llmmem.rules.fit import anchor
from llmmem.rules.practices import has_training_signal
from llmmem.rules.registry import Rule, register
from llmmem.scenario import Analysis


def check_setup_not_sized(analysis: Analysis, text: str) -> list[Finding]:
    if analysis.refusal is None or analysis.budget is not None:
        return []
    plan = analysis.plan
    if plan.kind in ("python", "notebook") and plan.trainer_range is None:
        return []  # code that loads a model but trains nothing llmmem sees (a loader, a demo)
    if not has_training_signal(plan):
        return []
    return [
        Finding(
            code="LLM018",
            severity=Severity.WARNING,
            message=f"no estimate: {analysis.refusal}",
            path=analysis.plan.path,
            range=anchor(analysis),
        )
    ]


register(
    Rule(
        code="LLM018",
        name="setup-not-sized",
        severity=Severity.WARNING,
        summary="The file's model and settings are read, but the step they make is one its "
        "framework refuses to run or one llmmem does not size, so there is no estimate (said "
        "where no other rule warns about the file).",
        why="A linter that passes a file it gave no answer for tells CI the step fits. The "
        "reason is the framework's own rule (torchtune refuses fp16, full fine-tuning of a "
        "4-bit model is not possible) or a method llmmem does not model yet (LitGPT's "
        "LLaMA-Adapter).",
        example="model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\ndtype: fp16",
        fix="Change the setting the message names (`dtype: bf16`), or silence the file with "
        "`# llmmem: ignore[LLM018]` where no estimate is wanted.",
        check=check_setup_not_sized,
        fallback=True,  # where LLM012 or LLM013 names the setting already, that is enough
    )
)

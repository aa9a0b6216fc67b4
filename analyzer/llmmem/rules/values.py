"""Values a file states that llmmem will not use: LLM011."""

from __future__ import annotations

from llmmem.rules.finding import Finding, Severity
from llmmem.rules.fit import anchor
from llmmem.rules.registry import Rule, register
from llmmem.scenario import Analysis


def check_rejected_values(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    findings = []
    for rejected in plan.rejected:
        where = rejected.range
        message = f"{rejected.key}: {rejected.message}; the estimate does not use it"
        if where is not None and where.path is not None:  # written in a file this one names
            message += f" (in {where.path}, line {where.start_line + 1})"
            where = anchor(analysis)
        findings.append(
            Finding(
                code="LLM011",
                severity=Severity.WARNING,
                message=message,
                path=plan.path,
                range=where,
            )
        )
    return findings


register(
    Rule(
        code="LLM011",
        name="value-out-of-range",
        severity=Severity.WARNING,
        summary="A value the file writes cannot be used (a count of 0, below 0, not a number, "
        "above 10**9, a DeepSpeed size above 10**15), so the estimate goes on without it.",
        why="A micro-batch or a sequence length that large is a typo or a placeholder: no GPU "
        "holds it, and numbers past float range would make every figure meaningless. llmmem "
        "never swaps such a value for a default silently: the estimate uses the framework's "
        "default and this finding says so.",
        example="args = TrainingArguments(per_device_train_batch_size=10**309)",
        fix="Write the value meant (`per_device_train_batch_size=8`), or a `# llmmem: batch=8` "
        "pragma when the file computes it.",
        check=check_rejected_values,
    )
)

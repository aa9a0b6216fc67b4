"""What llmmem could not read is said, never passed over: LLM015 and LLM016.

A linter that prints nothing for a file it could not parse tells CI the file is fine. LLM015 is
the file itself (a syntax error, a YAML or JSON document that does not parse: the parser's own
message, where it stopped); LLM016 is what the user wrote for llmmem (a `# llmmem:` comment, an
`ignore[...]`, `[tool.llmmem]`) that cannot be used.
"""

from __future__ import annotations

from llmmem.extract.pragmas import read_pragmas
from llmmem.rules.finding import Finding, Severity
from llmmem.rules.registry import RULES, Rule, register
from llmmem.scenario import Analysis


def check_does_not_parse(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    if not plan.parse_error:
        return []
    consequence = "; llmmem cannot read the file, so it cannot size it" if plan.unreadable else ""
    return [
        Finding(
            code="LLM015",
            severity=Severity.ERROR,
            message=plan.parse_error + consequence,
            path=plan.path,
            range=plan.parse_error_range,
        )
    ]


def check_unusable_settings(analysis: Analysis, text: str) -> list[Finding]:
    plan = analysis.plan
    findings = []
    if "llmmem" in text:
        reading = read_pragmas(text)
        for located in reading.located:
            findings.append(_unusable(plan.path, located.message + "; not used", located.range))
        for code, where in reading.ignored_codes:
            if code not in RULES and code != "*":
                findings.append(
                    _unusable(
                        plan.path,
                        f"`ignore[{code}]`: there is no rule {code}, so it silences nothing "
                        "(`llmmem-lint --explain CODE` describes a rule)",
                        where,
                    )
                )
    for problem in plan.settings_problems:
        findings.append(_unusable(plan.path, problem, None))
    return findings


def _unusable(path: str, message: str, where: object) -> Finding:
    return Finding(
        code="LLM016",
        severity=Severity.WARNING,
        message=message,
        path=path,
        range=where,  # type: ignore[arg-type]
    )


register(
    Rule(
        code="LLM015",
        name="does-not-parse",
        severity=Severity.ERROR,
        summary="The file does not parse (a Python syntax error, YAML or JSON that is not "
        "well formed), so llmmem cannot read it and gives no estimate.",
        why="A linter that is silent about a file it could not read tells CI the file is fine. "
        "Python is read with the syntax of the newest release llmmem knows (3.14), whatever "
        "interpreter runs llmmem, so this is a real error, not a newer construct.",
        example="args = TrainingArguments(\n    per_device_train_batch_size=8\n    bf16=True,\n)",
        fix="Correct the file where the parser stopped (here: the comma after `8`). The editor "
        "keeps showing the last estimate that parsed while you type.",
        check=check_does_not_parse,
    )
)

register(
    Rule(
        code="LLM016",
        name="unusable-setting",
        severity=Severity.WARNING,
        summary="A `# llmmem:` comment, an `ignore[...]` or the `[tool.llmmem]` table cannot be "
        "used as written (an unknown key, a value that is not a number, an unclosed bracket, an "
        "unknown rule code, a pyproject.toml that cannot be read), so the estimate goes on "
        "without it.",
        why="A setting the user wrote for llmmem and llmmem dropped changes what the estimate "
        "means: `# llmmem: gpus=A100-80GB` checks no GPU, `ignore[LLM001` silences nothing.",
        example="# llmmem: gpus=A100-80GB batch=abc",
        fix="Write the key and value as the pragma keys are documented (`gpu=A100-80GB "
        "batch=8`), close `ignore[...]`, use rule codes `llmmem-lint --explain` knows.",
        check=check_unusable_settings,
    )
)

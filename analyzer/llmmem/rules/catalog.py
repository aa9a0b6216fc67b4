"""Every rule, loaded: importing this module imports each rule family, which registers its rules
in `llmmem.rules.registry`. The registry imports none of them (no import circle); a caller that
needs the rules imports this module, lazily where start-up time matters."""

from __future__ import annotations

from llmmem.rules import (  # noqa: F401 - registration
    fit,
    names,
    practices,
    reading,
    refusal,
    values,
)
from llmmem.rules.finding import Finding, Severity
from llmmem.rules.registry import RULES, Rule
from llmmem.scenario import Analysis


def all_rules() -> list[Rule]:
    return [RULES[code] for code in sorted(RULES)]


def run_rules(analysis: Analysis, text: str) -> list[Finding]:
    """Every rule's findings for one analysed file, in code order; the fallback rules only
    where no other rule warned."""
    findings: list[Finding] = []
    for rule in all_rules():
        if not rule.fallback:
            findings.extend(rule.check(analysis, text))
    if not any(finding.severity in (Severity.WARNING, Severity.ERROR) for finding in findings):
        for rule in all_rules():
            if rule.fallback:
                findings.extend(rule.check(analysis, text))
    return sorted(findings, key=lambda finding: finding.code)


__all__ = ["all_rules", "run_rules"]

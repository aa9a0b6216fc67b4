"""Every rule, loaded: importing this module imports each rule family, which registers its rules
in `llmmem.rules.registry`. The registry imports none of them (no import circle); a caller that
needs the rules imports this module, lazily where start-up time matters."""

from __future__ import annotations

from llmmem.rules import fit, names, practices, reading, values  # noqa: F401 - registration
from llmmem.rules.finding import Finding
from llmmem.rules.registry import RULES, Rule
from llmmem.scenario import Analysis


def all_rules() -> list[Rule]:
    return [RULES[code] for code in sorted(RULES)]


def run_rules(analysis: Analysis, text: str) -> list[Finding]:
    """Every rule's findings for one analysed file, in code order."""
    findings: list[Finding] = []
    for rule in all_rules():
        findings.extend(rule.check(analysis, text))
    return findings


__all__ = ["all_rules", "run_rules"]

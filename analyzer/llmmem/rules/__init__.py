"""Rules: checks over an Analysis that produce Findings, each with a stable code and a doc.

`run_rules(analysis, text)` runs every rule: `llmmem.rules.catalog` imports the rule modules
(one per rule family), which register themselves in `llmmem.rules.registry`. Fixes travel inside
the findings as text edits with the predicted peak after them, so a code action is a lookup, not
a re-run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmmem.rules.finding import Finding, Fix, Severity, TextEdit
from llmmem.rules.registry import RULES, Rule

if TYPE_CHECKING:
    from llmmem.scenario import Analysis


def run_rules(analysis: Analysis, text: str) -> list[Finding]:
    """Every rule's findings for one analysed file (the rule modules load on the first call)."""
    from llmmem.rules.catalog import run_rules as run_all

    return run_all(analysis, text)


__all__ = ["RULES", "Finding", "Fix", "Rule", "Severity", "TextEdit", "run_rules"]

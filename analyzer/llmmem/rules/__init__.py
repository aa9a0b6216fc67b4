"""Rules: checks over an Analysis that produce Findings, each with a stable code and a doc.

`run_rules(analysis, text)` runs every registered rule; rule modules register themselves on
import (one module per rule family). Fixes travel inside the findings as text edits with the
predicted peak after them, so a code action is a lookup, not a re-run.
"""

from llmmem.rules.finding import Finding, Fix, Severity, TextEdit
from llmmem.rules.registry import RULES, Rule, run_rules

__all__ = ["RULES", "Finding", "Fix", "Rule", "Severity", "TextEdit", "run_rules"]

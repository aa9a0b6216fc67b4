"""The rule registry: a rule is a code, a doc in a fixed shape and a check function. Rule modules
register themselves here on import; `llmmem.rules.catalog` imports them all and runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmmem.rules.finding import Finding, Severity
from llmmem.scenario import Analysis

Check = Callable[[Analysis, str], list[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str  # stable: LLM001, LLM002, ...
    name: str  # kebab-case: will-not-fit
    severity: Severity
    summary: str  # what it checks, one line
    why: str
    example: str
    fix: str
    check: Check
    # runs only where no other rule has a warning or an error for the file: a last word for
    # what the others have not said
    fallback: bool = False

    def doc(self) -> str:
        """The rule's documentation, as `--explain` and the editor show it (Markdown)."""
        return (
            f"# {self.code} {self.name}\n\n"
            f"**What it does.** {self.summary}\n\n"
            f"**Why.** {self.why}\n\n"
            f"**Example.**\n\n```python\n{self.example.strip()}\n```\n\n"
            f"**Fix.** {self.fix}\n"
        )


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    if rule.code in RULES:
        raise ValueError(f"rule code {rule.code} registered twice")
    RULES[rule.code] = rule
    return rule

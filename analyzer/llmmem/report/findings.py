"""Findings as text for people and as JSON, GitHub annotations and SARIF for machines."""

from __future__ import annotations

import json
from typing import Any

from llmmem.rules.finding import Finding, Severity
from llmmem.version import __version__

SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def rule_url(code: str) -> str:
    """Where a rule's doc lives: the rules reference shipped inside the package."""
    from llmmem.rules.docs import RULES_DOC
    from llmmem.rules.registry import RULES

    rule = RULES.get(code)
    anchor = f"{code.lower()}-{rule.name}" if rule else code.lower()
    return f"{RULES_DOC.as_uri()}#{anchor}"


def _where(finding: Finding) -> str:
    if finding.range is None:
        return f"{finding.path}:1:1"
    return f"{finding.path}:{finding.range.start_line + 1}:{finding.range.start_col + 1}"


def concise(findings: list[Finding]) -> str:
    return "".join(f"{_where(f)}: {f.code} [{f.severity.value}] {f.message}\n" for f in findings)


def full(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{_where(f)}: {f.code} [{f.severity.value}] {f.message}")
        for related in f.related:
            lines.append(f"    note: line {related.range.start_line + 1}: {related.message}")
        for fix in f.fixes:
            lines.append(f"    fix{'' if fix.safe else ' (review)'}: {fix.title}")
        lines.append(f"    docs: {rule_url(f.code)}")
    return "\n".join(lines) + ("\n" if lines else "")


def as_json(findings: list[Finding]) -> str:
    return json.dumps([f.to_json() for f in findings], indent=2) + "\n"


def _escape_github(text: str) -> str:
    """A workflow command's message: `%`, CR and LF escaped, so a value cannot end the line."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_github_property(text: str) -> str:
    """A workflow command's property value (`file=`, `title=`): the message escapes, and `:`
    and `,`, which would otherwise end the property list or the value."""
    return _escape_github(text).replace(":", "%3A").replace(",", "%2C")


def github(findings: list[Finding]) -> str:
    out = []
    for f in findings:
        line = f.range.start_line + 1 if f.range else 1
        col = f.range.start_col + 1 if f.range else 1
        out.append(
            f"::{GITHUB_LEVEL[f.severity]} file={_escape_github_property(f.path)},"
            f"line={line},col={col},title={_escape_github_property(f.code)}::"
            f"{_escape_github(f.message)}"
        )
    return "\n".join(out) + ("\n" if out else "")


def sarif(findings: list[Finding], rules: list[Any]) -> str:
    """SARIF 2.1.0, the format code-scanning dashboards read."""
    results = []
    for f in findings:
        result: dict[str, Any] = {
            "ruleId": f.code,
            "level": SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
        }
        location: dict[str, Any] = {"artifactLocation": {"uri": f.path}}
        if f.range is not None:
            location["region"] = {
                "startLine": f.range.start_line + 1,
                "startColumn": f.range.start_col + 1,
                "endLine": f.range.end_line + 1,
                "endColumn": f.range.end_col + 1,
            }
        result["locations"] = [{"physicalLocation": location}]
        results.append(result)
    driver = {
        "name": "llmmem",
        "version": __version__,
        "rules": [
            {
                "id": rule.code,
                "name": rule.name,
                "shortDescription": {"text": rule.summary},
                "fullDescription": {"text": rule.why},
                "helpUri": rule_url(rule.code),
                "defaultConfiguration": {"level": SARIF_LEVEL[rule.severity]},
            }
            for rule in rules
        ],
    }
    log = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": driver}, "results": results}],
    }
    return json.dumps(log, indent=2) + "\n"

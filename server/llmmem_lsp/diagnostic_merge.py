"""One diagnostic per range: findings that land on the same text are said together.

A config names its model once, and several findings are about it (the step does not fit, the
model is sized from its name, a problem reading it); an editor draws each as its own squiggle on
the same value and lists them one under the other. Here they become one diagnostic: the most
severe one's code and severity, each message on its line, the related values of all of them.
Its `data.merged` lists each finding's (code, message), so that a quick fix request naming the
merged diagnostic finds every finding in it (`matches`).
"""

from __future__ import annotations

from typing import Any

from lsprotocol import types

MERGED = "merged"


def _key(diagnostic: types.Diagnostic) -> tuple[int, int, int, int]:
    r = diagnostic.range
    return (r.start.line, r.start.character, r.end.line, r.end.character)


def _rank(diagnostic: types.Diagnostic) -> int:
    return int(diagnostic.severity or types.DiagnosticSeverity.Information)


def merged(diagnostics: list[types.Diagnostic]) -> list[types.Diagnostic]:
    """The diagnostics with those of one range merged, in the order of their first."""
    groups: dict[tuple[int, int, int, int], list[types.Diagnostic]] = {}
    for diagnostic in diagnostics:
        groups.setdefault(_key(diagnostic), []).append(diagnostic)
    out = []
    for group in groups.values():
        out.append(group[0] if len(group) == 1 else _merge(group))
    return out


def _merge(group: list[types.Diagnostic]) -> types.Diagnostic:
    ordered = sorted(group, key=_rank)  # stable: the most severe first, else as listed
    first = ordered[0]
    related: list[types.DiagnosticRelatedInformation] = []
    for diagnostic in ordered:
        for item in diagnostic.related_information or []:
            if item not in related:
                related.append(item)
    data: dict[str, Any] = {}
    for diagnostic in ordered:
        if isinstance(diagnostic.data, dict):
            data = {**diagnostic.data, **data}
    data[MERGED] = [[d.code, d.message] for d in ordered]
    return types.Diagnostic(
        range=first.range,
        severity=first.severity,
        code=first.code,
        code_description=first.code_description,
        source=first.source,
        message="\n".join(d.message for d in ordered),
        related_information=related or None,
        data=data,
    )


def matches(wanted: types.Diagnostic, ours: types.Diagnostic) -> bool:
    """Whether `ours` (one finding's diagnostic) is in `wanted`, a merged diagnostic the client
    sent back: the same range, its code and message among those merged."""
    data = wanted.data
    if not isinstance(data, dict) or not isinstance(data.get(MERGED), list):
        return False
    if _key(wanted) != _key(ours):
        return False
    return any(
        isinstance(item, list)
        and len(item) == 2
        and item[0] == ours.code
        and item[1] == ours.message
        for item in data[MERGED]
    )


def shown_as(diagnostics: list[types.Diagnostic]) -> list[types.Diagnostic]:
    """For each diagnostic, the one the client was sent for it: the merged one of its range,
    or itself (a quick fix lists the diagnostic the client knows)."""
    published = {_key(d): d for d in merged(diagnostics)}
    return [published[_key(d)] for d in diagnostics]

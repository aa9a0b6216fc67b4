"""What a rule reports: code, severity, message, where, and the edits that fix it.

Frozen keyword-only dataclasses; `dataclasses.replace` makes an edited copy and `to_json()` gives
the JSON shape of `llmmem-lint --format json` (enums as their values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from llmmem.plan import SourceRange


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True, kw_only=True)
class TextEdit:
    range: SourceRange  # replaced text; an empty range inserts
    new_text: str

    def to_json(self) -> dict[str, Any]:
        return {"range": self.range.to_dict(), "new_text": self.new_text}


@dataclass(frozen=True, slots=True, kw_only=True)
class Fix:
    title: str  # "Enable gradient checkpointing → 31.2 GiB (fits A100-80GB)"
    edits: list[TextEdit]
    predicted_device_bytes: int | None = None  # the nvidia-smi total after the fix
    fits: bool | None = None
    safe: bool = True  # applied by `llmmem-lint --fix`
    levers: tuple[str, ...] = ()  # a "make it fit" combination: its changes (`--fix --fit`)

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "edits": [edit.to_json() for edit in self.edits],
            "predicted_device_bytes": self.predicted_device_bytes,
            "fits": self.fits,
            "safe": self.safe,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Related:
    range: SourceRange
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"range": self.range.to_dict(), "message": self.message}


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    code: str
    severity: Severity
    message: str
    path: str
    range: SourceRange | None = None
    fixes: list[Fix] = field(default_factory=list)
    related: list[Related] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.severity, Severity):  # its text value is accepted too
            object.__setattr__(self, "severity", Severity(self.severity))

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "path": self.path,
            "range": self.range.to_dict() if self.range is not None else None,
            "fixes": [fix.to_json() for fix in self.fixes],
            "related": [related.to_json() for related in self.related],
        }

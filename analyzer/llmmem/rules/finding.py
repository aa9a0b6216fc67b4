"""What a rule reports: code, severity, message, where, and the edits that fix it."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from llmmem.plan import SourceRange


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class TextEdit(BaseModel):
    range: SourceRange  # replaced text; an empty range inserts
    new_text: str


class Fix(BaseModel):
    title: str  # "Enable gradient checkpointing → 31.2 GiB (fits A100-80GB)"
    edits: list[TextEdit]
    predicted_device_bytes: int | None = None  # the nvidia-smi total after the fix
    fits: bool | None = None
    safe: bool = True  # applied by `llmmem-lint --fix`


class Related(BaseModel):
    range: SourceRange
    message: str


class Finding(BaseModel):
    code: str
    severity: Severity
    message: str
    path: str
    range: SourceRange | None = None
    fixes: list[Fix] = Field(default_factory=list)
    related: list[Related] = Field(default_factory=list)

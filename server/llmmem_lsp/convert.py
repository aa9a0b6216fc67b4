"""Between llmmem's values and LSP's: ranges (code points <-> the client's encoding), findings
to diagnostics, fixes to code actions."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:  # not imported at start: the server answers `initialize` before the analyzer
    from llmmem.plan import SourceRange
    from llmmem.rules.finding import Finding, Fix, TextEdit

SEVERITY = {  # by the value of llmmem.rules.finding.Severity
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "info": types.DiagnosticSeverity.Information,
}


class Lines:
    """The lines of one version of a document, to convert columns between llmmem (code points)
    and the client (UTF-16 by default; UTF-8 or UTF-32 when negotiated)."""

    def __init__(self, text: str, encoding: str = "utf-16") -> None:
        self.lines = text.split("\n")
        self.encoding = encoding
        self._starts: list[int] | None = None

    @staticmethod
    @lru_cache(maxsize=32)
    def of(text: str, encoding: str = "utf-16") -> Lines:
        """The index of one text, built once: a document's text is one string object per
        version, so every request after the first finds it here without reading the text."""
        return Lines(text, encoding)

    @property
    def starts(self) -> list[int]:
        """The offset of each line's first character (`llmmem.rules.text_edits.line_starts`)."""
        if self._starts is None:
            starts = [0]
            for line in self.lines[:-1]:
                starts.append(starts[-1] + len(line) + 1)
            self._starts = starts
        return self._starts

    def _line(self, number: int) -> str:
        return self.lines[number] if 0 <= number < len(self.lines) else ""

    def to_client_col(self, line: int, col: int) -> int:
        prefix = self._line(line)[:col]
        if self.encoding == "utf-32":
            return len(prefix)
        if self.encoding == "utf-8":
            return len(prefix.encode("utf-8", errors="surrogatepass"))
        return len(prefix.encode("utf-16-le", errors="surrogatepass")) // 2

    def from_client_col(self, line: int, col: int) -> int:
        if self.encoding == "utf-32":
            return col
        text = self._line(line)
        units = 0
        for index, char in enumerate(text):
            if units >= col:
                return index
            if self.encoding == "utf-8":
                units += len(char.encode("utf-8", errors="surrogatepass"))
            else:
                units += 2 if ord(char) > 0xFFFF else 1
        return len(text)

    def position(self, line: int, col: int) -> types.Position:
        line = max(0, min(line, len(self.lines) - 1))
        return types.Position(line=line, character=self.to_client_col(line, col))

    def range(self, source: SourceRange | None) -> types.Range:
        if source is None:
            start = types.Position(line=0, character=0)
            return types.Range(start=start, end=start)
        return types.Range(
            start=self.position(source.start_line, source.start_col),
            end=self.position(source.end_line, source.end_col),
        )

    def server_position(self, position: types.Position) -> tuple[int, int]:
        return position.line, self.from_client_col(position.line, position.character)


def overlaps(a: types.Range, b: types.Range) -> bool:
    def key(p: types.Position) -> tuple[int, int]:
        return p.line, p.character

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def diagnostic(
    finding: Finding, lines: Lines, uri: str, rule_url: str | None = None
) -> types.Diagnostic:
    related = [
        types.DiagnosticRelatedInformation(
            location=types.Location(uri=uri, range=lines.range(item.range)),
            message=item.message,
        )
        for item in finding.related
        if item.range.path is None
    ]
    return types.Diagnostic(
        range=lines.range(finding.range),
        severity=SEVERITY[finding.severity.value],
        code=finding.code,
        code_description=types.CodeDescription(href=rule_url) if rule_url else None,
        source="llmmem",
        message=finding.message,
        related_information=related or None,
    )


def text_edits(edits: Sequence[TextEdit], lines: Lines) -> list[types.TextEdit]:
    return [types.TextEdit(range=lines.range(edit.range), new_text=edit.new_text) for edit in edits]


def workspace_edit(
    edits: Sequence[TextEdit], uri: str, version: int | None, lines: Lines, versioned: bool
) -> types.WorkspaceEdit:
    """The edits for one document: versioned (a client will not apply them to a newer text)
    where the client takes `documentChanges`, a plain `changes` map otherwise."""
    converted = text_edits(edits, lines)
    if not versioned:
        return types.WorkspaceEdit(changes={uri: converted})
    document = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
    return types.WorkspaceEdit(
        document_changes=[types.TextDocumentEdit(text_document=document, edits=list(converted))]
    )


def code_action(
    fix: Fix,
    uri: str,
    version: int | None,
    lines: Lines,
    diagnostics: list[types.Diagnostic],
    versioned: bool = True,
) -> types.CodeAction:
    """A quick fix that carries its edits up front (no resolve round trip)."""
    return types.CodeAction(
        title=fix.title,
        kind=types.CodeActionKind.QuickFix,
        diagnostics=diagnostics or None,
        edit=workspace_edit(fix.edits, uri, version, lines, versioned),
        is_preferred=bool(fix.fits),
    )

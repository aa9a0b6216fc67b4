"""Text edits as positions: line starts, offsets, the span of an `ast` node, applying edits and
the smallest edits between two texts. Pure text: no rule, no plan, nothing above them."""

from __future__ import annotations

import ast
import re

from llmmem.plan import SourceRange
from llmmem.rules.finding import TextEdit


def line_starts(text: str) -> list[int]:
    starts = [0]
    for index, char in enumerate(text):
        if char == "\n":
            starts.append(index + 1)
    return starts


def offset(text: str, line: int, col: int, starts: list[int] | None = None) -> int:
    starts = starts or line_starts(text)
    if line >= len(starts):
        return len(text)
    return min(starts[line] + col, len(text))


def position(text: str, index: int, starts: list[int] | None = None) -> tuple[int, int]:
    starts = starts or line_starts(text)
    line = max(i for i, start in enumerate(starts) if start <= index)
    return line, index - starts[line]


def point_range(line: int, col: int) -> SourceRange:
    return SourceRange(start_line=line, start_col=col, end_line=line, end_col=col)


def char_column(text: str, starts: list[int], line: int, byte_col: int) -> int:
    if line >= len(starts):
        return byte_col
    end = text.find("\n", starts[line])
    row = text[starts[line] : end if end >= 0 else len(text)]
    if row.isascii():
        return byte_col
    return len(row.encode("utf-8")[:byte_col].decode("utf-8", errors="ignore"))


def node_span(text: str, node: ast.AST, starts: list[int] | None = None) -> tuple[int, int]:
    """A node's start and end as offsets into `text` (ast counts columns in UTF-8 bytes)."""
    starts = starts or line_starts(text)
    line = int(getattr(node, "lineno", 1)) - 1
    end_line = int(getattr(node, "end_lineno", None) or line + 1) - 1
    col = char_column(text, starts, line, int(getattr(node, "col_offset", 0)))
    end_col = char_column(text, starts, end_line, int(getattr(node, "end_col_offset", None) or 0))
    return offset(text, line, col, starts), offset(text, end_line, end_col, starts)


def range_span(text: str, where: SourceRange, starts: list[int]) -> tuple[int, int]:
    return (
        offset(text, where.start_line, where.start_col, starts),
        offset(text, where.end_line, where.end_col, starts),
    )


def range_of_span(text: str, start: int, end: int, starts: list[int]) -> SourceRange:
    start_line, start_col = position(text, start, starts)
    end_line, end_col = position(text, end, starts)
    return SourceRange(
        start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
    )


def apply_edits(text: str, edits: list[TextEdit]) -> str:
    """The text with the edits applied (edits must not overlap). Edits of a notebook's cells
    (a range with a path) are for an editor holding the cells, not for the file's text."""
    if any(edit.range.path is not None for edit in edits):
        raise ValueError("edits of notebook cells apply to the cells, not to the file's text")
    starts = line_starts(text)
    spans = sorted(
        (
            (
                offset(text, e.range.start_line, e.range.start_col, starts),
                offset(text, e.range.end_line, e.range.end_col, starts),
                e.new_text,
            )
            for e in edits
        ),
        reverse=True,
    )
    for start, end, new_text in spans:
        text = text[:start] + new_text + text[end:]
    return text


def whole_change(before: str, after: str) -> TextEdit:
    """One edit turning `before` into `after`: the span between their common prefix and
    suffix."""
    start = 0
    limit = min(len(before), len(after))
    while start < limit and before[start] == after[start]:
        start += 1
    end = 0
    while end < limit - start and before[-1 - end] == after[-1 - end]:
        end += 1
    start_line, start_col = position(before, start)
    end_line, end_col = position(before, len(before) - end)
    return TextEdit(
        range=SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        ),
        new_text=after[start : len(after) - end],
    )


_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # a line and its ending


def diff_edits(before: str, after: str) -> list[TextEdit]:
    """The edits turning `before` into `after`, one per changed block of lines, each trimmed
    to the characters that differ; a line inserted whole is written after the end of the line
    before it (`,\n    name=value` after an argument's comma, as an editor would type it)."""
    import difflib

    old_lines, new_lines = _LINES.findall(before), _LINES.findall(after)
    starts = line_starts(before)
    offsets = [0]
    for line in old_lines:
        offsets.append(offsets[-1] + len(line))
    # a fix changes a few lines: the lines equal at both ends are set aside first, so the
    # matcher (quadratic in what it is given) sees only the changed middle of a long file
    lead = 0
    most = min(len(old_lines), len(new_lines))
    while lead < most and old_lines[lead] == new_lines[lead]:
        lead += 1
    trail = 0
    while (
        trail < most - lead
        and old_lines[len(old_lines) - 1 - trail] == new_lines[len(new_lines) - 1 - trail]
    ):
        trail += 1
    matcher = difflib.SequenceMatcher(
        None,
        old_lines[lead : len(old_lines) - trail],
        new_lines[lead : len(new_lines) - trail],
        autojunk=False,
    )
    edits = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        i1, i2, j1, j2 = i1 + lead, i2 + lead, j1 + lead, j2 + lead
        start, end = offsets[i1], offsets[i2]
        new_text = "".join(new_lines[j1:j2])
        old_text = before[start:end]
        same = 0
        limit = min(len(old_text), len(new_text))
        while same < limit and old_text[same] == new_text[same]:
            same += 1
        tail = 0
        while tail < limit - same and old_text[-1 - tail] == new_text[-1 - tail]:
            tail += 1
        start, end = start + same, end - tail
        new_text = new_text[same : len(new_text) - tail]
        newline = "\r\n" if before[:start].endswith("\r\n") else before[start - 1 : start]
        if start == end and newline in ("\n", "\r\n") and new_text.endswith(newline):
            start = end = start - len(newline)
            new_text = newline + new_text[: -len(newline)]
        edits.append(TextEdit(range=range_of_span(before, start, end, starts), new_text=new_text))
    return edits

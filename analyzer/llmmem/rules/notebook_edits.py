"""A notebook's fixes written into its JSON: each edited cell's source, and not a byte more.

The fixes of a notebook are edits of its code cells (ranges naming `{notebook}#cell={index}`,
in the lines of the cell's source, see `extract/notebook`). Here they are applied to the cells'
sources and each new source is written back where the old one stands in the notebook's text:
the JSON around it (indentation, key order, outputs, metadata) is not re-encoded. A source kept
as a list of lines (as Jupyter writes it) keeps every unchanged line's string as it was written
and the separators between them; a new or changed line is encoded as Jupyter encodes it (non-ASCII
characters as they are, unless the notebook escapes them). Lines keep their own line ends (CRLF,
CR or LF); a new line gets the one most of the cell's lines have.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from llmmem.rules.finding import TextEdit

_DECODER = json.JSONDecoder()
_BLANK = re.compile(r"[ \t\n\r]*")
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")  # a line and its end
# a non-ASCII character escaped: the notebook was written with `ensure_ascii`
_ESCAPED = re.compile(r"\\u(?!00[0-7])[0-9a-fA-F]{4}")


class NotebookEditError(ValueError):
    """Why a notebook's cell edits cannot be written into its text."""


@dataclass(frozen=True)
class Span:
    start: int
    end: int


def cell_edit_index(edit: TextEdit, notebook: str) -> int | None:
    """The cell an edit's range names in `notebook` (None: not a cell of it)."""
    from llmmem.extract.notebook import cell_index

    return cell_index(edit.range, notebook)


def is_cell_fix(edits: list[TextEdit], notebook: str) -> bool:
    """Every edit is of a cell of `notebook` (and there is one)."""
    return bool(edits) and all(cell_edit_index(edit, notebook) is not None for edit in edits)


def apply_cell_edits(text: str, notebook: str, edits: list[TextEdit]) -> str:
    """The notebook's text with `edits` (each in a cell of `notebook`) applied to its cells'
    sources; raises NotebookEditError where that cannot be done."""
    from llmmem.rules.text_edits import apply_edits

    by_cell: dict[int, list[TextEdit]] = {}
    for edit in edits:
        index = cell_edit_index(edit, notebook)
        if index is None:
            raise NotebookEditError(f"an edit is not in a cell of {notebook}")
        local = replace(edit, range=replace(edit.range, path=None))
        by_cell.setdefault(index, []).append(local)
    sources = _cell_sources(text)
    escaped = text.isascii() and _ESCAPED.search(text) is not None
    pieces: list[tuple[Span, str]] = []
    for index, cell_edits in by_cell.items():
        span = sources[index] if 0 <= index < len(sources) else None
        if span is None:
            raise NotebookEditError(f"cell {index + 1} has no source llmmem can edit")
        old = _DECODER.raw_decode(text, span.start)[0]
        parts = old if isinstance(old, list) else [old]
        if not all(isinstance(part, str) for part in parts):
            raise NotebookEditError(f"cell {index + 1}'s source is not text")
        old_lines = _LINE.findall("".join(parts))
        # the edits' lines and columns are those of the source with every line end a `\n`
        plain = [_plain(line) for line in old_lines]
        new_plain = _LINE.findall(apply_edits("".join(plain), cell_edits))
        ending = _usual_ending(old_lines)
        new_lines: list[str] = []
        matcher = difflib.SequenceMatcher(None, plain, new_plain, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                new_lines += old_lines[i1:i2]  # each with its own line end
            else:
                new_lines += [line.replace("\n", ending) for line in new_plain[j1:j2]]
        if isinstance(old, str):
            written = json.dumps("".join(new_lines), ensure_ascii=escaped)
        else:
            written = _source_list(text, span, new_lines, escaped)
        pieces.append((span, written))
    for span, written in sorted(pieces, key=lambda piece: piece[0].start, reverse=True):
        text = text[: span.start] + written + text[span.end :]
    return text


def _usual_ending(lines: list[str]) -> str:
    """The line end most of the lines have (the first's on a tie; `\n` for none)."""
    endings = [line[len(line.rstrip("\r\n")) :] for line in lines]
    endings = [ending for ending in endings if ending]
    return max(endings, key=endings.count) if endings else "\n"


def _plain(line: str) -> str:
    """A line with its end (CRLF, CR or LF) written `\n`."""
    body = line.rstrip("\r\n")
    return body + "\n" if len(body) < len(line) else body


def _source_list(text: str, span: Span, new_lines: list[str], escaped: bool) -> str:
    """The JSON list of `new_lines`, written as the list at `span` is: its unchanged strings
    as they were, its separators and the space inside its brackets. (A list whose strings are
    not one line each is written a line a string, as Jupyter writes it.)"""
    items = list(_array_items(text, span.start))
    old_lines = [_DECODER.raw_decode(text, item.start)[0] for item in items]
    if items:
        opening = text[span.start + 1 : items[0].start]
        closing = text[items[-1].end : span.end - 1]
        between = text[items[0].end : items[1].start] if len(items) > 1 else "," + opening
    else:
        indent = _indent_at(text, span.start)
        opening, closing, between = f"\n{indent} ", f"\n{indent}", f",\n{indent} "
    if _LINE.findall("".join(old_lines)) != old_lines:
        old_lines = []  # not a line a string: no string is kept as it was written
    tokens: list[str] = []
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            tokens += [text[item.start : item.end] for item in items[i1:i2]]
        else:
            tokens += [json.dumps(line, ensure_ascii=escaped) for line in new_lines[j1:j2]]
    if not tokens:
        return "[]"
    return "[" + opening + between.join(tokens) + closing + "]"


def _indent_at(text: str, at: int) -> str:
    line_start = text.rfind("\n", 0, at) + 1
    line = text[line_start:at]
    return line[: len(line) - len(line.lstrip(" \t"))]


# -- where each cell's source is written ------------------------------------------------------


def _cell_sources(text: str) -> list[Span | None]:
    """For each cell, in the order the reader numbers them (`cells`, or nbformat 3's
    worksheets' cells), where its code source is written (None: not a code cell with one)."""
    start = _skip_blank(text, 0)
    if text[start : start + 1] != "{":
        raise NotebookEditError("the notebook's JSON is not an object")
    members = _members(text, start)
    if "cells" in members:
        return [_code_source(text, cell) for cell in _array_items(text, members["cells"].start)]
    if "worksheets" in members:
        return [
            _code_source(text, cell)
            for sheet in _array_items(text, members["worksheets"].start)
            if text[sheet.start] == "{"
            and "cells" in (sheet_members := _members(text, sheet.start))
            and text[sheet_members["cells"].start] == "["
            for cell in _array_items(text, sheet_members["cells"].start)
        ]
    raise NotebookEditError("the notebook has no list of cells")


def _code_source(text: str, cell: Span) -> Span | None:
    if text[cell.start] != "{":
        return None
    members = _members(text, cell.start)
    kind = members.get("cell_type")
    if kind is None or _DECODER.raw_decode(text, kind.start)[0] != "code":
        return None
    return members.get("source", members.get("input"))


def _members(text: str, start: int) -> dict[str, Span]:
    """An object's keys and where each value is written (the last of a repeated key, as a
    JSON reader keeps it)."""
    found: dict[str, Span] = {}
    index = _skip_blank(text, start + 1)
    if text[index : index + 1] == "}":
        return found
    while True:
        if text[index : index + 1] != '"':
            raise NotebookEditError("the notebook's JSON does not read")
        key_end = _value_end(text, index)
        key = _DECODER.raw_decode(text, index)[0]
        index = _skip_blank(text, key_end)
        if text[index : index + 1] != ":":
            raise NotebookEditError("the notebook's JSON does not read")
        value_start = _skip_blank(text, index + 1)
        value_end = _value_end(text, value_start)
        found[str(key)] = Span(value_start, value_end)
        index = _skip_blank(text, value_end)
        if text[index : index + 1] == "}":
            return found
        if text[index : index + 1] != ",":
            raise NotebookEditError("the notebook's JSON does not read")
        index = _skip_blank(text, index + 1)


def _array_items(text: str, start: int) -> Iterator[Span]:
    if text[start : start + 1] != "[":
        raise NotebookEditError("the notebook's JSON does not read")
    index = _skip_blank(text, start + 1)
    if text[index : index + 1] == "]":
        return
    while True:
        end = _value_end(text, index)
        yield Span(index, end)
        index = _skip_blank(text, end)
        if text[index : index + 1] == "]":
            return
        if text[index : index + 1] != ",":
            raise NotebookEditError("the notebook's JSON does not read")
        index = _skip_blank(text, index + 1)


def _value_end(text: str, start: int) -> int:
    try:
        return _DECODER.raw_decode(text, start)[1]
    except (ValueError, RecursionError) as err:
        raise NotebookEditError(f"the notebook's JSON does not read ({err})") from None


def _skip_blank(text: str, index: int) -> int:
    match = _BLANK.match(text, index)
    return match.end() if match else index

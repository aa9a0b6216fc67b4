"""Edits of one top-level setting of a YAML or JSON config that change nothing else.

The reader (`extract/yaml_positions`) reads the first document; so do these edits. A value is
replaced where it is written unless that text is shared: an anchored value (`common: &bs 16`)
that an alias reads elsewhere is never edited, nor is its anchor removed; the key being set gets
the literal in place of its alias (`micro_batch_size: *bs` -> `micro_batch_size: 8`), and where
the value comes through a merge key (`<<: *base`) there is no edit. A key that is not written is
added to the first document's top-level mapping: a line at its end for a block mapping, an entry
before the closing brace for a flow mapping or a JSON object. Values in JSON are JSON-encoded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from llmmem.budget.setup import TrainingSetup
from llmmem.plan import SourceRange
from llmmem.rules.finding import TextEdit
from llmmem.rules.spellings import KeyWrite


@dataclass
class Entry:
    """One top-level `key: value` of the first document: the value's text span."""

    start: int
    end: int
    alias: bool  # the value is written as `*name`
    key_start: int


@dataclass
class Document:
    """The first document's top-level mapping, as far as edits need it."""

    flow: bool  # `{...}` (and every JSON object)
    end: int  # where the mapping's last entry ends (block: where the next token starts)
    entries: dict[str, Entry] = field(default_factory=dict)
    anchored: list[tuple[int, int, str]] = field(default_factory=list)  # spans with anchors
    aliased: set[str] = field(default_factory=set)  # anchors some alias reads


def read_document(text: str) -> Document | None:
    """The top-level mapping of the first document; None when the text does not parse or the
    document is not a mapping."""
    try:
        events = list(_first_document_events(text))
    except yaml.YAMLError:
        return None
    if len(events) < 2 or not isinstance(events[0], yaml.MappingStartEvent):
        return None
    document = Document(flow=bool(events[0].flow_style), end=0)
    depth, expect_key, key = 0, True, None
    open_spans: list[tuple[int, str | None, str | None]] = []  # (start, anchor, top-level key)
    for event in events:
        start, end = event.start_mark.index, event.end_mark.index
        if isinstance(event, yaml.AliasEvent):
            document.aliased.add(event.anchor)
        anchor = getattr(event, "anchor", None)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            entry_key = None
            if depth == 1:
                entry_key = None if expect_key else key
                expect_key = not expect_key
            open_spans.append((start, anchor, entry_key))
            depth += 1
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
            begin, opened_anchor, entry_key = open_spans.pop()
            if opened_anchor is not None:
                document.anchored.append((begin, end, opened_anchor))
            if depth == 0:
                document.end = start
            elif depth == 1 and entry_key is not None:
                document.entries[entry_key] = Entry(begin, end, False, begin)
            continue
        if anchor is not None and isinstance(event, yaml.ScalarEvent):
            document.anchored.append((start, end, anchor))
        if depth != 1:
            continue
        if expect_key:
            key = event.value if isinstance(event, yaml.ScalarEvent) else None
            key_start = start
        elif key is not None:
            alias = isinstance(event, yaml.AliasEvent)
            document.entries[key] = Entry(start, end, alias, key_start)
        expect_key = not expect_key
    if document.flow:
        last = max((e.end for e in document.entries.values()), default=None)
        document.end = last if last is not None else document.end
    return document


def _first_document_events(text: str) -> list[yaml.Event]:
    events: list[yaml.Event] = []
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.StreamStartEvent, yaml.DocumentStartEvent)):
            continue
        if isinstance(event, yaml.DocumentEndEvent):
            break
        events.append(event)
    return events


def config_literal(value: Any, *, json_file: bool) -> str:
    if json_file:
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(config_literal(item, json_file=False) for item in value) + "]"
    if isinstance(value, dict):
        entries = (
            f"{config_literal(key, json_file=False)}: {config_literal(item, json_file=False)}"
            for key, item in value.items()
        )
        return "{" + ", ".join(entries) + "}"
    if isinstance(value, str):
        loaded = _plain_scalar(value)
        return value if loaded == value else json.dumps(value)
    return str(value)


def _plain_scalar(value: str) -> Any:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return None


def set_config_value(
    text: str, key: str, value: Any, where: SourceRange | None, *, json_file: bool
) -> TextEdit | None:
    """The edit making the first document say `key: value`: at `where` (the range the value
    was read from) when it is written, else a new entry; None where no safe edit exists."""
    document = read_document(text)
    if document is None:
        return None
    literal = config_literal(value, json_file=json_file)
    entry = document.entries.get(key)
    if where is not None:
        start = _offset(text, where.start_line, where.start_col)
        end = _offset(text, where.end_line, where.end_col)
        if entry is not None and entry.alias:
            return _edit(text, entry.start, entry.end, literal)  # the alias, not its anchor
        shared = any(
            begin < end and start < finish and (anchor in document.aliased or begin >= start)
            for begin, finish, anchor in document.anchored
        )
        return None if shared else _edit(text, start, end, literal)
    if entry is not None:
        return None  # written, though not where the plan read it: editing it is a guess
    name = json.dumps(key) if json_file else key
    if document.flow:
        return _flow_entry(text, document, f"{name}: {literal}")
    at = document.end
    indent = _block_indent(text, document)
    line = f"{indent}{name}: {literal}"
    eol = _line_break(text)
    if at == 0 or text[at - 1] == "\n":
        return _edit(text, at, at, line + eol)
    return _edit(text, at, at, eol + line + (eol if at < len(text) else ""))


def _line_break(text: str) -> str:
    """The file's own line break (a CRLF file gets CRLF lines)."""
    return "\r\n" if "\r\n" in text else "\n"


def _flow_entry(text: str, document: Document, entry: str) -> TextEdit:
    """`, key: value` after a flow mapping's last entry (on a line of its own, at the last
    entry's indent, when the entries are one per line)."""
    if not document.entries:
        return _edit(text, document.end, document.end, entry)
    last = max(document.entries.values(), key=lambda e: e.end)
    line_start = text.rfind("\n", 0, last.key_start) + 1
    before = text[line_start : last.key_start]
    if "\n" in text[last.end : text.find("}", last.end) + 1] and not before.strip():
        return _edit(text, last.end, last.end, f",{_line_break(text)}{before}{entry}")
    return _edit(text, last.end, last.end, f", {entry}")


def _block_indent(text: str, document: Document) -> str:
    first = min((e.key_start for e in document.entries.values()), default=None)
    if first is None:
        return ""
    line_start = text.rfind("\n", 0, first) + 1
    before = text[line_start:first]
    return before if not before.strip() else ""


def _offset(text: str, line: int, col: int) -> int:
    index = 0
    for _ in range(line):
        found = text.find("\n", index)
        if found < 0:
            return len(text)
        index = found + 1
    return min(index + col, len(text))


def _edit(text: str, start: int, end: int, new_text: str) -> TextEdit:
    return TextEdit(range=_range(text, start, end), new_text=new_text)


def _range(text: str, start: int, end: int) -> SourceRange:
    start_line = text.count("\n", 0, start)
    end_line = text.count("\n", 0, end)
    start_col = start - (text.rfind("\n", 0, start) + 1)
    end_col = end - (text.rfind("\n", 0, end) + 1)
    return SourceRange(
        start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
    )


def spelled_edits(
    text: str, writes: tuple[KeyWrite, ...], setup: TrainingSetup, *, json_file: bool
) -> list[TextEdit] | None:
    """One edit writing every key of a framework's spelling of a lever (`rules/spellings`),
    each where it is written or, at the top level, as a new key; None where any of them has no
    safe edit (a nested key not written, a value the spelling cannot give for this file)."""
    from llmmem.extract.yaml_positions import read_positioned_yaml
    from llmmem.rules.text_edits import apply_edits, whole_change

    edited = text
    for write in writes:
        document = read_positioned_yaml(edited, is_json=json_file)
        found, current = document.lookup(write.path)
        if write.layout_key and not found:
            continue  # another layout's key: the file writes its own
        value = write.value(setup, current) if callable(write.value) else write.value
        if value is None:
            return None
        if found and current == value and type(current) is type(value):
            continue
        if _appends(current, value) and len(write.path) == 1:
            edit = append_to_sequence(edited, str(write.path[0]), value[len(current) :])
            if edit is None:
                return None
            edited = apply_edits(edited, [edit])
            continue
        where = document.range_of(write.path) if found else None
        if where is None and (write.only_if_written or len(write.path) > 1):
            return None
        key = str(write.path[0]) if len(write.path) == 1 else ""
        edit = set_config_value(edited, key, value, where, json_file=json_file)
        if edit is None:
            return None
        edited = apply_edits(edited, [edit])
    if edited == text:
        return None
    return [whole_change(text, edited)]


def _appends(current: Any, value: Any) -> bool:
    """`value` is the list `current` with items added at its end."""
    return (
        isinstance(current, list)
        and isinstance(value, list)
        and len(value) > len(current)
        and value[: len(current)] == current
    )


def append_to_sequence(text: str, key: str, items: list[Any]) -> TextEdit | None:
    """The edit adding `items` at the end of the list that the first document's top-level `key`
    holds, in that list's own style: `, item` before a flow list's `]`, a `- item` line after a
    block list's last item, at its indent. None for a list shared through an anchor or an
    alias, or a key that holds no list."""
    try:
        events = _first_document_events(text)
    except yaml.YAMLError:
        return None
    if not events or not isinstance(events[0], yaml.MappingStartEvent):
        return None
    depth, expect_key, index = 0, True, 0
    start: yaml.SequenceStartEvent | None = None
    for index, event in enumerate(events):
        if depth == 1 and expect_key and isinstance(event, yaml.ScalarEvent):
            if event.value == key:
                following = events[index + 1] if index + 1 < len(events) else None
                if isinstance(following, yaml.SequenceStartEvent):
                    start = following
                break
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if depth == 1:
                expect_key = not expect_key
            depth += 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif depth == 1:
            expect_key = not expect_key
    if start is None or start.anchor is not None:
        return None
    item_starts: list[int] = []
    last_end: int | None = None
    nesting = 0
    for event in events[index + 2 :]:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            if nesting == 0:
                item_starts.append(event.start_mark.index)
            nesting += 1
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            if nesting == 0:
                end_event = event
                break
            nesting -= 1
            if nesting == 0:
                last_end = event.end_mark.index
            continue
        if isinstance(event, yaml.AliasEvent) and nesting == 0:
            return None  # an item read through an alias: the list is not this key's alone
        if nesting == 0:
            item_starts.append(event.start_mark.index)
            last_end = event.end_mark.index
    else:
        return None
    literals = [config_literal(item, json_file=False) for item in items]
    if start.flow_style:
        if last_end is None:
            close = end_event.start_mark.index
            return _edit(text, close, close, ", ".join(literals))
        return _edit(text, last_end, last_end, "".join(f", {item}" for item in literals))
    if last_end is None or not item_starts:
        return None
    first_line = text.rfind("\n", 0, item_starts[0]) + 1
    prefix = text[first_line : item_starts[0]]
    if not prefix.strip(" \t").startswith("-") or prefix.strip(" \t-"):
        return None
    line_end = text.find("\n", last_end)
    if line_end < 0:
        eol = _line_break(text)
        return _edit(text, len(text), len(text), "".join(eol + prefix + item for item in literals))
    eol = "\r\n" if text[line_end - 1 : line_end] == "\r" else "\n"
    at = line_end + 1
    return _edit(text, at, at, "".join(prefix + item + eol for item in literals))


def add_to_block(text: str, path: tuple[str | int, ...], value: Any) -> list[TextEdit] | None:
    """`key: value` added as the last entry of a YAML file's block mapping `parent:` (the
    path `(parent, key)`), on a line of its own at the indent of the entries; None where the
    key is written already, or the mapping is not a block whose last entry sits on one line."""
    from llmmem.extract.yaml_positions import read_positioned_yaml

    if len(path) != 2 or not isinstance(path[1], str):
        return None
    document = read_positioned_yaml(text, is_json=False)
    found, parent = document.lookup(path[:1])
    if document.problems or not found or not isinstance(parent, dict) or not parent:
        return None
    if path[1] in parent:
        return None
    last = (path[0], list(parent)[-1])
    head, key, written = (
        document.key_ranges.get(path[:1]),
        document.key_ranges.get(last),
        document.ranges.get(last),
    )
    if head is None or key is None or written is None or key.path is not None:
        return None
    if not (head.start_line < key.start_line == written.start_line == written.end_line):
        return None  # a flow mapping, or a last entry over several lines
    line_start = _offset(text, key.start_line, 0)
    indent = text[line_start : line_start + key.start_col]
    if indent.strip() or len(indent) <= head.start_col:
        return None
    line_end = text.find("\n", line_start)
    line_end = len(text) if line_end < 0 else line_end
    if line_end > line_start and text[line_end - 1] == "\r":
        line_end -= 1
    entry = f"{path[1]}: {config_literal(value, json_file=False)}"
    return [_edit(text, line_end, line_end, _line_break(text) + indent + entry)]

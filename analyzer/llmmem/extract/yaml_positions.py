"""YAML (and JSON) read into plain Python values, with the file range of every value.

`yaml.safe_load` forgets where a value was written; the editor needs it. This reader runs PyYAML's
composer, which keeps a start and end mark on every node, and builds the values itself:

    read_positioned_yaml("train:\\n  micro_batch_size: 2\\n")
    -> value  {"train": {"micro_batch_size": 2}}
       ranges {(): ..., ("train",): ..., ("train", "micro_batch_size"): line 1, columns 20-21}

A key path is the tuple of mapping keys and sequence indices leading to a value. Each range covers
the value's text (quotes included for a quoted scalar; a block collection ends where its last item
ends), 0-based lines and columns, end exclusive, as `SourceRange` everywhere in llmmem.

Nothing raises. What cannot be read becomes a problem line and the rest is kept:
- a syntax error (a tab used for indentation, an unclosed bracket) keeps the lines before it;
- a duplicate key keeps the last one, as `yaml.safe_load` does, and says so;
- anchors and aliases resolve like `yaml.safe_load`; an alias's range is the anchored text;
  `<<: *base` merges the base's keys under the explicit ones; a document whose aliases expand
  past MAX_ALIAS_NODES nodes (a "billion laughs") is not read, and `refused` says why;
- a tag with no safe meaning (`!include x.yaml`) keeps the scalar's text;
- a second document (`---`) is ignored, with a problem line.
JSON is YAML's flow style, so DeepSpeed JSON files go through the same reader; tabs between JSON
tokens are read as spaces (one character each, so every column stays where it was).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from llmmem.extract.numbers import shown
from llmmem.plan import SourceRange

KeyPath = tuple[str | int, ...]

# Aliases can nest so that a small file expands to an enormous value ("billion laughs"): the walk
# counts the nodes it visits again through an alias (or a `<<` merge), and past this many the
# document is not read at all. Configs that reuse a block or two stay far below it.
MAX_ALIAS_NODES = 10_000

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass(frozen=True)
class PositionedYaml:
    """The values of one YAML document and the range of each, by key path."""

    value: Any
    ranges: dict[KeyPath, SourceRange] = field(default_factory=dict)
    key_ranges: dict[KeyPath, SourceRange] = field(default_factory=dict)  # the key's own text
    problems: tuple[str, ...] = ()
    refused: str | None = None  # why the document was not read at all (its aliases expand)
    # the document does not parse: the parser's message and where it stopped (the part
    # before is read)
    syntax_error: SyntaxErrorAt | None = None

    def lookup(self, path: KeyPath) -> tuple[bool, Any]:
        """(True, value) where the path exists, (False, None) where it does not."""
        current = self.value
        for step in path:
            if isinstance(step, str) and isinstance(current, dict) and step in current:
                current = current[step]
            elif isinstance(step, int) and isinstance(current, list) and 0 <= step < len(current):
                current = current[step]
            else:
                return False, None
        return True, current

    def range_of(self, path: KeyPath) -> SourceRange | None:
        return self.ranges.get(path)


@dataclass(frozen=True)
class SyntaxErrorAt:
    """Where a document stops parsing: the problem line (with its place in words), the
    parser's message with the place after it, and the range of the line's text."""

    problem: str
    message: str
    range: SourceRange


def describe_location(source_path: str | None, line: int, column: int) -> str:
    """'line 3, column 5' for the plan's own file, 'ds_z3.json line 3, column 5' for another;
    `line` and `column` are 0-based and shown 1-based."""
    where = f"line {line + 1}, column {column + 1}"
    return f"{source_path} {where}" if source_path else where


def read_positioned_yaml(
    text: str, source_path: str | None = None, *, is_json: bool = False
) -> PositionedYaml:
    """Read the first YAML document of `text`; ranges carry `source_path` (None: the plan's file).

    Never raises: an unreadable document gives `value=None` (or the part before the error) and
    a problem line.
    """
    if is_json:
        text = text.replace("\t", " ")
    problems: list[str] = []
    errors: list[SyntaxErrorAt] = []
    root = _compose_first_document(text, source_path, problems, errors)
    syntax_error = errors[0] if errors else None
    if root is None:
        return PositionedYaml(value=None, problems=tuple(problems), syntax_error=syntax_error)
    walk = _NodeWalk(source_path)
    try:
        value = walk.build(root, ())
    except RecursionError:
        problems.append(f"{source_path or 'this file'}: nests too deeply to read")
        return PositionedYaml(value=None, problems=tuple(problems))
    except _AliasesExpandTooFar:
        refused = f"the YAML expands its aliases past {MAX_ALIAS_NODES} nodes; not read"
        problems.append(f"{source_path}: {refused}" if source_path else refused)
        return PositionedYaml(value=None, problems=tuple(problems), refused=refused)
    problems.extend(walk.problems)
    return PositionedYaml(
        value=value,
        ranges=walk.ranges,
        key_ranges=walk.key_ranges,
        problems=tuple(problems),
        syntax_error=syntax_error,
    )


def _compose_first_document(
    text: str,
    source_path: str | None,
    problems: list[str],
    errors: list[SyntaxErrorAt] | None = None,
) -> yaml.Node | None:
    """The node tree of the first document; on a syntax error, of the lines before the error
    (the error, with where it is, appended to `errors`)."""
    try:
        return _compose(text, source_path, problems)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line if mark is not None else 0
        column = mark.column if mark is not None else 0
        kept, kept_lines = _parseable_before(text, line, source_path)
        what = _explain_syntax_error(error)
        kept_note = f"; kept the {kept_lines} line(s) above it" if kept.strip() else ""
        problems.append(f"{describe_location(source_path, line, column)}: {what}{kept_note}")
        _note_error(errors, problems[-1], what, kept_note, source_path, text, line, column)
    except yaml.reader.ReaderError as error:
        line, column = _line_and_column(text, error.position)
        kept = _text_before_line(text, line)
        what = f"character {_character_name(error.character)} is not allowed in YAML"
        kept_note = f"; kept the {line} line(s) above it" if kept.strip() else ""
        problems.append(f"{describe_location(source_path, line, column)}: {what}{kept_note}")
        _note_error(errors, problems[-1], what, kept_note, source_path, text, line, column)
    except RecursionError:
        problems.append(f"{source_path or 'this file'}: nests too deeply to read")
        return None
    except (yaml.YAMLError, ValueError) as error:
        problems.append(f"{source_path or 'this file'}: cannot be read as YAML ({error})")
        return None
    if not kept.strip():
        return None
    try:
        return _compose(kept, source_path, [])
    except (yaml.YAMLError, ValueError, RecursionError):
        return None


def _note_error(
    errors: list[SyntaxErrorAt] | None,
    problem: str,
    what: str,
    kept_note: str,
    source_path: str | None,
    text: str,
    line: int,
    column: int,
) -> None:
    """The error for a finding: the parser's words, then where (line and column, 1-based), and
    the range of the line's text (the mark itself where the line is blank)."""
    if errors is None:
        return
    lines = text.split("\n")
    row = lines[line].rstrip("\r") if 0 <= line < len(lines) else ""
    start = len(row) - len(row.lstrip())
    end = len(row)
    if start >= end:
        start, end = max(min(column, len(row)) - 1, 0), min(column, len(row))
    message = f"{what} (line {line + 1}, column {column + 1}){kept_note}"
    located = SourceRange(
        path=source_path, start_line=line, start_col=start, end_line=line, end_col=end
    )
    errors.append(SyntaxErrorAt(problem, message, located))


def _compose(text: str, source_path: str | None, problems: list[str]) -> yaml.Node | None:
    loader = yaml.SafeLoader(text)
    try:
        if not loader.check_node():
            return None
        first = loader.get_node()
        try:
            if loader.check_node():
                problems.append(
                    f"{source_path or 'this file'}: holds several YAML documents (---); "
                    "only the first is read"
                )
        except yaml.YAMLError:
            problems.append(
                f"{source_path or 'this file'}: text after the first YAML document "
                "cannot be read; only the first document is used"
            )
        return first
    finally:
        loader.dispose()


def _explain_syntax_error(error: yaml.MarkedYAMLError) -> str:
    problem = error.problem or "cannot be read as YAML"
    if "'\\t'" in problem:
        return "a tab character where YAML needs spaces (YAML indents with spaces only)"
    if error.context:
        return f"{problem} ({error.context})"
    return problem


def _character_name(character: object) -> str:
    if isinstance(character, int):
        return f"U+{character:04X}"
    return repr(character)


MAX_BACKOFF_LINES = 8  # lines given up above a syntax error to find a prefix that reads


def _parseable_before(text: str, line: int, source_path: str | None) -> tuple[str, int]:
    """The lines above a syntax error, less the last few where they too fail to read (a
    `key:value` with no blank reads as a key only once the next line shows it is one), and
    how many lines that is."""
    for kept_lines in range(line, max(line - MAX_BACKOFF_LINES, 0) - 1, -1):
        kept = _text_before_line(text, kept_lines)
        if not kept.strip():
            break
        try:
            _compose(kept, source_path, [])
        except (yaml.YAMLError, ValueError, RecursionError):
            continue
        return kept, kept_lines
    return _text_before_line(text, line), line


def _text_before_line(text: str, line: int) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(lines[:line])


def _line_and_column(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    line = before.count("\n")
    return line, position - (before.rfind("\n") + 1)


class _AliasesExpandTooFar(Exception):
    """The walk has visited more than MAX_ALIAS_NODES nodes again through aliases."""


class _NodeWalk:
    """Builds plain values from composed nodes, recording ranges and problems on the way."""

    def __init__(self, source_path: str | None) -> None:
        self.source_path = source_path
        self.ranges: dict[KeyPath, SourceRange] = {}
        self.key_ranges: dict[KeyPath, SourceRange] = {}
        self.problems: list[str] = []
        self.visited: set[int] = set()  # ids of the nodes built once already
        self.alias_nodes = 0  # nodes built again, through an alias or a merge
        self.open_collections: set[int] = set()
        self.scalar_constructor = yaml.constructor.SafeConstructor()

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        if id(node) in self.visited:
            self.count_again()
        else:
            self.visited.add(id(node))
        self.ranges[path] = self.node_range(node)
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node)
        if id(node) in self.open_collections:
            self.problem_at(node, "an alias refers to the collection it is in; left empty")
            return None
        self.open_collections.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, (*path, index)) for index, item in enumerate(node.value)]
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
        finally:
            self.open_collections.discard(id(node))
        return None

    def count_again(self) -> None:
        """One more node read again through an alias or a merge; past MAX_ALIAS_NODES the
        document is given up."""
        self.alias_nodes += 1
        if self.alias_nodes > MAX_ALIAS_NODES:
            raise _AliasesExpandTooFar

    def mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        explicit_line: dict[str, int] = {}
        merged: list[yaml.MappingNode] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged.extend(self.merge_sources(value_node))
                continue
            key = self.key_text(key_node)
            if key is None:
                continue
            if key in explicit_line:
                self.problem_at(
                    key_node,
                    f"key '{key}' appears again (first on line {explicit_line[key] + 1}); "
                    "the last one is used",
                )
            explicit_line[key] = key_node.start_mark.line
            self.key_ranges[path + (key,)] = self.node_range(key_node)
            result[key] = self.build(value_node, (*path, key))
        for source in merged:
            for key_node, value_node in source.value:
                self.count_again()
                key = self.key_text(key_node) if key_node.tag != MERGE_TAG else None
                if key is None or key in result:
                    continue
                self.key_ranges[path + (key,)] = self.node_range(key_node)
                result[key] = self.build(value_node, (*path, key))
        return result

    def merge_sources(self, node: yaml.Node) -> list[yaml.MappingNode]:
        if isinstance(node, yaml.MappingNode):
            return [node]
        if isinstance(node, yaml.SequenceNode):
            mappings = [item for item in node.value if isinstance(item, yaml.MappingNode)]
            if len(mappings) == len(node.value):
                return mappings
        self.problem_at(node, "'<<' merges only mappings; ignored")
        return []

    def key_text(self, key_node: yaml.Node) -> str | None:
        if not isinstance(key_node, yaml.ScalarNode):
            self.problem_at(key_node, "a key that is a list or mapping is ignored")
            return None
        value = self.scalar(key_node)
        return key_node.value if value is None else str(value)

    def scalar(self, node: yaml.ScalarNode) -> Any:
        try:
            return self.scalar_constructor.construct_object(node)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError):
            # an unknown tag (`!include x`) or a value its tag cannot hold (`2020-13-45`)
            self.problem_at(node, f"'{shown(node.value)}' kept as text ({node.tag})")
            return node.value

    def node_range(self, node: yaml.Node) -> SourceRange:
        end = self.content_end(node)
        return SourceRange(
            path=self.source_path,
            start_line=node.start_mark.line,
            start_col=node.start_mark.column,
            end_line=end.line,
            end_col=end.column,
        )

    def content_end(self, node: yaml.Node) -> yaml.Mark:
        """A block collection's end mark lies at the next token, often lines later; use the end
        of its last item instead."""
        if (
            not isinstance(node, yaml.CollectionNode)
            or node.flow_style is not False
            or not node.value
        ):
            return node.end_mark
        last = node.value[-1]
        last_node = last[1] if isinstance(last, tuple) else last
        if not isinstance(last_node, yaml.Node) or id(last_node) in self.open_collections:
            return node.end_mark
        if last_node.start_mark.index <= node.start_mark.index:
            return node.end_mark  # an alias to text above: no better end to give
        return self.content_end(last_node)

    def problem_at(self, node: yaml.Node, message: str) -> None:
        where = describe_location(self.source_path, node.start_mark.line, node.start_mark.column)
        self.problems.append(f"{where}: {message}")

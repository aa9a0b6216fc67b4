"""Positions and parsing: a script's text as `ast` nodes, and 0-based LSP ranges for them."""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass, replace

from llmmem.extract.pragmas import split_lines
from llmmem.plan import SourceRange

MAX_SOURCE_CHARS = 1_000_000  # larger files are not parsed (pragmas are still read)


ORIGIN = "llmmem_origin"  # the attribute a node read from another file carries


@dataclass(frozen=True)
class Origin:
    """The file a node was read from (a module the script imports): its positions, and the
    path its ranges name."""

    source: SourceMap
    path: str


def mark_origin(module: ast.Module, origin: Origin) -> None:
    """Every node of `module` remembers the file it was read from."""
    for node in ast.walk(module):
        setattr(node, ORIGIN, origin)


class SourceMap:
    """0-based LSP ranges for ast nodes (ast counts lines from 1 and columns in UTF-8 bytes).
    A node of another file (`mark_origin`) gets a range in that file, naming it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = split_lines(text)

    def _foreign(self, node: ast.AST | None) -> Origin | None:
        origin = getattr(node, ORIGIN, None) if node is not None else None
        return origin if isinstance(origin, Origin) and origin.source is not self else None

    def _column(self, line_index: int, byte_column: int) -> int:
        if line_index >= len(self.lines):
            return byte_column
        line = self.lines[line_index]
        if line.isascii():
            return byte_column
        return len(line.encode("utf-8")[:byte_column].decode("utf-8", errors="ignore"))

    def range_of(self, node: ast.AST | None) -> SourceRange | None:
        if node is None or not hasattr(node, "lineno"):
            return None
        origin = self._foreign(node)
        if origin is not None:
            found = origin.source.range_of(node)
            return replace(found, path=origin.path) if found is not None else None
        start_line = int(node.lineno) - 1
        end_line = int(getattr(node, "end_lineno", None) or node.lineno) - 1
        start_col = self._column(start_line, int(getattr(node, "col_offset", 0)))
        end_col = self._column(end_line, int(getattr(node, "end_col_offset", None) or 0))
        return SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        )

    def text_of(self, node: ast.AST | None, limit: int = 60) -> str:
        origin = self._foreign(node)
        if origin is not None:
            return origin.source.text_of(node, limit)
        found = self.range_of(node)
        if found is None:
            return ""
        if found.start_line == found.end_line:
            text = self.lines[found.start_line][found.start_col : found.end_col]
        else:
            text = self.lines[found.start_line][found.start_col :] + " ..."
        text = " ".join(text.split())
        return text if len(text) <= limit else text[: limit - 3] + "..."


# -- parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedScript:
    """A script as `ast` reads it: the module, or why there is none and where (a syntax error's
    position); `notes` say what was read with a stand-in (syntax newer than this Python)."""

    module: ast.Module | None
    problem: str | None = None
    problem_range: SourceRange | None = None
    notes: tuple[str, ...] = ()
    syntax_message: str | None = None  # a syntax error's own words ("'(' was never closed")


def parse_script(text: str) -> ParsedScript:
    """The module, or None and a line for `problems` saying why it cannot be read. Syntax of
    Python releases newer than the running one is read (`syntax.downlevel`)."""
    if len(text) > MAX_SOURCE_CHARS:
        size = len(text.encode("utf-8", errors="replace")) / 1e6
        return ParsedScript(
            None,
            f"file is {size:.1f} MB; llmmem reads Python files up to "
            f"{MAX_SOURCE_CHARS / 1e6:.0f} MB (only `# llmmem:` comments were read)",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ParsedScript(ast.parse(text))
    except SyntaxError as first_error:
        err = first_error
        message = err.msg or "invalid syntax"
        if "null bytes" in message:
            return ParsedScript(None, "not Python source: the file contains NUL bytes")
        from llmmem.extract.python.syntax import downlevel, newer_syntax_note

        newer = downlevel(text)
        if newer is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    module = ast.parse(newer.text)
                return ParsedScript(module, notes=(newer_syntax_note(newer.constructs),))
            except SyntaxError as real_error:  # at the same place in the original text
                err, message = real_error, real_error.msg or "invalid syntax"
            except (RecursionError, MemoryError, ValueError):
                pass
        line = f"line {err.lineno}" if err.lineno else "an unknown line"
        return ParsedScript(
            None,
            f"syntax error at {line}: {message}",
            syntax_error_range(text, err),
            syntax_message=message,
        )
    except (RecursionError, MemoryError):
        return ParsedScript(None, "the file nests expressions too deeply to read")
    except ValueError as err:  # NUL bytes or lone surrogates
        return ParsedScript(None, f"not Python source: {err}")


def syntax_error_range(text: str, err: SyntaxError) -> SourceRange | None:
    """Where a SyntaxError points, 0-based (its offsets count characters from 1); the rest of
    the line when it names no end."""
    if not err.lineno:
        return None
    lines = split_lines(text)
    line = min(max(err.lineno - 1, 0), max(len(lines) - 1, 0))
    length = len(lines[line]) if lines else 0
    start = min(max((err.offset or 1) - 1, 0), length)
    end_line, end = line, length
    if (
        err.end_lineno
        and err.end_offset
        and (err.end_lineno, err.end_offset)
        > (
            err.lineno,
            err.offset or 0,
        )
    ):
        end_line = min(err.end_lineno - 1, max(len(lines) - 1, 0))
        end = min(max(err.end_offset - 1, 0), len(lines[end_line]))
    if (end_line, end) <= (line, start):  # at the end of a line: cover the character before
        end_line, end = line, start
        start = max(start - 1, 0)
    return SourceRange(start_line=line, start_col=start, end_line=end_line, end_col=end)

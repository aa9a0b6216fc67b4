"""Positions and parsing: a script's text as `ast` nodes, and 0-based LSP ranges for them."""

from __future__ import annotations

import ast
import warnings

from llmmem.extract.pragmas import split_lines
from llmmem.plan import SourceRange

MAX_SOURCE_CHARS = 1_000_000  # larger files are not parsed (pragmas are still read)


class SourceMap:
    """0-based LSP ranges for ast nodes (ast counts lines from 1 and columns in UTF-8 bytes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = split_lines(text)

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
        start_line = int(node.lineno) - 1
        end_line = int(getattr(node, "end_lineno", None) or node.lineno) - 1
        start_col = self._column(start_line, int(getattr(node, "col_offset", 0)))
        end_col = self._column(end_line, int(getattr(node, "end_col_offset", None) or 0))
        return SourceRange(
            start_line=start_line, start_col=start_col, end_line=end_line, end_col=end_col
        )

    def text_of(self, node: ast.AST | None, limit: int = 60) -> str:
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


def parse_script(text: str) -> tuple[ast.Module | None, str | None]:
    """The module, or None and a line for `problems` saying why it cannot be read."""
    if len(text) > MAX_SOURCE_CHARS:
        size = len(text.encode("utf-8", errors="replace")) / 1e6
        return None, (
            f"file is {size:.1f} MB; llmmem reads Python files up to "
            f"{MAX_SOURCE_CHARS / 1e6:.0f} MB (only `# llmmem:` comments were read)"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text), None
    except SyntaxError as err:
        message = err.msg or "invalid syntax"
        if "null bytes" in message:
            return None, "not Python source: the file contains NUL bytes"
        line = f"line {err.lineno}" if err.lineno else "an unknown line"
        return None, f"syntax error at {line}: {message}"
    except (RecursionError, MemoryError):
        return None, "the file nests expressions too deeply to read"
    except ValueError as err:  # NUL bytes or lone surrogates
        return None, f"not Python source: {err}"

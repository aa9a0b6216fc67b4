"""Python syntax newer than the interpreter that runs llmmem: read, not refused.

llmmem reads scripts with `ast`, whose grammar is the running interpreter's. A script written
for a newer Python is valid where it runs, so it must not read as a syntax error under Python
3.11. `downlevel` puts a stand-in of the same lines and columns in place of each newer construct,
so that `ast` reads everything else with its positions unchanged:

- a `type X = ...` statement (3.12), an f-string that only 3.12 parses (its own quotes, a
  backslash or a comment inside a replacement field), a t-string (3.14) and the exception types
  of `except A, B:` (3.14) become `(0` ... `)`: an expression with the same line breaks;
- the type parameters of a `def` or `class` (`[T]`, 3.12; defaults 3.13) become spaces.

The constructs are found by one linear scan of the text (strings as 3.14 reads them, comments,
bracket depth, statement starts), never by a recursive parser, so hostile input costs no more
than ordinary input. When the text still does not parse after the stand-ins, it has a real
syntax error, which `ast` reports at its own place in the rewritten text.
"""

from __future__ import annotations

import ast
import re
import sys
import warnings
from dataclasses import dataclass

NEWEST_SYNTAX = "3.14"  # the newest Python release whose syntax llmmem reads
MAX_FIELD_NESTING = 16  # f-strings inside replacement fields inside f-strings ...
_SPACE = " \t\r\n\\\x0c"  # what may stand between statements

_PREFIXES = {"", "r", "u", "b", "br", "rb", "f", "fr", "rf", "t", "tr", "rt"}
_TYPE_ALIAS = re.compile(r"type[ \t]+[A-Za-z_]\w*[ \t]*[\[=]")
_GENERIC_DEF = re.compile(r"(?:async[ \t]+)?(?:def|class)[ \t]+[A-Za-z_]\w*[ \t]*\[")
_EXCEPT = re.compile(r"except(?:[ \t]*\*)?[ \t]+")


@dataclass(frozen=True)
class Downlevelled:
    """A script's text with newer constructs replaced, and what they were (for a note)."""

    text: str
    constructs: tuple[str, ...]  # "a type alias", "type parameters", ...


def parses(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


class _Unreadable(Exception):
    """The scan met something it does not read (an unterminated string, deep nesting)."""


@dataclass
class _Scan:
    masked: str  # the text with string and comment characters as spaces (line breaks kept)
    strings: list[tuple[int, int, str]]  # start, end, lower-case prefix
    statements: list[tuple[int, int]]  # each simple statement's span (depth-0 boundaries)


def downlevel(text: str) -> Downlevelled | None:
    """`text` with each construct newer than this interpreter replaced (see the module doc), or
    None when there is none. The result may still not parse: then the file has a real syntax
    error, at the same place in both texts."""
    try:
        scan = _scan(text)
    except _Unreadable:
        return None
    replacements: list[tuple[int, int, str]] = []
    kinds: dict[str, None] = {}

    def replace(start: int, end: int, kind: str, blank: bool = False) -> None:
        original = text[start:end]
        if not blank and len(original.replace("\n", "")) < 3:
            return
        replacements.append((start, end, _blanked(original) if blank else _expression(original)))
        kinds[kind] = None

    running = sys.version_info[:2]
    for start, end, prefix in scan.strings:
        if "t" in prefix and running < (3, 14):
            replace(start, end, "a t-string")
        elif "f" in prefix and running < (3, 12) and not parses("(" + text[start:end] + "\n)"):
            replace(start, end, "an f-string")
    masked = scan.masked
    for start, end in scan.statements:
        first = start + len(masked[start:end]) - len(masked[start:end].lstrip(_SPACE))
        if _TYPE_ALIAS.match(masked, first, end):
            replace(first, len(masked[:end].rstrip(_SPACE)), "a type alias")
            continue
        generic = _GENERIC_DEF.match(masked, first, end)
        if generic is not None:
            close = _closing(masked, generic.end() - 1, end)
            if close is not None:
                replace(generic.end() - 1, close + 1, "type parameters", blank=True)
            continue
        handler = _EXCEPT.match(masked, first, end)
        if handler is not None:
            types_end = _types_end(masked, handler.end(), end)
            types = masked[handler.end() : types_end]
            if types_end > handler.end() and _has_top_level_comma(types):
                replace(handler.end(), types_end, "`except` with unparenthesised types")
    if not replacements:
        return None
    pieces: list[str] = []
    cursor = 0
    for start, end, new in sorted(replacements):
        if start < cursor:  # inside a construct already replaced
            continue
        pieces += [text[cursor:start], new]
        cursor = end
    pieces.append(text[cursor:])
    return Downlevelled(text="".join(pieces), constructs=tuple(kinds))


def newer_syntax_note(constructs: tuple[str, ...]) -> str:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"the script uses syntax newer than Python {running}, which runs llmmem "
        f"({', '.join(constructs)}); llmmem read it as Python {NEWEST_SYNTAX} does, the "
        "construct itself left out"
    )


# -- the scan ---------------------------------------------------------------------------------


def _scan(text: str) -> _Scan:
    masked = list(text)
    strings: list[tuple[int, int, str]] = []
    statements: list[tuple[int, int]] = []
    depth = 0
    statement_start = 0
    index, size = 0, len(text)
    while index < size:
        char = text[index]
        if char == "#":
            end = text.find("\n", index)
            end = size if end < 0 else end
            masked[index:end] = " " * (end - index)
            index = end
            continue
        if char in "'\"":
            prefix_length = _prefix_length(text, index)
            start = index - prefix_length
            prefix = text[start:index].lower()
            end = _string_end(text, index, prefix, 0)
            strings.append((start, end, prefix))
            masked[start:end] = [c if c == "\n" else " " for c in text[start:end]]
            index = end
            continue
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char == "\\" and text.startswith("\n", index + 1):
            index += 2
            continue
        elif depth == 0 and char in "\n;":
            statements.append((statement_start, index))
            statement_start = index + 1
        index += 1
    statements.append((statement_start, size))
    return _Scan("".join(masked), strings, statements)


def _prefix_length(text: str, quote: int) -> int:
    for length in (2, 1):
        start = quote - length
        if start < 0 or text[start:quote].lower() not in _PREFIXES:
            continue
        if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):
            return length
    return 0


def _string_end(text: str, quote_index: int, prefix: str, nesting: int) -> int:
    """Where the string whose quote starts at `quote_index` ends (exclusive), as Python 3.14
    reads it: a replacement field of an f- or t-string may hold any expression, strings with
    the same quotes included."""
    if nesting > MAX_FIELD_NESTING:
        raise _Unreadable
    quote = (
        text[quote_index] * 3
        if text.startswith(text[quote_index] * 3, quote_index)
        else text[quote_index]
    )
    formatted = "f" in prefix or "t" in prefix
    index, size = quote_index + len(quote), len(text)
    while index < size:
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if text.startswith(quote, index):
            return index + len(quote)
        if char == "\n" and len(quote) == 1:
            raise _Unreadable
        if formatted and char == "{":
            if text.startswith("{{", index):
                index += 2
                continue
            index = _field_end(text, index + 1, nesting + 1)
            continue
        index += 1
    raise _Unreadable


def _field_end(text: str, index: int, nesting: int) -> int:
    """Where a replacement field that starts at `index` (after its `{`) ends (after its `}`)."""
    if nesting > MAX_FIELD_NESTING:
        raise _Unreadable
    depth, size = 0, len(text)
    while index < size:
        char = text[index]
        if char in "'\"":
            prefix_length = _prefix_length(text, index)
            prefix = text[index - prefix_length : index].lower()
            index = _string_end(text, index, prefix, nesting)
            continue
        if char == "#":
            end = text.find("\n", index)
            index = size if end < 0 else end
            continue
        if char in "([{":
            depth += 1
        elif char in ")]" or (char == "}" and depth > 0):
            depth -= 1
        elif char == "}":
            return index + 1
        elif char == ":" and depth == 0 and not text.startswith(":=", index):
            return _spec_end(text, index + 1, nesting)
        index += 1
    raise _Unreadable


def _spec_end(text: str, index: int, nesting: int) -> int:
    """Where a format spec (after a field's `:`) and its field end (after the `}`)."""
    size = len(text)
    while index < size:
        char = text[index]
        if char == "{":
            index = _field_end(text, index + 1, nesting + 1)
            continue
        if char == "}":
            return index + 1
        if char == "\n":
            raise _Unreadable
        index += 1
    raise _Unreadable


def _closing(masked: str, opening: int, limit: int) -> int | None:
    """The index of the bracket that closes the one at `opening` (strings already masked)."""
    depth = 0
    for index in range(opening, limit):
        char = masked[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _types_end(masked: str, start: int, limit: int) -> int:
    """Where the exception types of an `except` clause end: before ` as ` or the `:`."""
    depth = 0
    for index in range(start, limit):
        char = masked[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and (char == ":" or re.match(r"\sas\s", masked[index : index + 4])):
            return len(masked[start:index].rstrip()) + start
    return start


def _has_top_level_comma(types: str) -> bool:
    depth = 0
    for char in types:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            return True
    return False


def _expression(original: str) -> str:
    """`(0`, then spaces, then `)`, with `original`'s line breaks where they were."""
    chars = [ch if ch == "\n" else " " for ch in original]
    filled = [i for i, ch in enumerate(chars) if ch != "\n"]
    chars[filled[0]], chars[filled[1]], chars[filled[-1]] = "(", "0", ")"
    return "".join(chars)


def _blanked(original: str) -> str:
    """Spaces, with `original`'s line breaks continued by a backslash (they were inside
    brackets, where a line break does not end the statement)."""
    out = [ch if ch == "\n" else " " for ch in original]
    for index, ch in enumerate(out):
        if ch == "\n" and index > 0 and out[index - 1] == " ":
            out[index - 1] = "\\"
    return "".join(out)

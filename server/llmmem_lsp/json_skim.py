"""What can be told of a JSON text without parsing it: how deep it nests, where its first value
ends, and the `id` member of the object it opens with.

The framing (`framing.FrameReader`) reads these from a message body before, or instead of,
parsing it: a body nested deeper than the parser can follow is refused unparsed, a body whose
Content-Length was wrong is cut where its value ends (what follows is the next message), and a
refusal names the request's id wherever the body shows one at its top level, broken or not.

Only the structure is followed (brackets and strings, escapes included); the text between them
is not checked. A JSON text never holds a line break outside its strings' escapes, nor inside
a string, so a `Content-Length:` header line found in one means that it was not one JSON text.
"""

from __future__ import annotations

import json
import re

_OPENERS = b"{["
# outside strings: a run of openers, a run of closers, or a string's opening quote
_STRUCTURE = re.compile(rb"[{\[]++|[}\]]++|\"")
# inside a string (after its opening quote): everything up to its closing quote
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)
# the tokens of a text, for the `id` of its top-level object
_TOKEN = re.compile(
    rb'(?P<string>"(?:[^"\\]++|\\.)*+")|(?P<open>[{\[])|(?P<close>[}\]])'
    rb'|(?P<colon>:)|(?P<comma>,)|(?P<scalar>[^\s{}\[\]:,"]++)|(?P<cut>")',
    re.DOTALL,
)
ID_SCAN_BYTES = 1 << 20  # a request's id is looked for in its first MiB


class Skimmer:
    """Follows a JSON text fed in pieces: its nesting depth, the deepest it went, and the end of
    its first value (an object, an array or a string)."""

    def __init__(self) -> None:
        self.depth = 0
        self.deepest = 0
        self.in_string = False
        self.escaped = False  # a backslash ended the last piece, inside a string

    def feed(self, data: bytes | bytearray, start: int = 0, stop: int | None = None) -> int | None:
        """Reads `data[start:stop]`; returns the offset in `data` just past the end of the
        first value, or None while it has not ended."""
        position, size = start, len(data) if stop is None else stop
        while position < size:
            if self.escaped:
                self.escaped = False
                position += 1
                continue
            if self.in_string:
                rest = _STRING_REST.match(data, position, size)
                position = rest.end() if rest is not None else position
                if position >= size:
                    return None
                if data[position] == 0x5C:  # a backslash, the last byte: its escape is next
                    self.escaped = True
                    position += 1
                    continue
                self.in_string = False  # the closing quote
                position += 1
                if self.depth == 0:
                    return position
                continue
            found = _STRUCTURE.search(data, position, size)
            if found is None:
                return None
            run = found.group()
            position = found.end()
            if run == b'"':
                self.in_string = True
            elif run[0] in _OPENERS:
                self.depth += len(run)
                self.deepest = max(self.deepest, self.depth)
            elif self.depth > 0:  # closers (before any opener: text that is no JSON, skipped)
                if len(run) >= self.depth:
                    end = found.start() + self.depth
                    self.depth = 0
                    return end
                self.depth -= len(run)
        return None


def value_end(data: bytes | bytearray) -> tuple[int | None, int]:
    """Where the first value of `data` ends (None: it does not end in `data`) and how deep it
    nests."""
    skimmer = Skimmer()
    end = skimmer.feed(data)
    return end, skimmer.deepest


def top_level_id(data: bytes | bytearray) -> int | str | None:
    """The `id` member of the object `data` opens with, where it is an integer or a string
    (what JSON-RPC allows), found in the text's first `ID_SCAN_BYTES` even where the text is
    cut or broken further on; None where there is none."""
    text = bytes(data[:ID_SCAN_BYTES])
    start = len(text) - len(text.lstrip())
    if text[start : start + 1] != b"{":
        return None
    depth, expecting, key = 1, "key", None
    for token in _TOKEN.finditer(text, start + 1):
        kind = token.lastgroup
        if kind == "cut":
            return None
        if kind == "open":
            depth += 1
            continue
        if kind == "close":
            depth -= 1
            if depth == 0:
                return None
            if depth == 1:
                expecting = "comma"
            continue
        if depth > 1:
            continue
        if kind == "comma":
            expecting, key = "key", None
        elif expecting == "key" and kind == "string":
            key, expecting = token.group(), "colon"
        elif expecting == "colon" and kind == "colon":
            expecting = "value"
        elif expecting == "value":
            if key == b'"id"':
                return _as_id(token.group())
            expecting = "comma"
    return None


def _as_id(raw: bytes) -> int | str | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return None

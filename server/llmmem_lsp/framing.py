"""Splitting the bytes a client sends into messages, so that no frame can wedge the reader.

LSP frames each JSON-RPC message as header lines (`Content-Length: N`, maybe `Content-Type`), a
blank line and N bytes of JSON. Clients get this wrong in many ways: a length off by a byte, a
header in lower case, lines ended by `\\n` alone, no length at all, a body that is no JSON. A
reader that trusts the length reads past the body into the next frame's header (or waits for
bytes that never come) and from then on reads every header glued to a body: it never answers
again. This reader:

- takes header names in any case and lines ended by `\\r\\n` or `\\n`;
- checks that a body is exactly one JSON value (`json_skim`): where the length was too long,
  what follows the value is read again as the next frame; where it was too short, the rest of
  the body is text before the next header, skipped up to the `Content-Length` that starts it;
- delimits a body that comes with no usable length (none, not a number, more than
  `MAX_MESSAGE_BYTES`) by where its JSON value ends, or where the next header starts;
- refuses a body nested deeper than `MAX_DEPTH` levels before it is parsed.

Each refusal is a `Refusal`: the id of the request where one can be read from the body
(`json_skim.top_level_id`), the JSON-RPC error code (ParseError where the frame or its JSON
cannot be read, InvalidRequest where it is refused for its size or depth) and the reason. The
reader does no I/O: `feed` takes the bytes as they come, `stalled` is called when none have come
for a while although a body is awaited (a length too long on the last frame a client sent).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from llmmem_lsp.json_skim import ID_SCAN_BYTES, Skimmer, top_level_id, value_end

log = logging.getLogger("llmmem_lsp")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 128  # far deeper than any LSP message; the parser's recursion stays well clear
MAX_HEADER_LINE_BYTES = 8 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

_HEADER = re.compile(rb"[ \t]*([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*(.*?)[ \t]*")
# where a frame starts: a Content-Length header line, in any case, found anywhere
_FRAME_START = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
_HEADER_NAME_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_LENGTH = re.compile(rb"\d{1,12}")
_OVERLAP = 64  # bytes kept between pieces while looking for a frame's start


@dataclass(frozen=True)
class Body:
    """A message body that is one JSON value, within the size and depth limits."""

    data: bytes


@dataclass(frozen=True)
class Refusal:
    """A frame that is refused: answered with `code` where it is a request (its id known)."""

    ident: int | str | None
    code: int
    reason: str


Event = Body | Refusal


@dataclass
class _Skim:
    """A body delimited by its JSON value (no usable Content-Length): what is kept of it."""

    code: int
    reason: str
    limit: int  # bytes read at most
    skimmer: Skimmer
    head: bytearray  # its first bytes, for the id
    seen: int = 0  # bytes of it taken from the buffer
    fed: int = 0  # bytes of the buffer the skimmer has read


class FrameReader:
    def __init__(self) -> None:
        self._buffer = bytearray()
        self._lengths: list[bytes] = []  # the Content-Length values of the header block so far
        self._in_headers = False  # a header line was read and the blank line has not come
        self._length: int | None = None  # reading a body of this many bytes
        self._skim: _Skim | None = None

    @property
    def awaiting_body(self) -> bool:
        """Whether bytes of a body whose length was declared are awaited."""
        return self._length is not None

    def feed(self, data: bytes) -> list[Event]:
        self._buffer += data
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def stalled(self) -> list[Event]:
        """No byte came for a while, a declared body still short. Where what came holds a
        whole JSON value, the length was too long: the value is refused (its client waits for
        the answer, and no more bytes will come) and what follows it is read as headers."""
        if self._length is None or value_end(self._buffer)[0] is None:
            return []
        declared, self._length = self._length, None
        came = bytes(self._buffer)
        self._buffer.clear()
        event = self._checked(came)
        if isinstance(event, Body):
            reason = f"Content-Length {declared} is more than the {len(came)} bytes that came"
            event = Refusal(top_level_id(came), PARSE_ERROR, reason)
        events: list[Event] = [event]
        while self._step(events):
            pass
        return events

    # -- one step over the buffer ---------------------------------------------------------

    def _step(self, events: list[Event]) -> bool:
        """Reads what can be read; False when more bytes are needed."""
        if self._skim is not None:
            return self._skim_step(events)
        if self._length is not None:
            return self._body_step(events)
        return self._header_step(events)

    def _header_step(self, events: list[Event]) -> bool:
        buffer = self._buffer
        if not buffer:
            return False
        first = len(buffer) - len(buffer.lstrip(b" \t"))
        if first < len(buffer) and buffer[first] in b"{[":
            # JSON where a header line should start: a body that came without its header
            why = "no blank line after its headers" if self._in_headers else "no header"
            self._start_skim(PARSE_ERROR, f"a message with {why}", MAX_MESSAGE_BYTES)
            return True
        newline = buffer.find(b"\n")
        if newline < 0:
            if len(buffer) > MAX_HEADER_LINE_BYTES:
                self._drop_junk(len(buffer) - _OVERLAP)
            return False
        line = bytes(buffer[:newline]).rstrip(b"\r")
        del buffer[: newline + 1]
        if not line.strip():
            if self._in_headers:
                self._end_headers()
            return True  # a blank line between frames: nothing
        header = _HEADER.fullmatch(line)
        if header is not None:
            self._in_headers = True
            if header.group(1).lower() == b"content-length":
                self._lengths.append(header.group(2))
            return True
        start = _HEADER_NAME_START.search(line)
        if start is not None:  # text glued before a header (the tail of a body cut short)
            log.info("skipped %d bytes before a Content-Length header", start.start())
            buffer[:0] = line[start.start() :] + b"\n"
            return True
        log.info("skipped a line that is no header: %.80r", line)
        return True

    def _end_headers(self) -> None:
        lengths, self._lengths, self._in_headers = self._lengths, [], False
        values = set(lengths)
        if not values:
            self._start_skim(PARSE_ERROR, "a message with no Content-Length header", None)
            return
        written = lengths[0].decode("ascii", errors="replace")
        if len(values) > 1 or not _LENGTH.fullmatch(lengths[0]):
            reason = f"Content-Length {written!r} is not one number of bytes"
            self._start_skim(PARSE_ERROR, reason, None)
            return
        length = int(lengths[0])
        if length > MAX_MESSAGE_BYTES:
            reason = (
                f"a message of {length} bytes, more than the limit of "
                f"{MAX_MESSAGE_BYTES // (1024 * 1024)} MiB"
            )
            self._start_skim(INVALID_REQUEST, reason, length)
            return
        self._length = length

    def _body_step(self, events: list[Event]) -> bool:
        length = self._length
        assert length is not None
        if len(self._buffer) < length:
            return False
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        self._length = None
        events.append(self._checked(body))
        return True

    def _checked(self, body: bytes) -> Event:
        """The body if it is one JSON value within the depth limit, else its refusal; what
        follows its value (the length was too long) goes back to be read as headers."""
        end, deepest = value_end(body)
        if end is not None and not body[end:].strip():
            if deepest > MAX_DEPTH:
                reason = f"the message nests deeper than {MAX_DEPTH} levels"
                return Refusal(top_level_id(body), INVALID_REQUEST, reason)
            return Body(body)
        restart = _FRAME_START.search(body)
        if end is None and restart is None and body.lstrip()[:1] not in (b"{", b"[", b'"'):
            return Body(body)  # a number, a word, bytes: the parser says what is wrong
        cut = len(body) if end is None else end
        if restart is not None and restart.start() < cut:
            cut = restart.start()
        self._buffer[:0] = body[cut:]
        if end is None:
            reason = "the message ends inside its JSON (its Content-Length is too short?)"
        else:
            extra = len(body) - end
            follow = "byte follows" if extra == 1 else "bytes follow"
            reason = f"{extra} {follow} the message's JSON (its Content-Length is too long?)"
        return Refusal(top_level_id(body[:cut]), PARSE_ERROR, reason)

    # -- a body delimited by its JSON value -----------------------------------------------

    def _start_skim(self, code: int, reason: str, declared: int | None) -> None:
        self._lengths, self._in_headers = [], False
        limit = MAX_MESSAGE_BYTES if declared is None else declared
        self._skim = _Skim(code, reason, limit, Skimmer(), bytearray())

    def _skim_step(self, events: list[Event]) -> bool:
        """Reads a body up to the end of its JSON value, the next frame's Content-Length
        header or its limit, whichever comes first; only its first bytes are kept."""
        skim = self._skim
        assert skim is not None
        buffer = self._buffer
        window = min(len(buffer), skim.limit - skim.seen)
        restart = _FRAME_START.search(buffer, 0, window)
        stop = restart.start() if restart is not None else window
        end = skim.skimmer.feed(buffer, min(skim.fed, stop), stop)
        if end is not None:
            stop = end
        elif restart is None and skim.seen + window < skim.limit:
            # not finished: keep the last bytes, a header may be cut between two pieces
            skim.fed = window
            taken = max(0, window - _OVERLAP)
            self._take(skim, taken)
            return False
        self._take(skim, stop)
        self._skim = None
        events.append(Refusal(top_level_id(skim.head), skim.code, skim.reason))
        return True

    def _take(self, skim: _Skim, count: int) -> None:
        room = ID_SCAN_BYTES - len(skim.head)
        if room > 0:
            skim.head += self._buffer[: min(room, count)]
        skim.seen += count
        skim.fed -= count
        del self._buffer[:count]

    def _drop_junk(self, count: int) -> None:
        """A long run of bytes with no line end in the headers: dropped up to the next
        Content-Length header, or all but the last few bytes."""
        start = _HEADER_NAME_START.search(self._buffer)
        count = start.start() if start is not None and start.start() > 0 else count
        log.info("skipped %d bytes that are no header", count)
        del self._buffer[:count]

"""The server's connection, over stdio (the default) or TCP, read through `framing.FrameReader`.

pygls reads a connection with `pygls.io_.run_async`: a header line counts only when it is
exactly `Content-Length: N\\r\\n`, and N bytes are read as the body whatever they are, so after
one wrong frame every later header is read glued to a body and nothing is answered again. Here
the bytes are read as they come and split by the frame reader, which cannot be wedged; each
message goes to the protocol in order, and a refused frame is answered with its error (with its
request's id where the body shows one). stdin is read in a thread of its own, a piece at a time,
so the event loop never blocks on it and never loses what was read.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, BinaryIO

from pygls.io_ import StdoutWriter

from llmmem_lsp.framing import PARSE_ERROR, Body, Event, FrameReader
from llmmem_lsp.json_skim import top_level_id

if TYPE_CHECKING:
    from pygls.server import JsonRPCServer

    from llmmem_lsp.protocol import LlmmemProtocol

log = logging.getLogger("llmmem_lsp")

CHUNK_BYTES = 64 * 1024
STALL_S = 1.0  # a declared body that stops short this long, as one whole JSON value, is cut
INTERNAL_ERROR = -32603

NextChunk = Callable[[], Awaitable[bytes]]


async def read_messages(next_chunk: NextChunk, protocol: LlmmemProtocol) -> None:
    """Reads pieces from `next_chunk` (b"" at the end of the input) and delivers their
    messages until the input ends."""
    frames = FrameReader()
    while True:
        if frames.awaiting_body:
            try:
                chunk = await asyncio.wait_for(next_chunk(), STALL_S)
            except asyncio.TimeoutError:
                for event in frames.stalled():
                    deliver(protocol, event)
                continue
        else:
            chunk = await next_chunk()
        if not chunk:
            return
        for event in frames.feed(chunk):
            deliver(protocol, event)


def deliver(protocol: LlmmemProtocol, event: Event) -> None:
    """One message to the protocol; a refused frame or a body that is no JSON answered."""
    if not isinstance(event, Body):
        protocol.refuse_frame(event.ident, event.code, event.reason)
        return
    try:
        message = json.loads(event.data, object_hook=protocol.structure_message)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        protocol.refuse_frame(
            top_level_id(event.data), PARSE_ERROR, f"the message is not JSON: {err}"
        )
        return
    except Exception as err:
        log.exception("reading a message failed")
        protocol.refuse_frame(top_level_id(event.data), INTERNAL_ERROR, f"unreadable: {err}")
        return
    try:
        protocol.handle_message(message)
    except BrokenPipeError:
        raise
    except Exception:
        log.exception("handling a message failed")


def _pipe_reader(stream: BinaryIO) -> NextChunk:
    """Pieces of `stream` read by a daemon thread (the file descriptor itself where there is
    one: no buffer lock is held by a thread still blocked in a read when the server exits),
    at most a few pieces ahead of the event loop."""
    loop = asyncio.get_running_loop()
    pieces: asyncio.Queue[bytes] = asyncio.Queue(maxsize=4)
    try:
        descriptor: int | None = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        descriptor = None
    read_piece = getattr(stream, "read1", stream.read)

    def pump() -> None:
        while True:
            try:
                if descriptor is not None:
                    piece = os.read(descriptor, CHUNK_BYTES)
                else:
                    piece = read_piece(CHUNK_BYTES)
            except OSError:
                piece = b""
            try:
                asyncio.run_coroutine_threadsafe(pieces.put(piece), loop).result()
            except BaseException:  # the loop is closed or closing: the server exits
                return
            if not piece:
                return

    threading.Thread(target=pump, name="llmmem-stdin", daemon=True).start()
    return pieces.get


async def _serve_pipe(stream: BinaryIO, protocol: LlmmemProtocol) -> None:
    await read_messages(_pipe_reader(stream), protocol)


def serve_stdio(
    server: JsonRPCServer, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None
) -> None:
    """Serves one client over stdin/stdout until the input ends or `exit` comes."""
    protocol: LlmmemProtocol = server.protocol  # type: ignore[assignment]
    protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    try:
        asyncio.run(_serve_pipe(stdin or sys.stdin.buffer, protocol))
    except BrokenPipeError:
        log.error("the connection to the editor is lost: the server exits")
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()


def serve_tcp(server: JsonRPCServer, host: str, port: int) -> None:
    """Listens on host:port and serves the first client that connects until it leaves or
    `exit` comes."""
    protocol: LlmmemProtocol = server.protocol  # type: ignore[assignment]

    async def listen() -> None:
        finished = asyncio.Event()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            protocol.set_writer(writer)  # type: ignore[arg-type]
            try:
                await read_messages(partial(reader.read, CHUNK_BYTES), protocol)
            finally:
                finished.set()

        listening = await asyncio.start_server(connected, host, port)
        log.info("listening on %s:%d", host, port)
        async with listening:
            await finished.wait()

    try:
        asyncio.run(listen())
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()

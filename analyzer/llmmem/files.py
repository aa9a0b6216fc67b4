"""Reading a file that a user's file names: regular files only, with a size cap, never blocking.

A path read from a script, a config or pyproject.toml (a `model_config=` pragma, a DeepSpeed
config, a local model directory, the files a launcher names) may point at anything: a FIFO no one
writes to (`open` waits forever), `/dev/zero` (`read` never ends), a directory, a file of many
gigabytes. `read_file_bytes` and `open_regular_file` refuse these with `UnreadableFile`, an
OSError whose text is one line saying why, so callers that already turn an OSError into a problem
line or a finding need no new branch.

The type is checked before the file is opened (a device is never opened) and again on what was
opened (a path swapped in between is caught); the open itself is non-blocking, so a FIFO put in
place between the two checks cannot hang it either.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO opens at once instead of waiting for a writer
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)  # Windows
)


class UnreadableFile(OSError):
    """A path that is not a regular file of an acceptable size; `str()` is the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(errno.EINVAL, reason, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO), not a file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a file"
    if stat.S_ISSOCK(mode):
        return "a socket, not a file"
    return "not a regular file"


def _check(info: os.stat_result, path: Path | str, max_bytes: int | None) -> None:
    kind = _kind(info.st_mode)
    if kind is not None:
        raise UnreadableFile(path, kind)
    if max_bytes is not None and info.st_size > max_bytes:
        raise UnreadableFile(path, f"larger than {_size(max_bytes)}, not read")


def _size(count: int) -> str:
    if count >= 1024 * 1024 and count % (1024 * 1024) == 0:
        return f"{count // (1024 * 1024)} MiB"
    if count >= 1_000_000 and count % 1_000_000 == 0:
        return f"{count // 1_000_000} MB"
    return f"{count} bytes"


def open_regular_file(path: Path | str, max_bytes: int | None) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file of at most `max_bytes` (None:
    any size, for a caller that reads only a bounded part); raises UnreadableFile (or the
    OSError of a missing or forbidden file) otherwise."""
    _check(os.stat(path), path, max_bytes)
    descriptor = os.open(path, _OPEN_FLAGS)
    try:
        _check(os.fstat(descriptor), path, max_bytes)
        if hasattr(os, "set_blocking"):
            os.set_blocking(descriptor, True)  # a regular file: reads are ordinary again
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def read_file_bytes(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (also when it grows while read);
    raises UnreadableFile (or the OSError of a missing or forbidden file) otherwise."""
    with open_regular_file(path, max_bytes) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnreadableFile(path, f"larger than {_size(max_bytes)}, not read")
    return data


def why_not_a_file(path: Path | str) -> str:
    """Why a path named on the command line cannot be read as a file, in words."""
    try:
        info = os.stat(path)
    except OSError:
        return "no such file"
    return _kind(info.st_mode) or "not a regular file"

"""Writing a file the user named on the command line: regular files only, never blocking.

What `llmmem.files` is for the paths llmmem reads, this is for the ones it writes (`verify
--output`; `--snapshot`, which torch writes in the step's process, is checked the same way
first). Opening a FIFO for writing waits until some process opens it for reading, which may be
never; a device or a directory is no place for a report either. The path is checked before the
work that produces the file starts (`why_not_writable`), and opened at the end without blocking
and checked again on what was opened (`open_output_file`), so that a FIFO put in place meanwhile
cannot hang the command: it is refused with an OSError whose text is one line.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

from llmmem.files import UnreadableFile, why_not_a_file

_OPEN_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO without a reader fails at once (ENXIO), never waits
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)  # Windows
)


def why_not_writable(path: Path | str) -> str | None:
    """Why a report cannot be written to `path`, in words; None when it can be tried (an
    existing regular file, or a new name in an existing directory)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        parent = Path(path).parent
        try:
            if not stat.S_ISDIR(os.stat(parent).st_mode):
                return f"{parent} is not a directory"
        except OSError:
            return f"the directory {parent} does not exist"
        return None if os.access(parent, os.W_OK) else f"the directory {parent} is not writable"
    except OSError as err:
        return f"cannot be written there ({(err.strerror or str(err)).lower()})"
    if stat.S_ISDIR(info.st_mode):
        return "a directory, not a file; give a file name such as report.json"
    if not stat.S_ISREG(info.st_mode):
        return why_not_a_file(path)
    return None if os.access(path, os.W_OK) else "a file that is not writable"


def open_output_file(path: Path | str) -> BinaryIO:
    """`path` opened for binary writing, emptied, when it is (or becomes) a regular file;
    raises UnreadableFile for anything else, without waiting on it."""
    why = why_not_writable(path)
    if why:
        raise UnreadableFile(path, why)
    try:
        descriptor = os.open(path, _OPEN_FLAGS, 0o666)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a FIFO no one reads, put there after the check
            raise UnreadableFile(path, why_not_a_file(path)) from None
        raise
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(path, why_not_a_file(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(descriptor, True)  # a regular file: writes are ordinary again
        os.ftruncate(descriptor, 0)
        return os.fdopen(descriptor, "wb")
    except BaseException:
        os.close(descriptor)
        raise


def write_output_text(path: Path | str, text: str) -> None:
    """Write `text` (UTF-8) to the regular file `path`; raises OSError with one line of text."""
    with open_output_file(path) as handle:
        handle.write(text.encode("utf-8"))

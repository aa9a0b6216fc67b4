"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_USAGE = 2  # bad input: a usage error, an unreadable file, a file that could not be written


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (the full usage is one `--help` away) and long
    options spelled out: `--grad-acc` is an error, not `--grad-accum` (an abbreviation that
    means one option today can mean another when an option is added)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def non_empty(text: str) -> str:
    """An option's value that must name something: `--gpu ""` (a shell variable left unset) is a
    usage error, not the option left out."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty (is the variable that sets it unset?)")
    return text


def run_entry_point(prog: str, run: Callable[[], int]) -> int:
    """Run a command so that a fault of its environment ends it with one line and exit 2, never
    a traceback (exit 1 would read as findings in CI): an output encoding that cannot show a
    character (cp1252, ascii: the character is written as an escape instead), a full disk or a
    closed pipe on stdout, a file name too long for the file system, a folder that cannot be
    read. A UsageError is printed the same way; Ctrl-C exits 130."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    try:
        code = run()
        sys.stdout.flush()
        return code
    except UsageError as err:
        return _fail(prog, str(err))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader stopped reading (`| head`): nothing more to say
        _silence_stdout()
        return EXIT_USAGE
    except OSError as err:
        _silence_stdout()
        what = err.strerror or type(err).__name__
        if err.filename:
            return _fail(prog, f"{os.fsdecode(err.filename)[:120]}: {what}")
        return _fail(prog, f"cannot go on: {what}")
    except (RecursionError, MemoryError) as err:
        return _fail(prog, f"the input is too large or nests too deeply ({type(err).__name__})")


def _fail(prog: str, message: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.stderr.flush()
    return EXIT_USAGE


def _silence_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's own flush at exit does not
    fail a second time with a traceback of its own."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)

"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations

import argparse
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

"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations

import argparse
from typing import NoReturn

EXIT_USAGE = 2  # bad input: a usage error, an unreadable file, a file that could not be written


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (the full usage is one `--help` away)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

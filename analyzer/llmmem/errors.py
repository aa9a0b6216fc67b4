"""Errors that end a command with a one-line message instead of a traceback."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""

"""Whole numbers as a user writes them: bounded, ASCII digits only, never a crash.

A batch size, a sequence length, an accumulation count, a world size or a LoRA rank is a count
from 1 to MAX_COUNT (10**9: a billion tokens in one sequence or a billion sequences in one
micro-batch is past any GPU). DeepSpeed's bucket sizes and thresholds count elements and may be
up to MAX_ELEMENTS (10**15). A value past its bound is refused with a message that says so
(`NumberOutOfRange`), never replaced silently: an integer that large would overflow the float
arithmetic of the estimate, and Python refuses to convert decimal strings past 4300 digits.

Text is read as ASCII digits only: `str.isdigit` also accepts superscripts (`²`) that `int()`
then rejects, and `int()` accepts other scripts' digits and underscores.
"""

from __future__ import annotations

MAX_COUNT = 10**9
MAX_ELEMENTS = 10**15


class NumberOutOfRange(ValueError):
    """A whole number past its bound; the message says what was written and the bound."""


def shown(text: str, limit: int = 24) -> str:
    """A value as a message quotes it: a 400-digit number is cut, with its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def is_ascii_digits(text: str) -> bool:
    return bool(text) and text.isascii() and text.isdigit()


def check_bound(value: int, bound: int = MAX_COUNT) -> int:
    """`value` when it is at most `bound`; NumberOutOfRange otherwise."""
    if value > bound:
        bits = value.bit_length()
        # str() of an int past 4300 digits raises: say how long it is instead
        if bits < 13_000:
            text = str(value)
            written = text if len(text) <= 24 else f"{text[:24]}… ({len(text)} digits)"
        else:
            written = f"a {int(bits * 0.30103) + 1}-digit number"
        raise NumberOutOfRange(f"{written} is larger than {bound:,}, the largest llmmem reads")
    return value


def parse_count(text: str, bound: int = MAX_COUNT) -> int:
    """A whole number from 1 to `bound` written in ASCII digits. Raises ValueError (not a whole
    number, or 0) or NumberOutOfRange (past the bound), each with a one-line message."""
    text = text.strip()
    if not is_ascii_digits(text):
        raise ValueError(f"expected a whole number, got '{shown(text)}'")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(bound)):  # decided before int(): no 4300-digit limit to reach
        raise NumberOutOfRange(f"{shown(text)} is larger than {bound:,}, the largest llmmem reads")
    value = int(digits)
    if value <= 0:
        raise ValueError(f"must be at least 1, got {text}")
    return check_bound(value, bound)

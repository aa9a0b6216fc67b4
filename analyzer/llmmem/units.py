"""Byte quantities as people read them: GiB as nvidia-smi and torch report them (2**30)."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def format_bytes(n: float) -> str:
    """`31.2 GiB`, `412 MiB`, `96 KiB`, `12 B`: three significant figures, binary units."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
            return f"{sign}{text} {unit}"
    return f"{sign}{int(n)} B"


def format_count(n: float) -> str:
    """`8.03e9` style counts for formulas: short and exact enough to recompute by hand."""
    if abs(n) < 10_000:
        return f"{n:g}"
    return f"{n:.3g}".replace("e+0", "e").replace("e+", "e")

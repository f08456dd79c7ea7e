"""How numbers are written in labels, tables and target descriptions."""

from __future__ import annotations


def pow2(value: int) -> str:
    """2^k for powers of two of at least 1024, the plain number otherwise."""
    if value >= 1024 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


def ms(value: float | None) -> str:
    """Milliseconds to 3 significant digits (whole ones from 100 up); ``-`` for None."""
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def percent(value: float | None) -> str:
    """A fraction as a whole percentage; ``-`` for None."""
    return "-" if value is None else f"{100 * value:.0f}%"


def share(value: float | None) -> str:
    """A share of a time, measured as a difference of two timings: below zero it is
    within their noise (a layer timed faster than its own matmuls), and says so."""
    if value is not None and value < 0:
        return "<0% (noise)"
    return percent(value)


def speedup(value: float | None) -> str:
    """A ratio of times as ``12.3x``; ``-`` for None."""
    return "-" if value is None else f"{value:.1f}x"

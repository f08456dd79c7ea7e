"""Continued-fraction math: plain functions, no nn.Module.

``continued_fraction`` and ``univariate_ladder`` are the public ops; ``reference`` holds
float64 references the fast paths are tested against. See docs/ops.md.
"""

from cofrgenet.ops.api import (
    AUTO_COMPILE_MIN_UNITS,
    GRAD_MODES,
    IMPLS,
    continued_fraction,
    denominator_stats,
    ladder_denominator_stats,
    resolve_impl,
    univariate_ladder,
)

__all__ = [
    "AUTO_COMPILE_MIN_UNITS",
    "GRAD_MODES",
    "IMPLS",
    "continued_fraction",
    "denominator_stats",
    "ladder_denominator_stats",
    "resolve_impl",
    "univariate_ladder",
]

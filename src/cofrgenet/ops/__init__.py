"""Continued-fraction math: plain functions, no nn.Module.

``continued_fraction``, ``univariate_ladder``, ``pvariate_ladder`` and ``ladder_ensemble``
are the public ops; ``reference`` holds float64 references the fast paths are tested
against, ``triton`` the fused GPU kernels and ``custom_ops`` their ``torch.library``
registration. See docs/ops.md.
"""

from cofrgenet.ops.api import (
    AUTO_COMPILE_MIN_UNITS,
    GRAD_MODES,
    IMPLS,
    NEAR_POLE,
    LadderStats,
    check_ladder_options,
    continued_fraction,
    denominator_stats,
    ladder_denominator_stats,
    ladder_ensemble,
    mix_ensemble,
    positive_denominators,
    pvariate_denominator_stats,
    pvariate_ladder,
    resolve_impl,
    triton_available,
    univariate_ladder,
)

__all__ = [
    "AUTO_COMPILE_MIN_UNITS",
    "GRAD_MODES",
    "IMPLS",
    "NEAR_POLE",
    "LadderStats",
    "check_ladder_options",
    "continued_fraction",
    "denominator_stats",
    "ladder_denominator_stats",
    "ladder_ensemble",
    "mix_ensemble",
    "positive_denominators",
    "pvariate_denominator_stats",
    "pvariate_ladder",
    "resolve_impl",
    "triton_available",
    "univariate_ladder",
]

"""Continued-fraction math: plain functions, no nn.Module.

``continued_fraction``, ``univariate_ladder``, ``pvariate_ladder`` and ``ladder_ensemble``
are the public ops; ``reference`` holds float64 references the fast paths are tested
against, ``triton`` the fused GPU kernels and ``custom_ops`` their ``torch.library``
registration. See docs/ops.md. Names are imported lazily (as in :mod:`cofrgenet.models`):
``cofrgenet.ops.reference`` alone does not import the fast paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cofrgenet.lazy import lazy_exports

_EXPORTS = {
    "AUTO_COMPILE_MIN_UNITS": "api",
    "GRAD_MODES": "api",
    "IMPLS": "api",
    "NEAR_POLE": "api",
    "LadderStats": "api",
    "check_ladder_options": "api",
    "continued_fraction": "api",
    "denominator_stats": "api",
    "ladder_denominator_stats": "api",
    "ladder_ensemble": "api",
    "mix_ensemble": "api",
    "positive_denominators": "api",
    "pvariate_denominator_stats": "api",
    "pvariate_ladder": "api",
    "resolve_impl": "api",
    "triton_available": "api",
    "univariate_ladder": "api",
}

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

if TYPE_CHECKING:
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


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())

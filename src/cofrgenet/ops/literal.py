"""The literal nested form: d divisions and plain autograd (the paper's "CoFrGeNetB").

This is the slow baseline the continuant implementation is measured against. Unlike the
continuant form, which clamps only the final continuant K_d, it clamps every one of its
d denominators (as CoFrNets did): y_d = a_d, y_k = a_k + 1 / clamp(y_{k+1}),
f~ = 1 / clamp(y_1). Away from poles of every level the two forms agree to rounding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cofrgenet.ops.reference import clamp_denominator


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (fp32, bf16, fp16) is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _nested(coefficient, d: int, eps: float) -> Tensor:
    y = coefficient(d - 1)
    for k in range(d - 2, -1, -1):
        y = coefficient(k) + 1.0 / clamp_denominator(y, eps)
    return 1.0 / clamp_denominator(y, eps)


def literal_continued_fraction(a: Tensor, eps: float) -> Tensor:
    """a: (..., d) -> (...), nested form with per-level clamping."""
    work = a.to(compute_dtype(a.dtype))
    return _nested(lambda k: work[..., k], a.shape[-1], eps).to(a.dtype)


def literal_univariate_ladder(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, floor: float = 0.0
) -> Tensor:
    """x: (..., n), weight/bias: (d, n) -> (..., n), nested form with per-level clamping.

    floor > 0: a_k = floor + softplus(x w_k + b_k) instead of x w_k + b_k.
    """
    dtype = compute_dtype(x.dtype)
    xw, w = x.to(dtype), weight.to(dtype)
    b = None if bias is None else bias.to(dtype)

    def coefficient(k: int) -> Tensor:
        u = xw * w[k] if b is None else xw * w[k] + b[k]
        return u if floor <= 0 else torch.nn.functional.softplus(u) + floor

    return _nested(coefficient, weight.shape[0], eps).to(x.dtype)

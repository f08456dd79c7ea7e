"""Plain float64 references for the continued-fraction ops.

These are written for clarity, not speed: tests hold every fast path against them.
Nothing here rescales, so keep |a| and d moderate (the tests do).

Conventions (see docs/ops.md): ``a[..., 0]`` is a_1, the outermost partial denominator;
``d = a.shape[-1]`` counts partial denominators.
"""

from __future__ import annotations

import torch
from torch import Tensor


def clamp_denominator(k: Tensor, eps: float) -> Tensor:
    """sign(k) * max(|k|, eps) with sign(0) = +1, differentiable (zero slope when clamped)."""
    return torch.where(k >= 0, k.clamp_min(eps), k.clamp_max(-eps))


def suffix_continuants(a: Tensor) -> list[Tensor]:
    """Continuants of the tails of ``a``: element j is K_j(a_{d-j+1}, ..., a_d), j = 0..d.

    a: (..., d) -> list of d + 1 tensors of shape (...). K_0 = 1, K_1 = a_d.
    """
    d = a.shape[-1]
    ks = [torch.ones_like(a[..., 0]), a[..., d - 1]]
    for j in range(2, d + 1):
        ks.append(a[..., d - j] * ks[-1] + ks[-2])
    return ks


def prefix_continuants(a: Tensor) -> list[Tensor]:
    """Continuants of the heads of ``a``: element j is K_j(a_1, ..., a_j), j = 0..d."""
    return suffix_continuants(a.flip(-1))


def reference_continued_fraction(a: Tensor, eps: float = 0.01) -> Tensor:
    """f~(a) = K_{d-1}(a_2..a_d) / clamp(K_d(a_1..a_d)) in float64 with plain autograd.

    a: (..., d) -> (...). Autograd through this function gives the *exact* gradient of
    the clamped function (grad="exact").
    """
    a = a.double()
    ks = suffix_continuants(a)
    return ks[-2] / clamp_denominator(ks[-1], eps)


def reference_paper_grad(a: Tensor, eps: float = 0.01) -> Tensor:
    """Proposition 1 with the clamped K_d (grad="paper"), in float64.

    a: (..., d) -> (..., d), entry k-1 holds (-1)^k (K_{d-k}(a_{k+1}..a_d) / clamp(K_d))^2.
    """
    a = a.double().detach()
    d = a.shape[-1]
    ks = suffix_continuants(a)
    denom = clamp_denominator(ks[-1], eps)
    grads = [(-1) ** k * (ks[d - k] / denom) ** 2 for k in range(1, d + 1)]
    return torch.stack(grads, dim=-1)


def reference_exact_grad(a: Tensor, eps: float = 0.01) -> Tensor:
    """Closed form of the exact gradient of the clamped function, in float64.

    Unclamped: Proposition 1. Clamped (|K_d| < eps): 0 for a_1 and
    K(a_2..a_{k-1}) K(a_{k+1}..a_d) / clamp(K_d) for k >= 2.
    """
    a = a.double().detach()
    d = a.shape[-1]
    suffix = suffix_continuants(a)
    prefix_from_2 = prefix_continuants(a[..., 1:]) if d > 1 else [torch.ones_like(a[..., 0])]
    denom = clamp_denominator(suffix[-1], eps)
    clamped = suffix[-1].abs() < eps
    grads = [torch.zeros_like(denom)]
    for k in range(2, d + 1):
        grads.append(prefix_from_2[k - 2] * suffix[d - k] / denom)
    exact_clamped = torch.stack(grads, dim=-1)
    return torch.where(clamped.unsqueeze(-1), exact_clamped, reference_paper_grad(a, eps))


def ladder_denominators(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Partial denominators of univariate ladders: a[..., i, k] = weight[k, i] x_i + bias[k, i].

    x: (..., n), weight: (d, n), bias: (d, n) or None -> (..., n, d).
    """
    a = x.unsqueeze(-1) * weight.transpose(0, 1)
    if bias is not None:
        a = a + bias.transpose(0, 1)
    return a


def reference_positive_denominators(u: Tensor, floor: float) -> Tensor:
    """floor + log(1 + exp(u)), written out in float64."""
    u = u.double()
    return floor + torch.log1p(torch.exp(-u.abs())) + u.clamp_min(0)


def reference_univariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    floor: float | None = None,
) -> Tensor:
    """Elementwise continued fraction of univariate ladders, float64, plain autograd.

    x: (..., n), weight: (d, n), bias: (d, n) or None -> (..., n). With ``floor``, the
    partial denominators are floor + softplus(x w_k + b_k).
    """
    b = None if bias is None else bias.double()
    a = ladder_denominators(x.double(), weight.double(), b)
    if floor is not None:
        a = reference_positive_denominators(a, floor)
    return reference_continued_fraction(a, eps)


def reference_pvariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    floor: float | None = None,
) -> Tensor:
    """p-variate ladders in float64 with plain autograd: a[..., j, k] = W[k, j] . x + b[k, j].

    x: (..., p), weight: (d, L, p), bias: (d, L) or None -> (..., L). With ``floor``, the
    partial denominators are floor + softplus of that.
    """
    a = torch.einsum("...p,klp->...lk", x.double(), weight.double())
    if bias is not None:
        a = a + bias.double().t()
    if floor is not None:
        a = reference_positive_denominators(a, floor)
    return reference_continued_fraction(a, eps)

"""Triton building blocks of the continuant recurrence, shared by every kernel.

The math is the one of ``cofrgenet.ops.continuant`` (see docs/ops.md): tail continuants
K_0 = 1, K_1 = a_d, K_j = a_{d-j+1} K_{j-1} + K_{j-2}; f~ = K_{d-1} / clamp(K_d); the
gradient of a_k is (-1)^k (K_{d-k} r)^2 with r = 1 / clamp(K_d) ("paper"), or, where the
clamp is active, 0 for a_1 and K(a_2..a_{k-1}) K(a_{k+1}..a_d) r ("exact").

Coefficients a_k come from one of two places (``FROM_X``, a constexpr), whose pointers
and values a kernel gathers once per tile in a :class:`Source` (built by
:func:`memory_source` or :func:`ladder_source`) that every helper below takes:

* memory: ``a_ptrs + k * stride_ak``, a tile of pointers to a[..., 0];
* a univariate ladder: a_k = x * w_k (+ b_k), with ``w_ptrs`` / ``b_ptrs`` a [1, BN] tile
  of pointers to weight[0, cols] / bias[0, cols] and ``stride_wk`` the depth stride; with
  ``FLOOR`` > 0 (a constexpr; 0 is the paper's linear form) a_k = FLOOR + softplus(that).

The constexprs (``FROM_X``, ``HAS_BIAS``, ``FLOOR``, the compute dtype ``COMPUTE``)
travel beside the source, not in it: Triton's compiler (3.7) does not keep a tuple's
constexpr fields constant, so an ``if`` on one would compile both branches.

Rescaling: when |K_j| passes 2^64, both running values are multiplied by 2^-64 (exact)
and a per-element counter ``scale`` goes up by one; the true K_j is stored * 2^(64 scale).
Kernels first run without it (one FMA per step) and redo a tile with it only if that
tile's K_d came out non-finite: scaling by powers of two changes no bits otherwise.
"""

from __future__ import annotations

from typing import NamedTuple

import triton
import triton.language as tl

#: |K| above which the recurrence is rescaled, and the factor it is rescaled by.
RESCALE_AT = tl.constexpr(18446744073709551616.0)  # 2^64
RESCALE_BY = tl.constexpr(5.421010862427522e-20)  # 2^-64
RESCALE_EXPONENT = tl.constexpr(64.0)
INF = tl.constexpr(float("inf"))


class Source(NamedTuple):
    """Where the partial denominators of a tile come from (see the module docstring).

    The fields of the kind not in use hold placeholders (never read: ``FROM_X`` picks
    the branch at compile time).
    """

    a_ptrs: tl.tensor
    stride_ak: tl.tensor
    mask: tl.tensor
    x: tl.tensor
    w_ptrs: tl.tensor
    b_ptrs: tl.tensor
    stride_wk: tl.tensor
    w_mask: tl.tensor


@triton.jit
def memory_source(a_ptrs, stride_ak, mask):
    """a_k at ``a_ptrs + (k - 1) * stride_ak`` (masked lanes read 1); FROM_X False."""
    return Source(a_ptrs, stride_ak, mask, a_ptrs, a_ptrs, a_ptrs, stride_ak, mask)


@triton.jit
def ladder_source(x, w_ptrs, b_ptrs, stride_wk, w_mask, mask):
    """a_k = x w_k (+ b_k), or FLOOR + softplus(that), for a tile of x; FROM_X True."""
    return Source(w_ptrs, stride_wk, mask, x, w_ptrs, b_ptrs, stride_wk, w_mask)


@triton.jit
def softplus(u):
    """log(1 + exp(u)) without overflow: max(u, 0) + log(1 + exp(-|u|))."""
    return tl.maximum(u, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(u)))


@triton.jit
def preactivation(k, src, HAS_BIAS: tl.constexpr, COMPUTE: tl.constexpr):
    """u_{k+1} = x w_{k+1} (+ b_{k+1}) of a univariate ladder (0-based k), [BM, BN]."""
    w = tl.load(src.w_ptrs + k * src.stride_wk, mask=src.w_mask, other=0.0).to(COMPUTE)
    u = src.x * w
    if HAS_BIAS:
        u += tl.load(src.b_ptrs + k * src.stride_wk, mask=src.w_mask, other=0.0).to(COMPUTE)
    return u


@triton.jit
def coefficient(
    k,
    src,
    FROM_X: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    COMPUTE: tl.constexpr,
):
    """a_{k+1} (0-based k) as a tile in the compute dtype.

    From x: u = x w_k (+ b_k), and a = u (FLOOR 0, the paper's) or FLOOR + softplus(u).
    """
    if FROM_X:
        a = preactivation(k, src, HAS_BIAS, COMPUTE)
        if FLOOR > 0:
            a = FLOOR + softplus(a)
    else:
        # Masked lanes read 1: finite, so they never trigger the rescaled path.
        a = tl.load(src.a_ptrs + k * src.stride_ak, mask=src.mask, other=1.0).to(COMPUTE)
    return a


@triton.jit
def rescale(high, low, scale):
    """Divide both running values by 2^64 where |high| > 2^64; count it in ``scale``."""
    big = tl.abs(high) > RESCALE_AT
    high = tl.where(big, high * RESCALE_BY, high)
    low = tl.where(big, low * RESCALE_BY, low)
    return high, low, scale + big.to(scale.dtype)


@triton.jit
def tail_continuants(
    src,
    D: tl.constexpr,
    FROM_X: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    COMPUTE: tl.constexpr,
    RESCALE: tl.constexpr,
):
    """(K_d, K_{d-1}, scale of both) by the tail recurrence, a_d first."""
    high = coefficient(D - 1, src, FROM_X, HAS_BIAS, FLOOR, COMPUTE)
    low = tl.full(high.shape, 1.0, COMPUTE)
    scale = tl.zeros(high.shape, COMPUTE)
    for i in tl.static_range(D - 1):
        a = coefficient(D - 2 - i, src, FROM_X, HAS_BIAS, FLOOR, COMPUTE)
        high, low = a * high + low, high
        if RESCALE:
            high, low, scale = rescale(high, low, scale)
    return high, low, scale


@triton.jit
def forward_continuants(
    src,
    D: tl.constexpr,
    FROM_X: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    COMPUTE: tl.constexpr,
    FORCE_RESCALE: tl.constexpr,
):
    """(K_d, K_{d-1}, scale, rescaled): unscaled first, rescaled if the tile overflowed.

    ``rescaled`` is a scalar (0 or 1) shared by the whole tile: the backward pass of the
    tile must then rescale too.
    """
    high, low, scale = tail_continuants(
        src, D, FROM_X, HAS_BIAS, FLOOR, COMPUTE, RESCALE=FORCE_RESCALE
    )
    if FORCE_RESCALE:
        rescaled = tl.max(tl.full(high.shape, 1, tl.int32))
    else:
        # Not finite (inf or NaN) somewhere in the tile: redo it with rescaling.
        rescaled = tl.max(tl.where(tl.abs(high) < INF, 0, 1))
        if rescaled > 0:
            high, low, scale = tail_continuants(
                src, D, FROM_X, HAS_BIAS, FLOOR, COMPUTE, RESCALE=True
            )
    return high, low, scale, rescaled


@triton.jit
def clamp_reciprocal(high, scale, EPS: tl.constexpr, RESCALE: tl.constexpr):
    """(r, clamped): r = 1 / clamp(K_d) in K_d's scaled domain; the clamp sees the true K_d.

    clamp(K) = sign(K) max(|K|, EPS) with sign(0) = +1. EPS is a constexpr (a Python
    float), rounded once to K_d's dtype: exactly eps in float64, float32(eps) in float32,
    as the torch implementations clamp. (A runtime float argument would reach compiled
    kernels as fp32 whatever the compute dtype, while the interpreter keeps it float64.)
    """
    if RESCALE:
        threshold = tl.exp2(scale * -RESCALE_EXPONENT) * EPS
    else:
        threshold = tl.full(high.shape, EPS, high.dtype)
    clamped = tl.abs(high) < threshold
    denominator = tl.where(clamped, tl.where(high >= 0, threshold, -threshold), high)
    return 1.0 / denominator, clamped


@triton.jit
def coefficient_gradient(
    k: tl.constexpr,
    suffix,
    suffix_scale,
    r,
    scale_d,
    clamped,
    src,
    D: tl.constexpr,
    FROM_X: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    COMPUTE: tl.constexpr,
    EXACT: tl.constexpr,
    RESCALE: tl.constexpr,
):
    """d f~ / d a_k (1-based k) from suffix = K_{d-k}(a_{k+1}..a_d) and r.

    "paper": (-1)^k (suffix r)^2. "exact", where clamped: 0 for k = 1, else
    K(a_2..a_{k-1}) suffix r, the prefix continuant rebuilt here (O(d) per k, O(d^2) in
    all: d is small and the kernels are memory-bound).
    """
    ratio = suffix * r
    if RESCALE:
        ratio = ratio * tl.exp2((suffix_scale - scale_d) * RESCALE_EXPONENT)
    g = ratio * ratio
    if k % 2 == 1:
        g = -g
    if EXACT:
        if k == 1:
            g = tl.where(clamped, 0.0, g)
        else:
            # prefix = K(a_2..a_{k-1}): P_0 = 1, P_m = a_{m+1} P_{m-1} + P_{m-2}.
            prefix = tl.full(r.shape, 1.0, COMPUTE)
            before = tl.zeros(r.shape, COMPUTE)
            prefix_scale = tl.zeros(r.shape, COMPUTE)
            for m in tl.static_range(1, k - 1):
                a = coefficient(m, src, FROM_X, HAS_BIAS, FLOOR, COMPUTE)
                prefix, before = a * prefix + before, prefix
                if RESCALE:
                    prefix, before, prefix_scale = rescale(prefix, before, prefix_scale)
            exact = prefix * suffix * r
            if RESCALE:
                exact = exact * tl.exp2((prefix_scale + suffix_scale - scale_d) * RESCALE_EXPONENT)
            g = tl.where(clamped, exact, g)
    return g


@triton.jit
def suffix_step(
    k: tl.constexpr,
    suffix,
    previous,
    suffix_scale,
    src,
    FROM_X: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    COMPUTE: tl.constexpr,
    RESCALE: tl.constexpr,
):
    """K_{d-k+1}(a_k..a_d) from K_{d-k} (suffix) and K_{d-k-1} (previous), 1-based k."""
    a = coefficient(k - 1, src, FROM_X, HAS_BIAS, FLOOR, COMPUTE)
    suffix, previous = a * suffix + previous, suffix
    if RESCALE:
        suffix, previous, suffix_scale = rescale(suffix, previous, suffix_scale)
    return suffix, previous, suffix_scale

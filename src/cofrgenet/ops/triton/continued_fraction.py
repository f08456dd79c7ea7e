"""Fused Triton kernels of ``continued_fraction``: a (..., d) -> f~ (...), and its gradient.

Tiling: a 1-D grid over ladder units (the leading dims of a, flattened), BLOCK units per
program; d is a compile-time constant and the recurrence is unrolled. a is read in its
own layout: the leading dims are collapsed into at most two groups (i1, i2) with their
own strides, so the depth-major (d outermost) tensors the layers build need no copy; the
gradient is written in a's layout too. Forward: one pass over a (d loads per unit), one
store. Backward: saves nothing from the forward, it reruns the tail recurrence to get
K_d and r, then the suffix recurrence emits the d gradients (d loads again, cached).

The clamp threshold ``EPS`` is a constexpr, not a runtime float: compiled Triton passes a
Python float argument as fp32 (the interpreter keeps it float64), which would clamp
float64 inputs at fp32(eps). A constexpr enters the kernel in its compute dtype (eps
itself in float64, fp32(eps) in float32, as torch clamps); each distinct eps compiles its
own kernels, which a fixed model hyperparameter does once.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from cofrgenet.ops.triton import runtime
from cofrgenet.ops.triton.recurrence import (
    clamp_reciprocal,
    coefficient_gradient,
    forward_continuants,
    memory_source,
    suffix_step,
)


@triton.jit
def continued_fraction_fwd_kernel(
    a_ptr,
    out_ptr,
    units,
    inner,
    stride_a1,
    stride_a2,
    stride_ad,
    EPS: tl.constexpr,
    D: tl.constexpr,
    COMPUTE: tl.constexpr,
    FORCE_RESCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out[u] = f~(a[u, :]) for u in one block; unit u = (u // inner, u % inner)."""
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # [B]
    mask = offs < units
    a_ptrs = a_ptr + (offs // inner) * stride_a1 + (offs % inner) * stride_a2  # [B], a_1
    src = memory_source(a_ptrs, stride_ad, mask)
    high, low, scale, rescaled = forward_continuants(
        src, D, False, False, 0.0, COMPUTE, FORCE_RESCALE
    )
    if rescaled > 0:
        r, _ = clamp_reciprocal(high, scale, EPS, RESCALE=True)
    else:
        r, _ = clamp_reciprocal(high, scale, EPS, RESCALE=False)
    tl.store(out_ptr + offs, (low * r).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cf_gradients(
    src,
    g_ptrs,
    stride_gd,
    grad_out,
    r,
    scale_d,
    clamped,
    D: tl.constexpr,
    COMPUTE: tl.constexpr,
    EXACT: tl.constexpr,
    RESCALE: tl.constexpr,
):
    """Store grad_out * d f~ / d a_k for k = d..1 (suffix continuants built on the way)."""
    suffix = tl.full(r.shape, 1.0, COMPUTE)  # K_0 of the empty tail
    previous = tl.zeros(r.shape, COMPUTE)
    suffix_scale = tl.zeros(r.shape, COMPUTE)
    for k in tl.static_range(D, 0, -1):  # k = d..1
        g = coefficient_gradient(
            k,
            suffix,
            suffix_scale,
            r,
            scale_d,
            clamped,
            src,
            D,
            False,
            False,
            0.0,
            COMPUTE,
            EXACT,
            RESCALE,
        )
        g_ptrs_k = g_ptrs + (k - 1) * stride_gd
        tl.store(g_ptrs_k, (g * grad_out).to(g_ptrs.dtype.element_ty), mask=src.mask)
        if k > 1:
            suffix, previous, suffix_scale = suffix_step(
                k, suffix, previous, suffix_scale, src, False, False, 0.0, COMPUTE, RESCALE
            )


@triton.jit
def continued_fraction_bwd_kernel(
    a_ptr,
    grad_out_ptr,
    grad_a_ptr,
    units,
    inner,
    stride_a1,
    stride_a2,
    stride_ad,
    stride_go,
    stride_g1,
    stride_g2,
    stride_gd,
    EPS: tl.constexpr,
    D: tl.constexpr,
    COMPUTE: tl.constexpr,
    EXACT: tl.constexpr,
    FORCE_RESCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """grad_a[u, k] = grad_out[u] * d f~(a[u]) / d a_k, recomputing the forward."""
    offs = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)  # [B]
    mask = offs < units
    i1, i2 = offs // inner, offs % inner
    a_ptrs = a_ptr + i1 * stride_a1 + i2 * stride_a2  # [B]
    g_ptrs = grad_a_ptr + i1 * stride_g1 + i2 * stride_g2  # [B]
    grad_out = tl.load(grad_out_ptr + offs * stride_go, mask=mask, other=0.0).to(COMPUTE)
    src = memory_source(a_ptrs, stride_ad, mask)
    high, _, scale_d, rescaled = forward_continuants(
        src, D, False, False, 0.0, COMPUTE, FORCE_RESCALE
    )
    if rescaled > 0:
        r, clamped = clamp_reciprocal(high, scale=scale_d, EPS=EPS, RESCALE=True)
        _cf_gradients(src, g_ptrs, stride_gd, grad_out, r, scale_d, clamped, D, COMPUTE, EXACT, RESCALE=True)  # fmt: skip
    else:
        r, clamped = clamp_reciprocal(high, scale=scale_d, EPS=EPS, RESCALE=False)
        _cf_gradients(src, g_ptrs, stride_gd, grad_out, r, scale_d, clamped, D, COMPUTE, EXACT, RESCALE=False)  # fmt: skip


# ----------------------------------------------------------------------------- launchers


def unit_groups(t: Tensor) -> tuple[list[int], list[int]] | None:
    """Collapse the leading dims of t (..., d) into at most two (size, stride) groups.

    Returns ([outer, inner] sizes, [outer, inner] strides, in t's strides) or None if the
    leading dims do not collapse into two groups. Each group's stride is that of its
    innermost dim, so the same grouping applies to any tensor whose leading dims merge
    where t's do (t's own layout, or a contiguous one).
    """
    groups: list[list[int]] = []  # [size, stride, last dim]
    for dim in range(t.dim() - 1):
        size, stride = t.shape[dim], t.stride(dim)
        if size == 1:
            continue
        if groups and groups[-1][1] == stride * size:
            groups[-1][0] *= size
            groups[-1][1] = stride
        else:
            groups.append([size, stride])
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, [1, 0])
    return [g[0] for g in groups], [g[1] for g in groups]


def _group_strides(t: Tensor, sizes_like: Tensor) -> list[int]:
    """Strides of t's leading dims for the grouping of ``sizes_like`` (same shape)."""
    groups: list[int] = []
    last_stride = None
    for dim in range(sizes_like.dim() - 1):
        size, stride = sizes_like.shape[dim], sizes_like.stride(dim)
        if size == 1:
            continue
        if last_stride is not None and last_stride == stride * size:
            groups[-1] = t.stride(dim)
        else:
            groups.append(t.stride(dim))
        last_stride = stride
    while len(groups) < 2:
        groups.insert(0, 0)
    return groups


def continued_fraction_fwd(a: Tensor, eps: float, force_rescale: bool = False) -> Tensor:
    """f~(a) for a (..., d) of any layout -> (...) contiguous, in a's dtype."""
    runtime.check_tensor(a)
    if unit_groups(a) is None:
        a = a.contiguous()
    (outer, inner), (s1, s2) = unit_groups(a)
    units, d = outer * inner, a.shape[-1]
    out = runtime.new_output(a.shape[:-1], a.dtype, a.device)
    if units == 0:
        return out
    block, warps = runtime.block_1d()
    continued_fraction_fwd_kernel[(triton.cdiv(units, block),)](
        a,
        out,
        units,
        inner,
        s1,
        s2,
        a.stride(-1),
        EPS=float(eps),
        D=d,
        COMPUTE=runtime.compute_dtype(a.dtype),
        FORCE_RESCALE=force_rescale,
        BLOCK=block,
        num_warps=warps,
    )
    return out


def continued_fraction_bwd(
    a: Tensor, grad_out: Tensor, eps: float, exact: bool, force_rescale: bool = False
) -> Tensor:
    """d loss / d a for a (..., d) and grad_out (...): shaped like a, in a's layout and dtype.

    The layout is that of ``torch.empty_like(a)`` (a's strides when a is dense, else
    contiguous, or channels-last for a 4-d a that suggests it), which the op's fake
    implementation reproduces.
    """
    runtime.check_tensor(a)
    grad_a = runtime.new_output_like(a)
    source = a if unit_groups(a) is not None else a.contiguous()
    # The kernel writes the gradient with source's grouping of the leading dims, which
    # holds for source's own strides and for contiguous ones. empty_like keeps the
    # strides of a dense a that does not group (a permuted 4-d tensor, say) and may
    # pick channels-last for a gapped one: the kernel then writes a contiguous buffer.
    same = grad_a.stride() == source.stride() or grad_a.is_contiguous()
    target = grad_a if same else runtime.new_output(a.shape, a.dtype, a.device)
    (outer, inner), (s1, s2) = unit_groups(source)
    g1, g2 = _group_strides(target, source)
    units, d = outer * inner, a.shape[-1]
    if units == 0:
        return grad_a
    grad_flat = grad_out.reshape(-1)  # unit order = row-major order of the leading dims
    block, warps = runtime.block_1d()
    continued_fraction_bwd_kernel[(triton.cdiv(units, block),)](
        source,
        grad_flat,
        target,
        units,
        inner,
        s1,
        s2,
        source.stride(-1),
        grad_flat.stride(0),
        g1,
        g2,
        target.stride(-1),
        EPS=float(eps),
        D=d,
        COMPUTE=runtime.compute_dtype(a.dtype),
        EXACT=exact,
        FORCE_RESCALE=force_rescale,
        BLOCK=block,
        num_warps=warps,
    )
    if target is not grad_a:
        grad_a.copy_(target)
    return grad_a

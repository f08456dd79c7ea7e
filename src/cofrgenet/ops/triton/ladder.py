"""Fused Triton kernels of univariate ladder ensembles, forward and backward.

One kernel pair serves both ops:

* ``univariate_ladder``: x (M, n), weight/bias (d, n) -> f~(x w_1 + b_1, ..., x w_d + b_d),
  elementwise (L = 1, no mixing);
* the elementwise Cffn ensemble: x (M, p), weight/bias (d, L, p), mix V (p, L) ->
  sum_j V[:, j] * f~(x W[:, j] + b[:, j]), without materialising (M, p, L, d).

Tiling: 2-D tiles of BLOCK_M rows x BLOCK_N columns of x (columns = ladders, contiguous
in memory). A program loads its x tile once, the [1, BLOCK_N] weight rows per depth and
ladder as needed, and unrolls the d-step recurrence (d and L are compile-time constants).
Forward: read x, write the output; nothing is saved for backward besides the inputs.
Backward: recomputes the tail recurrence for K_d and r (and f~ for the gradient of V),
then the suffix recurrence emits d f~ / d a_k for k = d..1; each feeds grad_x (a sum
over ladders and depths, kept in registers) and the parameter gradients. Those are sums
over rows: the grid is (column blocks, SPLIT); each program walks every SPLIT-th row
block, keeps running [P, BLOCK_N] sums (P = rows of (depth, ladder) pairs, padded to a
power of two) and writes them once to a (SPLIT, P, n) buffer that torch sums over SPLIT
(deterministic, no atomics).

``EPS`` and ``FLOOR`` are constexprs, rounded once to the compute dtype (a runtime float
argument would be fp32 in compiled kernels, even in float64 ones): each distinct value
compiles its own kernels, once for the fixed hyperparameters of a model (see
:mod:`.continued_fraction`).
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
    ladder_source,
    preactivation,
    suffix_step,
)


@triton.jit
def ladder_ensemble_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    v_ptr,
    out_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_wk,
    stride_wj,
    stride_vn,
    stride_vj,
    EPS: tl.constexpr,
    D: tl.constexpr,
    L: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    HAS_MIX: tl.constexpr,
    COMPUTE: tl.constexpr,
    FORCE_RESCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """out[m, i] = sum_j V[i, j] f~_j(x[m, i]) (or f~(x[m, i]) without mixing, L = 1)."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BM]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_mask = (cols < N)[None, :]  # [1, BN]
    mask = (rows < M)[:, None] & col_mask  # [BM, BN]
    x = tl.load(
        x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0
    ).to(COMPUTE)  # [BM, BN]
    out = tl.zeros([BLOCK_M, BLOCK_N], COMPUTE)
    for j in tl.static_range(L):
        w_ptrs = w_ptr + j * stride_wj + cols[None, :]  # [1, BN], depth 0
        b_ptrs = b_ptr + j * stride_wj + cols[None, :]
        src = ladder_source(x, w_ptrs, b_ptrs, stride_wk, col_mask, mask)
        high, low, scale, rescaled = forward_continuants(
            src, D, True, HAS_BIAS, FLOOR, COMPUTE, FORCE_RESCALE
        )
        if rescaled > 0:
            r, _ = clamp_reciprocal(high, scale, EPS, RESCALE=True)
        else:
            r, _ = clamp_reciprocal(high, scale, EPS, RESCALE=False)
        if HAS_MIX:
            v = tl.load(v_ptr + cols * stride_vn + j * stride_vj, mask=cols < N, other=0.0)
            out += v.to(COMPUTE)[None, :] * (low * r)
        else:
            out += low * r
    out_ptrs = out_ptr + rows[:, None] * N + cols[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _ladder_gradients(
    j: tl.constexpr,
    src,
    upstream,
    grad_x,
    acc_w,
    acc_b,
    acc_rows,
    r,
    scale_d,
    clamped,
    D: tl.constexpr,
    L: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    NEED_X: tl.constexpr,
    NEED_PARAMS: tl.constexpr,
    EXACT: tl.constexpr,
    COMPUTE: tl.constexpr,
    RESCALE: tl.constexpr,
):
    """Add ladder j's share to grad_x and to the running parameter sums (k = d..1)."""
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
            True,
            HAS_BIAS,
            FLOOR,
            COMPUTE,
            EXACT,
            RESCALE,
        )
        t = g * upstream  # d loss / d a_k, [BM, BN]
        if FLOOR > 0:  # a_k = FLOOR + softplus(u_k): d a_k / d u_k = sigmoid(u_k)
            t = t * tl.sigmoid(preactivation(k - 1, src, HAS_BIAS, COMPUTE))
        if NEED_X:
            w_k = src.w_ptrs + (k - 1) * src.stride_wk
            grad_x += t * tl.load(w_k, mask=src.w_mask, other=0.0).to(COMPUTE)
        if NEED_PARAMS:
            row = acc_rows == (k - 1) * L + j  # [P, 1], weight[k-1, j] lives in row (k-1) L + j
            acc_w += tl.where(row, tl.sum(t * src.x, axis=0)[None, :], 0.0)
            if HAS_BIAS:
                acc_b += tl.where(row, tl.sum(t, axis=0)[None, :], 0.0)
        if k > 1:
            suffix, previous, suffix_scale = suffix_step(
                k, suffix, previous, suffix_scale, src, True, HAS_BIAS, FLOOR, COMPUTE, RESCALE
            )
    return grad_x, acc_w, acc_b


@triton.jit
def ladder_ensemble_bwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    v_ptr,
    grad_out_ptr,
    grad_x_ptr,
    part_w_ptr,
    part_b_ptr,
    part_v_ptr,
    M,
    N,
    stride_xm,
    stride_xn,
    stride_gm,
    stride_gn,
    stride_wk,
    stride_wj,
    stride_vn,
    stride_vj,
    row_blocks,
    split,
    EPS: tl.constexpr,
    D: tl.constexpr,
    L: tl.constexpr,
    P: tl.constexpr,
    LP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    FLOOR: tl.constexpr,
    HAS_MIX: tl.constexpr,
    NEED_X: tl.constexpr,
    NEED_PARAMS: tl.constexpr,
    EXACT: tl.constexpr,
    COMPUTE: tl.constexpr,
    FORCE_RESCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """grad_x (M, N) and per-program partial sums of the weight, bias and mix gradients.

    Grid (column blocks, split): program (n, s) takes row blocks s, s + split, ...
    """
    pid_n, pid_s = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    col_mask = (cols < N)[None, :]  # [1, BN]
    acc_rows = tl.arange(0, P)[:, None]  # [P, 1]
    acc_w = tl.zeros([P, BLOCK_N], COMPUTE)  # sum over rows of d loss / d weight
    acc_b = tl.zeros([P, BLOCK_N], COMPUTE)
    mix_rows = tl.arange(0, LP)[:, None]  # [LP, 1]
    acc_v = tl.zeros([LP, BLOCK_N], COMPUTE)
    for block in range(pid_s, row_blocks, split):
        rows = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # [BM]
        mask = (rows < M)[:, None] & col_mask  # [BM, BN]
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0
        ).to(COMPUTE)
        grad_out = tl.load(
            grad_out_ptr + rows[:, None] * stride_gm + cols[None, :] * stride_gn,
            mask=mask,
            other=0.0,
        ).to(COMPUTE)
        grad_x = tl.zeros([BLOCK_M, BLOCK_N], COMPUTE)
        for j in tl.static_range(L):
            w_ptrs = w_ptr + j * stride_wj + cols[None, :]  # [1, BN], depth 0
            b_ptrs = b_ptr + j * stride_wj + cols[None, :]
            src = ladder_source(x, w_ptrs, b_ptrs, stride_wk, col_mask, mask)
            high, low, scale_d, rescaled = forward_continuants(
                src, D, True, HAS_BIAS, FLOOR, COMPUTE, FORCE_RESCALE
            )
            if rescaled > 0:
                r, clamped = clamp_reciprocal(high, scale=scale_d, EPS=EPS, RESCALE=True)
            else:
                r, clamped = clamp_reciprocal(high, scale=scale_d, EPS=EPS, RESCALE=False)
            if HAS_MIX:
                v = tl.load(v_ptr + cols * stride_vn + j * stride_vj, mask=cols < N, other=0.0)
                if NEED_PARAMS:  # d loss / d V[i, j] = sum_m grad_out f~_j
                    value_sum = tl.sum(grad_out * (low * r), axis=0)  # [BN]
                    acc_v += tl.where(mix_rows == j, value_sum[None, :], 0.0)
                upstream = grad_out * v.to(COMPUTE)[None, :]
            else:
                upstream = grad_out
            if rescaled > 0:
                grad_x, acc_w, acc_b = _ladder_gradients(j, src, upstream, grad_x, acc_w, acc_b, acc_rows, r, scale_d, clamped, D, L, HAS_BIAS, FLOOR, NEED_X, NEED_PARAMS, EXACT, COMPUTE, RESCALE=True)  # fmt: skip
            else:
                grad_x, acc_w, acc_b = _ladder_gradients(j, src, upstream, grad_x, acc_w, acc_b, acc_rows, r, scale_d, clamped, D, L, HAS_BIAS, FLOOR, NEED_X, NEED_PARAMS, EXACT, COMPUTE, RESCALE=False)  # fmt: skip
        if NEED_X:
            grad_x_ptrs = grad_x_ptr + rows[:, None] * N + cols[None, :]
            tl.store(grad_x_ptrs, grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)
    if NEED_PARAMS:
        # Every program writes its whole slice, zeros included: no uninitialised partials.
        part = pid_s * P * N + acc_rows * N + cols[None, :]  # [P, BN]
        tl.store(part_w_ptr + part, acc_w, mask=col_mask)
        if HAS_BIAS:
            tl.store(part_b_ptr + part, acc_b, mask=col_mask)
        if HAS_MIX:
            part_v = pid_s * LP * N + mix_rows * N + cols[None, :]  # [LP, BN]
            tl.store(part_v_ptr + part_v, acc_v, mask=col_mask)


# ----------------------------------------------------------------------------- launchers


def _params(weight: Tensor, bias: Tensor | None, mix: Tensor | None):
    """Parameters as (d, L, n) / (n, L) tensors with unit stride along n (tiny copies)."""
    w = weight.contiguous()
    b = w if bias is None else bias.contiguous()
    v = w if mix is None else mix
    return w, b, v


def ladder_ensemble_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor | None,
    eps: float,
    floor: float = 0.0,
    force_rescale: bool = False,
) -> Tensor:
    """sum_j mix[:, j] f~(x weight[:, j] + bias[:, j]) for x (M, n), weight/bias (d, L, n).

    mix: (n, L), or None for L = 1 without mixing (a plain univariate ladder). floor > 0:
    partial denominators floor + softplus(x w + b) instead of x w + b.
    Returns (M, n), contiguous, in x's dtype.
    """
    runtime.check_tensor(x)
    (rows, n), (d, ladders) = x.shape, weight.shape[:2]
    w, b, v = _params(weight, bias, mix)
    out = runtime.new_output((rows, n), x.dtype, x.device)
    if out.numel() == 0:
        return out
    block_m, block_n, warps = runtime.block_2d(rows, n, runtime.tile_elements(d, ladders, False))
    grid = (triton.cdiv(rows, block_m), triton.cdiv(n, block_n))
    ladder_ensemble_fwd_kernel[grid](
        x,
        w,
        b,
        v,
        out,
        rows,
        n,
        x.stride(0),
        x.stride(1),
        w.stride(0),
        w.stride(1),
        v.stride(0),
        v.stride(1),
        EPS=float(eps),
        D=d,
        L=ladders,
        HAS_BIAS=bias is not None,
        FLOOR=float(floor),
        HAS_MIX=mix is not None,
        COMPUTE=runtime.compute_dtype(x.dtype, weight.dtype),
        FORCE_RESCALE=force_rescale,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps,
    )
    return out


def ladder_ensemble_bwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor | None,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float = 0.0,
    need_x: bool = True,
    need_params: bool = True,
    force_rescale: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias, grad_mix) of :func:`ladder_ensemble_fwd`.

    grad_x is (M, n) contiguous in x's dtype; the parameter gradients are reduced over
    the M rows and come in their parameters' shapes and dtypes. Gradients not asked for
    (or of absent parameters) are None.
    """
    runtime.check_tensor(x)
    (rows, n), (d, ladders) = x.shape, weight.shape[:2]
    w, b, v = _params(weight, bias, mix)
    compute = runtime.torch_compute_dtype(x.dtype, weight.dtype)
    grad_x = runtime.new_output((rows, n), x.dtype, x.device) if need_x else None
    block_m, block_n, warps = runtime.block_2d(rows, n, runtime.tile_elements(d, ladders, True))
    row_blocks, col_blocks = triton.cdiv(rows, block_m), triton.cdiv(n, block_n)
    split = runtime.reduction_split(row_blocks, col_blocks, x.device)
    p_rows = triton.next_power_of_2(d * ladders)
    mix_rows = triton.next_power_of_2(ladders)
    if need_params:
        part_w = runtime.new_output((split, p_rows, n), compute, x.device)
        part_b = (
            runtime.new_output((split, p_rows, n), compute, x.device)
            if bias is not None
            else part_w
        )
        part_v = (
            runtime.new_output((split, mix_rows, n), compute, x.device)
            if mix is not None
            else part_w
        )
    else:
        part_w = part_b = part_v = w
    if rows > 0 and n > 0 and (need_x or need_params):
        ladder_ensemble_bwd_kernel[(col_blocks, split)](
            x,
            w,
            b,
            v,
            grad_out,
            x if grad_x is None else grad_x,
            part_w,
            part_b,
            part_v,
            rows,
            n,
            x.stride(0),
            x.stride(1),
            grad_out.stride(0),
            grad_out.stride(1),
            w.stride(0),
            w.stride(1),
            v.stride(0),
            v.stride(1),
            row_blocks,
            split,
            EPS=float(eps),
            D=d,
            L=ladders,
            P=p_rows,
            LP=mix_rows,
            HAS_BIAS=bias is not None,
            FLOOR=float(floor),
            HAS_MIX=mix is not None,
            NEED_X=need_x,
            NEED_PARAMS=need_params,
            EXACT=exact,
            COMPUTE=runtime.compute_dtype(x.dtype, weight.dtype),
            FORCE_RESCALE=force_rescale,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=warps,
        )
    elif need_params:  # no rows: the sums are zero
        for part in (part_w, part_b, part_v):
            part.zero_()
    if not need_params:
        return grad_x, None, None, None
    # (d L, n) -> (d, L, n): row (k-1) L + j holds weight[k-1, j].
    grad_w = part_w.sum(0)[: d * ladders].view(d, ladders, n).to(weight.dtype)
    grad_b = None
    if bias is not None:
        grad_b = part_b.sum(0)[: d * ladders].view(d, ladders, n).to(bias.dtype)
    grad_v = None
    if mix is not None:
        # (L, n) -> (n, L), contiguous as the op's fake promises (inductor asserts strides).
        grad_v = part_v.sum(0)[:ladders].t().to(mix.dtype).contiguous()
    return grad_x, grad_w.reshape(weight.shape), grad_b, grad_v


def univariate_ladder_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    floor: float = 0.0,
    force_rescale: bool = False,
) -> Tensor:
    """f~ of univariate ladders: x (..., n), weight/bias (d, n) -> (..., n) contiguous."""
    d, n = weight.shape
    bias3 = None if bias is None else bias.reshape(d, 1, n)
    out = ladder_ensemble_fwd(
        x.reshape(-1, n), weight.reshape(d, 1, n), bias3, None, eps, floor, force_rescale
    )
    return out.view(x.shape)


def univariate_ladder_bwd(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float = 0.0,
    need_x: bool = True,
    need_params: bool = True,
    force_rescale: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x (..., n), grad_weight (d, n), grad_bias (d, n) | None) of the ladder."""
    d, n = weight.shape
    bias3 = None if bias is None else bias.reshape(d, 1, n)
    grad_x, grad_w, grad_b, _ = ladder_ensemble_bwd(
        x.reshape(-1, n),
        weight.reshape(d, 1, n),
        bias3,
        None,
        grad_out.reshape(-1, n),
        eps,
        exact,
        floor,
        need_x,
        need_params,
        force_rescale,
    )
    return (
        None if grad_x is None else grad_x.view(x.shape),
        None if grad_w is None else grad_w.view(d, n),
        None if grad_b is None else grad_b.view(d, n),
    )

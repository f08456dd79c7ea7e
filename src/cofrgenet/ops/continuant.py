"""Continuant evaluation of continued fractions: one reciprocal, closed-form backward.

For partial denominators a_1..a_d (a_1 outermost) the tail continuants are

    K_0 = 1,  K_1 = a_d,  K_j = a_{d-j+1} K_{j-1} + K_{j-2}

and f~ = K_{d-1} / clamp(K_d). With r = 1 / clamp(K_d) computed once, Proposition 1 of
the paper gives every gradient: d f~ / d a_k = (-1)^k (K_{d-k} r)^2, where K_{d-k} is the
(d-k)-th tail continuant, so the backward pass reruns the same recurrence and saves no
(..., d) activations.

Rescaling: continuants grow geometrically with d and |a|. When |K_j| passes 2^64 both
running values are multiplied by 2^-64 (exact in binary floating point) and a per-element
counter ``scale`` is incremented, so the true K_j is ``stored * 2^(64 * scale)``. The clamp
compares the true |K_d| with eps; gradients use the scale difference between K_{d-k} and
K_d. The eager and compiled paths first run without rescaling and rerun with it only if
something overflowed (scaling by powers of two changes no bits otherwise); the Triton
kernels always carry the scale, which costs nothing inside one kernel.

The kernels below are plain functions over a ``coefficient(k)`` callable returning a_{k+1}
(0-based k), so continued fractions on (..., d) tensors and univariate ladders (a_k
computed on the fly from x, weight, bias) share one recurrence.

Inference with positive partial denominators (every a_k >= floor > 0) needs neither the
continuants nor their bookkeeping: :func:`tail_value` evaluates f~ from the inside out,
two ops a level, with nothing that can overflow, no clamp and no overflow check.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from cofrgenet.ops.literal import compute_dtype

RESCALE_EXPONENT = 64
_RESCALE_AT = 2.0**RESCALE_EXPONENT
_RESCALE_BY = 2.0**-RESCALE_EXPONENT

#: The smallest normal float16: below it a floor rounds by more than clamp_eps's margin.
_HALF_NORMAL = 2.0**-14

Coefficient = Callable[[int], Tensor]
Emit = Callable[[int, Tensor], None]


def cast(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor.to(dtype)``, without the op dispatch when it already has that dtype (a
    one-token decoding step is bound by dispatch: a few us an op)."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def chain_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a p-variate ladder's backward carries d loss / d a in, through the chain
    rule to x and the parameters: float32 for float16 inputs, whose range ends at 65504
    while a clamped denominator's gradient, (K/eps)^2, is often larger (and finite once
    multiplied by the weights); the inputs' own dtype otherwise."""
    return torch.float32 if dtype == torch.float16 else dtype


# ----------------------------------------------------------------------------- recurrences


def _rescale(high: Tensor, low: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    big = high.abs() > _RESCALE_AT
    high = torch.where(big, high * _RESCALE_BY, high)
    low = torch.where(big, low * _RESCALE_BY, low)
    return high, low, scale + big.to(scale.dtype)


def _pow2_scale(exponent_count: Tensor) -> Tensor:
    """2^(64 * exponent_count), exact for the integer-valued counts used here."""
    return torch.exp2(RESCALE_EXPONENT * exponent_count)


def _zero_counts(like: Tensor) -> Tensor:
    """All-zero rescale counts shaped like ``like``: one zero, expanded (no fill)."""
    return like.new_zeros(()).expand(like.shape)


def clamp_eps(eps: float, floor: float) -> float | None:
    """eps, or None where positive partial denominators keep |K_d| >= eps already.

    With a_k = floor + softplus(u_k) >= floor > 0 every continuant stays away from 0:
    K_1 = a_d >= floor, K_2 = a_{d-1} K_1 + 1 >= 1 and K_j = a K_{j-1} + K_{j-2} >= K_{j-2},
    in floating point too (every term is >= 0 and rounding is monotone), so
    K_d >= min(floor, 1). Where that is at least eps (with 1% to spare for a floor rounded
    to half precision, and a floor that is a normal float16, >= 2^-14) the clamp changes
    nothing: the kernels skip it, its mask and exact mode's clamped-gradient pass (4
    elementwise ops forward, 2 (d - 1) continuants backward).
    """
    bounded = floor >= _HALF_NORMAL and 0.0 < eps <= 0.99 * min(floor, 1.0)
    return None if bounded else eps


def continuant_forward(
    coefficient: Coefficient, d: int, eps: float | None, rescale: bool, clamp_mask: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """Evaluate f~ by the tail recurrence.

    Returns (value, r, scale, clamped, k_d): r = 1 / clamp(K_d) in the scaled domain,
    scale = the rescale count of K_d (zeros without rescaling), clamped = |true K_d| < eps
    (None unless ``clamp_mask``), k_d = the scaled K_d (used to detect overflow). All
    shaped like one coefficient. eps None: K_d needs no clamp (:func:`clamp_eps`), and
    clamped is None.
    """
    high = coefficient(d - 1)  # K_1 = a_d
    # K_0 = 1, and no scale counts: scalars where nothing rescales (no full-size fills).
    low: Tensor | float = torch.ones_like(high) if rescale else 1.0
    scale = torch.zeros_like(high) if rescale else _zero_counts(high)
    for k in range(d - 2, -1, -1):
        high, low = coefficient(k) * high + low, high
        if rescale:
            high, low, scale = _rescale(high, low, scale)
    if eps is None:
        r = torch.reciprocal(high)
        return low * r, r, scale, None, high
    threshold = eps * _pow2_scale(-scale) if rescale else eps
    clamped = high.abs() < threshold if clamp_mask else None
    # sign(K_d) max(|K_d|, threshold) with sign(0) = +1, as reference.clamp_denominator.
    denominator = torch.where(high >= 0, high.clamp_min(threshold), high.clamp_max(-threshold))
    r = torch.reciprocal(denominator)
    return low * r, r, scale, clamped, high


def tail_value(coefficient: Coefficient, d: int) -> Tensor:
    """f~ = 1 / t_1 by the tails t_d = a_d, t_k = a_k + 1 / t_{k+1}: the value alone.

    Only for partial denominators bounded below by a positive floor (``clamp_eps`` None):
    then every t_k >= a_k >= floor, so nothing overflows, divides by zero or needs the
    clamp, and each level is one reciprocal and one add of positive numbers, neither of
    which amplifies relative error (at most about one ulp a level). The continuants' forward costs ~2x the ops, a
    reduction and a host sync (the overflow check); a one-token decoding step is bound
    by op dispatch. No K_d comes out of it, so training keeps the continuants.
    """
    tail = coefficient(d - 1)
    for k in range(d - 2, -1, -1):
        tail = coefficient(k) + torch.reciprocal(tail)
    return torch.reciprocal(tail)


def _paper_gradients(
    coefficient: Coefficient, d: int, r: Tensor, scale_d: Tensor, rescale: bool, emit: Emit
) -> None:
    """Emit (k-1, d f~/d a_k) for k = d..1 by Proposition 1 with the clamped K_d."""
    suffix: Tensor | None = None  # K_{d-k} of the tail; None for K_0 = 1 (no fill)
    previous: Tensor | float = 0.0
    scale = torch.zeros_like(r) if rescale else None
    for j in range(d):
        k = d - j  # suffix holds K_{d-k}(a_{k+1}..a_d)
        ratio = r if suffix is None else suffix * r
        if rescale:
            ratio = ratio * _pow2_scale(scale - scale_d)
        square = ratio * ratio
        emit(k - 1, square if k % 2 == 0 else -square)
        if j < d - 1:
            if suffix is None:  # K_1 = a_d, K_0 = 1
                suffix, previous = coefficient(k - 1), torch.ones_like(r) if rescale else 1.0
            else:
                suffix, previous = coefficient(k - 1) * suffix + previous, suffix
            if rescale:
                suffix, previous, scale = _rescale(suffix, previous, scale)


def _exact_clamped_gradients(
    coefficient: Coefficient, d: int, r: Tensor, scale_d: Tensor, rescale: bool
) -> list[Tensor]:
    """True gradient where K_d is clamped: 0 for a_1, K(a_2..a_{k-1}) K(a_{k+1}..a_d) r else.

    Needs prefix and suffix continuants at once, so both are kept as lists of d - 1
    tensors shaped like r (transient memory of the backward pass only).
    """
    zeros = torch.zeros_like(r)
    suffixes, suffix_scales = [torch.ones_like(r)], [zeros]  # K_j(tail), j = 0..d-2
    high, low, scale = torch.ones_like(r), zeros, zeros
    for j in range(d - 2):
        high, low = coefficient(d - 1 - j) * high + low, high
        if rescale:
            high, low, scale = _rescale(high, low, scale)
        suffixes.append(high)
        suffix_scales.append(scale)
    prefixes, prefix_scales = [torch.ones_like(r)], [zeros]  # K_m(a_2..a_{m+1}), m = 0..d-2
    high, low, scale = torch.ones_like(r), zeros, zeros
    for m in range(1, d - 1):
        high, low = coefficient(m) * high + low, high
        if rescale:
            high, low, scale = _rescale(high, low, scale)
        prefixes.append(high)
        prefix_scales.append(scale)
    grads = [zeros]
    for k in range(2, d + 1):
        g = prefixes[k - 2] * suffixes[d - k] * r
        if rescale:
            g = g * _pow2_scale(prefix_scales[k - 2] + suffix_scales[d - k] - scale_d)
        grads.append(g)
    return grads


def continuant_backward(
    coefficient: Coefficient,
    d: int,
    r: Tensor,
    scale_d: Tensor,
    clamped: Tensor | None,
    exact: bool,
    rescale: bool,
    emit: Emit,
) -> None:
    """Emit (k-1, d f~/d a_k) for every k, in the paper's or the exact gradient mode.

    Exact mode with ``clamped`` None (no K_d needed the clamp: :func:`clamp_eps`) is the
    paper's gradient."""
    if not exact or clamped is None:
        _paper_gradients(coefficient, d, r, scale_d, rescale, emit)
        return
    paper: list[Tensor] = [r] * d
    _paper_gradients(coefficient, d, r, scale_d, rescale, paper.__setitem__)
    exact_grads = _exact_clamped_gradients(coefficient, d, r, scale_d, rescale)
    for k in range(d):
        emit(k, torch.where(clamped, exact_grads[k], paper[k]))


# -------------------------------------------------------------------------- op kernels


def _forward_outputs(
    coefficient: Coefficient, d: int, eps: float | None, exact: bool, rescale: bool
):
    """continuant_forward trimmed to what the autograd wrappers keep.

    (value, r, scale, clamped, k_d_sum): the clamp mask only in exact mode; ``k_d_sum``,
    the overflow check of the unscaled first pass (fused into the kernel when compiled),
    only without rescaling: it is finite unless some K_d overflowed (or the sum itself
    did, which only costs a needless rescaled rerun with the same result).
    """
    value, r, scale, clamped, k_d = continuant_forward(coefficient, d, eps, rescale, exact)
    return value, r, scale, clamped, None if rescale else k_d.sum()


def _cf_forward(a: Tensor, eps: float | None, exact: bool, rescale: bool):
    """a: (..., d), any strides -> value, r, scale, clamped (exact mode only), k_d; each (...).

    Reads a[..., k] in place: no layout copy. Compiled, this is one fused loop.
    """
    return _forward_outputs(lambda k: a[..., k], a.shape[-1], eps, exact, rescale)


def _cf_backward(
    a: Tensor,
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    rescale: bool,
    depth_major: bool,
) -> Tensor:
    """d loss / d a as (..., d), or as (d, ...) when ``depth_major``.

    Stacking the d gradients in one go lets the compiled kernel write each output row
    (or each depth plane) contiguously; writing a[..., k] slices one at a time into a
    fresh row-major buffer was 6x slower on CPU (strided stores, scattered page faults).
    """
    d = a.shape[-1]
    grads: list[Tensor] = [r] * d

    def emit(k: int, g: Tensor) -> None:
        grads[k] = g * grad_out

    continuant_backward(lambda k: a[..., k], d, r, scale, clamped, exact, rescale, emit)
    return torch.stack(grads, dim=0 if depth_major else -1)


def is_depth_major(a: Tensor) -> bool:
    """Whether the depth dimension of a (..., d) tensor is its outermost stride."""
    return a.dim() > 1 and a.shape[-1] > 1 and a.stride(-1) == a.numel() // a.shape[-1]


def positive_link(u: Tensor, floor: float) -> Tensor:
    """floor + softplus(u): a partial denominator that never goes below floor (> 0)."""
    return torch.nn.functional.softplus(u) + floor


def pvariate_preactivation(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """u[..., j, k] = weight[k, j] . x (+ bias[k, j]), the linear parts of p-variate ladders.

    x: (..., p), weight: (d, L, p), bias: (d, L) or None -> (..., L, d), depth-major in
    memory (d outermost, rows innermost: the layout the continuant kernels read fastest).
    One (d L, p) x (p, M) matmul.
    """
    depth, ladders, dim = weight.shape
    rows = x.reshape(-1, dim)  # (M, p)
    flat = weight.reshape(depth * ladders, dim)
    if bias is None:
        u_t = flat @ rows.t()
    else:
        u_t = torch.addmm(bias.reshape(depth * ladders, 1), flat, rows.t())
    u = u_t.view(depth, ladders, rows.shape[0]).permute(2, 1, 0)  # (M, L, d) view
    return u.view(*x.shape[:-1], ladders, depth)


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A region without autocast; a no-op context when autocast is off already (making a
    ``torch.autocast`` object costs ~10-20 us, a tenth of a one-token Cffn step)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def pvariate_denominators(
    x: Tensor, weight: Tensor, bias: Tensor | None, floor: float
) -> tuple[Tensor, Tensor]:
    """(u, a): linear parts and partial denominators (..., L, d), depth-major, x's dtype.

    Computed without autocast, in x's dtype, so that backward recomputes exactly the
    denominators forward used (an autocast matmul would round them to half precision).
    floor 0: a = u (the paper's); floor > 0: a = positive_link(u, floor).
    """
    with _autocast_off(x.device.type):
        b = None if bias is None else cast(bias, x.dtype)
        u = pvariate_preactivation(x, cast(weight, x.dtype), b)
        return u, (u if floor <= 0 else positive_link(u, floor))


def pvariate_backward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    u: Tensor,
    grad_a: Tensor,
    floor: float,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) in the inputs' dtypes from d loss / d a (..., L, d),
    carried through the chain rule in :func:`chain_dtype`."""
    dtype = chain_dtype(x.dtype)
    with _autocast_off(x.device.type):
        grad_u = cast(grad_a, dtype)
        if floor > 0:  # a_k = floor + softplus(u_k): d a_k / d u_k = sigmoid(u_k)
            grad_u = grad_u * torch.sigmoid(cast(u, dtype))
        b = None if bias is None else cast(bias, dtype)
        grad_x, grad_w, grad_b = pvariate_chain(
            cast(x, dtype), cast(weight, dtype), b, grad_u, need_x, need_params
        )
    return (
        None if grad_x is None else cast(grad_x, x.dtype),
        None if grad_w is None else cast(grad_w, weight.dtype),
        None if grad_b is None or bias is None else cast(grad_b, bias.dtype),
    )


#: What a second derivative through a fast path says (gradient penalties, Hessians).
HIGHER_ORDER = (
    "cofrgenet's continuant and Triton backward passes are first-order only, and a "
    "gradient taken with create_graph=True through them would miss their terms (0, "
    "silently): use impl='literal' for higher derivatives"
)


def check_first_order() -> None:
    """Raise where a backward runs under ``create_graph=True`` (grad mode is on then):
    the gradient it returns has no graph, so a derivative of it would leave this op's
    terms out without an error (``once_differentiable`` raises only when the incoming
    gradient itself requires grad)."""
    if torch.is_grad_enabled():
        raise RuntimeError(HIGHER_ORDER)


def first_order_only(backward: Callable) -> Callable:
    """``once_differentiable``, and :func:`check_first_order` first."""
    once = once_differentiable(backward)

    @functools.wraps(backward)
    def checked(ctx: Any, *grads: Any) -> Any:
        check_first_order()
        return once(ctx, *grads)

    return checked


class PvariateDenominators(torch.autograd.Function):
    """a = link(W x + b), (..., L, d) depth-major, with the chain rule of
    :func:`pvariate_backward` as its backward: both outside autocast.

    The denominators as plain ops would do forward's matmul outside autocast, but traced,
    AOT autograd puts the surrounding autocast on their backward and rounds its matmuls
    to half precision (bf16: 4e-3 relative error in x's gradient; fp16 with a scaled
    loss: inf). A Function's backward keeps its own autocast setting, traced or not.
    Saves x, the parameters and, with a floor, u (softplus's input).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, floor: float) -> Tensor:
        u, a = pvariate_denominators(x, weight, bias, floor)
        ctx.save_for_backward(x, weight, bias, u if floor > 0 else None)
        ctx.floor = floor
        return a

    @staticmethod
    def backward(ctx, grad_a: Tensor) -> tuple[Tensor | None, ...]:
        x, weight, bias, u = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with torch.autocast(x.device.type, enabled=False):  # also when traced under it
            grad_x, grad_w, grad_b = pvariate_backward(
                x, weight, bias, u, grad_a, ctx.floor, need_x, need_w or need_b
            )
        return grad_x, grad_w if need_w else None, grad_b if need_b else None, None


def pvariate_chain(
    x: Tensor, weight: Tensor, bias: Tensor | None, grad_u: Tensor, need_x: bool, need_params: bool
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of :func:`pvariate_preactivation` from d loss / d u.

    grad_u: (..., L, d), depth-major like u (any layout works, that one without a copy).
    """
    depth, ladders, dim = weight.shape
    g_t = grad_u.reshape(-1, ladders, depth).permute(2, 1, 0).reshape(depth * ladders, -1)
    grad_x = None
    if need_x:
        grad_x = (g_t.t() @ weight.reshape(depth * ladders, dim)).view(x.shape)
    if not need_params:
        return grad_x, None, None
    grad_w = (g_t @ x.reshape(-1, dim)).view(weight.shape)
    grad_b = None if bias is None else g_t.sum(1).view(bias.shape)
    return grad_x, grad_w, grad_b


def ladder_preactivation(x: Tensor, weight: Tensor, bias: Tensor | None) -> Coefficient:
    """k -> u_k = x * weight[k] (+ bias[k]), the linear part of a univariate ladder."""
    if bias is None:
        return lambda k: x * weight[k]
    return lambda k: torch.addcmul(bias[k], x, weight[k])


def ladder_coefficient(
    x: Tensor, weight: Tensor, bias: Tensor | None, floor: float = 0.0
) -> Coefficient:
    """k -> a_{k+1}: u_k itself (floor 0, the paper's) or positive_link(u_k, floor)."""
    pre = ladder_preactivation(x, weight, bias)
    if floor <= 0:
        return pre
    return lambda k: positive_link(pre(k), floor)


def _ladder_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    rescale: bool,
):
    """x: (M, n), weight/bias: (d, n) -> value, r, scale, clamped (exact only), k_d; (M, n)."""
    return _forward_outputs(
        ladder_coefficient(x, weight, bias, floor),
        weight.shape[0],
        clamp_eps(eps, floor),
        exact,
        rescale,
    )


def _ladder_backward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    floor: float,
    rescale: bool,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients for x (M, n), weight (d, n) and bias (d, n); params reduced over M."""
    d = weight.shape[0]
    grad_x = torch.zeros_like(x) if need_x else None
    grad_w: list[Tensor] = [weight[0]] * d
    grad_b: list[Tensor] = [weight[0]] * d
    pre = ladder_preactivation(x, weight, bias)

    def emit(k: int, g: Tensor) -> None:
        nonlocal grad_x
        t = g * grad_out  # d loss / d a_k, (M, n)
        if floor > 0:  # a_k = floor + softplus(u_k): d a_k / d u_k = sigmoid(u_k)
            t = t * torch.sigmoid(pre(k))
        if need_x:
            grad_x = torch.addcmul(grad_x, t, weight[k])
        if need_params:
            grad_w[k] = (t * x).sum(0)
            grad_b[k] = t.sum(0)

    coefficient = ladder_coefficient(x, weight, bias, floor)
    continuant_backward(coefficient, d, r, scale, clamped, exact, rescale, emit)
    if not need_params:
        return grad_x, None, None
    return grad_x, torch.stack(grad_w), torch.stack(grad_b)


# ------------------------------------------------------------------------- compilation

_compile_failed = False


@functools.cache
def _compiled(fn: Callable) -> Callable:
    return torch.compile(fn, dynamic=None)


def compile_available() -> bool:
    """Whether the compiled continuant path can be used in this process."""
    return not _compile_failed


def _run(fn: Callable, compiled: bool, *args):
    """Run a kernel compiled (with rescaling inside) or eagerly; when only the compiled
    kernel fails (a missing C compiler, an inductor bug), eagerly for the rest of the
    process. A failure of both (out of memory, say) is raised and keeps the compiled path
    for the next call: a sweep worker goes on to its next trial at full speed."""
    global _compile_failed
    if not compiled or _compile_failed:
        return fn(*args)
    try:
        return _compiled(fn)(*args)
    except Exception as error:
        result = fn(*args)  # raises when the eager kernel fails too
        _compile_failed = True
        warnings.warn(
            f"torch.compile of the continuant kernels failed ({type(error).__name__}: "
            f"{error}); falling back to the eager continuant path for this process.",
            RuntimeWarning,
            stacklevel=3,
        )
        return result


def _forward_with_overflow_check(fn: Callable, compiled: bool, *args):
    """Run without rescaling and redo with it only if K_d overflowed.

    Scaling by powers of two changes no bits otherwise, and the unscaled kernels skip
    the scale bookkeeping (a select per step, an exp2 per gradient) in forward and
    backward. The check costs one reduction and a host sync.
    """
    result = _run(fn, compiled, *args, False)
    if math.isfinite(result[4]):
        return (*result, False)
    return (*_run(fn, compiled, *args, True), True)


def _ladder_work(x: Tensor, weight: Tensor, bias: Tensor | None):
    """x as (M, n), weight and bias, all in the compute dtype of x."""
    dtype = compute_dtype(x.dtype)
    x2 = cast(x.reshape(-1, x.shape[-1]), dtype)
    return x2, cast(weight, dtype), None if bias is None else cast(bias, dtype)


def _cf_gradient(
    a: Tensor,
    work: Tensor,
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    rescaled: bool,
    compiled: bool,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """d loss / d a from the forward state, in a's layout and in ``dtype`` (a's)."""
    depth_major = is_depth_major(a)
    grad = _run(
        _cf_backward,
        compiled,
        work,
        r,
        scale,
        clamped,
        cast(grad_out, r.dtype),
        exact,
        rescaled,
        depth_major,
    )
    if depth_major:  # (d, ...) -> (..., d), the same layout as a
        grad = grad.movedim(0, -1)
    return cast(grad, a.dtype if dtype is None else dtype)


def _ladder_gradients(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    work: tuple[Tensor, Tensor, Tensor | None],
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    floor: float,
    rescaled: bool,
    need_x: bool,
    need_params: bool,
    compiled: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) from the forward state, in the inputs' shapes and
    dtypes; None where not asked for (or no bias)."""
    x2, w, b = work
    grad_x, grad_w, grad_b = _run(
        _ladder_backward,
        compiled,
        x2,
        w,
        b,
        r,
        scale,
        clamped,
        cast(grad_out.reshape(-1, x.shape[-1]), r.dtype),
        exact,
        floor,
        rescaled,
        need_x,
        need_params,
    )
    return (
        None if grad_x is None else cast(grad_x.reshape(x.shape), x.dtype),
        None if grad_w is None else cast(grad_w, weight.dtype),
        None if grad_b is None or bias is None else cast(grad_b, bias.dtype),
    )


# --------------------------------------------------------------------- the entry points


def continued_fraction_value(a: Tensor, eps: float | None, compiled: bool) -> Tensor:
    """f~(a) without autograd bookkeeping (inference: nothing is saved for backward);
    eps None: a needs no clamp (:func:`clamp_eps`), and is evaluated by :func:`tail_value`
    unless ``compiled`` (one fused loop either way)."""
    work = cast(a, compute_dtype(a.dtype))
    if eps is None and not compiled:
        return cast(tail_value(lambda k: work[..., k], work.shape[-1]), a.dtype)
    value = _forward_with_overflow_check(_cf_forward, compiled, work, eps, False)[0]
    return cast(value, a.dtype)


def continued_fraction_grad(
    a: Tensor, grad_out: Tensor, eps: float, exact: bool, compiled: bool
) -> Tensor:
    """d loss / d a from a alone (the recurrence is rerun), laid out like
    ``torch.empty_like(a)``, in a's dtype: the backward of a stateless op."""
    work = cast(a, compute_dtype(a.dtype))
    _, r, scale, clamped, _, rescaled = _forward_with_overflow_check(
        _cf_forward, compiled, work, eps, exact
    )
    grad = _cf_gradient(a, work, r, scale, clamped, grad_out, exact, rescaled, compiled)
    out = torch.empty_like(a)
    out.copy_(grad)
    return out


def univariate_ladder_state(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    compiled: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, bool]:
    """(value in x's shape and dtype, r, scale, clamped (exact mode) | None, rescaled):
    the forward and what its backward needs; r, scale and clamped are (M, n), r and scale
    in the compute dtype, scale all zero unless ``rescaled``."""
    x2, w, b = _ladder_work(x, weight, bias)
    value, r, scale, clamped, _, rescaled = _forward_with_overflow_check(
        _ladder_forward, compiled, x2, w, b, eps, exact, floor
    )
    return cast(value.reshape(x.shape), x.dtype), r, scale, clamped, rescaled


def univariate_ladder_value(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, compiled: bool, floor: float
) -> Tensor:
    """Elementwise ladders without autograd bookkeeping (inference); positive partial
    denominators by :func:`tail_value` unless ``compiled``."""
    if clamp_eps(eps, floor) is None and not compiled:
        x2, w, b = _ladder_work(x, weight, bias)
        value = tail_value(ladder_coefficient(x2, w, b, floor), w.shape[0])
        return cast(value.reshape(x.shape), x.dtype)
    return univariate_ladder_state(x, weight, bias, eps, False, floor, compiled)[0]


def univariate_ladder_gradients(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    floor: float,
    rescaled: bool,
    need_x: bool,
    need_params: bool,
    compiled: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) from the forward's state (r, scale, clamped of
    :func:`univariate_ladder_state`): no recurrence rerun."""
    return _ladder_gradients(
        x, weight, bias, _ladder_work(x, weight, bias), r, scale, clamped, grad_out, exact,
        floor, rescaled, need_x, need_params, compiled,
    )  # fmt: skip


def univariate_ladder_grads(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float,
    need_x: bool,
    need_params: bool,
    compiled: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) from the inputs alone (the recurrence is rerun);
    None where not asked for: the backward of a stateless op."""
    work = _ladder_work(x, weight, bias)
    _, r, scale, clamped, _, rescaled = _forward_with_overflow_check(
        _ladder_forward, compiled, *work, eps, exact, floor
    )
    return _ladder_gradients(
        x, weight, bias, work, r, scale, clamped, grad_out, exact, floor, rescaled,
        need_x, need_params, compiled,
    )  # fmt: skip


def _scale_to_keep(scale: Tensor, rescaled: bool) -> Tensor | None:
    """The rescale counts backward needs: none unless something overflowed (they are all
    zero then, and the unscaled backward never reads them), which saves a tensor the size
    of the output for backward in the common case."""
    return scale if rescaled else None


def _kept_scale(scale: Tensor | None, r: Tensor) -> Tensor:
    """The counts :func:`_scale_to_keep` dropped: zeros, read by nothing unscaled."""
    return _zero_counts(r) if scale is None else scale


class ContinuedFraction(torch.autograd.Function):
    """f~(a) for a: (..., d) -> (...), with the closed-form backward.

    Saves a and r (the rescale counts only if K_d overflowed, the clamp mask only in exact
    mode); the recurrence is rerun in backward. a is read in its own layout and its
    gradient written in that layout.
    """

    @staticmethod
    def forward(ctx, a: Tensor, eps: float, exact: bool, compiled: bool) -> Tensor:
        work = cast(a, compute_dtype(a.dtype))
        value, r, scale, clamped, _, rescaled = _forward_with_overflow_check(
            _cf_forward, compiled, work, eps, exact
        )
        ctx.save_for_backward(a, r, _scale_to_keep(scale, rescaled), clamped)
        ctx.exact, ctx.compiled, ctx.rescaled = exact, compiled, rescaled
        return cast(value, a.dtype)

    @staticmethod
    @first_order_only
    def backward(ctx, grad_out: Tensor):
        a, r, scale, clamped = ctx.saved_tensors
        scale = _kept_scale(scale, r)
        work = cast(a, r.dtype)
        grad = _cf_gradient(
            a, work, r, scale, clamped, grad_out, ctx.exact, ctx.rescaled, ctx.compiled
        )
        return grad, None, None, None


def pvariate_ladder_value(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, compiled: bool, floor: float
) -> Tensor:
    """p-variate ladders without autograd bookkeeping (inference): (..., L), contiguous."""
    _, a = pvariate_denominators(x, weight, bias, floor)
    return continued_fraction_value(a, clamp_eps(eps, floor), compiled).contiguous()


def pvariate_ladder_state(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    compiled: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, bool]:
    """(value (..., L) in x's dtype, contiguous, r, scale, clamped (exact mode) | None,
    rescaled); r, scale and clamped are (..., L), r and scale in the compute dtype."""
    _, a = pvariate_denominators(x, weight, bias, floor)
    work = cast(a, compute_dtype(a.dtype))
    value, r, scale, clamped, _, rescaled = _forward_with_overflow_check(
        _cf_forward, compiled, work, clamp_eps(eps, floor), exact
    )
    return cast(value, x.dtype).contiguous(), r, scale, clamped, rescaled


def pvariate_ladder_gradients(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    r: Tensor,
    scale: Tensor,
    clamped: Tensor | None,
    grad_out: Tensor,
    exact: bool,
    floor: float,
    rescaled: bool,
    need_x: bool,
    need_params: bool,
    compiled: bool,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(grad_x, grad_weight, grad_bias) from the forward's state: the denominators are
    recomputed (one (d L) x p matmul), the forward recurrence is not."""
    u, a = pvariate_denominators(x, weight, bias, floor)
    grad_a = _cf_gradient(
        a, cast(a, r.dtype), r, scale, clamped, grad_out, exact, rescaled, compiled,
        chain_dtype(x.dtype),
    )  # fmt: skip
    return pvariate_backward(x, weight, bias, u, grad_a, floor, need_x, need_params)


def _save_ladder_state(
    ctx: Any, state: Callable, x: Tensor, weight: Tensor, bias: Tensor | None, *options
) -> Tensor:
    """A ladder Function's forward: the value of ``state`` (``pvariate_ladder_state`` or
    ``univariate_ladder_state``), saving what its backward needs."""
    eps, exact, compiled, floor = options
    value, r, scale, clamped, rescaled = state(x, weight, bias, eps, exact, floor, compiled)
    ctx.save_for_backward(x, weight, bias, r, _scale_to_keep(scale, rescaled), clamped)
    ctx.exact, ctx.compiled, ctx.rescaled, ctx.floor = exact, compiled, rescaled, floor
    return value


def _saved_ladder_gradients(ctx: Any, gradients: Callable, grad_out: Tensor) -> tuple:
    """A ladder Function's backward from the state :func:`_save_ladder_state` kept:
    ``gradients`` is ``pvariate_ladder_gradients`` or ``univariate_ladder_gradients``."""
    x, weight, bias, r, scale, clamped = ctx.saved_tensors
    needs = ctx.needs_input_grad
    grad_x, grad_w, grad_b = gradients(
        x, weight, bias, r, _kept_scale(scale, r), clamped, grad_out, ctx.exact, ctx.floor,
        ctx.rescaled, needs[0], needs[1] or needs[2], ctx.compiled,
    )  # fmt: skip
    return grad_x, grad_w if needs[1] else None, grad_b if needs[2] else None, *[None] * 4


class PvariateLadder(torch.autograd.Function):
    """p-variate ladders: x (..., p), weight (d, L, p), bias (d, L) | None -> (..., L).

    apply(x, weight, bias, eps, exact, compiled, floor). Saves x, the parameters and
    r = 1 / clamp(K_d) (..., L) (the rescale counts only if K_d overflowed, the clamp mask
    in exact mode): the (..., L, d) linear parts and partial denominators are recomputed
    in backward (one (d L) x p matmul) instead of kept.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, *options) -> Tensor:
        return _save_ladder_state(ctx, pvariate_ladder_state, x, weight, bias, *options)

    @staticmethod
    @first_order_only
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        return _saved_ladder_gradients(ctx, pvariate_ladder_gradients, grad_out)


class UnivariateLadder(torch.autograd.Function):
    """Elementwise ladders: x (..., n), weight (d, n), bias (d, n) | None -> (..., n).

    apply(x, weight, bias, eps, exact, compiled, floor). Saves only x, the parameters and
    r (..., n) (plus the rescale counts if K_d overflowed and the clamp mask in exact
    mode); the (..., n, d) partial denominators are recomputed in backward. ``floor`` > 0
    makes them positive: a_k = floor + softplus(x weight[k] + bias[k]).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, *options) -> Tensor:
        return _save_ladder_state(ctx, univariate_ladder_state, x, weight, bias, *options)

    @staticmethod
    @first_order_only
    def backward(ctx: Any, grad_out: Tensor) -> tuple:
        return _saved_ladder_gradients(ctx, univariate_ladder_gradients, grad_out)


def denominator_stats(
    coefficient: Coefficient, d: int, eps: float, near: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(clamped share, share with |K_d| < near, min |K_d|, max |f~|), 0-d float32, no grad."""
    with torch.no_grad():
        value, _, scale, clamped, k_d = continuant_forward(coefficient, d, eps, rescale=True)
        if k_d.numel() == 0:  # no units (an empty batch): none clamped, none near a pole
            zero = torch.zeros((), dtype=torch.float32, device=k_d.device)
            return zero, zero.clone(), torch.full_like(zero, math.inf), zero.clone()
        true_abs = k_d.double().abs() * _pow2_scale(scale.double())
        return (
            clamped.float().mean(),
            (true_abs < near).float().mean(),
            true_abs.min().float(),
            value.abs().max().float(),
        )

"""The continued-fraction ops as ``torch.library`` custom ops, for ``torch.compile``.

Each op is one opaque node in a compiled graph: dynamo does not trace into it (so the
eager continuant's data-dependent overflow check causes no graph break), its fake
implementation gives output shapes and strides, and ``register_autograd`` ties it to a
backward op, itself a custom op, so AOTAutograd traces the backward graph too.

| op | backends | inputs -> output |
|---|---|---|
| ``cofrgenet::continued_fraction`` | triton, torch | a (..., d) -> (...) |
| ``cofrgenet::univariate_ladder`` | triton, torch | x (..., n), weight/bias (d, n) -> (..., n) |
| ``cofrgenet::ladder_ensemble`` | triton | x (..., p), weight/bias (d, L, p), mix (p, L) -> (..., p) |

``backend="triton"`` runs the fused kernels of :mod:`cofrgenet.ops.triton`; ``"torch"``
runs the eager continuant kernels of :mod:`cofrgenet.ops.continuant` and ``"compiled"``
the same kernels through their own ``torch.compile`` (the CPU paths inside a compiled
graph: the op is opaque to the outer compile, so without ``"compiled"`` a large ladder
would run its recurrence op by op there, 2-4x slower than in an eager model). Forward ops save only their inputs; backward ops recompute the
recurrence. Outside ``torch.compile`` the triton backend is called through plain
``autograd.Function`` s instead (:func:`continued_fraction` etc.), which skips the custom
op dispatch (~50 us a call).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from cofrgenet.ops import continuant
from cofrgenet.ops.literal import compute_dtype

BACKENDS = ("triton", "torch", "compiled")


def _kernels():
    """The Triton kernels' package (imports triton on first use)."""
    from cofrgenet.ops import triton as kernels

    return kernels


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


# ---------------------------------------------------------------- torch (continuant) backend


def _torch_cf_forward(a: Tensor, eps: float, compiled: bool = False) -> Tensor:
    work = a.to(compute_dtype(a.dtype))
    value = continuant._forward_with_overflow_check(
        continuant._cf_forward, compiled, work, eps, False
    )[0]
    return value.to(a.dtype).contiguous()


def _torch_cf_backward(
    a: Tensor, grad_out: Tensor, eps: float, exact: bool, compiled: bool = False
) -> Tensor:
    work = a.to(compute_dtype(a.dtype))
    _, r, scale, clamped, _, rescaled = continuant._forward_with_overflow_check(
        continuant._cf_forward, compiled, work, eps, exact
    )
    depth_major = continuant.is_depth_major(a)
    grad = continuant._run(
        continuant._cf_backward,
        compiled,
        work,
        r,
        scale,
        clamped,
        grad_out.to(r.dtype),
        exact,
        rescaled,
        depth_major,
    )
    if depth_major:
        grad = grad.movedim(0, -1)
    out = torch.empty_like(a)  # the layout the fake implementation promises
    out.copy_(grad)
    return out


def _torch_ladder_inputs(x: Tensor, weight: Tensor, bias: Tensor | None):
    dtype = compute_dtype(x.dtype)
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    return x2, weight.to(dtype), None if bias is None else bias.to(dtype)


def _torch_ladder_forward(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, floor: float, compiled: bool = False
) -> Tensor:
    x2, w, b = _torch_ladder_inputs(x, weight, bias)
    value = continuant._forward_with_overflow_check(
        continuant._ladder_forward, compiled, x2, w, b, eps, False, floor
    )[0]
    return value.reshape(x.shape).to(x.dtype).contiguous()


def _torch_ladder_backward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float,
    need_x: bool,
    need_params: bool,
    compiled: bool = False,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    x2, w, b = _torch_ladder_inputs(x, weight, bias)
    _, r, scale, clamped, _, rescaled = continuant._forward_with_overflow_check(
        continuant._ladder_forward, compiled, x2, w, b, eps, exact, floor
    )
    g2 = grad_out.reshape(-1, x.shape[-1]).to(r.dtype)
    grad_x, grad_w, grad_b = continuant._run(
        continuant._ladder_backward,
        compiled,
        x2,
        w,
        b,
        r,
        scale,
        clamped,
        g2,
        exact,
        floor,
        rescaled,
        need_x,
        need_params,
    )
    grad_x = None if grad_x is None else grad_x.reshape(x.shape).to(x.dtype).contiguous()
    grad_w = None if grad_w is None else grad_w.to(weight.dtype)
    grad_b = None if grad_b is None or bias is None else grad_b.to(bias.dtype)
    return grad_x, grad_w, grad_b


# ------------------------------------------------------------------- continued_fraction


@torch.library.custom_op("cofrgenet::continued_fraction", mutates_args=())
def continued_fraction_op(a: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    """f~(a): a (..., d) -> (...) contiguous, a's dtype. ``exact`` only matters in backward."""
    if backend == "triton":
        return _kernels().continued_fraction_fwd(a, eps)
    return _torch_cf_forward(a, eps, backend == "compiled")


@continued_fraction_op.register_fake
def _(a: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    return a.new_empty(a.shape[:-1])


@torch.library.custom_op("cofrgenet::continued_fraction_backward", mutates_args=())
def continued_fraction_backward_op(
    a: Tensor, grad_out: Tensor, eps: float, exact: bool, backend: str
) -> Tensor:
    """d loss / d a, laid out like ``torch.empty_like(a)``."""
    if backend == "triton":
        return _kernels().continued_fraction_bwd(a, grad_out, eps, exact)
    return _torch_cf_backward(a, grad_out, eps, exact, backend == "compiled")


@continued_fraction_backward_op.register_fake
def _(a: Tensor, grad_out: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    return torch.empty_like(a)


def _cf_setup_context(ctx, inputs, output) -> None:
    a, eps, exact, backend = inputs
    ctx.save_for_backward(a)
    ctx.eps, ctx.exact, ctx.backend = eps, exact, backend


def _cf_backward(ctx, grad_out: Tensor):
    (a,) = ctx.saved_tensors
    grad = continued_fraction_backward_op(a, grad_out, ctx.eps, ctx.exact, ctx.backend)
    return grad, None, None, None


continued_fraction_op.register_autograd(_cf_backward, setup_context=_cf_setup_context)


# -------------------------------------------------------------------- univariate_ladder


@torch.library.custom_op("cofrgenet::univariate_ladder", mutates_args=())
def univariate_ladder_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
) -> Tensor:
    """Univariate ladders: x (..., n), weight/bias (d, n) -> (..., n) contiguous.

    floor 0: a_k = x w_k + b_k (the paper's); floor > 0: a_k = floor + softplus(x w_k + b_k).
    """
    if backend == "triton":
        return _kernels().univariate_ladder_fwd(x, weight, bias, eps, floor)
    return _torch_ladder_forward(x, weight, bias, eps, floor, backend == "compiled")


@univariate_ladder_op.register_fake
def _(x, weight, bias, eps, exact, floor, backend):
    return x.new_empty(x.shape)


@torch.library.custom_op("cofrgenet::univariate_ladder_backward", mutates_args=())
def univariate_ladder_backward_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias); a gradient not asked for is an empty (0,) tensor."""
    args = (x, weight, bias, grad_out, eps, exact, floor, need_x, need_params)
    if backend == "triton":
        grads = _kernels().univariate_ladder_bwd(*args)
    else:
        grads = _torch_ladder_backward(*args, compiled=backend == "compiled")
    grad_x, grad_w, grad_b = grads
    return (
        _empty(x) if grad_x is None else grad_x,
        _empty(weight) if grad_w is None else grad_w,
        _empty(weight) if grad_b is None else grad_b,
    )


def _fake_ladder_grads(x, weight, bias, need_x: bool, need_params: bool):
    """Fake (grad_x, grad_weight, grad_bias) of the ladder backward ops: shapes only."""
    grad_x = x.new_empty(x.shape) if need_x else _empty(x)
    grad_w = weight.new_empty(weight.shape) if need_params else _empty(weight)
    has_b = need_params and bias is not None
    grad_b = bias.new_empty(bias.shape) if has_b else _empty(weight)
    return grad_x, grad_w, grad_b


@univariate_ladder_backward_op.register_fake
def _(x, weight, bias, grad_out, eps, exact, floor, backend, need_x, need_params):
    return _fake_ladder_grads(x, weight, bias, need_x, need_params)


def _ladder_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, eps, exact, floor, backend = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.eps, ctx.exact, ctx.floor, ctx.backend = eps, exact, floor, backend


def _ladder_backward(ctx, grad_out: Tensor):
    x, weight, bias = ctx.saved_tensors
    need_x = ctx.needs_input_grad[0]
    need_params = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
    grad_x, grad_w, grad_b = univariate_ladder_backward_op(
        x,
        weight,
        bias,
        grad_out,
        ctx.eps,
        ctx.exact,
        ctx.floor,
        ctx.backend,
        need_x,
        need_params,
    )
    return (
        grad_x if need_x else None,
        grad_w if ctx.needs_input_grad[1] else None,
        grad_b if bias is not None and ctx.needs_input_grad[2] else None,
        None,
        None,
        None,
        None,
    )


univariate_ladder_op.register_autograd(_ladder_backward, setup_context=_ladder_setup_context)


# ----------------------------------------------------------------------- ladder_ensemble


@torch.library.custom_op("cofrgenet::ladder_ensemble", mutates_args=())
def ladder_ensemble_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor,
    eps: float,
    exact: bool,
    floor: float,
) -> Tensor:
    """sum_j mix[:, j] f~(x weight[:, j] + bias[:, j]): x (..., p), weight/bias (d, L, p),
    mix (p, L) -> (..., p) contiguous. Triton only."""
    p = x.shape[-1]
    out = _kernels().ladder_ensemble_fwd(x.reshape(-1, p), weight, bias, mix, eps, floor)
    return out.view(x.shape)


@ladder_ensemble_op.register_fake
def _(x, weight, bias, mix, eps, exact, floor):
    return x.new_empty(x.shape)


@torch.library.custom_op("cofrgenet::ladder_ensemble_backward", mutates_args=())
def ladder_ensemble_backward_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor,
    grad_out: Tensor,
    eps: float,
    exact: bool,
    floor: float,
    need_x: bool,
    need_params: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(grad_x, grad_weight, grad_bias, grad_mix); one not asked for is an empty (0,) tensor."""
    p = x.shape[-1]
    grad_x, grad_w, grad_b, grad_v = _kernels().ladder_ensemble_bwd(
        x.reshape(-1, p),
        weight,
        bias,
        mix,
        grad_out.reshape(-1, p),
        eps,
        exact,
        floor,
        need_x,
        need_params,
    )
    return (
        _empty(x) if grad_x is None else grad_x.view(x.shape),
        _empty(weight) if grad_w is None else grad_w,
        _empty(weight) if grad_b is None else grad_b,
        _empty(mix) if grad_v is None else grad_v,
    )


@ladder_ensemble_backward_op.register_fake
def _(x, weight, bias, mix, grad_out, eps, exact, floor, need_x, need_params):
    grad_v = mix.new_empty(mix.shape) if need_params else _empty(mix)
    return (*_fake_ladder_grads(x, weight, bias, need_x, need_params), grad_v)


def _ensemble_setup_context(ctx, inputs, output) -> None:
    x, weight, bias, mix, eps, exact, floor = inputs
    ctx.save_for_backward(x, weight, bias, mix)
    ctx.eps, ctx.exact, ctx.floor = eps, exact, floor


def _ensemble_backward(ctx, grad_out: Tensor):
    x, weight, bias, mix = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_params = need[1] or need[2] or need[3]
    grad_x, grad_w, grad_b, grad_v = ladder_ensemble_backward_op(
        x, weight, bias, mix, grad_out, ctx.eps, ctx.exact, ctx.floor, need[0], need_params
    )
    return (
        grad_x if need[0] else None,
        grad_w if need[1] else None,
        grad_b if bias is not None and need[2] else None,
        grad_v if need[3] else None,
        None,
        None,
        None,
    )


ladder_ensemble_op.register_autograd(_ensemble_backward, setup_context=_ensemble_setup_context)


# ------------------------------------------------- eager autograd.Functions (triton backend)


class TritonContinuedFraction(torch.autograd.Function):
    """f~(a) with the Triton kernels; saves only a."""

    @staticmethod
    def forward(ctx, a: Tensor, eps: float, exact: bool) -> Tensor:
        ctx.save_for_backward(a)
        ctx.eps, ctx.exact = eps, exact
        return _kernels().continued_fraction_fwd(a, eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        (a,) = ctx.saved_tensors
        return _kernels().continued_fraction_bwd(a, grad_out, ctx.eps, ctx.exact), None, None


class TritonUnivariateLadder(torch.autograd.Function):
    """Univariate ladders with the Triton kernels; saves only x, weight and bias."""

    @staticmethod
    def forward(
        ctx, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, exact: bool, floor: float
    ):
        ctx.save_for_backward(x, weight, bias)
        ctx.eps, ctx.exact, ctx.floor = eps, exact, floor
        return _kernels().univariate_ladder_fwd(x, weight, bias, eps, floor)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_x, grad_w, grad_b = _kernels().univariate_ladder_bwd(
            x, weight, bias, grad_out, ctx.eps, ctx.exact, ctx.floor, need[0], need[1] or need[2]
        )
        return (
            grad_x,
            grad_w if need[1] else None,
            grad_b if need[2] else None,
            None,
            None,
            None,
        )


class TritonLadderEnsemble(torch.autograd.Function):
    """The elementwise Cffn ensemble with the Triton kernels; saves only the inputs."""

    @staticmethod
    def forward(ctx, x, weight, bias, mix, eps: float, exact: bool, floor: float) -> Tensor:
        ctx.save_for_backward(x, weight, bias, mix)
        ctx.eps, ctx.exact, ctx.floor = eps, exact, floor
        p = x.shape[-1]
        out = _kernels().ladder_ensemble_fwd(x.reshape(-1, p), weight, bias, mix, eps, floor)
        return out.view(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        x, weight, bias, mix = ctx.saved_tensors
        need = ctx.needs_input_grad
        p = x.shape[-1]
        grad_x, grad_w, grad_b, grad_v = _kernels().ladder_ensemble_bwd(
            x.reshape(-1, p),
            weight,
            bias,
            mix,
            grad_out.reshape(-1, p),
            ctx.eps,
            ctx.exact,
            ctx.floor,
            need[0],
            need[1] or need[2] or need[3],
        )
        return (
            None if grad_x is None else grad_x.view(x.shape),
            grad_w if need[1] else None,
            grad_b if need[2] else None,
            grad_v if need[3] else None,
            None,
            None,
            None,
        )


# ------------------------------------------------------------------------ entry points


def continued_fraction(a: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    """The custom op inside ``torch.compile``; eagerly, the triton Function (triton only)."""
    if torch.compiler.is_compiling() or backend != "triton":
        return continued_fraction_op(a, eps, exact, backend)
    return TritonContinuedFraction.apply(a, eps, exact)


def univariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
) -> Tensor:
    if torch.compiler.is_compiling() or backend != "triton":
        return univariate_ladder_op(x, weight, bias, eps, exact, floor, backend)
    return TritonUnivariateLadder.apply(x, weight, bias, eps, exact, floor)


def ladder_ensemble(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor,
    eps: float,
    exact: bool,
    floor: float,
) -> Tensor:
    if torch.compiler.is_compiling():
        return ladder_ensemble_op(x, weight, bias, mix, eps, exact, floor)
    return TritonLadderEnsemble.apply(x, weight, bias, mix, eps, exact, floor)

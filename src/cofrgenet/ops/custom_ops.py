"""The continued-fraction ops as ``torch.library`` custom ops, for ``torch.compile``.

Each op is one opaque node in a compiled graph: dynamo does not trace into it (so the
eager continuant's data-dependent overflow check causes no graph break), its fake
implementation gives output shapes and strides, and ``register_autograd`` ties it to a
backward op, itself a custom op, so AOTAutograd traces the backward graph too.

| op | backends | inputs -> output |
|---|---|---|
| ``cofrgenet::continued_fraction`` | triton, torch, compiled | a (..., d) -> (...) |
| ``cofrgenet::univariate_ladder`` | triton, torch, compiled | x (..., n), weight/bias (d, n) -> (..., n) |
| ``cofrgenet::pvariate_ladder`` | triton, torch, compiled | x (..., p), weight (d, L, p), bias (d, L) -> (..., L) |
| ``cofrgenet::univariate_ladder_with_state`` | torch, compiled | as univariate_ladder, + its backward's state |
| ``cofrgenet::pvariate_ladder_with_state`` | torch, compiled | as pvariate_ladder, + its backward's state |
| ``cofrgenet::ladder_ensemble`` | triton | x (..., p), weight/bias (d, L, p), mix (p, L) -> (..., p) |

``backend="triton"`` runs the fused kernels of :mod:`cofrgenet.ops.triton`; ``"torch"``
runs the eager continuant kernels of :mod:`cofrgenet.ops.continuant` and ``"compiled"``
the same kernels through their own ``torch.compile`` (the CPU paths inside a compiled
graph: the op is opaque to the outer compile, so without ``"compiled"`` a large ladder
would run its recurrence op by op there, 2-4x slower than in an eager model). Forward
ops save only their inputs; backward ops recompute the recurrence, except in the
``_with_state`` ops the CPU backends use inside a compiled graph, which keep 1 / K_d
(one value per output) as the eager Functions do. Outside
``torch.compile`` the triton backend is called through plain ``autograd.Function`` s
instead (:func:`continued_fraction` etc.), which skips the custom op dispatch (~50 us a
call).

Every op is written once as a forward and a backward body (below) and :func:`define_op`
makes the rest from them: the forward and backward custom ops with their fake
implementations, the autograd registration, and the eager ``autograd.Function``. A
backward body takes the op's tensor inputs, the upstream gradient, the op's other
arguments and the flags saying which gradients to compute, and returns one gradient per
tensor input, an empty (0,) tensor where it computed none. (The schemas are those the
ops had before ``define_op``: a compiled graph in a warm inductor cache calls the ops by
their schemas, which are not part of the cache key.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from cofrgenet.ops import continuant
from cofrgenet.ops.literal import compute_dtype


def _kernels():
    """The Triton kernels' package (imports triton on first use)."""
    from cofrgenet.ops import triton as kernels

    return kernels


def _empty(like: Tensor) -> Tensor:
    return like.new_empty((0,))


def _or_empty(grad: Tensor | None, like: Tensor) -> Tensor:
    return _empty(like) if grad is None else grad


# ------------------------------------------------------------------------ define_op


class RegisteredOp(NamedTuple):
    """An op's forward and backward custom ops and its eager ``autograd.Function``."""

    op: Callable
    backward_op: Callable
    eager: type[torch.autograd.Function]


def _asked(grads, needs, options) -> tuple:
    """autograd's answer: each wanted gradient, None for the rest and every option."""
    if isinstance(grads, Tensor):
        grads = (grads,)
    wanted = tuple(g if need else None for g, need in zip(grads, needs, strict=True))
    return (*wanted, *(None for _ in options))


def _needs(needs_input_grad, tensors) -> list[bool]:
    return [bool(n) and t is not None for n, t in zip(needs_input_grad, tensors, strict=True)]


def no_flags(needs: list[bool]) -> tuple:
    """Backward flags of a one-input op: none (its gradient is always wanted)."""
    return ()


def x_and_params(needs: list[bool]) -> tuple[bool, bool]:
    """Backward flags (need_x, need_params) of the ladder ops: the first tensor input,
    and any of the others (the parameters' gradients come from one reduction)."""
    return needs[0], any(needs[1:])


def define_op(
    name: str,
    tensors: int,
    forward: Callable,
    backward: Callable,
    fake: Callable,
    fake_backward: Callable,
    flags: Callable[[list[bool]], tuple] = no_flags,
) -> RegisteredOp:
    """Register ``cofrgenet::<name>`` and ``cofrgenet::<name>_backward`` from their bodies.

    ``forward(*inputs)``: the op; its first ``tensors`` arguments are the tensors that
    have gradients (None allowed), the rest options (floats, bools, strings); its
    annotations give the schema. ``backward(*tensor_inputs, grad_out, *options,
    *flags(needs))``, with ``needs`` one bool per tensor input (its gradient is wanted):
    one gradient per tensor input, or the gradient alone for a one-input op. ``fake`` and
    ``fake_backward`` take the same arguments and return empty outputs of the real
    shapes and strides. Forward ops save only their tensor inputs.
    """
    op = torch.library.custom_op(f"cofrgenet::{name}", forward, mutates_args=())
    op.register_fake(fake)
    backward_op = torch.library.custom_op(f"cofrgenet::{name}_backward", backward, mutates_args=())
    backward_op.register_fake(fake_backward)

    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs[:tensors])
        ctx.options = inputs[tensors:]

    def op_backward(ctx, grad_out: Tensor):
        continuant.check_first_order()
        saved = ctx.saved_tensors
        needs = _needs(ctx.needs_input_grad[:tensors], saved)
        grads = backward_op(*saved, grad_out, *ctx.options, *flags(needs))
        return _asked(grads, needs, ctx.options)

    op.register_autograd(op_backward, setup_context=setup_context)

    class Eager(torch.autograd.Function):
        """The op's bodies without the custom op dispatch (eager triton)."""

        @staticmethod
        def forward(ctx, *inputs):
            ctx.save_for_backward(*inputs[:tensors])
            ctx.options = inputs[tensors:]
            return forward(*inputs)

        @staticmethod
        @continuant.first_order_only
        def backward(ctx, grad_out: Tensor):
            saved = ctx.saved_tensors
            needs = _needs(ctx.needs_input_grad[:tensors], saved)
            grads = backward(*saved, grad_out, *ctx.options, *flags(needs))
            return _asked(grads, needs, ctx.options)

    Eager.__name__ = Eager.__qualname__ = "".join(w.title() for w in name.split("_"))
    return RegisteredOp(op, backward_op, Eager)


# ------------------------------------------------------------------- continued_fraction


def _cf_forward(a: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    """f~(a): a (..., d) -> (...) contiguous, a's dtype. ``exact`` only matters in backward."""
    if backend == "triton":
        return _kernels().continued_fraction_fwd(a, eps)
    return continuant.continued_fraction_value(a, eps, backend == "compiled").contiguous()


def _cf_backward(a: Tensor, grad_out: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    """d loss / d a, laid out like ``torch.empty_like(a)``."""
    if backend == "triton":
        return _kernels().continued_fraction_bwd(a, grad_out, eps, exact)
    return continuant.continued_fraction_grad(a, grad_out, eps, exact, backend == "compiled")


def _cf_fake(a, eps, exact, backend):
    return a.new_empty(a.shape[:-1])


def _cf_fake_backward(a, grad_out, eps, exact, backend):
    return torch.empty_like(a)


# ---------------------------------------------------------------------- pvariate_ladder


def _pv_forward(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
) -> Tensor:
    """p-variate ladders: x (..., p), weight (d, L, p), bias (d, L) -> (..., L) contiguous.

    floor 0: a_k = W_k x + b_k (the paper's); floor > 0: a_k = floor + softplus(W_k x + b_k).
    """
    _, a = continuant.pvariate_denominators(x, weight, bias, floor)
    return _cf_forward(a, eps, exact, backend)


def _pv_backward(
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
    """(grad_x, grad_weight, grad_bias), the denominators recomputed from x; one not
    asked for is an empty (0,) tensor."""
    u, a = continuant.pvariate_denominators(x, weight, bias, floor)
    a = continuant.cast(a, continuant.chain_dtype(a.dtype))  # fp16: d loss / d a in fp32
    grad_a = _cf_backward(a, grad_out.to(a.dtype).contiguous(), eps, exact, backend)
    grad_x, grad_w, grad_b = continuant.pvariate_backward(
        x, weight, bias, u, grad_a, floor, need_x, need_params
    )
    return _or_empty(grad_x, x), _or_empty(grad_w, weight), _or_empty(grad_b, weight)


def _pv_fake(x, weight, bias, eps, exact, floor, backend):
    return x.new_empty((*x.shape[:-1], weight.shape[1]))


def _pv_fake_backward(x, weight, bias, grad_out, eps, exact, floor, backend, need_x, need_params):
    return _fake_ladder_grads(x, weight, bias, need_x, need_params)


# -------------------------------------------------------------------- univariate_ladder


def _ladder_forward(
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
    compiled = backend == "compiled"
    return continuant.univariate_ladder_value(x, weight, bias, eps, compiled, floor).contiguous()


def _ladder_backward(
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
    """(grad_x, grad_weight, grad_bias); one not asked for is an empty (0,) tensor."""
    args = (x, weight, bias, grad_out, eps, exact, floor, need_x, need_params)
    if backend == "triton":
        grad_x, grad_w, grad_b = _kernels().univariate_ladder_bwd(*args)
    else:
        grad_x, grad_w, grad_b = continuant.univariate_ladder_grads(*args, backend == "compiled")
        grad_x = None if grad_x is None else grad_x.contiguous()
    return _or_empty(grad_x, x), _or_empty(grad_w, weight), _or_empty(grad_b, weight)


def _ladder_fake(x, weight, bias, eps, exact, floor, backend):
    return x.new_empty(x.shape)


def _fake_ladder_grads(x, weight, bias, need_x: bool, need_params: bool):
    """Fake (grad_x, grad_weight, grad_bias) of the ladder backward ops: shapes only."""
    grad_x = x.new_empty(x.shape) if need_x else _empty(x)
    grad_w = weight.new_empty(weight.shape) if need_params else _empty(weight)
    has_b = need_params and bias is not None
    grad_b = bias.new_empty(bias.shape) if has_b else _empty(weight)
    return grad_x, grad_w, grad_b


def _ladder_fake_backward(
    x, weight, bias, grad_out, eps, exact, floor, backend, need_x, need_params
):
    return _fake_ladder_grads(x, weight, bias, need_x, need_params)


# ---------------------------------------------- univariate / pvariate ladders with state
#
# The CPU backends inside torch.compile: the forward also returns 1 / K_d, the rescale
# counts and (exact mode) the clamp mask, which autograd keeps, so that the backward runs
# only the gradient recurrence, as the eager Functions do (the stateless ops rerun the
# forward recurrence: twice the ladder work of a compiled CAttnU). No (..., n, d) or
# (..., L, d) tensor: the p-variate backward recomputes its denominators, as eagerly.


def define_state_op(
    name: str,
    state: Callable,
    gradients: Callable,
    shapes: Callable[[Tensor, Tensor], tuple[tuple[int, ...], tuple[int, ...]]],
) -> tuple[Callable, Callable]:
    """Register ``cofrgenet::<name>_with_state`` and its ``_backward`` for a ladder op of
    (x, weight, bias, eps, exact, floor, backend), backends "torch" and "compiled".

    ``state(x, weight, bias, eps, exact, floor, compiled)`` returns (value, r, scale,
    clamped | None, rescaled), as the eager Function's forward keeps them;
    ``gradients(x, weight, bias, r, scale, clamped | None, grad_out, exact, floor,
    rescaled, need_x, need_params, compiled)`` the gradients of x, weight and bias (None
    where not asked for). ``shapes(x, weight)`` gives the shapes of the value and of the
    state (one entry per ladder unit) for the fake implementations.
    """

    def forward(
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        eps: float,
        exact: bool,
        floor: float,
        backend: str,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        value, r, scale, clamped, _ = state(
            x, weight, bias, eps, exact, floor, backend == "compiled"
        )
        if clamped is None:  # an op returns no None: paper mode's mask is empty
            clamped = torch.zeros(0, dtype=torch.bool, device=x.device)
        # Contiguous, as the fake outputs are (the p-variate state comes depth-major).
        return value.contiguous(), r.contiguous(), scale.contiguous(), clamped.contiguous()

    def backward(
        x: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        r: Tensor,
        scale: Tensor,
        clamped: Tensor,
        grad_out: Tensor,
        exact: bool,
        floor: float,
        backend: str,
        need_x: bool,
        need_params: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        # Scale counts are all zero unless the forward rescaled; the empty mask (paper
        # mode, or nothing to clamp: continuant.clamp_eps) is None again.
        grad_x, grad_w, grad_b = gradients(
            x, weight, bias, r, scale, clamped if clamped.numel() else None, grad_out, exact, floor,
            bool(scale.any()), need_x, need_params, backend == "compiled",
        )  # fmt: skip
        grad_x = None if grad_x is None else grad_x.contiguous()
        return _or_empty(grad_x, x), _or_empty(grad_w, weight), _or_empty(grad_b, weight)

    op = torch.library.custom_op(f"cofrgenet::{name}_with_state", forward, mutates_args=())
    backward_op = torch.library.custom_op(
        f"cofrgenet::{name}_with_state_backward", backward, mutates_args=()
    )

    @op.register_fake
    def _(x, weight, bias, eps, exact, floor, backend):
        value_shape, state_shape = shapes(x, weight)
        state = x.new_empty(state_shape, dtype=compute_dtype(x.dtype))
        masked = exact and continuant.clamp_eps(eps, floor) is not None
        clamped = x.new_empty(state_shape if masked else (0,), dtype=torch.bool)
        return x.new_empty(value_shape), state, torch.empty_like(state), clamped

    @backward_op.register_fake
    def _(x, weight, bias, r, scale, clamped, grad_out, exact, floor, backend, need_x, need_params):
        return _fake_ladder_grads(x, weight, bias, need_x, need_params)

    def setup_context(ctx, inputs, output) -> None:
        x, weight, bias, _, exact, floor, backend = inputs
        _, r, scale, clamped = output
        ctx.mark_non_differentiable(r, scale, clamped)
        ctx.save_for_backward(x, weight, bias, r, scale, clamped)
        ctx.options = (exact, floor, backend)

    def op_backward(ctx, grad_out: Tensor, *_state_grads):
        continuant.check_first_order()
        x, weight, bias, r, scale, clamped = ctx.saved_tensors
        needs = _needs(ctx.needs_input_grad[:3], (x, weight, bias))
        grads = backward_op(
            x, weight, bias, r, scale, clamped, grad_out, *ctx.options, *x_and_params(needs)
        )
        return _asked(grads, needs, range(4))

    op.register_autograd(op_backward, setup_context=setup_context)
    return op, backward_op


univariate_ladder_with_state_op, univariate_ladder_with_state_backward_op = define_state_op(
    "univariate_ladder",
    continuant.univariate_ladder_state,
    continuant.univariate_ladder_gradients,
    lambda x, weight: (x.shape, (x.numel() // x.shape[-1], x.shape[-1])),
)
pvariate_ladder_with_state_op, pvariate_ladder_with_state_backward_op = define_state_op(
    "pvariate_ladder",
    continuant.pvariate_ladder_state,
    continuant.pvariate_ladder_gradients,
    lambda x, weight: ((*x.shape[:-1], weight.shape[1]),) * 2,
)


# ----------------------------------------------------------------------- ladder_ensemble


def _ensemble_forward(
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


def _ensemble_backward(
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
        _or_empty(grad_w, weight),
        _or_empty(grad_b, weight),
        _or_empty(grad_v, mix),
    )


def _ensemble_fake(x, weight, bias, mix, eps, exact, floor):
    return x.new_empty(x.shape)


def _ensemble_fake_backward(x, weight, bias, mix, grad_out, eps, exact, floor, need_x, need_params):
    grad_v = mix.new_empty(mix.shape) if need_params else _empty(mix)
    return (*_fake_ladder_grads(x, weight, bias, need_x, need_params), grad_v)


# ------------------------------------------------------------------------ registration

_CF = define_op("continued_fraction", 1, _cf_forward, _cf_backward, _cf_fake, _cf_fake_backward)
_LADDER = define_op(
    "univariate_ladder",
    3,
    _ladder_forward,
    _ladder_backward,
    _ladder_fake,
    _ladder_fake_backward,
    x_and_params,
)
_PVARIATE = define_op(
    "pvariate_ladder",
    3,
    _pv_forward,
    _pv_backward,
    _pv_fake,
    _pv_fake_backward,
    x_and_params,
)
_ENSEMBLE = define_op(
    "ladder_ensemble",
    4,
    _ensemble_forward,
    _ensemble_backward,
    _ensemble_fake,
    _ensemble_fake_backward,
    x_and_params,
)

continued_fraction_op, continued_fraction_backward_op, TritonContinuedFraction = _CF
univariate_ladder_op, univariate_ladder_backward_op, TritonUnivariateLadder = _LADDER
ladder_ensemble_op, ladder_ensemble_backward_op, TritonLadderEnsemble = _ENSEMBLE
pvariate_ladder_op, pvariate_ladder_backward_op, TritonPvariateLadder = _PVARIATE


# ------------------------------------------------------------------------ entry points


def continued_fraction(a: Tensor, eps: float, exact: bool, backend: str) -> Tensor:
    """The custom op inside ``torch.compile``; eagerly, the triton Function (triton only)."""
    if torch.compiler.is_compiling() or backend != "triton":
        return continued_fraction_op(a, eps, exact, backend)
    return TritonContinuedFraction.apply(a, eps, exact, backend)


def pvariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
) -> Tensor:
    """p-variate ladders x (..., p), weight (d, L, p), bias (d, L) -> (..., L) as one custom op
    (its autograd inside the op). The CPU backends ("torch", "compiled") go through
    ``pvariate_ladder_with_state_op``, which keeps 1 / K_d for backward; the stateless
    ``pvariate_ladder_op`` serves triton, and on CPU it is the twin the tests hold the
    with-state op's values and state against (``tests/ops/op_cases.check_with_state_op``)."""
    if backend != "triton":  # the CPU backends keep their state for backward
        return pvariate_ladder_with_state_op(x, weight, bias, eps, exact, floor, backend)[0]
    if torch.compiler.is_compiling():
        return pvariate_ladder_op(x, weight, bias, eps, exact, floor, backend)
    return TritonPvariateLadder.apply(x, weight, bias, eps, exact, floor, backend)


def univariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    exact: bool,
    floor: float,
    backend: str,
) -> Tensor:
    """Univariate ladders x (..., n), weight/bias (d, n) -> (..., n) as one custom op; the
    backends as in :func:`pvariate_ladder`."""
    if backend != "triton":  # the CPU backends keep their state for backward
        return univariate_ladder_with_state_op(x, weight, bias, eps, exact, floor, backend)[0]
    if torch.compiler.is_compiling():
        return univariate_ladder_op(x, weight, bias, eps, exact, floor, backend)
    return TritonUnivariateLadder.apply(x, weight, bias, eps, exact, floor, backend)


def ladder_ensemble(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    mix: Tensor,
    eps: float,
    exact: bool,
    floor: float,
) -> Tensor:
    """The elementwise Cffn ensemble, triton only: x (..., p), weight/bias (d, L, p), mix
    (p, L) -> (..., p), the custom op under compile, the triton Function eagerly."""
    if torch.compiler.is_compiling():
        return ladder_ensemble_op(x, weight, bias, mix, eps, exact, floor)
    return TritonLadderEnsemble.apply(x, weight, bias, mix, eps, exact, floor)

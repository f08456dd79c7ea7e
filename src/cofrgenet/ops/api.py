"""Public continued-fraction ops: argument checks and the choice of implementation."""

from __future__ import annotations

import importlib.util
import math
from typing import NamedTuple

import torch
from torch import Tensor

from cofrgenet.environment import env_flag
from cofrgenet.ops import continuant, custom_ops
from cofrgenet.ops.literal import literal_continued_fraction, literal_univariate_ladder

#: Implementations: "literal" (nested form, d divisions, autograd), "continuant" (eager
#: recurrence + closed-form backward), "compiled" (the same under torch.compile),
#: "triton" (fused Triton kernels, CUDA), "auto".
IMPLS = ("auto", "literal", "continuant", "compiled", "triton")
GRAD_MODES = ("paper", "exact")

#: |K_d| below which ladder health counts a unit as near a pole: its gradients are
#: (K_{d-k} / K_d)^2, so 100x or more of a unit far from poles.
NEAR_POLE = 0.1


class LadderStats(NamedTuple):
    """Health of a batch of ladders (0-d float32 tensors).

    clamped: share of units whose |K_d| < eps (the clamp is active);
    near_pole: share of units with |K_d| < ``near`` (default :data:`NEAR_POLE`);
    min_abs_kd: the smallest |K_d|; max_abs_value: the largest |f~|.
    """

    clamped: Tensor
    near_pole: Tensor
    min_abs_kd: Tensor
    max_abs_value: Tensor


#: Below this many ladder units "auto" stays eager: compiling does not pay for tiny inputs.
AUTO_COMPILE_MIN_UNITS = 1 << 15


#: Whether the ``triton`` package is installed (looked up once, without importing it).
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (a constant: safe inside torch.compile)."""
    return _TRITON_INSTALLED


def resolve_impl(impl: str, units: int, device: torch.device) -> str:
    """The concrete implementation "auto" stands for, for ``units`` ladders on ``device``.

    CUDA: the Triton kernels (if triton is installed). CPU: the compiled continuant for
    inputs of at least AUTO_COMPILE_MIN_UNITS ladders, the eager continuant otherwise.
    Set COFRGENET_COMPILE=0 (or false, no, off) to never compile. No units at all (an
    empty batch) take the literal form, whatever ``impl``: its plain ops give the empty
    result and its graph, where the kernels' reshapes of nothing fail.
    """
    if units == 0:
        return "literal"
    if impl != "auto":
        return impl
    if device.type == "cuda" and triton_available():
        return "triton"
    if not env_flag("COFRGENET_COMPILE", True) or not continuant.compile_available():
        return "continuant"
    return "compiled" if units >= AUTO_COMPILE_MIN_UNITS else "continuant"


def _graph_backend(chosen: str) -> str:
    """The custom-op backend of a continuant implementation inside a compiled graph."""
    return "compiled" if chosen == "compiled" else "torch"


def check_ladder_options(eps: float, grad: str, impl: str) -> None:
    """ValueError for an ``eps``, ``grad`` or ``impl`` the ops refuse (the layers check
    theirs when built, not at their first forward)."""
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite number (the clamp on |K_d|), got {eps!r}")
    if grad not in GRAD_MODES:
        raise ValueError(f"unknown grad mode {grad!r}; choose one of {GRAD_MODES}")
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {IMPLS}")


def _check_floor(floor: float | None) -> float:
    """``floor`` as the kernels take it: 0.0 for the paper's linear denominators."""
    if floor is None:
        return 0.0
    if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
        raise ValueError(
            f"floor must be None (the paper's a_k = w x + b) or a positive number (a_k = "
            f"floor + softplus(w x + b), no poles), got {floor!r}"
        )
    return float(floor)


def positive_denominators(u: Tensor, floor: float) -> Tensor:
    """Partial denominators a = floor + softplus(u) > 0, elementwise; u: any shape.

    With every a_k >= floor > 0, every continuant is >= min(1, floor) (K_j >= K_{j-2}
    and K_0 = 1, K_1 >= floor), so f~ has no poles: 0 < f~ <= 1 / floor and
    |d f~ / d a_k| <= 1 / min(1, floor)^2. See docs/layers.md for what it costs.
    """
    _check_floating("u", u)
    return continuant.positive_link(u, _check_floor(floor))


def _check_triton(tensor: Tensor) -> None:
    """A clear error before launching Triton kernels where they cannot run."""
    if torch.compiler.is_compiling():  # fake tensors; the op itself checks at run time
        return
    if not triton_available():
        raise RuntimeError("impl='triton' needs the triton package (Linux, x86-64 or CUDA)")
    from cofrgenet.ops.triton.runtime import check_tensor

    check_tensor(tensor)


def _check_floating(name: str, tensor: Tensor) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")


def continued_fraction(
    a: Tensor, eps: float = 0.01, grad: str = "paper", impl: str = "auto"
) -> Tensor:
    """Continued fraction 1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)) over the last dimension.

    Args:
        a: (..., d) partial denominators, ``a[..., 0]`` = a_1 (outermost), d >= 1.
        eps: clamp on the final continuant, K_d -> sign(K_d) max(|K_d|, eps), sign(0) = +1.
        grad: "paper" (Proposition 1 with the clamped K_d) or "exact" (the true gradient
            of the clamped function; they differ only where the clamp is active).
        impl: "auto", "literal", "continuant", "compiled" or "triton" (see ``IMPLS``).
            Inside ``torch.compile`` the continuant and triton paths are custom ops
            (:mod:`cofrgenet.ops.custom_ops`): no graph break.

    Returns:
        (...) tensor of a's dtype: K_{d-1}(a_2..a_d) / clamp(K_d(a_1..a_d)).
    """
    _check_floating("a", a)
    check_ladder_options(eps, grad, impl)
    if a.dim() == 0 or a.shape[-1] == 0:
        raise ValueError(
            "continued_fraction needs at least one partial denominator on the last "
            f"dimension (d >= 1), got a of shape {tuple(a.shape)}"
        )
    chosen = resolve_impl(impl, a.numel() // a.shape[-1], a.device)
    if chosen == "literal":
        return literal_continued_fraction(a, eps)
    exact = grad == "exact"
    if chosen == "triton":
        _check_triton(a)
        return custom_ops.continued_fraction(a, float(eps), exact, "triton")
    if torch.compiler.is_compiling():
        return custom_ops.continued_fraction(a, float(eps), exact, _graph_backend(chosen))
    if not (torch.is_grad_enabled() and a.requires_grad):  # inference: skip autograd's cost
        return continuant.continued_fraction_value(a, float(eps), chosen == "compiled")
    return continuant.ContinuedFraction.apply(a, float(eps), exact, chosen == "compiled")


def _check_on_device_of_x(x: Tensor, **tensors: Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_ladder(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    _check_floating("x", x)
    _check_floating("weight", weight)
    if weight.dim() != 2 or weight.shape[0] == 0:
        raise ValueError(
            f"weight must have shape (d, n) with depth d >= 1, got {tuple(weight.shape)}"
        )
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x's last dimension must equal weight.shape[1] = {weight.shape[1]} (one ladder "
            f"per input coordinate), got x of shape {tuple(x.shape)}"
        )
    if bias is not None:
        _check_floating("bias", bias)
        if bias.shape != weight.shape:
            raise ValueError(
                f"bias must have weight's shape {tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
    _check_on_device_of_x(x, weight=weight, bias=bias)


def univariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    grad: str = "paper",
    impl: str = "auto",
    floor: float | None = None,
) -> Tensor:
    """Univariate ladders, one per input coordinate: a_k = weight[k] * x + bias[k].

    Args:
        x: (..., n) inputs.
        weight: (d, n) ladder weights; row k-1 multiplies x in the k-th partial denominator.
        bias: (d, n) or None, added to the partial denominators.
        eps, grad, impl: as in :func:`continued_fraction`.
        floor: None for the paper's a_k above; a positive number makes every partial
            denominator positive, a_k = floor + softplus(weight[k] * x + bias[k]) (see
            :func:`positive_denominators`): no poles.

    Returns:
        (..., n) tensor of x's dtype: f~(a_1, ..., a_d) elementwise. The continuant
        implementations keep no (..., n, d) tensor alive for backward.
    """
    _check_ladder(x, weight, bias)
    check_ladder_options(eps, grad, impl)
    link = _check_floor(floor)
    chosen = resolve_impl(impl, x.numel(), x.device)
    if chosen == "literal":
        return literal_univariate_ladder(x, weight, bias, eps, link)
    exact = grad == "exact"
    if chosen == "triton":
        _check_triton(x)
        return custom_ops.univariate_ladder(x, weight, bias, float(eps), exact, link, "triton")
    if torch.compiler.is_compiling():
        return custom_ops.univariate_ladder(
            x, weight, bias, float(eps), exact, link, _graph_backend(chosen)
        )
    needs_grad = any(t is not None and t.requires_grad for t in (x, weight, bias))
    if not (torch.is_grad_enabled() and needs_grad):  # inference: skip autograd's cost
        return continuant.univariate_ladder_value(
            x, weight, bias, float(eps), chosen == "compiled", link
        )
    return continuant.UnivariateLadder.apply(
        x, weight, bias, float(eps), exact, chosen == "compiled", link
    )


def _check_pvariate(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    _check_floating("x", x)
    _check_floating("weight", weight)
    if weight.dim() != 3 or 0 in weight.shape[:2]:
        raise ValueError(
            f"weight must have shape (d, L, p) with depth d >= 1 and L >= 1 ladders, got "
            f"{tuple(weight.shape)}"
        )
    depth, ladders, dim = weight.shape
    if x.dim() == 0 or x.shape[-1] != dim:
        raise ValueError(
            f"x's last dimension must equal weight.shape[2] = {dim} (the ladders' inputs), "
            f"got x of shape {tuple(x.shape)}"
        )
    if bias is not None:
        _check_floating("bias", bias)
        if bias.shape != (depth, ladders):
            raise ValueError(
                f"bias must have shape (d, L) = {(depth, ladders)}, got {tuple(bias.shape)}"
            )
    _check_on_device_of_x(x, weight=weight, bias=bias)


def pvariate_ladder(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    grad: str = "paper",
    impl: str = "auto",
    floor: float | None = None,
) -> Tensor:
    """L p-variate ladders per row: z[..., j] = f~(a_1, ..., a_d), a_k = W_k[j] . x + b_k[j].

    The ladders of Cffn (scalar) and CAttnM: one dot product with x per partial
    denominator, then the continued fraction.

    Args:
        x: (..., p) inputs.
        weight: (d, L, p); weight[k - 1, j] gives ladder j's k-th partial denominator.
        bias: (d, L) or None.
        eps, grad, impl: as in :func:`continued_fraction`.
        floor: as in :func:`univariate_ladder` (a_k = floor + softplus(W_k x + b_k)).

    Returns:
        (..., L) in x's dtype. The denominators are computed in x's dtype, outside
        autocast. The continuant implementations save x, the parameters and 1 / K_d
        (..., L), and backward recomputes the (..., L, d) denominators (one small matmul).
        triton computes them traceably (:class:`continuant.PvariateDenominators`, which
        inductor fuses with their link) and runs only the continued fraction as a
        kernel: autograd keeps the denominators and, with a floor, their linear parts
        (2 L d values a row, ~1% of a Cffn's activations) rather than pay a second matmul
        and a custom op's eager work in every layer's backward (the GPU step was
        host-bound: docs/ops.md). float16 inputs go through the fused op, which carries
        d loss / d a in float32.
    """
    _check_pvariate(x, weight, bias)
    check_ladder_options(eps, grad, impl)
    link = _check_floor(floor)
    units = x.numel() // x.shape[-1] * weight.shape[1]
    chosen = resolve_impl(impl, units, x.device)
    if chosen == "literal":
        _, a = continuant.pvariate_denominators(x, weight, bias, link)
        return literal_continued_fraction(a, eps)
    exact = grad == "exact"
    if chosen == "triton":
        _check_triton(x)
        if x.dtype == torch.float16:  # the fused op carries d loss / d a in float32
            return custom_ops.pvariate_ladder(x, weight, bias, float(eps), exact, link, "triton")
        a = continuant.PvariateDenominators.apply(x, weight, bias, link)  # kept, not recomputed
        return custom_ops.continued_fraction(a, float(eps), exact, "triton")
    if torch.compiler.is_compiling():
        return custom_ops.pvariate_ladder(
            x, weight, bias, float(eps), exact, link, _graph_backend(chosen)
        )
    compiled = chosen == "compiled"
    needs_grad = any(t is not None and t.requires_grad for t in (x, weight, bias))
    if not (torch.is_grad_enabled() and needs_grad):  # inference: skip autograd's cost
        return continuant.pvariate_ladder_value(x, weight, bias, float(eps), compiled, link)
    return continuant.PvariateLadder.apply(x, weight, bias, float(eps), exact, compiled, link)


def _check_ensemble(x: Tensor, weight: Tensor, bias: Tensor | None, mix: Tensor) -> None:
    for name, t in (("x", x), ("weight", weight), ("mix", mix)):
        _check_floating(name, t)
    if weight.dim() != 3 or weight.shape[0] == 0 or weight.shape[1] == 0:
        raise ValueError(
            f"weight must have shape (d, L, p) with depth d >= 1 and L >= 1 ladders, got "
            f"{tuple(weight.shape)}"
        )
    _, n_l, p = weight.shape
    if x.dim() == 0 or x.shape[-1] != p:
        raise ValueError(
            f"x's last dimension must equal weight.shape[2] = {p}, got x of shape {tuple(x.shape)}"
        )
    if mix.shape != (p, n_l):
        raise ValueError(f"mix must have shape (p, L) = {(p, n_l)}, got {tuple(mix.shape)}")
    if bias is not None:
        _check_floating("bias", bias)
        if bias.shape != weight.shape:
            raise ValueError(
                f"bias must have weight's shape {tuple(weight.shape)}, got {tuple(bias.shape)}"
            )
    _check_on_device_of_x(x, weight=weight, bias=bias, mix=mix)


def ladder_ensemble(
    x: Tensor,
    weight: Tensor,
    mix: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    grad: str = "paper",
    impl: str = "auto",
    floor: float | None = None,
) -> Tensor:
    """An ensemble of L univariate ladders per coordinate, mixed: the elementwise Cffn.

    y[..., i] = sum_j mix[i, j] f~(a_1, ..., a_d), a_k = weight[k, j, i] x[..., i] + bias[k, j, i]
    (or floor + softplus of that with ``floor``, as in :func:`univariate_ladder`).

    Args:
        x: (..., p) inputs (the gated x^ of a Cffn).
        weight: (d, L, p) ladder weights, depth first.
        mix: (p, L), the V of the Cffn.
        bias: (d, L, p) or None.
        eps, grad, impl: as in :func:`continued_fraction`.
        floor: as in :func:`univariate_ladder`.

    Returns:
        (..., p) in x's dtype. ``impl="triton"`` runs one fused kernel each way and never
        builds the (..., L p) repeated input nor the (..., L, p) ladder outputs; the other
        implementations run :func:`univariate_ladder` on x repeated L times, then mix.
    """
    _check_ensemble(x, weight, bias, mix)
    check_ladder_options(eps, grad, impl)
    link = _check_floor(floor)
    d, n_l, p = weight.shape
    chosen = resolve_impl(impl, x.numel() * n_l, x.device)
    if chosen == "triton":
        _check_triton(x)
        return custom_ops.ladder_ensemble(x, weight, bias, mix, float(eps), grad == "exact", link)
    repeated = x.unsqueeze(-2).expand(*x.shape[:-1], n_l, p).reshape(*x.shape[:-1], n_l * p)
    flat_bias = None if bias is None else bias.reshape(d, n_l * p)
    z = univariate_ladder(
        repeated,
        weight.reshape(d, n_l * p),
        flat_bias,
        eps=eps,
        grad=grad,
        impl=chosen,
        floor=floor,
    )
    return mix_ensemble(z.unflatten(-1, (n_l, p)), mix).to(x.dtype)  # as the fused kernel


def mix_ensemble(z: Tensor, mix: Tensor) -> Tensor:
    """sum_j mix[:, j] * z[..., j, :]: ladder outputs z (..., L, p), mix (p, L) -> (..., p).

    A broadcast product summed over L. ``einsum("...lp,pl->...p")`` lowers this to p
    batched (rows, L) x (L, 1) products after transposing copies: on CPU about 15x slower
    forward and 8x slower forward and backward at (2048, 3, 256). Computed in the wider
    of the two dtypes, as any elementwise op (not cast down under autocast).
    """
    return (z * mix.t()).sum(-2)


def denominator_stats(a: Tensor, eps: float = 0.01, near: float = NEAR_POLE) -> LadderStats:
    """Ladder health of partial denominators a: (..., d), one ladder per leading index.

    Returns a :class:`LadderStats` of 0-d float32 tensors (see there); no gradient.
    """
    _check_floating("a", a)
    work = a.detach().to(torch.float64).reshape(-1, a.shape[-1]).t()
    return LadderStats(*continuant.denominator_stats(work.__getitem__, work.shape[0], eps, near))


def ladder_denominator_stats(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    floor: float | None = None,
    near: float = NEAR_POLE,
) -> LadderStats:
    """:func:`denominator_stats` of univariate ladders (x: (..., n), weight/bias: (d, n))."""
    _check_ladder(x, weight, bias)
    x2 = x.detach().to(torch.float64).reshape(-1, x.shape[-1])
    b = None if bias is None else bias.detach().double()
    coefficient = continuant.ladder_coefficient(
        x2, weight.detach().double(), b, _check_floor(floor)
    )
    return LadderStats(*continuant.denominator_stats(coefficient, weight.shape[0], eps, near))


def pvariate_denominator_stats(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    eps: float = 0.01,
    floor: float | None = None,
    near: float = NEAR_POLE,
) -> LadderStats:
    """:func:`denominator_stats` of p-variate ladders (x: (..., p), weight: (d, L, p),
    bias: (d, L)), their partial denominators built as :func:`pvariate_ladder` builds them."""
    _check_pvariate(x, weight, bias)
    with torch.no_grad():
        _, a = continuant.pvariate_denominators(x, weight, bias, _check_floor(floor))
    return denominator_stats(a, eps, near)

"""Shared inputs, references and implementation lists of the op suites (tests/ops/).

Each op has one suite (``test_continued_fraction.py``, ``test_univariate_ladder.py``,
``test_ladder_ensemble.py``) that runs every implementation on the same inputs against
the float64 references of :mod:`cofrgenet.ops.reference`. ``triton`` is one of them: on
a machine without a GPU its kernels run in Triton's interpreter on CPU tensors
(tests/conftest.py sets ``TRITON_INTERPRET=1``), with a GPU on CUDA (the ``on`` fixture of
tests/ops/conftest.py); the other implementations run on CPU. Shapes are small (the
interpreter is slow) but not multiples of the kernels' block sizes.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cofrgenet.ops.reference import (
    ladder_denominators,
    reference_continued_fraction,
    reference_exact_grad,
    reference_paper_grad,
    reference_univariate_ladder,
    suffix_continuants,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None

#: Every implementation a test can pick by name (``"auto"`` resolves to one of them).
IMPLS = ("literal", "continuant", "compiled", "triton")
#: The implementations that clamp only K_d and run the closed-form backward of both grad
#: modes. ``literal`` clamps each of its d denominators and differentiates by autograd,
#: so it agrees with the others only away from poles of every level.
CLAMPING = ("continuant", "compiled", "triton")
#: The custom-op backend (:mod:`cofrgenet.ops.custom_ops`) each implementation runs.
BACKEND = {"continuant": "torch", "compiled": "compiled", "triton": "triton"}
HALF = (torch.bfloat16, torch.float16)
HALF_IDS = ("bf16", "fp16")


def impl_param(impl: str, *more, id: str | None = None):
    """A pytest parameter set starting with ``impl``; triton skips where it is missing."""
    marks = ()
    if impl == "triton" and not HAS_TRITON:
        marks = pytest.mark.skip(reason="the triton package is not installed")
    return pytest.param(impl, *more, marks=marks, id=id)


def impls(*names: str) -> list:
    """pytest parameters for ``impl`` (default: every one of IMPLS)."""
    return [impl_param(n) for n in names or IMPLS]


def half_tol(dtype: torch.dtype) -> float:
    """Forward tolerance of a half-precision input whose p-variate denominators are rounded
    to it (gradients get twice this): loose, see :func:`half_ulps` for the tight check."""
    return 1e-2 if dtype == torch.bfloat16 else 2e-3


def ulps_off(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> float:
    """max |got - want| in units in the last place of ``dtype`` at each |want| (float64):
    ``want`` correctly rounded to ``dtype`` is 0.5 off. NaN anywhere fails any bound."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    info = torch.finfo(dtype)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp_min(info.tiny)))) * info.eps
    return ((got - want).abs() / ulp).max().item()


def half_ulps(impl: str, on: torch.device, dtype: torch.dtype) -> float:
    """The :func:`ulps_off` a half-precision op may be: computed in float32 and rounded
    once, values and gradients are 0.5 off, p-variate gradients (sums of terms rounded to
    the half dtype) up to 1.03; computed in the half dtype, 1.8 to 6 (the compiled
    p-variate ladder's 1.5 hides in its rounding). Triton's interpreter truncates to
    bfloat16 (triton.runtime.interpreter._convert_float, no rounding mode): 1 more."""
    truncates = impl == "triton" and on.type == "cpu" and dtype == torch.bfloat16
    return 2.6 if truncates else 1.6


def check_half_ulps(out, leaves, reference, names, impl, on, dtype) -> None:
    """``out`` and the gradients of ``out.sum()`` w.r.t. ``leaves`` (already computed)
    within :func:`half_ulps` of ``reference`` run on float64 copies of the leaves."""
    ref_leaves = float64_leaves(*leaves)
    ref = reference(*ref_leaves)
    ref.sum().backward()
    bound = half_ulps(impl, on, dtype)
    assert ulps_off(out, ref, dtype) < bound
    for name, got, want in zip(names, leaves, ref_leaves, strict=True):
        assert ulps_off(got.grad, want.grad, dtype) < bound, name


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, on CPU in float64 (NaN anywhere fails any bound)."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def assert_close_where_normal(got: torch.Tensor, want: torch.Tensor, rtol: float) -> torch.Tensor:
    """``got`` within ``rtol`` of ``want`` element by element, wherever ``want`` is a
    normal float32 number; returns that mask. Gradients of deep ladders span many orders
    of magnitude, so :func:`rel_err`, relative to the largest, would never look at the
    deep partial denominators' gradients."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    normal = want.abs() > 1e-30
    torch.testing.assert_close(got[normal], want[normal], rtol=rtol, atol=0)
    return normal


def assert_close_to_magnitude(got, want, magnitude, rtol: float, name: str = "") -> None:
    """|got - want| <= rtol * magnitude element by element, ``magnitude`` the sum of the
    absolute values of the terms that make up ``want`` (what rounding errors scale with).
    Every element is checked relative to its own size, unless a sum cancelled: there
    relative to its terms. :func:`rel_err`, relative to the largest element of values
    and gradients that reach 1e5 on poles, lets almost any error of the others pass."""
    got, want, magnitude = (t.detach().cpu().double() for t in (got, want, magnitude))
    off = (got - want).abs()
    bad = ~(off <= rtol * magnitude)  # NaN fails
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {bad.numel()} elements off by more than {rtol} of "
        f"their terms' magnitude (worst {(off / magnitude).nan_to_num(float('inf')).max():.3g})"
    )


def upstream_like(shape, device, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    """A fixed random upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


def require_grad(*tensors):
    """The tensors (None passes), each set to require grad."""
    return [None if t is None else t.requires_grad_() for t in tensors]


def float64_leaves(*tensors):
    """Detached float64 CPU copies that require grad: the reference's inputs."""
    return [None if t is None else t.detach().cpu().double().requires_grad_() for t in tensors]


def check_float64_op(op, tensors, args, reference, **reference_kwargs) -> None:
    """``op(*tensors, *args)`` in float64 (copies of ``tensors``): values and the gradients
    of its sum within 1e-12 of ``reference(*tensors, **reference_kwargs)``'s."""
    leaves = [t.detach().double().requires_grad_() for t in tensors]
    out = op(*leaves, *args)
    out.sum().backward()
    ref_leaves = float64_leaves(*leaves)
    ref = reference(*ref_leaves, **reference_kwargs)
    ref.sum().backward()
    assert rel_err(out, ref) < 1e-12
    for got, want in zip(leaves, ref_leaves, strict=True):
        assert rel_err(got.grad, want.grad) < 1e-12


# --------------------------------------------------------------- partial denominators


def away_from_poles(*shape: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    """Positive partial denominators in [0.5, 2.5): every continuant >= 1, no pole nearby."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)


def near_poles(rows: int, d: int, eps: float, seed: int = 0) -> torch.Tensor:
    """float64 partial denominators with |K_d| = |delta| < eps by construction (clamped).

    K_d = a_1 K(a_2..a_d) + K(a_3..a_d), so a_1 = -K(a_3..a_d) / K(a_2..a_d) + delta / K(a_2..a_d).
    """
    a = away_from_poles(rows, d, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    delta = (torch.rand(rows, generator=g).double() - 0.5) * eps
    if d == 1:
        a[:, 0] = delta
    else:
        tail = suffix_continuants(a[:, 1:])
        a[:, 0] = -tail[-2] / tail[-1] + delta / tail[-1]
    # A guard on the construction, so that a test of the clamp cannot become vacuous.
    assert (suffix_continuants(a)[-1].abs() < eps).all(), "near_poles built unclamped units"
    return a


def overflowing(rows: int, d: int, seed: int = 7) -> torch.Tensor:
    """|a| in [50, 150) with random signs: for d = 32, K_d ~ 1e64 overflows float32."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.rand(rows, d, generator=g) * 100 + 50
    return magnitude * torch.where(torch.rand(rows, d, generator=g) < 0.5, -1.0, 1.0)


# -------------------------------------------------------------------------- ladders


def ladder_inputs(rows, n, d, device, bias=True, seed=0, dtype=torch.float32):
    """x in [0.5, 1.5), positive weights and biases: no pole of any level."""
    x = (torch.rand(rows, n, generator=torch.Generator().manual_seed(seed)) + 0.5).to(dtype)
    w = away_from_poles(d, n, dtype=dtype, seed=seed + 1)
    b = away_from_poles(d, n, dtype=dtype, seed=seed + 2) if bias else None
    return [None if t is None else t.to(device) for t in (x, w, b)]


def signed_ladder_inputs(lead, n, d, device, bias=True, seed=4, dtype=torch.float32):
    """Signed inputs, weights and biases (for positive denominators, ``floor`` > 0): the
    paper's linear denominators would cross poles here."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, n, generator=g) * 3
    w = torch.randn(d, n, generator=g)
    b = torch.randn(d, n, generator=g) if bias else None
    return [None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, b)]


def ladder_overflow_inputs(d: int, device):
    """Ladders whose K_d overflows float32: d = 16 with a ~ 1e3 (K_d ~ 1e50), or d = 32
    with a ~ 100 (K_d ~ 1e64). Returns x, weight, bias (x: (8, 16))."""
    scale = 1000 if d == 16 else 50
    g = torch.Generator().manual_seed(d)
    x = torch.rand(8, 16, generator=g) * scale + scale
    w = torch.rand(d, 16, generator=g) + 1
    b = torch.rand(d, 16, generator=g)
    a = ladder_denominators(x.double(), w.double(), b.double())
    # A guard on the construction: these inputs exercise rescaling.
    assert (suffix_continuants(a)[-1].abs() > torch.finfo(torch.float32).max).all()
    return [t.to(device) for t in (x, w, b)]


def half_exact_pvariate_inputs(rows, n_l, d, device, dtype, seed=6):
    """x (rows, 4), weight (d, L, 4), bias (d, L) on grids (x in 1/4, W in 1/32, b in
    1/128) whose denominators W_k x + b_k are multiples of 1/128 in [0.5, 2): exact in
    bfloat16 and float16, so that computing them in x's dtype (as the ops do) rounds
    nothing and the float64 reference sees the same ladders."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, 7, (rows, 4), generator=g) / 4
    w = torch.randint(1, 3, (d, n_l, 4), generator=g) / 32
    b = torch.randint(64, 192, (d, n_l), generator=g) / 128
    a = torch.einsum("np,klp->nlk", x.double(), w.double()) + b.double().t()
    # A guard on the construction: the denominators need no rounding.
    assert torch.equal(a.to(dtype).double(), a) and (a >= 0.5).all() and (a < 2).all()
    return [t.to(device=device, dtype=dtype) for t in (x, w, b)]


# ------------------------------------------------------------------------- ensembles


def ensemble_inputs(rows, p, n_l, d, device, bias=True, seed=0, dtype=torch.float64):
    """x, weight (d, L, p), mix (p, L), bias: random x and W, so some ladders sit on
    poles (clamped) and the grad modes differ."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, p, generator=g, dtype=torch.float64)
    w = torch.randn(d, n_l, p, generator=g, dtype=torch.float64) * 0.5
    b = 1 + 0.1 * torch.randn(d, n_l, p, generator=g, dtype=torch.float64) if bias else None
    v = torch.randn(p, n_l, generator=g, dtype=torch.float64)
    return [None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, v, b)]


def ensemble_overflow_inputs(device):
    """x (8, 16), weight and bias (16, 2, 16), mix (16, 2), float32: ladder 0 is
    :func:`ladder_overflow_inputs` (d = 16, K_d ~ 1e50 overflows float32), ladder 1 its
    weights / 1e3 (a ~ 1 to 5, K_d < 1e12): rescaled tiles holding units that need no
    rescaling."""
    x, w, b = ladder_overflow_inputs(16, "cpu")
    weight = torch.stack([w, w * 1e-3], 1)
    bias = torch.stack([b, b], 1)
    mix = torch.randn(16, 2, generator=torch.Generator().manual_seed(5))
    a = ladder_denominators(x.double(), w.double() * 1e-3, b.double())
    # A guard on the construction: ladder 1 needs no rescaling.
    assert (suffix_continuants(a)[-1].abs() < 1e12).all()
    return [t.to(device) for t in (x, weight, mix, bias)]


def clamped_units(a: torch.Tensor, eps: float = 0.01) -> torch.Tensor:
    """The units of partial denominators a (..., d) whose |K_d| < eps, in float64."""
    return suffix_continuants(a.detach().cpu().double())[-1].abs() < eps


def onto_poles(x, weight, bias, eps=0.01, units=4, seed=0):
    """(weight, bias) with ladder 0 of the first ``units`` channels moved onto poles in
    x's first row (partial denominators from :func:`near_poles`): clamped units whatever
    the random draw, so that the grad modes differ."""
    d = weight.shape[0]
    a = near_poles(units, d, eps, seed=seed).t().to(weight)  # (d, units)
    x0 = x.reshape(-1, x.shape[-1])[0, :units]
    weight = weight.clone()
    if bias is None:
        weight[:, 0, :units] = a / x0
        return weight, None
    bias = bias.clone()
    bias[:, 0, :units] = a - weight[:, 0, :units] * x0
    return weight, bias


def ensemble_clamped_units(x, weight, bias, eps=0.01) -> int:
    """How many of the ensemble's ladder units (row, ladder, channel) have |K_d| < eps."""
    x, weight = x.detach().cpu().double(), weight.detach().cpu().double()
    d, n_l, p = weight.shape
    repeated = x.unsqueeze(-2).expand(*x.shape[:-1], n_l, p).reshape(*x.shape[:-1], n_l * p)
    b2 = None if bias is None else bias.detach().cpu().double().reshape(d, n_l * p)
    a = ladder_denominators(repeated, weight.reshape(d, n_l * p), b2)
    return int(clamped_units(a, eps).sum())


def ensemble_reference(x, weight, mix, bias, upstream, grad="paper", eps=0.01, magnitudes=False):
    """Output and (x, weight, mix, bias) gradients of the ensemble, float64, by hand.

    The composite: L p univariate ladders on x repeated L times, mixed by V; per-unit
    gradients from the closed forms of the grad mode, then the chain rule. With
    ``magnitudes``, each of them as the sum of the absolute values of its terms (|V z|
    over ladders, |d loss / d a_k w_k| over ladders and depths, ...): the scale of its
    rounding errors, for :func:`assert_close_to_magnitude`.
    """
    x, weight, mix, upstream = (t.detach().cpu().double() for t in (x, weight, mix, upstream))
    d, n_l, p = weight.shape
    lead = x.shape[:-1]
    repeated = x.unsqueeze(-2).expand(*lead, n_l, p).reshape(*lead, n_l * p)
    w2 = weight.reshape(d, n_l * p)
    b2 = None if bias is None else bias.detach().cpu().double().reshape(d, n_l * p)
    a = ladder_denominators(repeated, w2, b2)  # (..., L p, d)
    value = reference_continued_fraction(a, eps).unflatten(-1, (n_l, p))  # (..., L, p)
    per_unit = (reference_exact_grad if grad == "exact" else reference_paper_grad)(a, eps)
    if magnitudes:
        terms = (value, per_unit, mix, upstream, repeated, w2)
        value, per_unit, mix, upstream, repeated, w2 = (t.abs() for t in terms)
    up = (upstream.unsqueeze(-2) * mix.t()).flatten(-2)  # (..., L p): upstream of ladder j
    t = per_unit * up.unsqueeze(-1)  # (..., L p, d): d loss / d a_k
    sum_lead = tuple(range(len(lead)))
    grads = {
        "out": torch.einsum("...lp,pl->...p", value, mix),
        "x": (t * w2.t()).sum(-1).unflatten(-1, (n_l, p)).sum(-2),
        "weight": (t * repeated.unsqueeze(-1)).sum(sum_lead).t().reshape(d, n_l, p),
        "mix": torch.einsum("...p,...lp->pl", upstream, value),
    }
    if bias is not None:
        grads["bias"] = t.sum(sum_lead).t().reshape(d, n_l, p)
    return grads


def univariate_reference(x, weight, bias, upstream, grad="paper", eps=0.01):
    """Output and (x, weight, bias) gradients of univariate ladders, float64, from the
    closed forms (:func:`ensemble_reference` with one ladder mixed by 1). They keep the
    deep gradients (~1e-100 when K_d ~ 1e50) that autograd through the float64
    reference loses to its own rounding (~1e-19)."""
    n = x.shape[-1]
    bias = None if bias is None else bias.unsqueeze(1)
    mix = torch.ones(n, 1, dtype=torch.float64)
    want = ensemble_reference(x, weight.unsqueeze(1), mix, bias, upstream, grad, eps)
    want["weight"] = want["weight"].squeeze(1)
    if bias is not None:
        want["bias"] = want["bias"].squeeze(1)
    del want["mix"]
    return want


def positive_ensemble_reference(x, w, v, b, floor):
    """The positive-denominator ensemble in float64 with plain autograd."""
    d, n_l, p = w.shape
    repeated = x.unsqueeze(-2).expand(*x.shape[:-1], n_l, p).flatten(-2)
    b2 = None if b is None else b.reshape(d, n_l * p)
    z = reference_univariate_ladder(repeated, w.reshape(d, n_l * p), b2, floor=floor)
    return torch.einsum("...lp,pl->...p", z.unflatten(-1, (n_l, p)), v)


# ------------------------------------------------------------- compile and custom ops


def outputs_and_grads(fn, leaves):
    """fn's output and the gradients of its squared sum for fresh copies of ``leaves``."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    out.square().sum().backward()
    return out.detach(), [t.grad for t in leaves]


def assert_same(eager, compiled, rtol=1e-6, atol=1e-6):
    torch.testing.assert_close(compiled[0], eager[0], rtol=rtol, atol=atol)
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def check_with_state_op(op, stateless_op, cases, backend, eps=0.01):
    """A ladder op with state against its stateless twin, on (x, w, b, grad, dtype) cases
    (float32 ones overflow, exact ones have clamped units): the same values bit for bit,
    the same gradients, and state that says so (rescale counts, clamp mask)."""
    for x, w, b, grad, dtype in cases:
        exact = grad == "exact"
        with_state = [t.to(dtype).requires_grad_() for t in (x, w, b)]
        stateless = [t.to(dtype).requires_grad_() for t in (x, w, b)]
        out, _, scale, clamped = op(*with_state, eps, exact, 0.0, backend)
        assert bool(scale.any()) == (dtype == torch.float32) and bool(clamped.any()) == exact
        want = stateless_op(*stateless, eps, exact, 0.0, backend)
        upstream = upstream_like(out.shape, "cpu", dtype=dtype)
        (out * upstream).sum().backward()
        (want * upstream).sum().backward()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        for got, ref in zip(with_state, stateless, strict=True):
            torch.testing.assert_close(got.grad, ref.grad, rtol=1e-6, atol=0)


def compiles_fullgraph(fn, leaves, backend="aot_eager"):
    """fn under torch.compile(fullgraph=True) equals fn eagerly, forward and backward
    (``aot_eager``: dynamo and AOTAutograd, no code generation). A graph break raises."""
    torch.compiler.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    assert_same(outputs_and_grads(fn, leaves), outputs_and_grads(compiled, leaves))

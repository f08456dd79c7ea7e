"""pvariate_ladder: every implementation against the float64 reference.

literal, continuant, compiled and triton run on the same inputs (see op_cases.py), with
the paper's linear denominators a_k = W_k x + b_k and with positive ones (``floor``).
The op keeps no (..., L, d) tensor for backward: that is tested here too.
"""

from __future__ import annotations

import re

import pytest
import torch

from cofrgenet.ops import custom_ops as ops
from cofrgenet.ops import pvariate_ladder
from cofrgenet.ops.reference import (
    reference_positive_denominators,
    reference_pvariate_ladder,
    suffix_continuants,
)
from op_cases import (
    BACKEND,
    CLAMPING,
    HALF,
    HALF_IDS,
    IMPLS,
    check_float64_op,
    check_half_ulps,
    check_with_state_op,
    clamped_units,
    compiles_fullgraph,
    float64_leaves,
    half_exact_pvariate_inputs,
    half_tol,
    impl_param,
    impls,
    near_poles,
    rel_err,
    require_grad,
    upstream_like,
)

IMPL_GRADS = [
    impl_param(impl, grad, id=f"{impl}-{grad}")
    for impl in IMPLS
    for grad in ("paper", "exact")
    if not (impl == "literal" and grad == "exact")
]


def pvariate_inputs(lead, p, n_l, d, device, bias=True, signed=False, seed=0, dtype=None):
    """x (*lead, p), weight (d, L, p), bias (d, L). Unsigned: x in [0.5, 1.5) and positive
    weights and biases, so every a_k > 0 (no pole of any level, the paper's denominators
    are safe); signed: Gaussian, for positive denominators (``floor``)."""
    g = torch.Generator().manual_seed(seed)
    if signed:
        x = torch.randn(*lead, p, generator=g)
        w = torch.randn(d, n_l, p, generator=g) / p**0.5
        b = torch.randn(d, n_l, generator=g)
    else:
        x = torch.rand(*lead, p, generator=g) + 0.5
        w = (torch.rand(d, n_l, p, generator=g) + 0.5) / p
        b = torch.rand(d, n_l, generator=g) + 0.5
    tensors = (x, w, b if bias else None)
    return [
        None if t is None else t.to(device=device, dtype=dtype or torch.float32) for t in tensors
    ]


def check_against_reference(out, leaves, upstream, tol, floor=None):
    """out and the gradients of (out * upstream).sum() w.r.t. (x, weight, bias) within
    ``tol`` (gradients 2 tol below float32) of the float64 reference."""
    ref_leaves = float64_leaves(*leaves)
    ref = reference_pvariate_ladder(*ref_leaves, floor=floor)
    (ref * upstream.cpu().double()).sum().backward()
    assert out.shape == ref.shape
    assert rel_err(out, ref) < tol
    grad_tol = tol if tol <= 1e-5 else 2 * tol
    for name, got, want in zip(("x", "weight", "bias"), leaves, ref_leaves, strict=True):
        if got is not None:
            assert rel_err(got.grad, want.grad) < grad_tol, name


# ------------------------------------------------------------------- forward and backward


@pytest.mark.parametrize("impl,grad", IMPL_GRADS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("d", [1, 2, 5, 8])
def test_matches_reference(impl, grad, on, d, bias):
    x, w, b = require_grad(*pvariate_inputs((2, 35), 19, 3, d, on, bias=bias, seed=d))
    out = pvariate_ladder(x, w, b, grad=grad, impl=impl)
    upstream = upstream_like(out.shape, on, seed=2)
    (out * upstream).sum().backward()
    assert out.shape == (2, 35, 3) and out.dtype == torch.float32
    check_against_reference(out, (x, w, b), upstream, 1e-5)


@pytest.mark.parametrize("impl,grad", IMPL_GRADS)
@pytest.mark.parametrize(
    "p,ladders", [(1, 3), (24, 1), (1, 1)], ids=["one-input", "one-ladder", "one-each"]
)
def test_degenerate_shapes(impl, grad, on, p, ladders):
    """One input (p = 1), one ladder (L = 1) or both: size-1 dims of the matmuls and of
    the (..., L) output that a squeeze or a reshape could get wrong, float64 against the
    reference."""
    x, w, b = require_grad(*pvariate_inputs((37,), p, ladders, 3, on, seed=3, dtype=torch.float64))
    out = pvariate_ladder(x, w, b, grad=grad, impl=impl)
    upstream = upstream_like(out.shape, on, seed=2, dtype=torch.float64)
    (out * upstream).sum().backward()
    assert out.shape == (37, ladders) and out.dtype == torch.float64
    check_against_reference(out, (x, w, b), upstream, 1e-10)


@pytest.mark.parametrize("impl", impls())
@pytest.mark.parametrize("d", [1, 3, 5])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_positive_matches_reference(impl, on, d, bias):
    """floor > 0: a_k = floor + softplus(W_k x + b_k) on signed inputs (no poles anywhere)."""
    x, w, b = require_grad(*pvariate_inputs((37,), 24, 5, d, on, bias, signed=True, seed=d))
    out = pvariate_ladder(x, w, b, impl=impl, floor=0.5)
    upstream = upstream_like(out.shape, on, seed=3)
    (out * upstream).sum().backward()
    check_against_reference(out, (x, w, b), upstream, 1e-5, floor=0.5)


@pytest.mark.parametrize("which", ["x", "params"])
@pytest.mark.parametrize("impl", impls())
def test_gradients_asked_for(impl, on, which):
    x, w, b = pvariate_inputs((9,), 11, 2, 4, on, seed=5)
    if which == "x":
        x.requires_grad_()
    else:
        require_grad(w, b)
    pvariate_ladder(x, w, b, impl=impl, floor=0.5).sum().backward()
    xr, wr, br = float64_leaves(x, w, b)
    reference_pvariate_ladder(xr, wr, br, floor=0.5).sum().backward()
    if which == "x":
        assert w.grad is None and rel_err(x.grad, xr.grad) < 1e-5
    else:
        assert x.grad is None and rel_err(w.grad, wr.grad) < 1e-5
        assert rel_err(b.grad, br.grad) < 1e-5


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", impls())
def test_gradcheck_float64(impl, on, grad):
    x, w, b = (t.double().requires_grad_() for t in pvariate_inputs((3,), 5, 2, 3, on, seed=6))
    assert torch.autograd.gradcheck(
        lambda *t: pvariate_ladder(*t, grad=grad, impl=impl, floor=0.5), (x, w, b)
    )


@pytest.mark.parametrize("impl", impls())
def test_empty_inputs(impl, on):
    x, w, b = require_grad(*pvariate_inputs((0,), 4, 2, 3, on))
    out = pvariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert out.shape == (0, 2) and x.grad.shape == (0, 4)
    assert torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_a_floor_below_eps_clamps_gradients_too(impl, on, d):
    """floor 0.001 < eps 0.01, exact mode: biases -6.5 keep the denominators within 0.003
    of the floor, so that K_d < eps for odd d (clamped), beside unclamped ladders (biases
    1); values and gradients are the clamped function's, as the float64 reference's."""
    floor = 0.001
    x, w, b = pvariate_inputs((2, 5), 6, 4, d, on, signed=True, seed=d, dtype=torch.float64)
    w = w * 0.05
    b[:, :2], b[:, 2:] = -6.5, 1.0
    u = torch.einsum("...p,klp->...lk", x, w) + b.t()
    clamped = clamped_units(reference_positive_denominators(u, floor))
    assert clamped[..., :2].all() and not clamped[..., 2:].any()  # a guard on the inputs
    x, w, b = require_grad(x, w, b)
    out = pvariate_ladder(x, w, b, grad="exact", impl=impl, floor=floor)
    upstream = upstream_like(out.shape, on, seed=2, dtype=torch.float64)
    (out * upstream).sum().backward()
    check_against_reference(out, (x, w, b), upstream, 1e-10, floor=floor)


@pytest.mark.parametrize("impl", impls("continuant", "triton"))  # compiled: same kernels
def test_large_depth_stays_finite(impl, on):
    """a ~ 1000 at d = 16: K_d ~ 1e48 overflows float32 (the rescaled path, whose counts
    are then kept for backward)."""
    x, w, b = pvariate_inputs((9,), 8, 2, 16, on)
    x = x * 1000
    a = torch.einsum("np,klp->nlk", x.double(), w.double()) + b.double().t()
    assert (suffix_continuants(a.cpu())[-1] > torch.finfo(torch.float32).max).all()
    x, w, b = require_grad(x, w, b)
    out = pvariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-4)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", impls())
def test_half_precision(impl, on, dtype):
    """Denominators exact in the half dtype, the ladders computed in float32 and rounded
    once: each value and gradient within half_ulps of the float64 reference (computing
    in the half dtype puts x's gradient 2 or more ulps off)."""
    x, w, b = require_grad(*half_exact_pvariate_inputs(33, 3, 5, on, dtype))
    out = pvariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype
    names = ("x", "weight", "bias")
    check_half_ulps(out, (x, w, b), reference_pvariate_ladder, names, impl, on, dtype)


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", impls())
def test_float16_gradients_stay_finite_through_a_clamped_denominator(impl, on, grad):
    """a = (-1/4, 4): K_2 = 4 (-1/4) + 1 = 0 is clamped, and d loss / d a_1 = -(4/eps)^2
    = -1.6e5 in paper mode, past float16's 65504, while x's gradient, that times the
    weight 2^-10, is -156.25. It came out -inf: d loss / d a was rounded to float16
    before the chain rule. Each gradient as the same ladder's in float32 (the weight's
    own -1.6e5 is -inf in float16: a value past its range)."""
    weight = torch.tensor([[[2.0**-10]], [[0.0]]], device=on)  # (d, L, p) = (2, 1, 1)
    bias = torch.tensor([[-0.25 - 2.0**-10], [4.0]], device=on)  # exact in float16
    grads = {}
    for dtype in (torch.float32, torch.float16):
        x, w, b = require_grad(
            *(t.to(dtype, copy=True) for t in (torch.ones(1, 1, device=on), weight, bias))
        )
        pvariate_ladder(x, w, b, grad=grad, impl=impl).sum().backward()
        grads[dtype] = (x.grad.float(), w.grad.float(), b.grad.float())
    wide, half = grads[torch.float32], grads[torch.float16]
    assert torch.isfinite(wide[0]).all() and torch.isfinite(half[0]).all()
    torch.testing.assert_close(half[0], wide[0], rtol=2e-3, atol=0)
    fits = wide[1].abs() <= torch.finfo(torch.float16).max
    torch.testing.assert_close(half[1][fits], wide[1][fits], rtol=2e-3, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", impls())
def test_half_precision_rounded_denominators(impl, on, dtype):
    """Denominators W_k x + b_k computed in x's dtype round (by design): a loose bound."""
    x, w, b = require_grad(*pvariate_inputs((33,), 24, 3, 5, on, seed=6, dtype=dtype))
    out = pvariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype
    check_against_reference(out, (x, w, b), torch.ones(out.shape), half_tol(dtype))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
@pytest.mark.parametrize("impl", impls("continuant", "compiled", "triton"))
def test_autocast_denominators_are_not_rounded(impl, on, traced):
    """Under bf16 autocast the denominators are still computed in x's dtype (float32),
    in forward and in backward (recomputed or chained): float32 accuracy, float32
    gradients; also traced, where AOT autograd would put autocast on a plain-op
    backward (triton's denominators: 4e-3 relative error in x's gradient)."""
    x, w, b = require_grad(*pvariate_inputs((40,), 24, 3, 5, on, signed=True, seed=8))

    def ladders(*leaves):
        return pvariate_ladder(*leaves, impl=impl, floor=0.5)

    if traced:
        ladders = torch.compile(ladders, backend="aot_eager", fullgraph=True)
    with torch.autocast(on.type, dtype=torch.bfloat16):
        out = ladders(x, w, b)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == torch.float32
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-5, floor=0.5)


# ---------------------------------------------------------------- what backward keeps


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_keeps_no_partial_denominators_for_backward(impl, on):
    """The continuant paths save no (..., L, d) tensor (denominators, their linear parts,
    continuants): x, the parameters and 1 / K_d (..., L); backward recomputes the rest."""
    x, w, b = require_grad(*pvariate_inputs((6, 7), 16, 3, 5, on, signed=True))
    saved: list[torch.Size] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        out = pvariate_ladder(x, w, b, impl=impl, floor=0.5)
    assert sorted(saved) == sorted([x.shape, w.shape, b.shape, out.shape])
    out.sum().backward()
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-5, floor=0.5)


@pytest.mark.parametrize("impl", impls("triton"))
@pytest.mark.parametrize("floor", [0.5, None])
def test_triton_keeps_the_denominators_not_a_recompute(impl, on, floor):
    """triton keeps, besides x and the parameters (themselves, no copies), the
    denominators (and with a floor their linear parts: softplus's input): L d values a row
    each, far less than x, and backward needs no second matmul."""
    x, w, b = require_grad(*pvariate_inputs((6, 7), 16, 3, 5, on, signed=True))
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = pvariate_ladder(x, w, b, impl=impl, floor=floor)
    depth_sized = [t for t in saved if t.shape == (6, 7, 3, 5)]
    assert len(depth_sized) == (2 if floor else 1)
    others = {t.untyped_storage().data_ptr() for t in saved if t.shape != (6, 7, 3, 5)}
    assert others == {t.untyped_storage().data_ptr() for t in (x, w, b)}
    out.sum().backward()
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-5, floor=floor)


@pytest.mark.parametrize("impl", impls("triton"))
def test_triton_graph_holds_the_denominators_as_plain_ops(impl, on):
    """Traced, the triton path is a matmul and its link in the graph (for inductor to fuse)
    around one opaque continued-fraction op; float16 keeps the fused p-variate op."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    for dtype, opaque in (
        (torch.float32, "continued_fraction"),
        (torch.float16, "pvariate_ladder"),
    ):
        x, w, b = pvariate_inputs((2, 5), 12, 3, 4, on, signed=True, dtype=dtype)
        compiled = torch.compile(
            lambda *t: pvariate_ladder(*t, impl=impl, floor=0.5), backend=record, fullgraph=True
        )
        compiled(x, w, b)
        ops_called = set(re.findall(r"cofrgenet\.(\w+)\.default", graphs[-1]))
        assert ops_called == {opaque}, graphs[-1]
        assert ("softplus" in graphs[-1]) == (opaque == "continued_fraction")


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_inference_path_equals_the_autograd_path(impl):
    """Without grad, the continuant paths skip their autograd Function: the same bits for
    the paper's denominators; positive ones are evaluated by tail_value eagerly (the same
    values to rounding)."""
    x, w, b = pvariate_inputs((5, 6), 16, 3, 4, "cpu", signed=True, dtype=torch.float64)
    for floor in (None, 0.5):
        with torch.no_grad():
            plain = pvariate_ladder(x, w, b, impl=impl, floor=floor)
        tracked = pvariate_ladder(x.clone().requires_grad_(), w, b, impl=impl, floor=floor)
        tol = 1e-13 if floor and impl == "continuant" else 0.0
        torch.testing.assert_close(plain, tracked.detach(), rtol=tol, atol=0)


# ------------------------------------------------------------ the custom op, compiled


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_custom_op(impl, on):
    """The torch.library op of each backend (opcheck), with and without bias and floor,
    and its float64 values and gradients against the reference."""
    backend = BACKEND[impl]
    x, w, b = require_grad(*pvariate_inputs((2, 5), 12, 3, 4, on, signed=True))
    torch.library.opcheck(ops.pvariate_ladder_op, (x, w, b, 0.01, False, 0.5, backend))
    torch.library.opcheck(ops.pvariate_ladder_op, (x, w, None, 0.01, True, 0.5, backend))
    args = (0.01, False, 0.5, backend)
    check_float64_op(ops.pvariate_ladder_op, (x, w, b), args, reference_pvariate_ladder, floor=0.5)
    x, w, b = require_grad(*pvariate_inputs((2, 5), 12, 3, 4, on))
    torch.library.opcheck(ops.pvariate_ladder_op, (x, w, b, 0.01, True, 0.0, backend))


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_custom_op_with_state(impl):
    """The CPU backends' op inside torch.compile keeps 1 / K_d, the rescale counts and
    the clamp mask from forward (opcheck), and its values and gradients equal the
    stateless op's, in both grad modes and through the rescaled path."""
    backend = BACKEND[impl]
    op = ops.pvariate_ladder_with_state_op
    x, w, b = require_grad(*pvariate_inputs((2, 5), 12, 3, 4, "cpu", signed=True))
    torch.library.opcheck(op, (x, w, b, 0.01, False, 0.5, backend))
    torch.library.opcheck(op, (x, w, None, 0.01, True, 0.5, backend))
    eps, d = 0.01, 4
    a = near_poles(30, d, eps, seed=9)  # clamped units: the grad modes differ
    # p = 1, x = 1 and weights 0.5: a_k of ladder j is bias[k, j] + 0.5 = a[j, k].
    clamped_inputs = (torch.ones(3, 1, dtype=torch.float64), torch.full((d, 30, 1), 0.5))
    overflow = pvariate_inputs((9,), 8, 2, 16, "cpu")  # K_d ~ 1e48 overflows float32
    overflow[0] = overflow[0] * 1000
    f64, f32 = torch.float64, torch.float32
    cases = [
        (*clamped_inputs, a.t().contiguous() - 0.5, "exact", f64),
        (*clamped_inputs, a.t().contiguous() - 0.5, "paper", f64),
        (*overflow, "paper", f32),
    ]
    check_with_state_op(op, ops.pvariate_ladder_op, cases, backend, eps)


def test_compiled_graph_runs_the_ladder_recurrence_once():
    """Inside torch.compile the CPU backends keep the forward's state: the backward
    reruns no forward recurrence (the stateless op would, doubling the ladder work)."""
    x, w, b = require_grad(*pvariate_inputs((4, 6), 12, 3, 5, "cpu", signed=True))
    compiled = torch.compile(lambda *t: pvariate_ladder(*t, impl="continuant", floor=0.5))
    calls = []
    original = ops.continuant.continuant_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    compiled(x, w, b).sum().backward()  # compile first: tracing runs fake kernels only
    ops.continuant.continuant_forward = counting
    try:
        compiled(x, w, b).sum().backward()
    finally:
        ops.continuant.continuant_forward = original
    assert len(calls) == 1


@pytest.mark.parametrize("impl", impls("auto", "continuant", "triton"))
def test_compiles_fullgraph(impl, device):
    """No graph break (fullgraph=True), forward and backward, equal to eager."""
    if impl == "continuant" and device.type == "cuda":
        pytest.skip("the continuant path is covered on CPU")
    on = device if impl in ("auto", "triton") else torch.device("cpu")
    leaves = pvariate_inputs((2, 5), 12, 3, 4, on, signed=True)
    compiles_fullgraph(lambda *t: pvariate_ladder(*t, impl=impl, floor=0.5), leaves)


def test_errors_name_the_problem():
    x, w, b = pvariate_inputs((4,), 6, 2, 3, "cpu")
    with pytest.raises(ValueError, match=r"weight must have shape \(d, L, p\)"):
        pvariate_ladder(x, w[0], b)
    with pytest.raises(ValueError, match=r"x's last dimension must equal weight\.shape"):
        pvariate_ladder(x[:, :5], w, b)
    with pytest.raises(ValueError, match=r"bias must have shape \(d, L\)"):
        pvariate_ladder(x, w, b.t())
    with pytest.raises(ValueError, match="floor must be None"):
        pvariate_ladder(x, w, b, floor=-1.0)

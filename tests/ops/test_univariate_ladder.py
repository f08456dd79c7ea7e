"""univariate_ladder: every implementation against the float64 references.

literal, continuant, compiled and triton run on the same inputs (see op_cases.py), with
the paper's linear denominators a_k = w_k x + b_k and with positive ones (``floor``).
"""

from __future__ import annotations

import pytest
import torch

from cofrgenet.ops import custom_ops as ops
from cofrgenet.ops import univariate_ladder
from cofrgenet.ops.reference import (
    ladder_denominators,
    reference_continued_fraction,
    reference_exact_grad,
    reference_paper_grad,
    reference_positive_denominators,
    reference_univariate_ladder,
)
from op_cases import (
    BACKEND,
    CLAMPING,
    HALF,
    HALF_IDS,
    IMPLS,
    assert_close_where_normal,
    away_from_poles,
    check_float64_op,
    check_half_ulps,
    check_with_state_op,
    clamped_units,
    compiles_fullgraph,
    float64_leaves,
    impl_param,
    impls,
    ladder_inputs,
    ladder_overflow_inputs,
    near_poles,
    rel_err,
    require_grad,
    signed_ladder_inputs,
    univariate_reference,
    upstream_like,
)

# The grad mode matters only where the clamp is active; literal has one (autograd).
IMPL_GRADS = [
    impl_param(impl, grad, id=f"{impl}-{grad}")
    for impl in IMPLS
    for grad in ("paper", "exact")
    if not (impl == "literal" and grad == "exact")
]


def check_against_reference(out, leaves, upstream, tol, floor=None):
    """out and the gradients of (out * upstream).sum() w.r.t. leaves = (x, w, b) within
    ``tol`` (gradients 2 tol below float32) of the float64 reference."""
    ref_leaves = float64_leaves(*leaves)
    ref = reference_univariate_ladder(*ref_leaves, floor=floor)
    (ref * upstream.cpu().double()).sum().backward()
    assert rel_err(out, ref) < tol
    grad_tol = tol if tol <= 1e-5 else 2 * tol
    for name, got, want in zip("xwb", leaves, ref_leaves, strict=True):
        if got is not None:
            assert rel_err(got.grad, want.grad) < grad_tol, name


# ------------------------------------------------------------------- forward and backward


@pytest.mark.parametrize("impl,grad", IMPL_GRADS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_matches_reference(impl, grad, on, d, bias):
    x, w, b = ladder_inputs(70, 19, d, on, bias=bias, seed=d)  # odd rows and columns
    x, w, b = require_grad(x.view(2, 35, 19), w, b)
    out = univariate_ladder(x, w, b, grad=grad, impl=impl)
    upstream = upstream_like(x.shape, on, seed=2)
    (out * upstream).sum().backward()
    assert out.shape == x.shape and out.dtype == torch.float32
    check_against_reference(out, (x, w, b), upstream, 1e-5)


@pytest.mark.parametrize("impl,grad", IMPL_GRADS)
@pytest.mark.parametrize(
    "rows,n", [(1, 19), (70, 1), (1, 1)], ids=["one-row", "one-channel", "one-unit"]
)
def test_degenerate_shapes(impl, grad, on, rows, n):
    """One row (M = 1), one channel (n = 1) or both: size-1 dims that a squeeze, a
    broadcast or a tile mask could get wrong, float64 against the reference."""
    x, w, b = require_grad(*ladder_inputs(rows, n, 3, on, seed=3, dtype=torch.float64))
    out = univariate_ladder(x, w, b, grad=grad, impl=impl)
    upstream = upstream_like(x.shape, on, seed=2, dtype=torch.float64)
    (out * upstream).sum().backward()
    assert out.shape == x.shape and out.dtype == torch.float64
    check_against_reference(out, (x, w, b), upstream, 1e-10)


@pytest.mark.parametrize("impl", impls())
def test_spans_several_tiles(impl, on):
    """More rows and columns than one Triton tile: the row loop and the partial sums."""
    x, w, b = require_grad(*ladder_inputs(150, 300, 3, on, seed=3))
    out = univariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-5)


@pytest.mark.parametrize("which", ["x", "params"])
@pytest.mark.parametrize("impl", impls())
def test_gradients_asked_for(impl, on, which):
    x, w, b = ladder_inputs(9, 11, 4, on, seed=5)
    if which == "x":
        x.requires_grad_()
    else:
        require_grad(w, b)
    univariate_ladder(x, w, b, impl=impl).sum().backward()
    xr, wr, br = float64_leaves(x, w, b)
    reference_univariate_ladder(xr, wr, br).sum().backward()
    if which == "x":
        assert w.grad is None and rel_err(x.grad, xr.grad) < 1e-5
    else:
        assert x.grad is None and rel_err(w.grad, wr.grad) < 1e-5
        assert rel_err(b.grad, br.grad) < 1e-5


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", impls())
def test_gradcheck_float64(impl, on, grad):
    x = (torch.rand(3, 5, dtype=torch.float64) + 0.5).to(on).requires_grad_()
    w = away_from_poles(3, 5, seed=4).to(on).requires_grad_()
    b = away_from_poles(3, 5, seed=5).to(on).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda *t: univariate_ladder(*t, grad=grad, impl=impl), (x, w, b)
    )


@pytest.mark.parametrize("impl", impls())
def test_empty_inputs(impl, on):
    x = torch.rand(0, 4, device=on, requires_grad=True)
    w = torch.rand(2, 4, device=on, requires_grad=True)
    out = univariate_ladder(x, w, impl=impl)
    out.sum().backward()
    assert out.shape == (0, 4) and x.grad.shape == (0, 4)
    assert torch.equal(w.grad, torch.zeros_like(w))


# ------------------------------------------------------------------------- the clamp


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_clamped_region(impl, on, exact):
    """Ladders built onto poles: a_k = w_k x + b_k with x = 1 and |K_d| < eps (float64)."""
    eps, d = 0.01, 4
    a = near_poles(30, d, eps, seed=9)  # (30, d): one ladder per column
    x = torch.ones(3, 30, dtype=torch.float64)
    w = torch.ones(d, 30, dtype=torch.float64) * 0.5
    b = a.t().contiguous() - w  # a_k = w_k * 1 + b_k
    args = [t.to(on).requires_grad_() for t in (x, w, b)]
    out = univariate_ladder(*args, eps=eps, grad="exact" if exact else "paper", impl=impl)
    out.sum().backward()
    per_unit = (reference_exact_grad if exact else reference_paper_grad)(a, eps)  # (30, d)
    assert rel_err(out, reference_continued_fraction(a, eps).expand(3, 30)) < 1e-9
    assert rel_err(args[2].grad, 3 * per_unit.t()) < 1e-9  # d a_k / d b_k = 1, 3 rows
    assert rel_err(args[0].grad, (per_unit * 0.5).sum(-1).expand(3, 30)) < 1e-9


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("d", [16, 32])
@pytest.mark.parametrize("impl", impls())
def test_large_depth_stays_finite(impl, on, d):
    """K_d overflows float32 (rescaling): d = 16 with a ~ 1e3, d = 32 with a ~ 100. The
    value and the gradients of x, w and b, element by element wherever the float64
    closed forms are normal float32 numbers (the deep parameters' gradients fall like
    a^-2k): a wrong parameter gradient of the rescaled tiles fails here."""
    if impl == "triton" and d == 32 and on.type == "cuda":
        pytest.skip("the unrolled d = 32 Triton ladder backward takes minutes to compile")
    x, w, b = require_grad(*ladder_overflow_inputs(d, on))
    out = univariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    want = univariate_reference(x, w, b, torch.ones(out.shape))
    assert_close_where_normal(out, want["out"], 1e-5)
    assert assert_close_where_normal(x.grad, want["x"], 1e-5).all()
    for name, t in (("weight", w), ("bias", b)):
        assert torch.isfinite(t.grad).all(), name
        normal = assert_close_where_normal(t.grad, want[name], 1e-5)
        assert normal[:4].all(), name  # a guard: the check reaches several depths


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", impls())
def test_half_precision(impl, on, dtype):
    """Computed in float32 and rounded once: each value and gradient within half_ulps of
    the float64 reference (computing in the half dtype is several ulps off)."""
    x, w, b = require_grad(*ladder_inputs(33, 24, 5, on, seed=6, dtype=dtype))
    out = univariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype
    check_half_ulps(out, (x, w, b), reference_univariate_ladder, "xwb", impl, on, dtype)


# ---------------------------------------------------------------- positive denominators


@pytest.mark.parametrize("impl", impls())
@pytest.mark.parametrize("d", [1, 2, 5, 8])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_positive_matches_reference(impl, on, d, bias):
    """floor > 0: a_k = floor + softplus(w_k x + b_k), signed x, w, b (no poles anywhere)."""
    x, w, b = require_grad(*signed_ladder_inputs((2, 35), 19, d, on, bias=bias, seed=d))
    out = univariate_ladder(x, w, b, impl=impl, floor=0.5)
    upstream = upstream_like(x.shape, on, seed=2)
    (out * upstream).sum().backward()
    check_against_reference(out, (x, w, b), upstream, 1e-5, floor=0.5)


@pytest.mark.parametrize("impl", impls())
def test_positive_bf16(impl, on):
    x, w, b = require_grad(*signed_ladder_inputs((2, 35), 19, 5, on, dtype=torch.bfloat16))
    out = univariate_ladder(x, w, b, impl=impl, floor=0.5)
    upstream = upstream_like(x.shape, on, seed=2, dtype=torch.bfloat16)
    (out * upstream).sum().backward()
    assert out.dtype == torch.bfloat16
    check_against_reference(out, (x, w, b), upstream, 2e-2, floor=0.5)


@pytest.mark.parametrize("impl", impls())
def test_positive_gradcheck_float64(impl, on):
    x, w, b = (
        t.to(on).requires_grad_()
        for t in signed_ladder_inputs((3,), 5, 3, "cpu", seed=3, dtype=torch.float64)
    )
    assert torch.autograd.gradcheck(
        lambda x, w, b: univariate_ladder(x, w, b, impl=impl, floor=0.25), (x, w, b)
    )


def test_clamp_eps_skips_the_clamp_only_where_k_d_cannot_reach_eps():
    """K_d >= min(floor, 1) for positive denominators: no clamp needed when that >= eps
    (with 1% to spare); the paper's denominators (floor 0) always clamp."""
    from cofrgenet.ops.continuant import clamp_eps

    assert clamp_eps(0.01, 0.5) is None and clamp_eps(0.5, 2.0) is None
    assert clamp_eps(0.01, 0.0) == 0.01  # the paper's linear denominators
    assert clamp_eps(0.01, 0.01) == 0.01  # no margin left for a floor rounded to bf16
    assert clamp_eps(2.0, 5.0) == 2.0  # K_2 = a K_1 + 1 can be as small as 1 < eps
    assert clamp_eps(1e-6, 2e-6) == 1e-6  # a float16 subnormal floor rounds too far


def positive_extremes(device):
    """x, w, b for d = 5 whose positive denominators hit the floor exactly (softplus
    underflows to 0), stay near it, or overflow K_d (the rescaled rerun), and signed
    ordinary ones, in float32."""
    x, w, b = signed_ladder_inputs((6, 8), 16, 5, "cpu", seed=11)
    b[:, :4] = -200.0  # a_k = floor exactly in the first 4 columns
    w[:, :4] = 0.0
    b[:, 4:8] = -3.0  # a_k = floor + softplus(-3 + small): near the floor
    w[:, 4:8] = 0.01
    b[:, 8:12] = 60.0  # a_k ~ 60 + x w
    w[:, 8:12] = w[:, 8:12].abs() + 0.5
    x[0, 0, 8:12] = 1e9  # a_k ~ 1e9: K_5 ~ 1e45 overflows float32, the rescaled rerun
    return [t.to(device) for t in (x, w, b)]


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
@pytest.mark.parametrize("op", ["univariate", "pvariate"])
@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_skipped_clamp_changes_no_bits(impl, op, exact, monkeypatch):
    """Positive ladders (floor 0.5, eps 0.01) skip the K_d clamp, its mask and exact mode's
    clamped-gradient pass: values and the paper's gradients have the bits of the kernels
    with the clamp (eagerly), including denominators at the floor exactly and an
    overflowing row. Exact mode's gradients are the paper's then: they differ from the
    masked kernel's in the order the d terms of grad x are summed only."""
    from cofrgenet.ops import continuant, pvariate_ladder

    x, w, b = positive_extremes("cpu")
    big = torch.nn.functional.softplus(x[0, 0, 8:12] * w[:, 8:12] + b[:, 8:12]) + 0.5
    assert torch.isinf(big.prod(0)).all()  # a guard on the construction: K_d overflows
    if op == "pvariate":
        w, b = w.view(5, 2, 8)[..., :1].expand(5, 2, 16).contiguous(), b[:, :2].contiguous()
        w[:, 1] = 0.03  # with x[0, 0, 8:12] = 1e9: a ~ 1e8, K_5 overflows float32
    state = continuant.univariate_ladder_state if op == "univariate" else None
    state = state or continuant.pvariate_ladder_state
    # Guards on the construction: the skip is taken, and one row reruns rescaled.
    _, _, _, mask, rescaled = state(x, w, b, 0.01, True, 0.5, False)
    assert mask is None and rescaled
    _, _, _, mask, _ = state(x, w, b, 0.01, True, 0.0, False)  # the paper's: masked
    assert mask is not None and mask.dtype == torch.bool
    ladder = univariate_ladder if op == "univariate" else pvariate_ladder
    grad = "exact" if exact else "paper"
    upstream = upstream_like(ladder(x, w, b, floor=0.5).shape, "cpu", seed=5)
    results = []
    for keep_clamp in (False, True):
        if keep_clamp:
            monkeypatch.setattr(continuant, "clamp_eps", lambda eps, floor: eps)
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        out = ladder(*leaves, floor=0.5, grad=grad, impl=impl)
        grads = torch.autograd.grad((out * upstream).sum(), leaves)
        with torch.no_grad():
            plain = ladder(x, w, b, floor=0.5, grad=grad, impl=impl)
        results.append((out.detach(), plain, *grads))
    assert torch.isfinite(results[0][0]).all()
    # Separately compiled kernels may contract multiply-adds differently: bits eagerly.
    tol = 0.0 if impl == "continuant" else 1e-5
    for i, (skipped, clamped) in enumerate(zip(*results, strict=True)):
        rtol = max(tol, 1e-5) if exact and i >= 2 else tol
        if i == 1:  # without grad, positive ladders are evaluated by tail_value
            rtol = max(tol, 1e-6)
        torch.testing.assert_close(skipped, clamped, rtol=rtol, atol=0)
    if exact:  # nothing clamped: the paper's gradients
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        out = ladder(*leaves, floor=0.5, grad="paper", impl=impl)
        paper = torch.autograd.grad((out * upstream).sum(), leaves)
        for got, want in zip(results[0][2:], paper, strict=True):
            torch.testing.assert_close(got, want, rtol=tol, atol=0)


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_a_floor_below_eps_still_clamps(impl, on):
    """floor 0.001 < eps 0.1: a_1 at the floor gives K_1 < eps, clamped to eps (1 / eps =
    10, not 1 / floor = 1000), as the reference does."""
    x = torch.zeros(1, 4, device=on)
    w = torch.zeros(1, 4, device=on)
    b = torch.full((1, 4), -200.0, device=on)  # softplus underflows: a_1 = floor
    out = univariate_ladder(x, w, b, eps=0.1, floor=0.001, impl=impl)
    torch.testing.assert_close(out.cpu(), torch.full((1, 4), 10.0))


@pytest.mark.parametrize("d", [1, 3])
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_a_floor_below_eps_clamps_gradients_too(impl, on, d):
    """floor 0.001 < eps 0.01, exact mode: biases -6.5 keep the denominators within 0.003
    of the floor, so that K_d < eps for odd d (clamped), beside unclamped units (biases
    1); the gradients are the clamped function's, through the softplus, as the float64
    reference's (the test above checks only the value)."""
    floor = 0.001
    x, w, b = signed_ladder_inputs((2, 5), 8, d, on, seed=d, dtype=torch.float64)
    w = w * 0.02
    b[:, :4], b[:, 4:] = -6.5, 1.0
    a = reference_positive_denominators(ladder_denominators(x, w, b), floor)
    clamped = clamped_units(a)
    assert clamped[..., :4].all() and not clamped[..., 4:].any()  # a guard on the inputs
    x, w, b = require_grad(x, w, b)
    out = univariate_ladder(x, w, b, grad="exact", impl=impl, floor=floor)
    upstream = upstream_like(out.shape, on, seed=2, dtype=torch.float64)
    (out * upstream).sum().backward()
    check_against_reference(out, (x, w, b), upstream, 1e-10, floor=floor)


# --------------------------------------------------------- memory, without autograd


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_saves_no_depth_sized_tensor(impl, on):
    """The fast ladders keep only (..., n)-sized tensors and the parameters for backward
    (the (..., n, d) partial denominators are recomputed); triton keeps x, w, b alone."""
    x, w, b = ladder_inputs(16, 32, 7, on)
    x.requires_grad_()
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        univariate_ladder(x, w, b, impl=impl)
    assert saved, "nothing saved: the test would be vacuous"
    assert all(s.numel() <= x.numel() for s in saved), [s.shape for s in saved]
    if impl == "triton":
        assert len(saved) == 3 and all(s is t for s, t in zip(saved, (x, w, b), strict=True))


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_inference_path_equals_the_autograd_path(impl):
    """Without grad, the continuant paths skip their autograd Function: the same bits for
    the paper's denominators; positive ones are evaluated by tail_value eagerly (the same
    values to rounding)."""
    x = torch.randn(7, 9, dtype=torch.float64)
    w, b = torch.randn(3, 9, dtype=torch.float64), torch.randn(3, 9, dtype=torch.float64)
    for floor in (None, 0.5):
        with torch.no_grad():
            plain = univariate_ladder(x, w, b, impl=impl, floor=floor)
        tracked = univariate_ladder(x, w.clone().requires_grad_(), b, impl=impl, floor=floor)
        tol = 1e-13 if floor and impl == "continuant" else 0.0
        torch.testing.assert_close(plain, tracked.detach(), rtol=tol, atol=0)


# ------------------------------------------------------------ the custom op, compiled


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_custom_op(impl, on):
    """The torch.library op of each backend: opcheck (bias or not, both grad modes, both
    links), and float64 values and gradients."""
    backend = BACKEND[impl]
    x, w, b = require_grad(*ladder_inputs(5, 9, 3, on, seed=0))
    op = ops.univariate_ladder_op
    torch.library.opcheck(op, (x, w, b, 0.01, False, 0.0, backend))
    torch.library.opcheck(op, (x, w, None, 0.01, True, 0.0, backend))
    torch.library.opcheck(op, (x, w, b, 0.01, False, 0.5, backend))
    args = (0.01, False, 0.5, backend)
    check_float64_op(op, (x, w, b), args, reference_univariate_ladder, floor=0.5)


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_custom_op_with_state(impl):
    """The CPU backends' op inside torch.compile keeps 1 / K_d, the rescale counts and
    the clamp mask from forward (opcheck), and its gradients equal the stateless op's,
    in both grad modes and through the rescaled path."""
    backend = BACKEND[impl]
    op = ops.univariate_ladder_with_state_op
    x, w, b = require_grad(*ladder_inputs(5, 9, 3, "cpu", seed=0))
    torch.library.opcheck(op, (x, w, b, 0.01, False, 0.5, backend))
    torch.library.opcheck(op, (x, w, None, 0.01, True, 0.0, backend))
    eps, d = 0.01, 4
    a = near_poles(30, d, eps, seed=9)  # clamped units: the grad modes differ
    clamped_inputs = (torch.ones(3, 30, dtype=torch.float64), torch.full((d, 30), 0.5))
    f64, f32 = torch.float64, torch.float32
    cases = [  # float32 overflows at d = 16, a ~ 1e3: the kept rescale counts are used
        (*clamped_inputs, a.t().contiguous() - 0.5, "exact", f64),
        (*clamped_inputs, a.t().contiguous() - 0.5, "paper", f64),
        (*ladder_overflow_inputs(16, "cpu"), "paper", f32),
    ]
    check_with_state_op(op, ops.univariate_ladder_op, cases, backend, eps)


@pytest.mark.parametrize("impl", impls("auto", "continuant", "triton"))
def test_compiles_fullgraph(impl, device):
    """No graph break (fullgraph=True), forward and backward, equal to eager."""
    if impl == "continuant" and device.type == "cuda":
        pytest.skip("the continuant path is covered on CPU")
    on = device if impl in ("auto", "triton") else torch.device("cpu")
    leaves = ladder_inputs(5, 9, 3, on, seed=0)
    compiles_fullgraph(lambda x, w, b: univariate_ladder(x, w, b, impl=impl), leaves)


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_keeps_x_and_one_value_per_output_for_backward(impl):
    """Without overflow, backward needs x, the parameters and 1 / K_d: the rescale counts
    (all zero) are not kept, nor any (..., n, d) tensor."""
    x, w, b = require_grad(*signed_ladder_inputs((3, 7), 10, 4, "cpu"))
    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel()) or t, lambda t: t
    ):
        out = univariate_ladder(x, w, b, impl=impl, floor=0.5)
    assert sorted(saved) == sorted([x.numel(), w.numel(), b.numel(), out.numel()])
    out.sum().backward()
    check_against_reference(out, (x, w, b), torch.ones(out.shape), 1e-5, floor=0.5)

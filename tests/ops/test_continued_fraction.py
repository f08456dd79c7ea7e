"""continued_fraction: every implementation against the float64 references.

literal, continuant, compiled and triton run on the same inputs (see op_cases.py; triton
under Triton's interpreter without a GPU, with every fresh output NaN-poisoned).
"""

from __future__ import annotations

import pytest
import torch

from cofrgenet.ops import continued_fraction
from cofrgenet.ops import custom_ops as ops
from cofrgenet.ops.reference import (
    reference_continued_fraction,
    reference_exact_grad,
    reference_paper_grad,
)
from op_cases import (
    BACKEND,
    CLAMPING,
    HALF,
    HALF_IDS,
    assert_close_where_normal,
    away_from_poles,
    compiles_fullgraph,
    half_ulps,
    impls,
    near_poles,
    overflowing,
    rel_err,
    ulps_off,
    upstream_like,
)

# ------------------------------------------------------------------- forward and backward


@pytest.mark.parametrize("impl", impls())
@pytest.mark.parametrize("d", range(1, 9))
@pytest.mark.parametrize("shape", [(1,), (37,), (3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(impl, on, d, shape):
    a = away_from_poles(*shape, d, dtype=torch.float32, seed=d).to(on).requires_grad_()
    out = continued_fraction(a, impl=impl)
    upstream = upstream_like(shape, on)
    (out * upstream).sum().backward()
    assert out.shape == shape and out.dtype == torch.float32
    assert rel_err(out, reference_continued_fraction(a.detach().cpu())) < 1e-5
    want = reference_paper_grad(a.detach().cpu()) * upstream.cpu().double().unsqueeze(-1)
    assert rel_err(a.grad, want) < 1e-5


LAYOUTS = ["depth_major", "transposed", "sliced", "permuted", "gapped_channels_last"]


@pytest.mark.parametrize("impl", impls())
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reads_and_writes_any_layout(impl, on, layout):
    """Depth-major (as the layers build it), transposed and gapped inputs (more rows than
    one Triton block), with a stride-0 upstream gradient. "permuted": dense, its leading
    dims in three stride groups (the kernels address two), so that empty_like(a), the
    gradient's layout, is one the kernel cannot write; "gapped_channels_last": not dense,
    and empty_like(a) is channels-last, not contiguous."""
    base = away_from_poles(5003, 4, dtype=torch.float32, seed=2).to(on)
    if layout == "depth_major":
        a = base.t().contiguous().t()  # (N, d) with d outermost in memory
    elif layout == "transposed":
        a = base.view(5003, 2, 2).transpose(0, 1)  # (2, N, 2) non-contiguous
        a = a.contiguous().transpose(0, 1)
    elif layout == "sliced":
        a = torch.cat([base, base], dim=-1)[:, ::2]  # stride 2 along d
    elif layout == "permuted":  # (11, 13, 35, 4), strides (140, 1540, 4, 1)
        a = away_from_poles(13, 11, 35, 4, dtype=torch.float32, seed=2).to(on)
        a = a.permute(1, 0, 2, 3)
    else:  # (13, 35, 11, 4), strides (3080, 1, 280, 70)
        a = away_from_poles(13, 11, 8, 35, dtype=torch.float32, seed=2).to(on)
        a = a.permute(0, 3, 1, 2)[..., ::2]
    a.requires_grad_()
    out = continued_fraction(a, grad="exact", impl=impl)
    upstream = upstream_like(out.shape[-1:], on).expand(out.shape)  # a stride-0 view
    out.backward(upstream)
    assert rel_err(out, reference_continued_fraction(a.detach().cpu())) < 1e-5
    want = reference_paper_grad(a.detach().cpu()) * upstream.cpu().double().unsqueeze(-1)
    assert rel_err(a.grad, want) < 1e-5
    if layout == "depth_major" and impl != "literal":
        assert a.grad.stride() == a.stride()  # the gradient is written in a's layout


@pytest.mark.parametrize("impl", impls())
def test_grad_of_expanded_upstream(impl, on):
    a = away_from_poles(6, 7, 3, dtype=torch.float32, seed=4).to(on).requires_grad_()
    continued_fraction(a, impl=impl).sum().backward()  # upstream: stride-0 ones
    assert rel_err(a.grad, reference_paper_grad(a.detach().cpu())) < 1e-5


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", impls())
def test_gradcheck_float64(impl, on, grad):
    a = away_from_poles(6, 4, seed=3).to(on).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: continued_fraction(t, grad=grad, impl=impl), (a,))


@pytest.mark.parametrize("impl", impls())
def test_empty_inputs(impl, on):
    a = torch.rand(0, 3, device=on, requires_grad=True)
    out = continued_fraction(a, impl=impl)
    out.sum().backward()
    assert out.shape == (0,) and a.grad.shape == (0, 3)


# ------------------------------------------------------------------------- the clamp


@pytest.mark.parametrize("impl", impls(*CLAMPING))
@pytest.mark.parametrize("d", [1, 2, 3, 6])
def test_clamped_region_both_grad_modes(impl, on, d):
    """|K_d| < eps by construction: value K_{d-1} / (sign(K_d) eps), and each grad mode's
    closed form; float64 inputs compute in float64, float32 ones near cancellation."""
    eps = 0.01
    a = near_poles(50, d, eps, seed=d)
    out = continued_fraction(a.to(on), eps=eps, impl=impl)
    assert rel_err(out, reference_continued_fraction(a, eps)) < 1e-9
    for grad, reference in (("paper", reference_paper_grad), ("exact", reference_exact_grad)):
        a64 = a.clone().to(on).requires_grad_()
        (g,) = torch.autograd.grad(
            continued_fraction(a64, eps=eps, grad=grad, impl=impl).sum(), a64
        )
        assert rel_err(g, reference(a, eps)) < 1e-9, grad
    # float32: K_d is computed in float32 near cancellation, so a looser bound.
    a32 = a.float().to(on).requires_grad_()
    out32 = continued_fraction(a32, eps=eps, grad="exact", impl=impl)
    (g32,) = torch.autograd.grad(out32.sum(), a32)
    assert rel_err(out32, reference_continued_fraction(a, eps)) < 1e-4
    assert rel_err(g32, reference_exact_grad(a, eps)) < 1e-4


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_exact_mode_is_the_gradient_of_the_clamped_function(impl, on):
    """Finite differences of the clamped function agree with grad="exact", not "paper"."""
    eps = 0.01
    a = near_poles(20, 3, eps, seed=11).to(on).requires_grad_()
    (g_exact,) = torch.autograd.grad(
        continued_fraction(a, eps=eps, grad="exact", impl=impl).sum(), a
    )
    h = 1e-7
    numeric = torch.zeros_like(a)
    for k in range(a.shape[-1]):
        step = torch.zeros_like(a)
        step[:, k] = h
        plus = continued_fraction(a.detach() + step, eps=eps, impl=impl)
        minus = continued_fraction(a.detach() - step, eps=eps, impl=impl)
        numeric[:, k] = (plus - minus) / (2 * h)
    assert rel_err(g_exact, numeric) < 1e-5
    (g_paper,) = torch.autograd.grad(
        continued_fraction(a, eps=eps, grad="paper", impl=impl).sum(), a
    )
    assert rel_err(g_paper, numeric) > 1e-2


@pytest.mark.parametrize("impl", impls())
def test_sign_of_zero_clamps_to_plus_eps(impl, on):
    a = torch.tensor([[0.0], [-0.0]], device=on)
    assert continued_fraction(a, eps=0.5, impl=impl).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_clamp_edges_match_the_reference(impl, on, dtype):
    """K_d at, inside and outside +-eps, signed zeros and non-finite values: the same bits
    as 1 / reference.clamp_denominator (sign(0) = +1, NaN stays NaN)."""
    from cofrgenet.ops.reference import clamp_denominator

    eps = 0.25
    edges = [0.0, -0.0, eps, -eps, eps / 2, -eps / 2, 2 * eps, -2 * eps, 1e-30, -1e-30]
    a = torch.tensor([*edges, float("nan"), float("inf"), float("-inf")], dtype=dtype)
    got = continued_fraction(a.unsqueeze(-1).to(on), eps=eps, impl=impl).cpu()
    want = torch.reciprocal(clamp_denominator(a, eps))
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_overflow_check_of_a_huge_but_finite_batch(impl):
    """Every K_d finite but their float32 sum (the overflow probe) infinite: the rescaled
    rerun it triggers gives the values of the float64 reference."""
    a = torch.full((64, 2), 1e19)  # K_2 = a_1 a_2 + 1 = 1e38 each; their sum overflows
    a[:, 1] = torch.linspace(1e18, 3e18, 64)
    assert torch.isinf(a.prod(-1).sum()) and torch.isfinite(a.prod(-1)).all()
    got = continued_fraction(a, impl=impl)
    assert rel_err(got, reference_continued_fraction(a)) < 1e-6


@pytest.mark.parametrize("d", [1, 2, 5, 12])
def test_tail_value_matches_the_reference(d):
    """Inference with positive partial denominators (a_k >= floor > 0) evaluates f~ from
    the inside out (continuant.tail_value): the float64 reference's values from the floor
    itself up to a_k ~ 1e20, where K_d overflows float32; odd shapes, float32 and
    float64, row-major and depth-major (what pvariate_denominators gives) layouts."""
    from cofrgenet.ops import continuant

    gen = torch.Generator().manual_seed(d)
    a = 0.5 + 3 * torch.rand(3, 5, 7, d, generator=gen, dtype=torch.float64)
    a[0] = 0.5  # at the floor exactly
    a[1, :2] = 10 ** (20 * torch.rand(2, 7, d, generator=gen, dtype=torch.float64))
    want = reference_continued_fraction(a)
    for dtype, rtol in ((torch.float64, 1e-14), (torch.float32, 2e-6)):
        for layout in (a, a.movedim(-1, 0).contiguous().movedim(0, -1)):
            got = continuant.continued_fraction_value(layout.to(dtype), None, False)
            assert got.dtype == dtype and got.shape == a.shape[:-1]
            torch.testing.assert_close(got, want.to(dtype), rtol=rtol, atol=0)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", impls())
def test_large_depth_and_magnitude_stay_finite(impl, on, grad):
    """d = 32 with |a| ~ 100: K_d ~ 1e64 overflows float32 without rescaling."""
    if impl == "triton" and on.type == "cuda":  # kept under the interpreter (no compile)
        pytest.skip("the unrolled d = 32 Triton backward takes minutes to compile")
    a = overflowing(300, 32).to(on).requires_grad_()
    out = continued_fraction(a, grad=grad, impl=impl)
    (grad_a,) = torch.autograd.grad(out.sum(), a)
    assert torch.isfinite(out).all() and torch.isfinite(grad_a).all()
    assert rel_err(out, reference_continued_fraction(a.detach().cpu())) < 1e-5
    # Per element: the gradient of a_k falls like 1e-4 per depth.
    normal = assert_close_where_normal(grad_a, reference_paper_grad(a.detach().cpu()), 1e-4)
    assert normal[:, :6].all()  # a guard: the check reaches several depths


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
@pytest.mark.parametrize("d", [1, 4, 7])
@pytest.mark.parametrize("impl", impls("triton"))
def test_rescaled_kernels_change_no_bits(impl, on, d, exact):
    """The rescaled kernels (forced) give the unscaled kernels' bits where nothing
    overflows (the eager continuant reruns rescaled only on overflow: nothing to compare)."""
    from cofrgenet.ops import triton as kernels

    a = torch.cat([near_poles(40, d, 0.01, seed=d), away_from_poles(60, d, seed=d)]).float()
    a, upstream = a.to(on), upstream_like(100, on)
    results = {}
    for force in (False, True):
        out = kernels.continued_fraction_fwd(a, 0.01, force_rescale=force)
        grad = kernels.continued_fraction_bwd(a, upstream, 0.01, exact, force_rescale=force)
        results[force] = out, grad
    (out, grad), plain = results[True], results[False]
    if on.type == "cpu":
        assert torch.equal(out, plain[0]) and torch.equal(grad, plain[1])
    else:  # the two compiled variants may contract multiply-adds differently
        torch.testing.assert_close(out, plain[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, plain[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", impls())
def test_half_precision_inputs(impl, on, dtype):
    """Computed in float32 and rounded once: each value and gradient within half_ulps of
    the float64 reference (computing in the half dtype is several ulps off)."""
    a = away_from_poles(64, 5, dtype=dtype, seed=1).to(on).requires_grad_()
    out = continued_fraction(a, impl=impl)
    out.sum().backward()
    assert out.dtype == dtype and a.grad.dtype == dtype
    bound = half_ulps(impl, on, dtype)
    assert ulps_off(out, reference_continued_fraction(a.detach().cpu()), dtype) < bound
    assert ulps_off(a.grad, reference_paper_grad(a.detach().cpu()), dtype) < bound


# ---------------------------------------------------------------- without autograd


@pytest.mark.parametrize("impl", impls("continuant", "compiled"))
def test_inference_path_equals_the_autograd_path(impl):
    """Without grad, the continuant paths skip their autograd Function: the same bits."""
    a = torch.rand(6, 4, 5, dtype=torch.float64) + 0.5
    with torch.no_grad():
        plain = continued_fraction(a, impl=impl)
    tracked = continued_fraction(a.clone().requires_grad_(), impl=impl)
    torch.testing.assert_close(plain, tracked.detach(), rtol=0, atol=0)


# ------------------------------------------------------------ the custom op, compiled


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_custom_op(impl, on):
    """The torch.library op of each backend: opcheck (row-major and depth-major inputs:
    the backward op promises empty_like(a)'s layout), and float64 values and gradients."""
    backend = BACKEND[impl]
    a = away_from_poles(7, 3, 4, dtype=torch.float32, seed=1).to(on).requires_grad_()
    for exact in (False, True):
        torch.library.opcheck(ops.continued_fraction_op, (a, 0.01, exact, backend))
    depth_major = a.detach().permute(2, 0, 1).contiguous().permute(1, 2, 0).requires_grad_()
    torch.library.opcheck(ops.continued_fraction_op, (depth_major, 0.01, False, backend))
    a64 = a.detach().double().requires_grad_()
    out = ops.continued_fraction_op(a64, 0.01, True, backend)
    (grad,) = torch.autograd.grad(out.sum(), a64)
    assert rel_err(out, reference_continued_fraction(a64.detach().cpu())) < 1e-12
    assert rel_err(grad, reference_exact_grad(a64.detach().cpu())) < 1e-12


@pytest.mark.parametrize("impl", impls("auto", "continuant", "triton"))
def test_compiles_fullgraph(impl, device):
    """No graph break (fullgraph=True), forward and backward, equal to eager. "auto" on
    the device fixture's device (triton on CUDA), the others where they run."""
    if impl == "continuant" and device.type == "cuda":
        pytest.skip("the continuant path is covered on CPU")
    on = device if impl in ("auto", "triton") else torch.device("cpu")
    a = away_from_poles(7, 3, 4, dtype=torch.float32, seed=1).to(on)
    compiles_fullgraph(lambda t: continued_fraction(t, grad="exact", impl=impl), [a])

"""The Triton kernels (impl="triton") against the float64 references.

On a machine without a GPU they run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), on CPU tensors; with a GPU the same tests run on CUDA. Every output
buffer is filled with NaN before the kernels run, so an element a kernel fails to write
fails the comparison. Shapes are small (the interpreter is slow) but not multiples of
the block sizes, on the GPU as in the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cofrgenet.nn import Cffn
from cofrgenet.ops import (
    continued_fraction,
    ladder_ensemble,
    resolve_impl,
    univariate_ladder,
)
from cofrgenet.ops.reference import (
    ladder_denominators,
    reference_continued_fraction,
    reference_exact_grad,
    reference_paper_grad,
    reference_univariate_ladder,
    suffix_continuants,
)
from test_ops import away_from_poles, near_poles, rel_err

pytest.importorskip("triton")

from cofrgenet.ops import triton as kernels
from cofrgenet.ops.triton import runtime

HALF = [torch.bfloat16, torch.float16]


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """NaN in every fresh output and partial-sum buffer: unwritten elements show."""
    monkeypatch.setattr(runtime, "poison_outputs", True)


def upstream_like(shape, device, seed=1) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(device)


def ladder_inputs(rows, n, d, device, bias=True, seed=0, dtype=torch.float32):
    """x in [0.5, 1.5), positive weights and biases: no pole of any level."""
    x = (torch.rand(rows, n, generator=torch.Generator().manual_seed(seed)) + 0.5).to(dtype)
    w = away_from_poles(d, n, dtype=dtype, seed=seed + 1)
    b = away_from_poles(d, n, dtype=dtype, seed=seed + 2) if bias else None
    return [t if t is None else t.to(device) for t in (x, w, b)]


# --------------------------------------------------------------- continued_fraction


@pytest.mark.parametrize("d", range(1, 9))
@pytest.mark.parametrize("shape", [(1,), (37,), (3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_continued_fraction_matches_reference(device, d, shape):
    a = away_from_poles(*shape, d, dtype=torch.float32, seed=d).to(device).requires_grad_()
    out = continued_fraction(a, impl="triton")
    upstream = upstream_like(shape, device)
    (out * upstream).sum().backward()
    assert out.shape == shape and out.dtype == torch.float32
    ref = reference_continued_fraction(a.detach().cpu())
    assert rel_err(out.cpu(), ref) < 1e-5
    want = reference_paper_grad(a.detach().cpu()) * upstream.cpu().double().unsqueeze(-1)
    assert rel_err(a.grad.cpu(), want) < 1e-5


@pytest.mark.parametrize("layout", ["depth_major", "transposed", "sliced"])
def test_continued_fraction_reads_and_writes_any_layout(device, layout):
    """Depth-major (as the layers build it), transposed and gapped inputs, no copies."""
    base = away_from_poles(5003, 4, dtype=torch.float32, seed=2).to(device)  # > 1 block
    if layout == "depth_major":
        a = base.t().contiguous().t()  # (N, d) with d outermost in memory
    elif layout == "transposed":
        a = base.view(5003, 2, 2).transpose(0, 1)  # (2, N, 2) non-contiguous
        a = a.contiguous().transpose(0, 1)
    else:
        a = torch.cat([base, base], dim=-1)[:, ::2]  # stride 2 along d
    a.requires_grad_()
    out = continued_fraction(a, grad="exact", impl="triton")
    upstream = upstream_like(out.shape, device).expand(out.shape)  # may be a stride-0 view
    out.backward(upstream)
    ref = reference_continued_fraction(a.detach().cpu())
    assert rel_err(out.cpu(), ref) < 1e-5
    want = reference_paper_grad(a.detach().cpu()) * upstream.cpu().double().unsqueeze(-1)
    assert rel_err(a.grad.cpu(), want) < 1e-5
    if layout == "depth_major":
        assert a.grad.stride() == a.stride()  # the gradient is written in a's layout


def test_continued_fraction_grad_of_expanded_upstream(device):
    a = away_from_poles(6, 7, 3, dtype=torch.float32, seed=4).to(device).requires_grad_()
    continued_fraction(a, impl="triton").sum().backward()  # upstream: stride-0 ones
    assert rel_err(a.grad.cpu(), reference_paper_grad(a.detach().cpu())) < 1e-5


@pytest.mark.parametrize("d", [1, 2, 3, 6])
def test_clamped_region_both_grad_modes(device, d):
    eps = 0.01
    a = near_poles(50, d, eps, seed=d)
    assert (suffix_continuants(a)[-1].abs() < eps).all()
    # float64 inputs compute in float64: the same bound as the continuant tests.
    out = continued_fraction(a.to(device), eps=eps, impl="triton")
    assert rel_err(out.cpu(), reference_continued_fraction(a, eps)) < 1e-9
    for grad, reference in (("paper", reference_paper_grad), ("exact", reference_exact_grad)):
        a64 = a.clone().to(device).requires_grad_()
        (g,) = torch.autograd.grad(
            continued_fraction(a64, eps=eps, grad=grad, impl="triton").sum(), a64
        )
        assert rel_err(g.cpu(), reference(a, eps)) < 1e-9, grad
    # float32: K_d is computed in float32 near cancellation, so a looser bound.
    a32 = a.float().to(device).requires_grad_()
    (g32,) = torch.autograd.grad(
        continued_fraction(a32, eps=eps, grad="exact", impl="triton").sum(), a32
    )
    assert rel_err(g32.cpu(), reference_exact_grad(a, eps)) < 1e-4


def test_sign_of_zero_clamps_to_plus_eps(device):
    a = torch.tensor([[0.0], [-0.0]], device=device)
    assert continued_fraction(a, eps=0.5, impl="triton").tolist() == [2.0, 2.0]


@pytest.mark.parametrize("grad", ["paper", "exact"])
def test_large_depth_and_magnitude_stay_finite(device, grad):
    """d = 32 with |a| ~ 100: K_d ~ 1e64 overflows float32 without rescaling."""
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(300, 32, generator=g) * 100 + 50) * torch.where(
        torch.rand(300, 32, generator=g) < 0.5, -1.0, 1.0
    )
    a = a.to(device).requires_grad_()
    out = continued_fraction(a, grad=grad, impl="triton")
    (grad_a,) = torch.autograd.grad(out.sum(), a)
    assert torch.isfinite(out).all() and torch.isfinite(grad_a).all()
    assert rel_err(out.cpu(), reference_continued_fraction(a.detach().cpu())) < 1e-5
    assert rel_err(grad_a.cpu(), reference_paper_grad(a.detach().cpu())) < 1e-4


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
@pytest.mark.parametrize("d", [1, 4, 7])
def test_rescaled_kernels_change_no_bits(device, d, exact):
    """The rescaled path (forced) gives the unscaled path's bits where nothing overflows."""
    a = torch.cat([near_poles(40, d, 0.01, seed=d), away_from_poles(60, d, seed=d)]).float()
    a = a.to(device)
    upstream = upstream_like(100, device)
    for force in (False, True):
        out = kernels.continued_fraction_fwd(a, 0.01, force_rescale=force)
        grad = kernels.continued_fraction_bwd(a, upstream, 0.01, exact, force_rescale=force)
        if not force:
            plain = out, grad
    if device.type == "cpu":
        assert torch.equal(out, plain[0]) and torch.equal(grad, plain[1])
    else:  # the two compiled variants may contract multiply-adds differently
        torch.testing.assert_close(out, plain[0], rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, plain[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_half_precision_inputs(device, dtype):
    a = away_from_poles(64, 5, dtype=dtype, seed=1).to(device).requires_grad_()
    out = continued_fraction(a, impl="triton")
    out.sum().backward()
    assert out.dtype == dtype and a.grad.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert rel_err(out.cpu(), reference_continued_fraction(a.detach().cpu())) < tol
    assert rel_err(a.grad.cpu(), reference_paper_grad(a.detach().cpu())) < 2 * tol


@pytest.mark.parametrize("grad", ["paper", "exact"])
def test_gradcheck_float64(device, grad):
    a = away_from_poles(6, 4, seed=3).to(device).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: continued_fraction(t, grad=grad, impl="triton"), (a,))
    x = (torch.rand(3, 5, dtype=torch.float64) + 0.5).to(device).requires_grad_()
    w = away_from_poles(3, 5, seed=4).to(device).requires_grad_()
    b = away_from_poles(3, 5, seed=5).to(device).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda *t: univariate_ladder(*t, grad=grad, impl="triton"), (x, w, b)
    )


# ---------------------------------------------------------------- univariate_ladder


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("d", [1, 2, 3, 5, 8])
def test_univariate_ladder_matches_reference(device, d, bias, grad):
    x, w, b = ladder_inputs(70, 19, d, device, bias=bias, seed=d)  # odd rows and columns
    x = x.view(2, 35, 19)
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_()
    out = univariate_ladder(x, w, b, grad=grad, impl="triton")
    upstream = upstream_like(x.shape, device, seed=2)
    (out * upstream).sum().backward()

    xr, wr = x.detach().cpu().double().requires_grad_(), w.detach().cpu().double().requires_grad_()
    br = b.detach().cpu().double().requires_grad_() if bias else None
    ref = reference_univariate_ladder(xr, wr, br)
    (ref * upstream.cpu().double()).sum().backward()
    assert out.shape == x.shape
    assert rel_err(out.cpu(), ref) < 1e-5
    assert rel_err(x.grad.cpu(), xr.grad) < 1e-5
    assert rel_err(w.grad.cpu(), wr.grad) < 1e-5
    if bias:
        assert rel_err(b.grad.cpu(), br.grad) < 1e-5


def test_ladder_spans_several_tiles(device):
    """More rows and columns than one tile: the row loop and the partial sums."""
    x, w, b = ladder_inputs(150, 300, 3, device, seed=3)
    for t in (x, w, b):
        t.requires_grad_()
    univariate_ladder(x, w, b, impl="triton").sum().backward()
    xr, wr, br = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    reference_univariate_ladder(xr, wr, br).sum().backward()
    for got, want in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert rel_err(got.cpu(), want) < 1e-5


@pytest.mark.parametrize("which", ["x", "params"])
def test_ladder_gradients_asked_for(device, which):
    x, w, b = ladder_inputs(9, 11, 4, device, seed=5)
    (x if which == "x" else w).requires_grad_()
    if which == "params":
        b.requires_grad_()
    univariate_ladder(x, w, b, impl="triton").sum().backward()
    xr, wr, br = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    reference_univariate_ladder(xr, wr, br).sum().backward()
    if which == "x":
        assert w.grad is None and rel_err(x.grad.cpu(), xr.grad) < 1e-5
    else:
        assert x.grad is None and rel_err(w.grad.cpu(), wr.grad) < 1e-5
        assert rel_err(b.grad.cpu(), br.grad) < 1e-5


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
def test_ladder_clamped_region(device, exact):
    """Ladders built onto poles: a_1 = w_1 x + b_1 with |K_d| < eps (float64 kernels)."""
    eps, d = 0.01, 4
    a = near_poles(30, d, eps, seed=9)  # (30, d): one ladder per column, x = 1
    x = torch.ones(3, 30, dtype=torch.float64)
    w = torch.ones(d, 30, dtype=torch.float64) * 0.5
    b = a.t().contiguous() - w  # a_k = w_k * 1 + b_k
    args = [t.to(device).requires_grad_() for t in (x, w, b)]
    out = univariate_ladder(*args, eps=eps, grad="exact" if exact else "paper", impl="triton")
    out.sum().backward()
    reference = reference_exact_grad if exact else reference_paper_grad
    per_unit = reference(a, eps)  # (30, d): d f~ / d a_k
    assert rel_err(out.cpu(), reference_continued_fraction(a, eps).expand(3, 30)) < 1e-9
    assert rel_err(args[2].grad.cpu(), 3 * per_unit.t()) < 1e-9  # d a_k / d b_k = 1, 3 rows
    assert rel_err(args[0].grad.cpu(), (per_unit * 0.5).sum(-1).expand(3, 30)) < 1e-9


def test_ladder_large_depth_stays_finite(device):
    """d = 16 with a ~ 1e3: K_d ~ 1e50 overflows float32 without rescaling.

    (d = 16, not 32: the unrolled d = 32 ladder backward takes minutes to compile.)
    """
    x = (torch.rand(8, 16) * 1000 + 1000).to(device).requires_grad_()
    w = (torch.rand(16, 16) + 1).to(device)
    b = torch.rand(16, 16).to(device)
    out = univariate_ladder(x, w, b, impl="triton")
    out.sum().backward()
    a = ladder_denominators(x.detach().cpu().double(), w.cpu().double(), b.cpu().double())
    assert (suffix_continuants(a)[-1].abs() > torch.finfo(torch.float32).max).all()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    xr = x.detach().cpu().double().requires_grad_()
    ref = reference_univariate_ladder(xr, w.cpu().double(), b.cpu().double())
    ref.sum().backward()
    assert rel_err(out.cpu(), ref) < 1e-5
    assert rel_err(x.grad.cpu(), xr.grad) < 1e-4


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_ladder_half_precision(device, dtype):
    x, w, b = ladder_inputs(33, 24, 5, device, seed=6, dtype=dtype)
    for t in (x, w, b):
        t.requires_grad_()
    out = univariate_ladder(x, w, b, impl="triton")
    out.sum().backward()
    assert out.dtype == x.grad.dtype == w.grad.dtype == dtype
    xr, wr, br = (t.detach().cpu().double().requires_grad_() for t in (x, w, b))
    reference_univariate_ladder(xr, wr, br).sum().backward()
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert rel_err(out.cpu(), reference_univariate_ladder(xr, wr, br)) < tol
    assert rel_err(x.grad.cpu(), xr.grad) < 2 * tol
    assert rel_err(w.grad.cpu(), wr.grad) < 2 * tol


def test_ladder_saves_only_its_inputs(device):
    x, w, b = ladder_inputs(16, 32, 7, device)
    x.requires_grad_()
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        univariate_ladder(x, w, b, impl="triton")
    assert len(saved) == 3 and all(s is t for s, t in zip(saved, (x, w, b), strict=True))


# ------------------------------------------------------------------ ladder_ensemble


def ensemble_reference(x, weight, mix, bias, upstream, grad="paper", eps=0.01):
    """Output and (x, weight, mix, bias) gradients of the ensemble, float64, by hand.

    The composite: L p univariate ladders on x repeated L times, mixed by V; per-unit
    gradients from the closed forms of the grad mode, then the chain rule.
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


def ensemble_inputs(rows, p, n_l, d, device, bias=True, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, p, generator=g, dtype=torch.float64)
    w = torch.randn(d, n_l, p, generator=g, dtype=torch.float64) * 0.5
    b = 1 + 0.1 * torch.randn(d, n_l, p, generator=g, dtype=torch.float64) if bias else None
    v = torch.randn(p, n_l, generator=g, dtype=torch.float64)
    return [None if t is None else t.to(device=device, dtype=dtype) for t in (x, w, v, b)]


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("ladders,depth", [(1, 1), (3, 5), (2, 8)])
def test_ladder_ensemble_matches_reference(device, ladders, depth, bias, grad):
    """Random x and W: some ladders sit on poles (clamped), so the grad modes differ."""
    x, w, v, b = ensemble_inputs(33, 27, ladders, depth, device, bias=bias, seed=depth)
    x = x.view(3, 11, 27)
    named = {"x": x, "weight": w, "mix": v, "bias": b}
    for t in named.values():
        if t is not None:
            t.requires_grad_()
    out = ladder_ensemble(x, w, v, b, grad=grad, impl="triton")
    upstream = upstream_like(x.shape, device, seed=3).double()
    (out * upstream).sum().backward()
    want = ensemble_reference(x, w, v, b, upstream, grad)
    assert out.shape == x.shape
    assert rel_err(out.cpu(), want["out"]) < 1e-10
    for name, t in named.items():
        if t is not None:
            assert rel_err(t.grad.cpu(), want[name]) < 1e-10, name


def test_ladder_ensemble_float32_and_bf16(device):
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        x, w, v, b = ensemble_inputs(40, 70, 3, 5, device, seed=1, dtype=dtype)
        named = {"x": x, "weight": w, "mix": v, "bias": b}
        for t in named.values():
            t.requires_grad_()
        out = ladder_ensemble(x, w, v, b, impl="triton")
        upstream = torch.ones_like(out)
        out.backward(upstream)
        want = ensemble_reference(x, w, v, b, upstream)
        assert out.dtype == dtype
        assert rel_err(out.cpu(), want["out"]) < tol
        for name, t in named.items():
            assert t.grad.dtype == dtype and rel_err(t.grad.cpu(), want[name]) < 2 * tol, name


def positive_ensemble_reference(x, w, v, b, floor):
    """The positive-denominator ensemble in float64 with plain autograd."""
    d, n_l, p = w.shape
    repeated = x.unsqueeze(-2).expand(*x.shape[:-1], n_l, p).flatten(-2)
    b2 = None if b is None else b.reshape(d, n_l * p)
    z = reference_univariate_ladder(repeated, w.reshape(d, n_l * p), b2, floor=floor)
    return torch.einsum("...lp,pl->...p", z.unflatten(-1, (n_l, p)), v)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("ladders,depth", [(1, 1), (3, 5), (2, 8)])
def test_positive_ladder_ensemble_matches_reference(device, ladders, depth, bias):
    """floor > 0: a_k = floor + softplus(x w + b) for signed x, w, b (no poles anywhere)."""
    x, w, v, b = ensemble_inputs(33, 27, ladders, depth, device, bias=bias, seed=depth)
    w = w * 4  # wide preactivations: both tails of the softplus
    x = x.view(3, 11, 27)
    named = {"x": x, "weight": w, "mix": v, "bias": b}
    for t in named.values():
        if t is not None:
            t.requires_grad_()
    out = ladder_ensemble(x, w, v, b, impl="triton", floor=0.5)
    upstream = upstream_like(x.shape, device, seed=3).double()
    (out * upstream).sum().backward()
    ref_inputs = {
        k: None if t is None else t.detach().cpu().requires_grad_() for k, t in named.items()
    }
    ref = positive_ensemble_reference(
        ref_inputs["x"], ref_inputs["weight"], ref_inputs["mix"], ref_inputs["bias"], 0.5
    )
    (ref * upstream.cpu()).sum().backward()
    assert rel_err(out.cpu(), ref) < 1e-10
    for name, t in named.items():
        if t is not None:
            assert rel_err(t.grad.cpu(), ref_inputs[name].grad) < 1e-10, name


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_positive_univariate_ladder_matches_reference(device, dtype, tol):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(2, 35, 19, generator=g) * 3).to(device=device, dtype=dtype)
    w = torch.randn(5, 19, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(5, 19, generator=g).to(device=device, dtype=dtype)
    for t in (x, w, b):
        t.requires_grad_()
    out = univariate_ladder(x, w, b, impl="triton", floor=0.5)
    upstream = upstream_like(x.shape, device, seed=2).to(dtype)
    (out * upstream).sum().backward()
    ref_in = [t.detach().cpu().double().requires_grad_() for t in (x, w, b)]
    ref = reference_univariate_ladder(*ref_in, floor=0.5)
    (ref * upstream.cpu().double()).sum().backward()
    assert out.dtype == dtype and rel_err(out.cpu(), ref) < tol
    for got, want in zip((x, w, b), ref_in, strict=True):
        assert rel_err(got.grad.cpu(), want.grad) < 2 * tol


def test_cffn_elementwise_uses_the_fused_kernel(device, monkeypatch):
    """Cffn(ladder="elementwise", impl="triton") equals the continuant path, and fuses."""
    torch.manual_seed(0)
    base = Cffn(24, 3, 4, ladder="elementwise").double().to(device)
    x = 0.5 * torch.randn(2, 5, 24, dtype=torch.float64, device=device)
    results = {}
    for impl in ("continuant", "triton"):
        layer = Cffn(24, 3, 4, ladder="elementwise", impl=impl).double().to(device)
        layer.load_state_dict(base.state_dict())
        xi = x.clone().requires_grad_()
        layer(xi).square().sum().backward()
        results[impl] = (layer(x), xi.grad, [p.grad for p in layer.parameters()])
    calls = []
    monkeypatch.setattr(
        kernels.ladder,
        "ladder_ensemble_fwd_kernel",
        _Spy(kernels.ladder.ladder_ensemble_fwd_kernel, calls),
    )
    layer(x)
    # one launch for the whole ensemble, and one no-grad ladder pass recording z's range
    assert sorted(c["L"] for c in calls) == [1, 3]
    calls.clear()
    layer.output_range = None  # no clipping: the fused launch alone
    layer(x)
    assert [c["L"] for c in calls] == [3]
    (out, gx, grads), (ref_out, ref_gx, ref_grads) = results["triton"], results["continuant"]
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-9, atol=1e-12)
    for g, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-12)


class _Spy:
    """Wraps a kernel, recording the constexprs of each launch."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


# --------------------------------------------------------------------------- the rest


def test_triton_on_a_cpu_tensor_without_the_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(runtime, "interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        continued_fraction(torch.rand(4, 3), impl="triton")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        univariate_ladder(torch.rand(4, 3), torch.rand(2, 3), impl="triton")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        kernels.continued_fraction_fwd(torch.rand(4, 3), 0.01)


def test_auto_picks_triton_on_cuda_only(monkeypatch):
    assert resolve_impl("auto", 1 << 20, torch.device("cuda")) == "triton"
    assert resolve_impl("auto", 10, torch.device("cuda", 0)) == "triton"
    assert resolve_impl("auto", 10, torch.device("cpu")) == "continuant"
    assert resolve_impl("auto", 1 << 20, torch.device("cpu")) == "compiled"
    assert resolve_impl("triton", 10, torch.device("cpu")) == "triton"


def test_poisoned_buffers_are_nan():
    out = runtime.new_output((3,), torch.float32, torch.device("cpu"))
    assert torch.isnan(out).all()


def test_empty_inputs(device):
    a = torch.rand(0, 3, device=device, requires_grad=True)
    out = continued_fraction(a, impl="triton")
    out.sum().backward()
    assert out.shape == (0,) and a.grad.shape == (0, 3)
    x, w = torch.rand(0, 4, device=device, requires_grad=True), torch.rand(2, 4, device=device)
    w.requires_grad_()
    univariate_ladder(x, w, impl="triton").sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


@pytest.mark.slow
def test_kernels_compile_for_hopper_without_a_gpu():
    """Triton's compiler, not its interpreter: every kernel compiles to a cubin for sm_90.

    The interpreter runs the Python source of a kernel directly, so a kernel can pass
    every test above and still fail to compile; this catches that on a CPU machine
    (2-10 minutes with a cold Triton cache: the unrolled backward kernels are large).
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet.ops.triton.aot", "--arch", "90"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled" in proc.stdout and "sm_90" in proc.stdout

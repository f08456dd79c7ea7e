"""The continued-fraction ops against their float64 references."""

from __future__ import annotations

import pytest
import torch

from cofrgenet.ops import (
    continued_fraction,
    denominator_stats,
    ladder_denominator_stats,
    positive_denominators,
    resolve_impl,
    univariate_ladder,
)
from cofrgenet.ops.reference import (
    reference_continued_fraction,
    reference_exact_grad,
    reference_paper_grad,
    reference_positive_denominators,
    reference_univariate_ladder,
    suffix_continuants,
)

FAST_IMPLS = ["continuant", "compiled"]
ALL_IMPLS = ["literal", *FAST_IMPLS]


def away_from_poles(*shape: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    """Positive partial denominators: every continuant of them is >= 1, no pole nearby."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)


def near_poles(rows: int, d: int, eps: float, seed: int = 0) -> torch.Tensor:
    """Partial denominators with |K_d| = |delta K(a_2..a_d)| < eps by construction.

    K_d = a_1 K(a_2..a_d) + K(a_3..a_d), so a_1 = -K(a_3..a_d) / K(a_2..a_d) + delta.
    """
    a = away_from_poles(rows, d, seed=seed)
    delta = (
        torch.rand(rows, generator=torch.Generator().manual_seed(seed + 1)).double() - 0.5
    ) * eps
    if d == 1:
        a[:, 0] = delta
        return a
    tail = suffix_continuants(a[:, 1:])
    a[:, 0] = -tail[-2] / tail[-1] + delta / tail[-1]
    return a


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (
        (got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)
    ).item()


# ------------------------------------------------------------------- forward and backward


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("d", range(1, 9))
@pytest.mark.parametrize("shape", [(1,), (37,), (3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_continued_fraction_matches_reference(impl, d, shape):
    a = away_from_poles(*shape, d, dtype=torch.float32, seed=d).requires_grad_()
    out = continued_fraction(a, impl=impl)
    upstream = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    (out * upstream).sum().backward()
    assert out.shape == shape and out.dtype == torch.float32
    assert rel_err(out, reference_continued_fraction(a.detach())) < 1e-5
    want = reference_paper_grad(a.detach()) * upstream.double().unsqueeze(-1)
    assert rel_err(a.grad, want) < 1e-5


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("d", [1, 2, 5, 8])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_univariate_ladder_matches_reference(impl, d, bias):
    x = (torch.rand(4, 3, 13, dtype=torch.float64) + 0.5).float().requires_grad_()
    w = away_from_poles(d, 13, dtype=torch.float32, seed=d).requires_grad_()
    b = away_from_poles(d, 13, dtype=torch.float32, seed=d + 9).requires_grad_() if bias else None
    out = univariate_ladder(x, w, b, impl=impl)
    upstream = torch.randn(4, 3, 13, generator=torch.Generator().manual_seed(2))
    (out * upstream).sum().backward()

    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    br = b.detach().double().requires_grad_() if bias else None
    ref = reference_univariate_ladder(xr, wr, br)
    (ref * upstream.double()).sum().backward()
    assert rel_err(out, ref) < 1e-5
    assert rel_err(x.grad, xr.grad) < 1e-5
    assert rel_err(w.grad, wr.grad) < 1e-5
    if bias:
        assert rel_err(b.grad, br.grad) < 1e-5


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_gradcheck_float64(grad, impl):
    a = away_from_poles(6, 4, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: continued_fraction(t, grad=grad, impl=impl), (a,))
    x = (torch.rand(3, 5, dtype=torch.float64) + 0.5).requires_grad_()
    w = away_from_poles(3, 5, seed=4).requires_grad_()
    b = away_from_poles(3, 5, seed=5).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda *t: univariate_ladder(*t, grad=grad, impl=impl), (x, w, b)
    )


# ------------------------------------------------------------------------- the clamp


@pytest.mark.parametrize("impl", FAST_IMPLS)
@pytest.mark.parametrize("d", [1, 2, 3, 6])
def test_clamped_region_both_grad_modes(impl, d):
    eps = 0.01
    a = near_poles(50, d, eps, seed=d)
    assert (suffix_continuants(a)[-1].abs() < eps).all()

    a32 = a.float().requires_grad_()
    out = continued_fraction(a32, eps=eps, impl=impl)
    # Value: K_{d-1} / (sign(K_d) eps).
    assert rel_err(out, reference_continued_fraction(a, eps)) < 1e-4

    for grad, reference in (("paper", reference_paper_grad), ("exact", reference_exact_grad)):
        a64 = a.clone().requires_grad_()
        (g,) = torch.autograd.grad(
            continued_fraction(a64, eps=eps, grad=grad, impl=impl).sum(), a64
        )
        assert rel_err(g, reference(a, eps)) < 1e-9, grad
    # The two modes really differ where the clamp is active.
    assert not torch.allclose(reference_paper_grad(a, eps), reference_exact_grad(a, eps))


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_exact_mode_is_the_gradient_of_the_clamped_function(impl):
    """Finite differences of the clamped function agree with grad="exact", not "paper"."""
    eps = 0.01
    a = near_poles(20, 3, eps, seed=11).requires_grad_()
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


def test_sign_of_zero_clamps_to_plus_eps():
    a = torch.tensor([[0.0]])
    assert continued_fraction(a, eps=0.5, impl="continuant").item() == pytest.approx(2.0)
    assert continued_fraction(a, eps=0.5, impl="literal").item() == pytest.approx(2.0)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_large_depth_and_magnitude_stay_finite(impl):
    """d = 32 with |a| ~ 100: K_d ~ 1e64 overflows float32 without rescaling."""
    g = torch.Generator().manual_seed(7)
    a = (torch.rand(300, 32, generator=g) * 100 + 50) * torch.where(
        torch.rand(300, 32, generator=g) < 0.5, -1.0, 1.0
    )
    a.requires_grad_()
    out = continued_fraction(a, impl=impl)
    (grad,) = torch.autograd.grad(out.sum(), a)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    assert rel_err(out, reference_continued_fraction(a.detach())) < 1e-5
    assert rel_err(grad, reference_paper_grad(a.detach())) < 1e-4


@pytest.mark.parametrize("impl", FAST_IMPLS)
def test_ladder_large_depth_stays_finite(impl):
    x = torch.rand(8, 16) * 50 + 50
    w = torch.rand(32, 16) + 1
    b = torch.rand(32, 16)
    x.requires_grad_()
    out = univariate_ladder(x, w, b, impl=impl)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert rel_err(out, reference_univariate_ladder(x.detach(), w, b)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_half_precision_inputs(dtype, impl):
    a = away_from_poles(64, 5, dtype=dtype, seed=1).requires_grad_()
    out = continued_fraction(a, impl=impl)
    out.sum().backward()
    assert out.dtype == dtype and a.grad.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    assert rel_err(out, reference_continued_fraction(a.detach())) < tol
    assert rel_err(a.grad, reference_paper_grad(a.detach())) < 2 * tol


# --------------------------------------------------------------------------- memory


def test_ladder_saves_no_depth_sized_tensor():
    """The continuant ladder keeps only (..., n)-sized tensors (and the params) for backward."""
    x = torch.rand(16, 32, requires_grad=True)
    w = torch.rand(7, 32, requires_grad=True)
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        univariate_ladder(x, w, impl="continuant")
    assert saved, "nothing saved: the test would be vacuous"
    assert all(s.numel() <= x.numel() for s in saved), saved


# ------------------------------------------------------------------------ bad input


def test_errors_name_the_problem():
    a = torch.rand(3, 4)
    with pytest.raises(ValueError, match="d >= 1"):
        continued_fraction(torch.rand(3, 0))
    with pytest.raises(TypeError, match="floating-point"):
        continued_fraction(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps"):
        continued_fraction(a, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        continued_fraction(a, eps=-1.0)
    with pytest.raises(ValueError, match="unknown impl 'fast'"):
        continued_fraction(a, impl="fast")
    with pytest.raises(ValueError, match="unknown grad mode 'true'"):
        continued_fraction(a, grad="true")
    x, w = torch.rand(2, 5), torch.rand(3, 5)
    with pytest.raises(ValueError, match="last dimension"):
        univariate_ladder(torch.rand(2, 4), w)
    with pytest.raises(ValueError, match="depth d >= 1"):
        univariate_ladder(x, torch.rand(0, 5))
    with pytest.raises(ValueError, match="bias must have"):
        univariate_ladder(x, w, torch.rand(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        univariate_ladder(x.long(), w)


# ------------------------------------------------------------------------ the rest


def test_auto_stays_eager_for_small_inputs_and_honours_the_switch(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_impl("auto", 10, cpu) == "continuant"
    assert resolve_impl("auto", 1 << 20, cpu) == "compiled"
    monkeypatch.setenv("COFRGENET_COMPILE", "0")
    assert resolve_impl("auto", 1 << 20, cpu) == "continuant"
    assert resolve_impl("literal", 1 << 20, cpu) == "literal"


def test_denominator_stats():
    eps = 0.01
    a = torch.cat([near_poles(10, 3, eps), away_from_poles(30, 3)])
    stats = denominator_stats(a, eps)
    true_kd = suffix_continuants(a)[-1].abs()
    assert stats.clamped.item() == pytest.approx(0.25)
    assert stats.near_pole.item() == pytest.approx((true_kd < 0.1).double().mean().item())
    assert stats.near_pole.item() >= 0.25
    assert stats.min_abs_kd.item() == pytest.approx(true_kd.min().item(), rel=1e-6)
    values = reference_continued_fraction(a, eps).abs()
    assert stats.max_abs_value.item() == pytest.approx(values.max().item(), rel=1e-6)
    x, w = torch.rand(4, 6) + 1, torch.rand(2, 6) + 1
    stats = ladder_denominator_stats(x, w, None, eps)
    assert stats.clamped.item() == 0.0 and stats.near_pole.item() == 0.0
    assert stats.min_abs_kd.item() > 1.0


# ---------------------------------------------------------------- positive denominators


def test_positive_denominators_reference_and_errors():
    u = torch.linspace(-40, 40, 101, dtype=torch.float64)
    a = positive_denominators(u, 0.5)
    # torch's softplus returns u itself above u = 20: 2e-9 away, relative 1e-10.
    assert torch.allclose(a, reference_positive_denominators(u, 0.5), rtol=1e-9, atol=0)
    assert a.min() >= 0.5 and a.dtype == torch.float64
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="floor must be None"):
            positive_denominators(u, bad)
        with pytest.raises(ValueError, match="floor must be None"):
            univariate_ladder(u[None, :3].float(), torch.ones(2, 3), floor=bad)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("d", [1, 2, 5, 8])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_positive_univariate_ladder_matches_reference(impl, d, bias):
    g = torch.Generator().manual_seed(d)
    # Signed inputs and weights of both signs: the paper's form would cross poles here.
    x = (torch.randn(3, 5, 11, generator=g) * 2).requires_grad_()
    w = torch.randn(d, 11, generator=g).requires_grad_()
    b = torch.randn(d, 11, generator=g).requires_grad_() if bias else None
    out = univariate_ladder(x, w, b, impl=impl, floor=0.5)
    upstream = torch.randn(out.shape, generator=g)
    (out * upstream).sum().backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    b64 = None if b is None else b.detach().double().requires_grad_()
    ref = reference_univariate_ladder(x64, w64, b64, floor=0.5)
    (ref * upstream.double()).sum().backward()
    assert rel_err(out, ref) < 1e-5
    pairs = [(x, x64), (w, w64)] + ([(b, b64)] if bias else [])
    for got, want in pairs:
        assert rel_err(got.grad, want.grad) < 1e-5


@pytest.mark.parametrize("impl", ["continuant", "compiled"])
def test_positive_ladder_gradcheck_float64(impl):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(4, 6, generator=g, dtype=torch.float64) * 3).requires_grad_()
    w = torch.randn(4, 6, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(4, 6, generator=g, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w, b: univariate_ladder(x, w, b, impl=impl, floor=0.25), (x, w, b)
    )


@pytest.mark.parametrize("floor", [0.1, 0.5, 1.0, 2.0])
def test_positive_denominators_have_no_poles(floor):
    """Any input, any weights: K_d >= min(1, floor), |f~| <= 1 / floor, and every
    |d f~ / d a_k| <= 1 / min(1, floor)^2 (the bounds docs/layers.md derives)."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(20000, 7, generator=g, dtype=torch.float64) * 10  # far outside any init
    a = positive_denominators(u, floor)
    stats = denominator_stats(a, eps=0.01)
    bound = min(1.0, floor)
    assert stats.clamped.item() == 0.0
    assert stats.min_abs_kd.item() >= bound * (1 - 1e-12)
    assert stats.max_abs_value.item() <= 1 / floor * (1 + 1e-12)
    grads = reference_paper_grad(a)
    assert grads.abs().max().item() <= 1 / bound**2 * (1 + 1e-12)


def test_inference_path_equals_the_autograd_path():
    """Without grad, the ops skip their autograd Function: the same values."""
    from cofrgenet.ops import continued_fraction, univariate_ladder

    a = torch.rand(6, 4, 5, dtype=torch.float64) + 0.5
    with torch.no_grad():
        plain = continued_fraction(a, impl="continuant")
    tracked = continued_fraction(a.clone().requires_grad_(), impl="continuant")
    torch.testing.assert_close(plain, tracked.detach(), rtol=0, atol=0)
    x = torch.randn(7, 9, dtype=torch.float64)
    w, b = torch.randn(3, 9, dtype=torch.float64), torch.randn(3, 9, dtype=torch.float64)
    with torch.no_grad():
        plain = univariate_ladder(x, w, b, impl="continuant", floor=0.5)
    tracked = univariate_ladder(x, w.requires_grad_(), b, impl="continuant", floor=0.5)
    torch.testing.assert_close(plain, tracked.detach(), rtol=0, atol=0)

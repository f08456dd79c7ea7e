"""ladder_ensemble (the elementwise Cffn's ladders): every implementation against float64.

triton runs one fused kernel each way; the others run univariate_ladder on x repeated L
times, then mix. Random x and W put some ladders on poles, where only the implementations
that clamp K_d alone (op_cases.CLAMPING) agree with the closed forms; literal joins on
positive denominators (no poles).
"""

from __future__ import annotations

import pytest
import torch

from cofrgenet.nn import Cffn
from cofrgenet.nn.ladder import recording_paused
from cofrgenet.ops import custom_ops as ops
from cofrgenet.ops import ladder_ensemble
from op_cases import (
    CLAMPING,
    assert_close_to_magnitude,
    compiles_fullgraph,
    ensemble_clamped_units,
    ensemble_inputs,
    ensemble_overflow_inputs,
    ensemble_reference,
    impls,
    onto_poles,
    positive_ensemble_reference,
    rel_err,
    require_grad,
    upstream_like,
)

NAMES = ("x", "weight", "mix", "bias")


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("ladders,depth", [(1, 1), (3, 5), (2, 8)])
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_matches_reference(impl, on, ladders, depth, bias, grad):
    """float64, random x and W, some ladders moved onto poles: clamped units, so the grad
    modes differ (random draws alone leave none in some cases)."""
    x, w, v, b = ensemble_inputs(33, 27, ladders, depth, on, bias=bias, seed=depth)
    w, b = onto_poles(x, w, b, seed=depth)
    assert ensemble_clamped_units(x, w, b) > 0  # a guard: the grad modes are told apart
    leaves = require_grad(x.view(3, 11, 27), w, v, b)
    out = ladder_ensemble(*leaves, grad=grad, impl=impl)
    upstream = upstream_like(out.shape, on, seed=3, dtype=torch.float64)
    (out * upstream).sum().backward()
    want = ensemble_reference(*leaves, upstream, grad)
    assert out.shape == (3, 11, 27)
    assert rel_err(out, want["out"]) < 1e-10
    for name, t in zip(NAMES, leaves, strict=True):
        if t is not None:
            assert rel_err(t.grad, want[name]) < 1e-10, name


@pytest.mark.parametrize("grad", ["paper", "exact"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize(
    "rows,p,ladders,depth",
    [(131, 27, 3, 5), (1, 1, 1, 1), (1, 1, 1, 3), (2, 1, 2, 2)],
    ids=["several-row-blocks", "one-unit", "one-unit-deep", "one-channel"],
)
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_row_blocks_and_degenerate_shapes(impl, on, rows, p, ladders, depth, bias, grad):
    """131 rows: the Triton kernel runs several row programs, whose partial sums of the
    weight gradients it adds up (33 rows fit one on CPU); one row, one channel, one
    ladder: the smallest shapes."""
    x, w, v, b = ensemble_inputs(rows, p, ladders, depth, on, bias=bias, seed=2)
    leaves = require_grad(x, w, v, b)
    out = ladder_ensemble(*leaves, grad=grad, impl=impl)
    upstream = upstream_like(out.shape, on, seed=3, dtype=torch.float64)
    (out * upstream).sum().backward()
    want = ensemble_reference(*leaves, upstream, grad)
    assert rel_err(out, want["out"]) < 1e-10
    for name, t in zip(NAMES, leaves, strict=True):
        if t is not None:
            assert rel_err(t.grad, want[name]) < 1e-10, name


@pytest.mark.parametrize(
    "dtype,rtol", [(torch.float32, 2e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"]
)
@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_float32_and_bf16(impl, on, dtype, rtol):
    """Random x and W, a few units on poles: x gradients reach 5e4 (median 0.17), so a
    bound relative to the largest element checked none of the others. Each element of
    the output and of every gradient is within ``rtol`` of the magnitude of its terms
    (ensemble_reference's magnitudes): in float32, near-pole units lose up to 6.7e-5 to
    cancellation in K_d (1e-6 where every |K_d| > 1); in bf16, computed in float32 and
    rounded (the continuant paths also round each ladder's value), up to 8.6e-3."""
    leaves = require_grad(*ensemble_inputs(40, 70, 3, 5, on, seed=1, dtype=dtype))
    x, w, _, b = leaves
    assert ensemble_clamped_units(x, w, b) > 0  # a guard: units on poles
    out = ladder_ensemble(*leaves, impl=impl)
    upstream = upstream_like(out.shape, on, seed=3, dtype=dtype)
    out.backward(upstream)
    want = ensemble_reference(*leaves, upstream)
    magnitude = ensemble_reference(*leaves, upstream, magnitudes=True)
    assert out.dtype == dtype
    assert_close_to_magnitude(out, want["out"], magnitude["out"], rtol, "out")
    for name, t in zip(NAMES, leaves, strict=True):
        assert t.grad.dtype == dtype
        assert_close_to_magnitude(t.grad, want[name], magnitude[name], rtol, name)


@pytest.mark.parametrize("impl", impls())
def test_bf16_inputs_with_float32_parameters_give_bf16(impl, on):
    """A Cffn under autocast hands the ladders a bf16 x beside its float32 weights and mix:
    every implementation returns x's dtype (the mixing alone promoted to float32 in
    literal and continuant, while the fused kernel wrote bf16), with float32 gradients
    of the float32 leaves."""
    x, w, mix, b = ensemble_inputs(6, 10, 3, 4, on, seed=2, dtype=torch.float32)
    x = x.to(torch.bfloat16).requires_grad_()
    w, mix, b = require_grad(w, mix, b)
    out = ladder_ensemble(x, w, mix, b, impl=impl)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16
    assert w.grad.dtype == mix.grad.dtype == b.grad.dtype == torch.float32


@pytest.mark.parametrize("impl", impls(*CLAMPING))
def test_float32_overflow_matches_reference(impl, on):
    """float32, ladder 0 of every unit overflowing K_d (d = 16, a ~ 1e3: rescaled tiles)
    beside ladder 1 that does not: the value and the gradients of x, weight, mix and
    bias, element by element wherever normal float32 numbers, within 1e-5 of the
    magnitude of their terms (observed 6e-7)."""
    leaves = require_grad(*ensemble_overflow_inputs(on))
    out = ladder_ensemble(*leaves, impl=impl)
    upstream = upstream_like(out.shape, on, seed=3)
    out.backward(upstream)
    assert torch.isfinite(out).all()
    want = ensemble_reference(*leaves, upstream)
    magnitude = ensemble_reference(*leaves, upstream, magnitudes=True)
    for name, got in zip(("out", *NAMES), (out, *(t.grad for t in leaves)), strict=True):
        assert torch.isfinite(got).all(), name
        normal = want[name].abs() > 1e-30
        if name in ("weight", "bias"):  # a guard: deep depths of ladder 0 underflow
            assert normal[:4].all() and normal[:, 1].all(), name
        else:
            assert normal.all(), name
        assert_close_to_magnitude(
            got.cpu()[normal], want[name][normal], magnitude[name][normal], 1e-5, name
        )


@pytest.mark.parametrize("exact", [False, True], ids=["paper", "exact"])
@pytest.mark.parametrize("mixed", [False, True], ids=["ladder", "ensemble"])
@pytest.mark.parametrize("d", [1, 4, 7])
@pytest.mark.parametrize("impl", impls("triton"))
def test_rescaled_kernels_change_no_bits(impl, on, d, mixed, exact):
    """The rescaled ladder kernels (forced) give the unscaled kernels' bits where nothing
    overflows: the value and the gradients of x, weight, bias (and mix), for univariate
    ladders (no mix) and mixed ensembles, with units on poles (exact mode rebuilds their
    prefix continuants, rescaled too). test_float32_overflow_matches_reference checks
    the rescaled tiles' values; this checks every branch of them, bit for bit."""
    from cofrgenet.ops import triton as kernels

    x, w, v, b = ensemble_inputs(33, 27, 3 if mixed else 1, d, on, seed=d, dtype=torch.float32)
    w, b = onto_poles(x, w, b, seed=d)
    assert ensemble_clamped_units(x, w, b) > 0  # a guard: clamped units
    v = v if mixed else None
    upstream = upstream_like(x.shape, on, seed=3)
    results = {}
    for force in (False, True):
        out = kernels.ladder_ensemble_fwd(x, w, b, v, 0.01, force_rescale=force)
        grads = kernels.ladder_ensemble_bwd(x, w, b, v, upstream, 0.01, exact, force_rescale=force)
        results[force] = (out, *grads)
    names = ("out", "x", "weight", "bias", "mix")  # ladder_ensemble_bwd's order
    for name, got, plain in zip(names, results[True], results[False], strict=True):
        assert (got is None) == (plain is None) == (name == "mix" and not mixed), name
        if got is None:
            continue
        if on.type == "cpu":
            assert torch.equal(got, plain), name
        else:  # the two compiled variants may contract multiply-adds differently
            torch.testing.assert_close(got, plain, rtol=1e-6, atol=0, msg=name)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("ladders,depth", [(1, 1), (3, 5), (2, 8)])
@pytest.mark.parametrize("impl", impls())
def test_positive_matches_reference(impl, on, ladders, depth, bias):
    """floor > 0: a_k = floor + softplus(x w + b) for signed x, w, b (no poles anywhere)."""
    x, w, v, b = ensemble_inputs(33, 27, ladders, depth, on, bias=bias, seed=depth)
    leaves = require_grad(x.view(3, 11, 27), w * 4, v, b)  # w * 4: both softplus tails
    out = ladder_ensemble(*leaves, impl=impl, floor=0.5)
    upstream = upstream_like(out.shape, on, seed=3, dtype=torch.float64)
    (out * upstream).sum().backward()
    ref_leaves = [None if t is None else t.detach().cpu().requires_grad_() for t in leaves]
    ref = positive_ensemble_reference(*ref_leaves, 0.5)
    (ref * upstream.cpu()).sum().backward()
    assert rel_err(out, ref) < 1e-10
    for name, t, r in zip(NAMES, leaves, ref_leaves, strict=True):
        if t is not None:
            assert rel_err(t.grad, r.grad) < 1e-10, name


# ------------------------------------------------------------ the custom op, compiled


@pytest.mark.parametrize("impl", impls("triton"))
def test_custom_op(impl, on):
    """The ensemble's torch.library op (triton only: the others compose univariate_ladder)."""
    x, w, v, b = ensemble_inputs(10, 12, 2, 3, on, dtype=torch.float32)
    x, w, v, b = require_grad(x.view(2, 5, 12), w, v, b)
    # Eager and AOT autograd hand the backward kernel differently laid out gradients (an
    # expanded one against a contiguous one); Triton specializes on strides, and the two
    # builds round apart by a few ulps where the gradient is large (on an H200, 2026-12-04:
    # 1 element of 120 at 1.9e-6 relative, against opcheck's float32 default of 1.3e-6).
    tolerance = {"atol": 1e-5, "rtol": 1e-5}
    for bias, exact, floor in ((b, False, 0.0), (None, True, 0.0), (b, False, 0.5)):
        args = (x, w, bias, v, 0.01, exact, floor)
        torch.library.opcheck(ops.ladder_ensemble_op, args, **tolerance)


@pytest.mark.parametrize("impl", impls("continuant", "triton"))
def test_compiles_fullgraph(impl, on):
    """No graph break (fullgraph=True), forward and backward, equal to eager."""
    x, w, v, b = ensemble_inputs(10, 12, 2, 3, on, dtype=torch.float32)
    leaves = [x.view(2, 5, 12), w, v, b]
    compiles_fullgraph(lambda x, w, v, b: ladder_ensemble(x, w, v, b, impl=impl), leaves)


# ------------------------------------------------------------------- in the Cffn


class _Spy:
    """Wraps a kernel, recording the constexprs of each launch."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(kwargs)
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.parametrize("impl", impls("triton"))
def test_cffn_elementwise_uses_the_fused_kernel(impl, on, monkeypatch):
    """Cffn(ladder="elementwise", impl="triton") equals the continuant path, and fuses."""
    from cofrgenet.ops import triton as kernels

    torch.manual_seed(0)
    base = Cffn(24, 3, 4, ladder="elementwise").double().to(on)
    x = 0.5 * torch.randn(2, 5, 24, dtype=torch.float64, device=on)
    results = {}
    for name in ("continuant", impl):
        layer = Cffn(24, 3, 4, ladder="elementwise", impl=name).double().to(on)
        layer.load_state_dict(base.state_dict())
        xi = x.clone().requires_grad_()
        layer(xi).square().sum().backward()
        results[name] = (layer(x), xi.grad, [p.grad for p in layer.parameters()])
    calls = []
    kernel = kernels.ladder.ladder_ensemble_fwd_kernel
    monkeypatch.setattr(kernels.ladder, "ladder_ensemble_fwd_kernel", _Spy(kernel, calls))
    layer(x)
    # one launch for the whole ensemble, and one no-grad ladder pass recording z's range
    assert sorted(c["L"] for c in calls) == [1, 3]
    calls.clear()
    with recording_paused(layer):  # activation checkpointing's replay: nothing to record
        layer(x)
    assert [c["L"] for c in calls] == [3]
    calls.clear()
    layer.output_range = None  # no clipping: the fused launch alone
    layer(x)
    assert [c["L"] for c in calls] == [3]
    (out, gx, grads), (ref_out, ref_gx, ref_grads) = results[impl], results["continuant"]
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gx, ref_gx, rtol=1e-9, atol=1e-12)
    for g, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shape", [(7, 1, 5), (2, 3, 4, 9)], ids=["L1", "L4"])
def test_mix_ensemble_is_the_einsum(shape):
    """The broadcast-and-sum mix of the non-fused paths against the einsum it replaced:
    float64 values and both gradients, odd shapes (one ladder, a batch dimension)."""
    from cofrgenet.ops import mix_ensemble

    torch.manual_seed(0)
    z = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    mix = torch.randn(shape[-1], shape[-2], dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(*shape[:-2], shape[-1], dtype=torch.float64)
    got = mix_ensemble(z, mix)
    want = torch.einsum("...lp,pl->...p", z, mix)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((got * upstream).sum(), (z, mix))
    want_grads = torch.autograd.grad((want * upstream).sum(), (z, mix))
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)

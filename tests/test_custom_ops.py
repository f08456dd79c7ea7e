"""The ops as torch.library custom ops: registration checks and torch.compile without breaks.

``fullgraph=True`` turns any graph break into an error, so these tests prove that a
model using the ops compiles into one graph, forward and backward. On CPU the continuant
path runs inside the op (its data-dependent overflow check would otherwise break the
graph) and the triton path runs in Triton's interpreter; on a GPU the same tests run the
kernels on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from cofrgenet.nn import Cffn
from cofrgenet.ops import continued_fraction, ladder_ensemble, univariate_ladder
from cofrgenet.ops import custom_ops as ops
from test_ops import away_from_poles

pytest.importorskip("triton")


def cf_args(device, requires_grad=True):
    a = away_from_poles(7, 3, 4, dtype=torch.float32, seed=1).to(device)
    return a.requires_grad_(requires_grad)


def ladder_args(device):
    x = (torch.rand(5, 9, generator=torch.Generator().manual_seed(0)) + 0.5).to(device)
    w = away_from_poles(3, 9, dtype=torch.float32, seed=2).to(device)
    b = away_from_poles(3, 9, dtype=torch.float32, seed=3).to(device)
    return [t.requires_grad_() for t in (x, w, b)]


def ensemble_args(device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 12, generator=g)
    w = torch.randn(3, 2, 12, generator=g) * 0.5
    b = 1 + 0.1 * torch.randn(3, 2, 12, generator=g)
    v = torch.randn(12, 2, generator=g)
    return [t.to(device).requires_grad_() for t in (x, w, b, v)]


def backends(device: torch.device) -> list[str]:
    return ["torch", "triton"] if device.type == "cpu" else ["triton"]


# ----------------------------------------------------------------- registration checks


def test_opcheck_continued_fraction(device):
    for backend in backends(device):
        for exact in (False, True):
            torch.library.opcheck(
                ops.continued_fraction_op, (cf_args(device), 0.01, exact, backend)
            )
    # A depth-major input: the backward op promises empty_like(a)'s layout, and keeps it.
    a = cf_args(device).detach().permute(2, 0, 1).contiguous().permute(1, 2, 0).requires_grad_()
    for backend in backends(device):
        torch.library.opcheck(ops.continued_fraction_op, (a, 0.01, False, backend))


def test_opcheck_univariate_ladder(device):
    x, w, b = ladder_args(device)
    for backend in backends(device):
        torch.library.opcheck(ops.univariate_ladder_op, (x, w, b, 0.01, False, 0.0, backend))
        torch.library.opcheck(ops.univariate_ladder_op, (x, w, None, 0.01, True, 0.0, backend))
        torch.library.opcheck(ops.univariate_ladder_op, (x, w, b, 0.01, False, 0.5, backend))


def test_opcheck_ladder_ensemble(device):
    x, w, b, v = ensemble_args(device)
    torch.library.opcheck(ops.ladder_ensemble_op, (x, w, b, v, 0.01, False, 0.0))
    torch.library.opcheck(ops.ladder_ensemble_op, (x, w, None, v, 0.01, True, 0.0))
    torch.library.opcheck(ops.ladder_ensemble_op, (x, w, b, v, 0.01, False, 0.5))


# ------------------------------------------------------------------------ torch.compile


def _grads(fn, leaves):
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    out = fn(*leaves)
    out.square().sum().backward()
    return out.detach(), [t.grad for t in leaves]


def _assert_same(eager, compiled, rtol=1e-6, atol=1e-6):
    torch.testing.assert_close(compiled[0], eager[0], rtol=rtol, atol=atol)
    for got, want in zip(compiled[1], eager[1], strict=True):
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("impl", ["auto", "continuant", "triton"])
def test_ops_compile_fullgraph(device, impl):
    """continued_fraction and univariate_ladder in one compiled function, forward and
    backward, equal to eager (aot_eager: dynamo and AOTAutograd, no code generation)."""
    if impl == "continuant" and device.type == "cuda":
        pytest.skip("the continuant path is covered on CPU")

    def fn(a, x, w, b):
        y = continued_fraction(a, grad="exact", impl=impl)  # (7, 3)
        z = univariate_ladder(x, w, b, impl=impl)  # (5, 9)
        return y.sum(-1, keepdim=True) * z.sum(0) + z.mean()  # (7, 9)

    leaves = [cf_args(device), *ladder_args(device)]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    _assert_same(_grads(fn, leaves), _grads(compiled, leaves))


def test_ensemble_compiles_fullgraph(device):
    fn = lambda x, w, b, v: ladder_ensemble(x, w, v, b, impl="triton")  # noqa: E731
    leaves = ensemble_args(device)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    _assert_same(_grads(fn, leaves), _grads(compiled, leaves))


@pytest.mark.parametrize("ladder", ["scalar", "elementwise"])
def test_cffn_compiles_fullgraph_with_inductor(device, ladder):
    """A whole Cffn through inductor (C++ on CPU), default impl="auto", in one graph."""
    torch.manual_seed(0)
    layer = Cffn(16, 3, 4, ladder=ladder).to(device)
    x = torch.randn(2, 6, 16, device=device)

    def run(module):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        out = module(xi)
        out.square().sum().backward()
        return out.detach(), [xi.grad, *(p.grad.clone() for p in layer.parameters())]

    torch._dynamo.reset()
    eager = run(layer)
    _assert_same(eager, run(torch.compile(layer, fullgraph=True)), rtol=1e-5, atol=1e-6)


def test_choosing_triton_for_cuda_traces_without_a_graph_break():
    """The CUDA branch of impl="auto" (checked on any machine: no tensor on the GPU)."""
    from cofrgenet.ops import resolve_impl

    def fn(x):
        picked = resolve_impl("auto", 10, torch.device("cuda"))
        return x + (1.0 if picked == "triton" else 0.0)

    torch._dynamo.reset()
    assert torch.compile(fn, backend="eager", fullgraph=True)(torch.zeros(1)).item() == 1.0


def test_the_compiled_backend_equals_the_torch_one():
    """Inside a compiled graph, large CPU ladders run their own compiled kernels
    (backend "compiled"): the same values and gradients as the eager kernels."""
    a = cf_args("cpu").detach().double().requires_grad_()
    grads = []
    for backend in ("torch", "compiled"):
        out = ops.continued_fraction_op(a, 0.01, True, backend)
        (grad,) = torch.autograd.grad(out.sum(), a)
        grads.append((out.detach(), grad))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)
    x, w, b = (t.detach().double().requires_grad_() for t in ladder_args("cpu"))
    results = []
    for backend in ("torch", "compiled"):
        out = ops.univariate_ladder_op(x, w, b, 0.01, False, 0.5, backend)
        results.append((out.detach(), *torch.autograd.grad(out.sum(), (x, w, b))))
    torch.testing.assert_close(results[0], results[1], rtol=1e-12, atol=1e-12)
    torch.library.opcheck(ops.univariate_ladder_op, (x, w, b, 0.01, False, 0.5, "compiled"))

"""The workloads: an op on one input shape, its inputs, and the calls that get timed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from cofrgenet.bench.ops.formatting import pow2
from cofrgenet.nn import Cffn
from cofrgenet.ops import continued_fraction, ladder_ensemble, univariate_ladder

if TYPE_CHECKING:  # config.py builds workloads: a runtime import would be circular
    from cofrgenet.bench.ops.config import OpsBenchConfig

CFFN_OPS = ("cffn_scalar", "cffn_elementwise")
#: The pseudo-impl timing a Cffn layer's matmuls alone (gate and U, no ladders).
MATMULS = "matmuls"


@dataclass(frozen=True)
class Workload:
    """One op on one input shape.

    ``width`` is n (ladders) or p (ensembles, Cffn layers), None for continued_fraction;
    ``ladders`` is L for ensembles and Cffn layers.
    """

    op: str
    rows: int
    d: int
    width: int | None = None
    ladders: int | None = None

    @property
    def units(self) -> int:
        """Number of ladders evaluated (what ``resolve_impl`` looks at)."""
        if self.op == "cffn_scalar":
            return self.rows * (self.ladders or 1)
        return self.rows * (self.width or 1) * (self.ladders or 1)

    @property
    def shape(self) -> str:
        """The input shapes: a (N, d), x (rows, n) x weight (d, n), or x and (d, L, p)."""
        if self.width is None:
            return f"({pow2(self.rows)}, {self.d})"
        if self.ladders is None:
            return f"({pow2(self.rows)}, {self.width}) x ({self.d}, {self.width})"
        return f"({pow2(self.rows)}, {self.width}) x L={self.ladders}, d={self.d}"

    @property
    def label(self) -> str:
        """Short name for tables: ``cf 2^20 d=8``, ``ladder 1024x1024 d=8``,
        ``ensemble 8192x768 L=3 d=5`` or ``Cffn-scalar 8192x768 L=3 d=5``."""
        if self.width is None:
            return f"cf {pow2(self.rows)} d={self.d}"
        size = f"{pow2(self.rows)}x{self.width}"
        if self.ladders is None:
            return f"ladder {size} d={self.d}"
        name = "ensemble" if self.op == "ladder_ensemble" else self.op.replace("cffn_", "Cffn-")
        return f"{name} {size} L={self.ladders} d={self.d}"


def min_bytes(w: Workload, mode: str, itemsize: int) -> int | None:
    """Bytes an op must move at least: each input read once, each output written once.

    fwd+bwd adds the backward's reads (the op's inputs and the upstream gradient) and
    writes (a gradient per input). None for Cffn layers (matmuls: not bandwidth-bound).
    """
    if w.op in CFFN_OPS:
        return None
    if w.op == "continued_fraction":
        data_in, data_out, params = w.rows * w.d, w.rows, 0
    else:
        data_in = data_out = w.rows * (w.width or 1)
        n_l = w.ladders or 1
        params = 2 * w.d * n_l * (w.width or 1) + (n_l * (w.width or 1) if w.ladders else 0)
    forward = data_in + data_out + params
    if mode == "fwd":
        return forward * itemsize
    # backward: read inputs, params and the upstream gradient; write grads of both.
    backward = data_in + params + data_out + data_in + params
    return (forward + backward) * itemsize


def make_inputs(
    w: Workload, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, Tensor]:
    """Inputs that keep every ladder off poles, and a fixed upstream gradient.

    Partial denominators a (N, d) in [0.5, 1.5) for continued_fraction; for ladders and
    ensembles x (rows, n) and weight (d, n) or (d, L, p) in [0, 1), bias 0.5, so that
    a_k = weight * x + 0.5; Cffn layers get x (rows, p) ~ 0.3 N(0, 1). ``grad_out`` has
    the op's output shape: (N,) or (rows, n).
    """
    gen = torch.Generator().manual_seed(seed)
    if w.op == "continued_fraction":
        tensors = {
            "a": 0.5 + torch.rand(w.rows, w.d, generator=gen),
            "grad_out": torch.randn(w.rows, generator=gen),
        }
    elif w.op == "univariate_ladder":
        tensors = {
            "x": torch.rand(w.rows, w.width, generator=gen),
            "weight": torch.rand(w.d, w.width, generator=gen),
            "bias": torch.full((w.d, w.width), 0.5),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    elif w.op == "ladder_ensemble":
        tensors = {
            "x": torch.rand(w.rows, w.width, generator=gen),
            "weight": torch.rand(w.d, w.ladders, w.width, generator=gen),
            "bias": torch.full((w.d, w.ladders, w.width), 0.5),
            "mix": torch.randn(w.width, w.ladders, generator=gen),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    else:  # a Cffn layer
        tensors = {
            "x": 0.3 * torch.randn(w.rows, w.width, generator=gen),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    return {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}


def make_layer(w: Workload, dtype: torch.dtype, device: torch.device, seed: int) -> Cffn:
    """The Cffn of a layer workload, with its default (pole-avoiding) initialisation."""
    # Seeded without touching the global RNG, so other workloads' inputs do not change.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kind = w.op.removeprefix("cffn_")
        layer = Cffn(w.width, w.ladders, w.d, ladder=kind)
    return layer.to(device=device, dtype=dtype)


def forward_fn(
    w: Workload, impl: str, config: OpsBenchConfig, layer: Cffn | None = None
) -> Callable[[dict[str, Tensor]], Tensor]:
    """The forward of ``impl`` on the tensors of :func:`make_inputs`.

    Returns f (N,) for continued_fraction, (rows, n) for the others; with
    ``impl == MATMULS``, the Cffn layer's gate and U without its ladders.
    """
    kwargs = {"eps": config.eps, "grad": config.grad, "impl": impl}
    if w.op == "continued_fraction":
        return lambda t: continued_fraction(t["a"], **kwargs)
    if w.op == "univariate_ladder":
        return lambda t: univariate_ladder(t["x"], t["weight"], t["bias"], **kwargs)
    if w.op == "ladder_ensemble":
        return lambda t: ladder_ensemble(t["x"], t["weight"], t["mix"], t["bias"], **kwargs)
    assert layer is not None
    if impl == MATMULS:
        return lambda t: layer.linear(torch.sigmoid(layer.gate(t["x"])) * t["x"])

    def run_layer(t: dict[str, Tensor]) -> Tensor:
        layer.impl = impl
        return layer(t["x"])

    return run_layer


def make_call(
    w: Workload,
    inputs: dict[str, Tensor],
    impl: str,
    mode: str,
    config: OpsBenchConfig,
    layer: Cffn | None = None,
) -> Callable[[], None]:
    """A no-argument callable running one forward (or forward+backward) of ``impl``."""
    forward = forward_fn(w, impl, config, layer)
    if mode == "fwd":

        def call() -> None:
            with torch.no_grad():
                forward(inputs)

        return call

    # Leaves that require grad, private to this call so impls do not share .grad.
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if k != "grad_out"}
    grad_out = inputs["grad_out"]

    def call_backward() -> None:
        for leaf in leaves.values():
            leaf.grad = None
        if layer is not None:
            layer.zero_grad(set_to_none=True)
        forward(leaves).backward(grad_out)

    return call_backward

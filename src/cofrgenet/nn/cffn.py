"""Cffn: the continued-fraction feed-forward network of CoFrGeNet-F (spec section 3)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cofrgenet.nn.ladder import (
    DENOMINATOR_FLOOR,
    OUT_STD,
    LadderLayer,
    LadderWeights,
    OutputRange,
    denominator_init,
    fan_in_spread,
    resolve_ladder_bias,
)
from cofrgenet.ops import (
    ladder_denominator_stats,
    ladder_ensemble,
    mix_ensemble,
    resolve_impl,
    univariate_ladder,
)

LADDER_KINDS = ("scalar", "elementwise")
#: sigmoid(G x) is ~0.5 at initialisation (G small), so x^ = gate * x has half x's spread.
_GATE_AT_INIT = 0.5


class Cffn(LadderLayer):
    """Gated, non-expanded continued-fraction FFN: (..., dim) -> (..., dim).

    x^ = sigmoid(G x) * x (the gate; G: dim x dim), then

    * ``ladder="scalar"`` (the paper's reading, default): L p-variate ladders; ladder j has
      partial denominators a^(j) = link(W^(j) x^ (+ b^(j))) in R^d and gives one scalar
      z_j = f~(a^(j)); y = U x^ + V z with U: p x p, V: p x L.
    * ``ladder="elementwise"`` (the public re-implementation's reading): ladder ensemble j
      applies p univariate ladders, a[..., i, k] = link(x^_i W^(j)[i, k] (+ b^(j)[i, k])),
      z_j in R^p; y = U x^ + sum_j V[:, j] * z_j.

    link is floor + softplus (``denominators="positive"``, default: no poles) or the
    identity (``"paper"``, the final continuant clamped at ``eps``); see
    :mod:`cofrgenet.nn.ladder`. U and V start at std ``out_std``; ladder outputs z are
    clipped in eval mode to the range seen in training (``clip_outputs``).

    Parameters (p = dim, L = ladders, d = depth = number of partial denominators; the
    linear term U is "depth 0"):

        2 p^2 + L p (d + 1)                       weights (G, U, W, V)
        + 2 p                                     if bias (biases of G and U)
        + L d   (scalar) or L p d (elementwise)   if ladder_bias

    At p = 768, L = 3, d = 5 without biases: 1,193,472 (a 4x GELU MLP has 4,718,592).
    ``ladder_bias=None`` follows ``bias``.
    """

    def __init__(
        self,
        dim: int,
        ladders: int,
        depth: int,
        ladder: str = "scalar",
        bias: bool = True,
        ladder_bias: bool | None = None,
        eps: float = 0.01,
        grad: str = "paper",
        impl: str = "auto",
        denominators: str = "positive",
        floor: float = DENOMINATOR_FLOOR,
        out_std: float = OUT_STD,
        clip_outputs: bool = True,
    ) -> None:
        super().__init__(denominators, floor)
        if ladder not in LADDER_KINDS:
            raise ValueError(f"unknown Cffn ladder kind {ladder!r}; choose one of {LADDER_KINDS}")
        if ladders < 1:
            raise ValueError(f"Cffn needs at least one ladder, got ladders={ladders}")
        self.dim, self.ladders, self.depth, self.ladder = dim, ladders, depth, ladder
        self.eps, self.grad, self.impl, self.out_std = eps, grad, impl, out_std
        self.check_options(dim=dim)
        has_ladder_bias = resolve_ladder_bias(bias, ladder_bias)
        self.gate = nn.Linear(dim, dim, bias=bias)  # G
        self.linear = nn.Linear(dim, dim, bias=bias)  # U, the depth-0 term
        bias_shape = (ladders,) if ladder == "scalar" else (ladders, dim)
        self.denominators = LadderWeights(
            depth, (ladders, dim), bias_shape if has_ladder_bias else None
        )
        self.mix = nn.Parameter(torch.empty(dim, ladders))  # V
        if clip_outputs:
            self.output_range = OutputRange((ladders,) if ladder == "scalar" else (ladders, dim))
        self.reset_parameters()

    @staticmethod
    def num_parameters_formula(
        dim: int,
        ladders: int,
        depth: int,
        ladder: str = "scalar",
        bias: bool = True,
        ladder_bias: bool | None = None,
    ) -> int:
        p, n_l, d = dim, ladders, depth
        count = 2 * p * p + n_l * p * (d + 1)
        if bias:
            count += 2 * p
        if resolve_ladder_bias(bias, ladder_bias):
            count += n_l * d if ladder == "scalar" else n_l * p * d
        return count

    def reset_parameters(self) -> None:
        nn.init.normal_(self.gate.weight, std=0.02)
        nn.init.normal_(self.linear.weight, std=self.out_std)
        for linear in (self.gate, self.linear):
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.normal_(self.mix, std=self.out_std)
        # Scalar ladders take a dot product over p inputs; elementwise ones a single input.
        fan_in = self.dim if self.ladder == "scalar" else 1
        std, offset = denominator_init(
            self.denominators.has_bias, fan_in_spread(fan_in, _GATE_AT_INIT)
        )
        self.denominators.reset_parameters(std, offset)

    def forward(self, x: Tensor) -> Tensor:
        gated = torch.sigmoid(self.gate(x)) * x  # x^, (..., p)
        if self.ladder != "scalar":
            linear = self.linear(gated)  # the ladders' sum in its dtype (bf16 under autocast)
            return linear + self._elementwise_ladders(gated).to(linear.dtype)  # (..., p)
        z = self.clip(self.pvariate_ladders(gated, self.denominators))  # (..., L)
        linear = self.linear(gated)
        # U x^ + V z as one addmm: the sum is written by the GEMM (no extra pass over
        # (..., p) forward, none backward), the same values as the two terms added.
        mixed = torch.addmm(linear.reshape(-1, self.dim), z.reshape(-1, self.ladders), self.mix.t())
        return mixed.view(linear.shape)

    def _elementwise_ladders(self, gated: Tensor) -> Tensor:
        """sum_j V[:, j] * z_j, (..., p): one fused kernel with impl="triton" (CUDA).

        The fused kernel never forms z (..., L, p), so it serves training only. Elsewhere
        (and in eval) the ensemble is L p univariate ladders on a repeated x^, then mixed,
        and z is clipped or recorded on the way; with the fused kernel, training records
        z's range from an extra no-grad ladder forward.
        """
        weight = self.denominators.stacked_weight()  # (d, L, p)
        bias = self.denominators.stacked_bias()  # (d, L, p) | None
        kwargs = {"eps": self.eps, "grad": self.grad, "floor": self.link_floor}
        n_l, p = self.ladders, self.dim
        fused = resolve_impl(self.impl, gated.numel() * n_l, gated.device) == "triton"
        if fused and self.training and not (self.clip_outputs or self.track_health):
            return ladder_ensemble(gated, weight, self.mix, bias, impl=self.impl, **kwargs)
        # One univariate ladder per (ensemble, channel): L p ladders on a repeated x^.
        x = gated.unsqueeze(-2).expand(*gated.shape[:-1], n_l, p).flatten(-2)
        flat_w = weight.reshape(self.depth, n_l * p)
        flat_b = None if bias is None else bias.reshape(self.depth, n_l * p)
        if self.track_health:
            stats = ladder_denominator_stats(
                x, flat_w, flat_b, self.eps, self.link_floor, self.health_near
            )
            self._record_health(stats)
        if fused and self.training:
            if self.clip_outputs and self.output_range.recording:  # not in a replay
                with torch.no_grad():
                    z = univariate_ladder(x, flat_w, flat_b, impl=self.impl, **kwargs)
                    self.clip(z.unflatten(-1, (n_l, p)))  # records the range
            return ladder_ensemble(gated, weight, self.mix, bias, impl=self.impl, **kwargs)
        z = univariate_ladder(x, flat_w, flat_b, impl=self.impl, **kwargs).unflatten(-1, (n_l, p))
        return mix_ensemble(self.clip(z), self.mix)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, ladders={self.ladders}, depth={self.depth}, ladder={self.ladder!r}, "
            f"eps={self.eps}, grad={self.grad!r}, impl={self.impl!r}, {self.ladder_extra_repr()}"
        )

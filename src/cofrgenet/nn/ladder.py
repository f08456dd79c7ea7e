"""Ladder parameters, one tensor per depth, and the base class of CoFrGeNet layers.

Each depth k = 1..d of a ladder ensemble is its own ``nn.Parameter``: the dyadic
schedule (spec section 4) freezes and releases depths independently through
``requires_grad``, which must be per-parameter for AdamW to give a frozen depth no
moments and no weight decay, and which keeps working under DDP/FSDP.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

#: Default spread of a partial denominator a_k at initialisation (for unit-variance input).
DENOMINATOR_STD = 0.5
#: Default initial ladder bias: a_k centred at +1 keeps K_d away from 0 (spec section 6).
#: Measured on Gaussian a_k, d = 5: 0.01% of units clamped versus 23% for small weights
#: without bias; see docs/layers.md.
DENOMINATOR_OFFSET = 1.0
#: Without a ladder bias no offset is possible; a wider spread keeps most units off poles
#: (0.4% clamped at d = 5 for std 1, 23% for std 0.02).
DENOMINATOR_STD_NO_BIAS = 1.0


class LadderWeights(nn.Module):
    """Partial-denominator weights (and optional biases) of a ladder ensemble, per depth.

    ``weight[k-1]`` (shape ``weight_shape``) and ``bias[k-1]`` (shape ``bias_shape``) hold
    depth k. ``stacked_weight(dim)`` returns them as one tensor with depth on ``dim``.
    """

    def __init__(
        self,
        depth: int,
        weight_shape: tuple[int, ...],
        bias_shape: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"ladder depth must be >= 1 (partial denominators), got {depth}")
        self.depth = depth
        self.weight = nn.ParameterList(
            nn.Parameter(torch.empty(weight_shape)) for _ in range(depth)
        )
        self.bias = (
            None
            if bias_shape is None
            else nn.ParameterList(nn.Parameter(torch.empty(bias_shape)) for _ in range(depth))
        )

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def reset_parameters(self, weight_std: float, offset: float = DENOMINATOR_OFFSET) -> None:
        for w in self.weight:
            nn.init.normal_(w, std=weight_std)
        for b in self.bias or ():
            nn.init.constant_(b, offset)

    def stacked_weight(self, dim: int = 0) -> Tensor:
        return torch.stack(list(self.weight), dim=dim)

    def stacked_bias(self, dim: int = 0) -> Tensor | None:
        return None if self.bias is None else torch.stack(list(self.bias), dim=dim)

    def pvariate_denominators(self, x: Tensor) -> Tensor:
        """Partial denominators of p-variate ladders: a[..., j, k] = W_k[j] . x (+ b_k[j]).

        x: (..., p) with weights of shape (L, p) and biases (L,) per depth -> (..., L, d).
        The result is depth-major in memory (d outermost, tokens innermost), the layout
        in which the continuant kernels read and write fastest.
        """
        depth, ladders, dim = self.depth, *self.weight[0].shape
        rows = x.reshape(-1, dim)  # (M, p)
        weight = self.stacked_weight().reshape(depth * ladders, dim)  # (d L, p)
        bias = self.stacked_bias()
        if bias is None:
            a_t = weight @ rows.t()
        else:
            a_t = torch.addmm(bias.reshape(depth * ladders, 1), weight, rows.t())
        a = a_t.view(depth, ladders, rows.shape[0]).permute(2, 1, 0)  # (M, L, d) view
        return a.view(*x.shape[:-1], ladders, depth)

    def parameters_by_depth(self) -> dict[int, list[nn.Parameter]]:
        """{k: [weight_k, bias_k]} for k = 1..d."""
        out: dict[int, list[nn.Parameter]] = {}
        for k, w in enumerate(self.weight, start=1):
            out[k] = [w] if self.bias is None else [w, self.bias[k - 1]]
        return out


@dataclass
class LadderHealth:
    """Ladder statistics of a layer's last forward (0-d tensors, detached)."""

    clamped_fraction: Tensor
    min_abs_denominator: Tensor


class LadderLayer(nn.Module):
    """Base class of CoFrGeNet layers: ladder bookkeeping shared by Cffn, CAttnU, CAttnM.

    Set ``track_health = True`` to record, at every forward, the fraction of ladders whose
    final continuant was clamped and the smallest |K_d| (an extra no-grad pass over the
    partial denominators; the LadderHealth callback turns it on only at logging steps).
    """

    track_health: bool

    def __init__(self) -> None:
        super().__init__()
        self.track_health = False
        self._health: LadderHealth | None = None

    def ladder_modules(self) -> Iterator[LadderWeights]:
        return (m for m in self.modules() if isinstance(m, LadderWeights))

    def ladder_parameters(self) -> Iterator[nn.Parameter]:
        """Partial-denominator parameters (the ones the dyadic schedule freezes)."""
        for module in self.ladder_modules():
            yield from module.parameters()

    def ladder_parameters_by_depth(self) -> dict[int, list[nn.Parameter]]:
        out: dict[int, list[nn.Parameter]] = {}
        for module in self.ladder_modules():
            for k, params in module.parameters_by_depth().items():
                out.setdefault(k, []).extend(params)
        return out

    def health(self) -> LadderHealth | None:
        """Statistics of the last forward run with ``track_health`` on, else None."""
        return self._health

    def _record_health(self, stats: tuple[Tensor, Tensor]) -> None:
        self._health = LadderHealth(*stats)


def resolve_ladder_bias(bias: bool, ladder_bias: bool | None) -> bool:
    """``ladder_bias=None`` follows ``bias``."""
    return bias if ladder_bias is None else ladder_bias


def denominator_init(has_bias: bool, fan_in_std: float) -> tuple[float, float]:
    """(weight std, bias offset) giving a_k ~ N(offset, std^2) for inputs of spread fan_in_std.

    fan_in_std is the standard deviation of w . x for unit-std weights (sqrt(fan_in) times
    the input's std).
    """
    std = DENOMINATOR_STD if has_bias else DENOMINATOR_STD_NO_BIAS
    return std / fan_in_std, DENOMINATOR_OFFSET


def fan_in_spread(fan_in: int, input_std: float = 1.0) -> float:
    return math.sqrt(fan_in) * input_std

"""CAttnU and CAttnM: continued-fraction replacements for causal self-attention."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cofrgenet.nn.decoding import append, causal_rows
from cofrgenet.nn.ladder import (
    DENOMINATOR_FLOOR,
    OUT_STD,
    LadderLayer,
    LadderWeights,
    OutputRange,
    attention_gain,
    denominator_init,
    fan_in_spread,
    resolve_ladder_bias,
)
from cofrgenet.ops import ladder_denominator_stats, univariate_ladder


def _check_input(name: str, x: Tensor, dim: int, max_len: int) -> None:
    """x must be (B, T, dim) with T <= max_len: a (T, C) input had its channels read as
    its length ("at most max_len tokens, got C"), or failed to unpack."""
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(
            f"{name} takes (batch, tokens, channels={dim}) inputs, got shape {tuple(x.shape)}"
        )
    _check_length(name, x.shape[1], max_len)


def _check_length(name: str, length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(
            f"{name} was built for sequences of at most max_len={max_len} tokens (its "
            f"parameters are tied to positions), got {length}; rebuild with a larger max_len"
        )


def _upper_triangle(size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(rows, cols) of the upper triangle s <= t of a size x size matrix, row-major.

    Eagerly from a cache (built once per size and device); inside torch.compile as a
    graph constant (Dynamo would trace through the cache and warn about it).
    """
    if torch.compiler.is_compiling():
        rows, cols = torch.triu_indices(size, size, device=device)
        return rows, cols
    return _cached_upper_triangle(size, device)


@functools.cache
def _cached_upper_triangle(size: int, device: torch.device) -> tuple[Tensor, Tensor]:
    with torch.inference_mode(False):  # cached: must not be an inference tensor
        rows, cols = torch.triu_indices(size, size, device=device)
    return rows, cols


class CAttnU(LadderLayer):
    """Token mixing with univariate ladders across positions: (B, T, p) -> (B, T, p).

    Two ensembles e = 1, 2 of full univariate ladders, weights indexed by position s and
    shared across channels c: y_e[s, c] = w0_e[s] x[s, c] + f~(a_e[., s, c]) with partial
    denominators a_k = link(w_e[k, s] x[s, c] + b_e[k, s]) (link as in Cffn: floor +
    softplus by default, the identity for ``denominators="paper"``). They are mixed
    causally by upper-triangular l x l matrices (s <= t):

        O[t, c] = (sum_{s<=t} U_1[s, t] y_1[s, c]) * (sum_{s<=t} U_2[s, t] y_2[s, c])

    Both U_e start as a causal running mean (1 / (t + 1) on column t, 2% noise), U_2 scaled
    by the gain of softmax attention's projections (``attention_gain(dim, out_std)``): the
    branch starts as small as the attention it replaces. f~ is clipped in eval mode to its
    training range (``clip_outputs``).

    Parameters (l = max_len, d = depth = number of partial denominators):

        l (2 d + l + 3)      = 2 l (d + 1) ladder weights incl. the linear term
                               + 2 l (l + 1) / 2 for the two triangles
        + 2 l d              if ladder_bias

    The paper writes l (2 d' + l + 1) with d' = d + 1 counting the linear term. The
    triangles are stored packed, so the module's parameter count is exactly this.
    Sequences shorter than l use the leading block (still causal). ``bias`` has no
    linear bias to switch here; it only sets the default of ``ladder_bias``.
    """

    def __init__(
        self,
        dim: int,
        max_len: int,
        depth: int,
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
        self.dim, self.max_len, self.depth = dim, max_len, depth
        self.eps, self.grad, self.impl, self.out_std = eps, grad, impl, out_std
        self.check_options(dim=dim, max_len=max_len)
        has_ladder_bias = resolve_ladder_bias(bias, ladder_bias)
        self.linear = nn.Parameter(torch.empty(2, max_len))  # w0_e[s], the depth-0 term
        self.denominators = LadderWeights(
            depth, (2, max_len), (2, max_len) if has_ladder_bias else None
        )
        self.mixing = nn.Parameter(torch.empty(2, max_len * (max_len + 1) // 2))  # packed U_e
        if clip_outputs:
            self.output_range = OutputRange((2, max_len))
        self.reset_parameters()

    @staticmethod
    def num_parameters_formula(
        max_len: int, depth: int, bias: bool = True, ladder_bias: bool | None = None
    ) -> int:
        count = max_len * (2 * depth + max_len + 3)
        if resolve_ladder_bias(bias, ladder_bias):
            count += 2 * max_len * depth
        return count

    def reset_parameters(self) -> None:
        nn.init.ones_(self.linear)
        std, offset = denominator_init(self.denominators.has_bias, fan_in_spread(1))
        self.denominators.reset_parameters(std, offset)
        # U_e starts as a causal running mean (1 / (t + 1) on column t) plus a little noise,
        # U_2 scaled by out_std: the product is a small residual branch at any length.
        with torch.no_grad():
            _, cols = _upper_triangle(self.max_len, self.mixing.device)
            if self.mixing.device.type != "meta":
                mean = 1.0 / (cols.to(self.mixing.dtype) + 1.0)
                self.mixing.copy_(mean.expand_as(self.mixing))
                self.mixing.add_(torch.randn_like(self.mixing) * 0.02 * mean)
                self.mixing[1].mul_(attention_gain(self.dim, self.out_std))

    def mixing_matrices(self, length: int) -> Tensor:
        """U_1, U_2 as (2, length, length), zero below the diagonal."""
        rows, cols = _upper_triangle(self.max_len, self.mixing.device)
        full = self.mixing.new_zeros(2, self.max_len, self.max_len)
        full[:, rows, cols] = self.mixing
        return full[:, :length, :length]

    def mixing_columns(self, start: int, length: int) -> Tensor:
        """Columns start .. start + length - 1 of U_1, U_2, rows 0 .. start + length - 1:
        (2, start + length, length), zero below the diagonal.

        ``mixing_matrices(start + length)[:, :, start:]`` without building the whole
        (2, l, l) matrices: a one-token decoding step reads start + 1 entries per
        ensemble instead of scattering l (l + 1) / 2 (184 us of a 630 us step at l = 256).
        """
        total, size = start + length, self.max_len
        rows = torch.arange(total, device=self.mixing.device).unsqueeze(1)  # s
        cols = torch.arange(start, total, device=self.mixing.device)  # t
        below = rows > cols
        # Row-major packed upper triangle: row s starts at s l - s (s - 1) / 2.
        index = rows * (2 * size - rows + 1) // 2 + cols - rows
        columns = self.mixing[:, index.masked_fill(below, 0)]  # (2, total, length)
        return columns.masked_fill(below, 0.0)

    def ladder_outputs(self, x: Tensor, start: int = 0) -> Tensor:
        """y_e[s, c] of tokens x (B, T, p) at positions start.. -> (B, p, 2, T)."""
        batch, length, dim = x.shape
        _check_length("CAttnU", start + length, self.max_len)
        positions = slice(start, start + length)
        # Ladders act along tokens: channels become the batch, positions the ladder index.
        tokens = x.transpose(1, 2).unsqueeze(2).expand(batch, dim, 2, length)  # (B, p, 2, T)
        tokens = tokens.reshape(batch, dim, 2 * length)
        weight = self.denominators.stacked_weight()[:, :, positions]
        weight = weight.reshape(self.depth, 2 * length)
        bias = self.denominators.stacked_bias()
        bias = None if bias is None else bias[:, :, positions].reshape(self.depth, 2 * length)
        floor = self.link_floor
        if self.track_health:
            stats = ladder_denominator_stats(
                tokens, weight, bias, self.eps, floor, self.health_near
            )
            self._record_health(stats)
        f = univariate_ladder(
            tokens, weight, bias, eps=self.eps, grad=self.grad, impl=self.impl, floor=floor
        )
        clip_to = length if start == 0 else positions  # the training-time call, unchanged
        f = self.clip(f.unflatten(-1, (2, length)), clip_to)  # (B, p, 2, T)
        return f + tokens.unflatten(-1, (2, length)) * self.linear[:, positions]

    def forward(self, x: Tensor) -> Tensor:
        _check_input("CAttnU", x, self.dim, self.max_len)
        length = x.shape[1]
        y = self.ladder_outputs(x)  # (B, p, 2, T)
        mixed = torch.einsum("bces,est->bcet", y, self.mixing_matrices(length))
        return (mixed[:, :, 0] * mixed[:, :, 1]).transpose(1, 2)  # (B, T, p)

    def decode(self, x: Tensor, state: dict[str, Any], start: int) -> Tensor:
        """Incremental forward (``cofrgenet.nn.decoding``): the ladder outputs y_e of the
        tokens seen are the state; the new columns t of U_e mix them.

        x: (B, T, C), the tokens at positions ``start .. start + T - 1`` -> (B, T, C).
        """
        length = x.shape[1]
        y = append(
            state, "y", self.ladder_outputs(x, start), dim=3, capacity=self.max_len
        )  # (B, p, 2, start + T)
        columns = self.mixing_columns(start, length)  # (2, start + T, T)
        mixed = torch.einsum("bces,est->bcet", y, columns)
        return (mixed[:, :, 0] * mixed[:, :, 1]).transpose(1, 2)

    def no_weight_decay(self) -> set[str]:
        """Also the linear terms w0 (start at 1: decay would pull the identity path to 0)."""
        return super().no_weight_decay() | {"linear"}

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, max_len={self.max_len}, depth={self.depth}, eps={self.eps}, "
            f"{self.ladder_extra_repr()}"
        )


class CAttnM(LadderLayer):
    """Attention weights from p-variate ladders: (B, T, p) -> (B, T, p).

    L p-variate ladders per token, Y[t, j] = f~(link(W^(j) x_t (+ b^(j)))) (link as in
    Cffn), a linear map F in R^{L x l} to sequence-length space and a causal softmax:

        A = causal_softmax(Y F),   O = A X W^v

    Logits depend on the query's content and the key's position, not the key's content
    (a continued-fraction Dense Synthesizer). W^v, which stands for attention's value and
    output projections, starts with their gain (``attention_gain(dim, out_std)``); Y is
    clipped in eval mode to its training range (``clip_outputs``).

    Parameters (p = dim, l = max_len, L = ladders, d = depth):

        L (d p + l) + p^2     (the paper's L (p + l) + p^2 is the d = 1 case)
        + p                   if bias (value bias)
        + L d                 if ladder_bias
    """

    def __init__(
        self,
        dim: int,
        max_len: int,
        ladders: int,
        depth: int,
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
        if ladders < 1:
            raise ValueError(f"CAttnM needs at least one ladder, got ladders={ladders}")
        self.dim, self.max_len, self.ladders, self.depth = dim, max_len, ladders, depth
        self.eps, self.grad, self.impl, self.out_std = eps, grad, impl, out_std
        self.check_options(dim=dim, max_len=max_len)
        has_ladder_bias = resolve_ladder_bias(bias, ladder_bias)
        self.denominators = LadderWeights(
            depth, (ladders, dim), (ladders,) if has_ladder_bias else None
        )
        self.position_map = nn.Parameter(torch.empty(ladders, max_len))  # F
        self.value = nn.Linear(dim, dim, bias=bias)  # W^v
        if clip_outputs:
            self.output_range = OutputRange((ladders,))
        self.reset_parameters()

    @staticmethod
    def num_parameters_formula(
        dim: int,
        max_len: int,
        ladders: int,
        depth: int,
        bias: bool = True,
        ladder_bias: bool | None = None,
    ) -> int:
        count = ladders * (depth * dim + max_len) + dim * dim
        if bias:
            count += dim
        if resolve_ladder_bias(bias, ladder_bias):
            count += ladders * depth
        return count

    def reset_parameters(self) -> None:
        std, offset = denominator_init(self.denominators.has_bias, fan_in_spread(self.dim))
        self.denominators.reset_parameters(std, offset)
        nn.init.normal_(self.position_map, std=0.02)  # near-uniform causal attention at init
        # W^v stands for attention's W_V W_O: start with their gain (std gain / sqrt(p)).
        value_std = attention_gain(self.dim, self.out_std) / self.dim**0.5
        nn.init.normal_(self.value.weight, std=value_std)
        if self.value.bias is not None:
            nn.init.zeros_(self.value.bias)

    def attention_logits(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Queries Y (B, T, L) and keys F^T (T, L) whose product gives the logits."""
        length = x.shape[1]
        y = self.clip(self.pvariate_ladders(x, self.denominators))  # (B, T, L)
        return y, self.position_map[:, :length].t()

    def forward(self, x: Tensor) -> Tensor:
        _check_input("CAttnM", x, self.dim, self.max_len)
        queries, keys = self.attention_logits(x)
        values = self.value(x)
        batch = x.shape[0]
        out = F.scaled_dot_product_attention(
            queries.unsqueeze(1),
            keys.to(queries.dtype).expand(batch, 1, *keys.shape),
            values.unsqueeze(1),
            is_causal=True,
            scale=1.0,
        )
        return out.squeeze(1)

    def decode(self, x: Tensor, state: dict[str, Any], start: int) -> Tensor:
        """Incremental forward (``cofrgenet.nn.decoding``): the values X W^v are the state
        (the logits need only the new queries and the key positions).

        x: (B, T, C), the tokens at positions ``start .. start + T - 1`` -> (B, T, C).
        """
        length = x.shape[1]
        _check_length("CAttnM", start + length, self.max_len)
        queries, _ = self.attention_logits(x)  # (B, T, L)
        keys = self.position_map[:, : start + length].t().to(queries.dtype)  # (start + T, L)
        values = append(
            state, "v", self.value(x), dim=1, capacity=self.max_len
        )  # (B, start + T, p)
        logits = queries @ keys.t()  # (B, T, start + T)
        if length > 1:  # one new token sees every key: no mask to build
            logits = logits.masked_fill(~causal_rows(start, length, x.device), float("-inf"))
        return logits.softmax(dim=-1) @ values

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, max_len={self.max_len}, ladders={self.ladders}, "
            f"depth={self.depth}, eps={self.eps}, {self.ladder_extra_repr()}"
        )

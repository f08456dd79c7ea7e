"""Sparse Transformer attention (Child et al. 2019): strided and fixed factorised patterns.

Each pattern is the union ("merged head") of the paper's two factorised index sets,
intersected with the causal mask, with stride l and, for "fixed", c summary positions:

* strided: A1(i) = {j : i - l <= j <= i} (the previous l positions and i),
           A2(i) = {j : (i - j) mod l = 0}  (every l-th position back from i);
* fixed:   A1(i) = {j : floor(j / l) = floor(i / l)}  (i's own block of l),
           A2(i) = {j : j mod l in {l - c, ..., l - 1}}  (the last c of every block).

The pattern is applied as a boolean mask over dense softmax attention: correct, but with
the cost of dense attention (T^2 scores computed and stored, and no flash kernel since
the mask is explicit). The O(T sqrt(T)) saving needs block-sparse kernels, which this
reference does not have. Each query keeps at least itself, so no row is empty.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from cofrgenet.nn.attention import CausalSelfAttention

SPARSE_PATTERNS = ("strided", "fixed")


def sparse_mask(
    pattern: str,
    length: int,
    stride: int,
    summary: int = 1,
    device: torch.device | str | None = None,
    start: int = 0,
) -> Tensor:
    """(T - start, T) bool mask of ``pattern``: True where query i (row, from ``start``)
    may attend key j (column).

    Built at every call (T^2 integer ops, small next to the attention it masks; no cache,
    which torch.compile would trace through anyway); a decoding step builds its new rows.
    """
    if stride < 1:
        raise ValueError(f"sparse stride must be >= 1, got {stride}")
    i = torch.arange(start, length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    causal = j <= i
    if pattern == "strided":
        keep = (i - j <= stride) | ((i - j) % stride == 0)
    elif pattern == "fixed":
        if not 1 <= summary <= stride:
            raise ValueError(f"fixed pattern needs 1 <= summary <= stride, got {summary}, {stride}")
        keep = (i // stride == j // stride) | (j % stride >= stride - summary)
    else:
        raise ValueError(f"unknown sparse pattern {pattern!r}; choose one of {SPARSE_PATTERNS}")
    return causal & keep


def default_stride(max_len: int) -> int:
    """The paper's choice l ~ sqrt(n)."""
    return max(1, round(math.sqrt(max_len)))


def default_summary(stride: int) -> int:
    """c = l / 8 (the paper pairs l = 128 with c in {8, 16, 32})."""
    return max(1, stride // 8)


class SparseCausalSelfAttention(CausalSelfAttention):
    """Causal softmax attention restricted to a strided or fixed sparse pattern.

    Same parameters (and names) as :class:`CausalSelfAttention`; every head uses the merged
    pattern. Accepts GQA, RoPE and ALiBi like its parent.

    Args:
        pattern: "strided" or "fixed".
        stride: l; None means round(sqrt(max_len)).
        summary: c for "fixed"; None means max(1, l // 8). Ignored by "strided".
        (others as :class:`CausalSelfAttention`)
    """

    def __init__(
        self,
        dim: int,
        n_head: int,
        max_len: int,
        bias: bool = True,
        dropout: float = 0.0,
        *,
        pattern: str = "strided",
        stride: int | None = None,
        summary: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dim, n_head, max_len, bias, dropout, **kwargs)
        if pattern not in SPARSE_PATTERNS:
            raise ValueError(f"unknown sparse pattern {pattern!r}; choose one of {SPARSE_PATTERNS}")
        self.pattern = pattern
        self.stride = default_stride(max_len) if stride is None else stride
        self.summary = default_summary(self.stride) if summary is None else summary
        sparse_mask(pattern, 1, self.stride, self.summary)  # validate the sizes now

    def allowed_keys(self, length: int, device: torch.device, start: int = 0) -> Tensor:
        return sparse_mask(self.pattern, length, self.stride, self.summary, device, start)

    def extra_repr(self) -> str:
        summary = f", summary={self.summary}" if self.pattern == "fixed" else ""
        return f"{super().extra_repr()}, pattern={self.pattern!r}, stride={self.stride}{summary}"

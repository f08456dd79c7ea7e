"""GPT-2 feed-forward network (the baseline ffn mixer)."""

from __future__ import annotations

from torch import Tensor, nn


class MLP(nn.Module):
    """Two-layer GELU MLP, as in GPT-2: ``c_proj(gelu(c_fc(x)))``.

    GELU uses the tanh approximation, as GPT-2 was trained with it. Parameter names
    match GPT-2 checkpoints.

    Args:
        dim: embedding width C.
        hidden: hidden width; None means 4 * dim.
        bias: biases in the two projections.
        dropout: dropout on the output.
    """

    def __init__(
        self, dim: int, hidden: int | None = None, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        hidden = 4 * dim if hidden is None else hidden
        self.c_fc = nn.Linear(dim, hidden, bias=bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

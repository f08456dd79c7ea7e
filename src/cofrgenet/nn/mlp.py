"""Feed-forward baselines: GPT-2's GELU MLP and Llama's SwiGLU."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: 2 sqrt(2 / pi): GELU-tanh's 0.5 (1 + tanh(z)) is sigmoid(2 z).
_GELU_SIGMOID_SCALE = 2.0 * math.sqrt(2.0 / math.pi)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU with the tanh approximation, ``F.gelu(x, approximate="tanh")``.

    Inside ``torch.compile`` on CPU it is written as x * sigmoid(2 z), the same function
    (0.5 (1 + tanh z) = sigmoid(2 z)): inductor's C++ kernels evaluate tanh with Sleef's
    1-ulp tanh, which makes GELU's forward and backward compute-bound and no faster than
    ATen's kernels, while its exp-based sigmoid is about twice as fast (the whole GPT-2
    training step: compiled 0.98x eager -> 1.04x on a 2-core CPU). Eagerly, and on other
    devices, it is the ATen op.
    """
    if torch.compiler.is_compiling() and x.device.type == "cpu":
        return x * torch.sigmoid(_GELU_SIGMOID_SCALE * (x + 0.044715 * x * x * x))
    return F.gelu(x, approximate="tanh")


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
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        out = self.c_proj(gelu_tanh(self.c_fc(x)))
        return self.dropout(out) if self.training else out


def swiglu_hidden(dim: int, multiple_of: int = 256) -> int:
    """Llama's default SwiGLU width: 2/3 of 4 * dim (same parameters as a 4x MLP), rounded
    up to a multiple of ``multiple_of``."""
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * -(-hidden // multiple_of)


class SwiGLU(nn.Module):
    """Gated feed-forward network of Llama (Shazeer 2020): ``c_proj(silu(c_gate(x)) * c_fc(x))``.

    Parameters: 3 * dim * hidden (+ 2 hidden + dim with biases). Llama's names are
    gate_proj (``c_gate``), up_proj (``c_fc``) and down_proj (``c_proj``); ``c_proj`` keeps
    the GPT-2 name so the model's scaled residual initialisation finds it.

    Args:
        dim: embedding width C.
        hidden: hidden width; None means :func:`swiglu_hidden` (dim).
        bias: biases in the three projections (Llama: none).
        dropout: dropout on the output.
    """

    def __init__(
        self, dim: int, hidden: int | None = None, bias: bool = False, dropout: float = 0.0
    ) -> None:
        super().__init__()
        hidden = swiglu_hidden(dim) if hidden is None else hidden
        self.c_gate = nn.Linear(dim, hidden, bias=bias)
        self.c_fc = nn.Linear(dim, hidden, bias=bias)
        self.c_proj = nn.Linear(hidden, dim, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        out = self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))
        return self.dropout(out) if self.training else out

"""GPT-2 causal softmax self-attention (the baseline attention mixer)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal softmax attention, as in GPT-2 / nanoGPT.

    A fused q/k/v projection (``c_attn``), ``scaled_dot_product_attention`` with
    ``is_causal=True`` (flash / memory-efficient kernels where available) and an
    output projection (``c_proj``). Parameter names match GPT-2 checkpoints.

    Args:
        dim: embedding width C; must be divisible by ``n_head``.
        n_head: number of heads.
        max_len: maximum sequence length. Unused by softmax attention; accepted so every
            attention mixer has the same signature.
        bias: biases in the two projections.
        dropout: dropout on the attention probabilities (training only) and on the output.
    """

    def __init__(
        self, dim: int, n_head: int, max_len: int, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if dim % n_head != 0:
            raise ValueError(f"dim ({dim}) must be divisible by n_head ({n_head})")
        self.dim = dim
        self.n_head = n_head
        self.max_len = max_len
        self.dropout = dropout
        self.c_attn = nn.Linear(dim, 3 * dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, C) -> (B, T, C); position t attends to positions <= t."""
        B, T, C = x.shape
        # (B, T, 3C) -> three (B, n_head, T, head_dim)
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        # (B, n_head, T, head_dim) -> (B, T, C)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_head={self.n_head}, max_len={self.max_len}"

"""Dense Synthesizer attention (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention")."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cofrgenet.nn.decoding import append, causal_rows


class DenseSynthesizer(nn.Module):
    """Causal Dense Synthesizer: attention weights predicted from each token alone.

    Per head h, token i's logits over key positions s are synthesised by a two-layer MLP
    from x_i alone (no query-key dot product):

        B_h[i, :] = W2_h relu(W1_h x_i + b1_h) + b2_h            in R^l, l = max_len
        Y_h = causal_softmax(B_h[:, :T]) (X W^v_h),  out = c_proj(concat_h Y_h)

    W1 (C x C, split into H heads of head_dim rows) plays the role of the query projection,
    W2_h (head_dim x l) maps to sequence length. The paper's F: R^d -> R^l has W1 in
    R^{d x d} and W2 in R^{d x l}; this is its multi-head form with the same d^2 + d l
    weights. Logits depend on the query's content and the key's *position* (CAttnM is the
    continued-fraction analogue). Sequences shorter than l use the leading l columns.

    Parameters: C^2 (W1) + C l (W2) + C^2 (values) + C^2 (c_proj), plus C + H l + 2 C
    with ``bias``. Tied to ``max_len``: longer sequences raise.

    Args:
        dim: embedding width C, divisible by ``n_head``.
        n_head: heads H.
        max_len: l, the maximum sequence length.
        bias: biases in the projections.
        dropout: dropout on the attention probabilities (training only) and the output.
    """

    def __init__(
        self, dim: int, n_head: int, max_len: int, bias: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if dim % n_head != 0:
            raise ValueError(f"dim ({dim}) must be divisible by n_head ({n_head})")
        self.dim, self.n_head, self.max_len = dim, n_head, max_len
        self.head_dim = dim // n_head
        self.dropout = dropout
        self.w1 = nn.Linear(dim, dim, bias=bias)
        # One (l x head_dim) map per head, stored as one Linear: weight (H l, head_dim).
        self.w2 = nn.Linear(self.head_dim, n_head * max_len, bias=bias)
        self.value = nn.Linear(dim, dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    @staticmethod
    def num_parameters_formula(dim: int, n_head: int, max_len: int, bias: bool = True) -> int:
        count = 3 * dim * dim + dim * max_len
        if bias:
            count += 3 * dim + n_head * max_len
        return count

    def attention_logits(self, x: Tensor, keys: int | None = None) -> Tensor:
        """Synthesised logits (B, H, T, keys) before the causal mask (keys: default T)."""
        B, T, _ = x.shape
        H, hd = self.n_head, self.head_dim
        keys = T if keys is None else keys
        if self.max_len < keys:
            raise ValueError(
                f"DenseSynthesizer was built for sequences of at most max_len={self.max_len} "
                f"tokens (its parameters are tied to positions), got {keys}"
            )
        hidden = F.relu(self.w1(x)).view(B, T, H, hd)
        # Only the first `keys` positions are needed: slice W2 instead of computing all l.
        w2 = self.w2.weight.view(H, self.max_len, hd)[:, :keys]  # (H, keys, hd)
        logits = torch.einsum("bthe,hse->bhts", hidden, w2)
        if self.w2.bias is not None:
            logits = logits + self.w2.bias.view(H, self.max_len)[:, None, :keys]
        return logits

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, C) -> (B, T, C); position t attends to positions <= t."""
        B, T, C = x.shape
        logits = self.attention_logits(x)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        probs = self.attn_dropout(logits.masked_fill(~causal, float("-inf")).softmax(dim=-1))
        v = self.value(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        y = (probs @ v).transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def decode(self, x: Tensor, state: dict[str, Any], start: int) -> Tensor:
        """Incremental forward (``cofrgenet.nn.decoding``): the values are cached (the
        logits need only the new queries and the key positions).

        x: (B, T, C), the tokens at positions ``start .. start + T - 1`` -> (B, T, C).
        """
        B, T, C = x.shape
        logits = self.attention_logits(x, start + T)  # (B, H, T, start + T)
        logits = logits.masked_fill(~causal_rows(start, T, x.device), float("-inf"))
        v = self.value(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = append(state, "v", v, dim=2, capacity=self.max_len)  # (B, H, start + T, hd)
        y = (logits.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_head={self.n_head}, max_len={self.max_len}"

"""Causal softmax self-attention: GPT-2's, plus grouped-query heads, RoPE and ALiBi."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cofrgenet.nn.decoding import append, causal_rows
from cofrgenet.nn.positional import RotaryEmbedding, alibi_bias


class CausalSelfAttention(nn.Module):
    """Multi-head causal softmax attention, as in GPT-2 / nanoGPT, with Llama's options.

    A fused q/k/v projection (``c_attn``), ``scaled_dot_product_attention`` and an output
    projection (``c_proj``). With the defaults it is GPT-2's layer and its parameter names
    match GPT-2 checkpoints.

    * Grouped-query attention (Ainslie et al. 2023): ``n_kv_head`` key/value heads, each
      shared by n_head / n_kv_head query heads. ``c_attn`` then maps C to
      (n_head + 2 n_kv_head) * head_dim (q, then k, then v).
    * ``rope``: rotary embeddings applied to q and k.
    * ``alibi``: ALiBi biases added to the logits (then the kernel gets an explicit
      (1, H, T, T) float mask instead of ``is_causal``, so no flash kernel).

    Subclasses restrict the keys further by overriding :meth:`allowed_keys`
    ``(length, device, start)`` -> (length - start, length) bool, the rows of the queries
    ``start .. length - 1`` (a decoding step asks for its new rows only; sparse attention).

    Args:
        dim: embedding width C; must be divisible by ``n_head``.
        n_head: number of query heads.
        max_len: maximum sequence length. Unused by softmax attention; accepted so every
            attention mixer has the same signature.
        bias: biases in the two projections.
        dropout: dropout on the attention probabilities (training only) and on the output.
        n_kv_head: key/value heads; None means n_head (plain multi-head attention).
        rope: a :class:`RotaryEmbedding` for head_dim, or None.
        alibi: add ALiBi biases.
    """

    def __init__(
        self,
        dim: int,
        n_head: int,
        max_len: int,
        bias: bool = True,
        dropout: float = 0.0,
        *,
        n_kv_head: int | None = None,
        rope: RotaryEmbedding | None = None,
        alibi: bool = False,
    ) -> None:
        super().__init__()
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        if dim % n_head != 0:
            raise ValueError(f"dim ({dim}) must be divisible by n_head ({n_head})")
        if n_kv_head < 1 or n_head % n_kv_head != 0:
            raise ValueError(f"n_head ({n_head}) must be a multiple of n_kv_head ({n_kv_head})")
        if rope is not None and alibi:
            raise ValueError("choose RoPE or ALiBi, not both")
        self.dim, self.n_head, self.n_kv_head = dim, n_head, n_kv_head
        self.head_dim = dim // n_head
        self.max_len = max_len
        self.dropout = dropout
        self.rope = rope
        self.alibi = alibi
        self.c_attn = nn.Linear(dim, (n_head + 2 * n_kv_head) * self.head_dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def allowed_keys(self, length: int, device: torch.device, start: int = 0) -> Tensor | None:
        """(T - start, T) bool, True where query i (from ``start``) may attend key j; None
        for the plain causal mask."""
        return None

    def attention_mask(
        self, length: int, device: torch.device, dtype: torch.dtype, start: int = 0
    ) -> Tensor | None:
        """The ``attn_mask`` for SDPA of the queries ``start .. length - 1``: None (use
        ``is_causal``), (T - start, T) bool or (1, H, T - start, T) float."""
        allowed = self.allowed_keys(length, device, start)
        if not self.alibi:
            return allowed
        bias = alibi_bias(self.n_head, length, device, dtype, start)  # causal already
        if allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf"))
        # 4-D: on CPU a 3-D float mask sent SDPA to its math kernel, about 7x slower.
        return bias.unsqueeze(0)

    def _heads(self, x: Tensor, start: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, n_head, T, hd), k and v (B, n_kv_head, T, hd) of tokens at start.."""
        B, T, _ = x.shape
        hd, n_q, n_kv = self.head_dim, self.n_head, self.n_kv_head
        qkv = self.c_attn(x)  # (B, T, (n_q + 2 n_kv) hd) -> (B, heads, T, hd) each
        if n_q == n_kv:  # one view for all three: fewer ops per decoded token
            q, k, v = qkv.view(B, T, 3, n_q, hd).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q, k, v = qkv.split((n_q * hd, n_kv * hd, n_kv * hd), dim=2)
            q = q.view(B, T, n_q, hd).transpose(1, 2)
            k = k.view(B, T, n_kv, hd).transpose(1, 2)
            v = v.view(B, T, n_kv, hd).transpose(1, 2)
        if self.rope is not None:
            q, k = self.rope(q, start), self.rope(k, start)
        return q, k, v

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, C) -> (B, T, C); position t attends to positions <= t."""
        B, T, C = x.shape
        n_q, n_kv = self.n_head, self.n_kv_head
        q, k, v = self._heads(x)
        mask = self.attention_mask(T, x.device, q.dtype)
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None,
            enable_gqa=n_kv != n_q,
        )
        # (B, n_head, T, head_dim) -> (B, T, C)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def decode(self, x: Tensor, state: dict[str, Any], start: int) -> Tensor:
        """Incremental forward (``cofrgenet.nn.decoding``): keys and values are cached.

        x: (B, T, C), the tokens at positions ``start .. start + T - 1`` -> (B, T, C).
        """
        B, T, C = x.shape
        q, k, v = self._heads(x, start)
        k = append(state, "k", k, dim=2, capacity=self.max_len)
        v = append(state, "v", v, dim=2, capacity=self.max_len)
        mask = self.attention_mask(start + T, x.device, q.dtype, start)  # the new rows
        if mask is None and T > 1:
            mask = causal_rows(start, T, x.device)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.n_kv_head != self.n_head
        )
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def extra_repr(self) -> str:
        kv = f", n_kv_head={self.n_kv_head}" if self.n_kv_head != self.n_head else ""
        alibi = ", alibi=True" if self.alibi else ""
        return f"dim={self.dim}, n_head={self.n_head}{kv}, max_len={self.max_len}{alibi}"

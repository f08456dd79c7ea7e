"""Position encodings: sinusoidal (absolute), rotary (RoPE) and ALiBi (relative).

* "learned": an ``nn.Embedding`` of positions (GPT-2), added to the token embeddings.
* "sinusoidal": the original transformer's fixed table (Vaswani et al. 2017, section 3.5),
  added to the token embeddings.
* "rope": rotary embeddings (Su et al. 2021) applied to queries and keys, optionally with
  Llama 3's frequency scaling.
* "alibi": a linear bias -m_h (i - j) on the attention logits (Press et al. 2022).
* "none": no encoding (a causal decoder still infers order from the mask).

Nothing here holds a buffer: tables, frequencies and slopes are computed from Python
numbers in ``forward``, so modules built on the meta device, moved with ``to_empty`` or
cast to bf16 never carry stale or low-precision copies (a bf16 ``inv_freq`` buffer ruins
RoPE at long positions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

POSITIONS = ("learned", "sinusoidal", "rope", "alibi", "none")
#: Applied to the q.k logits inside attention; only mixers that compute q.k can use them.
RELATIVE_POSITIONS = ("rope", "alibi")
#: Keys of ``rope_scaling`` (Llama 3's "llama3" rope type).
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_len")


def _position_dtype(dtype: torch.dtype) -> torch.dtype:
    # Positions, angles and distances in float32 at least (bf16 loses integers above
    # 256), float64 for float64 inputs so reference tests stay exact.
    return torch.float64 if dtype == torch.float64 else torch.float32


# Sinusoidal ---------------------------------------------------------------------------


def sinusoidal_encoding(
    positions: Tensor, dim: int, base: float = 10000.0, dtype: torch.dtype | None = None
) -> Tensor:
    """Sinusoidal position vectors of the original transformer: positions (...,) -> (..., dim).

    PE[pos, 2i] = sin(pos / base^(2i / dim)),  PE[pos, 2i + 1] = cos(pos / base^(2i / dim)).
    An odd ``dim`` drops the last cosine column. ``dtype`` defaults to float32.
    """
    dtype = torch.float32 if dtype is None else dtype
    work = _position_dtype(dtype)
    exponents = torch.arange(0, dim, 2, device=positions.device, dtype=work) / dim
    angles = positions.to(work)[..., None] * base**-exponents  # (..., ceil(dim / 2))
    table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # sin, cos interleaved
    return table[..., :dim].to(dtype)


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal position vectors: positions (T,) -> (T, dim). No parameters.

    A drop-in for the learned ``nn.Embedding(block_size, dim)`` of positions.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        self.dim, self.base = dim, base

    def forward(self, positions: Tensor) -> Tensor:
        return sinusoidal_encoding(positions, self.dim, self.base)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}"


# RoPE ---------------------------------------------------------------------------------


def rope_frequencies(
    head_dim: int,
    theta: float = 10000.0,
    scaling: Mapping[str, float] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Rotary inverse frequencies theta^(-2i / head_dim), i < head_dim / 2 -> (head_dim // 2,).

    ``scaling`` (keys ``ROPE_SCALING_KEYS``) applies Llama 3's rule: wavelengths longer
    than original_max_len / low_freq_factor are slowed by ``factor``, wavelengths shorter
    than original_max_len / high_freq_factor are kept, and the band between interpolates
    smoothly (Meta's ``apply_scaling`` in llama-models, HF's "llama3" rope type).
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim)
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_len"]
    wavelen = 2 * math.pi / inv_freq
    # 0 at the low-frequency end of the band, 1 at its high-frequency end.
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate feature pairs (i, i + D/2) of x (..., T, D) by the angles of cos/sin (T, D/2).

    The "rotate half" pairing of GPT-NeoX, HF Llama and litgpt (Meta's original code pairs
    adjacent features; the two differ by a fixed permutation of q/k weights).
    """
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class RotaryEmbedding(nn.Module):
    """RoPE for (B, H, T, head_dim) queries or keys at positions 0..T-1. No parameters.

    ``forward(x)`` rotates x; the dot product of a query rotated at position m with a key
    rotated at n then depends on m - n only, and every rotation preserves norms.
    """

    def __init__(
        self, head_dim: int, theta: float = 10000.0, scaling: Mapping[str, float] | None = None
    ) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        self.head_dim, self.theta = head_dim, theta
        self.scaling = None if scaling is None else dict(scaling)

    def angles(
        self, length: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor]:
        """cos and sin of position x frequency -> two (length, head_dim // 2) tensors."""
        work = _position_dtype(dtype)
        inv_freq = rope_frequencies(self.head_dim, self.theta, self.scaling, device, work)
        angles = torch.outer(torch.arange(length, device=device, dtype=work), inv_freq)
        return angles.cos(), angles.sin()

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (..., T, head_dim) at positions offset .. offset + T - 1 -> same shape, the
        row of position t rotated by t * inv_freq."""
        cos, sin = self.angles(offset + x.shape[-2], x.device, x.dtype)
        return apply_rotary(x, cos[offset:], sin[offset:])

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, scaling={self.scaling}"


# ALiBi --------------------------------------------------------------------------------


def alibi_slopes(n_head: int) -> list[float]:
    """Head slopes m_h of ALiBi (Press et al. 2022, and their reference code).

    For n a power of two: m_h = 2^(-8 h / n), h = 1..n. Otherwise, with p the largest power
    of two below n: the p slopes for p heads, then every other slope of the 2p-head
    sequence, the first n - p of them.
    """
    if n_head < 1:
        raise ValueError(f"n_head must be >= 1, got {n_head}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_head & (n_head - 1) == 0:
        return power_of_two(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]


def alibi_bias(
    n_head: int,
    length: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    start: int = 0,
) -> Tensor:
    """Causal ALiBi logit bias of the queries at ``start .. length - 1`` over keys
    ``0 .. length - 1`` -> (n_head, length - start, length).

    bias[h, i, j] = -m_h (i - j) for keys j <= i and -inf for j > i (the causal mask).
    A decoding step asks for its new rows only: the whole square is O(T^2) per token.
    """
    # Made in float32 and rounded once: in bf16, distances past 256 (and their products
    # with the slopes) would round twice, by several logits at a length of 1024.
    work = _position_dtype(dtype)
    slopes = torch.tensor(alibi_slopes(n_head), device=device, dtype=work)
    queries = torch.arange(start, length, device=device)
    keys = torch.arange(length, device=device)
    distance = (queries[:, None] - keys[None, :]).to(work)  # i - j
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf")).to(dtype)

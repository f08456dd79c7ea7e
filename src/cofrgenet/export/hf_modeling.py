"""CoFrGeNet language models for Hugging Face ``transformers`` (remote code).

``cofr export hf`` copies this file into the exported folder as ``modeling_cofrgenet.py``
and points ``config.json``'s ``auto_map`` at it, so

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

loads the model on a machine with torch and transformers only: this file imports
nothing else (never ``cofrgenet``). It re-implements, for inference, every architecture
and mixer of ``cofr models list`` (GPT-2 / Llama decoders with softmax, sparse,
synthesizer, CAttnU and CAttnM attention and MLP, SwiGLU and Cffn feed-forward
networks; RNN, LSTM and GRU), operation for operation as cofrgenet computes them in eval
mode, so float32 logits agree to rounding. Parameter names are cofrgenet's.

Made for inference and fine-tuning, not for cofrgenet's pretraining: ladder outputs are
clipped to the range recorded in training when ``ladder_clip`` is true (cofrgenet's eval
mode, in train mode too), continued fractions use the eager continuant recurrence with
plain autograd, and dropout is absent. Transformers' activation checkpointing recomputes
every block (``every_n_layers`` is not read). There is no key/value cache: ``generate``
re-reads the context (the last ``block_size`` tokens for transformers, the whole
sequence for recurrent models) at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

RECURRENT_CELLS = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}
TRANSFORMER_ARCHS = ("gpt", "llama")
ATTENTIONS = (
    "softmax",
    "sparse_strided",
    "sparse_fixed",
    "synthesizer_dense",
    "cattn_u",
    "cattn_m",
)
FFNS = ("mlp", "swiglu", "cffn")

# Continuant rescaling, as cofrgenet.ops.continuant: scale by 2^-64 past 2^64.
_RESCALE_EXPONENT = 64
_RESCALE_AT = 2.0**_RESCALE_EXPONENT
_RESCALE_BY = 2.0**-_RESCALE_EXPONENT


#: The usual Hugging Face names of cofrgenet's settings: {theirs: ours}.
HF_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "max_position_embeddings": "block_size",
}


class CofrGeNetConfig(PretrainedConfig):
    """Configuration of an exported CoFrGeNet model.

    ``cofr`` holds cofrgenet's ``ModelConfig.to_dict()`` (architecture, shape, mixers,
    ladder options); the usual Hugging Face names (vocab_size, hidden_size,
    num_hidden_layers, num_attention_heads, max_position_embeddings) are filled from it;
    recurrent models, which read any length, have max_position_embeddings None. They stay
    in step with ``cofr``, the Hugging Face name winning: one given
    (``from_pretrained(..., vocab_size=400)``) or set (``resize_token_embeddings`` sets
    ``vocab_size``) is written into ``cofr``, which the model is built from.
    """

    model_type = "cofrgenet"

    def __init__(self, cofr: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.cofr = dict(cofr or {})
        for theirs, ours in self._aliases().items():
            if ours in self.cofr:
                kwargs.setdefault(theirs, self.cofr[ours])
        if self.cofr.get("arch") in RECURRENT_CELLS:
            # No position limit (block_size was the training length only): with one,
            # generate warned past it and capped its default length at it.
            kwargs.setdefault("max_position_embeddings", None)
        # The head shares the embedding inside the model (no lm_head.weight when tied):
        # transformers' own tying machinery is not needed.
        kwargs["tie_word_embeddings"] = False
        kwargs.setdefault("use_cache", False)
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
            if key in kwargs:
                setattr(self, key, kwargs.pop(key))
        if "max_position_embeddings" in kwargs:
            self.max_position_embeddings = kwargs.pop("max_position_embeddings")
        super().__init__(**kwargs)

    def _aliases(self) -> dict[str, str]:
        """HF_NAMES, less max_position_embeddings for recurrent models (no position limit)."""
        if self.__dict__.get("cofr", {}).get("arch") in RECURRENT_CELLS:
            return {k: v for k, v in HF_NAMES.items() if k != "max_position_embeddings"}
        return HF_NAMES

    def __setattr__(self, key: str, value: Any) -> None:
        super().__setattr__(key, value)
        # Written through to cofr, which builds the model: a resized vocabulary saved
        # with a stale cofr["vocab_size"] no longer loaded (size mismatch).
        cofr = self.__dict__.get("cofr")
        aliases = self._aliases()
        if key in aliases and cofr is not None and value is not None:
            cofr[aliases[key]] = value


# Continued fractions -------------------------------------------------------------------


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rescale(high: Tensor, low: Tensor, scale: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    big = high.abs() > _RESCALE_AT
    high = torch.where(big, high * _RESCALE_BY, high)
    low = torch.where(big, low * _RESCALE_BY, low)
    return high, low, scale + big.to(scale.dtype)


def _continuant(coefficient: Callable[[int], Tensor], d: int, eps: float, rescale: bool):
    """f~ = K_{d-1}(a_2..a_d) / clamp(K_d(a_1..a_d)) by the tail recurrence.

    ``coefficient(k)`` returns a_{k+1} (shape S); returns (value (S), K_d (S), scaled).
    |K_d| is clamped at eps (sign(0) = +1).
    """
    high = coefficient(d - 1)  # K_1 = a_d
    low = torch.ones_like(high)  # K_0
    scale = torch.zeros_like(high)
    for k in range(d - 2, -1, -1):
        high, low = coefficient(k) * high + low, high
        if rescale:
            high, low, scale = _rescale(high, low, scale)
    if rescale:
        threshold = eps * torch.exp2(_RESCALE_EXPONENT * -scale)
    else:
        threshold = torch.full_like(high, eps)
    clamped = high.abs() < threshold
    denominator = torch.where(clamped, torch.where(high >= 0, threshold, -threshold), high)
    return low * torch.reciprocal(denominator), high


def _fraction(coefficient: Callable[[int], Tensor], d: int, eps: float) -> Tensor:
    """Unscaled first; rescaled only if K_d overflowed (powers of two change no bits)."""
    value, k_d = _continuant(coefficient, d, eps, rescale=False)
    if bool(torch.isfinite(k_d).all()):
        return value
    return _continuant(coefficient, d, eps, rescale=True)[0]


def continued_fraction(a: Tensor, eps: float) -> Tensor:
    """1 / (a_1 + 1 / (a_2 + ... + 1 / a_d)): a (..., d) -> (...), a[..., 0] = a_1."""
    work = a.to(_compute_dtype(a.dtype))
    return _fraction(lambda k: work[..., k], a.shape[-1], eps).to(a.dtype)


def univariate_ladder(
    x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, floor: float
) -> Tensor:
    """Elementwise ladders a_k = link(weight[k] x + bias[k]): x (..., n), weight/bias
    (d, n) -> (..., n). link is floor + softplus for floor > 0, else the identity."""
    dtype = _compute_dtype(x.dtype)
    x2 = x.reshape(-1, x.shape[-1]).to(dtype)
    w = weight.to(dtype)
    b = None if bias is None else bias.to(dtype)

    def coefficient(k: int) -> Tensor:
        u = x2 * w[k] if b is None else torch.addcmul(b[k], x2, w[k])
        return u if floor <= 0 else F.softplus(u) + floor

    return _fraction(coefficient, weight.shape[0], eps).reshape(x.shape).to(x.dtype)


# Ladder layers -------------------------------------------------------------------------


class LadderWeights(nn.Module):
    """Partial-denominator weights per depth: ``weight.{k-1}`` (and ``bias.{k-1}``)."""

    def __init__(
        self, depth: int, weight_shape: tuple[int, ...], bias_shape: tuple[int, ...] | None
    ) -> None:
        super().__init__()
        self.depth = depth
        self.weight = nn.ParameterList(
            nn.Parameter(torch.empty(weight_shape)) for _ in range(depth)
        )
        self.bias = (
            None
            if bias_shape is None
            else nn.ParameterList(nn.Parameter(torch.empty(bias_shape)) for _ in range(depth))
        )

    def stacked_weight(self) -> Tensor:
        return torch.stack(list(self.weight))

    def stacked_bias(self) -> Tensor | None:
        return None if self.bias is None else torch.stack(list(self.bias))

    def pvariate_denominators(self, x: Tensor) -> Tensor:
        """a[..., j, k] = W_k[j] . x (+ b_k[j]): x (..., p) -> (..., L, d)."""
        depth, ladders, dim = self.depth, *self.weight[0].shape
        rows = x.reshape(-1, dim)
        weight = self.stacked_weight().reshape(depth * ladders, dim)
        bias = self.stacked_bias()
        if bias is None:
            a_t = weight @ rows.t()
        else:
            a_t = torch.addmm(bias.reshape(depth * ladders, 1), weight, rows.t())
        a = a_t.view(depth, ladders, rows.shape[0]).permute(2, 1, 0)
        return a.view(*x.shape[:-1], ladders, depth)


class OutputRange(nn.Module):
    """Ladder outputs clipped to [low, high], the range recorded in training, in eval mode
    only: a model fine-tuned here (``model.train()``) computes what cofrgenet trains,
    unclipped, rather than a clip that gives outputs past the range no gradient. The
    range is not updated by that training."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.register_buffer("low", torch.full(shape, float("-inf")))
        self.register_buffer("high", torch.full(shape, float("inf")))

    def forward(self, z: Tensor, length: int | None = None) -> Tensor:
        if self.training:
            return z
        low, high = self.low, self.high
        if length is not None:
            low, high = low[..., :length], high[..., :length]
        return torch.clamp(z, low.to(z.dtype), high.to(z.dtype))


class LadderLayer(nn.Module):
    """Shared by Cffn, CAttnU and CAttnM: the partial-denominator link and the clip."""

    def __init__(self, cofr: dict[str, Any], range_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.eps = float(cofr["ladder_eps"])
        positive = cofr["ladder_denominators"] == "positive"
        self.floor = float(cofr["ladder_floor"]) if positive else 0.0
        bias = cofr["ladder_bias"]
        self.has_ladder_bias = bool(cofr["bias"] if bias is None else bias)
        self.output_range = OutputRange(range_shape) if cofr["ladder_clip"] else None

    def link(self, u: Tensor) -> Tensor:
        return F.softplus(u) + self.floor if self.floor > 0 else u

    def clip(self, z: Tensor, length: int | None = None) -> Tensor:
        return z if self.output_range is None else self.output_range(z, length)


class Cffn(LadderLayer):
    """Continued-fraction FFN: x^ = sigmoid(G x) x, y = U x^ + V f~(ladders(x^)).

    (..., p) -> (..., p); "scalar" ladders are p-variate (one value each), "elementwise"
    ones univariate per channel.
    """

    def __init__(self, cofr: dict[str, Any]) -> None:
        dim, ladders, depth, ladder = (
            cofr["n_embd"],
            cofr["ladders"],
            cofr["depth"],
            cofr["cffn_ladder"],
        )
        shape = (ladders,) if ladder == "scalar" else (ladders, dim)
        super().__init__(cofr, shape)
        self.dim, self.ladders, self.depth, self.ladder = dim, ladders, depth, ladder
        self.gate = nn.Linear(dim, dim, bias=cofr["bias"])
        self.linear = nn.Linear(dim, dim, bias=cofr["bias"])
        self.denominators = LadderWeights(
            depth, (ladders, dim), shape if self.has_ladder_bias else None
        )
        self.mix = nn.Parameter(torch.empty(dim, ladders))

    def forward(self, x: Tensor) -> Tensor:
        gated = torch.sigmoid(self.gate(x)) * x
        if self.ladder == "scalar":
            a = self.link(self.denominators.pvariate_denominators(gated))  # (..., L, d)
            z = self.clip(continued_fraction(a, self.eps))  # (..., L)
            mixed = z @ self.mix.t()
        else:
            n_l, p = self.ladders, self.dim
            weight = self.denominators.stacked_weight().reshape(self.depth, n_l * p)
            bias = self.denominators.stacked_bias()
            bias = None if bias is None else bias.reshape(self.depth, n_l * p)
            # One univariate ladder per (ensemble, channel), on x^ repeated L times.
            repeated = gated.unsqueeze(-2).expand(*gated.shape[:-1], n_l, p).flatten(-2)
            z = univariate_ladder(repeated, weight, bias, self.eps, self.floor)
            # A broadcast product summed over L (an einsum is ~15x slower on CPU).
            mixed = (self.clip(z.unflatten(-1, (n_l, p))) * self.mix.t()).sum(-2)
        return self.linear(gated) + mixed


class CAttnU(LadderLayer):
    """Univariate ladders along tokens, mixed causally by two upper-triangular matrices.

    (B, T, p) -> (B, T, p); parameters tied to positions (T <= block_size).
    """

    def __init__(self, cofr: dict[str, Any]) -> None:
        max_len, depth = cofr["block_size"], cofr["depth"]
        super().__init__(cofr, (2, max_len))
        self.max_len, self.depth = max_len, depth
        self.linear = nn.Parameter(torch.empty(2, max_len))
        self.denominators = LadderWeights(
            depth, (2, max_len), (2, max_len) if self.has_ladder_bias else None
        )
        self.mixing = nn.Parameter(torch.empty(2, max_len * (max_len + 1) // 2))

    def mixing_matrices(self, length: int) -> Tensor:
        """U_1, U_2 as (2, length, length), zero below the diagonal."""
        rows, cols = torch.triu_indices(self.max_len, self.max_len, device=self.mixing.device)
        full = self.mixing.new_zeros(2, self.max_len, self.max_len)
        full[:, rows, cols] = self.mixing
        return full[:, :length, :length]

    def forward(self, x: Tensor) -> Tensor:
        batch, length, dim = x.shape
        tokens = x.transpose(1, 2).unsqueeze(2).expand(batch, dim, 2, length)
        tokens = tokens.reshape(batch, dim, 2 * length)  # (B, p, 2 T)
        weight = self.denominators.stacked_weight()[:, :, :length].reshape(self.depth, 2 * length)
        bias = self.denominators.stacked_bias()
        bias = None if bias is None else bias[:, :, :length].reshape(self.depth, 2 * length)
        f = univariate_ladder(tokens, weight, bias, self.eps, self.floor)
        f = self.clip(f.unflatten(-1, (2, length)), length)  # (B, p, 2, T)
        y = f + tokens.unflatten(-1, (2, length)) * self.linear[:, :length]
        mixed = torch.einsum("bces,est->bcet", y, self.mixing_matrices(length))
        return (mixed[:, :, 0] * mixed[:, :, 1]).transpose(1, 2)


class CAttnM(LadderLayer):
    """A = causal_softmax(Y F), O = A (X W^v), Y from p-variate ladders: (B, T, p) -> same."""

    def __init__(self, cofr: dict[str, Any]) -> None:
        dim, max_len, ladders = cofr["n_embd"], cofr["block_size"], cofr["ladders"]
        super().__init__(cofr, (ladders,))
        self.denominators = LadderWeights(
            cofr["depth"], (ladders, dim), (ladders,) if self.has_ladder_bias else None
        )
        self.position_map = nn.Parameter(torch.empty(ladders, max_len))
        self.value = nn.Linear(dim, dim, bias=cofr["bias"])

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[1]
        a = self.link(self.denominators.pvariate_denominators(x))  # (B, T, L, d)
        queries = self.clip(continued_fraction(a, self.eps))  # (B, T, L)
        keys = self.position_map[:, :length].t()  # (T, L)
        values = self.value(x)
        out = F.scaled_dot_product_attention(
            queries.unsqueeze(1),
            keys.to(queries.dtype).expand(x.shape[0], 1, *keys.shape),
            values.unsqueeze(1),
            is_causal=True,
            scale=1.0,
        )
        return out.squeeze(1)


# Baseline mixers -----------------------------------------------------------------------


def rope_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, device, dtype
) -> Tensor:
    """RoPE inverse frequencies (head_dim // 2,), with Llama 3's scaling when given."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=dtype) / head_dim)
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_len"]
    wavelen = 2 * math.pi / inv_freq
    smooth = ((original / wavelen - low) / (high - low)).clamp(0.0, 1.0)
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def apply_rope(x: Tensor, theta: float, scaling: dict[str, Any] | None) -> Tensor:
    """Rotate feature pairs (i, i + D/2) of x (..., T, D) by position x frequency."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    inv_freq = rope_frequencies(x.shape[-1], theta, scaling, x.device, work)
    angles = torch.outer(torch.arange(x.shape[-2], device=x.device, dtype=work), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def alibi_slopes(n_head: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022)."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if n_head & (n_head - 1) == 0:
        return power_of_two(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_head - closest]


def alibi_bias(n_head: int, length: int, device, dtype) -> Tensor:
    """Causal ALiBi bias (n_head, T, T): -m_h (i - j) for j <= i, -inf above."""
    slopes = torch.tensor(alibi_slopes(n_head), device=device, dtype=dtype)
    pos = torch.arange(length, device=device)
    distance = (pos[:, None] - pos[None, :]).to(dtype)
    bias = -slopes[:, None, None] * distance
    return bias.masked_fill(distance < 0, float("-inf"))


def sparse_mask(pattern: str, length: int, stride: int, summary: int, device) -> Tensor:
    """(T, T) bool, True where query i may attend key j (Sparse Transformer patterns)."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    causal = j <= i
    if pattern == "strided":
        keep = (i - j <= stride) | ((i - j) % stride == 0)
    else:
        keep = (i // stride == j // stride) | (j % stride >= stride - summary)
    return causal & keep


class CausalSelfAttention(nn.Module):
    """Causal softmax attention with GQA, RoPE / ALiBi and optional sparse patterns."""

    def __init__(self, cofr: dict[str, Any], pattern: str | None = None) -> None:
        super().__init__()
        dim, n_head = cofr["n_embd"], cofr["n_head"]
        n_kv = n_head if cofr["n_kv_head"] is None else cofr["n_kv_head"]
        self.n_head, self.n_kv_head, self.head_dim = n_head, n_kv, dim // n_head
        self.rope = cofr["position"] == "rope"
        self.alibi = cofr["position"] == "alibi"
        self.rope_theta, self.rope_scaling = cofr["rope_theta"], cofr["rope_scaling"]
        self.pattern = pattern
        if pattern is not None:
            stride = cofr["sparse_stride"]
            self.stride = max(1, round(math.sqrt(cofr["block_size"]))) if stride is None else stride
            summary = cofr["sparse_summary"]
            self.summary = max(1, self.stride // 8) if summary is None else summary
        self.c_attn = nn.Linear(dim, (n_head + 2 * n_kv) * self.head_dim, bias=cofr["bias"])
        self.c_proj = nn.Linear(dim, dim, bias=cofr["bias"])

    def attention_mask(self, length: int, device, dtype) -> Tensor | None:
        allowed = None
        if self.pattern is not None:
            allowed = sparse_mask(self.pattern, length, self.stride, self.summary, device)
        if not self.alibi:
            return allowed
        bias = alibi_bias(self.n_head, length, device, dtype)
        if allowed is not None:
            bias = bias.masked_fill(~allowed, float("-inf"))
        return bias.unsqueeze(0)  # 4-D: a 3-D float mask sends SDPA to its slow math kernel

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        hd, n_q, n_kv = self.head_dim, self.n_head, self.n_kv_head
        q, k, v = self.c_attn(x).split((n_q * hd, n_kv * hd, n_kv * hd), dim=2)
        q = q.view(B, T, n_q, hd).transpose(1, 2)
        k = k.view(B, T, n_kv, hd).transpose(1, 2)
        v = v.view(B, T, n_kv, hd).transpose(1, 2)
        if self.rope:
            q = apply_rope(q, self.rope_theta, self.rope_scaling)
            k = apply_rope(k, self.rope_theta, self.rope_scaling)
        mask = self.attention_mask(T, x.device, q.dtype)
        kwargs: dict[str, Any] = {"attn_mask": mask, "is_causal": mask is None}
        if n_kv != n_q:
            kwargs["enable_gqa"] = True
        y = F.scaled_dot_product_attention(q, k, v, **kwargs)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class DenseSynthesizer(nn.Module):
    """Causal Dense Synthesizer: logits over key positions from each token alone."""

    def __init__(self, cofr: dict[str, Any]) -> None:
        super().__init__()
        dim, n_head, max_len, bias = (
            cofr["n_embd"],
            cofr["n_head"],
            cofr["block_size"],
            cofr["bias"],
        )
        self.n_head, self.head_dim, self.max_len = n_head, dim // n_head, max_len
        self.w1 = nn.Linear(dim, dim, bias=bias)
        self.w2 = nn.Linear(self.head_dim, n_head * max_len, bias=bias)
        self.value = nn.Linear(dim, dim, bias=bias)
        self.c_proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        H, hd = self.n_head, self.head_dim
        hidden = F.relu(self.w1(x)).view(B, T, H, hd)
        w2 = self.w2.weight.view(H, self.max_len, hd)[:, :T]
        logits = torch.einsum("bthe,hse->bhts", hidden, w2)
        if self.w2.bias is not None:
            logits = logits + self.w2.bias.view(H, self.max_len)[:, None, :T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        probs = logits.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        v = self.value(x).view(B, T, H, hd).transpose(1, 2)
        return self.c_proj((probs @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """GPT-2's MLP: c_proj(gelu_tanh(c_fc(x)))."""

    def __init__(self, cofr: dict[str, Any]) -> None:
        super().__init__()
        dim = cofr["n_embd"]
        hidden = 4 * dim if cofr["ffn_hidden"] is None else cofr["ffn_hidden"]
        self.c_fc = nn.Linear(dim, hidden, bias=cofr["bias"])
        self.c_proj = nn.Linear(hidden, dim, bias=cofr["bias"])

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class SwiGLU(nn.Module):
    """Llama's SwiGLU: c_proj(silu(c_gate(x)) * c_fc(x))."""

    def __init__(self, cofr: dict[str, Any]) -> None:
        super().__init__()
        dim = cofr["n_embd"]
        hidden = cofr["ffn_hidden"]
        if hidden is None:  # Llama's rule: 8/3 dim rounded up to a multiple of 256
            hidden = 256 * -(-int(2 * 4 * dim / 3) // 256)
        self.c_gate = nn.Linear(dim, hidden, bias=cofr["bias"])
        self.c_fc = nn.Linear(dim, hidden, bias=cofr["bias"])
        self.c_proj = nn.Linear(hidden, dim, bias=cofr["bias"])

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))


def build_attention(name: str, cofr: dict[str, Any]) -> nn.Module:
    if name == "softmax":
        return CausalSelfAttention(cofr)
    if name in ("sparse_strided", "sparse_fixed"):
        return CausalSelfAttention(cofr, pattern=name.split("_", 1)[1])
    if name == "synthesizer_dense":
        return DenseSynthesizer(cofr)
    if name == "cattn_u":
        return CAttnU(cofr)
    if name == "cattn_m":
        return CAttnM(cofr)
    raise ValueError(f"unknown attention mixer {name!r}; this file knows {ATTENTIONS}")


def build_ffn(name: str, cofr: dict[str, Any]) -> nn.Module:
    if name == "mlp":
        return MLP(cofr)
    if name == "swiglu":
        return SwiGLU(cofr)
    if name == "cffn":
        return Cffn(cofr)
    raise ValueError(f"unknown ffn mixer {name!r}; this file knows {FFNS}")


def build_norm(cofr: dict[str, Any]) -> nn.Module:
    dim, eps = cofr["n_embd"], cofr["norm_eps"]
    if cofr["norm"] == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=cofr["bias"])
    return nn.RMSNorm(dim, eps=eps)


def layer_mixer(cofr: dict[str, Any], kind: str, layer: int) -> str:
    """Mixer name of ``layer``: the pattern (cycled) when set, else the global name."""
    pattern = cofr.get(f"{kind}_pattern")
    return pattern[layer % len(pattern)] if pattern else cofr[kind]


class Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). (B, T, C) -> same.

    ``gradient_checkpointing`` and ``_gradient_checkpointing_func`` are set by
    transformers' ``gradient_checkpointing_enable()``: a training forward then keeps only
    x for backward and recomputes the block there.
    """

    gradient_checkpointing = False

    def __init__(self, cofr: dict[str, Any], layer: int) -> None:
        super().__init__()
        self.ln_1 = build_norm(cofr)
        self.attn = build_attention(layer_mixer(cofr, "attention", layer), cofr)
        self.ln_2 = build_norm(cofr)
        self.mlp = build_ffn(layer_mixer(cofr, "ffn", layer), cofr)

    def forward(self, x: Tensor) -> Tensor:
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(self._forward, x)
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def sinusoidal_encoding(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """The original transformer's position table: positions (T,) -> (T, dim), float32."""
    exponents = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim
    angles = positions.to(torch.float32)[..., None] * base**-exponents
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :dim]


# The Hugging Face model ----------------------------------------------------------------


class CofrGeNetPreTrainedModel(PreTrainedModel):
    config_class = CofrGeNetConfig
    base_model_prefix = "model"  # no such submodule: parameter names are used as they are
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True  # transformer blocks; recurrent models have none

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """A plain random start for models built from a config alone (``from_config``).

        Exported weights replace all of it; the clipping ranges start open (no clip).
        """
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LadderLayer):
            # The ladder weights live in ParameterLists, which transformers' init skips:
            # initialised here with the layer's own parameters.
            for weight in module.denominators.weight:
                nn.init.normal_(weight, std=0.5 / math.sqrt(weight.shape[-1]))
            for bias in module.denominators.bias or ():
                nn.init.ones_(bias)  # partial denominators centred near +1
            for name, parameter in module.named_parameters(recurse=False):
                if name == "linear":  # CAttnU's linear terms start at 1
                    nn.init.ones_(parameter)
                else:
                    nn.init.normal_(parameter, std=0.02)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.reset_parameters()
        elif isinstance(module, OutputRange):
            module.low.fill_(float("-inf"))
            module.high.fill_(float("inf"))
        elif isinstance(module, nn.RNNBase):
            module.reset_parameters()


class CofrGeNetForCausalLM(CofrGeNetPreTrainedModel, GenerationMixin):
    """A CoFrGeNet (or baseline) language model: input_ids (B, T) -> logits (B, T, V).

    Transformers (arch "gpt"/"llama") hold ``transformer.{wte, wpe, h, ln_f}`` and
    ``lm_head``; recurrent ones (``rnn``/``lstm``/``gru``) hold ``wte``, ``rnn`` and
    ``lm_head``. A tied head reuses the token embedding and has no weight of its own.
    """

    def __init__(self, config: CofrGeNetConfig) -> None:
        super().__init__(config)
        cofr = config.cofr
        self.arch = cofr["arch"]
        C, V = cofr["n_embd"], config.vocab_size  # the HF name wins (kept in step)
        self.block_size = cofr["block_size"]
        # generate's context: the length the run trained at, when shorter than the block
        # (positions past it never trained), as cofr generate reads.
        self.context = min(
            getattr(config, "trained_length", None) or self.block_size, self.block_size
        )
        if self.arch in TRANSFORMER_ARCHS:
            modules: dict[str, nn.Module] = {"wte": nn.Embedding(V, C)}
            self.position = cofr["position"]
            if self.position == "learned":
                modules["wpe"] = nn.Embedding(self.block_size, C)
            modules["h"] = nn.ModuleList(Block(cofr, i) for i in range(cofr["n_layer"]))
            modules["ln_f"] = build_norm(cofr)
            self.transformer = nn.ModuleDict(modules)
            self.embedding_scale = math.sqrt(C) if self.position == "sinusoidal" else 1.0
            self.tied = bool(cofr["tie_embeddings"])
            H = C
        elif self.arch in RECURRENT_CELLS:
            H = cofr["rnn_hidden"] or C
            self.wte = nn.Embedding(V, C)
            self.rnn = RECURRENT_CELLS[self.arch](
                C, H, num_layers=cofr["n_layer"], bias=cofr["bias"], batch_first=True
            )
            self.embedding_scale = math.sqrt(C)
            self.tied = bool(cofr["tie_embeddings"]) and H == C
        else:
            raise ValueError(f"unknown architecture {self.arch!r}")
        self.lm_head = None if self.tied else nn.Linear(H, V, bias=False)
        # Blocks to recompute: transformers then says "does not support" for the others.
        self.supports_gradient_checkpointing = self.arch in TRANSFORMER_ARCHS
        self.post_init()

    # Embeddings, for transformers' utilities.
    def _embedding(self) -> nn.Embedding:
        return self.transformer["wte"] if self.arch in TRANSFORMER_ARCHS else self.wte

    def get_input_embeddings(self) -> nn.Embedding:
        return self._embedding()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if self.arch in TRANSFORMER_ARCHS:
            self.transformer["wte"] = value
        else:
            self.wte = value

    def get_output_embeddings(self) -> nn.Module | None:
        return self.lm_head

    def compute_logits(self, input_ids: Tensor) -> Tensor:
        """input_ids (B, T) -> logits (B, T, V), exactly cofrgenet's eval forward."""
        if self.arch in RECURRENT_CELLS:
            x = self.wte(input_ids) * self.embedding_scale
            hidden, _ = self.rnn(x)
        else:
            seq_len = input_ids.shape[1]
            if seq_len > self.block_size:
                raise ValueError(
                    f"sequence length {seq_len} exceeds block_size {self.block_size}: the "
                    "model was built for at most block_size positions"
                )
            x = self.transformer["wte"](input_ids)
            if self.position in ("learned", "sinusoidal"):
                pos = torch.arange(seq_len, device=input_ids.device)
                if self.position == "learned":
                    table = self.transformer["wpe"](pos)
                else:
                    table = sinusoidal_encoding(pos, x.shape[-1])
                x = x * self.embedding_scale + table.to(x.dtype)
            for block in self.transformer["h"]:
                x = block(x)
            hidden = self.transformer["ln_f"](x)
        if self.lm_head is None:
            return F.linear(hidden, self._embedding().weight)
        return self.lm_head(hidden)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple[Tensor, ...]:
        """input_ids (B, T) -> CausalLMOutputWithPast(logits (B, T, V), loss if labels).

        ``attention_mask`` may only mark right padding (trailing zeros): a causal model
        never looks ahead, so positions before the padding are exact. Left padding would
        shift positions and is refused. Cache arguments are ignored (no KV cache).
        """
        if input_ids is None:
            raise ValueError("CofrGeNet models take input_ids (inputs_embeds is not supported)")
        asked = [k for k in ("output_hidden_states", "output_attentions") if kwargs.get(k)]
        if asked:  # silently None would read as the model's answer
            raise ValueError(
                f"CofrGeNet models return logits (and the loss) only: {asked[0]} is not supported"
            )
        if attention_mask is not None:
            _check_right_padding(attention_mask)
        logits = self.compute_logits(input_ids)
        loss = None
        if labels is not None:
            # Predict token t + 1 from positions <= t; -100 labels are ignored.
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1).to(logits.device),
                ignore_index=-100,
            )
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """The whole context at every step (no cache); transformers see the last block_size
        tokens (the trained length's, when the run trained at less), as ``cofr generate``
        does, recurrent models everything. Prompts of one
        length only: generate appends each new token after a row's padding."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError(
                "CofrGeNet models generate from prompts of one length (no padding): "
                "generate would append each token after a row's padding; run prompts of "
                "other lengths one at a time (padded batches are fine for scoring)"
            )
        if self.arch in TRANSFORMER_ARCHS:
            input_ids = input_ids[:, -self.context :]
            if attention_mask is not None:
                attention_mask = attention_mask[:, -self.context :]
        return {"input_ids": input_ids, "attention_mask": attention_mask}


def _check_right_padding(attention_mask: Tensor) -> None:
    mask = attention_mask.to(torch.int64)
    if not bool((mask.cummin(dim=-1).values == mask).all()):
        raise ValueError(
            "CofrGeNet models support right padding only (attention_mask 1...1 0...0): "
            "left-padded batches shift positions; pad on the right or run one sequence at a time"
        )

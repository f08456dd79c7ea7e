"""Mixer registries: attention and feed-forward modules chosen by name.

A mixer is any ``nn.Module`` mapping (B, T, C) -> (B, T, C). Register a builder with
the signature ``(config: ModelConfig, layer_idx: int) -> nn.Module``::

    from cofrgenet.models import ATTENTION

    @ATTENTION.register("my_attention")
    def build_my_attention(config, layer_idx):
        return MyAttention(config.n_embd, config.block_size)

then ``ModelConfig(attention="my_attention")`` uses it; the block never changes.
Optional keywords of ``register``:

* ``flops(config, layer_idx, seq_len) -> int``: forward FLOPs per token of one layer
  (for ``estimate_flops_per_token``); without it the estimate is 2 FLOPs per parameter.
* ``owns_dropout``: True when the module applies ``config.dropout`` to its own output
  (as GPT-2's attention and MLP do); otherwise the block applies it.
* ``relative_positions``: True when the module computes q.k logits and applies
  ``config.position`` "rope" / "alibi" to them. A model whose ``position`` is one of
  those must have at least one such layer (the others are position-aware by
  construction, e.g. CAttnM and the Dense Synthesizer read key positions).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from cofrgenet.nn.attention import CausalSelfAttention
from cofrgenet.nn.mlp import MLP, SwiGLU, swiglu_hidden
from cofrgenet.nn.positional import RotaryEmbedding
from cofrgenet.nn.sparse_attention import SparseCausalSelfAttention
from cofrgenet.nn.synthesizer import DenseSynthesizer

if TYPE_CHECKING:
    from cofrgenet.models.config import ModelConfig

Builder = Callable[["ModelConfig", int], nn.Module]
FlopsFn = Callable[["ModelConfig", int, int], int]


@dataclass(frozen=True)
class MixerEntry:
    """One registered mixer: its builder and what the model needs to know about it."""

    name: str
    builder: Builder
    flops: FlopsFn | None = None
    owns_dropout: bool = False
    relative_positions: bool = False


class Registry:
    """Name -> mixer builder. ``kind`` ("attention", "ffn", ...) appears in errors."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, MixerEntry] = {}

    def register(
        self,
        name: str,
        *,
        flops: FlopsFn | None = None,
        owns_dropout: bool = False,
        relative_positions: bool = False,
        replace: bool = False,
    ) -> Callable[[Builder], Builder]:
        """Decorator registering ``builder`` under ``name`` (ValueError if taken, unless replace)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} mixer name must be a non-empty string, got {name!r}")

        def decorator(builder: Builder) -> Builder:
            if name in self._entries and not replace:
                raise ValueError(
                    f"{self.kind} mixer {name!r} is already registered (pass replace=True)"
                )
            self._entries[name] = MixerEntry(name, builder, flops, owns_dropout, relative_positions)
            return builder

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name``; unknown names raise ValueError listing the registered ones."""
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> MixerEntry:
        """The entry for ``name``; unknown names raise ValueError listing the registered ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} mixer {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def build(self, name: str, config: ModelConfig, layer_idx: int) -> nn.Module:
        """Build mixer ``name`` for layer ``layer_idx`` of a model with ``config``."""
        return self.entry(name).builder(config, layer_idx)

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


ATTENTION = Registry("attention")
FFN = Registry("ffn")


# Analytic forward FLOPs per token. A matmul costs 2 FLOPs per multiply-add; elementwise
# activations, norms, softmax and position encodings are left out (as in nanoGPT / PaLM).
# seq_len is T.


def mixer_flops(registry: Registry, name: str, config: ModelConfig, layer: int, T: int) -> int:
    """Forward FLOPs per token of mixer ``name`` in layer ``layer`` at sequence length T."""
    entry = registry.entry(name)
    if entry.flops is not None:
        return int(entry.flops(config, layer, T))
    # No formula registered: 2 FLOPs per parameter (every weight used once per token).
    with torch.device("meta"):
        module = entry.builder(config, layer)
    return 2 * sum(p.numel() for p in module.parameters())


def continuant_flops(depth: int) -> int:
    """FLOPs of one ladder unit's continued fraction: ~3 per partial denominator + 1 reciprocal."""
    return 3 * depth + 1


def _softmax_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C = config.n_embd
    kv_width = config.kv_heads * (C // config.n_head)
    # q, k, v (k and v narrower with GQA) + output projection, then scores (q.k) and values
    # (a.v) over the full T. Sparse patterns are masks over this same dense computation.
    return 2 * C * (C + 2 * kv_width) + 2 * C * C + 2 * 2 * seq_len * C


def _synthesizer_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C = config.n_embd
    # W1 (C x C); W2 per head to T logits (H T head_dim = T C); values, output projection;
    # probabilities times values over the full T.
    return 2 * C * C + 2 * seq_len * C + 2 * C * C + 2 * C * C + 2 * seq_len * C


def _mlp_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C = config.n_embd
    hidden = config.ffn_hidden or 4 * C
    return 2 * 2 * C * hidden


def _swiglu_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C = config.n_embd
    hidden = config.ffn_hidden or swiglu_hidden(C)
    return 2 * 3 * C * hidden


def _cffn_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C, L, d = config.n_embd, config.ladders, config.depth
    # gate G and linear term U (C x C each); partial denominators (L d per input
    # coordinate in both readings); ladder mix V (C x L).
    matmuls = 2 * 2 * C * C + 2 * L * d * C + 2 * C * L
    units = L if config.cffn_ladder == "scalar" else L * C
    return matmuls + units * continuant_flops(d)


def _cattn_u_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C, d = config.n_embd, config.depth
    # Two ensembles of full univariate ladders per channel (a_k = w x + b, the fraction,
    # the linear term w0 x), two causal token mixes over the full T, their product.
    ladders = 2 * C * (2 * d + continuant_flops(d) + 2)
    return ladders + 2 * 2 * seq_len * C + C


def _cattn_m_flops(config: ModelConfig, layer_idx: int, seq_len: int) -> int:
    C, L, d = config.n_embd, config.ladders, config.depth
    # L p-variate ladders, Y F to T logits, A (X W^v): values over the full T + W^v.
    ladders = 2 * L * d * C + L * continuant_flops(d)
    return ladders + 2 * L * seq_len + 2 * seq_len * C + 2 * C * C


# Built-in mixers. The CoFrGeNet layers are imported inside their builders so that
# this module (and every softmax/mlp model) works without touching cofrgenet.nn's ladders.


def residual_std(config: ModelConfig) -> float:
    """GPT-2's init std of projections that write to the residual stream."""
    return 0.02 / math.sqrt(2 * config.n_layer)


def _ladder_kwargs(config: ModelConfig) -> dict[str, object]:
    out_std = config.ladder_out_std
    return {
        "bias": config.bias,
        "ladder_bias": config.ladder_bias,
        "eps": config.ladder_eps,
        "grad": config.ladder_grad,
        "impl": config.ladder_impl,
        "denominators": config.ladder_denominators,
        "floor": config.ladder_floor,
        "out_std": residual_std(config) if out_std is None else out_std,
        "clip_outputs": config.ladder_clip,
    }


def _softmax_kwargs(config: ModelConfig) -> dict[str, object]:
    """Heads and relative positions shared by the softmax-attention mixers."""
    head_dim = config.n_embd // config.n_head
    rope = None
    if config.position == "rope":
        rope = RotaryEmbedding(head_dim, config.rope_theta, config.rope_scaling)
    return {
        "bias": config.bias,
        "dropout": config.dropout,
        "n_kv_head": config.n_kv_head,
        "rope": rope,
        "alibi": config.position == "alibi",
    }


@ATTENTION.register("softmax", flops=_softmax_flops, owns_dropout=True, relative_positions=True)
def build_softmax_attention(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Causal softmax attention (GPT-2's; GQA, RoPE and ALiBi by config)."""
    return CausalSelfAttention(
        config.n_embd, config.n_head, config.block_size, **_softmax_kwargs(config)
    )


def _sparse_attention(config: ModelConfig, pattern: str) -> nn.Module:
    return SparseCausalSelfAttention(
        config.n_embd,
        config.n_head,
        config.block_size,
        pattern=pattern,
        stride=config.sparse_stride,
        summary=config.sparse_summary,
        **_softmax_kwargs(config),
    )


@ATTENTION.register(
    "sparse_strided", flops=_softmax_flops, owns_dropout=True, relative_positions=True
)
def build_sparse_strided(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Sparse Transformer attention, strided pattern (Child et al. 2019)."""
    return _sparse_attention(config, "strided")


@ATTENTION.register(
    "sparse_fixed", flops=_softmax_flops, owns_dropout=True, relative_positions=True
)
def build_sparse_fixed(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Sparse Transformer attention, fixed pattern (Child et al. 2019)."""
    return _sparse_attention(config, "fixed")


@ATTENTION.register("synthesizer_dense", flops=_synthesizer_flops, owns_dropout=True)
def build_dense_synthesizer(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Dense Synthesizer (Tay et al. 2020), tied to block_size."""
    return DenseSynthesizer(
        config.n_embd, config.n_head, config.block_size, bias=config.bias, dropout=config.dropout
    )


@ATTENTION.register("cattn_u", flops=_cattn_u_flops)
def build_cattn_u(config: ModelConfig, layer_idx: int) -> nn.Module:
    """CoFrGeNet CAttnU: univariate ladders across tokens (tied to block_size)."""
    from cofrgenet.nn import CAttnU

    return CAttnU(config.n_embd, config.block_size, config.depth, **_ladder_kwargs(config))


@ATTENTION.register("cattn_m", flops=_cattn_m_flops)
def build_cattn_m(config: ModelConfig, layer_idx: int) -> nn.Module:
    """CoFrGeNet CAttnM: p-variate ladders mapped to causal attention weights."""
    from cofrgenet.nn import CAttnM

    return CAttnM(
        config.n_embd, config.block_size, config.ladders, config.depth, **_ladder_kwargs(config)
    )


@FFN.register("mlp", flops=_mlp_flops, owns_dropout=True)
def build_mlp(config: ModelConfig, layer_idx: int) -> nn.Module:
    """GPT-2 GELU MLP (hidden width ``ffn_hidden``, default 4 * n_embd)."""
    return MLP(config.n_embd, config.ffn_hidden, bias=config.bias, dropout=config.dropout)


@FFN.register("swiglu", flops=_swiglu_flops, owns_dropout=True)
def build_swiglu(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Llama's SwiGLU (hidden width ``ffn_hidden``, default Llama's 8/3 n_embd rule)."""
    return SwiGLU(config.n_embd, config.ffn_hidden, bias=config.bias, dropout=config.dropout)


@FFN.register("cffn", flops=_cffn_flops)
def build_cffn(config: ModelConfig, layer_idx: int) -> nn.Module:
    """CoFrGeNet Cffn: gated ladder ensemble replacing the MLP."""
    from cofrgenet.nn import Cffn

    return Cffn(
        config.n_embd,
        config.ladders,
        config.depth,
        ladder=config.cffn_ladder,
        **_ladder_kwargs(config),
    )

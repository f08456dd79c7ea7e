"""The built-in attention and feed-forward mixers: their builders and FLOPs counts.

Registered into :data:`cofrgenet.models.registry.ATTENTION` and ``FFN``, which import this
module the first time a name is looked up.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ATTENTION, FFN, Registry
from cofrgenet.nn.attention import CausalSelfAttention
from cofrgenet.nn.cattn import CAttnM, CAttnU
from cofrgenet.nn.cffn import Cffn
from cofrgenet.nn.mlp import MLP, SwiGLU, swiglu_hidden
from cofrgenet.nn.positional import RotaryEmbedding
from cofrgenet.nn.sparse_attention import SparseCausalSelfAttention
from cofrgenet.nn.synthesizer import DenseSynthesizer


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


# Built-in mixers.


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


@ATTENTION.register(
    "softmax", flops=_softmax_flops, owns_dropout=True, relative_positions=True, uses_heads=True
)
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
    "sparse_strided",
    flops=_softmax_flops,
    owns_dropout=True,
    relative_positions=True,
    uses_heads=True,
)
def build_sparse_strided(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Sparse Transformer attention, strided pattern (Child et al. 2019)."""
    return _sparse_attention(config, "strided")


@ATTENTION.register(
    "sparse_fixed",
    flops=_softmax_flops,
    owns_dropout=True,
    relative_positions=True,
    uses_heads=True,
)
def build_sparse_fixed(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Sparse Transformer attention, fixed pattern (Child et al. 2019)."""
    return _sparse_attention(config, "fixed")


@ATTENTION.register(
    "synthesizer_dense", flops=_synthesizer_flops, owns_dropout=True, uses_heads=True
)
def build_dense_synthesizer(config: ModelConfig, layer_idx: int) -> nn.Module:
    """Dense Synthesizer (Tay et al. 2020), tied to block_size."""
    return DenseSynthesizer(
        config.n_embd, config.n_head, config.block_size, bias=config.bias, dropout=config.dropout
    )


@ATTENTION.register("cattn_u", flops=_cattn_u_flops)
def build_cattn_u(config: ModelConfig, layer_idx: int) -> nn.Module:
    """CoFrGeNet CAttnU: univariate ladders across tokens (tied to block_size)."""
    return CAttnU(config.n_embd, config.block_size, config.depth, **_ladder_kwargs(config))


@ATTENTION.register("cattn_m", flops=_cattn_m_flops)
def build_cattn_m(config: ModelConfig, layer_idx: int) -> nn.Module:
    """CoFrGeNet CAttnM: p-variate ladders mapped to causal attention weights."""
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
    return Cffn(
        config.n_embd,
        config.ladders,
        config.depth,
        ladder=config.cffn_ladder,
        **_ladder_kwargs(config),
    )

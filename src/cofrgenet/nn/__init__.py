"""Layers (nn.Modules) built on :mod:`cofrgenet.ops`: CoFrGeNet components and baselines.

Names are imported lazily (as in :mod:`cofrgenet.models`): importing one layer's module
does not import the others."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cofrgenet.lazy import lazy_exports

_EXPORTS = {
    "CausalSelfAttention": "attention",
    "CAttnM": "cattn",
    "CAttnU": "cattn",
    "Cffn": "cffn",
    "LadderLayer": "ladder",
    "LadderWeights": "ladder",
    "reusing_stacked_weights": "ladder",
    "MLP": "mlp",
    "SwiGLU": "mlp",
    "build_norm": "norms",
    "RotaryEmbedding": "positional",
    "SinusoidalPositions": "positional",
    "alibi_bias": "positional",
    "alibi_slopes": "positional",
    "SparseCausalSelfAttention": "sparse_attention",
    "DenseSynthesizer": "synthesizer",
}

__all__ = [
    "MLP",
    "CAttnM",
    "CAttnU",
    "CausalSelfAttention",
    "Cffn",
    "DenseSynthesizer",
    "LadderLayer",
    "LadderWeights",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "SparseCausalSelfAttention",
    "SwiGLU",
    "alibi_bias",
    "alibi_slopes",
    "build_norm",
    "reusing_stacked_weights",
]

if TYPE_CHECKING:
    from cofrgenet.nn.attention import CausalSelfAttention
    from cofrgenet.nn.cattn import CAttnM, CAttnU
    from cofrgenet.nn.cffn import Cffn
    from cofrgenet.nn.ladder import LadderLayer, LadderWeights, reusing_stacked_weights
    from cofrgenet.nn.mlp import MLP, SwiGLU
    from cofrgenet.nn.norms import build_norm
    from cofrgenet.nn.positional import (
        RotaryEmbedding,
        SinusoidalPositions,
        alibi_bias,
        alibi_slopes,
    )
    from cofrgenet.nn.sparse_attention import SparseCausalSelfAttention
    from cofrgenet.nn.synthesizer import DenseSynthesizer


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())

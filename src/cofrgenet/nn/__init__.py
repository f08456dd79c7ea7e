"""Layers (nn.Modules) built on :mod:`cofrgenet.ops`: CoFrGeNet components and baselines."""

from cofrgenet.nn.attention import CausalSelfAttention
from cofrgenet.nn.cattn import CAttnM, CAttnU
from cofrgenet.nn.cffn import Cffn
from cofrgenet.nn.ladder import LadderLayer, LadderWeights, reusing_stacked_weights
from cofrgenet.nn.mlp import MLP, SwiGLU
from cofrgenet.nn.norms import build_norm
from cofrgenet.nn.positional import RotaryEmbedding, SinusoidalPositions, alibi_bias, alibi_slopes
from cofrgenet.nn.sparse_attention import SparseCausalSelfAttention
from cofrgenet.nn.synthesizer import DenseSynthesizer

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

"""Layers (nn.Modules) built on :mod:`cofrgenet.ops`: CoFrGeNet components and baselines."""

from cofrgenet.nn.attention import CausalSelfAttention
from cofrgenet.nn.cattn import CAttnM, CAttnU
from cofrgenet.nn.cffn import Cffn
from cofrgenet.nn.ladder import LadderHealth, LadderLayer, LadderWeights
from cofrgenet.nn.mlp import MLP

__all__ = [
    "MLP",
    "CAttnM",
    "CAttnU",
    "CausalSelfAttention",
    "Cffn",
    "LadderHealth",
    "LadderLayer",
    "LadderWeights",
]

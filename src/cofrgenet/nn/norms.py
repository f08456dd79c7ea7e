"""Normalisation layers chosen by name: LayerNorm (GPT-2) or RMSNorm (Llama)."""

from __future__ import annotations

from torch import nn

NORMS = ("layernorm", "rmsnorm")


def build_norm(kind: str, dim: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """A norm over the last dimension (..., dim) -> (..., dim).

    * "layernorm": ``nn.LayerNorm`` (mean and variance; a bias when ``bias``).
    * "rmsnorm": ``nn.RMSNorm``, x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich
      2019, as in Llama); no bias whatever ``bias`` says.
    """
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; choose one of {NORMS}")

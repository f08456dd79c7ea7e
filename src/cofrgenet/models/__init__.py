"""Decoder-only language models with pluggable mixers.

``ModelConfig`` describes a model (presets via ``ModelConfig.from_preset``),
``build_model`` builds it, ``ATTENTION`` / ``FFN`` are the mixer registries, and
``count_parameters`` / ``estimate_flops_per_token`` report its size and cost.
"""

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.presets import list_presets
from cofrgenet.models.registry import ATTENTION, FFN, MixerEntry, Registry
from cofrgenet.models.report import (
    FlopsPerToken,
    ParameterCount,
    count_parameters,
    estimate_flops_per_token,
    presets_markdown,
)
from cofrgenet.models.transformer import GPT, Block, build_model

__all__ = [
    "ATTENTION",
    "FFN",
    "GPT",
    "Block",
    "FlopsPerToken",
    "MixerEntry",
    "ModelConfig",
    "ParameterCount",
    "Registry",
    "build_model",
    "count_parameters",
    "estimate_flops_per_token",
    "list_presets",
    "presets_markdown",
]

"""Language models: decoder-only transformers with pluggable mixers, and recurrent LMs.

``ModelConfig`` describes a model (presets via ``ModelConfig.from_preset``),
``build_model`` builds it, ``ARCHITECTURES`` / ``ATTENTION`` / ``FFN`` are the
registries of architectures and mixers, and ``count_parameters`` /
``estimate_flops_per_token`` report its size and cost.
"""

from cofrgenet.models.architectures import ARCHITECTURES, ArchEntry, build_model
from cofrgenet.models.combinations import combinations_markdown, supported_combinations
from cofrgenet.models.config import ModelConfig
from cofrgenet.models.presets import list_presets
from cofrgenet.models.recurrent import RecurrentLM
from cofrgenet.models.registry import ATTENTION, FFN, MixerEntry, Registry
from cofrgenet.models.report import (
    FlopsPerToken,
    ParameterCount,
    count_parameters,
    estimate_flops_per_token,
    presets_markdown,
)
from cofrgenet.models.transformer import GPT, Block

__all__ = [
    "ARCHITECTURES",
    "ATTENTION",
    "FFN",
    "GPT",
    "ArchEntry",
    "Block",
    "FlopsPerToken",
    "MixerEntry",
    "ModelConfig",
    "ParameterCount",
    "RecurrentLM",
    "Registry",
    "build_model",
    "combinations_markdown",
    "count_parameters",
    "estimate_flops_per_token",
    "list_presets",
    "presets_markdown",
    "supported_combinations",
]

"""Language models: decoder-only transformers with pluggable mixers, and recurrent LMs.

* :mod:`cofrgenet.models.config`: ``ModelConfig``, the plain description of a model
  (presets via ``ModelConfig.from_preset``); it imports no model code.
* :mod:`cofrgenet.models.registry`: the registries ``ARCHITECTURES``, ``ATTENTION``,
  ``FFN`` (one generic class), which import their built-ins at the first lookup.
* :mod:`cofrgenet.models.build`: ``build_model`` (also on meta: ``build_shapes``).
* :mod:`cofrgenet.models.transformer`, :mod:`~cofrgenet.models.recurrent`,
  :mod:`~cofrgenet.models.mixers`: the built-in architectures and mixers.
* :mod:`cofrgenet.models.counts`: ``count_parameters``, ``estimate_flops_per_token``.

Names are imported lazily, so importing one module (the config, say) does not import
the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cofrgenet.lazy import lazy_exports

_EXPORTS = {
    "ARCHITECTURES": "registry",
    "ATTENTION": "registry",
    "FFN": "registry",
    "ArchEntry": "registry",
    "MixerEntry": "registry",
    "Registry": "registry",
    "ModelConfig": "config",
    "build_model": "build",
    "list_presets": "presets",
    "combinations_markdown": "combinations",
    "supported_combinations": "combinations",
    "RecurrentLM": "recurrent",
    "GPT": "transformer",
    "Block": "transformer",
    "FlopsPerToken": "counts",
    "ParameterCount": "counts",
    "count_parameters": "counts",
    "estimate_flops_per_token": "counts",
    "presets_markdown": "counts",
}

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

if TYPE_CHECKING:
    from cofrgenet.models.build import build_model
    from cofrgenet.models.combinations import combinations_markdown, supported_combinations
    from cofrgenet.models.config import ModelConfig
    from cofrgenet.models.counts import (
        FlopsPerToken,
        ParameterCount,
        count_parameters,
        estimate_flops_per_token,
        presets_markdown,
    )
    from cofrgenet.models.presets import list_presets
    from cofrgenet.models.recurrent import RecurrentLM
    from cofrgenet.models.registry import (
        ARCHITECTURES,
        ATTENTION,
        FFN,
        ArchEntry,
        MixerEntry,
        Registry,
    )
    from cofrgenet.models.transformer import GPT, Block


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())

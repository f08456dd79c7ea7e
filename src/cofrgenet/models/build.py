"""Building a model from its config (also on the meta device, shapes only)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ARCHITECTURES


def build_model(config: ModelConfig) -> nn.Module:
    """Build the model ``config`` describes (on the current default device; works on meta).

    The result maps token ids (B, T) to logits (B, T, vocab_size) whatever ``config.arch``.
    """
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    return ARCHITECTURES.build(config.arch, config)


@contextlib.contextmanager
def _skipped_init() -> Iterator[None]:
    """``torch.nn.init``'s in-place initialisers as no-ops, for building on meta.

    A meta tensor has no values, so initialising one changes nothing; the calls only cost
    time (80% of building a model on meta).
    """
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {name: getattr(nn.init, name) for name in names}
    try:
        for name in names:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def build_shapes(config: ModelConfig) -> nn.Module:
    """The model ``config`` describes on the meta device, shapes only (no memory, no
    initialisation): for counting parameters and FLOPs."""
    with torch.device("meta"), _skipped_init():
        return build_model(config)

"""Architecture registry: the network skeleton ``ModelConfig.arch`` names.

An architecture is a builder ``(config) -> nn.Module`` whose module maps token ids
(B, T) to logits (B, T, vocab_size), plus what the rest of the package needs to know:

* ``defaults``: values for config fields left at None (e.g. "llama" fills
  ``norm="rmsnorm"``, ``position="rope"``, ``ffn="swiglu"``, ``bias=False``). A field
  given explicitly always wins; the defaults are applied when the config is made.
* ``flops(config, seq_len) -> dict[str, int]``: forward FLOPs per token by component.
* ``validate(config)``: raise ValueError for settings the architecture cannot take.
* ``kind``: "transformer" (blocks of attention and ffn mixers) or "recurrent".

Register a new one with ``ARCHITECTURES.register("name", defaults=..., flops=...)`` on its
builder; ``ModelConfig(arch="name")`` then builds it through ``build_model``.
The built-ins live in ``transformer.py`` ("gpt", "llama") and ``recurrent.py``
("rnn", "lstm", "gru").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from cofrgenet.models.config import ModelConfig

ArchBuilder = Callable[["ModelConfig"], nn.Module]
ArchFlops = Callable[["ModelConfig", int], dict[str, int]]
ArchValidate = Callable[["ModelConfig"], None]
KINDS = ("transformer", "recurrent")


@dataclass(frozen=True)
class ArchEntry:
    """One registered architecture."""

    name: str
    builder: ArchBuilder
    flops: ArchFlops
    kind: str = "transformer"
    defaults: dict[str, Any] = field(default_factory=dict)
    validate: ArchValidate | None = None


class ArchitectureRegistry:
    """Name -> architecture entry."""

    def __init__(self) -> None:
        self._entries: dict[str, ArchEntry] = {}

    def register(
        self,
        name: str,
        *,
        flops: ArchFlops,
        kind: str = "transformer",
        defaults: dict[str, Any] | None = None,
        validate: ArchValidate | None = None,
        replace: bool = False,
    ) -> Callable[[ArchBuilder], ArchBuilder]:
        """Decorator registering ``builder`` under ``name`` (ValueError if taken, unless replace)."""
        if kind not in KINDS:
            raise ValueError(f"architecture kind must be one of {KINDS}, got {kind!r}")

        def decorator(builder: ArchBuilder) -> ArchBuilder:
            if name in self._entries and not replace:
                raise ValueError(f"architecture {name!r} is already registered (pass replace=True)")
            self._entries[name] = ArchEntry(
                name, builder, flops, kind, dict(defaults or {}), validate
            )
            return builder

        return decorator

    def unregister(self, name: str) -> None:
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> ArchEntry:
        """The entry for ``name``; unknown names raise ValueError listing the registered ones."""
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown architecture {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def names(self, kind: str | None = None) -> list[str]:
        """Registered names of ``kind`` (default: every kind, transformers first), each kind
        in registration order."""
        kinds = KINDS if kind is None else (kind,)
        return [n for k in kinds for n, e in self._entries.items() if e.kind == k]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __repr__(self) -> str:
        return f"ArchitectureRegistry(names={self.names()})"


ARCHITECTURES = ArchitectureRegistry()


def build_model(config: ModelConfig) -> nn.Module:
    """Build the model ``config`` describes (on the current default device; works on meta).

    The result maps token ids (B, T) to logits (B, T, vocab_size) whatever ``config.arch``.
    """
    from cofrgenet.models.config import ModelConfig

    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    return ARCHITECTURES.entry(config.arch).builder(config)


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

"""Registries: architectures and mixers chosen by name.

One generic :class:`Registry` holds every kind: ``ARCHITECTURES`` (the network skeleton
``ModelConfig.arch`` names), ``ATTENTION`` and ``FFN`` (the mixers of a transformer
block). A registry knows the modules that register its built-ins and imports them the
first time a name is looked up, so any module may import a registry (``ModelConfig``
does) without importing model code, and nothing depends on import order.

Mixers. A mixer is any ``nn.Module`` mapping (B, T, C) -> (B, T, C). Register a builder
with the signature ``(config: ModelConfig, layer_idx: int) -> nn.Module``::

    from cofrgenet.models import ATTENTION

    @ATTENTION.register("my_attention")
    def build_my_attention(config, layer_idx):
        return MyAttention(config.n_embd, config.block_size)

then ``ModelConfig(attention="my_attention")`` uses it; the block never changes.
Keywords of a mixer's ``register`` (:class:`MixerEntry`):

* ``flops(config, layer_idx, seq_len) -> int``: forward FLOPs per token of one layer
  (for ``estimate_flops_per_token``); without it the estimate is 2 FLOPs per parameter.
* ``owns_dropout``: True when the module applies ``config.dropout`` to its own output
  (as GPT-2's attention and MLP do); otherwise the block applies it.
* ``relative_positions``: True when the module computes q.k logits and applies
  ``config.position`` "rope" / "alibi" to them. A model whose ``position`` is one of
  those must have at least one such layer (the others are position-aware by
  construction, e.g. CAttnM and the Dense Synthesizer read key positions).

Architectures. A builder ``(config) -> nn.Module`` whose module maps token ids (B, T) to
logits (B, T, vocab_size). Keywords of its ``register`` (:class:`ArchEntry`):

* ``defaults``: values for config fields left at None (e.g. "llama" fills
  ``norm="rmsnorm"``, ``position="rope"``, ``ffn="swiglu"``, ``bias=False``). A field
  given explicitly always wins; the defaults are applied when the config is made.
* ``flops(config, seq_len) -> dict[str, int]``: forward FLOPs per token by component.
* ``validate(config)``: raise ValueError for settings the architecture cannot take.
* ``kind``: "transformer" (blocks of attention and ffn mixers) or "recurrent".

The built-ins: ``transformer.py`` ("gpt", "llama"), ``recurrent.py`` ("rnn", "lstm",
"gru"), ``mixers.py`` (softmax, sparse, synthesizer, CAttnU, CAttnM; mlp, swiglu, cffn).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from torch import nn

from cofrgenet.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from cofrgenet.models.config import ModelConfig

Builder = Callable[["ModelConfig", int], nn.Module]
FlopsFn = Callable[["ModelConfig", int, int], int]
ArchBuilder = Callable[["ModelConfig"], nn.Module]
ArchFlops = Callable[["ModelConfig", int], dict[str, int]]
ArchValidate = Callable[["ModelConfig"], None]
#: Kinds of architecture, in the order ``arch_names`` lists them.
KINDS = ("transformer", "recurrent")


@dataclass(frozen=True)
class MixerEntry:
    """One registered mixer: its builder and what the model needs to know about it."""

    name: str
    builder: Builder
    flops: FlopsFn | None = None
    owns_dropout: bool = False
    relative_positions: bool = False
    #: splits the width into config.n_head heads (n_embd must divide by it)
    uses_heads: bool = False


@dataclass(frozen=True)
class ArchEntry:
    """One registered architecture."""

    name: str
    builder: ArchBuilder
    flops: ArchFlops
    kind: str = "transformer"
    defaults: dict[str, Any] = field(default_factory=dict)
    validate: ArchValidate | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"architecture kind must be one of {KINDS}, got {self.kind!r}")


E = TypeVar("E", MixerEntry, ArchEntry)


class Registry(Generic[E]):
    """Name -> entry (a :class:`MixerEntry` or an :class:`ArchEntry`).

    kind: what the names are ("attention mixer", "architecture"), for errors.
    entry_type: the entry class ``register``'s keywords fill.
    builtins: modules registering the built-in entries, imported at the first lookup.
    order: sort key of entries for :meth:`names` (stable: registration order within a key);
        None keeps registration order.
    """

    def __init__(
        self,
        kind: str,
        entry_type: type[E],
        builtins: tuple[str, ...] = (),
        order: Callable[[E], Any] | None = None,
    ) -> None:
        self.kind, self.entry_type, self.builtins, self.order = kind, entry_type, builtins, order
        self._entries: dict[str, E] = {}
        self._loaded = not builtins

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self.builtins:
                importlib.import_module(module)

    def register(self, name: str, *, replace: bool = False, **fields: Any) -> Callable:
        """Decorator registering a builder under ``name`` with the entry's ``fields``
        (ValueError if the name is taken, unless ``replace``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(builder: Callable) -> Callable:
            if name in self._entries and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered (pass replace=True)")
            self._entries[name] = self.entry_type(name, builder, **fields)
            return builder

        return decorator

    def unregister(self, name: str) -> None:
        """Remove ``name``; unknown names raise ValueError listing the registered ones."""
        self.entry(name)
        del self._entries[name]

    def entry(self, name: str) -> E:
        """The entry for ``name``; an unknown name raises ConfigError (a ValueError)
        listing the registered ones: a one-line error in every command."""
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}{did_you_mean(str(name), self.names())}; "
                f"registered: {', '.join(self.names())} (one of your own is registered by "
                "importing its module first: docs/architecture.md)"
            ) from None

    def build(self, name: str, *args: Any) -> nn.Module:
        """Build ``name``: a mixer from ``(config, layer_idx)``, an architecture from
        ``(config)``."""
        return self.entry(name).builder(*args)

    def names(self) -> list[str]:
        """Registered names, in registration order (or ``order``'s)."""
        self._load()
        if self.order is None:
            return list(self._entries)
        return sorted(self._entries, key=lambda name: self.order(self._entries[name]))

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"


_MIXERS = ("cofrgenet.models.mixers",)
ATTENTION: Registry[MixerEntry] = Registry("attention mixer", MixerEntry, _MIXERS)
FFN: Registry[MixerEntry] = Registry("ffn mixer", MixerEntry, _MIXERS)
ARCHITECTURES: Registry[ArchEntry] = Registry(
    "architecture",
    ArchEntry,
    ("cofrgenet.models.transformer", "cofrgenet.models.recurrent"),
    order=lambda entry: KINDS.index(entry.kind),  # transformers first, whatever was imported
)


def arch_names(kind: str | None = None) -> list[str]:
    """Architecture names of ``kind`` (default: every kind, transformers first)."""
    return [n for n in ARCHITECTURES.names() if kind is None or ARCHITECTURES.entry(n).kind == kind]

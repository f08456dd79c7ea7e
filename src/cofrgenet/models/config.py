"""ModelConfig: the plain, serialisable description of a decoder-only language model."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass
class ModelConfig:
    """Shape and mixer choice of a decoder-only transformer (GPT-2 style block).

    Every field is a plain Python value so a config round-trips through
    ``to_dict()``/``from_dict()`` (and JSON/YAML). Mixers are chosen by *name*; the
    names resolve through ``cofrgenet.models.registry.ATTENTION`` / ``FFN`` when the
    model is built, so new mixers need no change here or in the block.

    Shape:
        vocab_size, block_size (maximum sequence length), n_layer, n_embd, n_head.
    Mixers:
        attention: attention mixer name for every layer ("softmax", "cattn_u", "cattn_m").
        ffn: feed-forward mixer name for every layer ("mlp", "cffn").
        attention_pattern / ffn_pattern: optional per-layer names; when set they cycle
            over the layers (layer i uses ``pattern[i % len(pattern)]``) and override
            ``attention`` / ``ffn``.
        ffn_hidden: hidden width of the "mlp" ffn; None means 4 * n_embd.
    CoFrGeNet ladders (used by the ladder mixers only):
        ladders: L, number of ladders in an ensemble (Cffn, CAttnM).
        depth: d, number of partial denominators per ladder (linear term not counted).
        cffn_ladder: "scalar" (paper reading, p-variate ladders) or "elementwise".
        ladder_bias: biases on the partial denominators; None means "same as ``bias``".
        ladder_eps: clamp on the final continuant, |K_d| >= eps.
        ladder_grad: "paper" (Proposition 1) or "exact".
        ladder_impl: "auto", "literal", "continuant" or "compiled".
    Other:
        dropout: dropout on embeddings, attention probabilities and mixer outputs.
        bias: biases in Linear layers and LayerNorms (GPT-2: True).
        tie_embeddings: share the token embedding with the output head (GPT-2: True).
        norm_eps: LayerNorm epsilon.
    """

    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    attention: str = "softmax"
    ffn: str = "mlp"
    attention_pattern: list[str] | None = None
    ffn_pattern: list[str] | None = None
    ffn_hidden: int | None = None
    ladders: int = 3
    depth: int = 5
    cffn_ladder: str = "scalar"
    ladder_bias: bool | None = None
    ladder_eps: float = 0.01
    ladder_grad: str = "paper"
    ladder_impl: str = "auto"
    dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        # Patterns read from YAML/JSON may arrive as tuples: store lists (plain types).
        for name in ("attention_pattern", "ffn_pattern"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of mixer names, got {value!r}")
            if len(value) == 0:
                raise ValueError(f"{name} must not be empty (use None for 'no pattern')")
            setattr(self, name, list(value))
        for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "ladders", "depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.ffn_hidden is not None and (
            not isinstance(self.ffn_hidden, int) or self.ffn_hidden < 1
        ):
            raise ValueError(
                f"ffn_hidden must be a positive integer or None, got {self.ffn_hidden!r}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.cffn_ladder not in ("scalar", "elementwise"):
            raise ValueError(
                f"cffn_ladder must be 'scalar' or 'elementwise', got {self.cffn_ladder!r}"
            )

    # Per-layer choice -------------------------------------------------------------

    def attention_for(self, layer_idx: int) -> str:
        """Attention mixer name of layer ``layer_idx``."""
        if self.attention_pattern:
            return self.attention_pattern[layer_idx % len(self.attention_pattern)]
        return self.attention

    def ffn_for(self, layer_idx: int) -> str:
        """Feed-forward mixer name of layer ``layer_idx``."""
        if self.ffn_pattern:
            return self.ffn_pattern[layer_idx % len(self.ffn_pattern)]
        return self.ffn

    @property
    def effective_ladder_bias(self) -> bool:
        """``ladder_bias`` with None resolved to ``bias``."""
        return self.bias if self.ladder_bias is None else self.ladder_bias

    # Serialisation ----------------------------------------------------------------

    @classmethod
    def field_names(cls) -> list[str]:
        """The names a config dict may hold."""
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (lists copied), suitable for JSON/YAML."""
        return {
            name: list(value) if isinstance(value, list) else value
            for name, value in ((n, getattr(self, n)) for n in self.field_names())
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; an unknown key raises ValueError naming it."""
        _check_keys(data, "ModelConfig.from_dict")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (unknown names raise ValueError)."""
        _check_keys(changes, "ModelConfig.replace")
        return dataclasses.replace(self, **changes)

    # Presets ----------------------------------------------------------------------

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The named preset (see :func:`cofrgenet.models.list_presets`) with ``overrides``.

        Example: ``ModelConfig.from_preset("gpt2-small-f", depth=3, dropout=0.1)``.
        """
        from cofrgenet.models.presets import preset_dict

        _check_keys(overrides, f"ModelConfig.from_preset({name!r})")
        return cls.from_dict({**preset_dict(name), **overrides})


def _check_keys(data: dict[str, Any], where: str) -> None:
    valid = ModelConfig.field_names()
    unknown = [key for key in data if key not in valid]
    if unknown:
        raise ValueError(
            f"{where}: unknown config key(s) {unknown}; valid keys are: {', '.join(valid)}"
        )

"""Named model presets: GPT-2 shapes and their CoFrGeNet variants.

Base presets are GPT-2 shapes (tiny/mini for CPU tests). Each base ``B`` also gives:

* ``B-f``:  CoFrGeNet-F, the feed-forward network replaced by Cffn;
* ``B-a``:  CoFrGeNet-A, attention replaced by CAttnM (the paper's default for -A);
* ``B-fa``: CoFrGeNet, both replaced.

Ladder defaults for every preset: L = 3 ladders, depth d = 5, scalar Cffn ladders.
"""

from __future__ import annotations

from typing import Any

# Shared by every preset; a preset's own entries take precedence.
_COMMON: dict[str, Any] = {
    "bias": True,
    "tie_embeddings": True,
    "dropout": 0.0,
    "ladders": 3,
    "depth": 5,
    "cffn_ladder": "scalar",
}

_GPT2 = {"vocab_size": 50257, "block_size": 1024}

#: Base shapes (standard GPT-2 sizes, plus two CPU-sized ones).
BASES: dict[str, dict[str, Any]] = {
    "gpt2-tiny": {"vocab_size": 256, "block_size": 128, "n_layer": 2, "n_embd": 64, "n_head": 4},
    "gpt2-mini": {"vocab_size": 512, "block_size": 256, "n_layer": 4, "n_embd": 128, "n_head": 4},
    "gpt2-small": {**_GPT2, "n_layer": 12, "n_embd": 768, "n_head": 12},
    "gpt2-medium": {**_GPT2, "n_layer": 24, "n_embd": 1024, "n_head": 16},
    "gpt2-large": {**_GPT2, "n_layer": 36, "n_embd": 1280, "n_head": 20},
    "gpt2-xl": {**_GPT2, "n_layer": 48, "n_embd": 1600, "n_head": 25},
}

#: Variant suffix -> mixer choice.
VARIANTS: dict[str, dict[str, str]] = {
    "": {"attention": "softmax", "ffn": "mlp"},
    "-f": {"attention": "softmax", "ffn": "cffn"},
    "-a": {"attention": "cattn_m", "ffn": "mlp"},
    "-fa": {"attention": "cattn_m", "ffn": "cffn"},
}

PRESETS: dict[str, dict[str, Any]] = {
    base + suffix: {**_COMMON, **shape, **mixers}
    for base, shape in BASES.items()
    for suffix, mixers in VARIANTS.items()
}


def list_presets() -> list[str]:
    """Names accepted by ``ModelConfig.from_preset``, smallest base first."""
    return list(PRESETS)


def preset_dict(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s config fields; unknown names raise ValueError."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
    return dict(PRESETS[name])

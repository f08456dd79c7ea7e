"""The model variants the benchmarks compare, by name: a preset and ModelConfig overrides.

``cofr bench train`` times them and ``cofr bench quality`` trains them; one table, so that
a name means the same model in both reports (each bench rebuilds it at its own shape).
"""

from __future__ import annotations

from typing import Any

#: Variant name -> (preset, overrides).
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("gpt2-mini", {}),
    "cofrgenet-f": ("gpt2-mini-f", {}),
    "cofrgenet-f-elementwise": ("gpt2-mini-f", {"cffn_ladder": "elementwise"}),
    "cofrgenet-a": ("gpt2-mini-a", {}),
    "cofrgenet-a-u": ("gpt2-mini-a", {"attention": "cattn_u"}),
    "cofrgenet": ("gpt2-mini-fa", {}),
    "synthesizer-d": ("gpt2-mini", {"attention": "synthesizer_dense"}),
    "llama3": ("llama3-mini", {}),
    "lstm": ("lstm-mini", {}),
}


def model(name: str) -> tuple[str, dict[str, Any]]:
    """(preset, a copy of the overrides) of variant ``name``."""
    preset, overrides = MODELS[name]
    return preset, dict(overrides)

"""Which (architecture, attention, ffn, position) combinations ``build_model`` supports.

Derived from the registries, so a newly registered architecture or mixer shows up here,
in the docs table (``combinations_markdown``) and in the test that builds every row.
Rule: every transformer takes every attention and ffn mixer; RoPE and ALiBi need a
mixer that computes q.k logits (``relative_positions=True`` in its registration), the
other positions go with any mixer; recurrent architectures take no mixer and no
position encoding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ARCHITECTURES, ATTENTION, FFN, arch_names
from cofrgenet.nn.positional import POSITIONS, RELATIVE_POSITIONS


@dataclass(frozen=True)
class Combination:
    """One buildable choice; attention and ffn are None for recurrent architectures."""

    arch: str
    attention: str | None
    ffn: str | None
    position: str

    def config(self, **fields: Any) -> ModelConfig:
        """A ModelConfig with this combination and ``fields`` (shape etc.)."""
        mixers = {"attention": self.attention, "ffn": self.ffn} if self.attention else {}
        return ModelConfig(arch=self.arch, position=self.position, **mixers, **fields)


def positions_for(attention: str) -> tuple[str, ...]:
    """Position encodings a transformer whose every layer uses ``attention`` can take."""
    if ATTENTION.entry(attention).relative_positions:
        return POSITIONS
    return tuple(p for p in POSITIONS if p not in RELATIVE_POSITIONS)


def _rows() -> list[tuple[str, str | None, tuple[str, ...], tuple[str, ...]]]:
    """(arch, attention, ffns, positions): the compact form of the table."""
    rows = []
    for arch in arch_names():
        if ARCHITECTURES.entry(arch).kind == "recurrent":
            rows.append((arch, None, (), ("none",)))
            continue
        for attention in ATTENTION.names():
            rows.append((arch, attention, tuple(FFN.names()), positions_for(attention)))
    return rows


def supported_combinations() -> list[Combination]:
    """Every combination ``build_model`` supports (all layers using the same mixers)."""
    out = []
    for arch, attention, ffns, positions in _rows():
        for ffn in ffns or (None,):
            out.extend(Combination(arch, attention, ffn, position) for position in positions)
    return out


def unsupported_combinations() -> list[Combination]:
    """Transformer combinations ``build_model`` rejects: RoPE/ALiBi without q.k logits."""
    supported = set(supported_combinations())
    return [
        Combination(arch, attention, ffn, position)
        for arch in arch_names("transformer")
        for attention in ATTENTION.names()
        for ffn in FFN.names()
        for position in POSITIONS
        if Combination(arch, attention, ffn, position) not in supported
    ]


def combinations_markdown() -> str:
    """Markdown table: one row per (architecture, attention), every listed ffn and
    position combining freely within the row."""
    lines = ["| arch | attention | ffn | position |", "|---|---|---|---|"]
    for arch, attention, ffns, positions in _rows():
        lines.append(
            f"| {arch} | {attention or '-'} | {', '.join(ffns) or '-'} | {', '.join(positions)} |"
        )
    return "\n".join(lines)

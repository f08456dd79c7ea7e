"""Parameter counts by component and an analytic FLOPs-per-token estimate."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ATTENTION, FFN, Registry
from cofrgenet.models.transformer import build_model


@dataclass
class ParameterCount:
    """Parameters of a model by component (shared tensors counted once).

    ``ladder`` is the part of ``attention`` + ``ffn`` held by CoFrGeNet ladders (partial
    denominator weights and biases); ``head`` is 0 when the head is tied to ``wte``.
    ``total == embedding + head + attention + ffn + norm + other``.
    """

    embedding: int = 0
    head: int = 0
    attention: int = 0
    ffn: int = 0
    norm: int = 0
    other: int = 0
    ladder: int = 0
    total: int = 0
    per_layer: list[dict[str, int]] = field(default_factory=list)

    @property
    def non_embedding(self) -> int:
        """Total minus the embedding tables (wte, wpe); an untied head is kept."""
        return self.total - self.embedding

    def rows(self) -> list[tuple[str, int, float]]:
        """(component, parameters, fraction of total), in a fixed order."""
        names = ("embedding", "head", "attention", "ffn", "ladder", "norm", "other", "total")
        total = max(self.total, 1)
        return [(n, getattr(self, n), getattr(self, n) / total) for n in names]

    def table(self) -> str:
        """Plain-text table of :meth:`rows` (ladder is included in attention + ffn)."""
        lines = [f"{'component':<12}{'parameters':>16}{'share':>9}"]
        for name, count, share in self.rows():
            label = "  ladder" if name == "ladder" else name
            lines.append(f"{label:<12}{count:>16,}{share:>9.1%}")
        return "\n".join(lines)


def _ladder_param_ids(model: nn.Module) -> set[int]:
    """ids of parameters held by ladders: inside LadderWeights modules, or yielded by a
    module's ``ladder_parameters()``."""
    try:
        from cofrgenet.nn.ladder import LadderWeights
    except ImportError:
        LadderWeights = ()  # no ladder layers available
    ids: set[int] = set()
    for module in model.modules():
        if LadderWeights and isinstance(module, LadderWeights):
            ids.update(id(p) for p in module.parameters())
        ladder_parameters = getattr(module, "ladder_parameters", None)
        if callable(ladder_parameters):
            ids.update(id(p) for p in ladder_parameters())
    return ids


def count_parameters(model: nn.Module | ModelConfig) -> ParameterCount:
    """Count ``model``'s parameters by component.

    A ModelConfig is built on the meta device first (no memory used), so
    ``count_parameters(ModelConfig.from_preset("gpt2-xl"))`` is instant. The model is
    expected to use the GPT layout (``transformer.wte/wpe/h/ln_f``, ``lm_head``).
    """
    if isinstance(model, ModelConfig):
        with torch.device("meta"):
            model = build_model(model)
    ladder_ids = _ladder_param_ids(model)
    count = ParameterCount()
    layers: dict[int, dict[str, int]] = {}
    # named_parameters() yields a shared (tied) tensor once, under its first name (wte).
    for name, p in model.named_parameters():
        n = p.numel()
        parts = name.split(".")
        if parts[0] == "transformer" and parts[1] in ("wte", "wpe"):
            component = "embedding"
        elif parts[0] == "lm_head":
            component = "head"
        elif parts[0] == "transformer" and parts[1] == "h":
            component = {"attn": "attention", "mlp": "ffn"}.get(parts[3], "other")
            if parts[3].startswith("ln_"):
                component = "norm"
            layer = layers.setdefault(int(parts[2]), {"attention": 0, "ffn": 0, "ladder": 0})
            if component in layer:
                layer[component] += n
        elif parts[0] == "transformer" and parts[1] == "ln_f":
            component = "norm"
        else:
            component = "other"
        setattr(count, component, getattr(count, component) + n)
        if id(p) in ladder_ids:
            count.ladder += n
            if parts[:2] == ["transformer", "h"]:
                layers[int(parts[2])]["ladder"] += n
        count.total += n
    count.per_layer = [layers[i] for i in sorted(layers)]
    return count


@dataclass
class FlopsPerToken:
    """Analytic FLOPs per token at sequence length ``seq_len``.

    ``forward``: one forward pass; ``training = 3 * forward`` (backward ~ 2x forward).
    ``breakdown``: forward FLOPs of "attention", "ffn" (all layers) and "lm_head".
    """

    forward: int
    training: int
    seq_len: int
    breakdown: dict[str, int]


def _mixer_flops(registry: Registry, name: str, config: ModelConfig, layer: int, T: int) -> int:
    entry = registry.entry(name)
    if entry.flops is not None:
        return int(entry.flops(config, layer, T))
    # No formula registered: 2 FLOPs per parameter (every weight used once per token).
    with torch.device("meta"):
        module = entry.builder(config, layer)
    return 2 * sum(p.numel() for p in module.parameters())


def estimate_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopsPerToken:
    """Forward and training FLOPs per token of the model ``config`` describes.

    A matmul costs 2 FLOPs per multiply-add; attention scores/values use the full
    sequence length T (as nanoGPT / PaLM, i.e. no credit for causal masking);
    embeddings, norms, activations and softmax are not counted. Ladder mixers add
    3 d + 1 FLOPs per ladder unit for the continuant. Formulas: docs/models.md.
    """
    T = config.block_size if seq_len is None else int(seq_len)
    if T < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    attention = sum(
        _mixer_flops(ATTENTION, config.attention_for(i), config, i, T)
        for i in range(config.n_layer)
    )
    ffn = sum(_mixer_flops(FFN, config.ffn_for(i), config, i, T) for i in range(config.n_layer))
    lm_head = 2 * config.n_embd * config.vocab_size
    forward = attention + ffn + lm_head
    breakdown = {"attention": attention, "ffn": ffn, "lm_head": lm_head}
    return FlopsPerToken(forward=forward, training=3 * forward, seq_len=T, breakdown=breakdown)


def presets_markdown(names: list[str] | None = None) -> str:
    """Markdown table of presets: shape, mixers, parameter counts and training FLOPs/token.

    Models are built on the meta device, so this is quick even for gpt2-xl.
    """
    from cofrgenet.models.presets import list_presets

    header = (
        "| preset | n_layer | n_embd | n_head | attention | ffn | params | non-embedding "
        "| ladder | train GFLOP/token |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for name in list_presets() if names is None else names:
        config = ModelConfig.from_preset(name)
        counts = count_parameters(config)
        flops = estimate_flops_per_token(config)
        lines.append(
            f"| {name} | {config.n_layer} | {config.n_embd} | {config.n_head} "
            f"| {config.attention} | {config.ffn} | {counts.total:,} | {counts.non_embedding:,} "
            f"| {counts.ladder:,} | {flops.training / 1e9:.4g} |"
        )
    return "\n".join(lines)

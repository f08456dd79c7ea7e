"""Parameter counts by component and an analytic FLOPs-per-token estimate."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from cofrgenet.models.build import build_shapes
from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ARCHITECTURES


@dataclass
class ParameterCount:
    """Parameters of a model by component (shared tensors counted once).

    ``ladder`` is the part of ``attention`` + ``ffn`` held by CoFrGeNet ladders (partial
    denominator weights and biases); ``head`` is 0 when the head is tied to ``wte``;
    ``recurrent`` is the RNN/LSTM/GRU stack of recurrent models.
    ``total == embedding + head + attention + ffn + recurrent + norm + other``.
    """

    embedding: int = 0
    head: int = 0
    attention: int = 0
    ffn: int = 0
    recurrent: int = 0
    norm: int = 0
    other: int = 0
    ladder: int = 0
    total: int = 0
    per_layer: list[dict[str, int]] = field(default_factory=list)

    @property
    def non_embedding(self) -> int:
        """Total minus the embedding tables (token and learned position); an untied head is kept."""
        return self.total - self.embedding

    def rows(self) -> list[tuple[str, int, float]]:
        """(component, parameters, fraction of total), in a fixed order."""
        names = (
            "embedding",
            "head",
            "attention",
            "ffn",
            "ladder",
            "recurrent",
            "norm",
            "other",
            "total",
        )
        total = max(self.total, 1)
        return [(n, getattr(self, n), getattr(self, n) / total) for n in names]

    def table(self) -> str:
        """Plain-text table of :meth:`rows`; the ladders' parameters, which attention and
        ffn hold both, are a line of their own under the total."""
        lines = [f"{'component':<12}{'parameters':>16}{'share':>9}"]
        ladder = ""
        for name, count, share in self.rows():
            line = f"{name:<12}{count:>16,}{share:>9.1%}"
            if name == "ladder":
                ladder = line + "  (of attention + ffn above)"
            else:
                lines.append(line)
        return "\n".join([*lines, ladder])


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
    ``count_parameters(ModelConfig.from_preset("llama3.2-3b"))`` is instant. The model
    says which component each parameter belongs to through its
    ``parameter_component(name) -> (component, layer or None)`` (GPT, RecurrentLM);
    without it everything counts as "other". ``per_layer`` has one dict per layer with
    the model's ``LAYER_COMPONENTS`` and "ladder".
    """
    if isinstance(model, ModelConfig):
        model = build_shapes(model)
    ladder_ids = _ladder_param_ids(model)
    component_of = getattr(model, "parameter_component", lambda name: ("other", None))
    layer_keys = (*getattr(model, "LAYER_COMPONENTS", ()), "ladder")
    count = ParameterCount()
    layers: dict[int, dict[str, int]] = {}
    # named_parameters() yields a shared (tied) tensor once, under its first name (wte).
    for name, p in model.named_parameters():
        n = p.numel()
        component, layer = component_of(name)
        ladder = n if id(p) in ladder_ids else 0
        setattr(count, component, getattr(count, component) + n)
        count.ladder += ladder
        count.total += n
        if layer is not None:
            per_layer = layers.setdefault(layer, dict.fromkeys(layer_keys, 0))
            if component in per_layer:
                per_layer[component] += n
            per_layer["ladder"] += ladder
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


def estimate_flops_per_token(config: ModelConfig, seq_len: int | None = None) -> FlopsPerToken:
    """Forward and training FLOPs per token of the model ``config`` describes.

    A matmul costs 2 FLOPs per multiply-add; attention scores/values use the full
    sequence length T (as nanoGPT / PaLM, i.e. no credit for causal or sparse masking);
    embeddings, norms, activations, position encodings and softmax are not counted.
    Ladder mixers add 3 d + 1 FLOPs per ladder unit for the continuant. The breakdown
    comes from the architecture (transformers: attention, ffn, lm_head; recurrent
    models: recurrent, lm_head). Formulas: docs/models.md.
    """
    T = config.block_size if seq_len is None else int(seq_len)
    if T < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len!r}")
    breakdown = ARCHITECTURES.entry(config.arch).flops(config, T)
    forward = sum(breakdown.values())
    return FlopsPerToken(forward=forward, training=3 * forward, seq_len=T, breakdown=breakdown)


def presets_markdown(names: list[str] | None = None) -> str:
    """Markdown table of presets: shape, mixers, parameter counts and training FLOPs/token.

    Models are built on the meta device, so this is quick even for gpt2-xl.
    """
    from cofrgenet.models.presets import list_presets

    header = (
        "| preset | arch | n_layer | n_embd | heads | attention | ffn | position | params "
        "| without ladder biases | non-embedding | ladder | train GFLOP/token |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [header]
    for name in list_presets() if names is None else names:
        config = ModelConfig.from_preset(name)
        counts = count_parameters(config)
        unbiased = count_parameters(config.replace(ladder_bias=False)).total
        flops = estimate_flops_per_token(config)
        lines.append(
            f"| {name} | {config.arch} | {config.n_layer} | {config.n_embd} "
            f"| {heads_label(config)} | {config.attention or '-'} | {config.ffn or '-'} "
            f"| {config.position} | {counts.total:,} | {unbiased:,} | {counts.non_embedding:,} "
            f"| {counts.ladder:,} | {flops.training / 1e9:.4g} |"
        )
    return "\n".join(lines)


def heads_label(config: ModelConfig) -> str:
    """ "12", "32/8" (query/key-value heads under GQA), or "-" for recurrent models."""
    if ARCHITECTURES.entry(config.arch).kind != "transformer":
        return "-"
    if config.kv_heads != config.n_head:
        return f"{config.n_head}/{config.kv_heads}"
    return str(config.n_head)

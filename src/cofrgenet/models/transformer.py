"""Decoder-only transformer with pluggable mixers (pre-norm blocks, nanoGPT layout).

One class serves the "gpt" and "llama" architectures: they differ only in the
components their configs name (norm, position encoding, ffn, biases, heads), which is
what their ``ARCHITECTURES`` defaults fill in. Parameter names follow GPT-2 / nanoGPT
(``transformer.wte``, ``transformer.h.0.attn``, ``transformer.h.0.mlp``, ``lm_head``)
whatever the components, so GPT-2 checkpoints map onto the softmax/mlp model and state
dicts of variants line up layer by layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from cofrgenet.errors import ConfigError
from cofrgenet.models.config import ModelConfig, unused_settings
from cofrgenet.models.generation import DecodeCache, generate_cached
from cofrgenet.models.mixers import mixer_flops, residual_std
from cofrgenet.models.registry import ARCHITECTURES, ATTENTION, FFN
from cofrgenet.nn.decoding import TokenSink
from cofrgenet.nn.ladder import LadderLayer, recording_paused
from cofrgenet.nn.norms import build_norm
from cofrgenet.nn.positional import RELATIVE_POSITIONS, SinusoidalPositions
from cofrgenet.nn.sparse_attention import default_stride


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).

    ``attn`` and ``mlp`` are whatever the registries build for this layer's names;
    ``mlp`` is the feed-forward slot (a SwiGLU in Llama, a Cffn in CoFrGeNet-F), named as
    in GPT-2. ``ln_1`` / ``ln_2`` are LayerNorms or RMSNorms (``config.norm``).
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attention_name = config.attention_for(layer_idx)
        self.ffn_name = config.ffn_for(layer_idx)
        attn_entry = ATTENTION.entry(self.attention_name)
        ffn_entry = FFN.entry(self.ffn_name)
        self.ln_1 = build_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.attn = attn_entry.builder(config, layer_idx)
        self.ln_2 = build_norm(config.norm, config.n_embd, config.norm_eps, config.bias)
        self.mlp = ffn_entry.builder(config, layer_idx)
        # Residual dropout for mixers that do not apply it themselves (no parameters, so
        # state dicts do not depend on it).
        self.attn_dropout = nn.Dropout(0.0 if attn_entry.owns_dropout else config.dropout)
        self.mlp_dropout = nn.Dropout(0.0 if ffn_entry.owns_dropout else config.dropout)
        #: Activation checkpointing (:meth:`GPT.recompute_blocks`): a run-time choice, not
        #: part of the config, so checkpoints do not depend on it.
        self.recompute = False
        self._replaying = False

    def forward(self, x: Tensor, state: dict[str, Any] | None = None, start: int = 0) -> Tensor:
        """x: (B, T, C) -> (B, T, C). With ``state`` (eval only), x holds positions
        start.. and the attention mixer decodes incrementally (``cofrgenet.nn.decoding``).
        With ``recompute`` on, a training forward keeps only x for backward and runs
        again there (activation checkpointing; the random state of dropout is replayed,
        the ladders' output ranges and health are recorded by the first run only)."""
        if self.recompute and state is None and self.training and torch.is_grad_enabled():
            self._replaying = False  # the first run, inside checkpoint(); then the replay
            out = checkpoint(self._checkpointed, x, start, use_reentrant=False)
            self._replaying = True
            return out
        return self._forward(x, state, start)

    def _checkpointed(self, x: Tensor, start: int) -> Tensor:
        if not self._replaying:
            return self._forward(x, None, start)
        with recording_paused(self):
            return self._forward(x, None, start)

    def _forward(self, x: Tensor, state: dict[str, Any] | None, start: int) -> Tensor:
        h = self.ln_1(x)
        mixed = self.attn(h) if state is None else self.attn.decode(h, state, start)
        x = x + (self.attn_dropout(mixed) if self.training else mixed)
        mixed = self.mlp(self.ln_2(x))
        # Dropout is the identity in eval: skipping the call saves ~2 us a token per module.
        return x + (self.mlp_dropout(mixed) if self.training else mixed)

    @property
    def can_decode(self) -> bool:
        return hasattr(self.attn, "decode")

    def extra_repr(self) -> str:
        return (
            f"layer_idx={self.layer_idx}, attention={self.attention_name!r}, ffn={self.ffn_name!r}"
        )


class GPT(nn.Module):
    """Decoder-only transformer language model (the "gpt" and "llama" architectures).

    Token embeddings (+ learned or sinusoidal positions when ``config.position`` is
    absolute), ``n_layer`` pre-norm blocks, a final norm and a linear head (tied to the
    token embedding when ``tie_embeddings``). RoPE and ALiBi live inside the attention
    mixers that compute q.k logits.

    ``forward(idx)`` maps token ids (B, T), T <= block_size, to logits (B, T, vocab_size).
    """

    #: Per-layer components of ``count_parameters(...).per_layer``.
    LAYER_COMPONENTS = ("attention", "ffn")

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        _check_transformer_config(config)
        self.config = config
        C = config.n_embd
        modules: dict[str, nn.Module] = {"wte": nn.Embedding(config.vocab_size, C)}
        if config.position == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, C)
        elif config.position == "sinusoidal":
            modules["wpe"] = SinusoidalPositions(C)
        modules["drop"] = nn.Dropout(config.dropout)
        modules["h"] = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        modules["ln_f"] = build_norm(config.norm, C, config.norm_eps, config.bias)
        self.transformer = nn.ModuleDict(modules)
        # The original transformer scales token embeddings by sqrt(C) before adding its
        # unit-amplitude sinusoids (Vaswani et al. 2017, section 3.4); with N(0, 0.02)
        # embeddings the table would otherwise drown the tokens.
        self.embedding_scale = math.sqrt(C) if config.position == "sinusoidal" else 1.0
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """nanoGPT initialisation of the baseline parts.

        Linear and Embedding weights ~ N(0, 0.02), biases 0, norms reset; output
        projections named ``c_proj`` get std 0.02 / sqrt(2 n_layer) (GPT-2's scaled
        residual init). CoFrGeNet layers (and any module with ``self_initialising =
        True``) keep the initialisation of their own ``reset_parameters``.
        """
        if self.lm_head.weight.is_meta:  # shapes only: nothing to initialise
            return
        proj_std = residual_std(self.config)
        for name, module in _modules_to_init(self):
            if isinstance(module, nn.Linear):
                std = proj_std if name.endswith("c_proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()

    def forward(self, idx: Tensor, cache: DecodeCache | None = None) -> Tensor:
        """idx: (B, T) int64 token ids, T <= block_size -> logits (B, T, vocab_size).

        With a :class:`~cofrgenet.models.generation.DecodeCache` (eval mode), idx holds the
        tokens after the ``cache.length`` already seen, and the cache is extended by them.
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        start = 0 if cache is None else cache.length
        seq_len = start + idx.shape[1]
        if seq_len > self.config.block_size:
            raise ValueError(
                f"sequence length {seq_len} exceeds block_size {self.config.block_size}: "
                "the model was built for at most block_size positions"
            )
        x = self.transformer.wte(idx)  # (B, T, C)
        wpe = getattr(self.transformer, "wpe", None)
        if isinstance(wpe, nn.Embedding):  # rows start..seq_len: a slice, no lookup
            x = x + wpe.weight[start:seq_len].to(x.dtype)  # + (T, C)
        elif wpe is not None:
            pos = torch.arange(start, seq_len, device=idx.device)
            x = x * self.embedding_scale + wpe(pos).to(x.dtype)  # + (T, C)
        if self.training:
            x = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            x = block(x) if cache is None else block(x, cache.layers[i], start)
        if cache is not None:
            cache.length = seq_len
        return self.lm_head(self.transformer.ln_f(x))

    def recompute_blocks(self, on: bool = True) -> None:
        """Activation checkpointing: each block keeps only its input for backward and
        recomputes the rest there (about one more forward of compute per step, for the
        activation memory of one block instead of ``n_layer``)."""
        for block in self.modules():  # the blocks themselves, whatever wraps them (FSDP)
            if isinstance(block, Block):
                block.recompute = on

    @property
    def can_decode(self) -> bool:
        """Whether every attention mixer decodes incrementally (``cofrgenet.nn.decoding``)."""
        return all(block.can_decode for block in self.transformer.h)

    def new_cache(self) -> DecodeCache:
        return DecodeCache([{} for _ in self.transformer.h])

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        top_p: float | None = None,
        vocab: int | None = None,
        stop_id: int | None = None,
        context: int | None = None,
        on_token: TokenSink | None = None,
    ) -> Tensor:
        """Extend idx (B, T) by up to ``max_new_tokens`` sampled tokens -> (B, T + new).

        temperature 0 is greedy; otherwise the ``top_k`` likeliest ids, then the smallest
        set of them holding ``top_p`` of the probability (nucleus sampling), among the
        first ``vocab`` ids (the tokenizer's; default all). Sampling ends early once every
        row has produced ``stop_id``. The prompt is read once, then one token per step
        through the mixers' caches; once a sequence outgrows ``context`` (default: the
        block size), every step reads the last ``context`` tokens again (positions restart
        with the window, as in full recomputation). The tokens are those of recomputing
        the whole context at every step (eval mode). ``on_token(ids)`` gets each step's
        ids (B, 1).
        """
        return generate_cached(
            self, idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id,
            context, on_token,
        )  # fmt: skip

    @staticmethod
    def parameter_component(name: str) -> tuple[str, int | None]:
        """(component, layer index or None) of parameter ``name``, for ``count_parameters``."""
        parts = name.split(".")
        if parts[0] == "lm_head":
            return "head", None
        if parts[0] != "transformer":
            return "other", None
        if parts[1] in ("wte", "wpe"):
            return "embedding", None
        if parts[1] == "ln_f":
            return "norm", None
        if parts[1] == "h":
            layer, sub = int(parts[2]), parts[3]
            if sub.startswith("ln_"):
                return "norm", layer
            return {"attn": "attention", "mlp": "ffn"}.get(sub, "other"), layer
        return "other", None


def _check_transformer_config(config: ModelConfig) -> None:
    """Component names are resolved, the width splits into heads where a mixer uses them,
    and RoPE/ALiBi have a layer that can apply them (run when the config is made, and
    again by ``GPT`` for configs changed since)."""
    for name in ("attention", "ffn", "norm", "position", "bias", "tie_embeddings"):
        if getattr(config, name) is None:
            raise ValueError(f"a transformer needs config.{name} (arch {config.arch!r})")
    if unused_settings(config.to_dict()):  # rnn_hidden
        raise ConfigError(
            f"rnn_hidden={config.rnn_hidden!r} is the width of a recurrent model's layers; "
            f"arch {config.arch!r} has none (leave it out, or use arch rnn, lstm or gru)"
        )
    for ffn in {config.ffn_for(i) for i in range(config.n_layer)}:
        FFN.entry(ffn)  # a typo fails here, when the config is made, not at build time
    names = config.attention_names()
    with_heads = sorted(n for n in names if ATTENTION.entry(n).uses_heads)
    if with_heads and config.n_embd % config.n_head:
        raise ConfigError(
            f"n_embd ({config.n_embd}) must be a multiple of n_head ({config.n_head}): "
            f"{', '.join(with_heads)} attention splits the width into n_head heads"
        )
    if config.position == "rope" and with_heads and (config.n_embd // config.n_head) % 2:
        raise ConfigError(
            f"position='rope' rotates pairs of a head's dimensions: n_embd / n_head = "
            f"{config.n_embd} / {config.n_head} = {config.n_embd // config.n_head} must be even"
        )
    if "sparse_fixed" in names and config.sparse_summary is not None:
        stride = config.sparse_stride or default_stride(config.block_size)
        if config.sparse_summary > stride:  # the pattern's c summary columns of l
            given = "sparse_stride" if config.sparse_stride else "round(sqrt(block_size))"
            raise ConfigError(
                f"sparse_summary ({config.sparse_summary}) must be <= the sparse stride "
                f"({stride}, {given}): the fixed pattern's summary columns are the last "
                "sparse_summary of each block of sparse_stride; lower it, or raise sparse_stride"
            )
    if config.position in RELATIVE_POSITIONS and not any(
        ATTENTION.entry(n).relative_positions for n in names
    ):
        able = [n for n in ATTENTION.names() if ATTENTION.entry(n).relative_positions]
        raise ConfigError(
            f"position={config.position!r} acts on q.k logits, but none of this model's "
            f"attention mixers {sorted(names)} computes them (those that do: "
            f"{', '.join(able)}); use position 'learned', 'sinusoidal' or 'none'"
        )


def transformer_flops(config: ModelConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token: attention and ffn mixers of every layer, and the head."""
    layers = range(config.n_layer)
    return {
        "attention": sum(
            mixer_flops(ATTENTION, config.attention_for(i), config, i, seq_len) for i in layers
        ),
        "ffn": sum(mixer_flops(FFN, config.ffn_for(i), config, i, seq_len) for i in layers),
        "lm_head": 2 * config.n_embd * config.vocab_size,
    }


# GPT-2: LayerNorm, learned positions, GELU MLP, biases, tied head.
ARCHITECTURES.register(
    "gpt",
    flops=transformer_flops,
    defaults={
        "attention": "softmax",
        "ffn": "mlp",
        "norm": "layernorm",
        "position": "learned",
        "bias": True,
        "tie_embeddings": True,
    },
    validate=_check_transformer_config,
)(GPT)
# Llama 3: RMSNorm, RoPE, SwiGLU, no biases, untied head (Llama 3.2 1B/3B tie it: presets).
ARCHITECTURES.register(
    "llama",
    flops=transformer_flops,
    defaults={
        "attention": "softmax",
        "ffn": "swiglu",
        "norm": "rmsnorm",
        "position": "rope",
        "bias": False,
        "tie_embeddings": False,
    },
    validate=_check_transformer_config,
)(GPT)


def self_initialising_types() -> tuple[type[nn.Module], ...]:
    """Module types whose parameters the model's init must leave alone (CoFrGeNet layers,
    which take the residual std from their builders)."""
    return (LadderLayer,)


def _modules_to_init(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every module outside self-initialising subtrees."""
    skip = self_initialising_types()

    def walk(prefix: str, module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
        if isinstance(module, skip) or getattr(module, "self_initialising", False):
            return
        yield prefix, module
        for child_name, child in module.named_children():
            yield from walk(f"{prefix}.{child_name}" if prefix else child_name, child)

    yield from walk("", model)

"""Decoder-only transformer with pluggable mixers (GPT-2 block, nanoGPT layout).

Parameter names follow GPT-2 / nanoGPT (``transformer.wte``, ``transformer.h.0.attn``,
``transformer.h.0.mlp``, ``lm_head``) whatever mixers a layer uses, so GPT-2 checkpoints
map onto the softmax/mlp model and state dicts of variants line up layer by layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from cofrgenet.models.config import ModelConfig
from cofrgenet.models.registry import ATTENTION, FFN


class Block(nn.Module):
    """Pre-LayerNorm residual block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).

    ``attn`` and ``mlp`` are whatever the registries build for this layer's names;
    ``mlp`` is the feed-forward slot (a Cffn in CoFrGeNet-F), named as in GPT-2.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.attention_name = config.attention_for(layer_idx)
        self.ffn_name = config.ffn_for(layer_idx)
        attn_entry = ATTENTION.entry(self.attention_name)
        ffn_entry = FFN.entry(self.ffn_name)
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.attn = attn_entry.builder(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.mlp = ffn_entry.builder(config, layer_idx)
        # Residual dropout for mixers that do not apply it themselves (no parameters, so
        # state dicts do not depend on it).
        self.attn_dropout = nn.Dropout(0.0 if attn_entry.owns_dropout else config.dropout)
        self.mlp_dropout = nn.Dropout(0.0 if ffn_entry.owns_dropout else config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, C) -> (B, T, C)."""
        x = x + self.attn_dropout(self.attn(self.ln_1(x)))
        x = x + self.mlp_dropout(self.mlp(self.ln_2(x)))
        return x

    def extra_repr(self) -> str:
        return (
            f"layer_idx={self.layer_idx}, attention={self.attention_name!r}, ffn={self.ffn_name!r}"
        )


class GPT(nn.Module):
    """GPT-2 style language model: token + learned position embeddings, ``n_layer``
    blocks, a final LayerNorm and a linear head (tied to the token embedding by default).

    ``forward(idx)`` maps token ids (B, T), T <= block_size, to logits (B, T, vocab_size).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, C),
                "wpe": nn.Embedding(config.block_size, C),
                "drop": nn.Dropout(config.dropout),
                "h": nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                "ln_f": nn.LayerNorm(C, eps=config.norm_eps, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """nanoGPT initialisation of the baseline parts.

        Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorms reset; output
        projections named ``c_proj`` get std 0.02 / sqrt(2 n_layer) (GPT-2's scaled
        residual init). CoFrGeNet layers (and any module with ``self_initialising =
        True``) keep the initialisation of their own ``reset_parameters``.
        """
        if self.lm_head.weight.is_meta:  # shapes only: nothing to initialise
            return
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, module in _modules_to_init(self):
            if isinstance(module, nn.Linear):
                std = proj_std if name.endswith("c_proj") else 0.02
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()

    def forward(self, idx: Tensor) -> Tensor:
        """idx: (B, T) int64 token ids, T <= block_size -> logits (B, T, vocab_size)."""
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        seq_len = idx.shape[1]
        if seq_len > self.config.block_size:
            raise ValueError(
                f"sequence length {seq_len} exceeds block_size {self.config.block_size}: "
                "the model was built for at most block_size positions"
            )
        pos = torch.arange(seq_len, device=idx.device)
        # (B, T, C) + (T, C)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build_model(config: ModelConfig) -> GPT:
    """Build the model ``config`` describes (on the current default device; works on meta)."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"build_model expects a ModelConfig, got {type(config).__name__}")
    return GPT(config)


def self_initialising_types() -> tuple[type[nn.Module], ...]:
    """Module types whose parameters the model's init must leave alone (CoFrGeNet layers)."""
    try:
        from cofrgenet.nn import CAttnM, CAttnU, Cffn
    except ImportError:  # ladder layers not available: nothing to skip
        return ()
    return (Cffn, CAttnU, CAttnM)


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

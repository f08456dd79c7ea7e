"""Token generation with the mixers' incremental decoding (``cofrgenet.nn.decoding``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from cofrgenet.nn.decoding import sample_tokens
from cofrgenet.nn.ladder import reusing_stacked_weights


@dataclass
class DecodeCache:
    """What a transformer has seen: one state dict per layer and the tokens so far."""

    layers: list[dict[str, Any]] = field(default_factory=list)
    length: int = 0

    def select_rows(self, index: Tensor) -> None:
        """Keep only rows ``index`` (1-D ids) of the batch: every cached tensor is
        batch-first (``cofrgenet.nn.decoding``)."""
        for layer in self.layers:
            for key, value in layer.items():
                if isinstance(value, Tensor):
                    layer[key] = value.index_select(0, index)


def _full_context_logits(model: Any, idx: Tensor, block: int) -> Tensor:
    return model(idx[:, -block:])[:, -1, :]


def generate_cached(
    model: Any,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
    vocab: int | None = None,
    stop_id: int | None = None,
) -> Tensor:
    """Sample up to ``max_new_tokens`` after idx (B, T) from a transformer -> (B, T + new).

    Sampling as :func:`~cofrgenet.nn.decoding.sample_next` (temperature, top-k, then
    nucleus top-p, among the first ``vocab`` ids); it ends early once every row has
    produced ``stop_id``.

    ``model`` has ``config.block_size``, ``new_cache()``, ``forward(idx, cache)`` and
    ``can_decode``; a model whose mixers cannot decode, or a model in training mode
    (dropout), recomputes the whole context at every step instead.
    """
    if max_new_tokens <= 0:
        return idx
    # inference_mode, not no_grad: ~10% less per-op overhead in one-token steps. The
    # result is copied out of it, so the ids can feed a training step later.
    with torch.inference_mode(), reusing_stacked_weights():
        out = _sample_tokens(
            model, idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id
        )
    return out.clone()


def _sample_tokens(
    model: Any,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
    top_p: float | None,
    vocab: int | None = None,
    stop_id: int | None = None,
) -> Tensor:
    block = model.config.block_size
    cached = model.can_decode and not model.training
    cache: DecodeCache | None = None

    def logits_after(out: Tensor, new: Tensor) -> Tensor:
        nonlocal cache
        if not cached or out.shape[1] > block:
            return _full_context_logits(model, out, block)
        if cache is None:  # new is the prompt
            cache = model.new_cache()
        return model(new, cache)[:, -1, :]

    return sample_tokens(
        logits_after, idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id
    )

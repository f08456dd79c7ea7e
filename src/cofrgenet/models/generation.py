"""Token generation with the mixers' incremental decoding (``cofrgenet.nn.decoding``):
:func:`generate_cached` samples a fixed number of tokens (``cofr generate``),
:func:`decode_until` continues each row until its own stop (the evaluation harness's
``generate_until``), recurrent models included."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from cofrgenet.nn.decoding import TokenSink, check_prompt, sample_tokens
from cofrgenet.nn.ladder import recording_paused, reusing_stacked_weights


def is_recurrent(model: Any) -> bool:
    """Whether ``model`` is a recurrent LM: it has ``step`` (prompt ``(B, T)`` -> logits
    and a hidden state), reads any length, and has no positions."""
    return callable(getattr(model, "step", None))


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
    context: int | None = None,
    on_token: TokenSink | None = None,
) -> Tensor:
    """Sample up to ``max_new_tokens`` after idx (B, T) from a transformer -> (B, T + new).

    Sampling as :func:`~cofrgenet.nn.decoding.sample_next` (temperature, top-k, then
    nucleus top-p, among the first ``vocab`` ids); it ends early once every row has
    produced ``stop_id``. Once a sequence outgrows ``context`` tokens (default and at
    most ``config.block_size``; shorter for a model trained on shorter sequences), each
    step reads the last ``context`` again. ``on_token(ids)`` gets each step's ids (B, 1).

    ``model`` has ``config.block_size``, ``new_cache()``, ``forward(idx, cache)`` and
    ``can_decode``; a model whose mixers cannot decode, or a model in training mode
    (dropout), recomputes the whole context at every step instead.
    """
    check_prompt(idx)
    block = model.config.block_size
    if context is not None and not 1 <= context <= block:
        raise ValueError(f"context must be in [1, block_size={block}], got {context}")
    if max_new_tokens <= 0:
        return idx
    # inference_mode, not no_grad: ~10% less per-op overhead in one-token steps. The
    # result is copied out of it, so the ids can feed a training step later.
    # Sampling is no training: a model left in train mode keeps its ladders' ranges.
    with torch.inference_mode(), reusing_stacked_weights(), recording_paused(model):
        out = _sample_tokens(
            model,
            idx,
            max_new_tokens,
            temperature,
            top_k,
            generator,
            top_p,
            vocab,
            stop_id,
            block if context is None else context,
            on_token,
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
    vocab: int | None,
    stop_id: int | None,
    context: int,
    on_token: TokenSink | None,
) -> Tensor:
    cached = model.can_decode and not model.training
    cache: DecodeCache | None = None

    def logits_after(out: Tensor, new: Tensor) -> Tensor:
        nonlocal cache
        if not cached or out.shape[1] > context:
            return _full_context_logits(model, out, context)
        if cache is None:  # new is the prompt
            cache = model.new_cache()
        return model(new, cache)[:, -1, :]

    return sample_tokens(
        logits_after, idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id,
        on_token,
    )  # fmt: skip


def decode_until(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    max_length: int,
    choose: Callable[[Tensor], Tensor],
    stopped: Callable[[list[int]], bool],
) -> list[list[int]]:
    """New token ids of each row of ``idx`` (B, T): ``choose`` picks each next token from
    the last logits, until ``stopped(new ids)`` or ``max_new_tokens``.

    Recurrent models (with ``step``) read the prompt once and carry their hidden state.
    Transformers whose mixers decode incrementally (``can_decode``, eval mode) read it
    once into a decode cache while the context fits in ``max_length``, then re-read the
    last ``max_length`` ids each step, as any other model does. Finished rows leave the
    batch, with their rows of the state or cache.
    """
    if max_new_tokens <= 0:
        return [[] for _ in range(idx.shape[0])]
    # Without it, every cache write would join one autograd graph, growing each step.
    with torch.inference_mode(), reusing_stacked_weights(), recording_paused(model):
        rows = list(range(idx.shape[0]))  # original row of each active row
        new: list[list[int]] = [[] for _ in rows]
        recurrent = is_recurrent(model)
        state: Any = None
        cache: Any = None
        if recurrent:
            logits, state = model.step(idx)
        elif (
            getattr(model, "can_decode", False)
            and not model.training
            and idx.shape[1] <= max_length
        ):
            cache = model.new_cache()
            logits = model(idx, cache)
        else:
            logits = model(idx[:, -max_length:])
        for i in range(max_new_tokens):
            next_ids = choose(logits[:, -1, :])  # (B, 1)
            keep = []
            for r, token in enumerate(next_ids[:, 0].tolist()):
                new[rows[r]].append(token)
                if not stopped(new[rows[r]]):
                    keep.append(r)
            if not keep or i + 1 == max_new_tokens:
                break
            if len(keep) < len(rows):  # drop finished rows from the batch
                rows = [rows[r] for r in keep]
                index = torch.tensor(keep, device=idx.device)
                idx, next_ids = idx[index], next_ids[index]
                if recurrent:
                    state = _select_rows(state, index)
                elif cache is not None:
                    cache.select_rows(index)
            idx = torch.cat([idx, next_ids], dim=1)
            if recurrent:
                logits, state = model.step(next_ids, state)
            elif cache is not None and idx.shape[1] <= max_length:
                logits = model(next_ids, cache)
            else:  # past max_length the window slides: recompute it
                cache = None
                logits = model(idx[:, -max_length:])
        return new


def _select_rows(state: Any, index: Tensor) -> Any:
    """Rows ``index`` of a recurrent state: h (layers, B, H) or an LSTM's (h, c)."""
    if isinstance(state, tuple):
        return tuple(s[:, index] for s in state)
    return state[:, index]

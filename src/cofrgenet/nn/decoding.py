"""Incremental decoding: the protocol mixers follow, and the sampling of one next token.

A mixer that can decode incrementally has, beside ``forward(x)``,

    decode(x: (B, T, C), state: dict[str, Any], start: int) -> (B, T, C)

for the tokens at positions ``start .. start + T - 1`` of sequences whose first
``start`` positions it has already seen. ``state`` is the mixer's own memory of them
(empty at ``start == 0``; its tensors batch-first, (B, ...), so that a caller can drop
finished rows), which ``decode`` reads and extends in place: the keys and
values of softmax attention, the value side of the Dense Synthesizer and CAttnM (their
logits come from the query and the key's position only), the ladder outputs of CAttnU.
Its output equals rows ``start ..`` of ``forward`` over the whole sequence, in eval mode
(``tests/test_decoding.py`` holds every mixer to that). Position-wise mixers (MLP,
SwiGLU, Cffn) need nothing: they have no ``decode``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

#: Called with each step's sampled ids (B, 1) as they come: ``cofr generate`` writes a
#: sample's text so, and keeps what was sampled before a Ctrl-C.
TokenSink = Callable[[Tensor], None]


class NonFiniteLogits(ValueError):
    """The model's logits hold NaN: no token can be sampled (a diverged checkpoint's)."""


def causal_rows(start: int, length: int, device: torch.device) -> Tensor:
    """(length, start + length) bool: query ``start + i`` may attend keys ``<= start + i``."""
    return torch.ones(length, start + length, dtype=torch.bool, device=device).tril(start)


def append(state: dict[str, Any], key: str, value: Tensor, dim: int, capacity: int) -> Tensor:
    """``state[key]`` extended by ``value`` along ``dim``; returns a view of all of it.

    The first call allocates room for ``capacity`` entries along ``dim`` (the mixer's
    maximum length), later calls write in place: no copy of the whole cache per token.
    """
    length = state.get(f"{key}:length", 0)
    new = length + value.shape[dim]
    if key not in state:
        shape = list(value.shape)
        shape[dim] = max(capacity, new)
        state[key] = value.new_empty(shape)
    buffer = state[key]
    buffer.narrow(dim, length, value.shape[dim]).copy_(value)
    state[f"{key}:length"] = new
    return buffer.narrow(dim, 0, new)


def sample_next(
    logits: Tensor,
    temperature: float,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
    vocab: int | None = None,
) -> Tensor:
    """Next token ids (B, 1) from last-position logits (B, V).

    temperature 0 is greedy (arg-max); otherwise softmax(logits / temperature) restricted
    to the ``top_k`` likeliest ids, then to the smallest set holding ``top_p`` of the
    probability (nucleus), sampled with ``generator``; top_p 1 keeps them all. ``vocab``:
    only ids below it (a padded model's extra ids are never chosen).
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 (None: every id), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (None or 1: no nucleus cut), got {top_p}")
    if vocab is not None and vocab < 1:  # 0 failed in amax, -1 dropped the last id
        raise ValueError(f"vocab must be >= 1 (the ids to sample from; None: all), got {vocab}")
    logits = logits.float() if vocab is None else logits[:, :vocab].float()
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    # Less the row's max first: a tiny temperature then sends the others to -inf, not the
    # max to inf (whose softmax is NaN).
    logits = logits - logits.amax(dim=-1, keepdim=True)
    if temperature < torch.finfo(logits.dtype).tiny:  # it rounds to 0 in the division
        logits = torch.where(logits == 0, 0.0, float("-inf"))  # the limit: the max(es)
    else:
        logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = F.softmax(sorted_logits, dim=-1)
        # Drop a token when the ones before it already hold top_p (the first always stays).
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


def check_prompt(idx: Tensor) -> None:
    """idx must be (B, T) ids with T >= 1: a (T,) prompt failed with an IndexError, an
    empty one at index -1."""
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(
            f"the prompt must be (batch, tokens) ids with at least one token, got shape "
            f"{tuple(idx.shape)} (one sequence: ids.unsqueeze(0))"
        )


def sample_tokens(
    logits_after: Callable[[Tensor, Tensor], Tensor],
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
    vocab: int | None = None,
    stop_id: int | None = None,
    on_token: TokenSink | None = None,
) -> Tensor:
    """Extend ids idx (B, T) by up to ``max_new_tokens`` sampled ids -> (B, T + new): the
    loop every generator shares.

    ``logits_after(out, new)`` returns the last position's logits (B, V) after the ids so
    far, out (B, T'), whose last ``new.shape[1]`` ids ``new`` the model has not read yet
    (the prompt first, then the latest id): a cached or recurrent model reads ``new``
    alone, any other all of ``out``. Sampling as :func:`sample_next`; the loop ends early
    once every row has produced ``stop_id``. ``on_token(ids)`` gets each step's ids (B, 1).
    NonFiniteLogits when the logits hold NaN (greedy decoding would read id 0 from them).
    """
    check_prompt(idx)
    out = new = idx
    stopped = torch.zeros(idx.shape[0], dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        logits = logits_after(out, new)
        if bool(logits.isnan().any()):
            read = out.shape[1]
            raise NonFiniteLogits(
                f"the model's logits hold NaN (after {read} token{'s' * (read != 1)})"
            )
        new = sample_next(logits, temperature, top_k, generator, top_p=top_p, vocab=vocab)
        if on_token is not None:
            on_token(new)
        out = torch.cat((out, new), dim=1)
        if all_stopped(stopped, new, stop_id):
            break
    return out


def all_stopped(stopped: Tensor, next_id: Tensor, stop_id: int | None) -> bool:
    """Mark in ``stopped`` (B,) bool, in place, the rows whose ``next_id`` (B, 1) is
    ``stop_id``; whether every row has stopped (never, for ``stop_id`` None)."""
    if stop_id is None:
        return False
    stopped |= next_id[:, 0] == stop_id
    return bool(stopped.all())

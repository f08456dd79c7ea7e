"""Log-likelihood of continuations given their contexts: LAMBADA's scorer and the
lm-evaluation-harness adapter's (``loglikelihood``, ``loglikelihood_rolling``).

A (context, continuation) pair is cut into windows that score each continuation token
once (:func:`continuation_windows`); a continuation that fits the model's length is one
window, the harness's ``(context + continuation)[-(max_length + 1):][:-1]``. Windows run
longest first, ``batch_size`` at a time, right-padded (the models are causal: padding
after a row changes none of its positions), and only the scored positions are
log-softmaxed, so no (B, T, V) float32 copy of the logits is made.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def continuation_windows(
    tokens: Sequence[int], start: int, max_length: int
) -> list[tuple[list[int], int]]:
    """Windows that score ``tokens[start:]`` once each, given ``tokens[:start]`` (start >= 1).

    Each window is (input ids, n): the model reads at most ``max_length`` ids, those just
    before the window's last target, and its last n positions predict the window's n
    targets (at most ``max_length``, disjoint).
    """
    if start < 1:
        raise ValueError("continuation_windows needs at least one context token")
    windows = []
    pos = start
    while pos < len(tokens):
        stop = min(pos + max_length, len(tokens))
        windows.append((list(tokens[max(0, stop - 1 - max_length) : stop - 1]), stop - pos))
        pos = stop
    return windows


@torch.no_grad()
def score_continuations(
    model: nn.Module | Callable[[Tensor], Tensor],
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    max_length: int,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    n_real: int | None = None,
    pad_id: int = 0,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[tuple[float, bool]]:
    """(log P(continuation | context), greedy) of each (context ids, continuation ids).

    model: ids (B, T) -> logits (B, T, V). The context must not be empty (start it with
    EOS when there is none). greedy: the arg-max token is the target at every scored
    position, taken among ids below ``n_real`` (the tokenizer's vocabulary; the ids
    above pad the model's and are no token). on_batch(n, total): called after each batch
    of n windows of the ``total`` (a progress bar).
    """
    windows: list[tuple[list[int], int, list[int]]] = []  # (inputs, n scored, targets)
    owner: list[int] = []
    for k, (context, continuation) in enumerate(pairs):
        tokens = [*context, *continuation]
        start = len(context)
        for inputs, n in continuation_windows(tokens, start, max_length):
            windows.append((inputs, n, tokens[start : start + n]))
            owner.append(k)
            start += n
    totals = [0.0] * len(pairs)
    greedy = [True] * len(pairs)
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))
    for at in range(0, len(order), batch_size):
        batch = order[at : at + batch_size]
        rows = [windows[i][0] for i in batch]
        inputs = torch.full((len(rows), len(rows[0])), pad_id, dtype=torch.long)
        for row, ids in enumerate(rows):
            inputs[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        logits = model(inputs.to(device))
        for row, i in enumerate(batch):
            ids, n, targets = windows[i]
            logprobs = F.log_softmax(logits[row, len(ids) - n : len(ids)].float(), dim=-1)
            target = torch.as_tensor(targets, dtype=torch.long, device=logprobs.device)
            totals[owner[i]] += float(logprobs.gather(1, target[:, None]).sum())
            hit = bool((logprobs[:, :n_real].argmax(-1) == target).all())
            greedy[owner[i]] = greedy[owner[i]] and hit
        if on_batch is not None:
            on_batch(len(batch), len(windows))
    return list(zip(totals, greedy, strict=True))

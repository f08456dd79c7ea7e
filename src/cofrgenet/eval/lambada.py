"""LAMBADA: predict the last word of a passage whose context makes it guessable.

Each passage is split into (context, `` last-word``); both are tokenised separately
(the target's tokens are the same whatever precedes them, as lm-evaluation-harness does
it). Two numbers:

* accuracy: the share of passages whose greedy continuation is the whole target word,
  i.e. at every target position the arg-max token is the target token;
* target-word perplexity: ``exp(-mean log p(word | context))`` over passages, what
  GPT-2's paper and lm-evaluation-harness call LAMBADA perplexity.

A context longer than the model's block keeps its last tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cofrgenet.eval.tasks import EvalDataError, split_last_word


@dataclass
class LambadaResult:
    correct: int
    examples: int
    nll: float  # summed over passages, nats

    def metrics(self) -> dict[str, float]:
        return {
            "accuracy": self.correct / self.examples,
            "ppl": math.exp(self.nll / self.examples),
            "examples": float(self.examples),
        }


@torch.no_grad()
def score_continuations(
    model: nn.Module | Callable[[Tensor], Tensor],
    pairs: Sequence[tuple[list[int], list[int]]],
    block: int,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    n_real: int | None = None,
) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of each continuation given its context.

    pairs: (context ids, continuation ids); the context must not be empty (start it with
    EOS when there is none). Their concatenation keeps its last ``block + 1`` tokens.
    n_real: the tokenizer's vocabulary size; the greedy choice is taken among ids below
    it (the ids above pad the model's vocabulary and are no token).
    """
    if any(len(cont) > block for _, cont in pairs):
        raise ValueError(f"a continuation is longer than the model's block ({block} tokens)")
    results: list[tuple[float, bool]] = []
    for first in range(0, len(pairs), batch_size):
        batch = pairs[first : first + batch_size]
        rows = [(ctx + cont)[-(block + 1) :] for ctx, cont in batch]
        width = max(len(r) for r in rows) - 1
        inputs = torch.zeros(len(rows), width, dtype=torch.long, device=device)
        for i, row in enumerate(rows):
            inputs[i, : len(row) - 1] = torch.tensor(row[:-1], device=device)
        logprobs = F.log_softmax(model(inputs).float(), dim=-1)
        for i, ((_, cont), row) in enumerate(zip(batch, rows, strict=True)):
            n = len(cont)
            positions = torch.arange(len(row) - 1 - n, len(row) - 1, device=device)
            target = torch.tensor(cont, device=device)
            picked = logprobs[i, positions]  # (n, V)
            loglik = picked.gather(-1, target[:, None]).sum().item()
            greedy = bool((picked[:, :n_real].argmax(-1) == target).all())
            results.append((loglik, greedy))
    return results


def lambada(
    model: nn.Module | Callable[[Tensor], Tensor],
    encode: Callable[[str], list[int]],
    eos_id: int,
    passages: Sequence[str],
    block: int,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    n_real: int | None = None,
) -> LambadaResult:
    """Accuracy and target-word perplexity over ``passages`` (n_real: as for
    :func:`score_continuations`)."""
    pairs = []
    for number, passage in enumerate(passages, start=1):
        context, target = split_last_word(passage)
        pairs.append(([eos_id, *encode(context)], encode(target)))
        if len(pairs[-1][1]) > block:
            raise EvalDataError(
                f"LAMBADA passage {number}: its last word {target.strip()[:40]!r} is "
                f"{len(pairs[-1][1])} tokens, more than the model's block ({block}): "
                "it cannot be scored"
            )
    scores = score_continuations(model, pairs, block, batch_size, device, n_real)
    return LambadaResult(
        correct=sum(greedy for _, greedy in scores),
        examples=len(scores),
        nll=-sum(loglik for loglik, _ in scores),
    )

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from cofrgenet.eval.perplexity import perplexity
from cofrgenet.eval.scoring import score_continuations
from cofrgenet.eval.tasks import EvalDataError, split_last_word


@dataclass
class LambadaResult:
    correct: int
    examples: int
    nll: float  # summed over passages, nats

    def metrics(self) -> dict[str, float]:
        return {
            "accuracy": self.correct / self.examples,
            "ppl": perplexity(self.nll / self.examples),
            "examples": self.examples,
        }


def continuation_pairs(
    encode: Callable[[str], list[int]], eos_id: int, passages: Sequence[str], block: int
) -> list[tuple[list[int], list[int]]]:
    """(context ids, last-word ids) of each passage; a last word longer than the
    ``block``-token window is an :class:`EvalDataError` naming its passage (``cofr eval``
    checks before it scores any set)."""
    pairs = []
    for number, passage in enumerate(passages, start=1):
        context, target = split_last_word(passage)
        pairs.append(([eos_id, *encode(context)], encode(target)))
        if len(pairs[-1][1]) > block:
            raise EvalDataError(
                f"LAMBADA passage {number}: its last word {target.strip()[:40]!r} is "
                f"{len(pairs[-1][1])} tokens, more than the {block}-token window it is "
                "scored in (--window; default: the length the model trained at): it cannot "
                "be scored"
            )
    return pairs


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
    :func:`cofrgenet.eval.scoring.score_continuations`)."""
    pairs = continuation_pairs(encode, eos_id, passages, block)
    return score_pairs(model, pairs, block, batch_size, device, n_real)


def score_pairs(
    model: nn.Module | Callable[[Tensor], Tensor],
    pairs: list[tuple[list[int], list[int]]],
    block: int,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    n_real: int | None = None,
) -> LambadaResult:
    """:func:`lambada` of passages already encoded by :func:`continuation_pairs`."""
    scores = score_continuations(model, pairs, block, batch_size, device, n_real)
    return LambadaResult(
        correct=sum(greedy for _, greedy in scores),
        examples=len(scores),
        nll=-sum(loglik for loglik, _ in scores),
    )

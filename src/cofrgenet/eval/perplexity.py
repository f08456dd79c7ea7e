"""Perplexity of a causal language model on a long text, by sliding window.

The text is tokenised once, after an end-of-text token that serves as the first
token's context, so every token of the text is scored, once. Windows of ``block``
tokens start every ``stride`` tokens; each scores only the tokens no earlier window
scored, so every token is predicted from the longest context its window gives (at
least ``block - stride`` tokens once past the first window). ``stride == block`` gives
disjoint windows. This is the Hugging Face recipe "perplexity of fixed-length models".

Three normalisations of the same total negative log-likelihood (nats), so that models
with different tokenizers compare (:class:`PerplexityResult`):

* token perplexity: ``exp(nll / tokens)``; depends on the tokenizer.
* word perplexity: ``exp(nll / words)``, words = whitespace-separated words of the
  set's original text, before detokenisation (the dataset's own word-level tokens, as
  lm-evaluation-harness's ``wikitext`` task counts them); the same for every tokenizer.
  ``word_ppl_eos`` also counts each line's end as a word, the ``<eos>`` of word-level
  language modelling (PTB's test set: 78,669 words + 3,761 lines = the usual 82,430).
* bits per byte: ``nll / (ln 2 * bytes)``, bytes = the original text's UTF-8 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class Window:
    """Inputs ``ids[start : start + length]``, targets one token later; the first
    ``context`` targets were scored by an earlier window (context only here)."""

    start: int
    length: int
    context: int


def default_stride(block: int) -> int:
    """Half the block: every scored token after the first window sees at least that much
    context."""
    return max(1, block // 2)


def sliding_windows(n_ids: int, block: int, stride: int) -> list[Window]:
    """The windows that score targets ``ids[1:]`` of ``n_ids`` ids, each exactly once.

    >>> sliding_windows(9, 4, 2)  # targets 1..8
    [Window(start=0, length=4, context=0), Window(start=2, length=4, context=2), \
Window(start=4, length=4, context=2)]
    """
    if not 1 <= stride <= block:
        raise ValueError(f"stride must be in [1, block={block}], got {stride}")
    windows: list[Window] = []
    scored_through = 0  # last target index scored
    start = 0
    while scored_through < n_ids - 1:
        length = min(block, n_ids - 1 - start)
        end = start + length  # last target index of this window
        windows.append(Window(start, length, context=scored_through - start))
        scored_through = end
        start += stride
    return windows


def perplexity(mean_nll: float) -> float:
    """``exp(mean_nll)``, inf past the float range: a diverged model's perplexity (over
    ~709 nats a token) is reported as inf, not an OverflowError that lost every set
    scored before it. NaN stays NaN."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf


@dataclass
class PerplexityResult:
    """Totals of one text: ``nll`` in nats over ``tokens`` scored tokens."""

    nll: float
    tokens: int
    words: int
    bytes: int
    lines: int

    @classmethod
    def of_text(cls, nll: float, tokens: int, original: str) -> PerplexityResult:
        """The totals with the denominators counted on ``original`` (before detokenising)."""
        lines = original.count("\n") + (0 if original.endswith("\n") else 1)
        return cls(nll, tokens, len(original.split()), len(original.encode("utf-8")), lines)

    @property
    def token_ppl(self) -> float:
        return perplexity(self.nll / self.tokens)

    @property
    def word_ppl(self) -> float:
        return perplexity(self.nll / self.words)

    @property
    def word_ppl_eos(self) -> float:
        return perplexity(self.nll / (self.words + self.lines))

    @property
    def bits_per_byte(self) -> float:
        return self.nll / (math.log(2) * self.bytes)

    def metrics(self) -> dict[str, float]:
        """What ``cofr eval`` reports (and logs to MLflow as ``eval/<task>/<key>``)."""
        return {
            "token_ppl": self.token_ppl,
            "word_ppl": self.word_ppl,
            "word_ppl_eos": self.word_ppl_eos,
            "bits_per_byte": self.bits_per_byte,
            **asdict(self),  # the counts as whole numbers (9600, not 9600.0, in --json)
        }


def _batches(windows: list[Window], batch_size: int) -> Iterator[list[Window]]:
    for first in range(0, len(windows), batch_size):
        yield windows[first : first + batch_size]


@torch.no_grad()
def window_nll(
    model: nn.Module | Callable[[Tensor], Tensor],
    ids: Tensor,
    block: int,
    stride: int,
    batch_size: int = 8,
) -> tuple[float, int]:
    """(total NLL in nats, tokens scored) of targets ``ids[1:]`` (1-D long tensor on the
    model's device) by sliding windows; ``model`` maps (B, T) ids to (B, T, V) logits."""
    windows = sliding_windows(len(ids), block, stride)
    total = torch.zeros((), dtype=torch.float64, device=ids.device)
    scored = 0
    for batch in _batches(windows, batch_size):
        width = max(w.length for w in batch)
        inputs = torch.zeros(len(batch), width, dtype=torch.long, device=ids.device)
        targets = torch.full_like(inputs, -100)  # ignored by cross_entropy
        for row, w in enumerate(batch):
            inputs[row, : w.length] = ids[w.start : w.start + w.length]
            keep = slice(w.context, w.length)  # right padding: causal rows are unaffected
            targets[row, keep] = ids[w.start + 1 + w.context : w.start + 1 + w.length]
            scored += w.length - w.context
        logits = model(inputs).float()
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        total += nll.double()
    return float(total), scored


def text_perplexity(
    model: nn.Module | Callable[[Tensor], Tensor],
    encode: Callable[[str], list[int]],
    eos_id: int,
    text: str,
    block: int,
    stride: int | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    original: str | None = None,
) -> PerplexityResult:
    """Sliding-window perplexity of ``text`` (already detokenised) under ``model``.

    stride: default ``block // 2``.
    original: the text before detokenisation, whose words, lines and bytes are the
    denominators of word perplexity and bits per byte (default: ``text``).
    """
    ids = torch.tensor([eos_id, *encode(text)], dtype=torch.long, device=device)
    if len(ids) < 2:
        raise ValueError("the text is empty: nothing to score")
    nll, tokens = window_nll(model, ids, block, stride or default_stride(block), batch_size)
    return PerplexityResult.of_text(nll, tokens, text if original is None else original)

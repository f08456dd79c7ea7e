"""The detokenisers GPT-2-style evaluations apply to WikiText and PTB before scoring.

WikiText and Mikolov's PTB are distributed *tokenised*: punctuation split off by spaces,
``@-@`` for hyphens inside words, `` n't`` as its own token. A model trained on raw web
text scores such text badly for reasons that have nothing to do with language modelling,
so evaluations of GPT-2-style models (GPT-2's paper, Megatron-LM, lm-evaluation-harness)
first undo the tokenisation. These are those functions, rule for rule (Megatron-LM's
``tasks/zeroshot_gpt/detokenizer.py``, which lm-evaluation-harness's ``wikitext`` task
copies), with one fix to PTB's number rule (see :func:`ptb_detokenize`).
``docs/evaluation.md`` lists what each rule changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's tokenisation: ``3 @,@ 000`` -> ``3,000``, ``word , word`` ->
    ``word, word``, ``( x )`` -> ``(x)``, ``= = Heading = =`` -> ``== Heading ==``."""
    # contractions
    text = text.replace("s '", "s'")
    text = re.sub(r"/' [0-9]/", r"/'[0-9]/", text)
    # number separators
    text = text.replace(" @-@ ", "-")
    text = text.replace(" @,@ ", ",")
    text = text.replace(" @.@ ", ".")
    # punctuation
    text = text.replace(" : ", ": ")
    text = text.replace(" ; ", "; ")
    text = text.replace(" . ", ". ")
    text = text.replace(" ! ", "! ")
    text = text.replace(" ? ", "? ")
    text = text.replace(" , ", ", ")
    # brackets and quotes hug their content
    text = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", text)
    text = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", text)
    text = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", text)
    text = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', text)
    text = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", text)
    # headings and the rest
    text = text.replace("= = = =", "====")
    text = text.replace("= = =", "===")
    text = text.replace("= =", "==")
    text = text.replace(" " + chr(176) + " ", chr(176))
    text = text.replace(" \n", "\n")
    text = text.replace("\n ", "\n")
    text = text.replace(" N ", " 1 ")
    text = text.replace(" 's", "'s")
    return text


def ptb_detokenize(text: str) -> str:
    """Undo PTB's tokenisation: `` 's`` -> ``'s``, `` n't`` -> ``n't``, the number
    placeholder ``N`` -> ``1``, and spaces around line breaks. (Lower case and ``<unk>``
    stay: the text has lost what they replaced.)"""
    text = text.replace(" '", "'")
    text = text.replace(" \n", "\n")
    text = text.replace("\n ", "\n")
    text = text.replace(" n't", "n't")
    # Megatron writes " N " -> "1 ", which eats the space before the number and misses
    # every second N of "N N" and an N at a line's end; every standalone N is meant.
    text = re.sub(r"(?<!\S)N(?!\S)", "1", text)
    text = text.replace("$ 1", "$1")
    text = text.replace("# 1", "#1")
    return text


def identity(text: str) -> str:
    return text


DETOKENIZERS: dict[str, Callable[[str], str]] = {
    "wikitext": wikitext_detokenize,
    "ptb": ptb_detokenize,
    "none": identity,
}

"""Datasets of the tiny harness tasks: the jsonl files next to this module, as ``test``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _docs(name: str) -> Any:
    import datasets

    lines = (HERE / name).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def mc_docs(**kwargs: Any) -> Any:
    """Multiple choice: question, choices, answer (index of the right choice)."""
    return _docs("mc.jsonl")


def ppl_docs(**kwargs: Any) -> Any:
    """Perplexity: one text per document."""
    return _docs("ppl.jsonl")

"""Report files that are whole at any instant: a run killed mid-write keeps the last one."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Report = TypeVar("Report")


def free_stem(out_dir: Path, base: str) -> Path:
    """``out_dir/base``, or ``base-2``, ``base-3``, ... when a report of that name is there
    already (``.md`` or ``.json``): a run never replaces another run's report. A run picks
    its stem once and rewrites its own files under it as it goes."""
    for number in itertools.count(1):
        stem = out_dir / (base if number == 1 else f"{base}-{number}")
        if not any(with_suffix(stem, ext).exists() for ext in (".md", ".json")):
            return stem
    raise AssertionError("unreachable")


def stem_once(choose: Callable[[Report], Path]) -> Callable[[Report], Path]:
    """``choose(report)`` at the first call, the same stem at every later one: a run names
    its report once (:func:`free_stem`) and then rewrites its own files as it goes."""
    chosen: list[Path] = []

    def stem(report: Report) -> Path:
        if not chosen:
            chosen.append(choose(report))
        return chosen[0]

    return stem


def with_suffix(stem: Path, ext: str) -> Path:
    """``stem`` + ``ext`` (``Path.with_suffix`` would cut a tag holding a dot, ``-v1.2``)."""
    return stem.with_name(stem.name + ext)

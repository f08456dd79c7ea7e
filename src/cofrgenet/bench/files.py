"""Report files that are whole at any instant: a run killed mid-write keeps the last one."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cofrgenet.atomic import why_no_folder
from cofrgenet.errors import UserError

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


def make_out_dir(out_dir: str | Path, flag: str = "--out-dir") -> Path:
    """The report folder, made now: one that cannot be made or written in (a file in its
    path, no permission) fails before the measuring, not after it."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"{flag} {out}: cannot make this folder: {why_no_folder(out, error)}"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out}: cannot write in this folder (permission denied)")
    return out


def check_file_name_part(flag: str, value: str | None) -> None:
    """Refuse a tag or suffix that would not stay part of the report's file name."""
    if value and not re.fullmatch(r"[A-Za-z0-9._-]+", value):
        raise UserError(
            f"{flag} {value!r}: it goes into the report's file name; use letters, digits, "
            "'.', '_' or '-'"
        )

"""Report files that are whole at any instant: a run killed mid-write keeps the last one."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cofrgenet.atomic import why_no_folder
from cofrgenet.errors import UserError
from cofrgenet.signals import sigterm_raises, stopped_by

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


Result = TypeVar("Result")


def measure_keeping_partial(
    measure: Callable[[], Result],
    written: list[tuple[Report, Path | None]],
    mark_stopped: Callable[[Report, str], object],
    saving: bool = True,
) -> Result:
    """``measure()``, with SIGTERM (a wall-clock limit, ``kill``) raising as Ctrl-C does.
    Stopped so, or by an error: the partial report written last (``written``: [(report,
    its .md)], kept by the run's ``on_update``) is rewritten by ``mark_stopped(report,
    what stopped it)`` and the user told where it is (an .md of None: a report only
    printed, which ``mark_stopped`` prints), or, where the run writes reports
    (``saving``), that none was written yet; then the stop goes on."""
    try:
        with sigterm_raises():
            return measure()
    except BaseException as error:
        if written:
            report, md = written[0]
            # "The finished run rewrites this file": not this one any more. A failed write
            # must not hide what stopped the run (the earlier partial file stays).
            with contextlib.suppress(OSError):
                mark_stopped(report, stopped_by(error))
            if md is not None:
                print(f"stopped: what was measured so far is in {md} (partial)", file=sys.stderr)
        elif saving and isinstance(error, (KeyboardInterrupt, SystemExit)):
            print("stopped: nothing was measured yet, so no report was written", file=sys.stderr)
        raise


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

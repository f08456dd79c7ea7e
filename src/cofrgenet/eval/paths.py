"""The files and folders an evaluation command reads and writes (``cofr eval``, ``cofr
finetune glue``), checked before the work: results are never computed only to be lost."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from cofrgenet.atomic import nearest_existing, write_text_atomic
from cofrgenet.errors import UserError


def check_output_file(path: str | os.PathLike[str], flag: str = "--json") -> Path:
    """``path`` if a results file can be written there: it is not a folder nor a file other
    than JSON (a checkpoint given twice), and its nearest existing parent is a writable
    folder (missing ones are made when writing).
    Checked before the work, so that results are never computed only to be lost."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{flag} {out} is a folder: give a file name, e.g. {out / 'results.json'}")
    parent = nearest_existing(out.absolute().parent)
    if not parent.is_dir():
        raise UserError(f"{flag} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{flag} {out}: cannot write in {parent} (permission denied)")
    if out.is_file() and out.stat().st_size and not _is_results_file(out):
        raise UserError(
            f"{flag} {out} exists and is not a results file of cofr eval or GLUE: it is not "
            "replaced; give another file name"
        )
    return out


#: Keys every results file these commands write has (cofr eval's, GLUE's).
RESULTS_KEYS = ("results", "metrics")


def _is_results_file(path: Path) -> bool:
    """Whether the file is a JSON results file written before (not any JSON: a model's
    config.json given by mistake)."""
    try:
        with open(path, "rb") as fh:  # not a checkpoint's gigabytes: its first bytes
            if not fh.read(256).lstrip().startswith(b"{") or path.stat().st_size > 2**26:
                return False
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(report, dict) and any(key in report for key in RESULTS_KEYS)


def check_data_dir(data_dir: str | None, holds: str, hub: str) -> None:
    """A ``--data-dir`` given must be a folder (None: the data comes from ``hub``)."""
    if data_dir is not None and not Path(data_dir).is_dir():
        if Path(data_dir).is_file():
            raise UserError(
                f"--data-dir {data_dir} is a file: give the folder that holds it "
                f"({Path(data_dir).parent}), or leave it out to use {hub}"
            )
        raise UserError(
            f"--data-dir {data_dir}: no such folder; give {holds}, or leave it out to use {hub}"
        )


def write_results(out: Path, report: dict[str, Any], flag: str = "--json") -> None:
    """Write ``report`` as JSON to ``out``; if that fails after all, print it to stdout
    first (results are not lost), then the one-line error."""
    text = json.dumps(report, indent=2) + "\n"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)  # an interrupted write keeps the earlier results
    except OSError as error:
        sys.stdout.write(text)
        raise UserError(
            f"{flag} {out}: could not write ({error.strerror or error}); the results are "
            "printed above"
        ) from None

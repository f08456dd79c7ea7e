"""The files and folders an evaluation command reads and writes (``cofr eval``, ``cofr
finetune glue``), checked before the work: results are never computed only to be lost."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from cofrgenet.atomic import nearest_existing, strict_json, write_text_atomic
from cofrgenet.errors import UserError

#: The keys that mark each command's results file (lm_eval's own output has "results"
#: too), and the command's name.
RESULTS_KINDS = {"results": "cofr eval", "metrics": "GLUE"}
_KIND_KEYS = {"results": {"checkpoint", "results"}, "metrics": {"task", "ckpt", "metrics"}}


def check_output_file(
    path: str | os.PathLike[str], flag: str = "--json", kind: str = "results"
) -> Path:
    """``path`` if a results file of ``kind`` (a key of :data:`RESULTS_KINDS`) can be
    written there: it is not a folder, nor a file other than such results (a checkpoint
    given twice, another command's results), and its nearest existing parent is a
    writable folder (missing ones are made when writing).
    Checked before the work, so that results are never computed only to be lost."""
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{flag} {out} is a folder: give a file name, e.g. {out / 'results.json'}")
    parent = nearest_existing(out.absolute().parent)
    if not parent.is_dir():
        raise UserError(f"{flag} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise UserError(f"{flag} {out}: cannot write in {parent} (permission denied)")
    if out.is_file() and out.stat().st_size:
        found = _results_kind(out)
        if found is None:
            raise UserError(
                f"{flag} {out} exists and is not a results file of cofr eval or GLUE: it is "
                "not replaced; give another file name"
            )
        if found != kind:
            raise UserError(
                f"{flag} {out} holds {RESULTS_KINDS[found]}'s results, not "
                f"{RESULTS_KINDS[kind]}'s: it is not replaced; give another file name"
            )
    return out


def partial_results_file(out: Path) -> Path:
    """Where a stopped evaluation's partial results go when ``--json`` is ``out``: ``out``
    itself, unless it holds an earlier run's complete results (no ``partial`` record),
    which a Ctrl-C is not to replace: then ``<stem>.partial<suffix>`` beside it."""
    if _results_kind(out) is None:
        return out
    earlier = read_results(out)
    if earlier is None or "partial" in earlier:
        return out
    return beside_partial(out)


def beside_partial(out: Path) -> Path:
    """``<stem>.partial<suffix>`` beside ``out``: where partial results go when ``out``
    holds complete ones."""
    return out.with_name(f"{out.stem}.partial{out.suffix}")


def older_partial_note(out: Path) -> str:
    """After complete results went to ``out``: a note naming the partial results that a
    stopped run left beside it (:func:`partial_results_file`), older than these; ``""``
    where there are none. They are not removed: they may be another checkpoint's."""
    partial = beside_partial(out)
    record = read_results(partial) if partial.is_file() else None
    if record is None or "partial" not in record:
        return ""
    return f" ({partial} holds a stopped run's partial results, older than these)"


def read_results(path: Path) -> dict[str, Any] | None:
    """A results file's record (as :func:`write_results` wrote it), or None where ``path``
    cannot be read or holds no JSON object."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _results_kind(path: Path) -> str | None:
    """Which command's JSON results file ``path`` is (a key of :data:`RESULTS_KINDS`),
    or None for anything else (a model's config.json given by mistake)."""
    try:
        with open(path, "rb") as fh:  # not a checkpoint's gigabytes: its first bytes
            if not fh.read(256).lstrip().startswith(b"{") or path.stat().st_size > 2**26:
                return None
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(report, dict):
        return None
    return next((kind for kind, keys in _KIND_KEYS.items() if keys <= report.keys()), None)


def check_data_dir(data_dir: str | None, holds: str, hub: str) -> None:
    """A ``--data-dir`` given must be a folder (None: the data comes from ``hub``), and
    not a training corpus made by ``cofr data prepare``."""
    from cofrgenet.data.meta import prepared_corpus

    if data_dir is not None and prepared_corpus(Path(data_dir)):
        raise UserError(
            f"--data-dir {data_dir} is a corpus made by `cofr data prepare` (its meta.json, "
            f"tokenized splits), not {holds}: `cofr validate` scores a run on such a "
            "folder's val split (--data.data_dir; docs/training.md)"
        )
    if data_dir is not None and not Path(data_dir).is_dir():
        if Path(data_dir).is_file():
            raise UserError(
                f"--data-dir {data_dir} is a file: give the folder that holds it "
                f"({Path(data_dir).parent}), or leave it out to use {hub}"
            )
        raise UserError(
            f"--data-dir {data_dir}: no such folder; give {holds}, or leave it out to use {hub}"
        )


#: From this size on a score is printed as 7.061e+127: a diverged model's perplexity in
#: full (128 digits) widened the table past the terminal, its columns squeezed to nothing.
SCIENTIFIC_FROM = 1e6


def readable(value: float, spec: str) -> str:
    """``value`` in ``spec``, or in 4 significant digits from :data:`SCIENTIFIC_FROM` on."""
    return (
        f"{value:.3e}"
        if math.isfinite(value) and abs(value) >= SCIENTIFIC_FROM
        else format(value, spec)
    )


def results_json(report: dict[str, Any]) -> str:
    """``report`` as strict JSON (non-finite numbers as null: :func:`~cofrgenet.atomic.finite`)."""
    return strict_json(report)


def write_results(out: Path, report: dict[str, Any], flag: str = "--json") -> None:
    """Write ``report`` as JSON to ``out`` (:func:`results_json`); if that fails after
    all, print it to stdout first (results are not lost), then the one-line error."""
    text = results_json(report)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, text)  # an interrupted write keeps the earlier results
    except OSError as error:
        sys.stdout.write(text)
        raise UserError(
            f"{flag} {out}: could not write ({error.strerror or error}); the results are "
            "printed above"
        ) from None

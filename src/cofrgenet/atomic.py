"""Files written whole or not at all: a temporary file beside the target, then a rename.

A run killed mid-write (a wall-clock limit, a crash, a full disk) must leave every file
it rewrites either as it was or as it was meant to be: the run folder's config and MLflow
run id, a data folder's ``meta.json``, sweep reports, benchmark reports. A rename within
a folder is atomic on POSIX file systems; the temporary name carries the process id, so
processes writing the same file at once (sweep workers finishing together) never write
into each other's temporary file.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: ``.<name>.<pid>.tmp<suffix>``: what :func:`replacing` writes before its rename.
_TEMPORARY = re.compile(r"\..+\.\d+\.tmp(\.[^.]+)?")


def is_temporary(name: str) -> bool:
    """Whether a file ``name`` is the temporary file of a write under way or cut short
    (a kill between the write and the rename leaves it)."""
    return _TEMPORARY.fullmatch(name) is not None


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside ``path``, with its suffix (for writers that read the
    format from it, e.g. ``savefig``): renamed onto ``path`` when the block ends, removed
    if the block raises."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder: keep the first error
            tmp.unlink(missing_ok=True)
        raise


def create_numbered(folder: Path, stem: str, suffix: str, create: Callable[[Path], T]) -> T:
    """``create(folder / (stem + suffix))``, or with ``-2``, ``-3``, ... after ``stem``
    while ``create`` raises FileExistsError: ``create`` makes its path exclusively (an
    ``O_EXCL`` open, a ``mkdir``), so two processes naming one in the same second get
    two names, never one file."""
    for number in itertools.count(1):
        with contextlib.suppress(FileExistsError):
            return create(folder / f"{stem}{f'-{number}' if number > 1 else ''}{suffix}")
    raise AssertionError("unreachable: itertools.count never ends")


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    with replacing(path) as tmp:
        tmp.write_text(text)


def finite(value: Any) -> Any:
    """``value`` with each NaN or infinite float (a broken or diverged model's scores)
    replaced by None, recursively: JSON's null. Python writes them as bare ``NaN`` and
    ``Infinity``, which strict parsers (jq, JavaScript, most languages') refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def strict_json(value: Any) -> str:
    """``value`` as strict, indented JSON (:func:`finite`), ending with a newline."""
    return json.dumps(finite(value), indent=2, allow_nan=False) + "\n"


def missing_folders(path: Path) -> list[Path]:
    """The folders on the way to ``path``, itself included, that do not exist yet, deepest
    first: what ``mkdir -p`` makes (through ``a/../b``, ``a`` too)."""
    path = path.absolute()
    prefixes = [Path(*path.parts[:end]) for end in range(1, len(path.parts) + 1)]
    missing = [
        folder
        for folder in prefixes
        if folder.name not in ("", ".", "..") and not (folder.exists() or folder.is_symlink())
    ]
    return missing[::-1]


def remove_empty_folders(folders: Iterable[Path]) -> None:
    """Remove ``folders`` (deepest first, as :func:`missing_folders` lists those a call
    made) while they are empty: the first that holds something (someone else's files)
    stops it, since the ones above hold it; one already gone is passed over."""
    for folder in folders:
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            break


def nearest_existing(path: Path) -> Path:
    """``path`` or its nearest parent that exists (a folder to be made goes in it)."""
    return next(p for p in (path, *path.parents) if p.exists())


def why_no_folder(path: Path, error: OSError) -> str:
    """Why ``mkdir -p path`` failed, in a few words: the file that stands where the folder
    or a parent folder should be, else the system's reason."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    return f"{str(blocker)!r} is a file" if blocker else (error.strerror or str(error))

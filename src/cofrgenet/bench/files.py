"""Report files that are whole at any instant: a run killed mid-write keeps the last one."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a hidden temporary file and a rename.

    Benchmarks rewrite their reports while they run (partial reports), and a wall-clock
    limit may kill them at any moment: a rename is atomic, so ``path`` always holds a
    whole report, the previous one or the new one.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

"""Which checkpoint to resume from, and whether a file is a checkpoint at all.

A checkpoint written by ``torch.save`` is a zip archive whose members carry CRC-32
checksums, so a truncated or overwritten file is found by reading it once, without
unpickling anything (:func:`is_intact`). ``--ckpt_path last`` then resumes from the
newest intact checkpoint of the run: ``last.ckpt``, Lightning's SLURM requeue
checkpoint ``hpc_ckpt_<n>.ckpt`` or a periodic ``step*.ckpt``, saying so when it had to
pass over a damaged newer one (:func:`newest_intact`).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from cofrgenet.errors import UserError


class CheckpointError(UserError, ValueError):
    """A file that is not an intact cofrgenet checkpoint."""


def damaged(path: Path) -> CheckpointError:
    return CheckpointError(f"this checkpoint is damaged or not a cofrgenet checkpoint: {path}")


#: Files of a sharded (FSDP ``state_dict_type: sharded``) checkpoint folder: the
#: torch.distributed.checkpoint metadata, written last, and Lightning's own entries.
SHARDED_MARKERS = (".metadata", "meta.pt")


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` is a sharded checkpoint: a folder of per-rank shards."""
    return Path(path).is_dir()


def is_intact(path: str | Path) -> bool:
    """Whether ``path`` is a complete torch.save archive (every member's CRC checks out),
    or a sharded checkpoint folder with its metadata and Lightning's entries."""
    if is_sharded(path):
        return all((Path(path) / name).is_file() for name in SHARDED_MARKERS)
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def check(path: str | Path) -> Path:
    """``path`` if it is an intact checkpoint file, else a CheckpointError naming it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    if not is_intact(path):
        raise damaged(path)
    return path


def candidates(run_dir: Path) -> list[Path]:
    """The run's checkpoints a resume may use, newest first."""
    found = [*run_dir.glob("hpc_ckpt_*.ckpt"), *(run_dir / "checkpoints").glob("*.ckpt")]
    found = [p for p in found if not p.name.startswith("nonfinite-")]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def newest_intact(run_dir: Path) -> tuple[Path | None, list[Path]]:
    """(the newest intact checkpoint of ``run_dir`` or None, the damaged newer ones)."""
    skipped: list[Path] = []
    for path in candidates(run_dir):
        if is_intact(path):
            return path, skipped
        skipped.append(path)
    return None, skipped


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents, checked first and unpickled with ``weights_only=True``
    (tensors and plain containers only: nothing in the file can run code). Tensors are
    memory-mapped, not read: callers that want the metadata (step, data folder) before
    Lightning loads the weights do not read a large file twice."""
    path = check(path)
    if is_sharded(path):
        raise CheckpointError(
            f"{path} is a sharded FSDP checkpoint (one shard per rank): make it one file with "
            f"`python -m lightning.pytorch.utilities.consolidate_checkpoint {path}` and use "
            f"{path}.consolidated"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception:
        raise damaged(path) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise damaged(path)
    return checkpoint

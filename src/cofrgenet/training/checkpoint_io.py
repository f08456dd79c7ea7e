"""Checkpoint files written whole or not at all, on any file system layout.

Lightning's ``TorchCheckpointIO`` writes a local checkpoint through fsspec's
transaction: the bytes go to a temporary file made by ``tempfile.mkstemp()`` in
``$TMPDIR``, which is then moved onto the checkpoint. On a cluster ``$TMPDIR`` is
usually node-local while runs live on a shared file system, so the move is a copy into
the open ``last.ckpt``: a job killed during it (SLURM's grace period after SIGTERM ends
with SIGKILL) leaves the previous good checkpoint truncated, and the node's /tmp must
hold a whole checkpoint. :class:`AtomicCheckpointIO` writes the temporary file beside
the checkpoint, flushes it to disk and renames it over the old one.

Lightning names its SLURM requeue checkpoint ``hpc_ckpt_<n>.ckpt`` (a file, or a folder
of shards under FSDP) with a new ``n`` at each requeue and never removes the older ones;
each holds the optimizer state too, so a job requeued often filled the disk.
:func:`remove_requeue_checkpoints` keeps the newest (``StopOnSignal`` calls it once
Lightning's requeue handler has saved one), or none once ``last.ckpt`` holds the fit's
last step (``RunCheckpoint`` at the end of training).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from cofrgenet.atomic import replacing
from cofrgenet.errors import UserError, raised_from

#: Lightning's name for the checkpoint it saves on SIGUSR1 before requeueing the job.
REQUEUE_CHECKPOINT = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are a same-folder write, fsync and rename
    (remote URLs keep Lightning's own path)."""

    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with replacing(path) as tmp, open(tmp, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
        except (OSError, RuntimeError) as error:
            # torch.save reports a full disk as a RuntimeError raised while handling the
            # write's OSError.
            cause = raised_from(error, OSError)
            if cause is None:
                raise
            raise CheckpointWriteError(
                f"cannot write the checkpoint {path}: {cause.strerror or cause}; the "
                "checkpoints saved before are intact: make room (or make the folder "
                "writable), then resume with --ckpt_path last"
            ) from error
        _fsync_folder(path.parent)  # the rename itself survives a node crash


class CheckpointWriteError(UserError, OSError):
    """A checkpoint could not be written (a full disk, a read-only folder)."""


def remove_requeue_checkpoints(run_dir: Path, keep_newest: bool = True) -> list[Path]:
    """Remove every ``hpc_ckpt_<k>.ckpt`` (file or shard folder) of ``run_dir``, but the
    one with the largest k when ``keep_newest``; returns the paths removed."""
    numbered = {}
    for path in Path(run_dir).glob("hpc_ckpt_*.ckpt"):
        match = REQUEUE_CHECKPOINT.fullmatch(path.name)
        if match is not None:
            numbered[int(match.group(1))] = path
    ordered = [numbered[k] for k in sorted(numbered)]
    removed = ordered[:-1] if keep_newest else ordered
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return removed


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # a file system that cannot open folders: the rename is done anyway
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)

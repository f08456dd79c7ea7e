"""One process per run folder: an exclusive lock that a crashed process cannot leave stuck.

``cofr fit`` takes the lock of its run folder before it creates an MLflow run or writes a
checkpoint, and holds it until the fit ends. It is a
:class:`~cofrgenet.folder_lock.FolderLock` on ``<run>/.lock``: a crash or a ``kill -9``
never leaves a folder locked, and the file says who holds it, for the error a second
``cofr fit`` on the same folder gets. Only global rank 0 of a distributed run takes it
(the other ranks share rank 0's folder).
"""

from __future__ import annotations

import errno
from pathlib import Path

import lightning as L

from cofrgenet.atomic import why_no_folder
from cofrgenet.errors import UserError
from cofrgenet.folder_lock import FolderLock

LOCK_FILE = ".lock"


class RunFolderBusyError(UserError, RuntimeError):
    """Another process holds the run folder."""


class RunLock:
    """The exclusive lock of one run folder (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._lock = FolderLock(self.path)

    @property
    def held(self) -> bool:
        return self._lock.held

    def acquire(self) -> None:
        """Take the lock or raise RunFolderBusyError naming the holder."""
        if self.held:
            return
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # --run.runs_dir under a file, a read-only disk
            raise UserError(
                f"cannot make the run folder {self.run_dir}: "
                f"{why_no_folder(self.run_dir, error)}; choose another --run.runs_dir"
            ) from None
        try:
            taken = self._lock.try_acquire()
        except OSError as error:  # a read-only run folder (a resume of one), no locks
            fix = (
                "make it writable"
                if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
                else "its file system may not lock files"
            )
            raise UserError(
                f"cannot write in the run folder {self.run_dir}: {error.strerror}; {fix}, "
                "or choose another --run.runs_dir"
            ) from None
        if not taken:
            raise RunFolderBusyError(
                f"run folder {self.run_dir} is in use by {self.describe_holder()}: wait "
                "for it to finish, or start a separate run with another --run.name"
            )

    def describe_holder(self) -> str:
        """Who holds the lock, as the holder wrote it: ``process 12 on host since ...``."""
        return self._lock.describe_holder()

    def try_acquire(self) -> bool:
        """Take the lock of an existing run folder; False when another process holds it."""
        return self._lock.try_acquire()

    def release(self, remove: bool = False) -> None:
        """Let go of the lock; ``remove`` also deletes the lock file, while still holding
        it (deleted after the release, a start that took it in between would hold a file
        no one else sees, and a third start could take the folder too)."""
        self._lock.release(remove=remove)


class HoldRunLock(L.Callback):
    """Keeps a taken RunLock for the length of a fit and releases it at the end."""

    def __init__(self, lock: RunLock) -> None:
        self.lock = lock

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.lock.release()

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self.lock.release()

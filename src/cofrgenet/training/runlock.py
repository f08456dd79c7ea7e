"""One process per run folder: an exclusive lock that a crashed process cannot leave stuck.

``cofr fit`` takes the lock of its run folder before it creates an MLflow run or writes a
checkpoint, and holds it until the fit ends. It is an ``flock`` on ``<run>/.lock``: the
kernel drops it when the holding process exits, however it exits, so a crash or a
``kill -9`` never leaves a folder locked. The file says who holds it, for the error a
second ``cofr fit`` on the same folder gets. Only global rank 0 of a distributed run
takes it (the other ranks share rank 0's folder).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import lightning as L

from cofrgenet.atomic import why_no_folder
from cofrgenet.errors import UserError
from cofrgenet.redact import hide_passwords

LOCK_FILE = ".lock"


class RunFolderBusyError(UserError, RuntimeError):
    """Another process holds the run folder."""


class RunLock:
    """The exclusive lock of one run folder (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def holder(self) -> dict[str, Any]:
        """What the holder wrote into the lock file (empty if unreadable)."""
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

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
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunFolderBusyError(self._busy_message()) from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": dt.datetime.now().isoformat(timespec="seconds"),
            "command": hide_passwords(" ".join(["cofr", *sys.argv[1:]]))[:500],  # 0644
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(me) + "\n").encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def _busy_message(self) -> str:
        info = self.holder()
        who = f"process {info.get('pid', '?')} on {info.get('host', '?')}"
        since = f" since {info['since']}" if "since" in info else ""
        command = f" ({info['command']})" if info.get("command") else ""
        return (
            f"run folder {self.run_dir} is in use by {who}{since}{command}: wait for it to "
            "finish, or start a separate run with another --run.name"
        )


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

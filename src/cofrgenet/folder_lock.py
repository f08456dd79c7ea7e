"""One writer per folder: an exclusive lock that a crashed process cannot leave stuck.

An ``flock`` on a file in the folder: the kernel drops it when the holding process
exits, however it exits, so a crash or a ``kill -9`` never leaves a folder locked. The
file says who holds it (process, host, since, command), for the error a second writer
gets. Users: ``cofr fit``'s run folder (:mod:`cofrgenet.training.runlock`) and ``cofr
data prepare``'s --out, ``cofr ui``'s port. :func:`waiting_for` is the blocking kind, for a short critical
section between processes (sweep workers creating one MLflow store or report).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cofrgenet.redact import shown_command_line

#: The most characters of the holder's command line a lock file keeps.
LOCK_COMMAND_CHARS = 500


class FolderLock:
    """The exclusive lock held on ``path`` (a file, made if missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
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

    def describe_holder(self) -> str:
        """``process 12 on host since 2026-12-04T03:00:00 (cofr fit ...)``, for errors."""
        info = self.holder()
        since = f" since {info['since']}" if "since" in info else ""
        command = f" ({info['command']})" if info.get("command") else ""
        return f"process {info.get('pid', '?')} on {info.get('host', '?')}{since}{command}"

    def try_acquire(self) -> bool:
        """Take the lock; False when another process holds it. Raises OSError when the
        lock file cannot be made."""
        if self.held:
            return True
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            except OSError:  # a file system that cannot lock (ENOLCK): not held, not leaked
                os.close(fd)
                raise
            # A holder that removed the file on release (release(remove=True)) may have
            # done so between our open and our flock: then we hold a file no one else
            # sees, and must lock the one at the path now.
            if _same_file(self.path, fd):
                break
            os.close(fd)
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": dt.datetime.now().isoformat(timespec="seconds"),
            "command": shown_command_line()[:LOCK_COMMAND_CHARS],  # the file is 0644
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(me) + "\n").encode())
        self._fd = fd
        return True

    def release(self, remove: bool = False) -> None:
        """Let go of the lock; ``remove`` also deletes the lock file if it is still the
        one held (safe: a process that opened it before checks, after its flock, that it
        is still the file at the path)."""
        if self._fd is None:
            return
        try:
            if remove and _same_file(self.path, self._fd):
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None


def held_now(path: str | os.PathLike[str]) -> bool | None:
    """Whether a process holds the lock at ``path`` now (a shared ``flock`` probe, let go
    at once: the holder's file is neither made nor written); None when there is no lock
    file or the file system cannot lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


def _same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd`` (not one made since in its place)."""
    try:
        at_path, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)


#: What flock fails with on a file system that cannot lock files (Lustre mounted with
#: noflock: ENOSYS; some NFS and FUSE mounts: EOPNOTSUPP, ENOLCK).
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)
#: The lock files :func:`waiting_for` has warned of going unlocked (once each per process).
_WARNED_UNLOCKABLE: set[str] = set()


@contextlib.contextmanager
def waiting_for(path: str | os.PathLike[str], what: str | None = None) -> Iterator[bool]:
    """Hold an exclusive flock on ``path`` (made, with its folder, if missing) for the
    block, waiting while another process holds it; yields whether the lock is held.

    Where the file system cannot lock files (:data:`NO_FLOCK`), the OSError is raised,
    unless ``what`` says what the lock guards: then the block runs without it, with one
    warning per lock file that ``what`` goes unguarded (processes doing it at once may
    each do it), which beats a traceback on every start."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as error:
            if what is None or error.errno not in NO_FLOCK:
                raise
            if str(path) not in _WARNED_UNLOCKABLE:
                _WARNED_UNLOCKABLE.add(str(path))
                logging.getLogger("cofrgenet").warning(
                    f"{path}: this file system cannot lock files ({error.strerror}): "
                    f"{what} without a lock"
                )
            locked = False
        else:
            locked = True
        try:
            yield locked
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


class ReadersLock:
    """Many readers or one replacer of a folder: a shared ``flock`` that training runs
    hold on their data folder, which ``cofr data prepare --overwrite`` must take alone
    before it replaces the folder's files (a run streaming it would read the new chunks
    through the old index). Where the lock file cannot be made (a read-only folder),
    nothing is locked: nothing can replace the files there either."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def _open(self) -> int | None:
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):
            try:
                return os.open(self.path, flags, 0o644)
            except OSError:
                continue
        return None

    def _take(self, mode: int) -> bool:
        """Take the lock in ``mode`` without waiting: False when it is held otherwise."""
        if self._fd is not None:
            return True
        fd = self._open()
        if fd is None:
            return True
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:  # a file system without flock: as a read-only one
            os.close(fd)
            return True
        self._fd = fd
        _HELD_READER_FDS.add(fd)
        return True

    def read(self) -> bool:
        """Take a reader's share; False while a replacer holds the folder."""
        return self._take(fcntl.LOCK_SH)

    def replace(self) -> bool:
        """Take the folder alone; False while any reader holds it."""
        return self._take(fcntl.LOCK_EX)

    def release(self) -> None:
        if self._fd is not None:
            _HELD_READER_FDS.discard(self._fd)
            os.close(self._fd)  # closing drops the flock
            self._fd = None


#: The descriptors of this process's readers locks: a forked child (a data loader
#: worker) shares their flock until it closes its copies.
_HELD_READER_FDS: set[int] = set()


def close_inherited_reader_locks() -> None:
    """In a forked child: close the copies of the parent's readers locks, so that the
    folder is free once the parent lets go (or dies), not when the child exits too."""
    for fd in list(_HELD_READER_FDS):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_READER_FDS.clear()

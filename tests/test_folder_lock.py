"""The one-writer-per-folder lock (run folders, data folders)."""

from __future__ import annotations

import fcntl
import os
import shlex
import sys

from cofrgenet.folder_lock import FolderLock


def test_one_holder_at_a_time_and_who_it_is(tmp_path):
    first, second = FolderLock(tmp_path / ".lock"), FolderLock(tmp_path / ".lock")
    assert first.try_acquire() and first.held
    assert not second.try_acquire() and not second.held
    assert second.describe_holder().startswith(f"process {os.getpid()} on ")
    first.release(remove=True)
    assert not (tmp_path / ".lock").exists()
    assert second.try_acquire()
    second.release()
    assert (tmp_path / ".lock").exists()  # kept unless asked: flock needs no cleanup


def test_a_lock_file_removed_between_open_and_flock_is_not_taken(tmp_path, monkeypatch):
    """A holder that removes the file on release, between a second process's open and
    its flock, would leave that process holding a file no one else sees: a third
    process would make a new one and hold it too."""
    path = tmp_path / ".lock"
    real_flock = fcntl.flock
    removed: list[int] = []

    def flock_after_a_removal(fd: int, operation: int) -> None:
        if not removed:  # the holder's release(remove=True) lands right here, once
            removed.append(fd)
            path.unlink()
        real_flock(fd, operation)

    path.touch()
    monkeypatch.setattr(fcntl, "flock", flock_after_a_removal)
    lock = FolderLock(path)
    assert lock.try_acquire() and removed
    assert not FolderLock(path).try_acquire()  # the file at the path is the one held


def test_a_release_removes_only_its_own_lock_file(tmp_path):
    """A holder whose file was replaced (removed, then made and taken by another) deleted
    the other's on release: a third process could then take a lock beside the second."""
    path = tmp_path / ".lock"
    first = FolderLock(path)
    assert first.try_acquire()
    path.unlink()  # gone while held (a cleanup that should not have touched it)
    second = FolderLock(path)
    assert second.try_acquire()
    first.release(remove=True)
    assert path.exists() and not FolderLock(path).try_acquire()  # still the second's


def test_a_run_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A resume of a read-only run folder ended in a PermissionError traceback."""
    import pytest

    from cofrgenet.errors import UserError
    from cofrgenet.training.runlock import RunLock

    def read_only(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(FolderLock, "try_acquire", read_only)
    with pytest.raises(UserError, match=r"run folder .*run: Permission denied; make it writable"):
        RunLock(tmp_path / "run").acquire()

    def no_locks(self):
        raise OSError(37, "No locks available")  # ENOLCK: a file system that cannot lock

    monkeypatch.setattr(FolderLock, "try_acquire", no_locks)
    with pytest.raises(UserError, match=r"No locks available; its file system may not lock"):
        RunLock(tmp_path / "run").acquire()


def test_the_holders_command_is_quoted_to_paste_back(tmp_path, monkeypatch):
    """A refused second writer is shown the holder's command: a glob in it was unquoted,
    and pasted back the shell expanded it into other arguments."""
    corpus = f"{tmp_path}/corpus/*.txt"
    argv = ["/venv/bin/cofr", "data", "prepare", "--glob", corpus, "--out", str(tmp_path / "o")]
    monkeypatch.setattr(sys, "argv", argv)
    lock = FolderLock(tmp_path / "lock")
    assert lock.try_acquire()
    try:
        command = FolderLock(tmp_path / "lock").holder()["command"]
        assert shlex.split(command) == ["cofr", *argv[1:]]
        assert f"'{corpus}'" in command
    finally:
        lock.release()

"""SIGTERM as an exception, for the commands that clean up after themselves.

SLURM's time limit and ``scancel`` end a job with SIGTERM, whose default action stops
the process where it is: no ``finally`` runs, and a half-written folder stays. Inside
:func:`sigterm_raises`, SIGTERM raises instead (as Ctrl-C raises KeyboardInterrupt), so
the command's cleanups run on the way out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


class Terminated(SystemExit):
    """SIGTERM, raised where the process was: the process exits with 128 + 15 = 143. A
    SystemExit, so that no ``except Exception`` on the way takes it for an error."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_raises(make: Callable[[], BaseException] = Terminated) -> Iterator[None]:
    """While inside, SIGTERM raises ``make()``; the handler from before is put back on
    leaving. Outside the main thread (where handlers cannot be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_it(signum: int, frame: Any) -> None:
        raise make()

    previous = signal.signal(signal.SIGTERM, raise_it)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held(*signums: int) -> Iterator[set[int]]:
    """While inside, the first of each of ``signums`` is noted, not acted on, so that a
    short piece of work (writing results that exist) finishes; the set yielded holds those
    that came, for the caller to act on after. A second one of the same signal acts at
    once: KeyboardInterrupt for SIGINT, :class:`Terminated` for SIGTERM. A signal the
    process ignores stays ignored, and the handlers from before are put back on leaving.
    Outside the main thread nothing is held."""
    arrived: set[int] = set()
    if threading.current_thread() is not threading.main_thread():
        yield arrived
        return

    def note(signum: int, frame: Any) -> None:
        if signum not in arrived:
            arrived.add(signum)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated()

    # One the process ignores (started under nohup, in the background) stays ignored.
    held = [signum for signum in signums if signal.getsignal(signum) != signal.SIG_IGN]
    previous = {signum: signal.signal(signum, note) for signum in held}
    try:
        yield arrived
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def lightning_sigterm() -> BaseException:
    """The SIGTERMException Lightning raises when SIGTERM stops a fit, exit status 143:
    what SIGTERM raises outside a fit in commands that end as a fit stopped by it does
    (``sigterm_raises(lightning_sigterm)``)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return SIGTERMException(128 + signal.SIGTERM)


#: The signals :func:`run_passing_signals` passes on: Ctrl-C, ``kill`` and SLURM's end,
#: and a closed terminal's hang-up.
PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def run_passing_signals(command: Sequence[str]) -> tuple[int, int | None]:
    """Run ``command`` to its end: (its exit status, the last signal passed on to it, or
    None if none came).

    The :data:`PASSED_ON` signals that reach this process go on to the command, once each
    time, and its end is waited for: it acts on them itself (``cofr fit`` stops after its
    step and saves, and marks its MLflow run), where ``subprocess.run`` kills it 0.25 s
    after a Ctrl-C and leaves it running, orphaned, on SIGTERM. It runs in a process group
    of its own, so that a terminal's Ctrl-C, which goes to the whole foreground group,
    reaches it once, through here (a second one aborts a fit at once). A signal this
    process ignores stays ignored. Outside the main thread: ``subprocess.run``'s way.
    """
    if threading.current_thread() is not threading.main_thread():
        return subprocess.run(list(command), check=False).returncode, None
    # Popen's process_group is Python 3.11's; setpgrp in the child is the same.
    own_group: dict[str, Any] = (
        {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    )
    passed: list[int] = []
    waiting: list[int] = []  # arrived before the process existed
    process: subprocess.Popen | None = None

    def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has ended meanwhile
            assert process is not None
            process.send_signal(signum)

    def pass_on(signum: int, frame: Any) -> None:
        passed.append(signum)
        if process is None:
            waiting.append(signum)
        else:
            send(signum)

    caught = [s for s in PASSED_ON if signal.getsignal(s) != signal.SIG_IGN]
    previous = {signum: signal.signal(signum, pass_on) for signum in caught}
    try:
        process = subprocess.Popen(list(command), **own_group)
        while waiting:  # one arriving now goes straight to it
            send(waiting.pop(0))
        status = process.wait()  # restarted after each handler (PEP 475)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status, (passed[-1] if passed else None)

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

    # Made once now: made first in the handler, in the middle of an import of the
    # command's (Lightning's own, at start-up), ``make``'s import of its exception's
    # module would meet modules half made and fail, or be taken for an optional
    # import's failure and the signal lost.
    make()
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


def signal_name(status: int) -> str:
    """``SIGTERM`` for the exit status 143 (128 + the signal), ``Ctrl-C`` for 130."""
    if status == 128 + signal.SIGINT:
        return "Ctrl-C"
    try:
        return signal.Signals(status - 128).name
    except ValueError:
        return f"signal {status - 128}"


def stopped_by(error: BaseException) -> str:
    """What ended a long command early, as its partial report says it: ``Ctrl-C``,
    ``SIGTERM`` (an exit status above 128), else the error in one line."""
    if isinstance(error, KeyboardInterrupt):
        return "Ctrl-C"
    if isinstance(error, SystemExit) and isinstance(error.code, int) and error.code > 128:
        return signal_name(error.code)
    return f"an error ({type(error).__name__}: {(str(error).strip() or '?').splitlines()[0]})"


def lightning_sigterm() -> BaseException:
    """The SIGTERMException Lightning raises when SIGTERM stops a fit, exit status 143:
    what SIGTERM raises outside a fit in commands that end as a fit stopped by it does
    (``sigterm_raises(lightning_sigterm)``)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return SIGTERMException(128 + signal.SIGTERM)


#: The signals :func:`run_passing_signals` passes on: Ctrl-C, and ``kill``'s and SLURM's
#: end.
PASSED_ON = (signal.SIGINT, signal.SIGTERM)


def in_terminal_foreground() -> bool:
    """Whether this process's group is the foreground group of its controlling terminal:
    a Ctrl-C typed there reaches every process of the group, children included, itself."""
    try:
        terminal = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:  # no controlling terminal (a batch job, a pipe, setsid)
        return False
    try:
        return os.tcgetpgrp(terminal) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(terminal)


def run_passing_signals(command: Sequence[str]) -> tuple[int, int | None]:
    """Run ``command`` to its end: (its exit status, the last :data:`PASSED_ON` signal
    that reached this process meanwhile, or None).

    Such a signal reaches the command once, and its end is waited for: it acts on it
    itself (``cofr fit`` stops after its step, saves and marks its MLflow run KILLED),
    where ``subprocess.run`` kills it 0.25 s after a Ctrl-C and leaves it running,
    orphaned, on SIGTERM. SIGTERM is passed on (a second one changes nothing for a fit).
    SIGINT is passed on unless this process is in its terminal's foreground group: a
    Ctrl-C typed there reaches the command too, and a second one would abort a fit at
    once. The command stays in this process's group, so the terminal's job control
    (Ctrl-Z, Ctrl-\\, a hang-up) and a signal to the whole group act on both, as before.
    A ``kill -INT`` of this process alone, while it is a terminal's foreground job, is
    not passed on. A signal this process ignores stays ignored. Outside the main thread:
    ``subprocess.run``'s way.
    """
    if threading.current_thread() is not threading.main_thread():
        return subprocess.run(list(command), check=False).returncode, None
    came: list[int] = []
    waiting: list[int] = []  # to pass on once the process exists
    process: subprocess.Popen | None = None

    def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it has ended meanwhile
            assert process is not None
            process.send_signal(signum)

    def pass_on(signum: int, frame: Any) -> None:
        came.append(signum)
        if signum == signal.SIGINT and in_terminal_foreground():
            return  # the terminal sent it to the command as well
        if process is None:
            waiting.append(signum)
        else:
            send(signum)

    # Not one the process ignores, nor one whose handler Python did not set (None:
    # it could not be put back).
    caught = [s for s in PASSED_ON if signal.getsignal(s) not in (signal.SIG_IGN, None)]
    previous = {signum: signal.signal(signum, pass_on) for signum in caught}
    try:
        process = subprocess.Popen(list(command))
        while waiting:  # one arriving now goes straight to it
            send(waiting.pop(0))
        status = process.wait()  # restarted after each handler (PEP 475)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status, (came[-1] if came else None)

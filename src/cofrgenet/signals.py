"""SIGTERM as an exception, for the commands that clean up after themselves.

SLURM's time limit and ``scancel`` end a job with SIGTERM, whose default action stops
the process where it is: no ``finally`` runs, and a half-written folder stays. Inside
:func:`sigterm_raises`, SIGTERM raises instead (as Ctrl-C raises KeyboardInterrupt), so
the command's cleanups run on the way out.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
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

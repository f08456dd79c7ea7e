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


def lightning_sigterm() -> BaseException:
    """The SIGTERMException Lightning raises when SIGTERM stops a fit, exit status 143:
    what SIGTERM raises outside a fit in commands that end as a fit stopped by it does
    (``sigterm_raises(lightning_sigterm)``)."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    return SIGTERMException(128 + signal.SIGTERM)

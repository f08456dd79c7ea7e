"""SIGTERM as an exception, and signals held while results are written."""

import os
import signal

import pytest

from cofrgenet.signals import Terminated, signals_held, sigterm_raises


@pytest.fixture
def handlers_back():
    """Every test here sets handlers: put SIGINT's and SIGTERM's back after it."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_sigterm_raises_inside_and_puts_the_handler_back(handlers_back):
    def earlier(signum, frame):
        pass

    signal.signal(signal.SIGTERM, earlier)
    with pytest.raises(Terminated) as raised, sigterm_raises():
        os.kill(os.getpid(), signal.SIGTERM)
    assert raised.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is earlier


def test_held_signals_wait_for_the_block_and_are_named_after_it(handlers_back):
    done = []
    with signals_held(signal.SIGINT, signal.SIGTERM) as arrived:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        done.append("written")  # the work after the signals still runs
    assert done == ["written"]
    assert arrived == {signal.SIGINT, signal.SIGTERM}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize(
    ("signum", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)]
)
def test_a_second_held_signal_acts_at_once(handlers_back, signum, raised):
    done = []
    with pytest.raises(raised), signals_held(signal.SIGINT, signal.SIGTERM):
        os.kill(os.getpid(), signum)
        done.append("after the first")
        os.kill(os.getpid(), signum)
        done.append("after the second")
    assert done == ["after the first"]


def test_nothing_held_is_an_empty_set(handlers_back):
    with signals_held(signal.SIGTERM) as arrived:
        pass
    assert arrived == set()


def test_an_ignored_signal_stays_ignored(handlers_back):
    """A process started with SIGINT ignored (nohup, a background job) stopped with 130."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with signals_held(signal.SIGINT, signal.SIGTERM) as arrived:
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)
    assert arrived == set() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN

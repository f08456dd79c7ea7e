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


#: A child that counts the SIGINTs and SIGTERMs it gets, says when it is ready, and ends
#: 0.5 s after the first with 128 + its number (as a fit ends after its step's save).
COUNTING_CHILD = """
import signal, sys, time
got = []
def note(signum, frame):
    got.append(signum)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, note)
import os
open(sys.argv[1], "w").write(str(os.getpgrp()))
while not got:
    time.sleep(0.01)
time.sleep(0.5)
open(sys.argv[2], "w").write(" ".join(str(s) for s in got))
sys.exit(128 + got[0])
"""

#: A parent that runs the counting child through run_passing_signals and prints what it
#: returned.
PASSING_PARENT = """
import os, sys
from cofrgenet.signals import run_passing_signals
status, signum = run_passing_signals([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(status, signum, os.getpgrp())
"""


@pytest.mark.parametrize(
    ("signum", "whole_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c-at-a-terminal", "kill"],
)
def test_a_signal_reaches_the_command_once_and_is_waited_for(tmp_path, signum, whole_group):
    """cofr demo ran its fits with subprocess.run: a Ctrl-C killed the fit 0.25 s later,
    before it could save (its MLflow run stayed RUNNING), and a SIGTERM left it training,
    orphaned. A terminal's Ctrl-C goes to the whole foreground group (``whole_group``):
    the command, in a group of its own, gets it once, through the parent."""
    import subprocess
    import sys
    import time

    ready, got = tmp_path / "ready", tmp_path / "got"
    parent = subprocess.Popen(
        [sys.executable, "-c", PASSING_PARENT, COUNTING_CHILD, str(ready), str(got)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a shell's foreground job has
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    if whole_group:
        os.killpg(parent.pid, signum)
    else:
        os.kill(parent.pid, signum)
    out, _ = parent.communicate(timeout=60)
    assert got.read_text() == str(int(signum))  # once, and it had time to finish
    status, passed, parent_group = out.split()
    assert (status, passed) == (str(128 + signum), str(int(signum)))
    # Two Ctrl-Cs close together may reach a process as one: its own group is what
    # keeps a terminal's from reaching it beside the one passed on.
    assert ready.read_text() != parent_group

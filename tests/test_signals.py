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
    before = signal.getsignal(signal.SIGINT)  # an earlier in-process fit's StopOnSignal's
    done = []
    with signals_held(signal.SIGINT, signal.SIGTERM) as arrived:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        done.append("written")  # the work after the signals still runs
    assert done == ["written"]
    assert arrived == {signal.SIGINT, signal.SIGTERM}
    assert signal.getsignal(signal.SIGINT) is before


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


#: A child that notes the SIGINTs and SIGTERMs it gets, says when it is ready, and ends
#: 0.5 s after the first with 128 + its number (as a fit ends after its step's save).
COUNTING_CHILD = """
import signal, sys, time
got = []
def note(signum, frame):
    got.append(signum)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, note)
open(sys.argv[1], "w").write("ready")
while not got:
    time.sleep(0.01)
time.sleep(0.5)
sys.exit(128 + got[0])
"""

#: A parent that runs the counting child through run_passing_signals, noting each
#: signal it sends on, and prints what it returned and what it sent.
PASSING_PARENT = """
import subprocess, sys
from cofrgenet.signals import run_passing_signals
sent = []
send_signal = subprocess.Popen.send_signal
def noted(self, signum):
    sent.append(int(signum))
    send_signal(self, signum)
subprocess.Popen.send_signal = noted
status, signum = run_passing_signals([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print(status, signum, "sent", *sent)
"""


def _passing_parent(tmp_path, **popen):
    import subprocess
    import sys
    import time

    ready = tmp_path / "ready"
    parent = subprocess.Popen(
        [sys.executable, "-c", PASSING_PARENT, COUNTING_CHILD, str(ready)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a shell's job has
        **popen,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    return parent


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_a_signal_to_the_parent_alone_reaches_the_command_and_is_waited_for(tmp_path, signum):
    """cofr demo ran its fits with subprocess.run: a Ctrl-C killed the fit 0.25 s later,
    before it could save (its MLflow run stayed RUNNING), and a SIGTERM left it training,
    orphaned. A signal to the parent alone (kill, timeout, SLURM) is passed on once and
    the command's end waited for."""
    parent = _passing_parent(tmp_path)
    os.kill(parent.pid, signum)
    out, _ = parent.communicate(timeout=60)
    assert out.split() == [str(128 + signum), str(int(signum)), "sent", str(int(signum))]


def test_a_ctrl_c_typed_at_the_terminal_is_not_sent_twice(tmp_path):
    """A terminal's Ctrl-C reaches its whole foreground group, the command too: passed on
    as well, it would be the fit's second Ctrl-C, which aborts without saving."""
    import fcntl
    import pty
    import termios

    main, terminal = pty.openpty()

    def take_the_terminal():  # in the new session: the pty becomes its terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        parent = _passing_parent(tmp_path, stdin=terminal, preexec_fn=take_the_terminal)
        os.write(main, b"\x03")  # Ctrl-C, typed
        out, _ = parent.communicate(timeout=60)
    finally:
        os.close(main)
        os.close(terminal)
    assert out.split() == ["130", str(int(signal.SIGINT)), "sent"]  # got it, sent nothing


SIGTERM_MID_IMPORT = """
import importlib.abc, importlib.machinery, os, signal, sys
from cofrgenet.signals import lightning_sigterm, sigterm_raises

class TermInModuleBody(importlib.abc.MetaPathFinder):
    # SIGTERM as lightning.fabric.wrappers starts running: in sys.modules, half made.
    def find_spec(self, name, path, target=None):
        if name != "lightning.fabric.wrappers":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module
        def exec_module(module):
            os.kill(os.getpid(), signal.SIGTERM)
            run(module)
        spec.loader.exec_module = exec_module
        return spec

with sigterm_raises(lightning_sigterm):
    sys.meta_path.insert(0, TermInModuleBody())
    import lightning.pytorch
    os.kill(os.getpid(), signal.SIGTERM)  # where Lightning was imported before the block
print("went on")
"""


def test_a_sigterm_in_the_middle_of_lightnings_import_stops_the_command():
    """`cofr bench quality` stopped by SIGTERM in its first seconds went on to train to
    its end (exit 0) or died with an ImportError's traceback: the handler imported
    Lightning's exception while Lightning was being imported (modules half made: a
    circular-import ImportError, which an optional import's `except ImportError` may
    take). The exception's module is imported on entry: the command stops with 143."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_MID_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stdout) == (143, ""), done.stderr[-2000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_signal_while_the_program_exits_keeps_the_commands_status(tmp_path):
    """A Ctrl-C in the seconds the interpreter takes to exit after a complete `cofr sweep
    report` exited 130 (and, after `cofr: interrupted`, raised in torch's exit hooks: a
    traceback under the clean line). Once the command has ended, a signal ends the
    process at once with the command's status."""
    import subprocess
    import sys
    import time

    slow_exit = (
        "import atexit, multiprocessing, time\n"
        "from cofrgenet import cli\n"
        "def exiting():  # an exit hook that takes its time\n"
        "    print('exiting', flush=True)\n"
        "    time.sleep(60)\n"
        "def done():\n"
        "    spawn = multiprocessing.get_context('spawn')\n"
        "    child = spawn.Process(target=time.sleep, args=(60,), daemon=True)\n"
        "    child.start()  # a child the command left, as a data loader's worker\n"
        "    atexit.register(exiting)  # after multiprocessing's own hook: run before it\n"
        "    print(child.pid, flush=True)\n"
        "    return {status}\n"
        "if __name__ == '__main__':\n"
        "    cli.main = done\n"
        "    cli.entry()\n"
    )
    for status, signum in ((0, signal.SIGINT), (3, signal.SIGTERM), (130, signal.SIGINT)):
        started = time.monotonic()
        script = tmp_path / "slow_exit.py"  # spawn re-imports __main__: a file, not -c
        script.write_text(slow_exit.format(status=status))
        proc = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        child = int(proc.stdout.readline())
        assert proc.stdout.readline() == "exiting\n"  # in the exit hook
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == status and "Traceback" not in err, err
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 10
        while _alive(child):  # ended with the program, not left for a minute
            assert time.monotonic() < deadline, f"child {child} outlived the program"
            time.sleep(0.1)

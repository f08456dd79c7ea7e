"""A hub that cannot be reached: the local cache at once, not after ~25 s of retries."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cofrgenet import hub

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def online(monkeypatch):
    """As on a user's machine: not offline, no proxy, huggingface_hub not imported yet."""
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_ENDPOINT", hub.REASON_VARIABLE)
    for name in (*names, *hub._PROXY_VARIABLES):
        # Set first: a delenv of an unset variable records nothing to undo, and the
        # probe's own os.environ writes would outlive the test.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.delitem(sys.modules, "huggingface_hub", raising=False)
    return monkeypatch


def refused_endpoint() -> str:
    """An http address on this machine where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_hub_sets_offline_mode(online, capsys):
    online.setenv("HF_ENDPOINT", refused_endpoint())
    reason = hub.offline_unless_reachable()
    assert reason is not None and reason.startswith("127.0.0.1: ")
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert "reading the local cache only, as with HF_HUB_OFFLINE=1" in capsys.readouterr().err
    # A dataset's error says why the hub was not asked: not "HF_HUB_OFFLINE is set",
    # which the user never set.
    assert hub.offline_reason() == f"the hub did not answer: {reason}"
    # So does a process this one starts (a DDP rank), which inherits the switch.
    child = subprocess.run(
        [sys.executable, "-c", "from cofrgenet import hub; print(hub.offline_reason())"],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == f"the hub did not answer: {reason}"


def test_offline_reason_names_the_users_setting(online):
    assert hub.offline_reason() == ""
    online.setenv("HF_HUB_OFFLINE", "1")
    assert hub.offline_reason() == "HF_HUB_OFFLINE is set"


def test_a_reachable_hub_changes_nothing(online, capsys):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        online.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.offline_unless_reachable() is None
    assert "HF_HUB_OFFLINE" not in os.environ
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "setting",
    [
        ("HF_HUB_OFFLINE", "1"),
        ("HF_HUB_OFFLINE", "0"),
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("imported", ""),
    ],
    ids=["already offline", "online by choice", "proxy", "hub client imported"],
)
def test_the_probe_stands_aside(online, setting):
    """Offline already, online by the user's choice (HF_HUB_OFFLINE=0 was made 1), a
    proxy (a direct connection says nothing about it), or a hub client that has read its
    settings: nothing is probed or changed."""
    online.setenv("HF_ENDPOINT", refused_endpoint())
    name, value = setting
    if name == "imported":
        online.setitem(sys.modules, "huggingface_hub", object())
    else:
        online.setenv(name, value)
    assert hub.offline_unless_reachable() is None
    assert os.environ.get("HF_HUB_OFFLINE") == (value if name == "HF_HUB_OFFLINE" else None)


def timed_run(
    command: list[str], env: dict[str, str], cwd: Path | None = None
) -> tuple[float, subprocess.CompletedProcess[str]]:
    """(seconds, result) of ``command`` in a fresh process."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=cwd)
    return time.perf_counter() - start, done


def probe_fails_at_once(command: list[str], env: dict[str, str], cwd: Path | None = None) -> str:
    """``command``'s stderr, once it is held to fail about as fast as the same start-up
    told to stay offline (HF_HUB_OFFLINE=1): the hub's retries took ~25 s more. Timed
    against that, not a fixed limit, which failed on a loaded 2-core CI machine."""
    offline, _ = timed_run(command, {**env, "HF_HUB_OFFLINE": "1"}, cwd)
    elapsed, done = timed_run(command, env, cwd)
    assert done.returncode != 0
    assert "Retrying in" not in done.stderr
    assert elapsed < offline + 12, f"{elapsed:.1f} s, {offline:.1f} s offline"
    return done.stderr


def test_an_evaluation_set_without_hub_or_cache_fails_at_once(tmp_path):
    """The whole path, in a fresh process (the hub client not imported yet), with an
    empty cache: the error comes in seconds, where the hub's retries took ~25 s."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", *hub._PROXY_VARIABLES)
    }
    env.update(
        HF_ENDPOINT=refused_endpoint(),
        HF_HOME=str(tmp_path / "hf"),
        PYTHONPATH=str(SRC),
    )
    code = (
        "from cofrgenet.eval.tasks import get_task, read_rows\n"
        f"read_rows(get_task('wikitext-2'), 'test', {str(tmp_path / 'eval')!r})\n"
    )
    stderr = probe_fails_at_once([sys.executable, "-c", code], env)
    assert "EvalDataNotFound: wikitext-2: no file" in stderr
    # The probe set HF_HUB_OFFLINE, not the user: said as what happened.
    assert "could not be loaded (the hub did not answer: 127.0.0.1:" in stderr
    assert "HF_HUB_OFFLINE is set" not in stderr


def test_glue_from_the_hub_without_hub_or_cache_fails_at_once(tmp_path):
    """`cofr finetune glue` without --data-dir, as a user runs it: its option checks
    import Lightning (hence the hub's client) before the data, so the probe comes first."""
    import zipfile

    ckpt = tmp_path / "model.ckpt"
    with zipfile.ZipFile(ckpt, "w") as archive:  # the data is read before the checkpoint
        archive.writestr("archive/data.pkl", b"")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", *hub._PROXY_VARIABLES)
    }
    env.update(HF_ENDPOINT=refused_endpoint(), HF_HOME=str(tmp_path / "hf"))
    command = [sys.executable, "-m", "cofrgenet.cli", "finetune", "glue", "--task", "rte"]
    command += ["--ckpt", str(ckpt), "--no-mlflow", "--accelerator", "cpu"]
    assert "reading the local cache only" in probe_fails_at_once(command, env, tmp_path)

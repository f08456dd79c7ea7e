"""`cofr demo` end to end (the README's main job), on a few steps."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_prepares_trains_both_and_prints_the_table(tmp_path):
    command = [
        sys.executable,
        "-m",
        "cofrgenet.cli",
        "demo",
        "--max-steps",
        "4",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--data-dir",
        str(tmp_path / "data" / "pydoc-byte"),
    ]
    # From another folder: the default configs are the checkout's.
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "data" / "pydoc-byte" / "meta.json").exists()
    [summary] = (tmp_path / "runs").glob("demo-*.md")
    rows = [
        line
        for line in summary.read_text().splitlines()
        if line.startswith("| ") and "preset" not in line
    ]
    assert [row.split("|")[2].strip() for row in rows] == ["gpt2-mini", "gpt2-mini-f"]
    for row in rows:
        val_loss = float(row.split("|")[6])
        assert 0 < val_loss < 10
    assert "cofr ui" in result.stdout


def test_a_failing_step_is_named_without_a_traceback(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text("{}")  # taken for prepared: the fit's own check refuses it
    command = [sys.executable, "-m", "cofrgenet.cli", "demo", "--max-steps", "1",
               "--runs-dir", str(tmp_path / "runs"), "--data-dir", str(data)]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out[-3000:]
    assert (
        "cofr demo: stopped: `cofr fit --config conf/experiment/demo-gpt2.yaml ...` failed" in out
    )
    assert "Traceback" not in out and "CalledProcessError" not in out


def test_a_missing_config_is_refused_before_the_data_is_made(tmp_path, capsys, monkeypatch):
    from cofrgenet.cli import main
    from cofrgenet.recipes import CHECKOUT, bundled

    monkeypatch.chdir(tmp_path)  # not the repository root: conf/... is the checkout's
    assert bundled("conf/experiment/demo-gpt2.yaml") == CHECKOUT / "conf/experiment/demo-gpt2.yaml"
    assert bundled("nope.yaml") == Path("nope.yaml")
    data = tmp_path / "data"
    assert main(["demo", "--configs", "nope.yaml", "--data-dir", str(data)]) == 2
    assert "cofr demo: error: --configs: no config file nope.yaml; give its path" in (
        capsys.readouterr().err
    )
    assert not data.exists()
    # A typo of a bundled one, from any folder: the closest name in its folder.
    typo = "conf/experiment/demo-cofrgenet-ff.yaml"
    assert main(["demo", "--configs", typo, "--data-dir", str(data)]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"no config file {typo} (did you mean 'conf/experiment/demo-cofrgenet-f.yaml'?)")
    )
    assert not data.exists()


def test_own_configs_train_on_their_own_data_and_names_stay_apart(tmp_path, monkeypatch):
    """`--configs` of other experiments: no --data.data_dir of the demo's pydoc bytes (the
    fit read data/pydoc-byte instead of the config's own), nothing prepared, and two
    files of one name get a run folder each."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main

    fits = []

    def fake_run(command):
        if command[3] == "fit":
            fits.append(command)
            name = command[command.index("--run.name") + 1]
            (tmp_path / "runs" / "exp" / name).mkdir(parents=True)
        elif command[3] != "validate":
            raise AssertionError(f"ran {command[3:6]}")
        return 0, None

    monkeypatch.setattr(demo, "run_passing_signals", fake_run)
    monkeypatch.setattr(demo, "collect", lambda run_dir, minutes, runs_dir: demo.DemoResult(
        run_dir.name, "p", 1, 0, float("nan"), 1.0, 2.7, minutes, run_dir, "pydoc, bpe"
    ))  # fmt: skip
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.yaml").write_text("model: {preset: gpt2-tiny}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--configs", "a/mine.yaml", "b/mine.yaml", "--runs-dir", "runs"]) == 0
    assert all("--data.data_dir" not in command for command in fits)
    assert not (tmp_path / "data").exists()
    names = [command[command.index("--run.name") + 1].rsplit("-", 2)[0] for command in fits]
    assert names == ["mine-1", "mine-2"]
    [summary] = (tmp_path / "runs").glob("demo-*.md")
    assert "| p | 1 | 0 | - | 1.000 | 2.70 |" in summary.read_text()  # nothing logged: "-"


def test_the_saved_table_states_what_was_measured(tmp_path, monkeypatch):
    """runs/demo-<stamp>.md held the table alone: no command, machine, data, steps or seed
    (the console's "(data: pydoc, byte)" was dropped too)."""
    import cofrgenet.demo as demo
    from cofrgenet.bench.machine import machine_summary
    from cofrgenet.cli import main

    def train(config, name, args, console, log_every=None):
        (Path(args.runs_dir) / "exp" / name).mkdir(parents=True)
        return 0.5

    def collect(run_dir, minutes, runs_dir):
        steps = "4" if run_dir.name.startswith("mine-1") else "6"
        return demo.DemoResult(
            run_dir.name, "p", 1, 0, 900.0, 1.0, 2.7, minutes, run_dir, "pydoc, byte", 3,
            trained=f"{steps} steps of 2 x 8 tokens, seed 7", data_dir="data/x",
        )  # fmt: skip

    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "collect", collect)
    monkeypatch.chdir(tmp_path)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mine.yaml").write_text("model: {preset: gpt2-tiny}\n")
    assert main(["demo", "--configs", "a/mine.yaml", "b/mine.yaml", "--runs-dir", "runs"]) == 0
    [summary] = (tmp_path / "runs").glob("demo-*.md")
    text = summary.read_text()
    assert text.startswith(f"# cofr demo, {summary.stem[5:9]}-{summary.stem[9:11]}-")
    assert "- command: `cofr demo --configs a/mine.yaml b/mine.yaml --runs-dir runs`" in text
    assert f"- machine: {machine_summary('cpu')}\n" in text
    assert "- data: pydoc, byte (data/x)\n" in text
    names = [line.split(" | ")[0][2:] for line in text.splitlines() if "| p |" in line]
    assert (
        f"- trained: {names[0]}: 4 steps of 2 x 8 tokens, seed 7; "
        f"{names[1]}: 6 steps of 2 x 8 tokens, seed 7\n"
    ) in text
    assert "| 900 | 1.000 | 2.70 | 0.5 |" in text and "tokens/s (median): of the rates" in text


def test_a_short_demo_logs_enough_rates_for_its_tokens_per_s(tmp_path, monkeypatch):
    """`cofr demo --max-steps 4` logged no tokens/s (the configs log every 10 steps), and
    its table read "-": a shorter run logs often enough for three rates."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main

    assert demo.rate_log_interval({"max_steps": 4, "log_every_n_steps": 10}) == 1
    assert demo.rate_log_interval({"max_steps": 20, "log_every_n_steps": 10}) == 6
    assert demo.rate_log_interval({"max_steps": 300, "log_every_n_steps": 10}) is None
    assert demo.rate_log_interval({"max_steps": -1, "log_every_n_steps": 50}) is None
    fits = []

    def fake_run(command):
        if command[3] == "fit":
            fits.append(command)
            name = command[command.index("--run.name") + 1]
            (tmp_path / "runs" / "demo" / name).mkdir(parents=True, exist_ok=True)  # 2 demos
        return 0, None

    monkeypatch.setattr(demo, "run_passing_signals", fake_run)
    monkeypatch.setattr(demo, "ensure_data", lambda data_dir, console: None)
    monkeypatch.setattr(demo, "collect", lambda run_dir, minutes, runs_dir: demo.DemoResult(
        run_dir.name, "p", 1, 0, 1.0, 1.0, 2.7, minutes, run_dir, "pydoc, byte"
    ))  # fmt: skip
    runs = str(tmp_path / "runs")
    assert main(["demo", "--max-steps", "4", "--runs-dir", runs]) == 0
    assert len(fits) == 2
    assert all(c[c.index("--trainer.log_every_n_steps") + 1] == "1" for c in fits)
    fits.clear()
    assert main(["demo", "--runs-dir", runs]) == 0  # 300 steps: the configs' own 10
    assert len(fits) == 2 and not any("--trainer.log_every_n_steps" in c for c in fits)


def test_one_of_the_demo_configs_alone_still_gets_its_data_made(tmp_path, monkeypatch):
    """`cofr demo --configs conf/experiment/demo-gpt2.yaml` skipped the data it needs."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main

    made = []
    monkeypatch.setattr(demo, "ensure_data", lambda data_dir, console: made.append(data_dir))

    def train(config, name, args, console, log_every=None):  # the fit's folder, its minutes
        (tmp_path / "runs" / "exp" / name).mkdir(parents=True)
        return 0.0

    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "collect", lambda run_dir, minutes, runs_dir: demo.DemoResult(
        run_dir.name, "p", 1, 0, 1.0, 1.0, 2.7, minutes, run_dir, "pydoc, byte"
    ))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    config = str(ROOT / "conf/experiment/demo-gpt2.yaml")
    assert main(["demo", "--configs", config, "--runs-dir", str(tmp_path / "runs")]) == 0
    assert made == [demo.DATA_DIR]


def test_every_config_and_max_steps_are_checked_before_anything_trains(
    tmp_path, capsys, monkeypatch
):
    """`--configs A B` trained A for minutes before B's typo was found, and `--max-steps 0`
    was refused by the first fit only."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main

    def never(*args, **kwargs):
        raise AssertionError("trained or prepared before the configs were checked")

    monkeypatch.setattr(demo.subprocess, "run", never)
    monkeypatch.setattr(demo, "ensure_data", never)
    good = str(ROOT / "conf/experiment/demo-gpt2.yaml")
    typo = tmp_path / "typo.yaml"
    typo.write_text("model: {preset: gpt2-tiny}\ntrainer: {max_stepz: 3}\n")
    runs = str(tmp_path / "runs")
    assert main(["demo", "--configs", good, str(typo), "--runs-dir", runs]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"cofr demo: error: --configs {typo}: the config does not parse: ")
    assert "unknown key 'trainer.max_stepz'" in line
    # A preset's name, or fields that do not fit together: said only after A trained.
    for text, said in (
        ("model: {preset: gpt2-mini-ff}\n", "unknown preset 'gpt2-mini-ff' (did you mean"),
        ("model: {config: {n_head: 3}}\n", "model.config: n_embd (128) must be a multiple"),
    ):
        typo.write_text(f"base: {good}\n{text}")
        assert main(["demo", "--configs", good, str(typo), "--runs-dir", runs]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"cofr demo: error: --configs {typo}: ") and said in line, line
    for steps in ("0", "-1"):
        assert main(["demo", "--max-steps", steps, "--runs-dir", runs]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"cofr demo: error: argument --max-steps: must be >= 1, got {steps}")
    # A file as the data folder: prepare's error named its own --out, not given here.
    (tmp_path / "a-file").write_text("mine")
    assert main(["demo", "--data-dir", str(tmp_path / "a-file"), "--runs-dir", runs]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == f"cofr demo: error: --data-dir {tmp_path / 'a-file'} is a file: give a " + (
        "prepared data folder, or a path where the demo makes one"
    )
    assert (tmp_path / "a-file").read_text() == "mine"
    assert not (tmp_path / "runs").exists()


def test_the_end_names_the_runs_dir_cofr_ui_must_serve(tmp_path, capsys, monkeypatch):
    """`cofr demo --runs-dir "my runs"` ended on a bare `cofr ui`, which serves
    runs/mlflow.db, where its runs are not."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main
    from cofrgenet.training import run_store

    def train(config, name, args, console, log_every=None):
        (Path(args.runs_dir) / "exp" / name).mkdir(parents=True)
        return 0.0

    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "collect", lambda run_dir, minutes, runs_dir: demo.DemoResult(
        run_dir.name, "p", 1, 0, 1.0, 1.0, 2.7, minutes, run_dir, "pydoc, byte"
    ))  # fmt: skip
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", None)
    monkeypatch.setenv("COLUMNS", "200")  # no line wrapping
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("model: {preset: gpt2-tiny}\n")
    assert main(["demo", "--configs", "mine.yaml", "--runs-dir", "my runs"]) == 0
    assert "the MLflow UI: cofr ui --runs-dir 'my runs' (it prints" in capsys.readouterr().out


def test_a_data_folder_of_nested_pydoc_topics_is_warned_of(tmp_path):
    """A pydoc folder prepared before 2026-12-05 holds the topics that others contain: its
    held-out topics are partly training text. The demo uses it, saying how to remake it."""
    import json

    from rich.console import Console

    from cofrgenet import demo
    from cofrgenet.data import PydocSource, prepare_data

    folder = tmp_path / "pydoc-byte"
    prepare_data(PydocSource(), folder, tokenizer="byte", max_docs=4, num_workers=1)
    console = Console(record=True, width=200)
    demo.ensure_data(str(folder), console)
    assert "warning" not in console.export_text()
    meta = json.loads((folder / "meta.json").read_text())
    del meta["source_args"]["topics"]  # as an older cofrgenet wrote it
    (folder / "meta.json").write_text(json.dumps(meta))
    demo.ensure_data(str(folder), console)
    said = " ".join(console.export_text().split())
    assert "partly training text" in said and f"--out {folder} --overwrite" in said


def test_a_tokens_per_s_of_too_few_steps_says_how_many(tmp_path):
    """`cofr demo --max-steps 10` logs one step's rate: the "median" column put gpt2 at
    1,658 tokens/s beside 23,931 without saying it was one step each."""
    from cofrgenet import demo

    def result(rate: float, samples: int) -> demo.DemoResult:
        return demo.DemoResult(
            "r", "gpt2-mini", 1, 0, rate, 2.0, 7.4, 0.1, tmp_path, "pydoc, byte", samples
        )

    table = demo.markdown([result(1658.0, 1), result(9000.0, 2), result(9438.0, 30)], "c", "d")
    assert "| 1,658 (1 step) |" in table and "| 9,000 (2 steps) |" in table
    assert "| 9,438 |" in table


def test_a_signal_during_a_fit_is_the_fits_to_act_on_and_stops_the_demo(
    tmp_path, capsys, monkeypatch
):
    """A Ctrl-C killed the demo's fit before it saved (subprocess.run's way), its MLflow
    run left RUNNING; now the fit gets it (tests/test_signals.py), saves and says how to
    resume, and the demo stops with 130, naming the step, without a table."""
    import cofrgenet.demo as demo
    from cofrgenet.cli import main

    steps = []

    def stopped_fit(command):
        steps.append(command[3])
        return (130, signal.SIGINT) if command[3] == "fit" else (0, None)

    monkeypatch.setattr(demo, "run_passing_signals", stopped_fit)
    monkeypatch.setattr(demo, "ensure_data", lambda data_dir, console: None)
    monkeypatch.chdir(tmp_path)
    config = str(ROOT / "conf/experiment/demo-gpt2.yaml")
    assert main(["demo", "--configs", config, "--runs-dir", str(tmp_path / "runs")]) == 130
    out = capsys.readouterr().out
    assert f"cofr demo: stopped by Ctrl-C during `cofr fit --config {config} ...`" in out
    assert steps == ["fit"]  # no validate, no second fit
    assert not list((tmp_path / "runs").glob("demo-*.md"))


@pytest.mark.parametrize(
    "meta, said",
    [
        ({"source": "pydoc", "source_args": {}}, "prepared before 2026-12-05 from every"),
        (
            {"source": "pydoc", "source_args": {"topics": "distinct"},
             "split_args": {"method": "random documents"}},
            "prepared before 2026-12-06: its held-out topics are the last ones",
        ),
        (
            {"source": "pydoc", "source_args": {"topics": "distinct"},
             "split_args": {"method": "seeded permutation"}},
            None,
        ),
    ],
)  # fmt: skip
def test_the_demo_warns_of_a_data_folder_made_the_old_ways(tmp_path, meta, said):
    """A demo folder prepared before 2026-12-06 holds out the last pydoc topics (the old
    validation draw): its figures are not the README's, and it was used unsaid."""
    import io

    from rich.console import Console

    from cofrgenet.demo import ensure_data

    (tmp_path / "meta.json").write_text(json.dumps(meta))
    out = io.StringIO()
    ensure_data(str(tmp_path), Console(file=out, width=400))
    if said is None:
        assert out.getvalue() == ""
    else:
        assert said in out.getvalue() and "--overwrite" in out.getvalue()

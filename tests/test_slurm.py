"""SLURM: sbatch resources agree with the trainer; a real sweep on a local cluster."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from cofrgenet.dotted import get_dotted
from cofrgenet.sweeps import SweepError, load_sweep
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.slurm import SubmitOptions, parse_sbatch_header, render
from cofrgenet.sweeps.spec import base_config, flow_yaml, parse_assignment

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = ROOT / "sweeps"


@pytest.fixture(autouse=True)
def _restore_mlflow_uri(monkeypatch):
    """In-process fits call mlflow.set_tracking_uri, which sets MLFLOW_TRACKING_URI for
    the whole process; restore it so later tests see the environment they started with."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def worker_settings(script: str) -> dict:
    """The --set KEY=VALUE pairs of the worker command line in a rendered script."""
    line = next(x for x in script.splitlines() if x.startswith("if [ $# -eq 0 ]; then set -- "))
    words = shlex.split(line.removeprefix("if [ $# -eq 0 ]; then set -- ").removesuffix("; fi"))
    return dict(parse_assignment(words[i + 1]) for i, w in enumerate(words) if w == "--set")


def check_agreement(sweep, options: SubmitOptions) -> tuple[dict, dict]:
    """The #SBATCH header and the config the worker trains with describe the same job."""
    rendered = render(sweep, options)
    header = parse_sbatch_header(rendered.script)
    config = base_config(sweep, worker_settings(rendered.script))
    assert header["nodes"] == str(get_dotted(config, "trainer.num_nodes")) == "1"
    assert header["ntasks-per-node"] == "1"  # one worker process; it spawns its own ranks
    devices = get_dotted(config, "trainer.devices")
    if get_dotted(config, "trainer.accelerator") == "gpu":
        assert header["gres"] == f"gpu:{devices}"
        if devices > 1:  # spawned ranks; told of frozen ladder depths (no gradient)
            frozen = "DyadicUnfreezing" in str(get_dotted(config, "trainer.callbacks", ""))
            expected = "ddp_spawn_find_unused_parameters_true" if frozen else "ddp_spawn"
            assert get_dotted(config, "trainer.strategy") == expected
    else:
        assert "gres" not in header and devices == 1
    workers = get_dotted(config, "data.num_workers")
    if isinstance(workers, int):
        assert int(header["cpus-per-task"]) >= max(1, devices) * (workers + 1)
    assert header["array"] == f"0-{options.workers - 1}"
    assert header["signal"] == "B:USR1@90" and "requeue" in header
    return header, config


def test_sweep_sbatch_resources_agree_with_the_trainer():
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    header, _ = check_agreement(tiny, SubmitOptions(workers=2, shared_journal=True))
    assert header["cpus-per-task"] == "1"  # data.num_workers 0
    tpe = load_sweep(SWEEPS / "tpe-depth-ladders-lr.yaml")
    header, _ = check_agreement(tpe, SubmitOptions(workers=8, partition="gpu", shared_journal=True))
    assert header["gres"] == "gpu:1" and header["partition"] == "gpu"
    assert header["cpus-per-task"] == "8" and header["mem"] == "64G"
    header, config = check_agreement(
        tpe, SubmitOptions(workers=4, gpus_per_worker=2, shared_journal=True)
    )
    assert header["gres"] == "gpu:2"
    assert get_dotted(config, "trainer.strategy") == "ddp_spawn_find_unused_parameters_true"
    header, _ = check_agreement(
        tpe,
        SubmitOptions(
            workers=2, gpus_per_worker=0, settings={"data.num_workers": 3}, shared_journal=True
        ),
    )
    assert int(header["cpus-per-task"]) >= 4
    check_agreement(
        load_sweep(SWEEPS / "paper-grid-cofrgenet-f.yaml"),
        SubmitOptions(workers=16, shared_journal=True),
    )


def test_the_worker_line_keeps_the_study_and_every_set_value():
    """`submit --study X` runs study X (its journal, its trials), and a --set value reads
    back as it was given: null, not the string 'None'; the string 'true', not True."""
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml", {"study": "other"})
    values = {"trainer.gradient_clip_val": None, "trainer.precision": "32-true"}
    rendered = render(tiny, SubmitOptions(settings=values))
    words = rendered.worker_args
    assert words[words.index("--study") + 1] == "other"
    assert "sweeps/other/optuna.journal" in words[words.index("--storage") + 1]
    got = worker_settings(rendered.script)
    assert all(got[key] == value for key, value in values.items()), got
    for value in (None, "true", "null", {"a": 1, "b": [0.5, "x"]}, [0, 1], 1e-4, "a: b"):
        assert parse_assignment(f"key={flow_yaml(value)}") == ("key", value)


def test_array_tasks_share_the_default_journal_only_when_told_it_is_shared(capsys, monkeypatch):
    """A journal file is safe on one host; array tasks may land on several. `--workers 8`
    with no storage given shared the default journal across nodes with a warning alone:
    it is refused unless --shared-journal says every node mounts it."""
    monkeypatch.delenv("COFR_SWEEP_STORAGE", raising=False)
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    render(tiny, SubmitOptions(workers=1))
    assert capsys.readouterr().err == ""
    with pytest.raises(SweepError, match=(
        r"^--workers 4 would share the default journal file .*/runs/sweeps/tiny-cpu/"
        r"optuna.journal across nodes: give a PostgreSQL storage \(storage: or --storage\), "
        r"or --shared-journal if every node mounts that folder"
    )):  # fmt: skip
        render(tiny, SubmitOptions(workers=4))
    render(tiny, SubmitOptions(workers=4, shared_journal=True))
    assert capsys.readouterr().err == ""
    render(tiny, SubmitOptions(workers=4, storage="journal:/shared/s.journal"))  # chosen: a warning
    warning = capsys.readouterr().err
    assert warning.startswith("warning: 4 array tasks share the journal file /shared/s.journal")
    assert "--shared-journal says it is" in warning
    render(tiny, SubmitOptions(workers=4, storage="postgresql://u:p$$w@db:5432/optuna"))
    assert capsys.readouterr().err == ""
    # A bundled sweep whose storage comes from an unset variable names the variable.
    paper = load_sweep(SWEEPS / "paper-grid-cofrgenet-f.yaml")
    with pytest.raises(SweepError, match=r"\(\$\{COFR_SWEEP_STORAGE\} in the environment, "):
        render(paper, SubmitOptions(workers=8))
    # Set for a file that does not read it (the README's line, with tiny-cpu.yaml): said.
    monkeypatch.setenv("COFR_SWEEP_STORAGE", "postgresql://u@db/optuna")
    with pytest.raises(SweepError, match=(
        r"\(--storage env:COFR_SWEEP_STORAGE, which this file does not read, storage: or"
    )):  # fmt: skip
        render(tiny, SubmitOptions(workers=4))


def test_sweep_sbatch_refuses_what_cannot_agree():
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    with pytest.raises(SweepError, match="num_nodes"):
        render(tiny, SubmitOptions(settings={"trainer.num_nodes": 2}))
    with pytest.raises(SweepError, match="cpus-per-worker"):
        render(tiny, SubmitOptions(cpus_per_worker=2, settings={"data.num_workers": 4}))
    # ddp_spawn: each of G ranks in the task starts its own loaders.
    spawn = SubmitOptions(gpus_per_worker=4, cpus_per_worker=4, settings={"data.num_workers": 3})
    with pytest.raises(SweepError, match=(
        r"^--cpus-per-worker 4 cannot feed each of 4 ranks' data.num_workers 3 loader processes "
        r"plus the trainer: give at least 16 CPUs, .*SLURM_CPUS_PER_TASK // 4 - 1\)$"
    )):  # fmt: skip
        render(tiny, spawn)
    spawn = SubmitOptions(gpus_per_worker=2, settings={"data.num_workers": 3})
    assert parse_sbatch_header(render(tiny, spawn).script)["cpus-per-task"] == "8"


def test_submit_dry_run_prints_the_script(tiny_data, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cofrgenet.cli", "sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"),
         "--workers", "2", "--shared-journal", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
         "--set", f"data.data_dir={tiny_data}"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash")
    assert "#SBATCH --array=0-1" in result.stdout
    assert "-m cofrgenet.cli sweep run" in result.stdout
    assert not (tmp_path / "runs").exists(), "a dry run writes nothing"
    assert subprocess.run(["bash", "-n"], input=result.stdout, text=True).returncode == 0
    # Nor into a database it checks: opened as a storage, it got Optuna's tables.
    import sqlite3

    database = tmp_path / "studies.db"
    with sqlite3.connect(database) as made:
        made.execute("create table mine (x integer)")
    from cofrgenet.cli import main

    command = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--storage",
               f"sqlite:///{database}", "--runs-dir", str(tmp_path / "runs"), "--dry-run",
               "--set", f"data.data_dir={tiny_data}"]  # fmt: skip
    for extra in ([], ["--no-storage-check"]):
        assert main([*command, *extra]) == 0
        with sqlite3.connect(database) as kept:
            tables = {row[0] for row in kept.execute("select name from sqlite_master")}
        assert tables == {"mine"}


def test_more_workers_than_trials_are_said(tiny_data, tmp_path, capsys):
    """`--workers 9` for 6 trials queued 3 array tasks that found nothing to train."""
    from cofrgenet.cli import main

    command = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--shared-journal",
               "--runs-dir", str(tmp_path / "runs"), "--dry-run",
               "--set", f"data.data_dir={tiny_data}", "--workers"]  # fmt: skip
    assert main([*command, "9"]) == 0
    assert (
        "warning: --workers 9 for a study of 6 trials: at least 3 array tasks would find no "
        "trial to train; --workers 6 is enough"
    ) in capsys.readouterr().err
    assert main([*command, "6"]) == 0
    assert "--workers 6" not in capsys.readouterr().err
    # Fewer: 2 workers of 2 trials each leave 2 of the 6 untrained, unsaid before.
    assert main([*command, "2", "--n-trials", "2"]) == 0
    assert (
        "warning: --workers 2 x --n-trials 2: this job's workers stop after 4 trials in all, "
        "of the study's 6 (fewer are left if some ran already); more workers, a larger "
        "--n-trials or a later submit run the rest"
    ) in capsys.readouterr().err
    assert main([*command, "2", "--n-trials", "3"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("nodes", "tasks", "gpus", "ok"),
    [("2", "8(x2)", "8", True), ("1", "1", "0", True), ("1", "1", "4", False)],
)
def test_train_sbatch_takes_the_topology_from_the_allocation(tmp_path, nodes, tasks, gpus, ok):
    header = parse_sbatch_header((ROOT / "slurm" / "train.sbatch").read_text())
    assert header["gres"] == f"gpu:{header['ntasks-per-node']}"  # one task per GPU
    assert header["signal"] == "SIGUSR1@90" and "requeue" in header
    # Run the script with a stub srun that prints the command it would launch.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho "$@" "cpus=$SRUN_CPUS_PER_TASK"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_CPUS_PER_TASK": "6",
        "SLURM_NNODES": nodes,
        "SLURM_NTASKS_PER_NODE": tasks,
        "SLURM_GPUS_ON_NODE": gpus,
        "SLURM_JOB_ID": "77",
        "SLURM_SUBMIT_DIR": str(ROOT),
    }
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train.sbatch"), "conf/experiment/demo-gpt2.yaml"],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    if not ok:
        assert result.returncode == 2 and "--ntasks-per-node" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[words.index("--trainer.num_nodes") + 1] == nodes
    assert words[words.index("--trainer.devices") + 1] == tasks.split("(")[0]
    accelerator = "gpu" if int(gpus) else "cpu"
    assert words[words.index("--trainer.accelerator") + 1] == accelerator
    assert words[words.index("--ckpt_path") + 1] == "last"
    # srun (Slurm >= 22.05) takes the task's CPUs from here, not from sbatch's request.
    assert words[-1] == "cpus=6"


def test_the_scripts_run_where_slurm_starts_them(tmp_path):
    """`sbatch --chdir DIR` starts a script in DIR, and the scripts' own `cd
    $SLURM_SUBMIT_DIR` moved them back: the runs and data were looked for in the submit
    folder (and submit skipped its data check, expecting --chdir to move the tasks)."""
    for name in ("train.sbatch", "sweep.sbatch"):
        text = (ROOT / "slurm" / name).read_text()
        assert not re.search(r"^\s*cd\s", text, re.MULTILINE), name
    bin_dir, work, submit = tmp_path / "bin", tmp_path / "work", tmp_path / "submit"
    for folder in (bin_dir, work, submit):
        folder.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho "ran in $(pwd)"\n')
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_SUBMIT_DIR": str(submit)}  # fmt: skip
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train.sbatch"), "conf/experiment/demo-gpt2.yaml"],
        env=env, capture_output=True, text=True, cwd=work,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"ran in {work}" in result.stdout
    # sbatch --ntasks 2 alone: one line, not a Lightning traceback from each rank.
    result = subprocess.run(
        ["bash", str(ROOT / "slurm" / "train.sbatch"), "conf/experiment/demo-gpt2.yaml"],
        env={**env, "SLURM_NTASKS": "2"}, capture_output=True, text=True, cwd=work,
    )  # fmt: skip
    assert result.returncode == 2
    assert "error: --ntasks=2 without --ntasks-per-node: submit with --ntasks-per-node N" in (
        result.stderr
    )
    one = {**env, "SLURM_NTASKS": "1"}  # one task on one node: as --ntasks-per-node 1
    assert subprocess.run(["bash", str(ROOT / "slurm" / "train.sbatch"), "x.yaml"], env=one,
                          capture_output=True, cwd=work).returncode == 0  # fmt: skip


# ------------------------------------------------------------------ a real cluster


def slurm_reason() -> str | None:
    """Why the SLURM test cannot run here, or None."""
    if shutil.which("sbatch") is None:
        return "SLURM is absent: no sbatch on PATH (CI starts a cluster with .ci/services.sh start)"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True)
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return (
            "no slurmctld answers `scontrol ping` (SLURM_CONF="
            f"{os.environ.get('SLURM_CONF', 'unset')}): start one with .ci/services.sh start"
        )
    return None


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    from cofrgenet.data import prepare_data

    out = tmp_path_factory.mktemp("data") / "pydoc-byte"
    prepare_data(source="pydoc", tokenizer="byte", out=out, max_docs=12, num_workers=1)
    return out


@pytest.mark.slow
def test_tiny_sweep_on_the_local_slurm_cluster(tiny_data, tmp_path):
    reason = slurm_reason()
    if reason:
        pytest.skip(reason)
    raw = yaml.safe_load((SWEEPS / "tiny-cpu.yaml").read_text())
    raw["base"] = [str(ROOT / b) for b in raw["base"]]
    raw["study"] = f"slurm-{uuid.uuid4().hex[:8]}"
    sweep_path = tmp_path / "tiny.yaml"
    sweep_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "cofrgenet.cli", "sweep", "submit", str(sweep_path), "--workers", "2",
         "--shared-journal", "--runs-dir", str(runs), "--set", f"data.data_dir={tiny_data}", "--time", "00:20:00", "--wait"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(runs.rglob("slurm/*.out")))
    assert result.returncode == 0, result.stdout + result.stderr + logs
    job = result.stdout.split(" as job ")[1].split()[0]

    sweep = load_sweep(sweep_path)
    url = st.default_storage(sweep, str(runs))
    study = optuna.load_study(study_name=sweep.study, storage=st.open_storage(url))
    trials = study.get_trials()
    assert len(trials) >= sweep.total_trials, logs
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) for t in trials)
    assert all(t.user_attrs.get(st.FAIL_REASON) for t in trials if t.state == TrialState.FAIL)
    assert {t.user_attrs[st.WORKER_ID] for t in trials} <= {f"slurm-{job}_0", f"slurm-{job}_1"}
    assert {t.user_attrs[st.SLURM_ARRAY_JOB] for t in trials} == {job}

    client = mlflow.MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(sweep.experiment)
    found = client.search_runs([experiment.experiment_id], max_results=100)
    (parent,) = [r for r in found if r.data.tags.get("cofr.sweep") == "parent"]
    children = [r for r in found if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(trials)
    assert all(r.data.tags["slurm.array_job_id"] == job for r in children)
    assert (runs / "sweeps" / sweep.study / "report" / "summary.md").is_file()


def test_ckpt_path_last_prefers_a_newer_requeue_checkpoint(tiny_data, tmp_path):
    """train.sbatch resumes with --ckpt_path last: Lightning's SIGUSR1 checkpoint
    (hpc_ckpt_<n>.ckpt in the run folder) wins when it holds a later step than last.ckpt,
    whichever file is newer (a copied run folder's times say nothing)."""
    from cofrgenet.training.cli import CofrCLI

    def fit(steps: int, *extra: str) -> None:
        CofrCLI(
            args=[
                "fit", "--config", str(ROOT / "sweeps" / ".." / "conf" / "trainer" / "cpu-debug.yaml"),
                "--model.preset", "gpt2-tiny", "--model.config", '{"vocab_size": 320, "block_size": 32}',
                "--data.data_dir", str(tiny_data), "--data.block_size", "32", "--data.batch_size", "2",
                "--data.num_workers", "0", "--run.runs_dir", str(tmp_path / "runs"), "--run.name", "r",
                "--run.mlflow", "false", "--run.checkpoint_every_n_steps", "2",
                "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "100",
                "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
                "--trainer.callbacks+=sweep_helpers.RecordStartStep",
                f"--trainer.callbacks.path={tmp_path / 'start'}", *extra,
            ]
        )  # fmt: skip

    fit(2)
    run_dir = tmp_path / "runs" / "default" / "r"
    last = run_dir / "checkpoints" / "last.ckpt"
    at_step_2 = last.read_bytes()
    fit(4, "--ckpt_path", "last")
    assert (tmp_path / "start").read_text() == "2"
    requeue = run_dir / "hpc_ckpt_1.ckpt"
    requeue.write_bytes(last.read_bytes())  # step 4, in the oldest file
    os.utime(requeue, (1e9, 1e9))
    last.write_bytes(at_step_2)
    fit(6, "--ckpt_path", "last")
    assert (tmp_path / "start").read_text() == "4"
    requeue.write_bytes(at_step_2)  # the newest file, of an earlier step than last.ckpt's 6
    fit(8, "--ckpt_path", "last")
    assert (tmp_path / "start").read_text() == "6"


def test_sbatch_header_values_cannot_inject_lines_or_break_the_header(tmp_path):
    """--time, --mem, --partition and --sbatch go into #SBATCH lines: a newline would
    start a shell line of its own, a space would end the value early."""
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    cases = [
        (SubmitOptions(time="04:00:00\nrm -rf ~"), "--time '04:00:00\\nrm -rf ~': an #SBATCH"),
        (SubmitOptions(mem="64 G"), "--mem '64 G': SLURM reads an #SBATCH value only up to"),
        (SubmitOptions(partition="gpu\r#SBATCH --x"), "--partition 'gpu\\r#SBATCH --x'"),
        (SubmitOptions(sbatch_args=["--account=abc\necho hi"]), "--sbatch account 'abc\\n"),
        (SubmitOptions(sbatch_args=["--comment=two words"]), "--sbatch comment 'two words'"),
        (SubmitOptions(sbatch_args=["--acc ount=x"]), "--sbatch '--acc ount=x': expected"),
        (SubmitOptions(runs_dir=str(tmp_path / "my runs")), "the runs folder (--runs-dir)"),
        (SubmitOptions(time="4h"), "--time '4h' is not a SLURM time: e.g. 04:00:00"),
        (SubmitOptions(mem="lots"), "--mem 'lots' is not a SLURM mem: e.g. 64G"),
    ]
    for options, message in cases:
        with pytest.raises(SweepError, match=re.escape(message)):
            render(tiny, options)
    tiny.slurm.time = "1:00:00\n#SBATCH --x"
    with pytest.raises(SweepError, match=re.escape("slurm.time (in the sweep) '1:00:00\\n")):
        render(tiny, SubmitOptions())
    # The flag replaces the sweep's value; a plain --sbatch flag has no value.
    for time, mem in (
        ("90", "16000"),
        ("2-00:00:00", "64G"),
        ("1-12", "512m"),
        ("UNLIMITED", "1T"),
    ):
        render(tiny, SubmitOptions(time=time, mem=mem))  # SLURM's other forms pass
    options = SubmitOptions(time="1:00:00", sbatch_args=["--exclusive", "--account=abc"])
    header = parse_sbatch_header(render(tiny, options).script)
    assert (header["time"], header["exclusive"], header["account"]) == ("1:00:00", "", "abc")


def test_a_time_limit_the_requeue_signal_cannot_come_before_is_refused(tmp_path, capsys):
    """--time 1 (a minute) with --signal=B:USR1@90: SLURM ends the task before the signal
    that saves and requeues the trial could come; it was submitted all the same."""
    from cofrgenet.cli import main

    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    cases = [
        (SubmitOptions(time="1"), "--time '1' is 60 s: no longer than the 90 s before the "
         "end at which submit's --signal=B:USR1@90 asks the worker to save and requeue"),
        (SubmitOptions(time="1:30"), "--time '1:30' is 90 s"),  # minutes:seconds
        (SubmitOptions(time="10", sbatch_args=["--signal=B:USR1@600"]),
         "at which --sbatch --signal=B:USR1@600 asks"),
        (SubmitOptions(sbatch_args=["--time=0:01:00"]), "--sbatch --time '0:01:00' is 60 s"),
    ]  # fmt: skip
    for options, message in cases:
        with pytest.raises(SweepError, match=re.escape(message)):
            render(tiny, options)
    tiny.slurm.time = 1
    with pytest.raises(SweepError, match=re.escape("slurm.time (in the sweep) '1' is 60 s")):
        render(tiny, SubmitOptions())
    for time in ("2", "0-1", "0", "unlimited"):  # 120 s, an hour, no limit
        render(tiny, SubmitOptions(time=time))
    render(tiny, SubmitOptions(time="2", sbatch_args=["--signal=B:USR1"]))  # SLURM's 60 s
    argv = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--time", "1", "--dry-run"]
    assert main(argv) == 2
    assert "so the signal would never come; give a time above 90 s" in capsys.readouterr().err


def test_a_signal_the_worker_does_not_requeue_on_is_refused(capsys):
    """--sbatch=--signal=USR1@30 (job steps only: no worker gets it) or B:USR2@300 (the
    script passes on USR1 alone) replaced the requeue signal: no trial was ever saved and
    requeued at the time limit."""
    from cofrgenet.cli import main

    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    for bad in ("USR1@30", "B:USR2@300", "R:USR1@300", "B:TERM"):
        with pytest.raises(SweepError, match=re.escape(
            f"--sbatch --signal={bad}: the worker saves and requeues its trial on SIGUSR1 "
            "sent to the batch shell, so only the lead time may change: give "
            "--signal=B:USR1@SECONDS (e.g. B:USR1@300), or leave it out for B:USR1@90"
        )):  # fmt: skip
            render(tiny, SubmitOptions(sbatch_args=[f"--signal={bad}"]))
    for good in ("B:USR1@300", "B:SIGUSR1@120", "b:usr1", "B:10@100"):
        header = parse_sbatch_header(
            render(tiny, SubmitOptions(sbatch_args=[f"--signal={good}"])).script
        )
        assert header["signal"] == good
    tiny.slurm.extra = ["--signal=USR1@30"]
    with pytest.raises(SweepError, match=r"^slurm\.extra \(in the sweep\) --signal=USR1@30: "):
        render(tiny, SubmitOptions())
    argv = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--sbatch=--signal=USR1@30"]
    assert main([*argv, "--dry-run"]) == 2
    assert "--sbatch --signal=USR1@30: the worker saves" in capsys.readouterr().err


def test_an_sbatch_option_that_needs_a_value_is_refused_without_one(capsys):
    """--sbatch=--account went into the script as a bare #SBATCH --account, which sbatch
    refused only after submit had written the script; flags (--exclusive) stay bare."""
    from cofrgenet.cli import main

    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    for bare in ("--account", "--partition=", "--job-name"):
        key = bare.strip("-=")
        message = f"--sbatch {bare!r}: sbatch's --{key} needs a value; give it as --{key}=VALUE"
        with pytest.raises(SweepError, match=re.escape(message)):
            render(tiny, SubmitOptions(sbatch_args=[bare]))
    tiny.slurm.extra = ["--qos"]
    with pytest.raises(SweepError, match=re.escape("slurm.extra (in the sweep) '--qos': sbatch")):
        render(tiny, SubmitOptions())
    tiny.slurm.extra = []
    options = SubmitOptions(sbatch_args=["--exclusive", "--requeue", "--account=abc"])
    header = parse_sbatch_header(render(tiny, options).script)
    assert (header["exclusive"], header["account"]) == ("", "abc")
    argv = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--sbatch=--account", "--dry-run"]
    assert main(argv) == 2
    assert "sbatch's --account needs a value" in capsys.readouterr().err


def test_sbatch_options_cannot_replace_the_lines_submit_decides(capsys):
    """--sbatch=--array=0-99 gave 100 workers on the default journal that --workers 2 is
    refused for, --gres=gpu:4 GPUs a CPU trainer never used, --nodes=2 a second idle
    node; --time/--mem skipped the format checks their flags get, and -t 1 became
    #SBATCH --t=1."""
    from cofrgenet.cli import main

    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    refused = {
        "--array=0-99": "--workers N",
        "-a3": "--workers N",
        "--nodes=2": "slurm/train.sbatch",
        "-N 2": "slurm/train.sbatch",
        "--ntasks=4": "slurm/train.sbatch",
        "-n4": "slurm/train.sbatch",
        "--ntasks-per-node=4": "slurm/train.sbatch",
        "--gres=gpu:4": "--gpus-per-worker",
        "--gres=tmpdisk:10,gpu:a100:2": "--gpus-per-worker",
        "--gpus=4": "--gpus-per-worker",
        "-G1": "--gpus-per-worker",
        "--gpus-per-node=2": "--gpus-per-worker",
        "--cpus-per-task=64": "--cpus-per-worker",
        "-c 64": "--cpus-per-worker",
    }
    for option, fix in refused.items():
        with pytest.raises(SweepError, match=r"^--sbatch -.*: submit sets sbatch's --[a-z-]+ "
                           rf"itself; .*{re.escape(fix)}"):  # fmt: skip
            render(tiny, SubmitOptions(sbatch_args=[option]))
    bad_formats = {
        "--time=garbage": "--sbatch --time 'garbage' is not a SLURM time: e.g. 04:00:00",
        "-tgarbage": "--sbatch --time 'garbage' is not a SLURM time",
        "--mem=lots": "--sbatch --mem 'lots' is not a SLURM mem: e.g. 64G",
        "-t": "--sbatch '-t': sbatch's -t (--time) needs a value; give it as --time=VALUE",
        "-Z1": "--sbatch '-Z1': not a one-letter sbatch option",
        "-kx": "--sbatch '-kx': sbatch's -k (--no-kill) takes no value",
        "-a3\necho hi": "--sbatch array '3\\necho hi': an #SBATCH value cannot hold a newline",
    }
    for option, message in bad_formats.items():
        with pytest.raises(SweepError, match=re.escape(message)):
            render(tiny, SubmitOptions(sbatch_args=[option]))
    tiny.slurm.extra = ["--mem=lots"]
    with pytest.raises(SweepError, match=re.escape("slurm.extra (in the sweep) --mem 'lots'")):
        render(tiny, SubmitOptions())
    tiny.slurm.extra = ["--array=0-9"]
    with pytest.raises(SweepError, match=r"^slurm\.extra \(in the sweep\) --array=0-9: submit"):
        render(tiny, SubmitOptions())
    tiny.slurm.extra = []
    # A one-letter option is written long: it replaces submit's own line, checked as it.
    for option in ("-t 100", "-t100", "-t=100"):
        script = render(tiny, SubmitOptions(sbatch_args=[option, "-Aabc", "-k"])).script
        header = parse_sbatch_header(script)
        assert (header["time"], header["account"], header["no-kill"]) == ("100", "abc", "")
        assert "#SBATCH --t=" not in script and "#SBATCH --A" not in script
    with pytest.raises(SweepError, match=re.escape("--sbatch --time '1' is 60 s")):
        render(tiny, SubmitOptions(sbatch_args=["-t=1"]))
    # Other generic resources join the worker's GPUs, or stand alone for a CPU worker.
    gpu = SubmitOptions(gpus_per_worker=2, sbatch_args=["--gres=tmpdisk:10"])
    assert parse_sbatch_header(render(tiny, gpu).script)["gres"] == "gpu:2,tmpdisk:10"
    cpu = SubmitOptions(sbatch_args=["--gres=tmpdisk:10"])
    assert parse_sbatch_header(render(tiny, cpu).script)["gres"] == "tmpdisk:10"
    argv = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--study", "subx", "--dry-run"]
    assert main([*argv, "--sbatch=--array=0-99"]) == 2
    err = capsys.readouterr().err
    assert "--sbatch --array=0-99: submit sets sbatch's --array itself" in err
    assert len(err.strip().splitlines()) == 1


def test_only_one_memory_option_reaches_the_script():
    """--mem 16G with --sbatch=--mem-per-cpu=4G wrote both lines, and sbatch refused the
    script after submit had checked and written it. An --sbatch --mem replaces --mem's
    line, as --time does."""
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    message = (
        "--mem and --sbatch --mem-per-cpu: sbatch takes only one of --mem, --mem-per-cpu "
        "and --mem-per-gpu (it refuses the script otherwise); give one of them"
    )
    with pytest.raises(SweepError, match=re.escape(message)):
        render(tiny, SubmitOptions(mem="16G", sbatch_args=["--mem-per-cpu=4G"]))
    tiny.slurm.extra = ["--mem-per-gpu=8G"]
    with pytest.raises(SweepError, match=re.escape(
        "slurm.extra (in the sweep) --mem-per-gpu and --sbatch --mem-per-cpu: sbatch takes"
    )):  # fmt: skip
        render(tiny, SubmitOptions(sbatch_args=["--mem-per-cpu=4G"]))
    tiny.slurm.extra = []
    header = parse_sbatch_header(
        render(tiny, SubmitOptions(mem="16G", sbatch_args=["--mem=8G"])).script
    )
    assert header["mem"] == "8G"
    header = parse_sbatch_header(
        render(tiny, SubmitOptions(sbatch_args=["--mem-per-cpu=4G"])).script
    )
    assert (header["mem-per-cpu"], "mem" in header) == ("4G", False)


def test_submit_refuses_to_wait_for_a_dry_run(capsys):
    from cofrgenet.cli import main

    assert main(["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--dry-run", "--wait"]) == 2
    assert "--dry-run submits none: drop one" in capsys.readouterr().err


def test_submit_wait_says_a_failed_job_and_exits_1(tiny_data, tmp_path, monkeypatch, capsys):
    """`sbatch --wait` exits non-zero for a failed job, its id printed all the same:
    submit said `submitted ... as job N` and exited 0. A failed sbatch (nothing
    submitted) left its script behind."""
    from cofrgenet.cli import main

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        '#!/bin/sh\ncase "$*" in *--wait*) echo 4242; exit 3;; esac\n'
        "echo 'sbatch: error: invalid partition specified: nope' >&2\nexit 1\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runs = tmp_path / "runs"
    submit = ["sweep", "submit", str(SWEEPS / "tiny-cpu.yaml"), "--runs-dir", str(runs)]
    submit += ["--set", f"data.data_dir={tiny_data}"]
    assert main([*submit, "--wait"]) == 1
    out, err = capsys.readouterr()
    assert "as job 4242" in out
    logs = runs / "sweeps" / "tiny-cpu" / "slurm"
    assert f"job 4242 failed (sbatch --wait exit status 3); its logs: {logs}/4242_*.out" in err
    assert len(err.strip().splitlines()) == 1
    assert main(submit) == 2
    assert "sbatch failed (1): sbatch: error: invalid partition" in capsys.readouterr().err
    assert len(list(logs.glob("*.sbatch"))) == 1  # the failed job's, not the unsubmitted one's
    # A first submit refused by sbatch leaves no empty study or slurm folder behind.
    fresh = tmp_path / "fresh"
    assert main([*submit[:-4], "--runs-dir", str(fresh), *submit[-2:]]) == 2
    assert not (fresh / "sweeps").exists()


def test_submit_to_a_runs_folder_it_cannot_make_says_so_in_one_line(
    tiny_data, tmp_path, monkeypatch
):
    """A --runs-dir under a file (or on a read-only disk) gave mkdir's traceback."""
    import cofrgenet.sweeps.slurm as slurm

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    blocker = tmp_path / "file"
    blocker.write_text("")
    options = SubmitOptions(
        runs_dir=str(blocker / "runs"), settings={"data.data_dir": str(tiny_data)}
    )
    with pytest.raises(SweepError, match=rf"^cannot make {blocker}/runs/.*/slurm, the folder of "):
        slurm.submit(load_sweep(SWEEPS / "tiny-cpu.yaml"), options, dry_run=False, wait=False)


def test_a_storage_password_stays_off_the_workers_command_lines(monkeypatch, capsys, tmp_path):
    """The script exports the URL and the workers read it (--storage env:NAME): ps, logs
    and MLflow's cofrgenet.command tag showed `--storage postgresql://u:secret@...`."""
    import argparse
    import shlex

    from cofrgenet.redact import hide_passwords
    from cofrgenet.sweeps.cli import storage_argument
    from cofrgenet.sweeps.slurm import STORAGE_VARIABLE
    from cofrgenet.training.run_store import code_tags

    url = "postgresql://alice:s3cr$t@db.example:5432/optuna"
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    rendered = render(tiny, SubmitOptions(workers=4, storage=url))
    words = rendered.worker_args
    assert words[words.index("--storage") + 1] == f"env:{STORAGE_VARIABLE}"
    [export] = [line for line in rendered.script.splitlines() if STORAGE_VARIABLE + "=" in line]
    assert shlex.split(export) == ["export", f"{STORAGE_VARIABLE}={url}"]
    assert rendered.script.count("s3cr$t") == 1  # that line alone
    monkeypatch.setenv(STORAGE_VARIABLE, url)
    assert storage_argument(f"env:{STORAGE_VARIABLE}") == url
    monkeypatch.delenv(STORAGE_VARIABLE)
    with pytest.raises(argparse.ArgumentTypeError, match=r"\$COFR_SWEEP_STORAGE_URL is not set"):
        storage_argument(f"env:{STORAGE_VARIABLE}")
    assert (
        render(tiny, SubmitOptions(storage="journal:/j/x.journal")).worker_args.count(
            "journal:/j/x.journal"
        )
        == 1
    )  # nothing to hide: the URL as given
    # A password typed on a command line is hidden where it is recorded or said.
    monkeypatch.setattr(sys, "argv", ["cofr", "sweep", "run", "x.yaml", "--storage", url])
    assert "s3cr" not in code_tags()["cofrgenet.command"]
    assert hide_passwords(url) == "postgresql://alice:***@db.example:5432/optuna"
    assert hide_passwords("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    query = "postgresql://u@h/db?sslmode=x&password=s3cr"  # a password as a parameter
    assert hide_passwords(query) == "postgresql://u@h/db?sslmode=x&password=***"
    assert render(tiny, SubmitOptions(storage=query)).worker_args.count(query) == 0
    # A variable holding no URL (a password variable, by mistake) is not echoed.
    monkeypatch.setenv("PGPASSWORD", "hunter2")
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"\$PGPASSWORD holds no storage URL"
    ) as bad:
        storage_argument("env:PGPASSWORD")
    assert "hunter2" not in str(bad.value)
    # The run folder's lock file (mode 0644) records the command line, hidden too.
    from cofrgenet.training.runlock import RunLock

    lock = RunLock(tmp_path / "run")
    lock.acquire()
    try:
        assert "s3cr" not in (tmp_path / "run" / ".lock").read_text()
    finally:
        lock.release()


def test_gpus_per_worker_0_in_the_sweep_file_and_a_set_submit_would_replace(tmp_path):
    """`slurm: {gpus_per_worker: 0}` read as unset (a GPU base config got --gres=gpu:1),
    and `--set trainer.devices=4` was replaced by 1 without a word."""
    raw = yaml.safe_load((SWEEPS / "tpe-depth-ladders-lr.yaml").read_text())
    raw["base"] = [str(ROOT / b) for b in raw["base"]]
    raw["slurm"] = {**raw["slurm"], "gpus_per_worker": 0, "cpus_per_worker": None}
    raw.pop("storage", None)
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(raw))
    rendered = render(load_sweep(path), SubmitOptions(workers=2, shared_journal=True))
    assert "gres" not in parse_sbatch_header(rendered.script)
    assert rendered.settings["trainer.accelerator"] == "cpu"
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    with pytest.raises(SweepError, match=r"--set trainer.devices=4: submit sets trainer.devices "
                       r"to 1 .* give --gpus-per-worker"):  # fmt: skip
        render(tiny, SubmitOptions(settings={"trainer.devices": 4}))
    render(tiny, SubmitOptions(settings={"trainer.devices": 1}))  # what it sets anyway: fine


def test_the_sweep_files_slurm_section_is_checked_when_read(tmp_path, capsys):
    """`gpus_per_worker: "two"` gave a TypeError traceback, `extra: "--account=abc"` was
    read a letter at a time (an error about '-'), and `cpus_per_worker: -1` was said as
    `--cpus-per-worker -1`, a flag nobody gave; `time: null` gave #SBATCH --time=None."""
    from cofrgenet.cli import main
    from cofrgenet.sweeps.spec import parse_sweep

    raw = yaml.safe_load((SWEEPS / "tiny-cpu.yaml").read_text())
    raw["base"] = [str(ROOT / b) for b in raw["base"]]
    cases = [
        ({"gpus_per_worker": "two"}, "slurm.gpus_per_worker must be a whole number >= 0, "
         "got 'two'"),
        ({"gpus_per_worker": -1}, "slurm.gpus_per_worker must be a whole number >= 0, got -1"),
        ({"cpus_per_worker": -1}, "slurm.cpus_per_worker must be a whole number >= 1, got -1"),
        ({"cpus_per_worker": True}, "slurm.cpus_per_worker must be a whole number >= 1"),
        ({"cpus_per_worker": 2.5}, "slurm.cpus_per_worker must be a whole number >= 1"),
        ({"extra": "--account=abc"}, "slurm.extra must be a list of sbatch options, e.g. "
         "extra: [--account=abc], got '--account=abc'"),
        ({"extra": ["--account=abc", 5]}, "slurm.extra[1] must be an sbatch option as a "
         "string, e.g. --account=abc, got 5"),
        ({"time": [4]}, "slurm.time must be a string, e.g. \"04:00:00\" or 90 (minutes), got [4]"),
        ({"mem": {"G": 64}}, "slurm.mem must be a string, e.g. 64G"),
        ({"partition": 5}, "slurm.partition must be a string, e.g. gpu, got 5"),
    ]  # fmt: skip
    for slurm_section, message in cases:
        with pytest.raises(SweepError, match=re.escape(message)):
            parse_sweep({**raw, "slurm": slurm_section})
    # `cofr sweep run` reads the same file, and refuses it as submit does.
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**raw, "slurm": {"gpus_per_worker": "two"}}))
    for command in ("run", "submit"):
        argv = ["sweep", command, str(path), "--runs-dir", str(tmp_path / "runs")]
        assert main([*argv, *(["--dry-run"] if command == "submit" else [])]) == 2
        err = capsys.readouterr().err
        assert f"cofr sweep {command}: error: slurm.gpus_per_worker must be" in err, err
        assert "Traceback" not in err
    # YAML's numbers are SLURM's minutes and megabytes; a null time is the partition's.
    sweep = parse_sweep({**raw, "slurm": {"time": 90, "mem": 16000, "extra": None}}, path)
    header = parse_sbatch_header(render(sweep, SubmitOptions()).script)
    assert (header["time"], header["mem"]) == ("90", "16000")
    sweep = parse_sweep({**raw, "slurm": {"time": None}}, path)
    assert "time" not in parse_sbatch_header(render(sweep, SubmitOptions()).script)
    # Too few CPUs from the sweep file are named as its field, not as the flag.
    sweep = parse_sweep({**raw, "slurm": {"cpus_per_worker": 2}}, path)
    with pytest.raises(SweepError, match=r"^slurm\.cpus_per_worker 2 cannot feed data"):
        render(sweep, SubmitOptions(settings={"data.num_workers": 3}))


def test_submit_refuses_a_database_it_cannot_reach_before_sbatch(tmp_path, monkeypatch):
    """Each array task found the storage unreachable once it started, after the queue's
    wait; submit asks the server first."""
    import socket

    import cofrgenet.sweeps.slurm as slurm

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    calls = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: calls.append(a))
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://cofr:secret@127.0.0.1:{port}/cofr"
    options = SubmitOptions(runs_dir=str(tmp_path / "runs"), storage=url)
    for dry_run in (False, True):  # the dry run, the preview, checks as the submit does
        with pytest.raises(
            SweepError, match=r"cannot reach the study database .*:\*\*\*@"
        ) as error:
            slurm.submit(load_sweep(SWEEPS / "tiny-cpu.yaml"), options, dry_run, wait=False)
        assert "secret" not in str(error.value) and calls == []
        assert str(error.value).endswith(
            "(where only the compute nodes reach it: --no-storage-check)"
        )
    assert not (tmp_path / "runs").exists()
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: calls.append(a) or subprocess.CompletedProcess(a, 0, stdout="7\n", stderr=""))  # fmt: skip
    options.check_storage = False
    assert (
        slurm.submit(load_sweep(SWEEPS / "tiny-cpu.yaml"), options, dry_run=False, wait=False)[1]
        == "7"
    )


def test_an_unreachable_databases_reason_hides_the_password_not_the_words_holding_it():
    """A password `p` was replaced in every word of the driver's reason: "port 1 failed"
    read "***ort 1 failed". It is hidden where it stands as a password: in a URL, or a
    libpq password= setting."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://u:p@127.0.0.1:{port}/db"
    with pytest.raises(SweepError) as error:
        st.check_reachable(url)
    assert f"port {port} failed" in str(error.value), error.value
    assert "***ort" not in str(error.value)
    reasons = {
        f"could not connect with {url}: port {port} failed": f"u:***@127.0.0.1:{port}/db: port",
        "invalid dsn: host=h password=p port=1": "host=h password=*** port=1",
        "invalid dsn: password='p q' port=1": "password=*** port=1",
        "bad: postgresql://u@h/db?sslmode=x&password=p": "sslmode=x&password=***",
    }
    for reason, shown in reasons.items():
        said = st._unreachable(url, RuntimeError(reason))
        assert shown in said and "=p" not in said and ":p@" not in said, said


def test_submit_refuses_a_tracking_server_it_cannot_reach_before_sbatch(tmp_path, monkeypatch):
    """Every task would hang on MLflow's retries after the queue's wait: submit asks the
    tracking server first (unless --no-storage-check: only the nodes may reach it)."""
    import dataclasses
    import socket

    import cofrgenet.sweeps.slurm as slurm
    from cofrgenet.errors import ConfigError

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    calls = []
    done = subprocess.CompletedProcess((), 0, stdout="8\n", stderr="")
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: calls.append(a) or done)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sweep = dataclasses.replace(
        load_sweep(SWEEPS / "tiny-cpu.yaml"), tracking_uri=f"http://127.0.0.1:{port}"
    )
    options = SubmitOptions(runs_dir=str(tmp_path / "runs"))
    with pytest.raises(ConfigError, match=r"^no MLflow server answers at http://127\.0\.0\.1"):
        slurm.submit(sweep, options, dry_run=False, wait=False)
    assert calls == []
    options.check_storage = False
    assert slurm.submit(sweep, options, dry_run=False, wait=False)[1] == "8"


def test_two_submits_in_one_second_keep_both_scripts_private(tmp_path, monkeypatch):
    """The script may hold the storage's password: it is written for its owner alone,
    and a second submit of the same second gets its own file (it was a FileExistsError)."""
    import cofrgenet.sweeps.slurm as slurm
    import cofrgenet.sweeps.worker as worker

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    monkeypatch.setattr(slurm.st, "check_reachable", lambda url: None)  # no server here
    monkeypatch.setattr(worker, "check_before_submit", lambda *a: None)  # nor its study
    monkeypatch.setattr(slurm.time, "strftime", lambda fmt, *a: "20261203-120000")
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, stdout="4242\n", stderr=""
    ))  # fmt: skip
    tiny = load_sweep(SWEEPS / "tiny-cpu.yaml")
    options = SubmitOptions(runs_dir=str(tmp_path / "runs"), storage="postgresql://u:pw@h/db")
    paths = [Path(slurm.submit(tiny, options, dry_run=False, wait=False)[0]) for _ in range(2)]
    assert [p.name for p in paths] == [
        "sweep-20261203-120000.sbatch",
        "sweep-20261203-120000-2.sbatch",
    ]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in paths)
    # A stopped worker says how to run it again: its own command line would name the
    # storage as env:COFR_SWEEP_STORAGE_URL, which the script alone sets; its task's
    # sbatch works from the login node.
    script = paths[1].read_text()
    assert (
        f'export COFR_SWEEP_AGAIN="sbatch --array=${{SLURM_ARRAY_TASK_ID:-0}} {paths[1]}"' in script
    )
    assert "--storage env:COFR_SWEEP_STORAGE_URL" in script
    monkeypatch.undo()  # subprocess.run as it is
    again = subprocess.run(
        ["bash", "-c", "\n".join(
            line for line in script.splitlines() if line.startswith("export COFR_SWEEP_AGAIN")
        ) + '\necho "$COFR_SWEEP_AGAIN"'],
        env={**os.environ, "SLURM_ARRAY_TASK_ID": "3"}, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert again == f"sbatch --array=3 {paths[1]}"

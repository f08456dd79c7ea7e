"""Sweeps: sweep files, workers in parallel, failures, killed workers, requeues, reports."""

from __future__ import annotations

import datetime
import errno
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import replace
from pathlib import Path

import mlflow
import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from cofrgenet.models import ModelConfig, build_model
from cofrgenet.sweeps import SweepError, load_sweep, parse_sweep
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.fitconfig import check_model_values, check_optimizer_values
from cofrgenet.sweeps.spec import (
    StorageOptions,
    check_budget,
    encode_value,
    parse_param,
    pruner_idle_in_budget,
    pruner_waits_past_budget,
    pruning_before_ladders,
    steps_for_tokens,
    trial_config,
)
from cofrgenet.sweeps.worker import open_study, run_worker

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "sweeps").glob("*.yaml"))
TESTS = Path(__file__).resolve().parent
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
POSTGRES_URL = os.environ.get("COFR_TEST_POSTGRES_URL")

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def _restore_mlflow_uri(monkeypatch):
    """In-process fits call mlflow.set_tracking_uri, which sets MLFLOW_TRACKING_URI for
    the whole process; restore it so later tests see the environment they started with."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    from cofrgenet.data import prepare_data

    out = tmp_path_factory.mktemp("data") / "pydoc-byte"
    prepare_data(source="pydoc", tokenizer="byte", out=out, max_docs=12, num_workers=1)
    return out


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    env.update(extra)
    return env


def cofr(*args: str) -> list[str]:
    return [sys.executable, "-m", "cofrgenet.cli", *args]


def write_sweep(tmp_path: Path, name: str = "sweep.yaml", **changes) -> Path:
    """The shipped tiny sweep, with the runs folder in tmp_path and ``changes`` on top."""
    raw = yaml.safe_load((ROOT / "sweeps" / "tiny-cpu.yaml").read_text())
    raw["base"] = [str(ROOT / b) for b in raw["base"]]
    raw["runs_dir"] = str(tmp_path / "runs")
    for key, value in changes.items():  # replaced, except overrides: merged
        raw[key] = {**raw[key], **value} if key == "overrides" else value
    for key in raw["space"]:  # a searched key is not also fixed (refused)
        raw["overrides"].pop(key, None)
    if (raw.get("budget") or {}).get("val_every"):  # the budget sets it
        raw["overrides"].pop("trainer.val_check_interval", None)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def mlflow_client(tmp_path: Path) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")


def study_of(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=st.open_storage(url))


# ----------------------------------------------------------------------- sweep files


def test_a_fixed_value_in_the_space_is_pointed_to_overrides():
    """`space: {model.config.depth: 3}` said only "expected a range string, a list or a
    mapping"; a value every trial takes belongs under overrides:."""
    with pytest.raises(SweepError, match=r"^space\.model\.config\.depth: expected a range "
                       r"string, a list or a mapping, not 3; a value every trial takes goes "
                       r"under overrides: \(model\.config\.depth: 3\)$"):  # fmt: skip
        parse_param("model.config.depth", 3)


def test_param_specs_read_ranges_and_choices():
    depth = parse_param("model.config.depth", "int 1..8")
    assert (depth.kind, depth.low, depth.high, depth.grid_values()) == (
        "int",
        1,
        8,
        list(range(1, 9)),
    )
    lr = parse_param("model.optimizer.lr", "float 1e-4..3e-3 log")
    assert lr.kind == "float" and lr.log and lr.low == 1e-4 and lr.high == 3e-3
    assert parse_param("k", "int 2..16 step 2").grid_values() == [2, 4, 6, 8, 10, 12, 14, 16]
    assert parse_param("k", [1, 3, 5, 7]).choices == (1, 3, 5, 7)
    with pytest.raises(SweepError, match=r"^space.k: low 8 > high 1$"):  # as written, not 8.0
        parse_param("k", "int 8..1")
    # A word given twice used its first; a repeated choice trained twice in a grid.
    with pytest.raises(SweepError, match=r"^space\.k: 'int 1\.\.3 step 2 step 5' gives step twice"):
        parse_param("k", "int 1..3 step 2 step 5")
    with pytest.raises(SweepError, match=r"^space\.k: choices repeat 1; give each value once$"):
        parse_param("k", [1, 1, 3])
    assert parse_param("k", [1, True, "1"]).choices == (1, True, "1")
    # An infinite end failed in the sampler ("refused by Optuna's TPESampler:
    # OverflowError"), a NaN one as "low nan > high 1": the end is named.
    for end, given in (("high", float("inf")), ("low", float("nan")), ("step", float("inf"))):
        bounds = {"type": "float", "low": 0.1, "high": 1, end: given}
        with pytest.raises(SweepError, match=rf"^space\.k: {given!r} is not a finite number$"):
            parse_param("k", bounds)
    assert parse_param("k", {"choices": ["a", "b"]}).kind == "categorical"
    for bad in ("int 1-8", "float 0..1 log", {"type": "int", "low": 1.5, "high": 3}, []):
        with pytest.raises(SweepError):
            parse_param("k", bad)
    with pytest.raises(SweepError, match="grid"):
        parse_param("k", "float 0.1..0.2").grid_values()
    # Three dots read `float 1e-4...3e-3` as 1e-4 to .3e-3 (3e-4), unsaid.
    for bad in ("float 1e-4...3e-3 log", "int 1...4"):
        with pytest.raises(SweepError, match=r"its ends go apart by two dots, not three"):
            parse_param("k", bad)
    assert parse_param("k", "float .1..0.5").low == 0.1  # a number may start with its dot


def test_sweep_values_that_would_break_every_worker_are_refused_when_read():
    """A sampler typo, a step of 0, a heat map of unknown keys, liveness settings under
    which live workers count as lost, n_trials beside a grid: refused with the key."""
    good = {"study": "s", "space": {"a.b": "int 1..4", "c": [1, 3]}, "n_trials": 2}
    cases = [
        ({"sampler": {"name": "tpe", "n_startup_trial": 4}}, "sampler.n_startup_trial: not an "
         "option of the tpe sampler (Optuna's TPESampler) (did you mean 'n_startup_trials'?)"),
        ({"sampler": {"name": "random", "multivariate": True}}, "sampler.multivariate"),
        ({"sampler": {"name": "tpee"}}, "got 'tpee' (did you mean 'tpe'?)"),
        ({"pruner": {"name": "medain"}}, "got 'medain' (did you mean 'median'?)"),
        ({"objective": {"metric": "val/loss", "direction": "minimise"}},
         "got 'minimise' (did you mean 'minimize'?)"),
        ({"space": {"c": {"choice": [1, 3]}}}, "unknown field(s) ['choice'] (did you mean 'choices'?)"),
        ({"budget": {"step": 6}}, "budget: unknown field(s) ['step'] (did you mean 'steps'?); known"),
        ({"storage_options": {"heartbeat_intervl": 5}}, "(did you mean 'heartbeat_interval'?)"),
        ({"sampler": {"name": "tpe", "seed": "x"}}, "sampler.seed must be a whole number"),
        # Choices that are not a list were split into their letters or keys.
        ({"space": {"c": {"choices": "13"}}}, "space.c: choices must be a list, e.g. "
         "{choices: [1, 3]}, got '13'"),
        ({"space": {"c": {"choices": {"a": 1}}}}, "space.c: choices must be a list, e.g. "
         "{choices: [1, 3]}, got {'a': 1}"),
        ({"heatmap": "a.b"}, "heatmap: a list of two keys of the space, got 'a.b'"),
        # Values of the wrong type: Optuna takes them, and fails at trial 0 or at 10.
        ({"sampler": {"name": "tpe", "gamma": 0.5}}, "sampler.gamma: 0.5 is refused by "
         "Optuna's TPESampler: TypeError: 'float' object is not callable"),
        ({"sampler": {"name": "tpe", "n_startup_trials": "x"}}, "sampler.n_startup_trials: "
         "'x' is refused by Optuna's TPESampler: TypeError"),
        ({"sampler": {"name": "tpe", "multivariate": True, "n_ei_candidates": "9"}},
         "sampler.n_ei_candidates: '9' is refused by Optuna's TPESampler"),
        ({"space": {"a.b": "int 1..4 step 0"}}, "space.a.b: step must be > 0"),
        ({"space": {"a.b": {"type": "int", "low": 1}}}, "space.a.b: an int range needs high, "
         "e.g. {type: int, low: 1, high: 4}"),
        ({"space": {"a.b": {"type": "float"}}}, "space.a.b: a float range needs low and high"),
        ({"objective": {"direction": "maximize"}}, "objective.direction maximize: val/loss is "
         "lower-is-better, as is every metric a trial reports; use minimize (the default)"),
        ({"space": {"a.b": {"type": "int", "low": 1, "high": 4, "step": -1}}}, "step must be > 0"),
        ({"space": {"a.b": "int 1..4 step 1.5"}}, "an int range needs a whole step"),
        ({"space": {"a.b": {"type": "float", "low": 1, "high": 4, "log": "no"}}},
         "space.a.b: log must be true or false, got 'no'"),
        ({"heatmap": ["a.b", "d"]}, "heatmap: 'd' is not a key of the space"),
        ({"experiment": "my exp"}, "experiment 'my exp' is not a folder name as given: use "
         "letters, digits, '.', '_' or '-', e.g. 'my-exp'"),  # "my-exp" would share runs/my-exp
        ({"experiment": "-x"}, "experiment '-x' is not a folder name as given: use letters, "
         "digits, '.', '_' or '-', not '.' or '-' first, e.g. 'x'"),
        ({"storage_options": {"heartbeat_interval": 120, "grace_period": 10}},
         "storage_options.grace_period 10 s must exceed twice the heartbeat_interval"),
        ({"storage_options": {"grace_period": -5}}, "storage_options.grace_period -5 s"),
        ({"storage_options": {"max_retry": "x"}}, "storage_options.max_retry must be a whole"),
        ({"storage_options": {"max_retry": -1}}, "storage_options.max_retry must be >= 0"),
        ({"sampler": {"name": "grid"}, "n_trials": 5}, "n_trials 5: a grid sweep trains each "
         "of its points once (8 points)"),
        # Overrides the sweep would replace in every trial.
        ({"overrides": {"a.b": 2}}, "overrides: a.b: the sweep searches this key; remove it "
         "from the space or remove it from the overrides"),
        ({"overrides": {"run.name": "mine"}}, "overrides: run.name: the sweep names each "
         "trial's run trial-<number>; remove it from the overrides"),
        ({"budget": {"steps": 6}, "overrides": {"trainer.max_steps": 100}},
         "overrides: trainer.max_steps: the sweep's budget sets this key"),
        # A searched key the sweep sets: trained with the sweep's value, the drawn one
        # recorded in the study.
        ({"budget": {"steps": 6}, "space": {"trainer.max_steps": "int 1..4"}},
         "space.trainer.max_steps: the sweep's budget sets trainer.max_steps; change the "
         "budget, or remove it from the space (each trial would train with the sweep's "
         "value, and the study record the drawn one)"),
        ({"budget": {"val_every": 2}, "space": {"trainer.val_check_interval": [3, 4]}},
         "space.trainer.val_check_interval: the sweep's budget.val_every sets"),
        ({"space": {"run.name": ["mine", "yours"]}}, "space.run.name: the sweep names each "
         "trial's run trial-<number>; remove it from the space (each trial"),
        ({"space": {"run": ["a", "b"]}}, "space.run: the sweep's experiment sets run.experiment"),
        ({"space": {"run.mlflow": [True, False]}}, "space.run.mlflow: run.* says where and "
         "how a trial is recorded, not what it trains, so there is nothing to search; set it "
         "in overrides instead"),
        # Sections written as a scalar or a list instead of a mapping.
        ({"sampler": "tpe"}, "sampler: a mapping of options is expected (e.g. `sampler: "
         "{name: tpe}`), got 'tpe'"),
        ({"pruner": "median"}, "pruner: a mapping of options is expected"),
        ({"objective": "val/loss"}, "objective: a mapping of options is expected"),
        ({"budget": 6}, "budget: a mapping of options is expected"),
        ({"overrides": ["a=1"]}, "overrides: a mapping of options is expected"),
        ({"base": 5}, "base: a config file or a list of them, got 5"),
        # Grid values: a list, within the range (whole for int), for the grid sampler.
        ({"sampler": {"name": "grid"}, "space": {"a.b": {"type": "int", "low": 1, "high": 4,
          "grid": [0, 9]}}}, "space.a.b: grid value 0 is not a whole number within 1..4"),
        ({"sampler": {"name": "grid"}, "space": {"a.b": {"type": "int", "low": 1, "high": 4,
          "grid": [2.5]}}}, "space.a.b: grid value 2.5 is not a whole number within 1..4"),
        ({"sampler": {"name": "grid"}, "space": {"a.b": {"type": "float", "low": 1, "high": 4,
          "grid": "1,2"}}}, "space.a.b: grid must be a list of values, e.g. [1, 4]"),
        ({"space": {"a.b": {"type": "int", "low": 1, "high": 4, "grid": [1, 2]}}},
         "space.a.b: grid values apply to the grid sampler only (sampler: {name: grid}); the "
         "tpe sampler draws from the range"),
    ]  # fmt: skip
    for changes, message in cases:
        with pytest.raises(SweepError, match=re.escape(message)):
            parse_sweep({**good, **changes})
    grid = parse_sweep({**good, "sampler": {"name": "grid"}, "n_trials": 8})
    assert grid.total_trials == 8
    space = {"a.b": {"type": "float", "low": 1, "high": 4, "grid": [1, 2.5, 4.0]}}
    grid = parse_sweep({**good, "space": space, "sampler": {"name": "grid"}, "n_trials": 3})
    assert grid.grid == [{"a.b": 1.0}, {"a.b": 2.5}, {"a.b": 4.0}]
    parse_sweep({**good, "sampler": {"name": "tpe", "multivariate": True, "n_startup_trials": 3}})
    parse_sweep({**good, "heatmap": ["c", "a.b"], "storage_options": {"grace_period": 121}})


def test_a_grid_too_large_is_refused_before_its_points_are_made(tmp_path, capsys):
    """A grid of a hundred million ints was built in memory as the file was read, by run,
    status, report and submit alike: the process ran out of memory, and the error blamed
    the batch size. Its size is counted from the ranges, and refused above the limit."""
    from cofrgenet.sweeps.spec import MAX_GRID_POINTS

    good = {"study": "s", "sampler": {"name": "grid"}}
    huge = {"a.b": "int 1..1000000000000", "c": [1, 3]}  # 2e12 points: no memory holds them
    message = (
        "sampler grid: the space has 2,000,000,000,000 points (a.b 1,000,000,000,000 x c 2), "
        f"more than the {MAX_GRID_POINTS:,} a grid sweep may queue (each point is a trial): "
        "give its ranges a coarser step or fewer choices, or use a tpe or random sampler "
        "with n_trials"
    )
    with pytest.raises(SweepError) as raised:
        parse_sweep({**good, "space": huge})
    assert str(raised.value) == message
    with pytest.raises(SweepError, match="the space has 10,001 points"):
        parse_sweep({**good, "space": {"a.b": "int 1..10001"}})
    space = {"a.b": "int 1..100", "c": {"type": "int", "low": 0, "high": 990, "step": 10}}
    assert parse_sweep({**good, "space": space}).total_trials == MAX_GRID_POINTS
    path = write_sweep(tmp_path, space={"model.config.depth": "int 1..1000000000000"},
                       sampler={"name": "grid"}, n_trials=None)  # fmt: skip
    for command in ("run", "status", "report", "submit"):
        line = one_line_error(capsys, ["sweep", command, str(path), "--runs-dir", str(tmp_path)])
        assert line.startswith(f"cofr sweep {command}: error: sampler grid: the space has "), line
        assert "(model.config.depth 1,000,000,000,000)" in line


def test_storage_variables_expand_braced_names_only(monkeypatch):
    """${VAR} from the environment; a bare $ is literal (passwords); a value that is one
    unset variable means the default (unless a close name is set: refused); an unset one
    inside a URL is refused where that storage is used, not when --storage replaces it."""
    good = {"study": "s", "space": {"a": [1, 2]}, "n_trials": 2}
    monkeypatch.delenv("COFR_SWEEP_STORAGE", raising=False)
    assert parse_sweep({**good, "storage": "${COFR_SWEEP_STORAGE}"}).storage is None
    url = "postgresql://bob:pa$$w0rd@db:5432/optuna"
    assert parse_sweep({**good, "storage": url}).storage == url
    monkeypatch.setenv("COFR_SWEEP_STORAGE", "postgresql://db/optuna")
    assert parse_sweep({**good, "storage": "${COFR_SWEEP_STORAGE}"}).storage == (
        "postgresql://db/optuna"
    )
    # A close name that is set: a typo, refused (it fell back to the local default, each
    # host's worker running a study of its own).
    typo = parse_sweep({**good, "storage": "${COFR_SWEEP_STORAG}"})
    with pytest.raises(SweepError, match=re.escape("(did you mean ${COFR_SWEEP_STORAGE}, wh")):
        st.home_storage(typo)
    inside = parse_sweep({**good, "storage": "postgresql://u:${NO_SUCH_PW_X}@db/optuna"})
    with pytest.raises(SweepError, match=r"^storage: \$\{NO_SUCH_PW_X\} is not set"):
        st.home_storage(inside)
    stored = parse_sweep({**good, "storage": "postgresql://u:${NO_SUCH_PW_X}@db/o"}, resolve=False)
    assert stored.storage is None and stored.storage_error is None  # status --storage URL
    with pytest.raises(SweepError, match=r"^tracking_uri: \$\{NO_SUCH_DIR_X\} is not set"):
        parse_sweep({**good, "tracking_uri": "sqlite:///${NO_SUCH_DIR_X}/mlflow.db"})


def test_sweep_review_edge_cases():
    """A sqlite URL with options names its file; an override of a parent key that does
    not hold the searched key stands; a stepped range's top end is the last step; a
    stored range's `log: 1` still reads."""
    assert st.storage_file("sqlite:////tmp/q.db?timeout=30") == Path("/tmp/q.db")
    good = {"study": "s", "space": {"model.config.depth": "int 1..3"}, "n_trials": 2}
    parse_sweep({**good, "overrides": {"model.config": {"dropout": 0.1}}})
    with pytest.raises(SweepError, match=r"overrides: model\.config: the sweep searches"):
        parse_sweep({**good, "overrides": {"model.config": {"depth": 2}}})
    from cofrgenet.sweeps.fitconfig import drawn_ends

    assert drawn_ends(parse_param("model.config.n_head", "int 2..5 step 2")) == [2, 4]
    # Drawn without Optuna's warning of it at every trial (the docs say it once).
    study = optuna.create_study()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trial = study.ask()
        assert parse_param("model.config.n_head", "int 2..5 step 2").suggest(trial) in (2, 4)
        assert parse_param("x", "float 0.1..0.35 step 0.1").suggest(trial) <= 0.3 + 1e-9
    ranged = {"type": "float", "low": 1e-4, "high": 1e-2, "log": 1}
    assert parse_param("model.optimizer.lr", ranged).log is True


def test_val_every_counts_optimizer_steps_under_accumulation():
    from cofrgenet.sweeps.spec import budget_settings

    sweep = parse_sweep(
        {"study": "s", "space": {"a": [1]}, "n_trials": 1, "budget": {"steps": 6, "val_every": 2}}
    )
    config = {"trainer": {"accumulate_grad_batches": 2}}
    assert budget_settings(sweep, config) == [
        ("trainer.max_steps", 6),
        ("trainer.val_check_interval", 4),  # batches: every 2 optimizer steps
    ]
    with pytest.raises(ValueError, match="needs the config"):
        budget_settings(sweep, None)


def test_the_shipped_sweeps_validate_where_they_checkpoint():
    """Lightning counts val_check_interval in batches: under accumulation a sweep that
    reports where it checkpoints multiplies by it (as conf/experiment's recipes do)."""
    for path in SWEEPS:
        overrides = load_sweep(path).overrides
        accumulate = overrides.get("trainer.accumulate_grad_batches", 1)
        interval = overrides.get("trainer.val_check_interval")
        every = overrides.get("run.checkpoint_every_n_steps")
        if isinstance(interval, int) and every:
            assert interval == every * accumulate, f"{path.name}: every {interval} batches"


def test_sweep_file_errors_name_the_problem(tmp_path):
    good = {"study": "s", "space": {"a.b": "int 1..2"}, "n_trials": 2}
    parse_sweep(good)
    with pytest.raises(SweepError, match=r"unknown sweep key.*did you mean 'sampler'"):
        parse_sweep({**good, "smapler": {}})
    for text, message in (
        ("", r"empty.yaml holds no settings"),
        ("- study: s\n", r"list.yaml is not a sweep file: it holds a YAML list"),
        ("study: s\nspace: {a.b: int 1..2}\nn_trials: 2\nsmapler: {}\n", r"in .*typo.yaml"),
    ):
        name = {"": "empty", "-": "list"}.get(text[:1], "typo")
        (tmp_path / f"{name}.yaml").write_text(text)
        with pytest.raises(SweepError, match=message):
            load_sweep(tmp_path / f"{name}.yaml")
    with pytest.raises(SweepError, match=r"is a folder, not a sweep file \(its sweep files: "):
        load_sweep(tmp_path)
    with pytest.raises(SweepError, match=r"sampler\.name"):
        parse_sweep({**good, "sampler": {"name": "cmaes-ish"}})
    with pytest.raises(SweepError, match="n_trials"):
        parse_sweep({k: v for k, v in good.items() if k != "n_trials"})
    with pytest.raises(SweepError, match=r"names conf/nowhere\.yaml, which is neither under"):
        parse_sweep({**good, "base": ["conf/nowhere.yaml"]})
    assert parse_sweep({**good, "sampler": {"name": "grid"}, "n_trials": None}).total_trials == 2


def test_a_sweeps_bases_are_found_as_a_fit_configs_are(tmp_path, monkeypatch):
    """One lookup for `base:` (recipes.find_base): a copy of a bundled sweep elsewhere
    finds conf/ in the checkout, and ${VAR} is the one variable syntax."""
    monkeypatch.chdir(tmp_path)
    copy = tmp_path / "mine.yaml"
    copy.write_text((ROOT / "sweeps" / "tiny-cpu.yaml").read_text())
    sweep = load_sweep(copy)
    assert all(base.is_file() for base in sweep.base)
    monkeypatch.setenv("COFR_TEST_GROUPS", str(ROOT / "conf" / "trainer"))
    text = copy.read_text()
    first = sweep.base[0].name
    assert f"conf/trainer/{first}" in text
    copy.write_text(text.replace(f"conf/trainer/{first}", f"${{COFR_TEST_GROUPS}}/{first}"))
    assert load_sweep(copy).base[0] == (ROOT / "conf" / "trainer" / first).resolve()
    monkeypatch.delenv("COFR_TEST_GROUPS")
    with pytest.raises(SweepError, match=r"\$\{COFR_TEST_GROUPS\} is not set"):
        load_sweep(copy)


def test_a_bundled_sweep_file_is_found_from_any_folder(tmp_path, monkeypatch, capsys):
    """`cofr fit --config conf/...` finds the checkout's files from anywhere, `cofr sweep
    run sweeps/tiny-cpu.yaml` did not. And status/report's --runs-dir help said "the
    sweep's runs_dir" where a study name has none."""
    import argparse

    from cofrgenet.sweeps.cli import add_run_arguments, add_study_arguments

    monkeypatch.chdir(tmp_path)
    sweep = load_sweep("sweeps/tiny-cpu.yaml")
    assert sweep.path == ROOT / "sweeps" / "tiny-cpu.yaml"
    line = one_line_error(capsys, ["sweep", "status", "sweeps/tiny-cpu.yaml"])
    assert "no study 'tiny-cpu' yet: " in line  # the file was read: its study is not there
    with pytest.raises(SweepError, match=r"no sweep file at sweeps/nope.yaml"):
        load_sweep("sweeps/nope.yaml")
    mine = tmp_path / "sweeps" / "tiny-cpu.yaml"  # one of the working directory wins
    mine.parent.mkdir()
    mine.write_text(yaml.safe_dump({**load_sweep(ROOT / "sweeps" / "tiny-cpu.yaml").raw,
                                    "study": "mine", "base": []}))  # fmt: skip
    assert load_sweep("sweeps/tiny-cpu.yaml").study == "mine"

    def runs_dir_help(add) -> str:
        parser = argparse.ArgumentParser()
        add(parser)
        (action,) = [a for a in parser._actions if "--runs-dir" in a.option_strings]
        return action.help

    assert runs_dir_help(add_study_arguments) == (
        "runs folder (default: a sweep file's runs_dir; with a study name, runs)"
    )
    assert runs_dir_help(add_run_arguments) == "runs folder (default: the sweep's runs_dir, runs)"


def test_workers_in_other_directories_read_the_same_bases_or_are_refused(
    tiny_data, tmp_path, monkeypatch
):
    """A base was looked up from the working directory first, and a joining worker was
    compared by the base entries' text alone: two workers started in different folders
    trained different configs under one study. A sweep's bases are found from its own
    folder first, and the study keeps what they hold: a worker whose files differ is
    refused, naming the file."""
    sweep_dir, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    for folder, lr in ((sweep_dir, 1e-3), (elsewhere, 3e-3)):
        (folder / "conf").mkdir(parents=True)
        (folder / "conf" / "lr.yaml").write_text(f"model:\n  optimizer:\n    lr: {lr}\n")
    raw = yaml.safe_load(write_sweep(tmp_path, overrides={"data.data_dir": str(tiny_data)})
                         .read_text())  # fmt: skip
    raw["base"] = [*raw["base"], "conf/lr.yaml"]
    path = sweep_dir / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(elsewhere)
    sweep = load_sweep(path)
    assert sweep.base[-1] == sweep_dir / "conf" / "lr.yaml"  # not the working directory's

    from cofrgenet.sweeps.worker import base_digests

    mine = base_digests(sweep)
    assert [d["entry"] for d in mine] == raw["base"]
    storage = st.open_storage(st.home_storage(sweep))
    open_study(sweep, storage, 0, bases=mine)
    assert not open_study(sweep, storage, 1, bases=base_digests(sweep))[1]
    # A comment or another layout changes no setting (a checkout updated between workers).
    (sweep_dir / "conf" / "lr.yaml").write_text("# the lr\nmodel: {optimizer: {lr: 1.0e-3}}\n")
    assert base_digests(sweep) == mine
    (sweep_dir / "conf" / "lr.yaml").write_text("model:\n  optimizer:\n    lr: 0.01\n")
    with pytest.raises(SweepError, match=(
        rf"^study 'tiny-cpu': base conf/lr.yaml holds other settings \({sweep_dir}/conf/lr.yaml, "
        r"changed since the study's first worker read it\): its trials would be ranked"
    )):  # fmt: skip
        run_worker(sweep, report=False, mlflow=False)
    moved = [{**d, "path": "/other/conf/lr.yaml", "sha256": "x"}
             if d["entry"] == "conf/lr.yaml" else d for d in mine]  # fmt: skip
    with pytest.raises(SweepError, match=r"\(/other/conf/lr.yaml here, .*sweep/conf/lr.yaml for "
                       r"the study's first worker\)"):  # fmt: skip
        open_study(sweep, storage, 2, bases=moved)


def test_tokens_budget_becomes_steps():
    config = {
        "data": {"batch_size": 8, "block_size": 1024},
        "trainer": {"devices": 8, "num_nodes": 2, "accumulate_grad_batches": 4},
    }
    assert steps_for_tokens(config, 524288 * 10) == 10
    assert steps_for_tokens(config, 1) == 1


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_shipped_sweep_builds_valid_trial_configs(path):
    """Each sweep's first and last grid corner parses through `cofr fit` and builds (meta)."""
    sweep = load_sweep(path)
    low = {p.key: p.default() for p in sweep.space}
    high = {p.key: (p.choices[-1] if p.choices else p.high) for p in sweep.space}
    for params in (low, high):
        params = {k: (int(v) if sweep.param(k).kind == "int" else v) for k, v in params.items()}
        config = trial_config(sweep, params)  # parses through `cofr fit`, or SweepError
        assert config["trainer"]["max_steps"] >= 1
        # No pruner of a shipped sweep judges trials before their deepest ladders train.
        assert pruning_before_ladders(sweep, config) is None
        model = config["model"]
        fields = {k: v for k, v in (model.get("config") or {}).items() if v is not None}
        with torch.device("meta"):
            build_model(ModelConfig.from_preset(model["preset"], **fields))
    if sweep.is_grid:
        assert len(sweep.grid) == sweep.total_trials


def test_paper_grid_is_d_by_l_in_1_3_5_7():
    sweep = load_sweep(ROOT / "sweeps" / "paper-grid-cofrgenet-f.yaml")
    points = {(p["model.config.depth"], p["model.config.ladders"]) for p in sweep.grid}
    assert points == {(d, n) for d in (1, 3, 5, 7) for n in (1, 3, 5, 7)}
    config = trial_config(sweep, sweep.grid[0])
    assert config["model"]["preset"] == "gpt2-small-f"  # CoFrGeNet-F at a small preset
    assert sweep.total_trials == 16


def test_trial_config_is_what_cofr_fit_makes_of_the_same_files_and_keys(tmp_path):
    """A trial's config is `cofr fit`'s parse of its base files and dotted keys: later files
    win, a dotted key sets one value, typed values keep their type."""
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(yaml.safe_dump({
        "trainer": {"accelerator": "cpu", "devices": 2, "max_steps": 20, "limit_val_batches": 4},
        "model": {"preset": "gpt2-tiny-f", "config": {"vocab_size": 320}},
        "data": {"data_dir": "data/pydoc-byte", "batch_size": 16},
    }))  # fmt: skip
    second.write_text(yaml.safe_dump({
        "model": {"config": {"vocab_size": 257, "block_size": 32}},
        "data": {"batch_size": 4},
    }))  # fmt: skip
    callbacks = [
        {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor",
         "init_args": {"logging_interval": "step"}}
    ]  # fmt: skip
    overrides = {
        "model.config.depth": 2,
        "trainer.devices": 1,
        "model.optimizer.betas": [0.9, 0.99],
        "data.data_dir": str(tmp_path / "a folder"),
        "run.tracking_uri": None,
        "trainer.enable_progress_bar": False,
        "trainer.callbacks": callbacks,
    }
    sweep = parse_sweep({
        "study": "merge", "base": [str(first), str(second)], "overrides": overrides,
        "space": {"model.optimizer.lr": "float 1e-4..3e-3 log", "model.config.ladders": [1, 3]},
        "budget": {"steps": 6, "val_every": 2}, "n_trials": 1,
    })  # fmt: skip
    params = {"model.optimizer.lr": 0.0012345678901234567, "model.config.ladders": 3}
    config = trial_config(sweep, params, extra={"trainer.limit_val_batches": 2})

    # What a user gives `cofr fit` for the same: the files, then the keys (trainer.devices in
    # a file: on the command line the parser would keep "1" as a string).
    from cofrgenet.sweeps.fitconfig import resolve_config

    devices = tmp_path / "devices.yaml"
    devices.write_text("trainer: {devices: 1}\n")
    typed = [
        "--config", str(first), "--config", str(second), "--config", str(devices),
        "--model.config.depth", "2", "--model.optimizer.betas", "[0.9, 0.99]",
        "--data.data_dir", str(tmp_path / "a folder"), "--run.tracking_uri", "null",
        "--trainer.enable_progress_bar", "false",
        "--trainer.callbacks", '[{"class_path": "lightning.pytorch.callbacks.LearningRateMonitor",'
        ' "init_args": {"logging_interval": "step"}}]',
        "--trainer.limit_val_batches", "2",
        "--model.optimizer.lr", "0.0012345678901234567", "--model.config.ladders", "3",
        "--trainer.max_steps", "6", "--trainer.val_check_interval", "2",
    ]  # fmt: skip
    assert config == resolve_config(typed)

    model, data, trainer = config["model"], config["data"], config["trainer"]
    assert (model["config"]["vocab_size"], model["config"]["block_size"]) == (257, 32)
    assert (model["config"]["depth"], model["config"]["ladders"]) == (2, 3)
    assert model["optimizer"]["lr"] == 0.0012345678901234567
    assert model["optimizer"]["betas"] == [0.9, 0.99]
    assert (data["data_dir"], data["batch_size"]) == (str(tmp_path / "a folder"), 4)
    assert (trainer["accelerator"], trainer["devices"], trainer["max_steps"]) == ("cpu", 1, 6)
    assert (trainer["val_check_interval"], trainer["limit_val_batches"]) == (2, 2)
    assert trainer["enable_progress_bar"] is False
    assert trainer["callbacks"][0]["init_args"]["logging_interval"] == "step"
    assert config["run"]["tracking_uri"] is None
    for value in (3, 1e-05, float("inf"), True, None, [1, "a"], {"a": [1, 2]}):
        assert yaml.safe_load(encode_value(value)) == value
    assert encode_value("a b: c") == "a b: c"


def test_a_later_setting_wins_over_an_earlier_one_inside_it():
    """The settings file goes before the --KEY=VALUE words: a setting replaced by a later
    one (same key, or a key above it) is dropped, so the order of the sweep holds."""
    from cofrgenet.sweeps.fitconfig import split_settings

    layer, words = split_settings([
        ("trainer.callbacks", [{"class_path": "a.B"}]),
        ("trainer.logger.init_args.save_dir", "x"),  # inside an option: a word
        ("trainer.logger", False),                    # ...replaced here
        ("trainer.max_steps", 5), ("trainer.max_steps", 6),
        ("model.optimizer.lr", 0.1), ("model.optimizer", None),
        ("nowhere.key", 1),                           # unknown: a word, the parser names it
    ])  # fmt: skip
    assert layer == {
        "trainer": {"callbacks": [{"class_path": "a.B"}], "logger": False, "max_steps": 6},
        "model": {"optimizer": None},
    }
    assert words == [("nowhere.key", 1)]


def test_a_mapping_to_a_group_of_options_merges_with_the_settings_beside_it(tmp_path):
    """`model: {preset: gpt2-tiny-f}` after `model.config.vocab_size: 320` (and other
    keys under `model`) dropped them: the trial trained with vocab_size null. It sets the
    options it names, as `cofr fit` merges a config file's mapping; so does a mapping to
    `model.optimizer` (a dataclass: `cofr fit` merges it field by field, it dropped an
    earlier `model.optimizer.warmup_steps`); an option's own value (a list, a dict-valued
    option's mapping such as `trainer.logger`'s) still replaces what was set inside it."""
    from cofrgenet.sweeps.fitconfig import kept_since_merging, split_settings
    from cofrgenet.training.cli import resolve_fit_config

    settings = [
        ("model.config.vocab_size", 320),
        ("model.optimizer.warmup_steps", 2),
        ("model", {"preset": "gpt2-tiny-f", "config": {"block_size": 32}}),
        ("data", {}),  # sets nothing, as in a config file
        ("trainer.logger.init_args.save_dir", "x"),
        ("trainer", {"logger": False}),  # an option's value: replaces the entry inside it
        ("model.optimizer", {"lr": 0.1}),  # likewise
    ]
    layer, words = split_settings(settings)
    assert layer == {
        "model": {
            "config": {"vocab_size": 320, "block_size": 32},
            "preset": "gpt2-tiny-f",
        },
        "trainer": {"logger": False},
    }
    assert words == [("model.optimizer.warmup_steps", 2), ("model.optimizer.lr", 0.1)]
    # What a cofr that replaced the whole group dropped: the keys a study made then lacks.
    dropped = ["model.config.vocab_size", "model.optimizer.warmup_steps"]
    assert kept_since_merging(settings) == dropped
    assert kept_since_merging(settings, version=1) == ["model.optimizer.warmup_steps"]
    assert kept_since_merging(settings, version=2) == []
    assert kept_since_merging([("model", {"preset": "x"}), ("model.config.depth", 2)]) == []
    # The finding's sweep: its trials get all of their overrides.
    overrides = {
        "model.config.vocab_size": 320,
        "model.config.block_size": 32,
        "model.optimizer.warmup_steps": 2,
        "data.block_size": 32,
        "model": {"preset": "gpt2-tiny-f"},
    }
    raw = yaml.safe_load((ROOT / "sweeps" / "tiny-cpu.yaml").read_text())
    raw.update(base=[str(ROOT / b) for b in raw["base"]], overrides=overrides)
    config = trial_config(parse_sweep(raw), {"model.config.depth": 2, "model.config.ladders": 1,
                                             "model.optimizer.lr": 1e-3})  # fmt: skip
    model = config["model"]
    assert (model["preset"], model["config"]["vocab_size"], model["config"]["block_size"]) == (
        "gpt2-tiny-f", 320, 32,
    )  # fmt: skip
    assert (model["optimizer"]["warmup_steps"], model["optimizer"]["lr"]) == (2, 1e-3)
    # As `cofr fit` makes of the same settings in two config files.
    overrides["model"] = {"preset": "gpt2-tiny-f", "optimizer": {"weight_decay": 0.25}}
    raw["overrides"] = overrides
    optimizer = trial_config(parse_sweep(raw), {"model.config.depth": 2})["model"]["optimizer"]
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("model: {optimizer: {warmup_steps: 2}}")
    second.write_text("model: {optimizer: {weight_decay: 0.25}}")
    args = [w for b in raw["base"] for w in ("--config", b)]
    args += ["--config", str(first), "--config", str(second)]
    fit = yaml.safe_load(resolve_fit_config(args))["model"]["optimizer"]
    assert (optimizer["warmup_steps"], optimizer["weight_decay"]) == (2, 0.25)
    assert optimizer == fit
    # A key misspelt inside such a mapping is named with a did-you-mean.
    raw["overrides"] = {"model": {"preest": "gpt2-tiny-f"}}
    with pytest.raises(
        SweepError, match=r"unknown key 'model\.preest' \(did you mean 'model\.preset'"
    ):
        trial_config(parse_sweep(raw), {"model.config.depth": 2})


def test_a_study_made_when_a_group_mapping_dropped_settings_is_not_resumed(tmp_path, monkeypatch):
    """A study made by a cofr that dropped the settings before `model: {...}` trained
    without them; this cofr keeps them, so its trials would differ under the same sweep
    file (the stored copy compares equal). Refused, naming them; a study made since, or
    one whose settings have no such mapping, goes on."""
    import cofrgenet.sweeps.worker as worker
    from cofrgenet.sweeps.spec import Sweep

    def sweep(study: str, overrides: dict) -> Sweep:
        return parse_sweep({"study": study, "space": {"model.config.depth": "int 1..4"},
                            "n_trials": 2, "overrides": overrides})  # fmt: skip

    dropping = {"model.config.vocab_size": 320, "model": {"preset": "gpt2-tiny-f"}}
    preset = {"model": {"preset": "gpt2-tiny-f"}}  # as a --set, after the overrides
    url = f"journal:{tmp_path / 's.journal'}"
    storage = st.open_storage(url)
    with monkeypatch.context() as patch:  # made as before: without the study's mark
        patch.setattr(worker, "MERGED_ATTR", "cofr.unused")
        open_study(sweep("old", dropping), storage, 0)
        open_study(sweep("plain", {"model.preset": "gpt2-tiny-f"}), storage, 0)
        open_study(sweep("set", {"model.config.vocab_size": 320}), storage, 0, preset)
    with pytest.raises(SweepError) as raised:
        open_study(sweep("old", dropping), storage, 1)
    assert str(raised.value).startswith(
        "study 'old' was made by an older cofr, which dropped model.config.vocab_size (given "
        "before a mapping above them, such as `model: {...}` or `model.optimizer: {...}`); "
        "this cofr keeps them"
    )
    with pytest.raises(SweepError, match=r"which dropped model\.config\.vocab_size"):
        open_study(sweep("set", {"model.config.vocab_size": 320}), storage, 1, preset)
    with pytest.raises(SweepError, match="made by an older cofr"):  # submit checks it too
        worker.check_before_submit(sweep("old", dropping), url, {}, data=False)
    open_study(sweep("plain", {"model.preset": "gpt2-tiny-f"}), storage, 1)
    # Made by a cofr that merged group mappings but not a mapping to model.optimizer.
    optimizer = {"model.optimizer.lr": 0.01, "model.optimizer": {"weight_decay": 0.2}}
    study, _ = open_study(sweep("optimizer", optimizer), storage, 0)
    study.set_user_attr(worker.MERGED_ATTR, True)
    with pytest.raises(SweepError, match=r"which dropped model\.optimizer\.lr \("):
        open_study(sweep("optimizer", optimizer), storage, 1)
    open_study(sweep("new", dropping), storage, 0)
    _, created = open_study(sweep("new", dropping), storage, 1)
    assert not created


# ------------------------------------------------------------------ local sweeps


def storages(tmp_path: Path, kind: str) -> str:
    if kind == "journal":
        return f"journal:{tmp_path / 'runs' / 'sweeps' / 'study.journal'}"
    if not POSTGRES_URL:
        pytest.skip(
            "COFR_TEST_POSTGRES_URL is not set: no PostgreSQL server to test against "
            "(CI starts one with .ci/services.sh start)"
        )
    pytest.importorskip("psycopg", reason="psycopg (psycopg[binary]) is not installed")
    return POSTGRES_URL


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["journal", "postgresql"])
def test_two_workers_in_parallel(kind, tiny_data, tmp_path, capsys):
    """2 worker processes on one storage: every trial finishes, MLflow nests, report written."""
    url = storages(tmp_path, kind)
    study_name = f"tiny-{kind}-{uuid.uuid4().hex[:8]}"
    sweep_path = write_sweep(tmp_path, study=study_name, storage=url)
    args = cofr("sweep", "run", str(sweep_path), "--set", f"data.data_dir={tiny_data}")
    logs = [open(tmp_path / f"worker{i}.log", "w") for i in range(2)]  # noqa: SIM115
    procs = [
        subprocess.Popen([*args, "--worker-index", str(i)], env=worker_env(), stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        for i, log in enumerate(logs)
    ]  # fmt: skip
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    output = "\n".join((tmp_path / f"worker{i}.log").read_text()[-3000:] for i in range(2))
    assert codes == [0, 0], output

    study = study_of(url, study_name)
    trials = study.get_trials()
    sweep = load_sweep(sweep_path)
    assert sweep.total_trials <= len(trials) <= sweep.total_trials + 1
    assert all(t.state in FINISHED for t in trials), [t.state for t in trials]
    assert all(t.user_attrs.get(st.FAIL_REASON) for t in trials if t.state == TrialState.FAIL)
    assert any(t.state == TrialState.COMPLETE for t in trials)
    workers = {t.user_attrs[st.PID] for t in trials}
    assert len(workers) == 2, "both workers should have run trials"
    # Intermediate values are reported at global steps (val every 2 steps of 6).
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert (
        set(complete[0].intermediate_values) <= {2, 4, 6} and 6 in complete[0].intermediate_values
    )

    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name(study_name)
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if r.data.tags.get("cofr.sweep") == "parent"]
    assert len(parents) == 1
    parent = parents[0]
    assert study.user_attrs[st_parent_attr()] == parent.info.run_id
    assert parent.data.params["sampler.name"] == "tpe"  # one param per option, no repr
    assert parent.data.tags["mlflow.user"] and parent.data.tags["cofrgenet.version"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(trials)
    by_number = {int(r.data.tags["optuna.trial_number"]): r for r in children}
    for trial in trials:
        child = by_number[trial.number]
        assert child.data.tags["optuna.state"] == trial.state.name
        for key, value in trial.params.items():
            assert child.data.params[key] == str(value)
    # The trial's curves and its objective value sit at the steps Optuna saw them.
    done = by_number[complete[0].number]
    val = client.get_metric_history(done.info.run_id, "val/loss")
    assert {m.step for m in val} == set(complete[0].intermediate_values)
    (value,) = client.get_metric_history(done.info.run_id, "optuna/value")
    assert (value.step, value.value) == (6, complete[0].value)

    report = tmp_path / "runs" / "sweeps" / study_name / "report"
    for name in (
        "summary.md",
        "optimization_history.png",
        "heatmap.png",
        "intermediate_values.png",
        "trials.csv",
    ):
        assert (report / name).is_file(), name
    assert f"# Sweep report: {study_name}" in (report / "summary.md").read_text()
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert "report/summary.md" in artifacts

    # `cofr sweep status` prints every trial.
    from cofrgenet.cli import main

    capsys.readouterr()
    assert main(["sweep", "status", str(sweep_path)]) == 0
    assert f"study {study_name}: {len(trials)} trials" in capsys.readouterr().out
    if kind == "postgresql":
        optuna.delete_study(study_name=study_name, storage=url)


def st_parent_attr() -> str:
    from cofrgenet.sweeps.tracking import PARENT_ATTR

    return PARENT_ATTR


def test_failed_trials_keep_their_reason_and_the_study_goes_on(tiny_data, tmp_path, caplog):
    """A sample the model rejects and a NaN loss end FAIL with reasons; the rest run. The
    worker that finishes the study says where its report is."""
    sweep_path = write_sweep(
        tmp_path,
        sampler={"name": "grid"},
        pruner={"name": "none"},
        n_trials=None,
        space={"data.block_size": {"choices": [64, 32]}, "model.optimizer.lr": {"choices": [1e-3, 0.5]}},
        overrides={
            "data.data_dir": str(tiny_data),
            "trainer.callbacks": [
                {"class_path": "sweep_helpers.PoisonWeights", "init_args": {"lr_above": 0.1}},
                # the file's own guard: it too must not say how to start the trial again
                {"class_path": "cofrgenet.training.callbacks.NonFiniteLossGuard"},
            ],
        },
    )  # fmt: skip
    sweep = load_sweep(sweep_path)
    with caplog.at_level("INFO", logger="cofrgenet.sweeps"):
        result = run_worker(sweep, report=True)
    report = tmp_path / "runs" / "sweeps" / sweep.study / "report"
    assert f"study {sweep.study} done: report in {report} (" in caplog.text
    trials = result.study.get_trials()
    assert len(trials) == 4 and result.done
    for trial in trials:
        block, lr = trial.params["data.block_size"], trial.params["model.optimizer.lr"]
        if block == 64:  # longer than the model's 32: refused when the trial starts
            assert trial.state == TrialState.FAIL
            assert "exceeds the model's block_size=32" in trial.user_attrs[st.FAIL_REASON]
        elif lr > 0.1:
            assert trial.state == TrialState.FAIL
            assert trial.user_attrs[st.FAIL_REASON].startswith("non-finite loss")
            # The trial is the sweep's to run again, not a fit started by hand.
            assert "--run.name" not in trial.user_attrs[st.FAIL_REASON]
        else:
            assert trial.state == TrialState.COMPLETE
    summary = (tmp_path / "runs" / "sweeps" / sweep.study / "report" / "summary.md").read_text()
    assert "non-finite loss" in summary and "Best trial" in summary
    # 1 complete trial: no importances (equal bars that meant nothing), and it says why.
    assert "![parameter importances]" not in summary
    assert "1 complete trial: at least 2 needed" in summary


def _wait_for(predicate, timeout: float, proc: subprocess.Popen | None = None, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"worker exited ({proc.returncode}) before {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def slow_sweep(tmp_path: Path, tiny_data: Path) -> Path:
    return write_sweep(
        tmp_path,
        n_trials=1,
        pruner={"name": "none"},
        budget={"steps": 8},
        overrides={
            "data.data_dir": str(tiny_data),
            "trainer.val_check_interval": 4,
            "trainer.callbacks": [{"class_path": "sweep_helpers.SleepPerStep"}],
        },
    )


@pytest.mark.slow
def test_a_trial_trains_on_two_spawned_processes(tiny_data, tmp_path):
    """What `cofr sweep submit --gpus-per-worker 2` asks of each worker (ddp_spawn), on 2
    CPU processes: the trial completes (a callback that did not pickle failed them all)."""
    sweep_path = write_sweep(
        tmp_path, n_trials=1, pruner={"name": "none"}, overrides={"data.data_dir": str(tiny_data)}
    )
    spawn = ["trainer.devices=2", "trainer.strategy=ddp_spawn", "trainer.accelerator=cpu"]
    args = cofr("sweep", "run", str(sweep_path), "--no-report", *[f"--set={s}" for s in spawn])
    done = subprocess.run(args, env=worker_env(), capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep = load_sweep(sweep_path)
    [trial] = study_of(st.default_storage(sweep), sweep.study).get_trials()
    assert trial.state == TrialState.COMPLETE, trial.user_attrs


def test_ctrl_c_stops_the_worker_with_130_and_names_the_sweep_command(tiny_data, tmp_path):
    """The trial saves and is queued for a retry; the worker says to run the sweep again
    (not `cofr fit`, which would train the trial outside the study), once, and exits 130."""
    sweep_path = slow_sweep(tmp_path, tiny_data)
    sweep = load_sweep(sweep_path)
    run_dir = tmp_path / "runs" / sweep.experiment / "trial-0000"
    proc = subprocess.Popen(
        cofr("sweep", "run", str(sweep_path), "--no-report"),
        env=worker_env(COFR_TEST_SLEEP="1.5"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_for(
            lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), 300, proc, "a checkpoint"
        )
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    command = f"cofr sweep run {sweep_path} --no-report"
    assert (
        f"stopped by a signal; the trial resumes from its checkpoint when a worker runs "
        f"again: {command}" in out
    )
    # Said once, as the worker stops: the fit's own "resume with:" line said it before.
    assert out.count(command) == 1, out[-3000:]
    assert "resume with:" not in out
    # The retry completes: the stop's traceback and step tag are no longer the trial's.
    assert (run_dir / "error.txt").exists()
    result = run_worker(sweep, report=False)
    assert [t.state for t in result.study.get_trials()] == [TrialState.FAIL, TrialState.COMPLETE]
    assert not (run_dir / "error.txt").exists()
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert "cofr.stopped_at_step" not in mlflow_client(tmp_path).get_run(run_id).data.tags


def test_killed_worker_trial_is_failed_and_retried_from_its_checkpoint(tiny_data, tmp_path):
    sweep_path = slow_sweep(tmp_path, tiny_data)
    sweep = load_sweep(sweep_path)
    url = st.default_storage(sweep)
    run_dir = tmp_path / "runs" / sweep.experiment / "trial-0000"
    log = open(tmp_path / "killed.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cofr("sweep", "run", str(sweep_path)), env=worker_env(COFR_TEST_SLEEP="1.5"),
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_for(
            lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), 300, proc, "a checkpoint"
        )
        proc.kill()  # SIGKILL: no handler runs, the trial stays RUNNING in the journal
        proc.wait(timeout=30)
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
    study = study_of(url, sweep.study)
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]

    # Another worker (here in-process) finds the dead worker's trial, fails it and retries it.
    result = run_worker(sweep, report=False)
    trials = result.study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "died during the trial" in trials[0].user_attrs[st.FAIL_REASON]
    assert trials[1].system_attrs["retry_history"] == [0]
    assert trials[1].params == trials[0].params
    assert trials[1].user_attrs[st.RESUMED] >= 2, "the retry must resume the checkpoint"
    assert not any(t.state == TrialState.RUNNING for t in trials)
    # One MLflow run for both attempts (same run folder), finished.
    client = mlflow_client(tmp_path)
    exp = client.get_experiment_by_name(sweep.experiment)
    children = [
        r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" in r.data.tags
    ]
    assert len(children) == 1 and children[0].data.tags["optuna.state"] == "COMPLETE"
    # The journal is intact: a fresh reader sees the same history.
    assert [t.state for t in study_of(url, sweep.study).get_trials()] == [t.state for t in trials]


@pytest.mark.slow
def test_a_worker_taken_for_lost_hands_its_trial_to_the_retry(tiny_data, tmp_path, caplog):
    """A worker fails a trial as lost while its worker, on "another host", still trains it
    (its heartbeats were refused, say), and takes the retry. The retry used to fail for
    good on the busy run folder while the first attempt trained on, unrecorded. Now the
    first worker sees within a heartbeat that its trial ended, saves and stops without
    touching the study or the MLflow run; the retry waits for the folder, resumes from
    that checkpoint and completes."""
    import threading

    from cofrgenet.training.runlock import RunLock

    sweep_path = write_sweep(
        tmp_path,
        n_trials=1,
        pruner={"name": "none"},
        budget={"steps": 8},
        storage_options={"heartbeat_interval": 1, "grace_period": 60},
        overrides={
            "data.data_dir": str(tiny_data),
            "trainer.val_check_interval": 4,
            "trainer.callbacks": [{"class_path": "sweep_helpers.SleepPerStep"}],
        },
    )
    sweep = load_sweep(sweep_path)
    url = st.default_storage(sweep)
    run_dir = tmp_path / "runs" / sweep.experiment / "trial-0000"
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(  # one trial: the retry is left to the other worker
            cofr("sweep", "run", str(sweep_path), "--no-report", "--n-trials", "1"),
            env=worker_env(COFR_TEST_SLEEP="1.5"), stdout=log, stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )  # fmt: skip
        try:
            _wait_for(
                lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), 300, proc, "a checkpoint"
            )
            # What the lost check of a worker on another host does to it.
            study = study_of(url, sweep.study)
            storage = st.open_storage(url)
            lost = st.frozen_trial(storage, study, 0)
            reason = "worker slurm-7_0 lost: no heartbeat for more than 60 s"
            assert st.fail_trial(storage, st.trial_id(storage, study, 0), reason, retry=True)
            assert st.retry_trial(study, lost, sweep.storage_options.max_retry) == 1
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
    # The retry finds the folder held (here by this process, in the first attempt's
    # stead: when the retry's worker gets there first is up to the machine).
    held = RunLock(run_dir)
    held.acquire()
    timer = threading.Timer(2.0, held.release)
    timer.start()
    try:
        with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
            result = run_worker(sweep, report=False)  # that worker takes the retry
    finally:
        timer.cancel()
        held.release()
    assert f"trial 1: run folder {run_dir} is in use by process {os.getpid()}" in caplog.text
    out = log_path.read_text()
    assert proc.returncode == 0, out[-3000:]
    assert "trial 0 was ended by another worker, which took this one for lost" in out
    stopped = re.search(r"trial 0: FAIL \(ended by another worker.*stopped at step (\d+)", out)
    assert stopped, out[-3000:]
    assert [(n, o.state) for n, o in result.outcomes] == [(1, TrialState.COMPLETE)]
    trials = study_of(url, sweep.study).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].user_attrs[st.FAIL_REASON] == reason  # the lost check's, kept
    assert trials[1].user_attrs[st.RESUMED] == int(stopped.group(1)) > 0
    client = mlflow_client(tmp_path)
    run = client.get_run((run_dir / "mlflow_run_id").read_text().strip())
    assert (run.info.status, run.data.tags["optuna.state"]) == ("FINISHED", "COMPLETE")


@pytest.mark.slow
def test_requeued_slurm_task_resumes_its_own_trial(tiny_data, tmp_path):
    """SIGUSR1 (SLURM's time-limit warning): checkpoint, leave the trial RUNNING, exit; the
    requeued task (same array id) resumes that trial from its checkpoint."""
    sweep_path = slow_sweep(tmp_path, tiny_data)
    sweep = load_sweep(sweep_path)
    run_dir = tmp_path / "runs" / sweep.experiment / "trial-0000"
    slurm = {"SLURM_JOB_ID": "4243", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "0"}
    # No scontrol to call: a stub records the requeue request.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.calls\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = worker_env(**slurm, PATH=f"{bin_dir}:{os.environ['PATH']}")
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        cofr("sweep", "run", str(sweep_path)), env={**env, "COFR_TEST_SLEEP": "1.5"},
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    try:
        _wait_for(
            lambda: (run_dir / "checkpoints" / "last.ckpt").exists(), 300, proc, "a checkpoint"
        )
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=120) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242_0"]
    url = st.default_storage(sweep)
    (trial,) = study_of(url, sweep.study).get_trials()
    assert trial.state == TrialState.RUNNING and trial.user_attrs["cofr.requeued_at"]
    stopped = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]

    second = subprocess.run(
        cofr("sweep", "run", str(sweep_path)), env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600
    )  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    (trial,) = study_of(url, sweep.study).get_trials()
    assert trial.state == TrialState.COMPLETE
    assert trial.user_attrs[st.RESUMED] == stopped > 0
    assert trial.user_attrs[st.WORKER_ID] == "slurm-4242_0"


def test_a_folder_from_another_study_is_moved_aside(tiny_data, tmp_path):
    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=1, overrides={"data.data_dir": str(tiny_data)})
    )
    stale = tmp_path / "runs" / sweep.experiment / "trial-0000" / "checkpoints"
    stale.mkdir(parents=True)
    (stale / "last.ckpt").write_text("not ours")
    result = run_worker(sweep, report=False, mlflow=False)
    assert [t.state for t in result.study.get_trials()] == [TrialState.COMPLETE]
    moved = list((tmp_path / "runs" / sweep.experiment).glob("trial-0000.old-*"))
    assert len(moved) == 1 and (moved[0] / "checkpoints" / "last.ckpt").read_text() == "not ours"
    # The config the sweep resolved (under the command line) is the one the trial trained with.
    run_dir = tmp_path / "runs" / sweep.experiment / "trial-0000"
    resolved = (run_dir / "sweep-trial.yaml").read_text()
    assert resolved.startswith("# cofr fit --config ")
    assert yaml.safe_load(resolved) == yaml.safe_load((run_dir / "config.yaml").read_text())


def test_a_study_of_the_same_name_in_another_storage_is_refused(tiny_data, tmp_path, capsys):
    """`storage: ${COFR_SWEEP_STORAGE}` run once unset, once set: the second run started a
    new study and moved the first one's trial folders aside, while the first study still
    pointed to them."""
    common = {"n_trials": 1, "overrides": {"data.data_dir": str(tiny_data)}}
    sweep = load_sweep(write_sweep(tmp_path, **common))
    run_worker(sweep, report=False, mlflow=False)
    trial = tmp_path / "runs" / sweep.experiment / "trial-0000"
    other = f"journal:{tmp_path / 'other.journal'}"
    moved = load_sweep(write_sweep(tmp_path, "moved.yaml", storage=other, **common))
    with pytest.raises(SweepError) as refused:
        run_worker(moved, report=False, mlflow=False)
    home = f"journal:{(tmp_path / 'runs' / 'sweeps' / sweep.study / 'optuna.journal').resolve()}"
    assert str(refused.value) == (  # the storage, as the trial recorded it: named
        f"study 'tiny-cpu' is not in {other}, but {trial} holds a trial of a study of that "
        f"name, stored elsewhere: give the storage its workers used (--storage {home}, or "
        f"the sweep's storage:), a new --study NAME, or move {trial.parent} away to start "
        "the study anew"
    )
    assert trial.is_dir() and not list(trial.parent.glob("trial-0000.old-*"))
    # The journal the refused start made, empty, goes: it would pass for the study's home.
    assert not (tmp_path / "other.journal").exists()
    # `cofr sweep status` of that file said "no study yet" only: it names the storage too.
    line = one_line_error(capsys, ["sweep", "status", str(tmp_path / "moved.yaml")])
    assert line.endswith(f"; its trials ({trial}) were run with --storage {home}")
    # Nor does a refused worker leave the study folder it made in its runs folder.
    home = f"journal:{tmp_path / 'runs' / 'sweeps' / sweep.study / 'optuna.journal'}"
    elsewhere = tmp_path / "elsewhere"
    with pytest.raises(SweepError, match="other --set settings"):
        run_worker(sweep, storage_url=home, runs_dir=str(elsewhere), report=False,
                   mlflow=False, extra={"data.block_size": 16})  # fmt: skip
    assert not (elsewhere / "sweeps").exists()
    # Its own default journal's folder too (the study folder, made by the storage).
    import shutil

    shutil.rmtree(tmp_path / "runs" / "sweeps")
    with pytest.raises(SweepError, match="holds a trial of a study of that name"):
        run_worker(sweep, report=False, mlflow=False)
    assert not (tmp_path / "runs" / "sweeps").exists()


def test_open_study_enqueues_the_grid_once(tmp_path):
    sweep = parse_sweep(
        {"study": "g", "space": {"a": [1, 2], "b": "int 1..3"}, "sampler": {"name": "grid"}}
    )
    storage = st.open_storage(f"journal:{tmp_path / 'g.journal'}")
    _, created = open_study(sweep, storage, 0)
    again, created_again = open_study(sweep, storage, 1)
    assert created and not created_again
    waiting = again.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 6


def test_a_worker_with_other_training_settings_is_refused(tmp_path):
    """Workers of one study with different --set (another learning rate, block size)
    ranked trials trained otherwise against each other, silently. Where a worker runs
    (its data copy, runs folder, devices) may differ."""
    sweep = parse_sweep({"study": "s", "space": {"a": "int 1..4"}, "n_trials": 2})
    storage = st.open_storage(f"journal:{tmp_path / 's.journal'}")
    first = {"data.data_dir": "/node1/data", "model.optimizer.lr": 1e-3, "data.block_size": 64}
    open_study(sweep, storage, 0, first)
    local = {**first, "data.data_dir": "/node2/data", "run.mlflow": False, "trainer.devices": 2}
    assert not open_study(sweep, storage, 1, local)[1]
    other = {**first, "model.optimizer.lr": 3e-3}
    with pytest.raises(SweepError, match=(
        r"other --set settings \(model.optimizer.lr: 0.001 in the study's, 0.003 here\).*"
        r"same --set as its first worker, or another study name"
    )):  # fmt: skip
        open_study(sweep, storage, 2, other)
    missing = {k: v for k, v in first.items() if k != "data.block_size"}
    with pytest.raises(SweepError, match=r"data.block_size only in the study's"):
        open_study(sweep, storage, 3, missing)
    with pytest.raises(SweepError, match=r"trainer.max_steps only in this worker's"):
        open_study(sweep, storage, 4, {**first, "trainer.max_steps": 9})
    # Read as cofr fit reads them: a mapping is its fields, YAML's text `1e-3` (no dot)
    # the float (both were refused as other settings).
    same = {"data.block_size": 64, "model.optimizer": {"lr": "1e-3"}}
    assert not open_study(sweep, storage, 5, same)[1]
    later = {"data.block_size": 64, "model.optimizer": {"lr": 3e-3}, "model.optimizer.lr": 1e-3}
    assert not open_study(sweep, storage, 6, later)[1]  # the later setting wins
    # Stored: the training keys only (a run.tracking_uri may hold a password), as JSON.
    import datetime

    stored = optuna.load_study(study_name="s", storage=storage).user_attrs["cofr.settings"]
    assert stored == {"model.optimizer.lr": 1e-3, "data.block_size": 64}
    dated = parse_sweep({"study": "d", "space": {"a": "int 1..4"}, "n_trials": 2})
    secret = {
        "run.tracking_uri": "postgresql://u:secret@db/x",
        "data.tag": datetime.date(2026, 1, 2),
    }
    study, _ = open_study(dated, storage, 0, secret)
    assert study.user_attrs["cofr.settings"] == {"data.tag": "2026-01-02"}


def test_a_worker_on_another_number_of_devices_is_refused(tiny_data, tmp_path):
    """trainer.devices and trainer.num_nodes were worker-local: a worker on 4 GPUs joined
    a study of 1-GPU trials, whose global batch (and a tokens budget's steps) was 4 times
    smaller. Their product is the study's; how a worker gets there may differ."""
    from cofrgenet.sweeps.spec import data_parallel_width

    def width(**trainer) -> int:
        return data_parallel_width({"trainer": trainer})

    assert width(devices=1) == 1 and width(devices="2", num_nodes=2) == 4
    assert width(devices=[0, 1]) == 2 and width(devices="0,1,2") == 3
    assert width(accelerator="cpu", devices="auto") == 1  # as Lightning's CPU takes it
    sweep = parse_sweep({"study": "s", "space": {"a": "int 1..4"}, "n_trials": 2})
    storage = st.open_storage(f"journal:{tmp_path / 's.journal'}")
    open_study(sweep, storage, 0, {"trainer.devices": 2}, width=width(devices=2))
    two_nodes = {"trainer.devices": 1, "trainer.num_nodes": 2}
    assert not open_study(sweep, storage, 1, two_nodes, width=width(devices=1, num_nodes=2))[1]
    with pytest.raises(SweepError, match=(
        r"^study 's' trains each trial on 2 device\(s\) in all \(trainer.devices x "
        r"trainer.num_nodes\), this worker on 4: the global batch, hence the trials, would "
        r"differ. Give this worker 2 device\(s\)"
    )):  # fmt: skip
        open_study(sweep, storage, 2, {"trainer.devices": 4}, width=4)
    stored = optuna.load_study(study_name="s", storage=storage).user_attrs
    assert stored["cofr.data_parallel_width"] == 2
    # A worker reads its width from its trials' config (tiny-cpu: one CPU device).
    tiny = load_sweep(write_sweep(tmp_path, overrides={"data.data_dir": str(tiny_data)}))
    open_study(tiny, st.open_storage(st.home_storage(tiny)), 0, width=3)
    with pytest.raises(SweepError, match=r"trains each trial on 3 device\(s\).*worker on 1:"):
        run_worker(tiny, report=False, mlflow=False)


def test_status_shows_the_values_of_queued_grid_points(tmp_path):
    """A grid's queued (WAITING) trials showed blank parameter columns, and a study no
    worker had run yet showed no parameter columns at all."""
    from rich.console import Console

    from cofrgenet.sweeps.status import status_table

    sweep = parse_sweep(
        {"study": "g", "space": {"a": [1, 2], "b": [3]}, "sampler": {"name": "grid"}}
    )
    storage = st.open_storage(f"journal:{tmp_path / 'g.journal'}")
    study, _ = open_study(sweep, storage, 0)
    console = Console(record=True, width=200)
    console.print(status_table(study, storage))
    lines = console.export_text().splitlines()
    (header,) = [line for line in lines if "┃ state" in line]
    assert [cell.strip() for cell in header.split("┃")[1:5]] == ["#", "state", "a", "b"]
    rows = [[cell.strip() for cell in line.split("│")[1:5]] for line in lines if "WAITING" in line]
    assert sorted(rows) == [["0", "WAITING", "1", "3"], ["1", "WAITING", "2", "3"]]


def test_status_says_how_much_of_the_studys_trial_budget_is_used(tmp_path):
    """The table counted the trials by state, not against n_trials: how far the study
    is, and whether workers are still needed, was left to work out."""
    from rich.console import Console

    from cofrgenet.sweeps.status import status_table

    def text(study, storage) -> str:
        console = Console(record=True, width=200)
        console.print(status_table(study, storage))
        return console.export_text()

    raw = {"study": "b", "space": {"x": "int 0..3"}, "n_trials": 4, "pruner": {"name": "none"}}
    storage = st.open_storage(f"journal:{tmp_path / 'b.journal'}")
    study, _ = open_study(parse_sweep(raw), storage, 0)
    for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
        trial = study.ask()
        trial.suggest_int("x", 0, 3)
        study.tell(trial, 1.0 if state == TrialState.COMPLETE else None, state=state)
    st.retry_trial(study, study.get_trials()[-1], max_retry=3)  # a retried failure: not used
    assert "budget: 2 of 4 trials used (1 complete, 1 pruned)" in text(study, storage)
    grid = {"study": "g", "space": {"a": [1]}, "sampler": {"name": "grid"}}
    study, _ = open_study(parse_sweep(grid), storage, 0)
    assert "budget: 0 of 1 trial used" in text(study, storage)  # its point queued
    plain = optuna.create_study(study_name="plain", storage=storage)  # not cofr's: no budget
    assert "budget:" not in text(plain, storage)


def test_a_worker_with_an_allowed_edit_updates_the_study_s_stored_sweep(tmp_path):
    """`cofr sweep status/report STUDY` read the sweep file as the study was created with:
    after a run with more n_trials or another pruner, they showed the old ones."""
    raw = {"study": "e", "space": {"a": "int 1..4"}, "n_trials": 2, "pruner": {"name": "none"}}
    storage = st.open_storage(f"journal:{tmp_path / 'e.journal'}")
    open_study(parse_sweep(raw), storage, 0)
    edited = {**raw, "n_trials": 5, "pruner": {"name": "median"}}
    study, created = open_study(parse_sweep(edited), storage, 1)
    assert not created and study.user_attrs["cofr.sweep"]["n_trials"] == 5
    assert optuna.load_study(study_name="e", storage=storage).user_attrs["cofr.sweep"] == (
        parse_sweep(edited).raw
    )


def test_a_grid_may_grow_and_its_new_points_are_queued_once(tmp_path):
    """Values added to a grid sweep's ranges: the study goes on with the new points queued
    (once, whichever worker comes first), its finished trials kept, and its trials take
    their parameters (Optuna accepts a range's new bounds). A grid that lost a point, a
    list of choices that changed (Optuna keeps those fixed: every trial would fail), or
    another key, is still refused."""
    a12 = {"type": "int", "low": 1, "high": 2}
    raw = {"study": "g", "space": {"a": a12, "b": [3]}, "sampler": {"name": "grid"}}
    storage = st.open_storage(f"journal:{tmp_path / 'g.journal'}")
    study, _ = open_study(parse_sweep(raw), storage, 0)

    def run_next(sweep) -> optuna.Trial:
        trial = study.ask()  # the next queued point, its parameters suggested as a trial does
        assert {p.key: p.suggest(trial) for p in sweep.space} == trial.params
        return trial

    study.tell(run_next(parse_sweep(raw)), 1.0)  # point a=1 done
    failed = study.ask()  # point a=2 fails after suggesting `a` alone: its params are
    parse_sweep(raw).space[0].suggest(failed)  # partial, its point is not queued again
    study.tell(failed, state=TrialState.FAIL)

    grown = parse_sweep({**raw, "space": {"a": {**a12, "high": 4}, "b": [3]}})
    lock = tmp_path / "grid.lock"
    for offset in (1, 2):  # a second worker finds nothing more to queue
        study, created = open_study(grown, storage, offset, grid_lock=lock)
        assert not created
        points = sorted(tuple(st.grid_point(t).values()) for t in study.get_trials())
        assert points == sorted(tuple(point.values()) for point in grown.grid)
    assert study.user_attrs["cofr.sweep"] == grown.raw
    assert run_next(grown).params == {"a": 3, "b": 3}  # a new point trains
    # A retry of the partial trial is for its whole point, and so not queued again either.
    frozen = study.get_trials()[failed.number]
    number = st.retry_trial(study, frozen, max_retry=3)
    retry = study.get_trials()[number]
    assert st.grid_point(retry) == {"a": 2, "b": 3} and retry.params == {"a": 2}
    count = len(study.get_trials())
    open_study(grown, storage, 5, grid_lock=lock)
    assert len(study.get_trials()) == count
    states = [t.state for t in study.get_trials()]
    assert states.count(TrialState.COMPLETE) == 1 and states.count(TrialState.FAIL) == 1

    lost = {"a": {**a12, "low": 2, "high": 4}, "b": [3]}
    for space in (lost, {"a": a12, "b": [3, 5]}, {"a": a12, "b": [3], "c": [0]}):
        with pytest.raises(SweepError, match=r"a grid may grow: values added to int or float"):
            open_study(parse_sweep({**raw, "space": space}), storage, 3)
    with pytest.raises(SweepError, match=r"base: \[\] -> \['x.yaml'\]\)") as refused:
        open_study(parse_sweep({**grown.raw, "base": ["x.yaml"]}, resolve=False), storage, 3)
    assert "a grid may grow" not in str(refused.value)  # only the space may grow
    # A worker refused for another objective queues nothing.
    more = parse_sweep({**grown.raw, "space": {"a": {**a12, "high": 5}, "b": [3]}})
    count = len(study.get_trials())
    with pytest.raises(SweepError):
        open_study(
            replace(more, objective=replace(more.objective, direction="maximize")), storage, 4
        )
    assert len(study.get_trials()) == count


def test_a_worker_that_loses_the_race_to_create_the_study_waits_for_its_grid(tmp_path, monkeypatch):
    """Workers started together: one creates the study, the other loads it before the
    grid is queued. It waits for the grid instead of finding nothing to do and leaving."""
    import threading

    from cofrgenet.sweeps import worker as sweep_worker

    sweep = parse_sweep(
        {"study": "g", "space": {"a": [1, 2], "b": "int 1..3"}, "sampler": {"name": "grid"}}
    )
    storage = st.open_storage(f"journal:{tmp_path / 'g.journal'}")
    creating = optuna.create_study(study_name="g", storage=storage)  # the setup not yet done

    def finish_setup() -> None:
        time.sleep(0.5)
        creating.set_user_attr(sweep_worker.UID_ATTR, "u")
        creating.set_user_attr("cofr.sweep", sweep.raw)
        for point in sweep.grid:
            creating.enqueue_trial(point, user_attrs={st.GRID_POINT: point})

    finisher = threading.Thread(target=finish_setup)
    finisher.start()
    loaded, created = open_study(sweep, storage, 1)
    waiting = loaded.get_trials(states=(TrialState.WAITING,))  # as open_study returns
    finisher.join()
    assert not created and len(waiting) == 6
    assert loaded.user_attrs[sweep_worker.UID_ATTR] == "u"

    optuna.create_study(study_name="h", storage=storage)  # its creator died mid-setup
    monkeypatch.setattr(sweep_worker, "SETUP_TIMEOUT_S", 0.3)
    with pytest.raises(SweepError, match=r"study 'h' exists but its setup never finished"):
        open_study(parse_sweep({**sweep.raw, "study": "h"}), storage, 1)


def test_a_half_made_study_is_waited_for_aloud_and_named_with_a_working_delete_command(
    tmp_path, monkeypatch, caplog
):
    """A worker killed between create_study and the study's attributes: the next one
    waited minutes without a word, then suggested `optuna delete-study ... --storage
    journal:PATH`, which Optuna's CLI refuses ("Failed to guess storage class")."""
    import shlex

    from cofrgenet.sweeps import worker as sweep_worker

    journal = tmp_path / "s.journal"
    url = f"journal:{journal}"
    storage = st.open_storage(url)
    optuna.create_study(study_name="s", storage=storage)  # its creator died mid-setup
    monkeypatch.setattr(sweep_worker, "SETUP_TIMEOUT_S", 0.8)
    monkeypatch.setattr(sweep_worker, "SETUP_NOTE_S", 0.1)
    sweep = parse_sweep({"study": "s", "space": {"a": [1, 2]}, "n_trials": 2})
    with caplog.at_level("INFO", logger="cofrgenet.sweeps"), pytest.raises(SweepError) as error:
        open_study(sweep, storage, 1, url=url)
    waits = [r.message for r in caplog.records if "is not set up yet" in r.message]
    assert waits == ["study 's' exists but is not set up yet: waiting up to 0.8 s for the "
                     "worker that created it"]  # fmt: skip
    command = re.search(r"delete it \((optuna delete-study .*)\)$", str(error.value)).group(1)
    assert command == (
        f"optuna delete-study --study-name s --storage {journal} --storage-class JournalFileBackend"
    )
    optuna_cli = Path(sys.executable).parent / "optuna"
    done = subprocess.run(
        [str(optuna_cli), *shlex.split(command)[1:]], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert optuna.get_all_study_names(st.open_storage(url)) == []
    db = st.delete_study_command("s", "postgresql://u:pw@h/db")
    assert db == "optuna delete-study --study-name s --storage 'postgresql://u:***@h/db'"


def _tiny_study(tmp_path: Path, **storage_options) -> tuple:
    sweep = parse_sweep(
        {"study": "w", "space": {"a": [1, 2]}, "n_trials": 4, "storage_options": storage_options}
    )
    storage = st.open_storage(f"journal:{tmp_path / 'w.journal'}")
    study, _ = open_study(sweep, storage, 0)
    return sweep, storage, study


def test_a_sweep_file_with_n_trials_below_the_trials_used_is_refused(tmp_path):
    """A finished study of 3 trials, then a worker of a file saying n_trials: 1: it
    became the study's budget (status: "3 of 1 trial used") and the report was written
    again."""
    _, storage, study = _tiny_study(tmp_path)
    for _ in range(3):
        trial = study.ask({"a": optuna.distributions.CategoricalDistribution([1, 2])})
        study.tell(trial, 1.0)
    space = {"a": [1, 2]}
    lower = parse_sweep({"study": "w", "space": space, "n_trials": 1})
    with pytest.raises(SweepError, match=(
        r"^study 'w' has used 3 trials, more than the sweep's n_trials: 1: give n_trials "
        r">= 3 \(the trials it keeps\), or leave it at 4$"
    )):  # fmt: skip
        open_study(lower, storage, 1)
    assert study.user_attrs["cofr.sweep"]["n_trials"] == 4  # kept
    for n_trials in (3, 6):  # ending it where it is, or going on: as before
        open_study(parse_sweep({"study": "w", "space": space, "n_trials": n_trials}), storage, 1)
    # Its own budget, overshot by workers that took the last trials together, stands.
    for _ in range(5):
        trial = study.ask({"a": optuna.distributions.CategoricalDistribution([1, 2])})
        study.tell(trial, 1.0)
    open_study(parse_sweep({"study": "w", "space": space, "n_trials": 6}), storage, 1)


def test_workers_in_one_slurm_job_are_told_apart(tmp_path, monkeypatch):
    """Two workers of one job (srun -n 2, or started by hand in one allocation) share
    SLURM_JOB_ID: neither takes the other's live trial for its own requeued one."""
    from cofrgenet.sweeps.worker import next_trial

    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "999")
    assert st.Worker.current().worker_id == "slurm-999"
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert st.Worker.current().worker_id == "slurm-999.1"
    monkeypatch.setenv("SLURM_PROCID", "0")
    me = st.Worker.current()
    assert me.worker_id == "slurm-999"

    sweep, storage, study = _tiny_study(tmp_path)
    other = subprocess.Popen(["sleep", "60"])
    try:
        # The other worker, alive on this host, with the same worker id, trains trial 0.
        busy = study.ask()
        twin = st.Worker(me.host, other.pid, st._pid_start(other.pid), me.worker_id, {})
        st.claim(storage, study, busy.number, twin)
        trial, resumed = next_trial(study, storage, sweep, me)
        assert (trial.number, resumed) == (1, False)
        assert st.frozen_trial(storage, study, busy.number).state == TrialState.RUNNING
    finally:
        other.kill()
        other.wait()
    # Gone (a requeue ended it): now trial 0 is this task's to resume.
    trial, resumed = next_trial(study, storage, sweep, me)
    assert (trial.number, resumed) == (0, True)


def test_a_tracking_error_while_a_trial_is_set_up_fails_it_for_a_retry(
    tmp_path, monkeypatch, caplog
):
    """An MlflowException while the trial's child run is made (a locked sqlite store, a
    server blip) escaped run_trial: the worker died with a traceback and the trial stayed
    RUNNING. Now it ends FAIL through _tell and is retried; a bug there ends it FAIL
    too, without a retry, its traceback in the log and in the trial's error.txt."""
    from mlflow.exceptions import MlflowException

    from cofrgenet.sweeps import objective
    from cofrgenet.sweeps.worker import _tell, next_trial

    sweep, storage, study = _tiny_study(tmp_path)
    me = st.Worker.current()
    ctx = objective.TrialContext(
        sweep=sweep, study=study, storage=storage, storage_url="", runs_dir=str(tmp_path),
        extra={}, worker=me,
    )  # fmt: skip

    def locked(*args, **kwargs):  # stands in for tracking.child_run's create_run
        raise MlflowException("(sqlite3.OperationalError) database is locked")

    monkeypatch.setattr(objective, "_config_and_train", locked)
    trial, _ = next_trial(study, storage, sweep, me)
    with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
        outcome = objective.run_trial(ctx, trial)
    assert outcome.state == TrialState.FAIL and outcome.retry and not outcome.stop_worker
    assert outcome.reason == (
        "tracking or storage unavailable: MlflowException: (sqlite3.OperationalError) "
        "database is locked"
    )
    assert "Traceback" not in caplog.text  # one line: not the trial's fault, nor a bug
    assert _tell(study, storage, trial, outcome, sweep)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].system_attrs["retry_history"] == [trial.number]

    def bug(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    monkeypatch.setattr(objective, "_config_and_train", bug)
    caplog.clear()
    retry, _ = next_trial(study, storage, sweep, me)
    with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
        outcome = objective.run_trial(ctx, retry)
    assert outcome.state == TrialState.FAIL and not outcome.retry
    assert outcome.reason == "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    assert "Traceback" in caplog.text and "in bug" in caplog.text
    assert "in bug" in (outcome.run_dir / "error.txt").read_text()
    assert _tell(study, storage, retry, outcome, sweep)
    assert st.frozen_trial(storage, study, retry.number).state == TrialState.FAIL


KILLED_BEFORE_THE_RETRY = """
import os, signal, sys
from optuna.trial import TrialState
from cofrgenet.sweeps import parse_sweep, storage as st, worker
from cofrgenet.sweeps.objective import Outcome
sweep = parse_sweep({"study": "g", "space": {"a": [1, 2]}, "sampler": {"name": "grid"}})
storage = st.open_storage(sys.argv[1])
study, _ = worker.open_study(sweep, storage, 0)
trial, _ = worker.next_trial(study, storage, sweep, st.Worker.current())
st.retry_trial = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
reason = "worker terminated (SIGTERM) during the trial"
worker._tell(study, storage, trial, Outcome(TrialState.FAIL, reason=reason, retry=True), sweep)
"""


def test_a_worker_killed_between_failing_a_trial_and_queueing_its_retry_loses_no_point(
    tmp_path,
):
    """_tell failed the trial and then queued its retry, two writes: a worker killed
    between them left a grid point failed for good (the grid counted it as present, the
    study as done). The retry is recorded before the FAIL, and the next worker queues it."""
    from cofrgenet.sweeps.worker import next_trial, queue_missing_points, study_done

    sweep = parse_sweep({"study": "g", "space": {"a": [1, 2]}, "sampler": {"name": "grid"}})
    url = f"journal:{tmp_path / 'g.journal'}"
    storage = st.open_storage(url)
    study, _ = open_study(sweep, storage, 0)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_THE_RETRY, url], env=worker_env(), timeout=300
    )
    assert killed.returncode == -signal.SIGKILL
    (first, _) = study.get_trials()
    assert first.state == TrialState.FAIL and st.RETRY_WANTED in first.user_attrs
    # The other point, taken by a worker that checked for lost trials before the kill.
    other = study.ask()
    assert st.grid_point(st.frozen_trial(storage, study, other.number)) != st.grid_point(first)
    study.tell(other, 1.0)
    assert not study_done(study, sweep)  # the retry is still to be queued
    queue_missing_points(study, storage, sweep)  # as a restarted worker does
    retry, _ = next_trial(study, storage, sweep, st.Worker.current())
    assert retry is not None
    frozen = st.frozen_trial(storage, study, retry.number)
    assert frozen.system_attrs["retry_history"] == [first.number]
    assert st.grid_point(frozen) == st.grid_point(first)
    study.tell(retry, 2.0)
    assert study_done(study, sweep)
    assert next_trial(study, storage, sweep, st.Worker.current()) == (None, False)


def test_signal_stops_use_no_retry_and_a_trial_with_none_left_says_so(
    tmp_path, monkeypatch, capsys
):
    """A trial stopped by hand 4 times lost its point: every stop counted towards
    max_retry (meant for lost or failing workers), the last FAIL, with no retry, counted
    against n_trials, and the worker still said the trial would resume. Stops count for
    nothing now; past max_retry, the outcome is a failure that says why, and so does the
    worker's last line."""
    import cofrgenet.sweeps.worker as worker_module
    from cofrgenet.cli import main
    from cofrgenet.sweeps.objective import Outcome
    from cofrgenet.sweeps.worker import WorkerResult, _tell, next_trial

    sweep, storage, study = _tiny_study(tmp_path, max_retry=1)

    def attempt(signal_status: int | None = None) -> Outcome:
        trial, _ = next_trial(study, storage, sweep, st.Worker.current())
        trial.suggest_categorical("a", [1, 2])  # as the trial's config does
        outcome = Outcome(
            TrialState.FAIL, reason="stopped", retry=True,
            stop_worker=signal_status is not None, signal_status=signal_status,
        )  # fmt: skip
        assert _tell(study, storage, trial, outcome, sweep)
        return outcome

    for _ in range(4):  # Ctrl-C, four times
        assert attempt(130).retry
    assert st.budget_used(study.get_trials()) == 0
    assert attempt().retry  # a busy run folder: the one retry
    assert attempt(143).retry  # SIGTERM: still no count
    last = attempt()
    assert not last.retry and last.reason == "stopped; no retries left (max_retry 1)"
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL] * 7
    assert st.budget_used(trials) == 1 and st.unqueued_retries(trials, 1) == []
    assert [t.user_attrs.get(st.STOPPED) for t in trials] == [
        *["Ctrl-C"] * 4,
        None,
        "SIGTERM",
        None,
    ]

    def stopped_with_no_retry(sweep, **kwargs):
        return WorkerResult(study, outcomes=[(6, last)], signal_status=130)

    monkeypatch.setattr(worker_module, "run_worker", stopped_with_no_retry)
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 130
    err = capsys.readouterr().err
    assert "the trial failed: stopped; no retries left (max_retry 1)" in err
    assert "resumes" not in err


def test_a_missing_retry_waits_for_a_live_worker_and_is_queued_once(tmp_path):
    """A failed trial whose retry is recorded but not queued: left to its worker while
    that one lives (it queues it next), queued once it is gone, and copies that workers
    queue at once are discarded but one."""
    sweep, storage, study = _tiny_study(tmp_path)
    options = sweep.storage_options
    here = __import__("socket").gethostname()
    other = subprocess.Popen(["sleep", "60"])
    try:
        trial = study.ask()
        tid = st.trial_id(storage, study, trial.number)
        intent = {st.HOST: here, st.PID: other.pid, st.PID_START: st._pid_start(other.pid)}
        storage.set_trial_user_attr(tid, st.RETRY_WANTED, {**intent, "at": time.time()})
        storage.set_trial_state_values(tid, TrialState.FAIL)
        assert st.queue_missing_retries(study, storage, options) == []
    finally:
        other.kill()
        other.wait()
    assert st.queue_missing_retries(study, storage, options) == [(0, 1)]
    assert st.queue_missing_retries(study, storage, options) == []  # queued: not again
    # A second worker that checked at the same moment queued a copy too.
    st.retry_trial(study, st.frozen_trial(storage, study, 0), options.max_retry)
    st.drop_duplicate_retries(study, storage)
    states = [(t.number, t.state, bool(t.user_attrs.get(st.DISCARDED))) for t in study.get_trials()]
    assert states == [
        (0, TrialState.FAIL, False), (1, TrialState.WAITING, False), (2, TrialState.FAIL, True),
    ]  # fmt: skip
    assert st.budget_used(study.get_trials()) == 0
    # A copy that a worker took between the listing and the discard trains: kept.
    st.retry_trial(study, st.frozen_trial(storage, study, 0), options.max_retry)
    listed = study.get_trials(deepcopy=False)
    storage.set_trial_state_values(st.trial_id(storage, study, 3), TrialState.RUNNING)
    study.get_trials = lambda deepcopy=True, states=None: listed  # the listing, before
    st.drop_duplicate_retries(study, storage)
    taken = st.frozen_trial(storage, study, 3)
    assert taken.state == TrialState.RUNNING and not taken.user_attrs.get(st.DISCARDED)
    # One that another worker discarded since the listing: nothing to do, no error.
    st.retry_trial(study, st.frozen_trial(storage, study, 0), options.max_retry)
    listed = optuna.load_study(study_name=study.study_name, storage=storage).get_trials()
    storage.set_trial_state_values(st.trial_id(storage, study, 4), TrialState.FAIL)
    st.drop_duplicate_retries(study, storage)  # raised UpdateFinishedTrialError
    # Elsewhere: the grace period decides, as for a lost trial.
    elsewhere = {st.HOST: "elsewhere", st.PID: 1}
    assert not st.retry_left_behind({**elsewhere, "at": time.time()}, options)
    assert st.retry_left_behind({**elsewhere, "at": time.time() - 10_000}, options)


def test_a_live_local_worker_is_never_lost_and_a_late_result_is_not_lost_silently(tmp_path, caplog):
    from cofrgenet.sweeps.objective import Outcome
    from cofrgenet.sweeps.worker import _tell

    sweep, storage, study = _tiny_study(tmp_path)
    other = subprocess.Popen(["sleep", "60"])
    try:
        trial = study.ask()
        worker = st.Worker(st.Worker.current().host, other.pid, None, None, {})
        st.claim(storage, study, trial.number, worker)
        trial.set_user_attr(st.HEARTBEAT, time.time() - 10_000)  # a long silent step
        frozen = st.frozen_trial(storage, study, trial.number)
        assert st.lost_reason(frozen, storage, sweep.storage_options) is None
        assert st.lost_trials(study, storage, sweep.storage_options) == {}
    finally:
        other.kill()
        other.wait()
    # Another worker failed it meanwhile: this worker's COMPLETE is refused, and says so.
    assert st.fail_trial(storage, st.trial_id(storage, study, trial.number), "lost")
    with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
        told = _tell(study, storage, trial, Outcome(TrialState.COMPLETE, value=1.0), sweep)
    assert told is False
    assert st.frozen_trial(storage, study, trial.number).state == TrialState.FAIL
    assert "was ended as FAIL by another worker (lost)" in caplog.text


def test_studies_sharing_an_experiment_keep_their_own_trial_folders(tmp_path):
    from cofrgenet.sweeps.objective import TRIAL_FILE, _claim_folder, trial_run_dir
    from cofrgenet.training.runlock import RunFolderBusyError, RunLock

    own = parse_sweep({"study": "s", "space": {"a": [1]}, "n_trials": 1})
    assert trial_run_dir(own, tmp_path, 3) == tmp_path / "s" / "trial-0003"
    shared = [
        parse_sweep({"study": name, "experiment": "x", "space": {"a": [1]}, "n_trials": 1})
        for name in ("a", "b")
    ]
    folders = [trial_run_dir(sweep, tmp_path, 0) for sweep in shared]
    assert folders == [tmp_path / "x" / "a-trial-0000", tmp_path / "x" / "b-trial-0000"]
    # A folder of another study is moved aside, never from under a live fit.
    run_dir = folders[0]
    _claim_folder(run_dir, {"study": "a", "uid": "old", "root_number": 0})
    lock = RunLock(run_dir)
    lock.acquire()
    try:
        with pytest.raises(RunFolderBusyError):
            _claim_folder(run_dir, {"study": "a", "uid": "new", "root_number": 0})
        assert yaml.safe_load((run_dir / TRIAL_FILE).read_text())["uid"] == "old"
    finally:
        lock.release()


def test_a_retry_resumes_in_the_run_folder_its_first_attempt_recorded(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """On shared storage a worker started from another directory (another runs folder)
    rebuilt a retry's folder from its own runs_dir and trained it from scratch, beside
    the first attempt's checkpoints. It resumes in the recorded folder when that exists,
    and logs to its own MLflow store; else it falls back to its own runs folder."""
    from cofrgenet.sweeps import objective
    from cofrgenet.sweeps.objective import RUN_DIR_ATTR, Outcome, TrialContext, run_trial

    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=2, overrides={"data.data_dir": str(tiny_data)})
    )
    storage = st.open_storage(f"journal:{tmp_path / 's.journal'}")
    study, _ = open_study(sweep, storage, 0)
    first_dir = tmp_path / "A" / "runs" / sweep.experiment / "trial-0000"
    (first_dir / "checkpoints").mkdir(parents=True)
    first = study.ask()
    first.set_user_attr(RUN_DIR_ATTR, str(first_dir))
    st.fail_trial(storage, st.trial_id(storage, study, first.number), "worker gone")
    st.retry_trial(study, st.frozen_trial(storage, study, first.number), max_retry=3)

    trained: list[Path] = []

    def fake_train(ctx, trial, args, run_dir):
        trained.append(run_dir)
        return Outcome(TrialState.COMPLETE, value=1.0)

    monkeypatch.setattr(objective, "_train", fake_train)
    runs_b = tmp_path / "B" / "runs"
    ctx = TrialContext(sweep, study, storage, "-", str(runs_b), {}, st.Worker.current())
    with caplog.at_level("INFO", logger="cofrgenet.sweeps"):
        run_trial(ctx, study.ask())
    assert trained[-1] == first_dir
    assert f"trial 1: resuming in {first_dir}, the run folder trial 0 (its first" in caplog.text
    config = yaml.safe_load((first_dir / "sweep-trial.yaml").read_text())
    assert Path(config["run"]["runs_dir"]) == tmp_path / "A" / "runs"
    assert config["run"]["tracking_uri"] == f"sqlite:///{runs_b / 'mlflow.db'}"
    assert study.get_trials()[1].user_attrs[RUN_DIR_ATTR] == str(first_dir)

    # The recorded folder is gone (another host's disk): this worker's own, as before.
    study.tell(1, 1.0)
    second = study.ask()
    second.set_user_attr(RUN_DIR_ATTR, str(tmp_path / "gone" / sweep.experiment / "trial-0002"))
    st.fail_trial(storage, st.trial_id(storage, study, second.number), "worker gone")
    st.retry_trial(study, st.frozen_trial(storage, study, second.number), max_retry=3)
    run_trial(ctx, study.ask())
    assert trained[-1] == runs_b / sweep.experiment / "trial-0002"


def test_a_resumed_trial_forgets_what_an_earlier_attempt_decided(tiny_data, tmp_path, monkeypatch):
    """A ddp_spawn rank leaves its stop and prune steps in the trial's attributes for the
    worker; a requeued attempt that trains to the end must not read the old ones back."""
    from cofrgenet.sweeps.objective import LAST_REPORT, PRUNED_AT, REQUEUED_AT

    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=1, overrides={"data.data_dir": str(tiny_data)})
    )
    storage = st.open_storage(st.default_storage(sweep))
    study, _ = open_study(sweep, storage, 0)
    first = study.ask()
    st.claim(storage, study, first.number, st.Worker("gone-host", 1, None, "slurm-5_0", {}))
    for key in (REQUEUED_AT, PRUNED_AT):
        first.set_user_attr(key, 1)
    first.set_user_attr(LAST_REPORT, [1, 9.0])
    result = run_worker(sweep, report=False, mlflow=False)
    (trial,) = result.study.get_trials()
    assert trial.state == TrialState.COMPLETE, result.outcomes
    assert trial.user_attrs[REQUEUED_AT] is None and trial.user_attrs[PRUNED_AT] is None


def study_and_dead_pid(tmp_path, name: str):
    """(storage, a new study ``name`` in a journal, its storage options, the pid of a
    process that has ended): for telling lost trials from live ones."""
    storage = st.open_storage(f"journal:{tmp_path / f'{name}.journal'}")
    study = optuna.create_study(study_name=name, storage=storage)
    dead = subprocess.Popen(["true"])
    dead.wait()
    options = parse_sweep({"study": name, "space": {"a": [1]}, "n_trials": 1}).storage_options
    return storage, study, options, dead.pid


def test_lost_worker_detection(tmp_path, monkeypatch):
    """A dead pid on this host is lost at once; elsewhere only after the grace period."""
    storage, study, options, dead_pid = study_and_dead_pid(tmp_path, "l")
    trial = study.ask()
    for key, value in {
        st.HOST: os.uname().nodename,
        st.PID: dead_pid,
        st.HEARTBEAT: time.time(),
    }.items():
        trial.set_user_attr(key, value)
    frozen = st.frozen_trial(storage, study, trial.number)
    if os.uname().nodename == __import__("socket").gethostname():
        assert "died" in st.lost_reason(frozen, storage, options)
    other = study.ask()
    for key, value in {st.HOST: "elsewhere", st.PID: 1, st.HEARTBEAT: time.time()}.items():
        other.set_user_attr(key, value)
    assert st.lost_reason(st.frozen_trial(storage, study, other.number), storage, options) is None
    other.set_user_attr(st.HEARTBEAT, time.time() - 10_000)
    assert "no heartbeat" in st.lost_reason(
        st.frozen_trial(storage, study, other.number), storage, options
    )


def test_a_trial_left_for_a_slurm_requeue_waits_the_grace_period_on_its_host(tmp_path):
    """Its worker's process is gone by design: another worker on that host failed it at
    once (a retry used up per requeue; with max_retry 0 the trial was dropped)."""
    import socket

    storage, study, options, dead_pid = study_and_dead_pid(tmp_path, "r")
    trial = study.ask()
    attrs = {st.HOST: socket.gethostname(), st.PID: dead_pid, st.WORKER: "slurm-7_0"}
    for key, value in {**attrs, st.HEARTBEAT: time.time(), st.REQUEUED: time.time()}.items():
        trial.set_user_attr(key, value)
    assert st.lost_reason(st.frozen_trial(storage, study, trial.number), storage, options) is None
    trial.set_user_attr(st.REQUEUED, time.time() - options.grace_period - 5)
    reason = st.lost_reason(st.frozen_trial(storage, study, trial.number), storage, options)
    assert (
        reason.startswith("worker slurm-7_0 left it for a SLURM requeue 30")
        and "not come back" in reason
    )
    trial.set_user_attr(st.REQUEUED, None)  # taken up again: its process decides again
    assert "died" in st.lost_reason(st.frozen_trial(storage, study, trial.number), storage, options)


def test_a_lost_trials_duration_ends_at_its_last_heartbeat(tmp_path, monkeypatch):
    """A lost trial's duration grew for as long as it stayed RUNNING, and once failed
    it ended when another worker noticed, not when its worker was last heard of."""
    from types import SimpleNamespace

    from rich.console import Console

    from cofrgenet.sweeps import status

    storage = st.open_storage(f"journal:{tmp_path / 'l.journal'}")
    study = optuna.create_study(study_name="l", storage=storage)
    trial = study.ask()
    started = st.frozen_trial(storage, study, trial.number).datetime_start.timestamp()
    st.claim(storage, study, trial.number, st.Worker("elsewhere", 1, None, "w1", {}))
    trial.set_user_attr(st.HEARTBEAT, started + 65)  # last heard of 65 s in
    later = {name: getattr(time, name) for name in dir(time) if not name.startswith("_")}
    later["time"] = lambda: started + 3 * 3600  # three hours on
    for module in (st, status):
        monkeypatch.setattr(module, "time", SimpleNamespace(**later))
    options = parse_sweep({"study": "l", "space": {"a": [1]}, "n_trials": 1}).storage_options

    def shown_duration() -> str:
        console = Console(record=True, width=200)
        console.print(status.status_table(study, storage, options))
        lines = console.export_text().splitlines()
        (header,) = [line for line in lines if "┃ state" in line]
        (row,) = [line for line in lines if "│ 0 " in line]
        column = [cell.strip() for cell in header.split("┃")].index("duration")
        return row.split("│")[column].strip()

    assert shown_duration() == "≥1:05"  # RUNNING, lost: not 3:00:00
    assert st.fail_lost_trials(study, storage, options)
    assert shown_duration() == "≥1:05"  # FAIL: not the moment it was failed


def test_a_trial_lost_before_its_first_heartbeat_shows_less_than_an_interval():
    """Not 0:00: its worker lived for up to one heartbeat interval after the claim."""
    from cofrgenet.sweeps import status

    start = datetime.datetime(2026, 1, 1, 12, 0, 0)
    trial = optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={
        st.LAST_SEEN: start.timestamp()})  # fmt: skip
    trial.datetime_start = start
    assert status.duration(trial, interval=60) == "<1:00"
    trial.user_attrs[st.LAST_SEEN] = start.timestamp() + 3700
    assert status.duration(trial, interval=60) == "≥1:01:40"
    del trial.user_attrs[st.LAST_SEEN]
    trial.datetime_complete = start + datetime.timedelta(seconds=42)
    assert status.duration(trial) == "0:42"  # ended normally: exact


def test_a_lost_trials_mlflow_run_ends_failed_and_its_reason_tag_follows_the_state(tmp_path):
    """A trial failed as lost no longer reads RUNNING in MLflow; a retry that completes
    drops the failed attempt's reason, and a pruned run's reason is not a failure's."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import RUN_DIR_ATTR, Outcome
    from cofrgenet.sweeps.tracking import finish_child
    from cofrgenet.sweeps.worker import _end_lost_run, next_trial
    from cofrgenet.training.run_store import RUN_ID_FILE

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("l")).info.run_id
    run_dir = tmp_path / "trial-0000"
    run_dir.mkdir()
    (run_dir / RUN_ID_FILE).write_text(run_id + "\n")
    storage = st.open_storage(f"journal:{tmp_path / 'l.journal'}")
    study = optuna.create_study(study_name="l", storage=storage)
    dead = subprocess.Popen(["true"])
    dead.wait()
    lost = study.ask()
    lost.suggest_categorical("a", [1, 2])
    here = __import__("socket").gethostname()
    st.claim(storage, study, lost.number, st.Worker(here, dead.pid, None, "", {}))
    lost.set_user_attr(RUN_DIR_ATTR, str(run_dir))
    sweep = parse_sweep({"study": "l", "space": {"a": [1, 2]}, "n_trials": 1})
    ctx = SimpleNamespace(mlflow_client=client, storage=storage, study=study)
    ended = []

    def on_lost(number, retry):
        ended.append((number, retry))
        _end_lost_run(ctx, number, retry)

    retry, _ = next_trial(study, storage, sweep, st.Worker.current(), on_lost)
    assert ended == [(0, 1)] and retry.number == 1
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["optuna.state"] == "FAIL"
    assert run.data.tags["optuna.fail_reason"].endswith("died during the trial (process "
                                                       "gone); retried as trial 1")  # fmt: skip
    assert run.data.tags["optuna.retried_as"] == "1"  # compare: "failed ..., retried as"
    finish_child(client, run_id, Outcome(TrialState.COMPLETE, value=1.5, step=6))
    tags = client.get_run(run_id).data.tags
    assert tags["optuna.state"] == "COMPLETE" and "optuna.fail_reason" not in tags
    assert "optuna.retried_as" not in tags
    finish_child(client, run_id, Outcome(TrialState.PRUNED, reason="pruned at step 2"))
    tags = client.get_run(run_id).data.tags
    assert tags["optuna.prune_reason"] == "pruned at step 2" and "optuna.fail_reason" not in tags


def test_a_failed_trials_run_names_the_retry_queued_after_it_ended(tmp_path):
    """The run ends FAILED before the worker queues the retry: `cofr compare` showed
    "[failed at step 5]" while `sweep status` listed the retry WAITING. The run is tagged
    with the retry once it is queued."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import Outcome
    from cofrgenet.sweeps.worker import WorkerResult, _record
    from cofrgenet.training.run_store import RUN_ID_FILE

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("r")).info.run_id
    storage = st.open_storage(f"journal:{tmp_path / 'r.journal'}")
    study = optuna.create_study(study_name="r", storage=storage)
    trial = study.ask()
    trial.suggest_categorical("a", [1, 2])
    sweep = parse_sweep({"study": "r", "space": {"a": [1, 2]}, "n_trials": 2})
    ctx = SimpleNamespace(
        study=study, storage=storage, sweep=sweep, worker=None, mlflow_client=client
    )
    stopped = Outcome(TrialState.FAIL, reason="stopped by SIGTERM", retry=True, mlflow_run=run_id)
    _record(ctx, WorkerResult(study), trial, stopped)
    assert stopped.retried_as == 1
    assert client.get_run(run_id).data.tags["optuna.retried_as"] == "1"
    # The retry fails for good before it reaches the run: the run is not "retried" for ever.
    run_dir = tmp_path / "trial-0000"
    run_dir.mkdir()
    (run_dir / RUN_ID_FILE).write_text(run_id + "\n")
    retry = study.ask()
    failed = Outcome(TrialState.FAIL, reason="ValueError: bad", run_dir=run_dir)
    _record(ctx, WorkerResult(study), retry, failed)
    assert "optuna.retried_as" not in client.get_run(run_id).data.tags


def test_status_names_each_attempts_next_retry_and_counts_retried_failures(tmp_path):
    from rich.console import Console

    from cofrgenet.sweeps.status import status_table

    storage = st.open_storage(f"journal:{tmp_path / 'r.journal'}")
    study = optuna.create_study(study_name="r", storage=storage)
    first = study.ask()
    first.suggest_int("x", 0, 3)
    study.tell(first, state=TrialState.FAIL)
    for _ in range(2):  # 0 -> 1 -> 2: the second attempt fails too, the third completes
        failed = study.get_trials()[-1]
        st.retry_trial(study, failed, max_retry=3)
        attempt = study.ask()
        if attempt.number == 1:
            study.tell(attempt, state=TrialState.FAIL)
        else:
            study.tell(attempt, 1.0)
    assert st.state_counts(study.get_trials()) == "1 complete, 2 fail (2 retried)"
    console = Console(width=200, record=True)
    console.print(status_table(study, storage))
    text = console.export_text()
    cells = [line.split("│") for line in text.splitlines()]
    rows = {row[1].strip(): row[-2] for row in cells if len(row) > 2}
    assert "retried as #1" in rows["0"] and "retried as #2" in rows["1"]
    assert "retry of #1" in rows["2"] and "3 trials (1 complete, 2 fail (2 retried))" in text


def test_an_rdb_worker_asks_trials_without_optunas_heartbeat_warnings(tmp_path):
    """The worker beats heartbeats itself (outside Study.optimize), on purpose."""
    import warnings

    from cofrgenet.sweeps.worker import next_trial

    sweep = parse_sweep({"study": "w", "space": {"a": [1, 2]}, "n_trials": 2})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        storage = st.open_storage(f"sqlite:///{tmp_path / 'w.db'}", sweep.storage_options)
        study = optuna.create_study(study_name="w", storage=storage)
        trial, _ = next_trial(study, storage, sweep, st.Worker.current())
    assert trial is not None
    assert [str(w.message) for w in caught if "eartbeat" in str(w.message)] == []


def test_rdb_stale_trials_fail_with_their_reason_and_are_retried(tmp_path):
    """RDB storages (sqlite here, PostgreSQL in production): Optuna's heartbeat table, by
    the database's clock, finds a worker lost on another host; its trial fails with the
    reason and a retry is queued; a trial that still beats is left alone."""
    options = StorageOptions(heartbeat_interval=1, grace_period=1, max_retry=3)
    storage = st.open_storage(f"sqlite:///{tmp_path / 'hb.db'}", options)
    assert st.uses_heartbeat_table(storage)
    study = optuna.create_study(study_name="hb", storage=storage)
    elsewhere = st.Worker("elsewhere", 1, None, "slurm-9_0", {})
    lost, alive = study.ask(), study.ask()
    for trial in (lost, alive):
        trial.suggest_int("x", 0, 3)
        st.claim(storage, study, trial.number, elsewhere)
    time.sleep(2.5)  # sqlite's clock counts whole seconds
    st.Heartbeat(storage, study, alive.number, 1).beat()
    assert st.stale_trial_numbers(storage, study) == {lost.number}
    assert set(st.lost_trials(study, storage, options)) == {lost.number}
    assert st.fail_lost_trials(study, storage, options) == [(lost.number, 2)]
    failed = st.frozen_trial(storage, study, lost.number)
    assert failed.state == TrialState.FAIL
    assert "no heartbeat for more than 1 s" in failed.user_attrs[st.FAIL_REASON]
    retry = st.frozen_trial(storage, study, 2)
    assert retry.state == TrialState.WAITING and retry.params == failed.params
    assert retry.system_attrs["retry_history"] == [lost.number]
    assert st.frozen_trial(storage, study, alive.number).state == TrialState.RUNNING


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed")
@pytest.mark.parametrize("backend", ["journal", "sqlite"])
def test_heartbeat_finds_its_trial_ended_by_another_worker(tmp_path, backend):
    """A worker taken for lost while alive (a storage that refused its heartbeats for a
    grace period, hosts whose clocks disagree) trained on in a trial already failed and
    retried, and its retry then failed for good on the busy run folder. Its heartbeat now
    reads the trial's state: ended elsewhere, it sets ``ended``, touches the file the fit
    polls, and stops beating; the file goes with the heartbeat."""
    if backend == "journal":
        storage = st.open_storage(f"journal:{tmp_path / 'hb.journal'}")
    else:
        options = StorageOptions(heartbeat_interval=1, grace_period=3)
        storage = st.open_storage(f"sqlite:///{tmp_path / 'hb.db'}", options)
    study = optuna.create_study(study_name="hb", storage=storage)
    trial = study.ask()
    st.claim(storage, study, trial.number, st.Worker.current())
    ended_file = tmp_path / "worker.ended"
    with st.Heartbeat(storage, study, trial.number, 1, ended_file):
        time.sleep(1.5)  # a beat of a trial still RUNNING: nothing happens
        assert not ended_file.exists()
        tid = st.trial_id(storage, study, trial.number)
        assert st.fail_trial(storage, tid, "worker lost: no heartbeat", retry=True)
        deadline = time.monotonic() + 5
        while not ended_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended_file.exists(), "the heartbeat did not see its trial ended"
    assert not ended_file.exists()


def test_a_trial_waits_for_its_run_folder_to_be_let_go(tmp_path, caplog):
    """A retry whose earlier attempt still trains in the run folder waits for it to stop
    (up to the grace period), and is failed for another retry when it does not."""
    import threading

    from cofrgenet.sweeps.objective import wait_for_run_folder
    from cofrgenet.training.runlock import RunLock

    run_dir = tmp_path / "trial-0000"
    held = RunLock(run_dir)
    held.acquire()  # another open file description: it blocks this process's own probe
    timer = threading.Timer(1.0, held.release)
    timer.start()
    try:
        with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
            assert wait_for_run_folder(run_dir, 30, 3) is None
    finally:
        timer.cancel()
    assert f"trial 3: run folder {run_dir} is in use by process {os.getpid()}" in caplog.text
    assert "waiting up to 30 s (storage_options.grace_period)" in caplog.text
    held.acquire()
    try:
        busy = wait_for_run_folder(run_dir, 0.5, 3)
    finally:
        held.release()
    assert busy is not None
    assert busy.startswith(f"run folder {run_dir} still in use by process {os.getpid()}")
    assert busy.endswith(" after 0.5 s")
    assert wait_for_run_folder(run_dir, 0, 3) is None  # free: no wait
    assert wait_for_run_folder(tmp_path / "not-made", 30, 3) is None  # a first attempt


def test_a_run_folder_taken_between_the_wait_and_the_fit_is_retried(tmp_path, monkeypatch):
    """The wait lets the folder go before cofr fit takes its lock: a process that takes
    it in between fails the trial with RunFolderBusyError, for a retry (not for good).
    A file system without flock leaves the wait to cofr fit's own lock and error."""
    from cofrgenet.sweeps.objective import classify, wait_for_run_folder
    from cofrgenet.training.runlock import RunFolderBusyError, RunLock

    reason, retry, stop, status = classify(RunFolderBusyError("run folder x is in use by y"))
    assert (reason, retry, stop, status) == (
        "RunFolderBusyError: run folder x is in use by y", True, False, None
    )  # fmt: skip

    def no_flock(self):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(RunLock, "try_acquire", no_flock)
    (tmp_path / "run").mkdir()
    assert wait_for_run_folder(tmp_path / "run", 30, 3) is None


def test_a_trial_ended_elsewhere_is_not_a_failure_of_its_worker(tmp_path, monkeypatch):
    """Neither in the worker's run of same failures (three in a row stopped it with
    exit 1) nor in its exit status; and one that came with a requeue (SIGUSR1 first)
    still requeues the SLURM job, without writing to the ended trial."""
    from cofrgenet.sweeps import worker as worker_module
    from cofrgenet.sweeps.objective import ENDED_ELSEWHERE, Outcome, TrialContext

    ended = Outcome(TrialState.FAIL, reason=ENDED_ELSEWHERE, ended_elsewhere=True)
    same = Outcome(TrialState.FAIL, reason="ValueError: x")
    outcomes = [(0, same), (1, ended), (2, same), (3, ended), (4, ended)]
    assert worker_module._same_failures(outcomes) == 0
    assert worker_module._same_failures([*outcomes, (5, same)]) == 3  # ended ones skipped
    result = worker_module.WorkerResult(None, outcomes=[(0, ended), (1, ended)])
    assert result.failed == [] and not result.none_completed

    sweep, storage, study = _tiny_study(tmp_path)
    ctx = TrialContext(
        sweep=sweep, study=study, storage=storage, storage_url="", runs_dir=str(tmp_path),
        extra={}, worker=st.Worker.current(),
    )  # fmt: skip

    def ended_then_requeued(ctx, trial):
        tid = st.trial_id(storage, study, trial.number)
        assert st.fail_trial(storage, tid, "worker lost", retry=True)
        return Outcome(TrialState.RUNNING, requeue=True, stop_worker=True, ended_elsewhere=True)

    asked = []
    monkeypatch.setattr(worker_module, "run_trial", ended_then_requeued)
    monkeypatch.setattr(worker_module, "_requeue_job", lambda worker: asked.append(worker))
    result = worker_module.WorkerResult(study)
    worker_module._run_trials(ctx, result, None)
    assert result.requeued and len(asked) == 1
    assert st.REQUEUED not in study.get_trials()[0].user_attrs


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("htp://127.0.0.1:1", "MLflow cannot use 'htp://127.0.0.1:1'"),
        ("http://127.0.0.1:1", "no MLflow server answers at http://127.0.0.1:1"),
    ],
)
def test_a_tracking_uri_that_cannot_work_is_refused_before_the_study(
    tiny_data, tmp_path, uri, said
):
    """A server that does not answer hung the worker for minutes (MLflow's client retries),
    then a traceback; a scheme MLflow does not know, a traceback; both after the study was
    created. Now one line, before any work, naming the fix."""
    from cofrgenet.errors import ConfigError

    overrides = {"data.data_dir": str(tiny_data)}
    sweep = load_sweep(write_sweep(tmp_path, tracking_uri=uri, overrides=overrides))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        run_worker(sweep, n_trials=1, report=False)
    assert "fix the sweep's tracking_uri" in str(refused.value)
    assert time.monotonic() - started < 60
    assert not (tmp_path / "runs" / "sweeps").exists()  # no study, no journal


def test_optuna_private_api_is_pinned():
    """storage.py's private Optuna uses were written for OPTUNA_TESTED: an Optuna outside
    it, or one without them, fails here first. Check them there, then move the range."""
    import inspect

    from optuna.storages import RDBStorage

    version = tuple(int(part) for part in re.findall(r"\d+", optuna.__version__)[:2])
    low, high = st.OPTUNA_TESTED
    assert low <= version < high, (
        f"optuna {optuna.__version__} is outside {low} <= version < {high}, the versions "
        "src/cofrgenet/sweeps/storage.py's private Optuna calls were written for"
    )
    for owner, name in st.OPTUNA_PRIVATE:
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone"
    assert list(inspect.signature(RDBStorage._get_stale_trial_ids).parameters) == [
        "self",
        "study_id",
    ]
    # open_trial calls the public constructor Optuna's docs advise against.
    assert list(inspect.signature(optuna.Trial.__init__).parameters) == [
        "self",
        "study",
        "trial_id",
    ]
    # System attributes read by name: a queued trial's values (worker._queued), the grid
    # sampler's bookkeeping (dropped from a retry by storage.retry_trial).
    study = optuna.create_study()
    study.enqueue_trial({"x": 1})
    assert study.get_trials(deepcopy=False)[0].system_attrs["fixed_params"] == {"x": 1}
    grid = optuna.create_study(sampler=optuna.samplers.GridSampler({"x": [1, 2]}))
    grid.ask().suggest_categorical("x", [1, 2])
    assert {"grid_id", "search_space"} <= set(grid.get_trials(deepcopy=False)[0].system_attrs)


def test_a_typo_in_a_space_key_stops_the_worker_before_any_trial(tiny_data, tmp_path):
    sweep_path = write_sweep(
        tmp_path,
        space={"model.config.depht": "int 1..4"},
        overrides={"data.data_dir": str(tiny_data)},
    )
    # ModelConfig's check, or the parser's once model.config has typed options.
    hint = r"depht'\]? \(did you mean '(model\.config\.)?depth'\?\)"
    with pytest.raises(SweepError, match=hint):
        run_worker(load_sweep(sweep_path), report=False, mlflow=False)
    assert not (tmp_path / "runs" / "tiny-cpu").exists()  # no trial folder was made


def test_a_missing_data_folder_stops_the_worker_before_the_study_exists(tmp_path):
    """Every trial would fail on it, each using up the study's budget."""
    sweep_path = write_sweep(tmp_path, overrides={"data.data_dir": str(tmp_path / "no-data")})
    with pytest.raises(SweepError, match=r"data\.data_dir: data folder .*no-data' does not"):
        run_worker(load_sweep(sweep_path), report=False, mlflow=False)
    assert not (tmp_path / "runs").exists()  # no study, no trial folder


def test_a_data_block_longer_than_the_models_stops_the_worker_before_the_study_exists(
    tiny_data, tmp_path
):
    """`data.block_size: 64` beside `model.config.block_size: 32`: the study was made and
    every trial failed on it; fixed, the file was then refused as another version of the
    study. Varied by the space, it is left to the trials."""
    overrides = {
        "data.data_dir": str(tiny_data),
        "data.block_size": 64,
        "model.config.block_size": 32,
    }
    sweep_path = write_sweep(tmp_path, overrides=overrides)
    with pytest.raises(SweepError, match=(
        r"data\.block_size=64 exceeds the model's block_size=32: every trial would fail on "
        r"it; lower data\.block_size or raise model\.config\.block_size"
    )):  # fmt: skip
        run_worker(load_sweep(sweep_path), report=False, mlflow=False)
    assert not (tmp_path / "runs").exists()  # no study, no trial folder
    from cofrgenet.sweeps.worker import check_data_folder

    varied = write_sweep(
        tmp_path, "varied.yaml", overrides=overrides, space={"data.block_size": [16, 64]}
    )
    check_data_folder(load_sweep(varied), {"data": {"data_dir": str(tiny_data),
                                                      "block_size": 64},
                                             "model": {"config": {"block_size": 32}}})  # fmt: skip


def test_a_study_made_for_another_metric_is_refused(tmp_path):
    storage = st.open_storage(f"journal:{tmp_path / 'm.journal'}")
    space = {"a": [1, 2]}
    open_study(parse_sweep({"study": "m", "space": space, "n_trials": 2}), storage, 0)
    other = {"metric": "train/loss", "direction": "minimize"}
    with pytest.raises(SweepError, match=r"study 'm' ranks trials by val/loss, the sweep says"):
        changed = {"study": "m", "space": space, "n_trials": 2, "objective": other}
        open_study(parse_sweep(changed), storage, 1)


def test_status_and_report_refuse_a_sweep_file_with_another_objective(tmp_path, capsys):
    """A file saying maximize val/ppl for a study of minimized val/loss: the report
    labelled val/loss values val/ppl and mapped each cell's worst trial."""
    from test_cli_errors import one_line_error

    sweep = load_sweep(write_sweep(tmp_path))
    open_study(sweep, st.open_storage(st.home_storage(sweep, sweep.runs_dir)), 0)
    objective = {"metric": "val/ppl", "direction": "maximize"}
    edited = str(write_sweep(tmp_path, "edited.yaml", objective=objective))
    for command in ("status", "report"):
        extra = ["--no-mlflow"] if command == "report" else []
        line = one_line_error(capsys, ["sweep", command, edited, *extra])
        assert (  # refused as it is read: every metric is lower-is-better
            "objective.direction maximize: val/ppl is lower-is-better, as is every metric a "
            "trial reports; use minimize (the default)"
        ) in line
        # A study made from such a file before: read by its name (its stored sweep).
        assert line.endswith("`cofr sweep status` or `report` with the study's name reads its "
                             "stored sweep")  # fmt: skip
    objective["direction"] = "minimize"
    edited = str(write_sweep(tmp_path, "edited.yaml", objective=objective))
    line = one_line_error(capsys, ["sweep", "status", edited])
    assert "study 'tiny-cpu' ranks trials by val/loss, the sweep says val/ppl" in line


def test_status_notes_a_sweep_file_that_now_trains_other_trials(tmp_path, capsys):
    """`cofr sweep run` refuses a file whose budget or space changed since the study was
    made; status and report showed the study's trials under it without a word."""
    from cofrgenet import cli

    sweep = load_sweep(write_sweep(tmp_path))
    open_study(sweep, st.open_storage(st.home_storage(sweep, sweep.runs_dir)), 0)
    same = str(write_sweep(tmp_path, "same.yaml"))
    assert cli.main(["sweep", "status", same]) == 0
    assert "note:" not in capsys.readouterr().err
    edited = str(write_sweep(tmp_path, "edited.yaml", budget={"steps": 7}))
    assert cli.main(["sweep", "status", edited]) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: the study's trials are shown, not this file's: study ")
    assert "budget" in err
    # Shown under the study's own space: the report drew the file's axes (a depth column
    # 5 that the study never searched) and wrote over the study's report.
    from cofrgenet.sweeps import cli as sweeps_cli

    space = {"model.config.depth": "int 1..5", "model.config.ladders": {"choices": [1, 3]}}
    wider = str(write_sweep(tmp_path, "wider.yaml", space=space))
    words = ["sweep", "status", wider]
    _, shown, _ = sweeps_cli._load_study(cli.build_parser(words).parse_args(words))
    assert (shown.space[0].key, shown.space[0].high) == ("model.config.depth", 4)
    assert len(shown.space) == 3 and shown.runs_dir == str(tmp_path / "runs")
    assert "space" in capsys.readouterr().err


def test_a_study_made_from_another_version_of_the_sweep_is_refused(tmp_path):
    """Trials trained with another budget, data or space would be ranked against the
    study's: refused, naming each change. Its budget (n_trials) and sampler may change."""
    storage = st.open_storage(f"journal:{tmp_path / 'v.journal'}")
    first = {
        "study": "v",
        "space": {"model.config.depth": "int 1..2"},
        "overrides": {"data.batch_size": 4},
        "budget": {"steps": 6},
        "n_trials": 2,
    }
    open_study(parse_sweep(first), storage, 0)
    more = {**first, "n_trials": 5, "sampler": {"name": "random", "seed": 3}}
    _, created = open_study(parse_sweep(more), storage, 1)
    assert not created
    changed = {
        **first,
        "space": {"model.config.depth": "int 1..2", "model.config.n_layer": "int 1..2"},
        "overrides": {"data.batch_size": 8},
        "budget": {"steps": 10},
    }
    with pytest.raises(SweepError) as refused:
        open_study(parse_sweep(changed), storage, 1)
    message = str(refused.value)
    assert message.startswith("study 'v' was created from another version of this sweep (")
    for change in (
        "overrides.data.batch_size: 4 -> 8",
        "space.model.config.n_layer added",
        "budget.steps: 6 -> 10",
    ):
        assert change in message
    assert message.endswith("give the changed sweep a new study name (study: ...)")
    # A grid that changed (not grown): named at once, not after waiting for points the
    # study never queued.
    grid = {"study": "g2", "space": {"a": [1, 2]}, "sampler": {"name": "grid"}}
    open_study(parse_sweep(grid), storage, 0)
    start = time.monotonic()
    with pytest.raises(SweepError, match=r"another version of this sweep \(space\.a: "):
        open_study(parse_sweep({**grid, "space": {"a": [1, 3, 4]}}), storage, 1)
    assert time.monotonic() - start < 10


def test_a_worker_stops_when_trials_keep_failing_for_one_reason(tiny_data, tmp_path):
    def failing_sweep(folder: Path) -> Path:
        folder.mkdir()
        return write_sweep(
            folder,
            sampler={"name": "grid"},
            pruner={"name": "none"},
            n_trials=None,
            space={"data.block_size": {"choices": [64]},
                   "model.optimizer.lr": {"choices": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3]}},
            overrides={"data.data_dir": str(tiny_data)},
        )  # fmt: skip

    result = run_worker(load_sweep(failing_sweep(tmp_path / "a")), report=False, mlflow=False)
    assert len(result.outcomes) == 3 and not result.done
    assert "data.block_size=64 exceeds the model's block_size=32" in result.failing
    proc = subprocess.run(
        cofr("sweep", "run", str(failing_sweep(tmp_path / "b")), "--no-report", "--no-mlflow"),
        capture_output=True, text=True, env=worker_env(), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1 and "3 trials in a row failed" in proc.stderr


def test_a_restarted_worker_does_not_repeat_finished_points(tiny_data, tmp_path):
    """A worker killed and started again with the same --worker-index draws new points."""
    sweep_path = write_sweep(
        tmp_path,
        pruner={"name": "none"},
        budget={"steps": 2},
        sampler={"name": "random", "seed": 0},
        overrides={"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2},
    )
    sweep = load_sweep(sweep_path)
    run_worker(sweep, n_trials=2, worker_index=0, report=False, mlflow=False)
    result = run_worker(sweep, n_trials=2, worker_index=0, report=False, mlflow=False)
    points = [tuple(sorted(t.params.items())) for t in result.study.get_trials()]
    assert len(points) == 4 and len(set(points)) == 4, points


def _finished_study(sweep) -> optuna.Study:
    """An in-memory study of the sweep with four complete trials (no training)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    study = optuna.create_study(study_name=sweep.study)
    distributions = {
        "model.config.depth": IntDistribution(1, 4),
        "model.config.ladders": CategoricalDistribution([1, 3]),
        "model.optimizer.lr": FloatDistribution(1e-4, 3e-3, log=True),
    }
    for i, (depth, ladders) in enumerate([(1, 1), (2, 3), (3, 1), (4, 3)]):
        params = {"model.config.depth": depth, "model.config.ladders": ladders}
        params["model.optimizer.lr"] = 1e-3
        study.add_trial(
            optuna.trial.create_trial(
                params=params,
                distributions=distributions,
                value=3.0 - 0.1 * i,
                intermediate_values={2: 3.5 - 0.1 * i, 4: 3.2 - 0.1 * i},
            )
        )
    return study


def test_lock_points_go_on_without_a_lock_where_the_file_system_has_no_flock(
    tmp_path, monkeypatch, caplog
):
    """Lustre mounted noflock fails flock with ENOSYS: the study's MLflow run, the MLflow
    store and the report stopped the worker with an OSError traceback. Each goes on
    unlocked, with one warning per lock file naming what may then go wrong."""
    import errno
    import fcntl

    from cofrgenet.sweeps import tracking
    from cofrgenet.sweeps.report import write_report
    from cofrgenet.sweeps.worker import _parent_run

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    sweep = load_sweep(write_sweep(tmp_path, n_trials=1))
    runs = str(tmp_path / "runs")
    storage = st.open_storage(st.home_storage(sweep))
    study, _ = open_study(sweep, storage, 0)
    with caplog.at_level("WARNING", logger="cofrgenet"):
        _, parent = _parent_run(sweep, runs, study, "journal:x")
        assert _parent_run(sweep, runs, study, "journal:x")[1] == parent  # warned once
        tracking.client_for(tracking.run_config(sweep, runs))
        write_report(_finished_study(sweep), sweep, tmp_path / "report")
    assert (tmp_path / "report" / "summary.md").is_file()
    warned = [r.getMessage() for r in caplog.records if "cannot lock files" in r.getMessage()]
    assert len(warned) == 3, warned
    assert warned[0].startswith(f"{tmp_path / 'runs' / '.mlflow.lock'}: this file system ")
    assert any("making the study's MLflow parent run (workers starting together may each "
               "make one) without a lock" in w for w in warned)  # fmt: skip
    assert "(Function not implemented): writing " in warned[-1]


def test_a_set_that_does_not_parse_is_named_as_the_users(tiny_data, tmp_path):
    """`--set data.batch_size=abc` was reported as the sweep file's error."""
    overrides = {"data.data_dir": str(tiny_data)}
    path = write_sweep(tmp_path, overrides=overrides)
    with pytest.raises(SweepError) as refused:
        run_worker(load_sweep(path), extra={"data.batch_size": "abc"}, report=False, mlflow=False)
    assert str(refused.value).startswith(f"{path} with --set data.batch_size=abc: ")
    assert "data.batch_size" in str(refused.value).split(": ", 1)[1]


def test_a_report_without_complete_trials_says_so_without_optunas_log_lines(tmp_path):
    """Optuna logged "There are no complete trials." (and the like) beside the report's
    own account of what each plot lacks."""
    import logging

    from cofrgenet.sweeps.report import write_report

    said: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    sweep = load_sweep(ROOT / "sweeps" / "tiny-cpu.yaml")
    study = optuna.create_study(study_name=sweep.study)
    study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL))
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)  # as in a worker
    collect = Collect()
    logging.getLogger("optuna").addHandler(collect)  # Optuna's own: not propagated
    try:
        write_report(study, sweep, tmp_path / "report")
    finally:
        logging.getLogger("optuna").removeHandler(collect)
        optuna.logging.set_verbosity(before)
    assert not [m for m in said if "complete trials" in m or "does not contain" in m], said
    assert "no completed trial" in (tmp_path / "report" / "summary.md").read_text()


def test_the_reports_trial_table_names_retries_as_status_does():
    """The report's table gave the fail reason only: "retried as #1" and "retry of #0",
    which `cofr sweep status` shows, were missing."""
    from optuna.distributions import IntDistribution

    from cofrgenet.sweeps.report import summary_markdown

    sweep = load_sweep(ROOT / "sweeps" / "tiny-cpu.yaml")
    study = optuna.create_study(study_name=sweep.study)
    point = {"params": {"x": 1}, "distributions": {"x": IntDistribution(0, 3)}}
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL, user_attrs={st.FAIL_REASON: "worker lost"}, **point
        )
    )
    study.add_trial(
        optuna.trial.create_trial(value=1.5, system_attrs={"retry_history": [0]}, **point)
    )
    table = summary_markdown(study, sweep, {}, {}, None, {}).split("## Trials")[1]
    rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| ")}
    assert rows["FAIL"].endswith(" | worker lost; retried as #1 |")
    assert rows["COMPLETE"].endswith(" | 1.5 | retry of #0 |")


def test_counts_of_one_say_trial_not_trials(monkeypatch):
    """ "1 trials" in the report's summary, the study's stopped-at tag and the grid's
    n_trials refusal."""
    from optuna.distributions import IntDistribution

    from cofrgenet.sweeps import tracking
    from cofrgenet.sweeps.report import summary_markdown
    from cofrgenet.sweeps.spec import counted
    from cofrgenet.sweeps.worker import _settle_parent_run

    assert (counted(1, "trial"), counted(0, "trial"), counted(2, "point")) == (
        "1 trial", "0 trials", "2 points"
    )  # fmt: skip
    assert counted(1_000_000, "trial") == "1,000,000 trials" and counted(2.5, "x") == "2.5 xs"
    sweep = parse_sweep({"study": "one", "space": {"x": "int 0..3"}, "n_trials": 1})
    study = optuna.create_study(study_name=sweep.study)
    point = {"params": {"x": 1}, "distributions": {"x": IntDistribution(0, 3)}}
    study.add_trial(optuna.trial.create_trial(value=1.5, **point))
    assert "; 1 trial: 1 complete." in summary_markdown(study, sweep, {}, {}, None, {})
    tags: dict = {}
    monkeypatch.setattr(tracking, "set_tags", lambda client, run, new: tags.update(new))
    monkeypatch.setattr(tracking, "set_parent_status", lambda *_: None)
    _settle_parent_run(None, "run", optuna.create_study(study_name="none"), sweep)
    assert tags[tracking.STUDY_STATE_TAG].startswith("stopped at 0 of 1 trial: ")
    grid = {"study": "g", "space": {"a": [1]}, "sampler": {"name": "grid"}, "n_trials": 2}
    with pytest.raises(SweepError, match=r"trains each of its points once \(1 point\)"):
        parse_sweep(grid)


def _report_in_child(study, sweep, out) -> None:
    from cofrgenet.sweeps.report import write_report

    write_report(study, sweep, out)


def test_workers_finishing_together_take_turns_writing_the_report(tmp_path):
    """The workers that finish a sweep at once each write its report. They take turns
    (a file lock), so one never deletes a plot the other has just written: the race
    that once left a two-worker sweep without optimization_history.png."""
    import multiprocessing

    from cofrgenet.folder_lock import waiting_for
    from cofrgenet.sweeps.report import write_report

    sweep = load_sweep(write_sweep(tmp_path))
    study = _finished_study(sweep)
    out = tmp_path / "report"
    out.mkdir()
    fork = multiprocessing.get_context("fork")
    with waiting_for(tmp_path / ".report.lock"):  # another writer holds the folder
        child = fork.Process(target=_report_in_child, args=(study, sweep, out))
        child.start()
        time.sleep(2.0)
        assert child.is_alive() and not any(out.iterdir()), "the writer did not wait"
    child.join(timeout=120)
    assert child.exitcode == 0
    expected = {"summary.md", "optimization_history.png", "intermediate_values.png"}
    assert expected <= {p.name for p in out.iterdir()}
    # Two at once, twice: every file is there after each round, no temporary left.
    for _ in range(2):
        writers = [
            fork.Process(target=_report_in_child, args=(study, sweep, out)) for _ in range(2)
        ]
        for w in writers:
            w.start()
        for w in writers:
            w.join(timeout=120)
        assert [w.exitcode for w in writers] == [0, 0]
        names = {p.name for p in out.iterdir()}
        assert expected <= names and not [n for n in names if ".tmp" in n], names
    files = write_report(study, sweep, out)
    assert expected <= set(files) and not any(name.startswith(".") for name in files)


# ------------------------------------------------------------------ bad input, one line


def one_line_error(capsys, argv: list[str], status: int = 2) -> str:
    """``cofr ARGV``'s one error line (no traceback). Logging's own "--- Logging error ---"
    reports, about streams an earlier test's capture closed, are left out."""
    from cofrgenet.cli import main

    capsys.readouterr()
    assert main(argv) == status
    err = capsys.readouterr().err.strip().split("--- Logging error ---")
    own = [block.split("Arguments: ", 1)[-1] for block in err]
    assert not any("Traceback" in block for block in own), err
    return "\n".join(own).strip().splitlines()[-1]


def test_bad_budget_or_metric_refuses_the_sweep_file_when_loaded(tmp_path, capsys):
    """steps 0 would record an untrained model's value, steps -3 and an objective the
    fit does not log would fail every trial: run, status and submit refuse them at once."""
    cases = {
        "steps0": ({"budget": {"steps": 0}}, "budget.steps must be a whole number >= 1, got 0"),
        "steps-3": ({"budget": {"steps": -3}}, "budget.steps must be a whole number >= 1"),
        "tokens": ({"budget": {"tokens": -1.0}}, "budget.tokens must be a number > 0"),
        "val": ({"budget": {"steps": 6, "val_every": 0}}, "budget.val_every must be a whole"),
        "trials": ({"n_trials": 0}, "n_trials must be a whole number >= 1, got 0"),
        "metric": (
            {"objective": {"metric": "val/los", "direction": "minimize"}},
            "objective.metric 'val/los' is not a metric a trial reports (did you mean "
            "'val/loss'?); use one of val/loss, val/ppl, train/loss",
        ),
    }
    for name, (changes, message) in cases.items():
        path = write_sweep(tmp_path, f"{name}.yaml", **changes)
        with pytest.raises(SweepError, match=re.escape(message)):
            load_sweep(path)
        for command in (["run", "--no-mlflow"], ["status"], ["submit", "--dry-run"]):
            line = one_line_error(capsys, ["sweep", command[0], str(path), *command[1:]])
            assert line.startswith(f"cofr sweep {command[0]}: error: {message}"), line
    assert not (tmp_path / "runs").exists()  # no study, no trial folder
    # What an older cofr stored with its study is still read (status, reports).
    stored = yaml.safe_load(write_sweep(tmp_path, budget={"steps": 0}).read_text())
    assert parse_sweep(stored, resolve=False).budget.steps == 0
    # The metrics offered are the ones the training module logs.
    from cofrgenet.sweeps.spec import OBJECTIVE_METRICS

    module = (ROOT / "src" / "cofrgenet" / "training" / "module.py").read_text()
    assert all(f'"{metric}"' in module for metric in OBJECTIVE_METRICS)


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, capsys):
    path = write_sweep(tmp_path)
    text = path.read_text().replace("sampler:\n  name: tpe", "sampler:\n  name: tpe: x")
    assert text != path.read_text()
    path.write_text(text)
    line_no = text.splitlines().index("  name: tpe: x") + 1
    for command in ("run", "status"):
        line = one_line_error(capsys, ["sweep", command, str(path)])
        assert line.startswith(f"cofr sweep {command}: error: {path}, line {line_no}, column ")
        assert "not valid YAML: mapping values are not allowed here" in line
    line = one_line_error(capsys, ["sweep", "run", str(path), "--set", "a=[1,"])
    assert "not valid YAML" in line  # the sweep file's error comes first
    line = one_line_error(capsys, ["sweep", "run", str(write_sweep(tmp_path)), "--set", "a=[1,"])
    assert line.startswith("cofr sweep run: error: --set a=[1,: the value is not valid YAML")


def test_a_key_given_twice_in_a_sweep_file_is_refused(tmp_path, capsys):
    """PyYAML keeps the last: a second `model.config.depth:` of the space, or a second
    `study:`, was silently used in place of the first. Refused as `cofr fit` refuses a
    config file's (one loader for both)."""
    text = write_sweep(tmp_path).read_text()
    depth = "  model.config.depth: int 1..4\n"
    assert depth in text and text.startswith("study: ")
    for name, twice in {
        "space": text.replace(depth, depth + "  model.config.depth: int 5..6\n"),
        "study": "study: other\n" + text,
    }.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(twice)
        key = "model.config.depth" if name == "space" else "study"
        for command in ("run", "status"):
            line = one_line_error(capsys, ["sweep", command, str(path)])
            assert line.startswith(f"cofr sweep {command}: error: {path}, line "), line
            assert line.endswith(f"not valid YAML: the key '{key}' is given twice: keep one")


def test_sweep_files_take_yaml_merge_keys_and_read_clock_times_as_text():
    """The duplicate-key loader refused `<<: *anchor` (no constructor for the merge tag);
    `time: 12:00:00` was YAML 1.1's base-60 integer 43200: minutes to sbatch, 30 days."""
    import yaml

    from cofrgenet.recipes import unique_key_loader

    text = (
        "range: &range {low: 1.0e-4, high: 1.0e-2, log: true}\n"
        "lr: {<<: *range, high: 3.0e-2}\ntime: 12:00:00\nsteps: 90\nratio: 0.5\n"
    )
    read = yaml.load(text, Loader=unique_key_loader())
    assert read["lr"] == {"low": 1.0e-4, "high": 3.0e-2, "log": True}
    assert read["time"] == "12:00:00" and read["steps"] == 90 and read["ratio"] == 0.5
    slurm = yaml.load("time: 12:00:00", Loader=unique_key_loader())
    sweep = parse_sweep({"study": "t", "space": {"x": "int 0..3"}, "n_trials": 1, "slurm": slurm})
    assert sweep.slurm.time == "12:00:00"


def test_an_unknown_storage_url_is_refused_at_once(tmp_path, capsys):
    path = str(write_sweep(tmp_path))
    start = time.monotonic()
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", "foo://bar"])
    assert time.monotonic() - start < 5, "refused after retries"
    assert line.startswith("cofr sweep status: error: storage 'foo://bar': unknown URL scheme")
    assert "sqlite:///PATH.db" in line and "postgresql://" in line and "journal:PATH" in line
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", "postgres://u:pw@h/db"])
    assert "(did you mean 'postgresql'?)" in line and "pw" not in line
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", str(tmp_path / "x")])
    assert "not a journal file or database URL" in line
    missing = f"sqlite:///{tmp_path / 'nowhere' / 'x.db'}"
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", missing])
    assert "nowhere/x.db does not exist" in line
    assert not (tmp_path / "nowhere").exists()
    # A scheme typo made a folder "jornal:" in the cwd; sqlite:// is a study in memory.
    typo = f"jornal:{tmp_path / 'x.journal'}"
    for command in (["status", path], ["run", path, "--no-mlflow"]):
        line = one_line_error(capsys, ["sweep", *command, "--storage", typo])
        assert "unknown scheme 'jornal:' (did you mean 'journal'?)" in line
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", "sqlite://"])
    assert "storage 'sqlite://' is an in-memory database" in line
    assert not list(Path.cwd().glob("jornal:*"))


def test_a_journal_without_a_file_path_is_refused_before_anything_runs(
    tmp_path, capsys, monkeypatch
):
    """`journal:` (the working directory) and a journal naming a folder raised
    IsADirectoryError from Optuna in run, status and report, and submit --dry-run wrote
    `--storage journal:` into its workers' script. One line wherever a URL is read: a
    --storage (also from env:NAME), the sweep file's storage:."""
    path = str(write_sweep(tmp_path))
    folder = tmp_path / "journals"
    folder.mkdir()
    none = "a journal needs a file path, and none is given: give one, e.g. "
    cases = {
        "journal:": f"storage 'journal:': {none}journal:runs/sweeps/<study>/optuna.journal",
        f"journal:{folder}": f"and {folder} is a folder: give a file in it, e.g. "
        f"journal:{folder}/optuna.journal",
        f"journal:{tmp_path / 'new'}/": f"and {tmp_path / 'new'}/ is a folder",
    }
    commands = (["run", "--no-mlflow"], ["status"], ["report"], ["submit", "--dry-run"])
    for url, message in cases.items():
        for command in commands:
            line = one_line_error(
                capsys, ["sweep", command[0], path, *command[1:], "--storage", url]
            )
            assert line.startswith(f"cofr sweep {command[0]}: error: argument --storage: "), line
            assert message in line, line
    monkeypatch.setenv("MY_STORAGE", f"journal:{folder}")
    line = one_line_error(capsys, ["sweep", "status", path, "--storage", "env:MY_STORAGE"])
    assert "is a folder: give a file in it" in line
    in_file = write_sweep(tmp_path, "in-file.yaml", storage="journal:")
    for command in commands:
        line = one_line_error(capsys, ["sweep", command[0], str(in_file), *command[1:]])
        assert line == f"cofr sweep {command[0]}: error: {cases['journal:']}", line
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_a_mistyped_storage_file_is_refused_when_the_study_exists_elsewhere(tmp_path, capsys):
    """Optuna would start the study anew in the mistyped file; one line says where it is."""
    path = str(write_sweep(tmp_path))
    sweep = load_sweep(path)
    home = st.default_storage(sweep)
    typo = f"journal:{tmp_path / 'optuna.jounral'}"
    st.check_given_storage(typo, home, sweep.study)  # no study yet: a new file is fine
    st.journal_path(home).parent.mkdir(parents=True)
    st.journal_path(home).touch()
    # An empty journal (a refused start's) holds no study: "leave out --storage" would
    # only lead back to that refusal.
    st.check_given_storage(typo, home, sweep.study)
    optuna.create_study(study_name=sweep.study, storage=st.open_storage(home))
    for command in (["run", "--no-mlflow"], ["submit", "--dry-run"]):
        line = one_line_error(
            capsys, ["sweep", *command[:1], path, *command[1:], "--storage", typo]
        )
        assert f"--storage {typo}: no such file, and study 'tiny-cpu' is stored in " in line
        assert "leave out --storage to go on with it, or give --study NAME" in line
    assert not st.journal_path(typo).exists()
    for fine in (home, f"journal:{path}", "postgresql://u@h/db", None):  # same, existing, server
        st.check_given_storage(fine, home, sweep.study)
    sqlite = f"sqlite:///{tmp_path / 'typo.db'}"
    with pytest.raises(SweepError, match="no such file"):
        st.check_given_storage(sqlite, home, sweep.study)


def test_an_empty_or_bad_study_override_is_refused(tmp_path, capsys):
    """--study '' is not "no override": it would run the sweep file's study unasked."""
    path = str(write_sweep(tmp_path))
    for value in ("", "a/b", "-x", ".x"):  # -x: refused as "experiment '-x'" at its folder
        line = one_line_error(capsys, ["sweep", "run", path, "--no-mlflow", f"--study={value}"])
        assert f"study {value!r}: a name of letters, digits" in line
    assert not (tmp_path / "runs").exists()
    # A file with no study: key at all (it said "study None: a name ... is required").
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text("space:\n  model.config.depth: int 1..2\nn_trials: 2\n")
    line = one_line_error(capsys, ["sweep", "run", str(nameless), "--no-mlflow"])
    assert line.endswith(f"{nameless} has no study: key: name the study (study: my-sweep)")


def test_status_of_a_study_not_started_creates_nothing(tmp_path, capsys):
    path = str(write_sweep(tmp_path))
    for command in ("status", "report"):
        line = one_line_error(capsys, ["sweep", command, path])
        assert "no study 'tiny-cpu' yet: " in line and "`cofr sweep run` starts it" in line
        assert "give --storage as its workers were given it" in line
    assert not (tmp_path / "runs").exists()
    # A mistyped sqlite --storage: no empty database made (a later run would start there).
    typo = tmp_path / "nope.db"
    line = one_line_error(capsys, ["sweep", "status", "tiny-cpu", "--storage", f"sqlite:///{typo}"])
    assert f"no study 'tiny-cpu' yet: {typo} does not exist" in line
    assert "check the path" in line and not typo.exists()
    # A mistyped study name gets the closest study of the runs folder.
    journal = tmp_path / "runs" / "sweeps" / "tiny-cpu" / "optuna.journal"
    journal.parent.mkdir(parents=True)
    journal.touch()
    runs = str(tmp_path / "runs")
    line = one_line_error(capsys, ["sweep", "status", "tiny-cpy", "--runs-dir", runs])
    assert "no study 'tiny-cpy' at " in line and "(did you mean 'tiny-cpu'?)" in line
    assert "the --runs-dir its workers ran in" in line  # a study run elsewhere: say how


def test_a_storage_or_runs_folder_under_a_file_is_one_line(tiny_data, tmp_path, capsys):
    """`--storage journal:run1.log/x.journal` or `--runs-dir run1.log/sub`, where
    run1.log is a file: FileExistsError / NotADirectoryError tracebacks."""
    path = str(write_sweep(tmp_path, overrides={"data.data_dir": str(tiny_data)}))
    blocker = tmp_path / "run1.log"
    blocker.write_text("a log\n")
    run = ["sweep", "run", path, "--no-mlflow", "--no-report"]
    line = one_line_error(capsys, [*run, "--storage", f"journal:{blocker / 'x.journal'}"])
    assert line.endswith(
        f"cannot make {blocker}, the folder of the study's storage: {str(blocker)!r} is a "
        "file; choose another with --storage or --runs-dir"
    )
    line = one_line_error(capsys, [*run, "--runs-dir", str(blocker / "sub")])
    assert f"cannot make {blocker / 'sub' / 'sweeps' / 'tiny-cpu'}, the folder of the " in line
    assert blocker.read_text() == "a log\n"
    # A journal named in a folder that is not there: refused as a sqlite file's is (it
    # made the folders, down from / for `journal:/nonexistent/x.journal`).
    missing = tmp_path / "nonexistent" / "deeper"
    line = one_line_error(capsys, [*run, "--storage", f"journal:{missing / 'x.journal'}"])
    assert f"no folder {missing} for the journal file (one in the runs folder " in line
    assert line.endswith(" is made)")
    assert not (tmp_path / "nonexistent").exists()


def test_report_out_must_be_a_folder(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    line = one_line_error(
        capsys, ["sweep", "report", str(write_sweep(tmp_path)), "--out", str(notes)]
    )
    assert line == (
        f"cofr sweep report: error: --out-dir {notes} is a file: --out-dir must be a folder "
        "(made if missing)"
    )
    assert notes.read_text() == "mine\n"


def test_set_keys_are_exact_and_not_set_again_by_the_sweep(tmp_path, capsys):
    """--set of a searched key (or the budget's, run.*) would be silently replaced in
    every trial, and an abbreviated key (data.batch_siz) read as the key it abbreviates:
    both stop the worker before the study exists."""
    path = str(write_sweep(tmp_path, n_trials=1))
    run = ["sweep", "run", path, "--no-mlflow", "--no-report", "--set"]
    line = one_line_error(capsys, [*run, "model.config.depth=4"])
    assert line == (
        "cofr sweep run: error: --set model.config.depth: the sweep searches this key; "
        "remove it from the space or drop the --set"
    )
    line = one_line_error(capsys, [*run, "model.config={depth: 4}"])
    assert "--set model.config: the sweep searches model.config.depth" in line
    line = one_line_error(capsys, [*run, "trainer.max_steps=3"])
    assert "the sweep's budget sets this key" in line
    line = one_line_error(capsys, [*run, "run.mlflow=true"])
    assert "--no-mlflow sets this key to false" in line
    line = one_line_error(capsys, [*run, "data.batch_siz=3"])
    assert line == (
        "cofr sweep run: error: --set: unknown key 'data.batch_siz' (did you mean "
        "'data.batch_size'?); `cofr fit --help` lists the keys"
    )
    assert not (tmp_path / "runs").exists()  # no study, no trial folder
    # submit renders workers that would stop: it refuses too.
    submit = ["sweep", "submit", path, "--dry-run", "--set"]
    assert "the sweep searches this key" in one_line_error(
        capsys, [*submit, "model.config.depth=4"]
    )
    assert "'data.batch_siz'" in one_line_error(capsys, [*submit, "data.batch_siz=3"])
    # Keys inside an option, and groups of options, are keys.
    from cofrgenet.sweeps.fitconfig import check_keys

    check_keys(load_sweep(path), {"model.optimizer.lr": 1e-3, "data": {"batch_size": 2}})


def test_an_unfinished_studys_run_names_the_command_that_goes_on(tiny_data, tmp_path):
    """The study's MLflow run, left KILLED by a worker of --study NAME --set K=V, said
    `cofr sweep run FILE` goes on: that runs the file's own study (or refuses the
    settings), not this one."""
    from cofrgenet.cli import main
    from cofrgenet.sweeps import tracking

    path = write_sweep(
        tmp_path, n_trials=2, pruner={"name": "none"}, budget={"steps": 2},
        overrides={"data.data_dir": str(tiny_data)},
    )  # fmt: skip
    words = ["--study", "other", "--set", "model.config.dropout=0.0", "--n-trials", "1"]
    assert main(["sweep", "run", str(path), *words, "--no-report"]) == 0
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name(load_sweep(path, {"study": "other"}).experiment)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`cofr.sweep` = 'parent'")
    again = f"cofr sweep run {path} --study other --set model.config.dropout=0.0"
    from argparse import Namespace

    from cofrgenet.sweeps.cli import _run_again_command

    given = Namespace(sweep="s.yaml", study=None, storage=None, runs_dir=None,
                      settings=["run.tracking_uri=postgresql://u:secret@h/db"])  # fmt: skip
    assert _run_again_command(given) == (
        "cofr sweep run s.yaml --set run.tracking_uri=postgresql://u:***@h/db"
    )
    assert parent.info.status == "KILLED"
    assert parent.data.tags[tracking.STUDY_STATE_TAG] == (
        f"stopped at 1 of 2 trials: `{again}` goes on"
    )


def test_no_mlflow_trials_track_nothing_and_train_loss_is_an_objective(tiny_data, tmp_path, capsys):
    """--no-mlflow: no parent run and no trial run (no mlflow.db). The objective
    train/loss survives the final validation that follows a last step between two."""
    path = write_sweep(
        tmp_path,
        n_trials=1,
        pruner={"name": "none"},
        objective={"metric": "train/loss", "direction": "minimize"},
        budget={"steps": 3, "val_every": 2},
        overrides={"data.data_dir": str(tiny_data)},
    )
    from cofrgenet.cli import main

    capsys.readouterr()
    assert main(["sweep", "run", str(path), "--no-mlflow", "--no-report"]) == 0
    out = capsys.readouterr().out
    sweep = load_sweep(path)
    (trial,) = study_of(st.default_storage(sweep), sweep.study).get_trials()
    assert trial.state == TrialState.COMPLETE, trial.user_attrs.get(st.FAIL_REASON)
    runs = tmp_path / "runs"
    assert not (runs / "mlflow.db").exists() and not (runs / "mlartifacts").exists()
    assert "MLflow run:" not in out
    config = yaml.safe_load((runs / sweep.experiment / "trial-0000" / "config.yaml").read_text())
    assert config["run"]["mlflow"] is False


def test_a_worker_whose_trials_all_failed_exits_1(tiny_data, tmp_path, capsys):
    """Failed trials keep their reason and the study goes on (two different failures do
    not stop the worker), but a worker none of whose trials completed says so: status 1."""
    path = write_sweep(
        tmp_path,
        sampler={"name": "grid"},
        pruner={"name": "none"},
        n_trials=None,
        space={"data.block_size": {"choices": [64]},
               "model.optimizer.lr": {"choices": [1e-3, 2e-3]}},
        overrides={"data.data_dir": str(tiny_data)},
    )  # fmt: skip
    from cofrgenet.cli import main

    capsys.readouterr()
    assert main(["sweep", "run", str(path), "--no-mlflow", "--no-report"]) == 1
    err = capsys.readouterr().err
    assert "cofr sweep run: no trial of this worker completed: 2 failed, the last with: " in err
    assert "data.block_size=64 exceeds the model's block_size=32" in err
    sweep = load_sweep(path)
    trials = study_of(st.default_storage(sweep), sweep.study).get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.FAIL]


# ------------------------------------------------------------ robustness of the storage


def _journal_study(folder: Path, name: str = "tiny-cpu") -> tuple[str, Path]:
    """A journal study with three complete trials and one RUNNING (no training)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "optuna.journal"
    study = optuna.create_study(study_name=name, storage=st.open_storage(f"journal:{path}"))
    for i in range(3):
        trial = study.ask()
        trial.set_user_attr("i", i)
        study.tell(trial, float(i))
    study.ask().set_user_attr("i", 3)
    return f"journal:{path}", path


def _append_trials(url: str, name: str, n: int = 2) -> None:
    study = optuna.load_study(study_name=name, storage=st.open_storage(url))
    for _ in range(n):
        study.tell(study.ask(), 1.0)


def test_a_torn_journal_record_is_cut_off_and_the_study_stays_readable(tmp_path, caplog):
    """A crash or a full disk in the middle of an append leaves a last line without its
    newline; the next append used to be glued onto it, and the journal could never be
    read again. The torn record is cut off (under the journal's lock, the whole file kept
    beside it) before a worker opens the study and before every append."""
    url, path = _journal_study(tmp_path / "a")
    whole = path.read_bytes()
    path.write_bytes(whole[:-30])  # head -c -30
    torn = path.read_bytes()
    with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
        _append_trials(url, "tiny-cpu")
    (copy,) = tmp_path.joinpath("a").glob("optuna.journal.torn-*")
    assert copy.read_bytes() == torn  # the whole file as it was, torn record included
    assert path.read_bytes().startswith(torn[: torn.rfind(b"\n") + 1])
    assert path.read_bytes().endswith(b"\n")
    assert f"{path}: removed its last record" in caplog.text
    assert str(copy) in caplog.text
    trials = study_of(url, "tiny-cpu").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3 + [
        TrialState.RUNNING,  # its last record was the torn one: stale-trial handling's
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]
    # A worker that opened the study before another one tore it appends safely too.
    url, path = _journal_study(tmp_path / "b")
    running = optuna.load_study(study_name="tiny-cpu", storage=st.open_storage(url))
    with open(path, "ab") as handle:
        handle.write(b'{"op_code":8,"worker_id":"dead","trial_id":3,"user_a')
    for _ in range(2):
        running.tell(running.ask(), 1.0)
    assert len(study_of(url, "tiny-cpu").get_trials()) == 6
    assert len(list(tmp_path.joinpath("b").glob("optuna.journal.torn-*"))) == 1


def _open_and_add(url: str, barrier) -> None:
    barrier.wait()
    _append_trials(url, "tiny-cpu", n=1)


def test_workers_starting_together_on_a_torn_journal_cut_it_once(tmp_path):
    import multiprocessing

    url, path = _journal_study(tmp_path)
    path.write_bytes(path.read_bytes()[:-30])
    fork = multiprocessing.get_context("fork")
    barrier = fork.Barrier(3)
    workers = [fork.Process(target=_open_and_add, args=(url, barrier)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0, 0]
    assert len(list(tmp_path.glob("optuna.journal.torn-*"))) == 1
    states = [t.state for t in study_of(url, "tiny-cpu").get_trials()]
    assert len(states) == 7 and states.count(TrialState.COMPLETE) == 6


def test_a_damaged_journal_names_the_file_and_the_repair(tmp_path, capsys):
    """A journal damaged before this fix (a torn record with another glued onto it, then
    more records) is one line saying where and how to repair it, not a traceback."""
    url, path = _journal_study(tmp_path / "runs" / "sweeps" / "tiny-cpu")
    lines = path.read_bytes().splitlines(keepends=True)
    glued = lines[-2][:-30] + lines[-1]
    path.write_bytes(b"".join([*lines[:-2], glued, lines[-1]]))
    runs = str(tmp_path / "runs")
    line = one_line_error(capsys, ["sweep", "status", "tiny-cpu", "--runs-dir", runs])
    assert line == (
        f"cofr sweep status: error: the study journal {path} is damaged: line "
        f"{len(lines) - 1} is not a whole JSON record; keep a copy of the file, then delete "
        f"its first {len(lines[-2]) - 30} bytes (a cut-off record that a later one was "
        "appended to)"
    )
    # Doing what it says repairs the study (less the cut-off record: trial 3's creation).
    path.write_bytes(b"".join([*lines[:-2], lines[-1], lines[-1]]))
    assert len(study_of(url, "tiny-cpu").get_trials()) == 3


def test_an_unreachable_database_is_one_line(tiny_data, tmp_path, capsys):
    path = str(write_sweep(tmp_path, overrides={"data.data_dir": str(tiny_data)}))
    url = "postgresql://me:secret@127.0.0.1:1/db"  # port 1: refused at once
    for command in (["status"], ["run", "--no-mlflow", "--no-report"]):
        start = time.monotonic()
        line = one_line_error(capsys, ["sweep", command[0], path, *command[1:], "--storage", url])
        assert line.startswith(
            f"cofr sweep {command[0]}: error: cannot reach the study database "
            "postgresql://me:***@127.0.0.1:1/db: is the server up, and its host, port, user "
            "and password right? ("
        ), line
        assert "secret" not in line
        assert time.monotonic() - start < 60
    assert not (tmp_path / "runs").exists()


def test_bad_pruner_options_refuse_the_sweep_file_when_loaded(tmp_path, capsys):
    """A pruner value Optuna only rejects at a trial's first report (Hyperband's
    min_resource -1: "math domain error" in every trial) is refused with its key."""
    good = {"study": "s", "space": {"a.b": "int 1..2"}, "n_trials": 2, "budget": {"steps": 6}}
    cases = {
        "hyperband-min": (
            {"name": "hyperband", "min_resource": -1},
            "pruner.min_resource: -1 is refused by the hyperband pruner",
        ),
        "hyperband-above": (
            {"name": "hyperband", "min_resource": 10},
            "pruner.min_resource: 10 is above the budget.steps 6",
        ),
        "hyperband-factor": (
            {"name": "hyperband", "reduction_factor": "x"},
            "pruner.reduction_factor: 'x' is refused",
        ),
        "median": ({"name": "median", "n_warmup_steps": -2}, "pruner.n_warmup_steps: -2"),
        "typo": ({"name": "median", "n_warmpu_steps": 2}, "(did you mean 'n_warmup_steps'?)"),
        "percentile": ({"name": "percentile", "percentile": 120}, "pruner.percentile: 120"),
        "sha": ({"name": "sha", "min_resource": 0}, "pruner.min_resource: 0"),
    }
    for pruner, message in cases.values():
        with pytest.raises(SweepError, match=re.escape(message)):
            parse_sweep({**good, "pruner": pruner})
    parse_sweep({**good, "pruner": {"name": "hyperband", "min_resource": 2}})
    parse_sweep({**good, "pruner": {"name": "percentile", "percentile": 25.0}})
    bad = write_sweep(tmp_path, pruner={"name": "hyperband", "min_resource": -1})
    for command in (["run", "--no-mlflow"], ["status"], ["submit", "--dry-run"]):
        line = one_line_error(capsys, ["sweep", command[0], str(bad), *command[1:]])
        assert "pruner.min_resource: -1 is refused by the hyperband pruner" in line
    assert not (tmp_path / "runs").exists()


def test_a_pruner_that_could_never_prune_is_said():
    """A warm-up or first rung at the budget's last step, or more complete trials awaited
    than the budget can hold while one runs: the pruner prunes nothing, and nothing said
    so (a sweep ran its whole budget unpruned). Said, not refused: a smoke run's copy of
    a sweep file with a smaller budget or n_trials is no error."""
    good = {"study": "s", "space": {"a.b": "int 1..2"}, "n_trials": 4, "budget": {"steps": 6}}
    cases = (
        ({"name": "median", "n_warmup_steps": 6},
         "pruner.n_warmup_steps: 6 is not below the budget's 6 steps, so the median pruner "
         "could prune no trial before its last step; lower n_warmup_steps"),
        ({"name": "percentile", "percentile": 25.0, "n_warmup_steps": 9}, "n_warmup_steps: 9"),
        ({"name": "sha", "min_resource": 6}, "pruner.min_resource: 6 puts the sha pruner's "
         "first rung at step 6, not below the budget's 6 steps"),
        ({"name": "sha", "min_resource": 2, "reduction_factor": 3, "min_early_stopping_rate": 1},
         "pruner.min_early_stopping_rate: 1 puts the sha pruner's first rung at step 6 "
         "(min_resource 2 x reduction_factor 3^1)"),
    )  # fmt: skip
    for pruner, message in cases:
        assert message in (pruner_idle_in_budget(parse_sweep({**good, "pruner": pruner}), {}) or "")
    waits = (
        ({"name": "median", "n_startup_trials": 4},
         "pruner.n_startup_trials: 4 is not below n_trials 4: the median pruner waits for 4 "
         "complete trials, but at most 3 can be complete while a trial runs, so it will "
         "prune nothing"),
        ({"name": "percentile", "percentile": 25.0, "n_min_trials": 5}, "n_min_trials: 5 is"),
    )  # fmt: skip
    for pruner, message in waits:
        assert message in (pruner_waits_past_budget(parse_sweep({**good, "pruner": pruner})) or "")
    grid = {"study": "g", "space": {"a": [1, 2]}, "sampler": {"name": "grid"}}
    gridded = parse_sweep({**grid, "pruner": {"name": "median", "n_startup_trials": 2}})
    assert "n_startup_trials: 2 is not below the grid's 2 points" in (
        pruner_waits_past_budget(gridded) or ""
    )
    for pruner in (
        {"name": "median", "n_warmup_steps": 5, "n_startup_trials": 3},
        {"name": "median"},  # Optuna's n_startup_trials 5: not the sweep's to answer for
        {"name": "sha", "min_resource": 2, "reduction_factor": 2, "min_early_stopping_rate": 1},
        {"name": "sha"},  # min_resource "auto"
    ):
        sweep = parse_sweep({**good, "pruner": pruner})
        assert pruner_waits_past_budget(sweep) is None and pruner_idle_in_budget(sweep, {}) is None


def test_a_typo_in_a_fixed_preset_stops_the_worker_before_the_study(tmp_path):
    sweep_path = write_sweep(tmp_path, overrides={"model.preset": "gpt2-tiny-ff"})
    with pytest.raises(SweepError, match=r"model\.preset: unknown preset 'gpt2-tiny-ff' "):
        run_worker(load_sweep(sweep_path), report=False, mlflow=False)
    assert not (tmp_path / "runs").exists()  # no study, no trial folder


def test_a_fixed_model_value_that_fails_every_point_stops_the_worker(tmp_path, capsys):
    """A bad fixed model.config value is refused before the study (and before sbatch);
    one that only clashes with some sampled values is left to those trials."""
    bad = write_sweep(tmp_path, overrides={"model.config.n_head": 5})
    message = (
        r"no trial could build its model \(at each of the 4 points of the space tried\): "
        r"n_embd \(64\) must be a multiple of n_head \(5\)"
    )
    with pytest.raises(SweepError, match=message):
        run_worker(load_sweep(bad), report=False, mlflow=False)
    line = one_line_error(capsys, ["sweep", "submit", str(bad), "--dry-run"])
    assert "no trial could build its model" in line and "n_head (5)" in line
    assert not (tmp_path / "runs").exists()  # no study, no trial folder

    # n_head 3 divides the width 96, not 64: only the trials that draw both fail.
    space = {"model.config.n_head": {"choices": [3, 4]}, "model.config.n_embd": [64, 96]}
    mixed = load_sweep(write_sweep(tmp_path, space=space))
    check_model_values(mixed, trial_config(mixed, {"model.config.n_head": 3}))
    # n_head 3 with the width fixed at 64: every trial that draws it fails.
    alone = load_sweep(write_sweep(tmp_path, space={"model.config.n_head": {"choices": [3, 4]}}))
    with pytest.raises(SweepError, match=r"^space\.model\.config\.n_head: 3 builds no model: "):
        check_model_values(alone, trial_config(alone, {"model.config.n_head": 4}))
    # Only range ends are tried: n_head 4 or 8 with a width of 30 builds no model, while
    # 5 or 6 would; the width 30 is not judged against a range.
    space = {"model.config.n_head": "int 4..8", "model.config.n_embd": [64, 30]}
    partial = load_sweep(write_sweep(tmp_path, space=space))
    check_model_values(partial, trial_config(partial, {"model.config.n_head": 4}))
    # A wrong type among the choices, a range end out of bounds.
    typed = load_sweep(write_sweep(tmp_path, space={"model.config.ladders": [1, "three"]}))
    with pytest.raises(SweepError, match=r"ladders: 'three' builds no model: ladders must be"):
        check_model_values(typed, trial_config(typed, {"model.config.ladders": 1}))
    # Beside a range too, when the reason is the same at both of its ends.
    space = {"model.config.ladders": [1, "three"], "model.config.depth": "int 1..4"}
    typed = load_sweep(write_sweep(tmp_path, space=space))
    with pytest.raises(SweepError, match=r"ladders: 'three' builds no model: ladders must be"):
        check_model_values(typed, trial_config(typed, {"model.config.ladders": 1}))
    ranged = load_sweep(write_sweep(tmp_path, space={"model.config.depth": "int 0..2"}))
    with pytest.raises(
        SweepError,
        match=r"depth: 0 builds no model: depth must be a positive.*; move the range's low "
        r"end \(0\.\.2\) past it \(1 is the lowest that builds\)$",
    ):
        check_model_values(ranged, trial_config(ranged, {"model.config.depth": 1}))
    # Named at once, not found one wrong low end after another (-1, then 0).
    ranged = load_sweep(write_sweep(tmp_path, space={"model.config.ladders": "int -1..3"}))
    with pytest.raises(SweepError, match=r"\(-1\.\.3\) past it \(1 is the lowest that builds\)$"):
        check_model_values(ranged, trial_config(ranged, {"model.config.ladders": 1}))
    wrong = load_sweep(write_sweep(tmp_path, space={"model.config.n_head": {"choices": [3, 5]}}))
    with pytest.raises(SweepError, match=r"2 points .*: n_embd \(64\) must be a multiple of"):
        check_model_values(wrong, trial_config(wrong, {"model.config.n_head": 3}))
    # Every point fails, and the fixed settings alone build a model: the space is named.
    space = {"model.config.depth": "int -2..0", "model.config.ladders": [1, 3]}
    negative = load_sweep(write_sweep(tmp_path, space=space))
    with pytest.raises(SweepError) as blamed:
        check_model_values(negative, trial_config(negative, {"model.config.depth": 0}))
    assert str(blamed.value).endswith("fix the values of space.model.config.depth")
    # Only the key at fault is named (ladders: [0] beside a depth that builds).
    space = {"model.config.depth": "int 1..3", "model.config.ladders": [0]}
    zero = load_sweep(write_sweep(tmp_path, space=space))
    with pytest.raises(SweepError) as blamed:
        check_model_values(zero, trial_config(zero, {"model.config.depth": 1}))
    assert str(blamed.value).endswith("fix the values of space.model.config.ladders")


def test_a_sampled_value_the_config_refuses_names_the_space_not_a_temporary_file(tmp_path):
    """`depth: float 1..4` said "model.config.depth (in /tmp/tmpXXXX/sweep-settings.yaml):
    expected an integer", naming a file the user never wrote."""
    sweep = load_sweep(write_sweep(tmp_path, space={"model.config.depth": "float 1..4"}))
    with pytest.raises(SweepError) as refused:
        run_worker(sweep, report=False, mlflow=False)
    assert "model.config.depth (space.model.config.depth drew 1.0): expected an integer" in str(
        refused.value
    )
    assert "sweep-settings.yaml" not in str(refused.value)


def test_a_storage_without_its_driver_names_that_driver():
    """`--storage mysql://...` without a MySQL driver suggested PostgreSQL's psycopg."""
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("a MySQL driver is installed here")
    with pytest.raises(SweepError, match=r"\(MySQL: pip install mysqlclient, or PyMySQL"):
        st.open_storage("mysql://u:p@127.0.0.1:3306/db")


def test_a_data_value_that_fails_every_trial_stops_the_worker(tiny_data, tmp_path):
    """data.batch_size 0 would fail every trial, each using up the study's budget."""
    path = write_sweep(tmp_path, overrides={"data.data_dir": str(tiny_data), "data.batch_size": 0})
    with pytest.raises(SweepError, match=r"data\.batch_size must be >= 1, got 0"):
        run_worker(load_sweep(path), report=False, mlflow=False)
    assert not (tmp_path / "runs").exists()  # no study, no trial folder


def test_an_optimizer_value_that_fails_every_trial_stops_the_worker(tmp_path, capsys):
    """model.optimizer.lr: -0.001 failed every trial, then the study was done; fixing
    the file was refused (its overrides changed): the study's name was burnt. Refused
    before the study (and before sbatch) now, as are a range end and a choice that
    cofr fit refuses."""
    space = {"model.config.depth": "int 1..4"}
    bad = write_sweep(tmp_path, overrides={"model.optimizer.lr": -0.001}, space=space)
    message = (
        r"no trial could train: model\.optimizer\.lr must be positive, got -0\.001; fix "
        r"the sweep's overrides or --set"
    )
    with pytest.raises(SweepError, match=message):
        run_worker(load_sweep(bad), report=False, mlflow=False)
    line = one_line_error(capsys, ["sweep", "submit", str(bad), "--dry-run"])
    assert "model.optimizer.lr must be positive, got -0.001" in line
    assert not (tmp_path / "runs").exists()  # no study, no trial folder

    ranged = load_sweep(write_sweep(tmp_path, space={"model.optimizer.lr": "float -1..1"}))
    with pytest.raises(SweepError, match=r"^space\.model\.optimizer\.lr: -1\.0 trains no trial: "):
        check_optimizer_values(ranged, trial_config(ranged, {"model.optimizer.lr": 0.5}))
    space = {"model.optimizer.min_lr_ratio": [0.1, 2]}
    chosen = load_sweep(write_sweep(tmp_path, space=space))
    with pytest.raises(SweepError, match=r"min_lr_ratio: 2 trains no trial: .*remove it from"):
        check_optimizer_values(chosen, trial_config(chosen, {"model.optimizer.min_lr_ratio": 0.1}))
    good = load_sweep(write_sweep(tmp_path))  # lr: float 1e-4..3e-3 log
    check_optimizer_values(good, trial_config(good, {"model.optimizer.lr": 1e-3}))
    # YAML reads `[6e-4, 3e-4]` (no dots) as strings, which cofr fit's parser makes floats.
    listed = load_sweep(write_sweep(tmp_path, space={"model.optimizer.lr": ["6e-4", "3e-4"]}))
    check_optimizer_values(listed, trial_config(listed, {"model.optimizer.lr": "6e-4"}))
    negative = load_sweep(write_sweep(tmp_path, space={"model.optimizer.lr": ["6e-4", "-1e-3"]}))
    with pytest.raises(SweepError, match=r"'-1e-3' trains no trial: .*must be positive"):
        check_optimizer_values(negative, trial_config(negative, {"model.optimizer.lr": "6e-4"}))


def test_unwritable_storage_and_report_folders_are_said_in_one_line(tmp_path, monkeypatch, capsys):
    """A read-only folder gave tracebacks (the journal's creation, the report's mkdir),
    and a sqlite file there, after retries, the advice for a database server that is
    down. (A read-only file system is simulated: tests may run as root.)"""
    readonly = tmp_path / "ro"
    readonly.mkdir()
    touch = Path.touch

    def read_only(self, *args, **kwargs):
        if self.parent == readonly:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return touch(self, *args, **kwargs)

    monkeypatch.setattr(Path, "touch", read_only)
    journal = readonly / "x.journal"
    with pytest.raises(SweepError) as error:
        st.open_storage(f"journal:{journal}")
    assert str(error.value) == (
        f"cannot make the study's journal {journal}: Read-only file system; choose another "
        "with --storage or --runs-dir"
    )
    (tmp_path / "dir.db").mkdir()  # a file sqlite cannot open, as in a read-only folder
    started = time.monotonic()
    with pytest.raises(SweepError, match=r"dir\.db \(unable to open database file\): its folder"):
        st.open_storage(f"sqlite:///{tmp_path / 'dir.db'}")
    assert time.monotonic() - started < 5  # no retries

    path = write_sweep(tmp_path)
    sweep = load_sweep(path)
    open_study(sweep, st.open_storage(st.default_storage(sweep)), 0)
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = ["--out", str(blocker / "report"), "--no-mlflow"]
    line = one_line_error(capsys, ["sweep", "report", str(path), *out])
    assert line.endswith(
        f"cannot make {blocker / 'report'}, the folder of the report: '{blocker}' is a file; "
        "choose another with --out-dir"
    )
    # A file the report's MLflow copy cannot write is not --out's fault.
    import cofrgenet.sweeps.report as sweep_report

    def store_refuses(study, sweep, out, client, parent):
        raise PermissionError(13, "Permission denied", "/srv/mlflow/artifacts/report")

    monkeypatch.setattr(sweep_report, "write_report", store_refuses)
    line = one_line_error(capsys, ["sweep", "report", str(path), "--out", str(tmp_path / "r")])
    assert "cannot log the report to MLflow run" in line and "--out" not in line


def test_n_trials_below_one_is_refused_when_parsed(tmp_path, capsys):
    path = str(write_sweep(tmp_path))
    for command in (["run", "--no-mlflow"], ["submit", "--dry-run"]):
        for value in ("0", "-2", "x"):
            line = one_line_error(
                capsys, ["sweep", command[0], path, *command[1:], "--n-trials", value]
            )
            assert f"argument --n-trials: must be a whole number >= 1, got '{value}'" in line
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SweepError, match="must be >= 1"):
        run_worker(load_sweep(path), n_trials=0, report=False, mlflow=False)


def test_a_requested_stop_waits_for_the_end_of_the_optimizer_step(tmp_path):
    """The stop file (or SIGUSR1) seen during a gradient accumulation: the checkpoint is
    saved once the step's last micro-batch has run, never between its micro-batches."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import PruneAtStep

    trial = optuna.create_study().ask()
    stop_file = tmp_path / "stop"
    stop_file.touch()
    callback = PruneAtStep(trial, "val/loss", "", "s", stop_file=str(stop_file))
    saved: list[tuple[int, Path]] = []
    trainer = SimpleNamespace(
        global_step=3, is_global_zero=True, world_size=1, should_stop=False,
        default_root_dir=str(tmp_path), check_val_every_n_epoch=None, limit_val_batches=2,
        val_check_batch=10, accumulate_grad_batches=2, sanity_checking=False,
        callback_metrics={},
    )  # fmt: skip
    trainer.save_checkpoint = lambda path, **_: saved.append((trainer.global_step, Path(path)))

    class EpochLoop:  # Lightning's count of batches: 2 a step, the last one running
        total_batch_idx = property(lambda self: trainer.global_step * 2 - 1)

    trainer.fit_loop = SimpleNamespace(epoch_loop=EpochLoop())
    callback._share = lambda key, value: None  # no study storage here
    callback.on_train_batch_start(trainer, None, None, 0)
    callback.on_train_batch_end(trainer, None, None, None, 0)  # micro-batch 1 of step 3
    assert saved == [] and not trainer.should_stop
    callback.on_train_batch_start(trainer, None, None, 1)
    trainer.global_step = 4  # micro-batch 2: the optimizer stepped
    callback.on_train_batch_end(trainer, None, None, None, 1)
    assert saved == [(4, tmp_path / "checkpoints" / "last.ckpt")] and trainer.should_stop
    assert callback.requeued_at == 4
    # At a step a validation follows (batch 10 = step 5 x 2), the save waits for its score:
    # saved before it, the resumed trial took it as done and the pruner never saw it.
    waiting = PruneAtStep(trial, "val/loss", "", "s", stop_file=str(stop_file))
    waiting._share = callback._share
    saved.clear()
    trainer.global_step, trainer.should_stop, trainer.limit_val_batches = 5, False, 2
    waiting.on_step_end(trainer, None)
    assert saved == [] and not trainer.should_stop and waiting.requeued_at is None
    waiting.on_validation_end(trainer, None)  # no score to report here: the stop alone
    assert saved == [(5, tmp_path / "checkpoints" / "last.ckpt")] and trainer.should_stop
    assert waiting.requeued_at == 5 and trainer.limit_val_batches == 0
    # Had no validation run after it, the next step's end saves.
    late = PruneAtStep(trial, "val/loss", "", "s", stop_file=str(stop_file))
    late._share = callback._share
    saved.clear()
    trainer.limit_val_batches, trainer.should_stop = 2, False
    late.on_step_end(trainer, None)
    trainer.global_step = 6
    late.on_step_end(trainer, None)
    assert saved == [(6, tmp_path / "checkpoints" / "last.ckpt")] and late.requeued_at == 6
    # After an epoch that ended on a step of one batch, step 5 has trained 9 batches, not
    # 10: no validation follows it, and the requeue saves at once (it waited for one that
    # came a batch into step 6, and saved there, inside that step).
    short = PruneAtStep(trial, "val/loss", "", "s", stop_file=str(stop_file))
    short._share = callback._share
    saved.clear()
    trainer.global_step, trainer.should_stop = 5, False
    trainer.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(total_batch_idx=8))
    short.on_step_end(trainer, None)
    assert saved == [(5, tmp_path / "checkpoints" / "last.ckpt")] and short.requeued_at == 5


def test_a_trial_ended_elsewhere_saves_stops_and_leaves_its_mlflow_run_alone(tmp_path):
    """The heartbeat's file seen at a step's end: last.ckpt is saved for the retry, the
    fit stops without the validation Lightning runs before a requested stop, nothing is
    shared with the (finished) trial or reported by a later validation, and neither the
    MLflow logger's finalize nor a signal stop (mark_killed) changes the run, which the
    retry now trains in."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import PruneAtStep
    from cofrgenet.training.tracking import CofrMLFlowLogger

    trial = optuna.create_study().ask()
    ended_file = tmp_path / "worker.ended"
    callback = PruneAtStep(trial, "val/loss", "", "s", ended_file=str(ended_file))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = CofrMLFlowLogger(tmp_path / "run", experiment_name="e", tracking_uri=uri)
    run_id = logger.run_id  # the run is made
    saved: list[tuple[int, Path]] = []
    trainer = SimpleNamespace(
        global_step=5, is_global_zero=True, world_size=1, should_stop=False,
        default_root_dir=str(tmp_path), loggers=[logger], limit_val_batches=4,
        sanity_checking=False, callback_metrics={"val/loss": torch.tensor(2.0)},
    )  # fmt: skip
    trainer.save_checkpoint = lambda path, **_: saved.append((trainer.global_step, Path(path)))
    callback._share = lambda key, value: pytest.fail(f"shared {key} with an ended trial")
    callback.on_step_end(trainer, None)
    assert saved == [] and not trainer.should_stop  # no file: nothing happens
    ended_file.touch()
    callback.on_step_end(trainer, None)
    assert saved == [(5, tmp_path / "checkpoints" / "last.ckpt")] and trainer.should_stop
    assert (callback.ended_at, callback.requeued_at) == (5, None)
    assert trainer.limit_val_batches == 0  # Lightning validates before a stop otherwise
    callback._trial = SimpleNamespace(
        report=lambda *a: pytest.fail("reported to an ended trial"), should_prune=lambda: False
    )
    callback.on_validation_end(trainer, None)
    assert callback.last_step is None
    logger.mark_killed(5)  # a SIGTERM on the way out
    logger.finalize("success")
    # The run's status is the retry's (a finalize would have made it FINISHED, a signal
    # stop KILLED with a stopped-at tag).
    run = mlflow.MlflowClient(uri).get_run(run_id)
    assert run.info.status == "RUNNING" and "cofr.stopped_at_step" not in run.data.tags


def test_a_storage_error_in_the_prune_check_does_not_fail_the_trial(caplog):
    """should_prune reads the storage: a brief database or NFS error there failed a
    healthy trial (no retry), counted towards the worker's repeated failures."""
    from types import SimpleNamespace

    from sqlalchemy.exc import OperationalError

    from cofrgenet.sweeps.objective import PruneAtStep

    callback = PruneAtStep(optuna.create_study().ask(), "val/loss", "", "s")
    calls = []

    def should_prune() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("SELECT ...", {}, Exception("server closed the connection"))
        return True

    callback._trial = SimpleNamespace(report=lambda value, step: None, should_prune=should_prune)
    trainer = SimpleNamespace(
        sanity_checking=False, global_step=2, is_global_zero=True, world_size=1, max_steps=-1,
        estimated_stepping_batches=float("inf"), should_stop=False,
        callback_metrics={"val/loss": torch.tensor(3.0)},
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="cofrgenet.sweeps"):
        for step in (2, 4):
            trainer.global_step = step
            callback.on_validation_end(trainer, None)
    assert not trainer.should_stop and callback.pruned_at is None
    assert caplog.text.count("the pruner could not read the study at step 2") == 1
    assert "at step 4" not in caplog.text  # said once
    trainer.global_step = 6  # the storage answers again: the pruner decides
    callback.on_validation_end(trainer, None)
    assert trainer.should_stop and callback.pruned_at == 6
    # A pruner's own bug is not taken for the storage's: raised, not hidden for the study.
    callback._trial = SimpleNamespace(report=lambda value, step: None, should_prune=lambda: 1 / 0)
    trainer.global_step, trainer.should_stop, callback.pruned_at = 8, False, None
    with pytest.raises(ZeroDivisionError):
        callback.on_validation_end(trainer, None)


def test_the_check_at_the_budgets_last_step_prunes_nothing():
    """A trial whose last validation fell at its last step ended PRUNED, value and all:
    a trained trial left out of the d x L table, the importances and the complete count.
    Pruning there saves nothing; before it, the pruner decides."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import PruneAtStep

    callback = PruneAtStep(optuna.create_study().ask(), "val/loss", "", "s")
    asked = []
    callback._trial = SimpleNamespace(
        report=lambda value, step: None, should_prune=lambda: asked.append(1) or True
    )
    trainer = SimpleNamespace(
        sanity_checking=False, global_step=6, is_global_zero=True, world_size=1, max_steps=6,
        should_stop=False, callback_metrics={"val/loss": torch.tensor(3.0)},
    )  # fmt: skip
    callback.on_validation_end(trainer, None)
    assert not trainer.should_stop and callback.pruned_at is None and not asked
    assert (callback.last_step, callback.last_value) == (6, 3.0)
    trainer.global_step = 4
    callback.on_validation_end(trainer, None)
    assert trainer.should_stop and callback.pruned_at == 4
    # A fit bounded by its epochs: their steps are its last.
    trainer.max_steps, trainer.estimated_stepping_batches = -1, 8
    trainer.global_step, trainer.should_stop, callback.pruned_at = 8, False, None
    callback.on_validation_end(trainer, None)
    assert not trainer.should_stop and callback.pruned_at is None


def test_a_retry_keeps_the_scores_its_failed_attempt_reported(recwarn):
    """A retry resumes from its attempt's checkpoint, but its scores so far stayed on the
    FAILED attempt, which the median pruner ignores: with every trial retried once, no
    completed trial had a score before the last step, and nothing was pruned. The retry
    reports the attempt's scores up to the step it resumes from (past it, it trains and
    reports again); one that starts over reports none of them. A step reported twice
    keeps its score, without Optuna's warning."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import PruneAtStep

    study = optuna.create_study()
    trial = study.ask({"x": optuna.distributions.IntDistribution(1, 4)})
    for step, value in ((50, 4.0), (100, 3.5), (150, 3.4)):
        trial.report(value, step)
    study.tell(trial, state=TrialState.FAIL)

    def retried(start: int, steps: list[tuple[int, float]]) -> dict[int, float]:
        number = st.retry_trial(study, study.get_trials()[0], max_retry=3)
        retry = study.ask()
        assert retry.number == number and not study.get_trials()[number].intermediate_values
        callback = PruneAtStep(retry, "val/loss", "", "s")
        callback._should_prune = lambda step: False
        trainer = SimpleNamespace(
            sanity_checking=False, global_step=start, is_global_zero=True, world_size=1,
            max_steps=300, should_stop=False,
        )  # fmt: skip
        callback.on_train_start(trainer, None)
        for step, value in steps:
            trainer.global_step = step
            trainer.callback_metrics = {"val/loss": torch.tensor(value)}
            callback.on_validation_end(trainer, None)
        return study.get_trials()[number].intermediate_values

    # Resumed at step 100 (the checkpoint before the attempt's last score).
    resumed = retried(100, [(100, 3.6), (150, 3.2)])
    assert resumed == {50: 4.0, 100: 3.5, 150: pytest.approx(3.2)}
    assert retried(0, [(50, 3.9)]) == {50: pytest.approx(3.9)}  # started over
    assert not [w for w in recwarn if "already reported" in str(w.message)]


def test_service_errors_are_the_stores_failures_not_the_trials():
    """Retried (not the trial's fault): a database or HTTP client error, an OS error (the
    default journal storage on NFS), an MLflow error of a store down for the moment. Not:
    an MLflow request refused (a parameter too long), a bug."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import (
        BAD_REQUEST,
        INVALID_PARAMETER_VALUE,
        TEMPORARILY_UNAVAILABLE,
    )
    from sqlalchemy.exc import OperationalError

    from cofrgenet.sweeps.objective import service_error

    def raised_from(error: BaseException, cause: BaseException) -> BaseException:
        error.__cause__ = cause
        return error

    locked = OperationalError("INSERT ...", {}, Exception("database is locked"))
    assert service_error(locked)
    assert service_error(OSError(116, "Stale file handle"))
    assert service_error(MlflowException("down", error_code=TEMPORARILY_UNAVAILABLE))
    assert service_error(MlflowException("(sqlite3.OperationalError) database is locked"))
    assert service_error(raised_from(RuntimeError("while logging"), locked))
    assert not service_error(MlflowException("too long", error_code=INVALID_PARAMETER_VALUE))
    # MLflow wraps a database's refusal too (BAD_REQUEST): its code decides, not the cause.
    refused = raised_from(MlflowException("constraint", error_code=BAD_REQUEST), locked)
    assert not service_error(refused)
    assert not service_error(TypeError("a bug"))


def test_a_spawned_rank_judges_with_the_sweeps_pruner(tmp_path):
    """Under ddp_spawn the callback is pickled into each rank, which reopens the study:
    with the sweep's pruner, not Optuna's default MedianPruner (which would prune even a
    sweep with ``pruner: none``)."""
    import pickle

    from cofrgenet.sweeps.objective import PruneAtStep

    url = f"journal:{tmp_path / 'p.journal'}"
    study = optuna.create_study(
        study_name="p", storage=st.open_storage(url), pruner=optuna.pruners.NopPruner()
    )
    for value in range(6):  # past the default MedianPruner's 5 startup trials
        trial = study.ask()
        trial.report(value, 10)
        study.tell(trial, value)
    trial = study.ask()
    callback = pickle.loads(pickle.dumps(PruneAtStep(trial, "val/loss", url, "p")))
    callback.trial.report(100.0, 10)  # far worse than every finished trial at step 10
    assert not callback.trial.should_prune()


def test_trials_failing_alike_in_other_folders_count_as_the_same_reason():
    """Reasons that name each trial's own folder were compared as plain text: three
    trials failing on the same missing file in a row never stopped the worker. Failures
    that depend on the sampled point (a NaN loss, out of memory) never stop it."""
    from optuna.trial import TrialState

    from cofrgenet.sweeps.objective import Outcome
    from cofrgenet.sweeps.worker import MAX_SAME_FAILURES, _same_failures

    def missing(trial: int) -> Outcome:
        return Outcome(TrialState.FAIL, reason=(
            f"FileNotFoundError: runs/s/trial-{trial:04d}/tokenizer.json: no such file"
        ))  # fmt: skip

    def nan(step: int) -> Outcome:
        return Outcome(TrialState.FAIL, reason=(
            f"non-finite loss: the training loss became nan at step {step}; the weights from "
            "before this step are saved in runs/s/trial-0001/checkpoints/last.ckpt."
        ))  # fmt: skip

    outcomes = [(n, missing(n)) for n in range(3)]
    assert _same_failures(outcomes) == MAX_SAME_FAILURES
    other = Outcome(TrialState.FAIL, reason="ValueError: n_head must be positive")
    assert _same_failures([*outcomes, (3, other)]) == 1
    assert _same_failures([(n, nan(step)) for n, step in enumerate([3, 12, 7, 5])]) == 0
    done = Outcome(TrialState.COMPLETE, value=1.0)
    assert _same_failures([(0, done), (1, missing(1))]) == 1


def test_a_ctrl_c_that_lightning_turned_into_exit_1_keeps_its_status():
    """Ctrl-C while a trial's fit starts: Lightning ends it with sys.exit(1), which read
    as an interruption without a signal (no 130, no "stopped by a signal")."""
    from cofrgenet.sweeps.objective import classify

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemExit(1)  # noqa: B904  (as Lightning's handler does)
    except SystemExit as exited:
        reason, *_, status = classify(exited)
    assert status == 130 and reason == "worker interrupted (Ctrl-C) during the trial"
    assert classify(SystemExit(1))[-1] is None  # a plain exit is no signal
    assert classify(SystemExit(1))[0] == "worker interrupted during the trial (SystemExit: 1)"


def test_a_ctrl_c_that_aborted_at_once_says_so_not_an_empty_keyboardinterrupt():
    """A bare KeyboardInterrupt (no message) was said "worker interrupted during the
    trial (KeyboardInterrupt:)"; another error without a message kept a dangling colon."""
    from cofrgenet.sweeps.objective import classify

    reason, retry, stop, status = classify(KeyboardInterrupt())
    assert reason == "worker interrupted (Ctrl-C) during the trial"
    assert (retry, stop, status) == (True, True, 130)
    assert classify(RuntimeError())[0] == "RuntimeError"
    assert classify(RuntimeError("boom"))[0] == "RuntimeError: boom"
    # Ctrl-C as StopOnSignal's exception (after the step's save): the same words.
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    stopped = SIGTERMException(130)
    assert classify(stopped) == ("worker interrupted (Ctrl-C) during the trial", True, True, 130)
    stopped = SIGTERMException(128 + signal.SIGUSR1)
    assert classify(stopped)[0] == "worker terminated (SIGUSR1) during the trial"


def test_the_cpu_allocators_out_of_memory_is_a_point_failure_too():
    """Only CUDA's message was read as out of memory: on CPU, three trials too large
    for the machine in a row stopped the worker as a repeated failure."""
    import torch

    from cofrgenet.sweeps.objective import classify
    from cofrgenet.sweeps.worker import POINT_FAILURES

    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as error:
        reason, *_ = classify(error)
    assert reason.startswith(POINT_FAILURES)
    reason, *_ = classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert reason.startswith(POINT_FAILURES)


def test_a_non_finite_objective_is_a_point_failure_like_a_nan_training_loss(tmp_path):
    """A final val/loss of NaN or inf (a pole met on the validation data) failed with a
    reason of its own: three such trials in a row stopped the worker, though NaN losses
    depend on the sample and never stop it."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import _fit_outcome
    from cofrgenet.sweeps.worker import POINT_FAILURES, _same_failures

    ctx = SimpleNamespace(
        sweep=SimpleNamespace(objective=SimpleNamespace(metric="val/loss")),
        trial_ended=lambda number: False,
    )
    outcomes = []
    for number, value in enumerate([float("nan"), float("inf"), float("nan")]):
        trainer = SimpleNamespace(global_step=6, callback_metrics={"val/loss": torch.tensor(value)})
        callback = SimpleNamespace(
            number=number, requeued_at=None, pruned_at=None, ended_at=None, last_step=6,
            last_value=value,
        )  # fmt: skip
        outcome = _fit_outcome(ctx, None, SimpleNamespace(trainer=trainer), callback, tmp_path)
        assert outcome.state == TrialState.FAIL and outcome.reason.startswith(POINT_FAILURES)
        assert "val/loss is" in outcome.reason and "at step 6" in outcome.reason
        outcomes.append((number, outcome))
    assert _same_failures(outcomes) == 0


def test_a_changed_tracking_uri_gets_a_new_parent_run_and_the_report_still_runs(
    tiny_data, tmp_path, capsys
):
    """The study named a parent run of the first store: trials logged to a second store
    pointed at a run that store lacks (not nested), and `cofr sweep report` crashed."""
    from cofrgenet.cli import main

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    first = run_worker(load_sweep(write_sweep(tmp_path, **common)), report=False)
    old_parent = first.study.user_attrs[st_parent_attr()]
    other = f"sqlite:///{tmp_path / 'other.db'}"
    moved = write_sweep(tmp_path, "moved.yaml", tracking_uri=other, **{**common, "n_trials": 2})
    second = run_worker(load_sweep(moved), report=False)
    new_parent = second.study.user_attrs[st_parent_attr()]
    assert new_parent != old_parent
    client = mlflow.MlflowClient(other)
    assert client.get_run(new_parent).data.tags["cofr.sweep"] == "parent"
    [child] = [
        r for r in client.search_runs([client.get_run(new_parent).info.experiment_id])
        if r.data.tags.get("mlflow.parentRunId") == new_parent
    ]  # fmt: skip
    assert child.data.tags["optuna.trial_number"] == "1"
    capsys.readouterr()
    assert main(["sweep", "report", str(write_sweep(tmp_path, "back.yaml", **common))]) == 0
    assert "is not in this run store" in capsys.readouterr().out  # the first store again


def test_status_and_report_find_a_study_run_under_another_name(tiny_data, tmp_path, capsys):
    """`cofr sweep run FILE --study other` said to follow with `cofr sweep status FILE`,
    which showed the file's own study; status and report take --study now."""
    import argparse

    from cofrgenet.cli import main
    from cofrgenet.sweeps.cli import _status_command

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = str(write_sweep(tmp_path, **common))
    run_worker(load_sweep(path, {"study": "other"}), report=False, mlflow=False)
    said = _status_command(argparse.Namespace(sweep=path, study="other"))
    assert said == f"cofr sweep status {path} --study other"
    assert _status_command(argparse.Namespace(sweep=path, study=None)).endswith(path)
    capsys.readouterr()
    assert main(["sweep", "status", path, "--study", "other"]) == 0
    assert "study other: 1 trial (" in capsys.readouterr().out
    assert main(["sweep", "report", path, "--study", "other", "--no-mlflow"]) == 0
    assert (tmp_path / "runs" / "sweeps" / "other" / "report" / "summary.md").is_file()


def test_the_status_command_a_submit_suggests_names_its_storage_and_runs_folder(
    tiny_data, tmp_path, monkeypatch, capsys
):
    """`cofr sweep submit --study S --storage URL` said to follow with a status command
    without --storage, which answered "no study 'S' yet"."""
    import argparse
    import shlex

    from cofrgenet.cli import main
    from cofrgenet.sweeps.cli import _status_command, storage_argument

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = str(write_sweep(tmp_path, **common))
    monkeypatch.setenv("MY_STUDIES", f"journal:{tmp_path / 'elsewhere.journal'}")
    storage = storage_argument("env:MY_STUDIES")
    runs = str(tmp_path / "other-runs")
    run_worker(
        load_sweep(path, {"study": "s", "storage": str(storage), "runs_dir": runs}),
        report=False, mlflow=False,
    )  # fmt: skip
    said = _status_command(
        argparse.Namespace(sweep=path, study="s", storage=storage, runs_dir=runs)
    )
    assert said == f"cofr sweep status {path} --study s --storage env:MY_STUDIES --runs-dir {runs}"
    capsys.readouterr()
    assert main(shlex.split(said)[1:]) == 0
    assert "study s: 1 trial (" in capsys.readouterr().out
    secret = storage_argument("postgresql://cofr:hunter2@db/cofr")
    said = _status_command(
        argparse.Namespace(sweep=path, study=None, storage=secret, runs_dir=None)
    )
    assert "hunter2" not in said and "--storage" in said
    assert main(["sweep", "status", "other", "--study", "x"]) == 2
    assert "--study x: give it with a sweep file" in capsys.readouterr().err


def test_sampler_seeds_stay_in_numpy_s_range_and_a_negative_worker_index_is_refused(
    tmp_path, capsys
):
    """A seed near 2**32 plus a pid, or a --worker-index of -5, ended in numpy's
    `Seed must be between 0 and 2**32 - 1` traceback."""
    from cofrgenet.sweeps.worker import make_sampler
    from test_cli_errors import one_line_error

    for seed, offset in ((2**32 - 1, 4_000_000), (0, -5), (7, 3)):
        sweep = parse_sweep(
            {
                "study": "s",
                "space": {"a": [1]},
                "n_trials": 1,
                "sampler": {"name": "tpe", "seed": seed},
            }
        )
        assert make_sampler(sweep, offset) is not None  # built: numpy took the seed
    path = str(write_sweep(tmp_path))
    line = one_line_error(capsys, ["sweep", "run", path, "--worker-index", "-5"])
    assert "argument --worker-index: must be >= 0, got -5" in line


def test_the_heat_map_sorts_a_choice_of_none_beside_numbers():
    """`ffn_hidden: {choices: [null, 128]}` on a heat-map axis: sorting None with ints
    was a TypeError, and the report (the worker's, and `cofr sweep report`) failed."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    from optuna.trial import create_trial

    from cofrgenet.sweeps.report import heatmap_table

    hidden = CategoricalDistribution([None, 128, 64])
    depth = IntDistribution(1, 3)
    trials = [
        create_trial(params={"h": h, "d": d}, distributions={"h": hidden, "d": depth}, value=v)
        for h, d, v in [(128, 1, 3.0), (None, 1, 2.5), (64, 2, 2.0), (None, 1, 2.7)]
    ]
    xs, ys, cells = heatmap_table(trials, "h", "d", maximize=False)
    assert xs == [None, 64, 128] and ys == [1, 2]
    assert (cells[0][0], cells[0][2], cells[1][1]) == (2.5, 3.0, 2.0)  # the best per cell
    assert cells[0][1] != cells[0][1] and cells[1][0] != cells[1][0]  # NaN: no trial there
    # A depth whose trials were all pruned keeps its row, empty, instead of vanishing.
    pruned = create_trial(
        params={"h": 64, "d": 3}, distributions={"h": hidden, "d": depth},
        state=TrialState.PRUNED, intermediate_values={2: 9.0},
    )  # fmt: skip
    xs, ys, cells = heatmap_table([*trials, pruned], "h", "d", maximize=False)
    assert ys == [1, 2, 3] and all(v != v for v in cells[2])


def test_the_heat_map_shows_the_searched_values_not_yet_drawn(tmp_path, monkeypatch):
    """An int range or choice list of a few values shows all of them (early in a study the
    axes held only the values drawn, so the untried cells did not show), a wide range
    only those drawn; a map without any completed cell draws no (empty) colour bar."""
    from optuna.distributions import IntDistribution
    from optuna.trial import create_trial

    import cofrgenet.sweeps.report as report
    from cofrgenet.sweeps.spec import parse_param

    depth, ladders = parse_param("d", "int 1..7 step 2"), parse_param("L", [1, 4, 16])
    wide = parse_param("w", "int 1..64")
    assert report.axis_values(depth) == [1, 3, 5, 7]
    assert report.axis_values(ladders) == [1, 4, 16]
    assert report.axis_values(wide) == [] and report.axis_values(None) == []
    # A TPE sweep's range of 1e12 values: counted, not made (a report ran out of memory).
    assert report.axis_values(parse_param("w", "int 1..1000000000000")) == []
    assert report.axis_values(parse_param("lr", "float 1e-4..1e-2 log")) == []
    dists = {"d": IntDistribution(1, 7, step=2), "L": IntDistribution(1, 16)}
    trial = create_trial(params={"d": 3, "L": 4}, distributions=dists, value=2.0)
    xs, ys, cells = report.heatmap_table(
        [trial], "L", "d", False, report.axis_values(ladders), report.axis_values(depth)
    )
    assert xs == [1, 4, 16] and ys == [1, 3, 5, 7]
    assert cells[1][1] == 2.0 and sum(v == v for row in cells for v in row) == 1
    assert report.heatmap_table([], "L", "d", False, [1], [1]) == ([], [], [])

    figures = []
    monkeypatch.setattr(report, "_savefig", lambda figure, path: figures.append(len(figure.axes)))
    report.plot_heatmap(xs, ys, cells, "L", "d", "val/loss", tmp_path / "a.png")
    empty = [[math.nan] * len(xs) for _ in ys]
    report.plot_heatmap(xs, ys, empty, "L", "d", "val/loss", tmp_path / "b.png")
    assert figures == [2, 1]  # the map and its colour bar; the map alone


def test_a_requeue_that_is_not_made_ends_the_worker_with_1(tmp_path, monkeypatch, capsys):
    """`scontrol requeue` failing (or SIGUSR1 outside SLURM) left status 0: the array task
    read as a success while its trial waited, RUNNING, for a worker."""
    import cofrgenet.sweeps.worker as worker_module
    from cofrgenet.cli import main
    from cofrgenet.sweeps.worker import WorkerResult, _requeue_job

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'Invalid job id' >&2\nexit 1\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    worker = st.Worker("h", 1, None, "slurm-7_0", {st.SLURM_JOB: "8", st.SLURM_ARRAY_JOB: "7",
                                                  st.SLURM_ARRAY_TASK: "0"})  # fmt: skip
    assert _requeue_job(worker) == "scontrol requeue 7_0 failed: Invalid job id"
    assert _requeue_job(st.Worker("h", 1, None, None, {})) == "this is not a SLURM job"

    def requeue_not_made(sweep, **kwargs):
        study = optuna.create_study()
        return WorkerResult(study, requeued=True, not_requeued="this is not a SLURM job")

    monkeypatch.setattr(worker_module, "run_worker", requeue_not_made)
    path = str(write_sweep(tmp_path))
    assert main(["sweep", "run", path, "--no-mlflow"]) == 1
    err = capsys.readouterr().err
    assert "stopped for a requeue, but this is not a SLURM job; the trial resumes" in err


def test_a_model_vocabulary_smaller_than_the_data_s_is_refused_before_the_study(
    tiny_data, tmp_path
):
    """Each trial failed alone on it (three of them used up before the worker stopped)."""
    path = write_sweep(
        tmp_path, overrides={"data.data_dir": str(tiny_data), "model.config.vocab_size": 100}
    )
    with pytest.raises(
        SweepError, match=r"but the model has vocab_size 100. Set the model.s vocab_size"
    ):
        run_worker(load_sweep(path), mlflow=False)
    assert not (tmp_path / "runs" / "sweeps").exists() or not list(
        (tmp_path / "runs" / "sweeps").rglob("*.journal")
    )  # no study made


def test_a_signal_after_a_trials_last_step_keeps_its_result_and_stops_the_worker():
    """SIGTERM or SIGUSR1 during a trial's final checkpoint save (StopOnSignal's
    late_signals): the trial keeps its result; SIGTERM stops the worker after it is told,
    SIGUSR1 requeues it as between trials. Delivered inside Lightning's teardown, the
    worker's handler raised there and the finished trial was failed for a retry."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import REQUEUE, Outcome, after_late_signals

    done = Outcome(TrialState.COMPLETE, value=1.5, step=8)
    assert after_late_signals(done, SimpleNamespace(late_signals=[])) == done
    assert not done.stop_worker
    try:
        late = SimpleNamespace(late_signals=[signal.SIGUSR1, signal.SIGTERM])
        outcome = after_late_signals(Outcome(TrialState.COMPLETE, value=1.5, step=8), late)
        assert outcome.state == TrialState.COMPLETE and outcome.value == 1.5
        assert outcome.stop_worker and outcome.signal_status == 143
        assert "SIGTERM after the last step" in outcome.reason
        assert REQUEUE.is_set()
    finally:
        REQUEUE.clear()


def test_a_signal_after_the_last_step_then_an_error_still_stops_the_worker(tmp_path, monkeypatch):
    """A SIGTERM during the final save, then an error (the final validation's, say): the
    failed outcome dropped the signal, which StopOnSignal had taken from the worker's own
    handler, and the worker began another trial until SLURM killed it."""
    from types import SimpleNamespace

    from cofrgenet.sweeps import objective

    class FitThatEndsBadly:
        def __init__(self, args, extra_callbacks):
            stop = next(c for c in extra_callbacks if isinstance(c, objective.StopOnSignal))
            stop.late_signals = [signal.SIGTERM]
            raise RuntimeError("the final validation failed")

    monkeypatch.setattr(objective, "SweepCLI", FitThatEndsBadly)
    sweep, _, study = _tiny_study(tmp_path)
    ctx = SimpleNamespace(sweep=sweep, storage_url="", stop_file=None, ended_file=None)
    (tmp_path / "run").mkdir()
    outcome = objective._train(ctx, study.ask(), [], tmp_path / "run")
    assert outcome.state == TrialState.FAIL and "final validation" in outcome.reason
    assert outcome.stop_worker and outcome.signal_status == 143


@pytest.mark.parametrize(
    ("signum", "where"),
    [(signal.SIGINT, "collect"), (signal.SIGTERM, "collect"), (signal.SIGTERM, "outcome")],
    ids=["sigint-in-gc", "sigterm-in-gc", "sigterm-reading-the-outcome"],
)
def test_a_signal_once_a_trials_fit_ended_keeps_its_result_and_stops_the_worker(
    tiny_data, tmp_path, monkeypatch, signum, where
):
    """After the fit gave the signals back: raised inside the garbage collection that
    frees the trial's memory (a weakref callback's), Python dropped it ("Exception
    ignored") and the worker trained every trial left, exit 0; raised while the outcome
    was read, it failed the trained trial. Noted now: the trial keeps its result, and the
    worker stops with 130 / 143."""
    from types import SimpleNamespace

    from cofrgenet.sweeps import objective

    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=2, overrides={"data.data_dir": str(tiny_data)})
    )

    class SignalledWhenCollected:
        def __del__(self):
            os.kill(os.getpid(), signum)
            for _ in range(10_000):  # the handler runs here, inside the collection
                pass

    def collect():
        cycle = SignalledWhenCollected()
        cycle.itself = cycle
        del cycle
        return real_gc.collect()

    import gc as real_gc

    if where == "collect":
        monkeypatch.setattr(objective, "gc", SimpleNamespace(collect=collect))
    else:
        read = objective._fit_outcome

        def signalled(*args):
            outcome = read(*args)
            os.kill(os.getpid(), signum)
            return outcome

        monkeypatch.setattr(objective, "_fit_outcome", signalled)
    unhandled = []  # where the worker does not handle it: noted, not the test run's end
    before = signal.signal(signum, lambda number, frame: unhandled.append(number))
    try:
        result = run_worker(sweep, report=False, mlflow=False)
    finally:
        signal.signal(signum, before)
    assert not unhandled
    assert result.signal_status == 128 + signum
    ((_, outcome),) = result.outcomes  # the second trial never started
    assert outcome.state == TrialState.COMPLETE and outcome.value is not None
    assert f"{signal.Signals(signum).name} after the last step" in outcome.reason
    assert [t.state for t in result.study.get_trials()] == [TrialState.COMPLETE]


def test_signals_are_noted_only_once_a_trials_fit_has_ended():
    """A Ctrl-C while the fit was set up (before StopOnSignal takes SIGINT over: the
    restore of a resumed trial, the strategy's setup) was noted and the trial trained to
    its end, unsaid; a second Ctrl-C after "press it again to abort" was noted too."""
    from cofrgenet.sweeps.objective import StopOnSignal, _noted_once_the_fit_ended

    stop = StopOnSignal()
    with _noted_once_the_fit_ended(stop) as noted:
        stop.setup(None, None, "fit")  # takes SIGTERM over; SIGINT waits for on_fit_start
        try:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
        finally:
            stop.teardown(None, None, "fit")  # the fit's end: the handlers given back
        assert stop.fit_ended and not noted
        os.kill(os.getpid(), signal.SIGTERM)  # after the fit: noted, the trial keeps its end
        time.sleep(0.1)
        assert noted == {signal.SIGTERM}
        stop.late_signals = [signal.SIGINT]  # "press it again to abort", said in the fit
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)


def test_a_trials_fit_callbacks_survive_ddp_spawns_pickling(tmp_path, monkeypatch):
    """ddp_spawn (what `cofr sweep submit --gpus-per-worker 2` sets) pickles the callbacks
    into each rank: a lambda resume hint failed every trial of a multi-GPU sweep."""
    import pickle
    from types import SimpleNamespace

    from cofrgenet.sweeps import objective

    class PickledFit:
        def __init__(self, args, extra_callbacks):
            for callback in extra_callbacks:
                pickle.loads(pickle.dumps(callback))
            raise RuntimeError("pickled")

    monkeypatch.setattr(objective, "SweepCLI", PickledFit)
    sweep, _, study = _tiny_study(tmp_path)
    url = f"journal:{tmp_path / 'w.journal'}"  # PruneAtStep reopens the study by its URL
    ctx = SimpleNamespace(sweep=sweep, storage_url=url, stop_file=None, ended_file=None)
    (tmp_path / "run").mkdir()
    outcome = objective._train(ctx, study.ask(), [], tmp_path / "run")
    assert outcome.state == TrialState.FAIL and outcome.reason.endswith("pickled")


def test_workers_that_each_made_a_parent_run_settle_on_the_oldest(tmp_path):
    """Workers starting together on a new study under other --runs-dir (the parent run's
    file lock is per folder), or across hosts without a shared lock, each made a parent
    run: trials nested under several, the report went to the last. They now take the
    oldest of the study's and delete their own; an old study's parent is not taken."""
    from cofrgenet.sweeps import tracking

    sweep = load_sweep(write_sweep(tmp_path, tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}"))
    run = tracking.run_config(sweep)
    client = tracking.client_for(run)
    exp = tracking.experiment_id(client, run)
    tags = {"cofr.sweep": "parent", "optuna.study": sweep.study, "optuna.storage": "db"}
    day_ago = int(time.time() * 1000) - 86_400_000
    earlier_study = client.create_run(exp, start_time=day_ago, tags=tags).info.run_id
    first = tracking.create_parent(client, run, sweep, "db")
    elsewhere = tracking.create_parent(client, run, sweep, "another study storage")
    second = tracking.create_parent(client, run, sweep, "db")
    # The oldest: the first made, or of two made in one millisecond the lower id.
    winner, loser = sorted((first, second), key=lambda r: (client.get_run(r).info.start_time, r))
    assert tracking.settle_parent(client, run, sweep, "db", second) == winner
    assert tracking.settle_parent(client, run, sweep, "db", first) == winner
    assert client.get_run(loser).info.lifecycle_stage == "deleted"
    for kept in (winner, elsewhere, earlier_study):
        assert client.get_run(kept).info.lifecycle_stage == "active"


def test_a_store_that_cannot_answer_is_not_taken_for_a_missing_parent_run():
    """Any MlflowException read as "missing": a tracking server down for a moment made
    the worker start another parent run and split the study's trials between two."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

    from cofrgenet.sweeps.tracking import run_missing

    class Store:
        def __init__(self, code):
            self.code = code

        def get_run(self, run_id):
            raise MlflowException("no", error_code=self.code)

    assert run_missing(Store(RESOURCE_DOES_NOT_EXIST), "r") is True
    assert run_missing(Store(TEMPORARILY_UNAVAILABLE), "r") is False


def test_a_sigterm_while_a_trial_is_set_up_fails_it_for_a_retry(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """Between "trial N: starting" and the fit's own signal handler (the config parse, the
    model and data building): the trial is failed and retried, the worker stops with 143,
    as for a SIGTERM during training; once the worker died with the trial RUNNING. (Its
    one trial is fewer than the pruner's n_startup_trials: said as the worker starts.)"""
    from cofrgenet.training import cli as training_cli

    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=1, overrides={"data.data_dir": str(tiny_data)})
    )

    class TerminatedWhileParsing(training_cli.ParseOnlyCLI):
        def __init__(self, *args, **kwargs):  # in the parse, whose SystemExit it is not
            if signal.getsignal(signal.SIGTERM) is not note:  # a trial's, not the startup's
                os.kill(os.getpid(), signal.SIGTERM)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(training_cli, "ParseOnlyCLI", TerminatedWhileParsing)
    unhandled = []  # where the worker does not handle it: noted, not the test run's end

    def note(signum, frame):
        unhandled.append(signum)

    before = signal.signal(signal.SIGTERM, note)
    try:
        with caplog.at_level(logging.WARNING, logger="cofrgenet.sweeps"):
            result = run_worker(sweep, report=False, mlflow=False)
        assert signal.getsignal(signal.SIGTERM) == note  # put back after the trial
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not unhandled
    assert "pruner.n_startup_trials: 2 is not below n_trials 1" in caplog.text
    assert result.signal_status == 128 + signal.SIGTERM
    ((_, outcome),) = result.outcomes
    assert outcome.retry and outcome.reason == "worker terminated (SIGTERM) during the trial"
    trials = result.study.get_trials()
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].system_attrs["retry_history"] == [0]


@pytest.mark.parametrize("where", ["taking", "starting", "finishing", "telling"])
def test_a_signal_between_trials_stops_the_worker_with_no_trial_left_running(
    tiny_data, tmp_path, monkeypatch, where
):
    """SIGTERM as a worker took a trial, as it set the trial's first attributes (before
    any handler of run_trial's), or as it told the study how one ended: the worker died
    there (exit -15, no word), the trial taken RUNNING until another worker took it for
    lost. Now the bookkeeping finishes, a taken trial is failed for a retry, and the
    worker stops with 143."""
    from cofrgenet.sweeps import objective, worker

    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=2, overrides={"data.data_dir": str(tiny_data)})
    )

    def terminating(function):
        def wrapped(*args, **kwargs):
            value = function(*args, **kwargs)
            handler = getattr(signal.getsignal(signal.SIGTERM), "__qualname__", "")
            if handler.startswith(("signals_held", "sigterm_raises")):  # the worker's calls
                os.kill(os.getpid(), signal.SIGTERM)
            return value

        return wrapped

    if where == "taking":
        monkeypatch.setattr(worker, "next_trial", terminating(worker.next_trial))
    elif where == "starting":
        monkeypatch.setattr(objective, "trial_run_dir", terminating(objective.trial_run_dir))
    elif where == "finishing":  # the trial's MLflow run ended: seconds on a remote server
        monkeypatch.setattr(objective, "finish_mlflow", terminating(objective.finish_mlflow))
    else:
        monkeypatch.setattr(worker, "_tell", terminating(worker._tell))
    result = run_worker(sweep, report=False, mlflow=False)
    assert result.signal_status == 128 + signal.SIGTERM
    trials = result.study.get_trials()
    assert TrialState.RUNNING not in [t.state for t in trials]
    ((_, outcome),) = result.outcomes
    if where in ("finishing", "telling"):  # the trial ended before: kept, no other taken
        assert [t.state for t in trials] == [TrialState.COMPLETE]
        if where == "finishing":
            assert outcome.reason == "SIGTERM as its end was recorded: the worker stops"
        return
    how = "by SIGTERM as it was taken" if where == "taking" else "by SIGTERM"
    assert outcome.reason == f"stopped {how} before its fit began" and outcome.retry
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[0].user_attrs[st.STOPPED] == "SIGTERM"


def test_a_worker_stopped_between_trials_says_the_study_goes_on(tmp_path, monkeypatch, capsys):
    """Its last line said "the trial resumes from its checkpoint" of a trial that had
    COMPLETEd."""
    import cofrgenet.sweeps.worker as worker_module
    from cofrgenet.cli import main
    from cofrgenet.sweeps.objective import Outcome

    _, _, study = _tiny_study(tmp_path)
    ended = Outcome(TrialState.COMPLETE, value=1.0)
    monkeypatch.setattr(
        worker_module,
        "run_worker",
        lambda sweep, **kwargs: worker_module.WorkerResult(
            study, outcomes=[(0, ended)], signal_status=143
        ),
    )
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 143
    err = capsys.readouterr().err
    assert "stopped by a signal between trials; the study goes on when a worker runs " in err
    assert "resumes from its checkpoint" not in err
    # Its own command line, as typed (what `cofr` ran is argv).
    monkeypatch.setattr(sys, "argv", ["/venv/bin/cofr", "sweep", "run", "my sweep.yaml"])
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 143
    assert capsys.readouterr().err.endswith("runs again: cofr sweep run 'my sweep.yaml'\n")
    # A worker of a submitted job: its task's sbatch (its command line names a storage
    # variable the script alone sets).
    monkeypatch.setenv("COFR_SWEEP_AGAIN", "sbatch --array=3 runs/x.sbatch")
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 143
    assert capsys.readouterr().err.endswith("runs again: sbatch --array=3 runs/x.sbatch\n")
    # The study's MLflow run says the same (it gave the worker's own command line, whose
    # --storage env:COFR_SWEEP_STORAGE_URL only the script sets).
    told = []
    monkeypatch.setattr(
        worker_module,
        "run_worker",
        lambda sweep, **kwargs: (
            told.append(kwargs["again"])
            or worker_module.WorkerResult(study, outcomes=[(0, ended)], signal_status=143)
        ),
    )
    main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"])
    assert told == ["sbatch --array=3 runs/x.sbatch"]
    capsys.readouterr()
    monkeypatch.setattr(worker_module, "run_worker", lambda sweep, **kwargs: (
        worker_module.WorkerResult(study, outcomes=[(0, ended)], signal_status=143)))  # fmt: skip
    # A trial stopped as it was taken has no checkpoint: it is retried.
    ended.state, ended.retry = TrialState.FAIL, True
    ended.reason = "stopped by SIGTERM as it was taken before its fit began"
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 143
    assert "stopped by a signal; the trial is retried when a worker" in capsys.readouterr().err
    # Stopped in its fit before the first save: no checkpoint either (said "resumes").
    ended.reason, ended.run_dir = "stopped by Ctrl-C at step 0", tmp_path / "no-save"
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 143
    assert "stopped by a signal; the trial is retried when a worker" in capsys.readouterr().err


def test_a_worker_with_no_trial_left_to_take_says_so(tmp_path, monkeypatch, capsys):
    """Other workers held the study's last trials: this one exited 0 with no word."""
    import cofrgenet.sweeps.worker as worker_module
    from cofrgenet.cli import main

    _, _, study = _tiny_study(tmp_path)
    study.ask()  # a trial another worker trains
    monkeypatch.setattr(
        worker_module, "run_worker", lambda sweep, **kwargs: worker_module.WorkerResult(study)
    )
    assert main(["sweep", "run", str(write_sweep(tmp_path)), "--no-mlflow"]) == 0
    assert "no trial left for this worker to take; other workers train the last 1 (" in (
        capsys.readouterr().out
    )


def test_sampled_values_that_build_no_model_together_fail_only_their_points(tiny_data, tmp_path):
    """`n_head: int 4..8` beside a width of 64: both ends build a model, 5, 6 and 7 do
    not. Each of those points fails before its fit starts, and three of them in a row do
    not stop the worker (once: "3 trials in a row failed with: ConfigError ...")."""
    sweep = load_sweep(write_sweep(
        tmp_path, space={"model.config.n_head": "int 4..8"}, sampler={"name": "grid"},
        pruner={"name": "none"}, budget={"steps": 2}, n_trials=5,
        overrides={"data.data_dir": str(tiny_data), "model.config.n_embd": 64},
    ))  # fmt: skip
    result = run_worker(sweep, report=False, mlflow=False)
    assert len(result.outcomes) == 5 and result.failing is None
    by_head = {t.params["model.config.n_head"]: t for t in result.study.get_trials()}
    assert {h: t.state for h, t in by_head.items()} == {
        4: TrialState.COMPLETE, 5: TrialState.FAIL, 6: TrialState.FAIL,
        7: TrialState.FAIL, 8: TrialState.COMPLETE,
    }  # fmt: skip
    reason = by_head[7].user_attrs[st.FAIL_REASON]
    assert reason.startswith("no model at this point:") and "n_head (7)" in reason, reason


def test_the_studys_mlflow_run_is_not_left_running_by_the_last_worker_to_leave(tiny_data, tmp_path):
    """A worker that leaves a study unfinished (its --n-trials) marks the study's run
    KILLED with how far it got; the next worker makes it live again, and FINISHED."""
    sweep_path = write_sweep(
        tmp_path,
        sampler={"name": "grid"},
        pruner={"name": "none"},
        n_trials=None,
        space={"model.optimizer.lr": {"choices": [1e-3, 2e-3]}},
        overrides={"data.data_dir": str(tiny_data)},
    )
    sweep = load_sweep(sweep_path)

    result = run_worker(sweep, n_trials=1, report=False)
    assert not result.done

    def parent_run():
        run_id = result.study.user_attrs[st_parent_attr()]
        return mlflow_client(tmp_path).get_run(run_id)

    parent = parent_run()
    assert parent.info.status == "KILLED"
    assert parent.data.tags["cofr.study_state"] == (
        f"stopped at 1 of 2 trials: `cofr sweep run {sweep_path}` goes on"
    )
    # A worker that joins: the run is live from its start, not only from its first trial.
    from cofrgenet.sweeps.worker import _parent_run

    _parent_run(sweep, str(tmp_path / "runs"), result.study, "journal")
    parent = parent_run()
    assert parent.info.status == "RUNNING" and "cofr.study_state" not in parent.data.tags
    assert run_worker(sweep, report=False).done
    parent = parent_run()
    assert (parent.info.status, parent.data.tags["cofr.study_state"]) == ("FINISHED", "complete")
    _parent_run(sweep, str(tmp_path / "runs"), result.study, "journal")  # a late worker
    parent = parent_run()
    assert (parent.info.status, parent.data.tags["cofr.study_state"]) == ("FINISHED", "complete")


def test_a_last_worker_under_no_mlflow_settles_the_studys_run_and_logs_the_report(
    tiny_data, tmp_path
):
    """The study's MLflow run was settled only by workers with MLflow: when the last one
    ran with --no-mlflow, the run its predecessors made stayed RUNNING, without a report."""
    sweep = load_sweep(write_sweep(
        tmp_path, sampler={"name": "grid"}, pruner={"name": "none"}, n_trials=None,
        space={"model.optimizer.lr": {"choices": [1e-3, 2e-3]}},
        overrides={"data.data_dir": str(tiny_data)},
    ))  # fmt: skip
    from cofrgenet.sweeps.worker import _parent_run

    study, _ = open_study(sweep, st.open_storage(st.home_storage(sweep)), 0)
    _, parent = _parent_run(sweep, str(tmp_path / "runs"), study, "journal")  # a first worker
    for _ in sweep.grid:  # whose trials ended
        trial = study.ask()
        sweep.space[0].suggest(trial)
        study.tell(trial, 1.0)
    assert mlflow_client(tmp_path).get_run(parent).info.status == "RUNNING"
    assert run_worker(sweep, mlflow=False).done  # the last worker, without MLflow
    run = mlflow_client(tmp_path).get_run(parent)
    assert (run.info.status, run.data.tags["cofr.study_state"]) == ("FINISHED", "complete")
    logged = [a.path for a in mlflow_client(tmp_path).list_artifacts(parent, "report")]
    assert "report/summary.md" in logged
    # A study whose run is in another store than this worker's is left alone.
    other = load_sweep(write_sweep(tmp_path, name="other.yaml", study="other", n_trials=1,
                                   overrides={"data.data_dir": str(tiny_data)}))  # fmt: skip
    study, _ = open_study(other, st.open_storage(st.home_storage(other)), 0)
    _, parent = _parent_run(other, str(tmp_path / "runs"), study, "journal")
    study.set_user_attr("cofr.mlflow_store", "http://elsewhere:5000")
    trial = study.ask()
    for param in other.space:
        param.suggest(trial)
    study.tell(trial, 1.0)
    assert run_worker(other, mlflow=False, report=False).done
    assert mlflow_client(tmp_path).get_run(parent).info.status == "RUNNING"


def test_a_leaving_worker_does_not_leave_the_studys_run_killed_under_a_new_trial(
    tmp_path, monkeypatch
):
    """Worker A leaves and sees no trial running; worker B takes one before A writes
    KILLED: A looks again and sets the run RUNNING, without the stop's tag."""
    from cofrgenet.sweeps import tracking
    from cofrgenet.sweeps.worker import _settle_parent_run

    sweep = parse_sweep({"study": "p", "space": {"a": [1, 2]}, "n_trials": 2})
    storage = st.open_storage(f"journal:{tmp_path / 'p.journal'}")
    study, _ = open_study(sweep, storage, 0)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent = client.create_run(client.create_experiment("p")).info.run_id
    written = tracking.set_parent_status

    def status_then_b_takes_a_trial(client, run_id, status):
        written(client, run_id, status)
        if status == "KILLED":
            study.ask()  # worker B's trial, RUNNING

    monkeypatch.setattr(tracking, "set_parent_status", status_then_b_takes_a_trial)
    _settle_parent_run(client, parent, study, sweep)
    run = client.get_run(parent)
    assert run.info.status == "RUNNING" and tracking.STUDY_STATE_TAG not in run.data.tags


def test_a_grid_point_queued_twice_by_two_hosts_trains_once(tmp_path):
    """Without a lock across hosts two workers may both queue a grown grid's point: the
    later waiting copy is failed as a duplicate (with its reason); the first copy, and a
    retry of a failed trial, are left alone."""
    from cofrgenet.sweeps.worker import fail_duplicate_points

    sweep = parse_sweep({"study": "d", "space": {"a": "int 1..2"}, "sampler": {"name": "grid"}})
    storage = st.open_storage(f"journal:{tmp_path / 'd.journal'}")
    study, _ = open_study(sweep, storage, 0)  # points a=1 (#0) and a=2 (#1) queued
    running = study.ask()  # a=1 taken by a worker
    for point in ({"a": 1}, {"a": 2}):  # the other host queued both again
        study.enqueue_trial(point, user_attrs={st.GRID_POINT: point})
    study.tell(running, state=TrialState.FAIL)
    retry = st.retry_trial(study, st.frozen_trial(storage, study, running.number), max_retry=3)
    fail_duplicate_points(study, storage)
    states = {t.number: t.state for t in study.get_trials()}
    assert states == {
        0: TrialState.FAIL,  # ran and failed: its retry (#4) and copy (#2) decide
        1: TrialState.WAITING,  # a=2, first queued
        2: TrialState.WAITING,  # a=1's copy, first of its point not failed
        3: TrialState.FAIL,  # a=2's copy
        4: TrialState.WAITING,  # the retry of #0
    }
    assert retry == 4
    assert study.get_trials()[3].user_attrs[st.FAIL_REASON].startswith("duplicate of trial 1:")


def test_a_grid_worker_that_loses_the_last_point_to_another_trains_no_new_trial(tmp_path):
    """A worker saw a WAITING grid point, another took it before this one's ask(): ask
    made a new trial, which the stand-by random sampler filled with a point that had run
    (a duplicate cell). It is failed untrained and counted for nothing; the worker looks
    again, and takes a point queued meanwhile or leaves."""
    from cofrgenet.sweeps.worker import next_trial

    sweep = parse_sweep({"study": "r", "space": {"a": [1, 2]}, "sampler": {"name": "grid"}})
    url = f"journal:{tmp_path / 'r.journal'}"
    storage = st.open_storage(url)
    study, _ = open_study(sweep, storage, 0)
    done = study.ask()
    sweep.space[0].suggest(done)
    study.tell(done, 1.0)
    other = optuna.load_study(study_name="r", storage=st.open_storage(url))
    real_ask = study.ask

    def ask_after_race(*args, **kwargs):
        study.ask = real_ask  # once
        other.ask()  # another worker takes the last queued point (a=2)
        return real_ask(*args, **kwargs)

    study.ask = ask_after_race
    me = st.Worker.current()
    assert next_trial(study, storage, sweep, me) == (None, False)
    trials = study.get_trials()
    discarded = trials[-1]
    assert discarded.state == TrialState.FAIL and not discarded.params
    assert discarded.user_attrs[st.FAIL_REASON].startswith("not trained: no grid point was left")
    assert st.budget_used(trials) == 2  # the two points, not the discarded trial

    def ask_then_requeue(*args, **kwargs):  # and a point is queued while this worker asks
        study.ask = real_ask  # once
        other.ask()
        trial = real_ask(*args, **kwargs)
        study.enqueue_trial({"a": 1}, user_attrs={st.GRID_POINT: {"a": 1}})
        return trial

    study.enqueue_trial({"a": 2}, user_attrs={st.GRID_POINT: {"a": 2}})
    study.ask = ask_then_requeue
    trial, resumed = next_trial(study, storage, sweep, me)
    assert not resumed and st.frozen_trial(storage, study, trial.number).user_attrs[
        st.GRID_POINT
    ] == {"a": 1}
    assert sweep.space[0].suggest(trial) == 1


def test_a_budget_that_leaves_the_pruner_nothing_is_refused_before_the_study(tiny_data, tmp_path):
    """budget.tokens 100 is one step of 4 x 32 tokens: Hyperband's min_resource 2 never
    comes (as budget.steps 1 is refused); val_every past the last step leaves the pruner
    the final validation alone. Both stop the worker before the study exists."""
    data = {"data.data_dir": str(tiny_data)}
    cases = (
        ({"tokens": 100}, {"name": "hyperband", "min_resource": 2},
         "pruner.min_resource: 2 is above the budget's 1 steps (what budget.tokens 100 makes)"),
        ({"steps": 3, "val_every": 5}, {"name": "median"},
         "budget.val_every: 5 is above the budget's 3 steps"),
    )  # fmt: skip
    for budget, pruner, message in cases:
        sweep = load_sweep(write_sweep(tmp_path, budget=budget, pruner=pruner, overrides=data))
        with pytest.raises(SweepError, match=re.escape(message)):
            run_worker(sweep, report=False, mlflow=False)
        assert not list((tmp_path / "runs").rglob("*.journal"))
    # A warm-up the budget's steps never pass: said (other trials may train longer).
    budget, pruner = {"tokens": 4 * 32 * 3}, {"name": "median", "n_warmup_steps": 3}
    sweep = load_sweep(write_sweep(tmp_path, budget=budget, pruner=pruner, overrides=data))
    probe = trial_config(sweep, {p.key: p.default() for p in sweep.space})
    assert (
        "pruner.n_warmup_steps: 3 is not below the budget's 3 steps (what budget.tokens "
        "384 makes at the space's first values), so the median pruner could prune no trial "
        "before its last step"
    ) in (pruner_idle_in_budget(sweep, probe) or "")
    # The trainer's own interval (the GPU sweeps' form of val_every) past the budget:
    # pruning was off, unsaid. Refused where every trial trains those steps...
    cases = (
        ({"trainer.val_check_interval": 5}, "trainer.val_check_interval: 5 batches is above "
         "the budget's 3 steps: a trial would validate once, at its end, and the median "
         "pruner see nothing before"),
        ({"trainer.val_check_interval": 7, "trainer.accumulate_grad_batches": 2},
         "above the budget's 3 steps (6 batches of 2)"),
    )  # fmt: skip
    for trainer, message in cases:
        overrides = {**data, **trainer}
        sweep = load_sweep(write_sweep(tmp_path, budget={"steps": 3}, overrides=overrides))
        with pytest.raises(SweepError, match=re.escape(message)):
            run_worker(sweep, report=False, mlflow=False)
        probe = trial_config(sweep, {p.key: p.default() for p in sweep.space})
        within = {"val_check_interval": 6, "accumulate_grad_batches": 2}  # the last step's
        assert pruner_idle_in_budget(sweep, {**probe, "trainer": within}) is None
    # ... said where a searched max_steps may train other trials longer.
    space = {"model.config.depth": "int 1..2", "trainer.max_steps": "int 3..30"}
    overrides = {**data, "trainer.val_check_interval": 5}
    sweep = load_sweep(write_sweep(tmp_path, budget={}, space=space, overrides=overrides))
    probe = trial_config(sweep, {p.key: p.default() for p in sweep.space})
    check_budget(sweep, probe)
    assert "trainer.val_check_interval: 5 batches is above the budget's 3 steps (trainer." \
        "max_steps at the space's first values)" in (pruner_idle_in_budget(sweep, probe) or "")  # fmt: skip


def test_a_later_sweep_file_shows_on_the_studys_run(tiny_data, tmp_path):
    """n_trials extended by a later run: the study's MLflow run keeps its first params
    (MLflow's cannot change) and says the new value as the tag latest/n_trials."""
    overrides = {"data.data_dir": str(tiny_data)}
    first = load_sweep(
        write_sweep(tmp_path, n_trials=1, pruner={"name": "none"}, overrides=overrides)
    )
    result = run_worker(first, report=False)
    more = load_sweep(
        write_sweep(tmp_path, n_trials=2, pruner={"name": "none"}, overrides=overrides)
    )
    run_worker(more, report=False)
    run = mlflow_client(tmp_path).get_run(result.study.user_attrs[st_parent_attr()])
    assert run.data.params["n_trials"] == "1" and run.data.tags["latest/n_trials"] == "2"


def test_hyperbands_max_resource_is_the_steps_a_tokens_budget_makes(
    tiny_data, tmp_path, monkeypatch
):
    """The pruner got budget.steps, None under budget.tokens: Hyperband's max_resource was
    "auto" (the first trial's last step) instead of the trials' steps."""
    from cofrgenet.sweeps import worker as sweep_worker

    seen = []
    monkeypatch.setattr(sweep_worker, "_run_trials", lambda ctx, *_: seen.append(ctx.study))
    budget = {"tokens": 4 * 32 * 5}  # 5 steps of data.batch_size 4 x block 32
    pruner = {"name": "hyperband", "min_resource": 2}
    data = {"data.data_dir": str(tiny_data)}
    sweep = load_sweep(write_sweep(tmp_path, budget=budget, pruner=pruner, overrides=data))
    run_worker(sweep, report=False, mlflow=False)
    assert seen[0].pruner._max_resource == 5  # Optuna keeps it private


def test_a_prune_reason_says_by_which_pruner_and_at_what_value():
    """It said "pruned at step 6" alone: status, report and the MLflow tag carry it."""
    from types import SimpleNamespace

    from cofrgenet.sweeps.objective import _prune_reason

    sweep = parse_sweep({"study": "s", "space": {"a": [1]}, "n_trials": 1,
                         "pruner": {"name": "hyperband"}, "budget": {"steps": 6}})  # fmt: skip
    ctx = SimpleNamespace(sweep=sweep)
    assert (
        _prune_reason(ctx, 6, 5.2134)
        == "pruned at step 6 by the hyperband pruner (val/loss 5.213 there)"
    )
    assert _prune_reason(ctx, 2, None) == "pruned at step 2 by the hyperband pruner"


def test_a_pruner_that_judges_before_the_ladders_train_is_warned_of():
    """With the paper's dyadic schedule no depth trains before half the budget: a
    Hyperband rung at step 250 of 3050 compares untrained ladders. It warned of depth 1
    alone: a rung at step 1600 compared d = 7 trials whose deepest ladders train only from
    step 3027 (the shipped TPE sweep did)."""
    dyadic = [{"class_path": "cofrgenet.training.callbacks.DyadicUnfreezing",
               "init_args": {"schedule": "paper"}}]  # fmt: skip
    model = {"preset": "gpt2-tiny-f", "config": {"depth": 1}}
    config = {"trainer": {"max_steps": 3050, "callbacks": dyadic}, "model": model}
    raw = {"study": "s", "space": {"a": [1]}, "n_trials": 1}
    early = parse_sweep({**raw, "pruner": {"name": "hyperband", "min_resource": 250}})
    warning = pruning_before_ladders(early, config)
    assert warning is not None and "from step 250 (min_resource)" in warning
    assert "ladder depth 1 (of the depths up to 1 that the trials train) trains only from " \
        "step 1525 of 3050" in warning  # fmt: skip
    late = parse_sweep({**raw, "pruner": {"name": "hyperband", "min_resource": 1600}})
    assert pruning_before_ladders(late, config) is None
    # Past depth 1's release, but the deepest depth searched comes last: 7 at t (1 - 2^-7).
    depths = {"model.config.depth": {"choices": [1, 3, 5, 7]}}
    deep = parse_sweep({**late.raw, "space": depths})
    assert "ladder depth 7 (of the depths up to 7 that the trials train) trains only from " \
        "step 3027 of 3050" in pruning_before_ladders(deep, config)  # fmt: skip
    ranged = parse_sweep({**late.raw, "space": {"model.config.depth": "int 1..8 step 3"}})
    assert "ladder depth 7 " in pruning_before_ladders(ranged, config)  # 1, 4, 7
    past = parse_sweep({**deep.raw, "pruner": {"name": "hyperband", "min_resource": 3027}})
    assert pruning_before_ladders(past, config) is None
    fixed = {**config, "model": {"preset": "gpt2-tiny-f", "config": {"depth": 3}}}
    assert "ladder depth 3 " in pruning_before_ladders(late, fixed)  # the model's depth
    assert "ladder depth 5 " in pruning_before_ladders(late, {**config, "model": None})
    dyadic[0]["init_args"]["total_steps"] = 1000  # the schedule's own t
    assert "from step 993 of 3050" in pruning_before_ladders(parse_sweep(
        {**raw, "space": depths, "pruner": {"name": "median", "n_warmup_steps": 800}}
    ), config)  # fmt: skip
    del dyadic[0]["init_args"]["total_steps"]
    median = parse_sweep({**raw, "pruner": {"name": "median"}})  # n_warmup_steps 0
    assert "from step 0 (n_warmup_steps)" in pruning_before_ladders(median, config)
    dyadic[0]["init_args"]["schedule"] = "none"
    assert pruning_before_ladders(early, config) is None  # ladders train from step 0
    assert pruning_before_ladders(parse_sweep({**raw, "pruner": {"name": "none"}}), config) is None


def test_a_trial_saved_for_a_requeue_that_does_not_come_is_retried_at_once(
    tiny_data, tmp_path, monkeypatch
):
    """SIGUSR1 outside SLURM (or scontrol refusing): the trial stayed RUNNING "waiting for
    its SLURM requeue", and the next worker ran nothing until the grace period (300 s)
    was out. It now fails with a retry, as a SIGTERM's stop does, counted for no retry."""
    import cofrgenet.sweeps.worker as worker_module
    from cofrgenet.sweeps.objective import Outcome

    children: list[str] = []

    def saved_for_a_requeue(ctx, trial):
        experiment = ctx.mlflow_client.get_experiment_by_name(ctx.sweep.experiment)
        children.append(ctx.mlflow_client.create_run(experiment.experiment_id).info.run_id)
        return Outcome(
            TrialState.RUNNING, reason="stopped at step 2 for a requeue", stop_worker=True,
            requeue=True, mlflow_run=children[-1],
        )  # fmt: skip

    monkeypatch.setattr(worker_module, "run_trial", saved_for_a_requeue)
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(
        write_sweep(tmp_path, n_trials=1, overrides={"data.data_dir": str(tiny_data)})
    )
    result = run_worker(sweep, report=False)
    from cofrgenet.sweeps.tracking import client_for, run_config

    (child,) = children  # its MLflow run says what the study says
    assert client_for(run_config(sweep)).get_run(child).data.tags["optuna.state"] == "FAIL"
    assert result.not_requeued == "this is not a SLURM job"
    first, retry = result.study.get_trials()
    assert first.state == TrialState.FAIL and retry.state == TrialState.WAITING
    assert first.user_attrs[st.STOPPED] == "SIGUSR1" and not first.user_attrs.get(st.REQUEUED)
    assert "for a requeue, but this is not a SLURM job" in first.user_attrs[st.FAIL_REASON]
    assert st.budget_used(result.study.get_trials()) == 0


def test_submit_refuses_what_run_refuses_before_sbatch(tiny_data, tmp_path, monkeypatch):
    """`cofr sweep submit` queued array tasks that all failed (a changed search space),
    that only said "study X: done" (no trials left), or that all stopped on a missing data
    folder; `cofr sweep run` refused each at once. Submit refuses them before sbatch."""
    import subprocess

    import cofrgenet.sweeps.slurm as slurm
    from cofrgenet.sweeps.slurm import SubmitOptions

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    calls = []
    done = subprocess.CompletedProcess((), 0, stdout="9\n", stderr="")
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: calls.append(a) or done)
    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = write_sweep(tmp_path, **common)
    run_worker(load_sweep(path), report=False, mlflow=False)

    def submit(sweep_file, dry_run=False, **options):
        return slurm.submit(load_sweep(sweep_file), SubmitOptions(**options), dry_run, False)

    changed = write_sweep(tmp_path, "changed.yaml", **common | {"n_trials": 2},
                          space={"model.config.depth": "int 1..8"})  # fmt: skip
    missing = dict(common, overrides={**common["overrides"], "data.data_dir": "no-such-data"})
    # --dry-run, the preview the sweep files recommend, printed a script for each.
    for dry_run in (False, True):
        with pytest.raises(SweepError, match=r"^study 'tiny-cpu' is done: its 1 trials have "
                           r"run, so workers would start none\. Raise n_trials in .*sweep\.yaml"):  # fmt: skip
            submit(path, dry_run)
        with pytest.raises(SweepError, match=r"^study 'tiny-cpu' was created from another"):
            submit(changed, dry_run)
        with pytest.raises(
            SweepError, match=r"(?s)data\.data_dir: .*no-such-data.*--no-storage-check\)$"
        ):
            submit(write_sweep(tmp_path, "nodata.yaml", **missing, study="new"), dry_run)
    # Workers on more devices than the study's, or with other --set: each task refused
    # by `run` after the queue's wait.
    more = write_sweep(tmp_path, "more.yaml", **common | {"n_trials": 2})
    for dry_run in (False, True):
        with pytest.raises(SweepError, match=r"^study 'tiny-cpu' trains each trial on 1 "
                           r"device\(s\) in all .*, this worker on 2"):  # fmt: skip
            submit(more, dry_run, gpus_per_worker=2)
        with pytest.raises(SweepError, match=r"^study 'tiny-cpu' was started with other --set "
                           r"settings \(model\.optimizer\.weight_decay only in this worker's"):  # fmt: skip
            submit(more, dry_run, settings={"model.optimizer.weight_decay": 0.0})
        # A budget that leaves the pruner nothing: refused by run, and now by submit.
        budget = {"budget": {"steps": 3, "val_every": 5}, "pruner": {"name": "median"}}
        idle = write_sweep(tmp_path, "idle.yaml", **common | budget, study="idle")
        with pytest.raises(SweepError, match=r"^budget\.val_every: 5 is above the budget's 3"):
            submit(idle, dry_run)
    assert calls == []
    assert not (tmp_path / "runs" / "sweeps" / "new").exists()  # a dry run writes nothing
    assert submit(more)[1] == "9"
    nodata = write_sweep(tmp_path, "nodata2.yaml", **missing, study="new")
    assert submit(nodata, dry_run=True, check_storage=False)[0].startswith("#!/bin/bash")
    assert submit(nodata, check_storage=False)[1] == "9"  # only the nodes may see it


def test_a_damaged_mlflow_store_is_one_line_for_run_and_report(tiny_data, tmp_path, capsys):
    """`echo garbage > runs/mlflow.db`: `cofr sweep report` gave SQLAlchemy's traceback
    ("file is not a database"); `run` says it in one line before the study is made."""
    from cofrgenet.errors import ConfigError
    from cofrgenet.sweeps.tracking import PARENT_ATTR

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = write_sweep(tmp_path, **common)
    store = tmp_path / "runs" / "mlflow.db"
    store.parent.mkdir(parents=True)
    store.write_text("garbage\n")
    with pytest.raises(ConfigError, match=r"mlflow\.db is not an MLflow database \(file is not"):
        run_worker(load_sweep(path), report=False)
    assert not (tmp_path / "runs" / "sweeps" / "tiny-cpu" / "optuna.journal").exists()
    result = run_worker(load_sweep(path), report=False, mlflow=False)
    result.study.set_user_attr(PARENT_ATTR, "0123456789abcdef")  # as a tracked worker sets it
    line = one_line_error(capsys, ["sweep", "report", str(path)])
    assert line.endswith(
        "mlflow.db is not an MLflow database (file is not a database): move it aside (the "
        "next cofr fit makes a new store), or fix the sweep's tracking_uri (or "
        "MLFLOW_TRACKING_URI), or report with --no-mlflow"
    )


def test_a_damaged_sqlite_study_database_is_said_at_once(tmp_path, capsys):
    """`echo garbage > bad.db; cofr sweep status st --storage sqlite:///bad.db` was retried
    five times (about 10 s), then blamed on a folder that must be writable."""
    import time

    bad = tmp_path / "bad.db"
    bad.write_text("garbage\n")
    started = time.monotonic()
    line = one_line_error(capsys, ["sweep", "status", "st", "--storage", f"sqlite:///{bad}"])
    assert time.monotonic() - started < 6  # the retries took ~10 s
    assert line.endswith(
        f"the study database {bad} is damaged (file is not a database): restore it from a "
        "copy, or move it aside to start its studies anew, or choose another with --storage"
    )


def test_a_killed_worker_not_yet_reaped_is_not_alive():
    """A SIGKILLed worker whose parent has not waited for it (a zombie, state Z) counted
    as alive (kill(pid, 0) finds it): status showed its trial RUNNING and other workers
    left the trial alone."""
    import signal
    import subprocess

    child = subprocess.Popen(["sleep", "60"])
    try:
        start = st._pid_start(child.pid)
        assert st.pid_alive(child.pid, start) and st.pid_alive(child.pid, None)
        os.kill(child.pid, signal.SIGKILL)
        for _ in range(100):  # killed, not reaped: Popen waits only when asked
            if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert not st.pid_alive(child.pid, start) and not st.pid_alive(child.pid, None)
    finally:
        child.kill()
        child.wait()


def test_no_validation_with_a_validation_objective_is_refused_before_any_trial(tiny_data, tmp_path):
    """`trainer.limit_val_batches: 0` with `objective.metric: val/loss` was found after
    three full trials ("objective metric 'val/loss' was never logged")."""
    from cofrgenet.sweeps.slurm import SubmitOptions, render

    overrides = {"data.data_dir": str(tiny_data), "trainer.limit_val_batches": 0}
    path = write_sweep(tmp_path, overrides=overrides)
    message = (
        r"trainer\.limit_val_batches: 0 turns validation off, but objective\.metric val/loss "
        r"is logged by validation: .* or rank by train/loss$"
    )
    with pytest.raises(SweepError, match=message):
        run_worker(load_sweep(path), report=False, mlflow=False)
    assert not (tmp_path / "runs" / "sweeps").exists()  # before the study
    with pytest.raises(SweepError, match=message):
        render(load_sweep(path), SubmitOptions())
    train = write_sweep(tmp_path, "train.yaml", overrides=overrides,
                        objective={"metric": "train/loss", "direction": "minimize"})  # fmt: skip
    render(load_sweep(train), SubmitOptions())  # no validation needed


def test_a_note_of_several_lines_stays_on_one_row_of_status_and_report():
    """A fail reason with newlines (an exception's message) broke the report's Markdown
    trial table (only | was escaped) and spread over lines in `cofr sweep status`."""
    from optuna.distributions import CategoricalDistribution, IntDistribution
    from rich.console import Console

    from cofrgenet.sweeps.report import summary_markdown
    from cofrgenet.sweeps.status import print_status

    sweep = load_sweep(ROOT / "sweeps" / "tiny-cpu.yaml")
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name=sweep.study, storage=storage)
    distributions = {"x": IntDistribution(0, 3), "y": CategoricalDistribution(["a\nb"])}
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL,
            params={"x": 1, "y": "a\nb"},
            distributions=distributions,
            user_attrs={st.FAIL_REASON: "RuntimeError: first line\n  second | line\n"},
        )
    )
    table = summary_markdown(study, sweep, {}, {}, None, {}).split("## Trials")[1]
    [row] = [line for line in table.splitlines() if line.startswith("| 0 |")]
    assert row.endswith(" |  | RuntimeError: first line second / line |")
    console = Console(width=400, record=True)
    print_status(study, storage, console=console)
    [line] = [x for x in console.export_text().splitlines() if "first line" in x]
    assert "RuntimeError: first line second | line" in line


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["sigterm", "sigusr1"])
def test_a_signal_while_the_last_worker_writes_the_report(
    signum, tiny_data, tmp_path, capsys, monkeypatch
):
    """SLURM's kill (SIGTERM) or its requeue warning (SIGUSR1) while the last worker wrote
    the study's report: no handler was in place, and the default action ended the worker
    silently, the report half-written. SIGTERM now stops it in one line naming the
    command that writes the report; SIGUSR1 asks nothing of a done study: the report ends."""
    from cofrgenet.cli import main
    from cofrgenet.sweeps import report

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = write_sweep(tmp_path, **common)
    run_worker(load_sweep(path), report=False, mlflow=False)
    capsys.readouterr()
    real = report.write_report

    def signalled_while_writing(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(0.5)  # the signal's handler runs first
        return real(*args, **kwargs)

    def not_handled(signum, frame):  # the default action would end pytest itself
        raise AssertionError("the report ran with no handler of its own")

    monkeypatch.setattr(report, "write_report", signalled_while_writing)
    previous = signal.signal(signum, not_handled)
    try:
        status = main(["sweep", "run", str(path), "--no-mlflow"])
    finally:
        signal.signal(signum, previous)
    if signum == signal.SIGUSR1:
        assert status == 0
        assert (tmp_path / "runs" / "sweeps" / "tiny-cpu" / "report" / "summary.md").exists()
        return
    assert status == 143
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cofr sweep run: stopped by a signal while writing the report of study tiny-cpu, which "
        f"is done: write it with `cofr sweep report {path}`"
    )


def test_run_on_a_done_study_says_how_to_add_trials(tiny_data, tmp_path, capsys):
    """`cofr sweep run FILE --n-trials 2` on a done study printed "study X: done" alone,
    as if --n-trials could add trials; n_trials in the file bounds the study."""
    from cofrgenet.cli import main

    common = {"n_trials": 1, "pruner": {"name": "none"}, "budget": {"steps": 2}}
    common["overrides"] = {"data.data_dir": str(tiny_data), "trainer.val_check_interval": 2}
    path = write_sweep(tmp_path, **common)
    run_worker(load_sweep(path), report=False, mlflow=False)
    capsys.readouterr()
    assert main(["sweep", "run", str(path), "--n-trials", "2", "--no-mlflow", "--no-report"]) == 0
    err = capsys.readouterr().err
    assert (
        "cofr sweep run: study tiny-cpu has run all its trials, so this worker started none. "
        f"Raise n_trials in {path} to add trials (--n-trials bounds one worker's alone), or "
        "give a new --study NAME"
    ) in err


def test_status_right_after_submit_says_no_trials_yet(tmp_path, monkeypatch, capsys):
    """`cofr sweep status FILE --study S`, the command submit says to follow with, gave
    "no study 'S' yet" and exit status 2 until a worker started."""
    import subprocess

    import cofrgenet.sweeps.slurm as slurm
    from cofrgenet.cli import main

    monkeypatch.setattr(slurm.shutil, "which", lambda name: "/usr/bin/sbatch")
    monkeypatch.setattr("cofrgenet.sweeps.worker.check_before_submit", lambda *a: None)
    done = subprocess.CompletedProcess((), 0, stdout="5\n", stderr="")
    monkeypatch.setattr(slurm.subprocess, "run", lambda *a, **k: done)
    path = str(write_sweep(tmp_path))
    capsys.readouterr()
    assert main(["sweep", "submit", path, "--study", "s"]) == 0
    follow = capsys.readouterr().out.splitlines()[-1].removeprefix("follow with: ")
    assert follow == f"cofr sweep status {path} --study s"
    assert main(follow.split()[1:]) == 0
    said = capsys.readouterr().out
    assert said.startswith("study s: no trials yet: ") and "none of its workers has started" in said
    assert not (tmp_path / "runs" / "sweeps" / "s" / "optuna.journal").exists()
    # By the study's name, as by its file (it said "no study 's' at ...", exit 2).
    assert main(["sweep", "status", "s", "--runs-dir", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out == said
    # Another study, or another storage than the script's: still no study there.
    line = one_line_error(capsys, ["sweep", "status", path])
    assert "no study 'tiny-cpu' yet: " in line
    other = f"journal:{tmp_path / 'other.journal'}"
    line = one_line_error(capsys, ["sweep", "status", path, "--study", "s", "--storage", other])
    assert "no study 's' yet: " in line
    # A study submitted with its own --storage, asked for by name with it.
    assert main(["sweep", "submit", path, "--study", "t", "--storage", other]) == 0
    capsys.readouterr()
    by_name = ["sweep", "status", "t", "--storage", other, "--runs-dir", str(tmp_path / "runs")]
    assert main(by_name) == 0
    assert capsys.readouterr().out.startswith("study t: no trials yet: ")


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_one_table_names_each_sampler_for_the_check_and_the_workers(monkeypatch):
    """A sampler name was listed in a tuple, checked against one class and built from
    another by an if/else in the worker: a new name in the table is now checked and built
    alike (here Optuna's QMCSampler, whose ``scramble`` option the check reads off it)."""
    import optuna

    from cofrgenet.sweeps import spec
    from cofrgenet.sweeps.worker import make_sampler

    monkeypatch.setitem(spec.SAMPLER_CLASSES, "qmc", "QMCSampler")
    raw = {"study": "s", "space": {"a": [1, 2]}, "n_trials": 1}
    sweep = parse_sweep({**raw, "sampler": {"name": "qmc", "seed": 3, "scramble": True}})
    built = make_sampler(sweep, offset=2)
    assert isinstance(built, optuna.samplers.QMCSampler)
    with pytest.raises(SweepError, match=r"sampler.gamma: not an option of the qmc sampler"):
        parse_sweep({**raw, "sampler": {"name": "qmc", "gamma": 0.5}})

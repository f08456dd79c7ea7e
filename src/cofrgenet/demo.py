"""``cofr demo``: CoFrGeNet-F against its GPT-2 baseline, on CPU, in a few minutes.

Prepares Python's bundled documentation (no download) if needed, trains the two models
of ``conf/experiment/demo-*.yaml`` (same width and depth) one after the other through
``cofr fit``, and prints a table from what MLflow recorded; ``runs/demo-<stamp>.md`` keeps
it with what was measured (steps, seed, data, machine, command), as the benches' reports.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table

from cofrgenet import terminal
from cofrgenet.dataclass_options import at_least
from cofrgenet.signals import run_passing_signals, signal_name

DEMO_CONFIGS = ("conf/experiment/demo-gpt2.yaml", "conf/experiment/demo-cofrgenet-f.yaml")
DATA_DIR = "data/pydoc-byte"


@dataclass
class DemoResult:
    name: str
    preset: str
    parameters: int
    ladder_parameters: int
    tokens_per_sec: float
    val_loss: float
    val_ppl: float
    minutes: float
    run_dir: Path
    data: str  # the data's source and tokenizer, as the run logged them
    #: How many logged steps the tokens/s median is of (a short demo logs one or two).
    rate_samples: int = 0
    #: What the run trained, as it logged it: ``4 steps of 16 x 128 tokens, seed 1337``.
    trained: str = ""
    #: The prepared data folder it read.
    data_dir: str = ""
    #: Lightning's accelerator of its trainer (``cpu``, ``gpu``, ``auto``).
    accelerator: str = "cpu"

    def rate(self) -> str:
        """The tokens/s median, with its count when too few steps were logged to trust."""
        text = _number(self.tokens_per_sec, ",.0f")
        if 0 < self.rate_samples < MIN_RATE_SAMPLES:
            text += f" ({self.rate_samples} step{'s' if self.rate_samples > 1 else ''})"
        return text


#: Below this many logged steps the tokens/s column says how many it is of.
MIN_RATE_SAMPLES = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--configs",
        nargs="+",
        default=list(DEMO_CONFIGS),
        help="experiment configs to train and compare (default: " + " ".join(DEMO_CONFIGS) + ")",
    )
    parser.add_argument(
        "--max-steps",
        type=at_least(int, 1),  # at parse time: 0 was refused by the first fit only
        default=None,
        help="override trainer.max_steps, >= 1 (default: the configs')",
    )
    parser.add_argument(
        "--runs-dir",
        default="runs",
        help="where the runs, their MLflow store and the results table go (default: runs)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="the prepared data folder of every run, made from pydoc (bytes) when missing "
        f"(default: the configs' own; the demo configs' {DATA_DIR} is made when missing)",
    )


def ensure_data(data_dir: str, console: Console) -> None:
    meta_file = Path(data_dir) / "meta.json"
    if meta_file.exists():
        from cofrgenet.data.meta import FORMER_SPLIT_METHOD
        from cofrgenet.data.sources import nested_pydoc_topics

        try:  # read as it is: a damaged folder is the fit's to refuse, naming the fix
            meta = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(meta, dict):
            return
        remake = f"cofr data prepare --source pydoc --tokenizer byte --out {data_dir} --overwrite"
        if nested_pydoc_topics(meta.get("source", ""), meta.get("source_args") or {}):
            console.print(
                f"[yellow]warning:[/] {data_dir} was prepared before 2026-12-05 from every "
                "pydoc topic, the nested ones too: its held-out topics are partly training "
                f"text, so val loss reads low. Remake it: {remake}"
            )
        elif (meta.get("split_args") or {}).get("method") == FORMER_SPLIT_METHOD:
            console.print(
                f"[yellow]warning:[/] {data_dir} was prepared before 2026-12-06: its held-out "
                "topics are the last ones (the old draw's, for the default seed), not the "
                f"README's. Remake it: {remake}"
            )
        return
    console.print(f"[bold]preparing[/] {data_dir} from Python's bundled documentation")
    command = [
        sys.executable,
        "-m",
        "cofrgenet.cli",
        "data",
        "prepare",
        "--source",
        "pydoc",
        "--tokenizer",
        "byte",
        "--out",
        data_dir,
    ]
    run_step(command)


class StepStopped(Exception):
    """A signal came while one of the demo's steps ran, which got it too (a fit that had
    begun training saved after its step and said how to go on)."""

    def __init__(self, command: list[str], status: int, signum: int) -> None:
        super().__init__(command, status, signum)
        self.command, self.status, self.signum = command, status, signum


def run_step(command: list[str]) -> None:
    """Run one step of the demo (``python -m cofrgenet.cli ...``) to its end. A Ctrl-C or
    SIGTERM goes to the step, which stops as it does alone (a fit after its step, saved,
    its MLflow run KILLED): :class:`StepStopped`; a failure:
    ``subprocess.CalledProcessError``."""
    status, signum = run_passing_signals(command)
    if signum is not None:
        raise StepStopped(command, status, signum)
    if status != 0:
        raise subprocess.CalledProcessError(status, command)


def fit_words(
    config: str, run_name: str, args: argparse.Namespace, log_every: int | None = None
) -> list[str]:
    """The words after ``cofr fit`` that train ``config`` as run ``run_name`` (logging
    every ``log_every`` steps, where given)."""
    words = [
        "--config",
        config,
        "--run.name",
        run_name,
        "--run.runs_dir",
        args.runs_dir,
        "--run.mlflow",
        "true",  # the table is read from what the runs logged
    ]
    if args.data_dir is not None:
        words += ["--data.data_dir", args.data_dir]
    if args.max_steps is not None:
        words += ["--trainer.max_steps", str(args.max_steps)]
    if log_every is not None:
        words += ["--trainer.log_every_n_steps", str(log_every)]
    return words


def check_configs(
    configs: list[str], run_names: list[str], args: argparse.Namespace
) -> list[int | None]:
    """Parse every config as its fit will, and its model's settings (a preset's name,
    fields that must fit together), before any trains: a typo in the last one was found
    only after the others had trained (minutes each). Nothing is built or run. Returns
    each one's :func:`rate_log_interval`."""
    import yaml

    from cofrgenet.errors import ConfigError, UserError
    from cofrgenet.training.cli import resolve_fit_config
    from cofrgenet.training.model_options import fit_model_config

    intervals = []
    for config, name in zip(configs, run_names, strict=True):
        try:
            resolved = yaml.safe_load(resolve_fit_config(fit_words(config, name, args)))
            model = resolved.get("model") or {}
            fit_model_config({key: model[key] for key in ("preset", "config") if key in model})
        except ConfigError as error:
            raise UserError(f"--configs {config}: {error}") from None
        intervals.append(rate_log_interval(resolved.get("trainer") or {}))
    return intervals


def rate_log_interval(trainer: dict[str, Any]) -> int | None:
    """A logging interval short enough for a fit of ``trainer["max_steps"]`` steps to log
    :data:`MIN_RATE_SAMPLES` tokens/s rates (its first step is never one), where its own
    ``log_every_n_steps`` is longer: `cofr demo --max-steps 4` logged none at 10, and its
    table's tokens/s read "-". None: the config's own interval does."""
    steps, every = trainer.get("max_steps"), trainer.get("log_every_n_steps")
    if not isinstance(steps, int) or steps < 1 or not isinstance(every, int):
        return None
    short = max(1, (steps - 1) // MIN_RATE_SAMPLES)
    return short if short < every else None


def train(
    config: str,
    run_name: str,
    args: argparse.Namespace,
    console: Console,
    log_every: int | None = None,
) -> float:
    words = fit_words(config, run_name, args, log_every)
    command = [sys.executable, "-m", "cofrgenet.cli", "fit", *words]
    console.rule(f"[bold]{run_name}[/]: {' '.join(command[3:])}")
    started = time.perf_counter()
    run_step(command)
    minutes = (time.perf_counter() - started) / 60
    # A fit validates every val_check_interval steps: a --max-steps that is no multiple
    # of it ends unscored. Validate the final checkpoint so both models are compared at
    # the same step, in the same run.
    run_step([*command[:3], "validate", *command[4:], "--ckpt_path", "last"])
    return minutes


def collect(run_dir: Path, minutes: float, runs_dir: str) -> DemoResult:
    """The run's row, from what its fit and validate logged to MLflow."""
    import mlflow

    from cofrgenet.training.run_store import RUN_ID_FILE, RunConfig, tracking_uri

    client = mlflow.tracking.MlflowClient(tracking_uri(RunConfig(runs_dir=runs_dir)))
    run_id = (run_dir / RUN_ID_FILE).read_text().strip()
    logged = client.get_run(run_id).data

    def history(key: str) -> list[float]:
        # In logging order: the final `validate` logs after the fit, whatever its step.
        metrics = client.get_metric_history(run_id, key)
        return [m.value for m in sorted(metrics, key=lambda m: (m.timestamp, m.step))]

    rates = history("perf/tokens_per_sec")
    losses, ppls = history("val/loss"), history("val/ppl")
    params = logged.params
    steps = params.get("trainer.max_steps", "?")
    trained = (
        f"{steps} step{'' if steps == '1' else 's'} of {params.get('data.batch_size', '?')} "
        f"x {params.get('data.block_size', '?')} tokens, seed {params.get('seed_everything', '?')}"
    )
    return DemoResult(
        name=run_dir.name,
        preset=logged.params.get("model.preset", "?"),
        parameters=int(logged.metrics["model/n_params"]),
        ladder_parameters=int(logged.metrics["model/n_params_ladder"]),
        tokens_per_sec=statistics.median(rates) if rates else float("nan"),
        rate_samples=len(rates),
        val_loss=losses[-1] if losses else float("nan"),
        val_ppl=ppls[-1] if ppls else float("nan"),
        minutes=minutes,
        run_dir=run_dir,
        data=f"{logged.params.get('data.source', '?')}, {logged.params.get('data.tokenizer', '?')}",
        trained=trained,
        data_dir=params.get("data.data_dir", "?"),
        accelerator=params.get("trainer.accelerator", "?"),
    )


def _number(value: float, spec: str) -> str:
    """``value`` formatted, or "-" where nothing was logged (a run too short to log it)."""
    return format(value, spec) if math.isfinite(value) else "-"


def results_table(results: list[DemoResult]) -> Table:
    data = "; ".join(dict.fromkeys(r.data for r in results))
    table = Table(title=f"cofr demo, {time.strftime('%Y-%m-%d')} (data: {data})")
    for column in (
        "run",
        "preset",
        "params",
        "ladder params",
        "tokens/s (median)",
        "val loss",
        "val ppl",
        "minutes",
    ):
        table.add_column(column, justify="left" if column in ("run", "preset") else "right")
    for r in results:
        table.add_row(
            r.name,
            r.preset,
            f"{r.parameters:,}",
            f"{r.ladder_parameters:,}",
            r.rate(),
            _number(r.val_loss, ".3f"),
            _number(r.val_ppl, ".2f"),
            f"{r.minutes:.1f}",
        )
    return table


def _per_run(results: list[DemoResult], what: str) -> str:
    """The runs' ``what``: one, or each run's where they differ."""
    values = {r.name: getattr(r, what) for r in results}
    if len(set(values.values())) <= 1:
        return next(iter(values.values()), "")
    return "; ".join(f"{name}: {value}" for name, value in values.items())


def markdown(results: list[DemoResult], command: str, date: str) -> str:
    """The table, under what it measured (command, machine, data, steps and seed), as the
    benches' reports give theirs: a table alone could not be reproduced or compared."""
    import torch

    from cofrgenet.bench.machine import machine_summary

    # The runs' trainers chose the device; `auto` trains on a GPU where there is one.
    gpu = any(r.accelerator not in ("cpu", "?") for r in results) and torch.cuda.is_available()
    data = "; ".join(dict.fromkeys(f"{r.data} ({r.data_dir})" for r in results))
    lines = [
        f"# cofr demo, {date}",
        "",
        f"- command: `{command}`",
        f"- machine: {machine_summary('cuda' if gpu else 'cpu')}",
        f"- data: {data}",
        f"- trained: {_per_run(results, 'trained')}",
        "",
        "| run | preset | params | ladder params | tokens/s (median) | val loss | val ppl | minutes |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.preset} | {r.parameters:,} | {r.ladder_parameters:,} "
            f"| {r.rate()} | {_number(r.val_loss, '.3f')} "
            f"| {_number(r.val_ppl, '.2f')} | {r.minutes:.1f} |"
        )
    lines += [
        "",
        "tokens/s (median): of the rates each fit logged (every trainer.log_every_n_steps "
        'steps, its first step left out; "-": none logged). val loss, val ppl: the final '
        "checkpoint's validation. minutes: the fit's wall time.",
    ]
    return "\n".join(lines) + "\n"


def run_names(configs: list[str]) -> list[str]:
    """A run name per config, from its file name (``demo-`` dropped), numbered where two
    files share one: each run must have its own folder."""
    stems = [Path(config).stem.removeprefix("demo-") for config in configs]
    return [
        stem if stems.count(stem) == 1 else f"{stem}-{stems[: i + 1].count(stem)}"
        for i, stem in enumerate(stems)
    ]


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except subprocess.CalledProcessError as error:
        # The step has printed its own error; say which step it was, without a traceback.
        step = " ".join(str(word) for word in error.cmd[3:6])
        status = error.returncode
        print(f"cofr demo: stopped: `cofr {step} ...` failed (exit status {status})")
        return 128 - status if status < 0 else status or 1  # -9: killed, as a shell says 137
    except StepStopped as stopped:
        # The step has said what it saved and how to go on; the demo's table is not made.
        step = " ".join(str(word) for word in stopped.command[3:6])
        name = signal_name(128 + stopped.signum)
        print(f"cofr demo: stopped by {name} during `cofr {step} ...`; no table was made")
        return 128 + stopped.signum


def _closest_file(path: str) -> str:
    """`` (did you mean 'conf/experiment/x.yaml'?)`` for the closest YAML file in the
    folder ``path`` names (here, or in the checkout), else ``; give its path``."""
    from cofrgenet.errors import did_you_mean
    from cofrgenet.recipes import bundled

    folder = bundled(Path(path).parent)
    prefix = "" if Path(path).parent == Path() else f"{Path(path).parent}/"
    names = [prefix + p.name for p in folder.glob("*.y*ml")] if folder.is_dir() else []
    return did_you_mean(f"{prefix}{Path(path).name}", sorted(names), prefix) or "; give its path"


def _run(args: argparse.Namespace) -> int:
    from cofrgenet.errors import UserError
    from cofrgenet.recipes import bundled

    args.configs = [str(bundled(config)) for config in args.configs]
    # The demo's configs train on its pydoc bytes, made here when missing; others bring
    # their own data.
    ours = {Path(bundled(d)).resolve() for d in DEMO_CONFIGS}
    demo_configs = any(Path(c).resolve() in ours for c in args.configs)
    for config in args.configs:  # before minutes of data preparation
        if not Path(config).is_file():
            raise UserError(f"--configs: no config file {config}{_closest_file(config)}")
    data_dir = None if args.data_dir is None else Path(args.data_dir)
    if data_dir is not None and data_dir.exists() and not data_dir.is_dir():
        # Said here: prepare's error would name its own --out.
        raise UserError(
            f"--data-dir {args.data_dir} is a file: give a prepared data folder, or a "
            "path where the demo makes one"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    names = [f"{name}-{stamp}" for name in run_names(args.configs)]
    console = terminal.console()
    console.print(f"checking {len(args.configs)} config(s)")
    intervals = check_configs(args.configs, names, args)  # before the data and the first fit
    if args.data_dir is not None or demo_configs:
        ensure_data(args.data_dir or DATA_DIR, console)
    results = []
    for name, config, log_every in zip(names, args.configs, intervals, strict=True):
        minutes = train(config, name, args, console, log_every)
        # The fit's experiment comes from the config and its bases: the name is unique.
        [run_dir] = Path(args.runs_dir).glob(f"*/{name}")
        results.append(collect(run_dir, minutes, args.runs_dir))
    console.print(results_table(results))
    summary = Path(args.runs_dir) / f"demo-{stamp}.md"
    command = getattr(args, "command_line", "cofr demo")
    summary.write_text(markdown(results, command, time.strftime("%Y-%m-%d")))
    console.print(f"table saved to {summary}")
    from cofrgenet.training.run_store import RunConfig, tracking_uri, ui_command_line

    # The runs' store: a bare `cofr ui` serves runs/mlflow.db, not another --runs-dir's.
    ui = ui_command_line(tracking_uri(RunConfig(runs_dir=args.runs_dir)))
    console.print(
        f"compare the runs in the MLflow UI: [bold]{rich_escape(ui)}[/] (it prints the URL to open)"
    )
    return 0

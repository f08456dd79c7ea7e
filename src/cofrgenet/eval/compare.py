"""``cofr compare``: runs from MLflow side by side, with the paper's rows, and their Pareto front.

Runs are picked by id or name (positional), by experiment (``--experiment``, repeatable)
or by sweep file (``--sweep``: the study's trials). For each run the table gives its
model (preset, mixers, ladder depth d and count L), parameters and analytic FLOPs per
token (computed from the run's logged config, so every run is counted the same way),
its last ``val/loss``, the median ``perf/tokens_per_sec`` and the ``cofr eval`` metrics
(``eval/<task>/<metric>``), marked where they were scored at another step than the val
loss; the paper's published rows (GPT2-xl on OpenWebText, spec section 5) follow.
Written to ``--out-dir`` (default ``runs/compare/<time>[-N]/``):

* ``compare.md``: that table in markdown;
* ``pareto.png``: parameters (or FLOPs per token, ``--x flops``) against ``--metric``,
  one marker per variant, the Pareto front (no other run is both smaller and better)
  drawn through the points it keeps; the paper's rows are added when ``--metric`` is one
  of their perplexities and the x axis parameters (the paper gives no FLOPs).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from cofrgenet.atomic import (
    create_numbered,
    nearest_existing,
    replacing,
    why_no_folder,
    write_text_atomic,
)
from cofrgenet.dotted import dotted_leaves
from cofrgenet.errors import UserError, did_you_mean
from cofrgenet.eval.paths import readable
from cofrgenet.training.run_store import STOPPED_AT_TAG

#: The paper's table (spec section 5): GPT2-xl-sized models pretrained on OpenWebText.
PAPER_ROWS: tuple[tuple[str, float, dict[str, float]], ...] = (
    ("GPT2-xl", 1.5e9, {"ptb": 30.12, "wikitext-2": 18.30, "lambada": 8.66, "wikitext-103": 17.50}),
    (
        "CoFrGeNet-F",
        985e6,
        {"ptb": 29.89, "wikitext-2": 17.12, "lambada": 8.12, "wikitext-103": 16.14},
    ),
    (
        "CoFrGeNet",
        798e6,
        {"ptb": 30.03, "wikitext-2": 17.96, "lambada": 8.55, "wikitext-103": 17.17},
    ),
    (
        "Synthesizer-D",
        1.2e9,
        {"ptb": 31.47, "wikitext-2": 19.35, "lambada": 9.92, "wikitext-103": 18.91},
    ),
)
#: The Pareto plot's y axis unless --metric says otherwise.
DEFAULT_METRIC = "val/loss"
#: Our metric that stands beside each of the paper's columns (docs/evaluation.md says why).
PAPER_METRICS = {
    "ptb": "eval/ptb/word_ppl_eos",  # line ends count as words: see docs/evaluation.md
    "wikitext-2": "eval/wikitext-2-v1/word_ppl",
    "lambada": "eval/lambada/ppl",
    "wikitext-103": "eval/wikitext-103-v1/word_ppl",
}
RATE_KEY = "perf/tokens_per_sec"


def paper_column(metric: str) -> str:
    """The table's header of a :data:`PAPER_METRICS` column: the ``cofr eval`` task it
    reads (``wikitext-2-v1 ppl``), not the paper's name (``wikitext-2``, which is
    another ``cofr eval`` task: the raw release, whose scores this column does not show)."""
    return f"{metric.split('/')[1]} ppl"


def raw_release(metric: str) -> str | None:
    """The same metric of the raw WikiText release (``eval/wikitext-2/word_ppl`` for
    ``eval/wikitext-2-v1/word_ppl``), the one a run scored on the other text may have."""
    return metric.replace("-v1/", "/", 1) if "-v1/" in metric else None


@dataclass
class RunRow:
    """One run's line of the comparison."""

    run_id: str
    name: str
    experiment: str
    variant: str
    params: int | None
    ladder_params: int | None
    flops_per_token: int | None
    depth: int | None
    ladders: int | None
    metrics: dict[str, float] = field(default_factory=dict)
    tokens_per_s: float | None = None
    #: How each eval/ set was scored (its ``<prefix>/protocol`` tag without the step):
    #: the split, stride and block, a digest of the text.
    protocols: dict[str, str] = field(default_factory=dict)
    #: The step each ``val/loss``, ``eval/`` and ``glue/`` number shown was logged at:
    #: a score from another step than the val loss's (an older checkpoint's) is marked.
    steps: dict[str, int] = field(default_factory=dict)
    #: The run trained to its end: not stopped, failed, still running or pruned (the
    #: Pareto front is drawn through such runs alone).
    finished: bool = True
    #: Its logged config's settings by dotted key (``model.optimizer.lr``): the values
    #: of the table's setting columns (``--column``, a sweep's searched keys).
    settings: dict[str, Any] = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="*",
        help="MLflow run ids or run names (with none, and no --experiment or --sweep: every "
        "run of the store)",
    )
    parser.add_argument(
        "--experiment",
        action="append",
        default=[],
        help="every run of this experiment (repeatable)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        help="a sweep file: compare its study's trials, with a column for each setting it "
        "searches (d and L have theirs)",
    )
    parser.add_argument(
        "--study",
        dest="study_name",
        default=None,
        help="with --sweep: the study its workers ran with --study (default: the file's)",
    )
    parser.add_argument(
        "--runs-dir",
        default="runs",
        help="the runs folder, whose mlflow.db is read (default: runs)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="another MLflow store (default: MLFLOW_TRACKING_URI when set, else "
        "<runs-dir>/mlflow.db)",
    )
    parser.add_argument(
        "--column",
        dest="columns",
        action="append",
        default=[],
        metavar="KEY",
        help="a config setting as a column, by its dotted key (model.optimizer.lr, "
        "data.batch_size; repeatable)",
    )
    parser.add_argument(
        "--metric",
        default=None,
        help=f"y axis of the Pareto plot; one some run has (default: {DEFAULT_METRIC})",
    )
    parser.add_argument(
        "--x",
        choices=("params", "flops"),
        default="params",
        help="x axis: parameters or FLOPs/token (default: params)",
    )
    parser.add_argument(
        "--out-dir",
        "--out",  # its older name
        dest="out",
        default=None,
        help="folder for compare.md and pareto.png (default: <runs-dir>/compare/<time>/, "
        "<time>-2/ for another compare in the same second)",
    )


# ------------------------------------------------------------------ runs from MLflow


def _logged_config(client: Any, run_id: str) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, "config.yaml", tmp)
        except Exception:  # a sweep's parent run, a run from another tool
            return None
        return yaml.safe_load(Path(path).read_text()) or {}


#: Why a run is not a row (:func:`describe_run`), as said after the table.
GLUE_RUN = "GLUE fine-tuning runs: their dev scores are columns of the fine-tuned run's row"
NO_CONFIG = "no cofrgenet config: a sweep's parent run, another tool's"
NO_CONFIG_TRIAL = (
    "sweep trials without a logged config (stopped or failed before their fit began, or "
    "just started)"
)
NO_STEP = "failed before a step"


def describe_run(
    client: Any, run: Any, experiment: str, plotted: str = DEFAULT_METRIC
) -> RunRow | str:
    """A :class:`RunRow`, or why the run is passed over: a ``cofr finetune glue`` run
    (:data:`GLUE_RUN`), a run without a cofrgenet config (:data:`NO_CONFIG`: sweep
    parents), a failed one that trained no step (:data:`NO_STEP`). A run not FINISHED
    has its state and step beside its name, and so has a sweep's pruned trial.

    Its metrics are read as the table reads them, ``plotted`` (the plot's) too: a
    validation's or evaluation's score of the newest checkpoint, logged last (an older
    checkpoint validated later does not replace it); a ``perf/`` rate's median; any other
    metric MLflow's latest (highest step)."""
    from cofrgenet.models import count_parameters, estimate_flops_per_token

    if "cofr.task" in run.data.tags:  # the tag cofr finetune glue sets (eval/glue.py)
        return GLUE_RUN
    config = _logged_config(client, run.info.run_id)
    if config is None or "model" not in config:
        # sweeps/objective.py tags a trial's run as it makes it, before the fit logs.
        return NO_CONFIG_TRIAL if "optuna.trial_number" in run.data.tags else NO_CONFIG
    status = run.info.status
    # Only a run not FINISHED needs its last step (a full history read, so not for all).
    trained = (
        [] if status == "FINISHED" else client.get_metric_history(run.info.run_id, "train/loss")
    )
    if status == "FAILED" and not trained:
        return NO_STEP  # a start refused after its MLflow run existed: no step, no score
    from cofrgenet.training.model_options import model_config_of

    model_config = model_config_of(config.get("model"))
    counts = count_parameters(model_config)
    # attention+ffn, always in that order (a pattern of several per layer is not named)
    mixers = [m for m in (model_config.attention, model_config.ffn) if isinstance(m, str)]
    preset = (config.get("model") or {}).get("preset") or "custom"
    has_ladders = counts.ladder > 0
    rates = [m.value for m in client.get_metric_history(run.info.run_id, RATE_KEY)]
    tokens_per_s = statistics.median(rates) if rates else None
    metrics = dict(run.data.metrics)
    steps: dict[str, int] = {}  # metric -> the step of the number shown
    eval_steps: dict[str, int] = {}  # eval prefix -> the step of the numbers shown
    for key in metrics:
        if key == RATE_KEY:  # the table's tokens/s: the median of the run's rates
            metrics[key] = tokens_per_s
            continue
        if key.startswith("perf/") and key == plotted:
            rates_of_key = client.get_metric_history(run.info.run_id, key)
            metrics[key] = statistics.median(m.value for m in rates_of_key)
            continue
        newest = key == "val/loss" or (key == plotted and key.startswith("val/"))
        if not (newest or _is_score(key)):  # any other metric: MLflow's latest
            continue
        history = client.get_metric_history(run.info.run_id, key)
        # The newest checkpoint's (each is logged at its checkpoint's step), scored last:
        # a `cofr validate` or `cofr eval` of an older checkpoint later does not replace it.
        shown = max(history, key=lambda m: (m.step, m.timestamp))
        if key.startswith("eval/"):
            eval_steps[key.rsplit("/", 1)[0]] = shown.step
        metrics[key], steps[key] = shown.value, shown.step
    name = run.info.run_name or run.info.run_id[:8]
    # sweeps/objective.py's tags: a retry trains in its first attempt's folder, which
    # names the run; the trial `cofr sweep status` lists is another number.
    trial = run.data.tags.get("optuna.trial_number")
    if trial is not None and trial != run.data.tags.get("optuna.first_trial_number", trial):
        name += f" (Optuna trial {trial})"
    pruned = run.data.tags.get("optuna.state") == "PRUNED"  # sweeps/tracking.py's tag
    if status != "FINISHED":  # a killed or running run beside finished ones: say so
        step = max((m.step for m in trained), default=-1) + 1
        if status == "KILLED":  # where it stopped: the history lags by log_every_n_steps
            step = int(run.data.tags.get(STOPPED_AT_TAG, step))
        state = status.lower()
        if status == "RUNNING" and _process_gone(config, experiment, run.info.run_name):
            state = LOST
        # A failed sweep trial whose retry will resume this run: not failed for good.
        retried = run.data.tags.get("optuna.retried_as")  # sweeps/tracking.py's tag
        going_on = f", retried as trial {retried}" if status == "FAILED" and retried else ""
        name += f" [{state} at step {step}{going_on}]"
    elif pruned:  # a FINISHED fit, stopped early by the pruner at its last validation
        name += f" [pruned at step {steps.get('val/loss', '?')}]"
    return RunRow(
        run_id=run.info.run_id,
        name=name,
        experiment=experiment,
        variant=preset if not mixers else f"{preset} ({'+'.join(mixers)})",
        params=counts.total,
        ladder_params=counts.ladder,
        flops_per_token=estimate_flops_per_token(model_config).forward,
        depth=model_config.depth if has_ladders else None,
        ladders=model_config.ladders if has_ladders else None,
        metrics=metrics,
        tokens_per_s=tokens_per_s,
        protocols=_protocols(run.data.tags, eval_steps),
        steps=steps,
        finished=status == "FINISHED" and not pruned,
        settings=dotted_leaves(config),
    )


#: A run MLflow says is running, whose run folder no process holds (:func:`_process_gone`).
LOST = "lost"
LOST_NOTE = (
    f"{LOST}: MLflow says the run is running, but no process holds its run folder (killed "
    "with SIGKILL, or its machine went down); the command that started it, with "
    "--ckpt_path last, resumes it (a sweep's trial: `cofr sweep run` of its study)"
)


def _process_gone(config: dict[str, Any], experiment: str, name: str | None) -> bool:
    """Whether the run folder of a RUNNING run is here (``<run.runs_dir>/<experiment>/
    <name>``, as ``cofr fit`` made it, from this folder) and no process holds its lock.
    False when that cannot be told: a folder elsewhere, a holder on another machine (a
    shared file system may lock within one machine only)."""
    import socket

    from cofrgenet.folder_lock import FolderLock, held_now
    from cofrgenet.training.run_store import folder_name
    from cofrgenet.training.runlock import LOCK_FILE

    runs_dir = (config.get("run") or {}).get("runs_dir") or "runs"
    if not name or not isinstance(runs_dir, str):
        return False
    lock = Path(runs_dir).expanduser() / folder_name(experiment) / folder_name(name) / LOCK_FILE
    if held_now(lock) is not False:
        return False
    host = FolderLock(lock).holder().get("host")
    return host in (None, socket.gethostname())


def _is_score(key: str) -> bool:
    """A ``cofr eval`` metric, or a GLUE dev score the table shows (not its loss)."""
    return key.startswith("eval/") or (key.startswith("glue/") and not key.endswith("/loss"))


def _protocols(tags: dict[str, str], eval_steps: dict[str, int]) -> dict[str, str]:
    """How each eval/ prefix's numbers shown were scored, without the step: the tag of
    their step, or the latest tag where it is that step's (runs evaluated before the
    per-step tags). None known: the prefix is left out (a ``?`` mark)."""
    protocols = {}
    for prefix, step in eval_steps.items():
        made = tags.get(f"{prefix}/protocol/step-{step}")
        latest = tags.get(f"{prefix}/protocol", "")
        if made is None and latest.startswith(f"step {step}, "):
            made = latest
        if made is not None:
            protocols[prefix] = re.sub(r"^step \d+, ", "", made)
    return protocols


def collect_runs(
    client: Any,
    refs: Sequence[str],
    experiments: Sequence[str],
    studies: dict[str, str] | None = None,
    plotted: str = DEFAULT_METRIC,
) -> tuple[list[RunRow], dict[str, list[str]]]:
    """(rows, {why: names of the runs passed over so}, :func:`describe_run`'s reasons);
    ``plotted``: the metric the plot reads, read as the table's are.

    ``studies`` ({experiment: study}): of that experiment, only the trials of that study
    (their ``optuna.study`` tag): studies may share an experiment."""
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    found: list[Any] = []
    empty: list[str] = []  # what an experiment named held none of, said if nothing is found
    earlier: dict[str, list[str]] = {}  # runs of earlier studies of a name, passed over
    for name in experiments:
        experiment = client.get_experiment_by_name(name)
        if experiment is None and studies and name in studies:  # compare --sweep
            raise UserError(
                f"no MLflow experiment {name!r}, where the trials of study {studies[name]!r} "
                "log: its workers ran with --no-mlflow, or logged to another store (give its "
                "--tracking-uri); `cofr sweep status` lists the trials either way"
            )
        if experiment is None:
            known = sorted(names.values())
            raise UserError(
                f"no MLflow experiment {name!r}{did_you_mean(name, known)}; the store has: "
                f"{short_list(known) or 'none'}"
            )
        if experiment.lifecycle_stage == "deleted":  # its runs are hidden, not gone
            raise UserError(
                f"MLflow experiment {name!r} is deleted (its runs are kept): restore it with "
                f"`mlflow experiments restore --experiment-id {experiment.experiment_id}` "
                "(MLFLOW_TRACKING_URI set to this store)"
            )
        runs = client.search_runs([experiment.experiment_id], max_results=5000)
        study = (studies or {}).get(name)
        if study is not None:  # compared here: no quoting for a name with ' in a filter
            others = sorted({str(r.data.tags.get("optuna.study")) for r in runs} - {"None"})
            runs = [r for r in runs if r.data.tags.get("optuna.study") == study]
            runs, older = newest_study(runs)
            if older:
                why = f"trials of an earlier study named {study!r}, whose MLflow run is older"
                earlier[why] = [r.info.run_name or r.info.run_id for r in older]
            if not runs:
                held = f"its runs' studies: {short_list(others)}" if others else "it has none"
                empty.append(
                    f"MLflow experiment {name!r} has no trials of study {study!r} ({held})"
                )
        elif not runs:
            empty.append(f"MLflow experiment {name!r} has no runs")
        found += runs
    for ref in refs:
        if "'" in ref:  # no quoting for it in MLflow's filter strings: compare the names here
            runs = [
                r
                for r in client.search_runs(list(names), max_results=5000)
                if r.info.run_name == ref
            ]
        else:
            runs = client.search_runs(
                list(names), filter_string=f"attributes.run_name = '{ref}'", max_results=5000
            )
        if not runs and re.fullmatch(r"[0-9a-f]{6,31}", ref):  # the table's short id
            runs = [
                r
                for r in client.search_runs(list(names), max_results=5000)
                if r.info.run_id.startswith(ref)
            ]
        if not runs:
            try:
                runs = [client.get_run(ref)]
            except Exception:
                known = sorted(
                    {r.info.run_name for r in client.search_runs(list(names), max_results=5000)}
                    - {None}
                )
                # A prefix of an id too short to be read as one (the table's are 8).
                short = (
                    " (an id's first 6 characters or more name its run)"
                    if re.fullmatch(r"[0-9a-f]{1,5}", ref)
                    else ""
                )
                # Run names are short (f1, g1): a one-character slip is half of one.
                raise UserError(
                    f"no MLflow run with id or name {ref!r} in this store{short}"
                    f"{did_you_mean(ref, known, cutoff=0.5)}; its runs: "
                    f"{short_list(known) or 'none'}"
                ) from None
        in_experiments = sorted({names.get(r.info.experiment_id, "?") for r in runs})
        if len(runs) > 1:  # all compared: said, with how to take one
            ids = ", ".join(
                f"{r.info.run_id} in {names.get(r.info.experiment_id, '?')}" for r in runs
            )
            print(
                f"note: {ref!r} names {len(runs)} runs, in experiment"
                f"{'s' if len(in_experiments) > 1 else ''} {', '.join(in_experiments)}: all "
                f"are compared (name one by its id: {ids})",
                file=sys.stderr,
            )
        found += runs
    if not refs and not experiments:
        found = client.search_runs(list(names), max_results=5000)
    if not found and empty:  # the experiment named is there, and empty: not a typo
        with_runs = sorted(
            name for id_, name in names.items() if client.search_runs([id_], max_results=1)
        )
        others = (
            f"experiments with runs: {short_list(with_runs)}"
            if with_runs
            else "no experiment of this store has runs yet (cofr fit makes them)"
        )
        raise UserError(f"{'; '.join(empty)}; {others}")
    rows: list[RunRow] = []
    skipped: dict[str, list[str]] = dict(earlier)
    seen = set()
    for run in found:
        if run.info.run_id in seen:
            continue
        seen.add(run.info.run_id)
        row = describe_run(client, run, names.get(run.info.experiment_id, "?"), plotted)
        if isinstance(row, str):
            skipped.setdefault(row, []).append(run.info.run_name or run.info.run_id)
        else:
            rows.append(row)
    # Runs of one name in one experiment (a folder moved aside, another tool's) read as
    # the same row twice: each has the start of its id.
    named = [(row.experiment, row.name) for row in rows]
    for row in rows:
        if named.count((row.experiment, row.name)) > 1:
            row.name += f" ({row.run_id[:8]})"
    return rows, skipped


def short_list(names: Sequence[str], limit: int = 8) -> str:
    """``a, b, c``, or the first ``limit`` and ``... (12 in all)``: names for one line."""
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def no_rows(skipped: dict[str, list[str]]) -> str:
    """Why :func:`collect_runs` gave no rows: the runs found were all passed over (and
    why), or none were found, which (a run or experiment named is found or refused there)
    is a store without runs."""
    if skipped:
        said = "; ".join(f"{why}: {short_list(passed, 5)}" for why, passed in skipped.items())
        return f"no run to compare: every run found was passed over ({said})"
    return "this store has no runs yet: train one (cofr fit), or name another with --runs-dir"


# ------------------------------------------------------------------ table and plot


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else readable(value, spec)  # a diverged run's 7e127


def _percent(value: float | None) -> float | None:
    return None if value is None else 100 * value


def in_percent(metric: str) -> bool:
    """Whether ``metric`` is shown in % (a GLUE dev score, logged as a fraction): in the
    table and on the Pareto plot's axis alike."""
    return metric.startswith("glue/") and _is_score(metric)


def glue_column(metric: str) -> str:
    """The table's header of a GLUE dev score: ``sst2/accuracy %`` (logged as a fraction,
    shown in %)."""
    return f"{metric.removeprefix('glue/')} %"


def paper_glue(row: int, metric: str) -> float | None:
    """The paper's GLUE dev score (%) of :data:`PAPER_ROWS` ``[row]`` for ``metric``
    (``glue/<task>/<metric>``): it gives them for GPT2-xl and CoFrGeNet-F only, one
    number a task, which reads as the accuracy on the matched dev set (eval/glue.py)."""
    from cofrgenet.eval.glue import PAPER as GLUE_PAPER

    _, task, name = metric.split("/", 2)
    scores = GLUE_PAPER.get(task)
    if scores is None or name != "accuracy" or row >= len(scores):
        return None
    return scores[row]  # PAPER_ROWS starts with GPT2-xl, CoFrGeNet-F: the pair's order


#: The settings the table always shows (d, L): no column of their own.
SHOWN_SETTINGS = ("model.config.depth", "model.config.ladders")


#: The table's own columns before and after the settings' (a setting is never headed so).
FIXED_HEADERS = ("run", "experiment", "variant", "d", "L", "params", "ladder params",
                 "FLOPs/token", "val loss", "val step", "tokens/s")  # fmt: skip


def setting_headers(keys: Sequence[str]) -> list[str]:
    """Each setting column's header: its key's last part (``lr``), the whole key where
    two columns share that part (``model.config.dropout``, ``data.dropout``) or it is
    one of the table's own headers (``run.experiment``: the paper's rows are filled by
    header, and its experiment would land in that column too)."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return [
        part if last.count(part) == 1 and part not in FIXED_HEADERS else key
        for key, part in zip(keys, last, strict=True)
    ]


def _setting(value: Any) -> str:
    """A setting's cell: a float in 3 significant digits (a sampled 0.000316 or 3.16e-05),
    a string or whole number as it is, anything else (true, a list) as YAML writes it
    inline; empty where the run has no such setting. A ``|`` is escaped (it would end
    the cell)."""
    if value is None:
        return ""
    if isinstance(value, float):
        text = f"{value:.3g}"
    elif isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        text = str(value)
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
        text = text.removesuffix("\n...").strip()  # a bare scalar's document end
    return text.replace("|", "\\|")


def markdown_table(rows: Sequence[RunRow], paper: bool = True, settings: Sequence[str] = ()) -> str:
    """The runs (and the paper's rows) as a markdown table; a column for each of
    ``settings`` (dotted config keys, after d and L) and for each GLUE dev score any run
    has (``cofr finetune glue`` logs them onto the pretraining run), in %, with the
    paper's dev scores in its rows where it gives them."""
    glue = sorted({k for r in rows for k in r.metrics if in_percent(k)})
    header = [
        *FIXED_HEADERS[:5],
        *setting_headers(settings),
        *FIXED_HEADERS[5:],
        *(paper_column(key) for key in PAPER_METRICS.values()),
        *(glue_column(key) for key in glue),
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 3 + "---:|" * (len(header) - 3)]
    marks = _protocol_marks(rows)
    step_marks, step_notes = _step_marks(rows, [*PAPER_METRICS.values(), *glue])
    for row in rows:
        cells = [
            row.name,
            row.experiment,
            row.variant,
            _fmt(row.depth, "d"),
            _fmt(row.ladders, "d"),
            *(_setting(row.settings.get(key)) for key in settings),
            _fmt(row.params, ","),
            _fmt(row.ladder_params, ","),
            _fmt(row.flops_per_token, ","),
            _fmt(row.metrics.get("val/loss"), ".4f"),
            _fmt(row.steps.get("val/loss"), ","),
            _fmt(row.tokens_per_s, ",.0f"),
            *(
                _fmt(row.metrics.get(key), ".2f")
                + marks.get((row.run_id, key), "")
                + step_marks.get((row.run_id, key), "")
                for key in PAPER_METRICS.values()
            ),
            *(
                _fmt(_percent(row.metrics.get(key)), ".2f") + step_marks.get((row.run_id, key), "")
                for key in glue
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if paper:
        for index, (name, params, values) in enumerate(PAPER_ROWS):
            # By column name: a column added to the runs' rows stays empty here, not
            # shifting the paper's figures under the wrong headers.
            given = {
                "run": f"{name} (paper)",
                "experiment": "OpenWebText",
                "params": f"{params:,.0f}",
                **{paper_column(PAPER_METRICS[t]): f"{values[t]:.2f}" for t in PAPER_METRICS},
                **{glue_column(key): _fmt(paper_glue(index, key), ".2f") for key in glue},
            }
            lines.append("| " + " | ".join(given.get(column, "") for column in header) + " |")
    notes = "\n".join(
        note
        for note in (
            _protocol_notes(rows),
            step_notes,
            _raw_release_notes(rows),
            LOST_NOTE if any(f"[{LOST} at step " in row.name for row in rows) else "",
        )
        if note
    )
    return "\n".join(lines) + "\n" + (f"\n{notes}\n" if notes else "")


def _raw_release_notes(rows: Sequence[RunRow]) -> str:
    """Below the table: the runs whose WikiText cell is empty though they have the raw
    release's score (``cofr eval --tasks wikitext-2``), which is another text than the
    paper's column (the ``<unk>`` release): not shown there, but said, with the fix."""
    lines = []
    for key in PAPER_METRICS.values():
        raw = raw_release(key)
        if raw is None:
            continue
        names = [r.name for r in rows if raw in r.metrics and key not in r.metrics]
        if names:
            task, raw_task = key.split("/")[1], raw.split("/")[1]
            lines.append(
                f"* `{paper_column(key)}` is empty for {', '.join(names)}: scored on "
                f"`{raw_task}` (the raw text, not the paper's `<unk>` release), whose "
                f"`{raw}` is not comparable; `cofr eval --tasks {task}` fills it"
            )
    return "\n".join(lines)


def _reference_step(row: RunRow) -> int | None:
    """The step a row's scores are held to: its val loss's, else its newest score's."""
    if "val/loss" in row.steps:
        return row.steps["val/loss"]
    scored = [step for key, step in row.steps.items() if _is_score(key)]
    return max(scored, default=None)


def _step_marks(
    rows: Sequence[RunRow], columns: Sequence[str]
) -> tuple[dict[tuple[str, str], str], str]:
    """(run id, metric) -> `` [1]``, `` [2]``...: a cell of ``columns`` scored at another
    step than its row's val loss (an older checkpoint evaluated), so that it is not read
    as the same model's; and the notes below the table saying which steps."""
    marks: dict[tuple[str, str], str] = {}
    numbers: dict[tuple[str, int], int] = {}  # (run id, step) -> its footnote
    notes = []
    for row in rows:
        reference = _reference_step(row)
        for key in columns:
            step = row.steps.get(key)
            if key not in row.metrics or step is None or step == reference:
                continue
            if (row.run_id, step) not in numbers:
                numbers[(row.run_id, step)] = len(numbers) + 1
                held_to = "val loss" if "val/loss" in row.steps else "newest score"
                notes.append(
                    f"* [{len(numbers)}] {row.name}: scored at step {step}, "
                    f"its {held_to} at step {reference}"
                )
            marks[(row.run_id, key)] = f" [{numbers[(row.run_id, step)]}]"
    return marks, "\n".join(notes)


def _protocols_by_column(rows: Sequence[RunRow]) -> dict[str, list[str]]:
    """For each paper column whose runs were scored in more than one way (another copy
    of the text, stride or split), the ways, in order of first appearance."""
    out = {}
    for key in PAPER_METRICS.values():
        prefix = key.rsplit("/", 1)[0]
        ways = [r.protocols.get(prefix, "?") for r in rows if key in r.metrics]
        distinct = list(dict.fromkeys(ways))
        if len(distinct) > 1:
            out[key] = distinct
    return out


def _protocol_marks(rows: Sequence[RunRow]) -> dict[tuple[str, str], str]:
    """(run id, metric) -> `` (a)``, `` (b)``...: which way a cell of such a column was
    scored (:func:`_protocol_notes` says what each letter is)."""
    marks = {}
    for key, ways in _protocols_by_column(rows).items():
        prefix = key.rsplit("/", 1)[0]
        for row in rows:
            if key in row.metrics:
                way = ways.index(row.protocols.get(prefix, "?"))
                marks[(row.run_id, key)] = f" ({chr(ord('a') + way)})"
    return marks


def _protocol_notes(rows: Sequence[RunRow]) -> str:
    """Below the table: the columns whose cells were scored in different ways, and how."""
    lines = []
    for key, ways in _protocols_by_column(rows).items():
        what = "; ".join(f"({chr(ord('a') + i)}) {way}" for i, way in enumerate(ways))
        lines.append(f"* `{key}` was scored in different ways, not comparable as is: {what}")
    return "\n".join(lines)


#: Metric name parts (after "/") whose larger values are better; any other metric is a
#: loss, a perplexity or bits per byte, where smaller is better.
HIGHER_IS_BETTER = (
    "acc", "f1", "mcc", "exact_match", "bleu", "rouge", "tokens_per_sec", "flops_per_s", "mfu",
)  # fmt: skip


def higher_is_better(metric: str) -> bool:
    """Whether larger values of ``metric`` are better: accuracies (``eval/lambada/accuracy``,
    harness ``acc_norm``), GLUE's F1 and MCC, throughput; not losses or perplexities, nor
    standard errors (``acc_stderr``). Only the metric's own name counts, not a task's
    (``eval/<task>/<metric>[/<filter>]``, ``glue/<task>/<metric>``)."""
    parts = metric.split("/")
    names = parts[2:] if parts[0] in ("eval", "glue") and len(parts) > 2 else parts[-1:]
    if any(name.endswith("_stderr") for name in names):
        return False
    return any(name.startswith(HIGHER_IS_BETTER) for name in names)


def is_perplexity(metric: str) -> bool:
    """Whether ``metric`` is a perplexity (``eval/<task>/word_ppl``, a harness
    ``word_perplexity``): plotted on a log axis, where a diverged run's 5e5 does not
    squash the others (and the paper's rows) into one line at the bottom."""
    parts = metric.split("/")
    names = parts[2:] if parts[0] in ("eval", "glue") and len(parts) > 2 else parts[-1:]
    return any("ppl" in name or "perplexity" in name for name in names)


def pareto_front(
    points: Sequence[tuple[float, float]], higher_is_better: bool = False
) -> list[int]:
    """Indices of the points no other point beats on both (lower x; lower y, or higher y
    when ``higher_is_better``), by x."""
    sign = -1.0 if higher_is_better else 1.0
    order = sorted(range(len(points)), key=lambda i: (points[i][0], sign * points[i][1]))
    front, best = [], float("inf")
    for i in order:
        if sign * points[i][1] < best:
            front.append(i)
            best = sign * points[i][1]
    return front


def _x_of(row: RunRow, x_axis: str) -> int | None:
    """The row's value on the plot's x axis (``params`` or ``flops``)."""
    return row.params if x_axis == "params" else row.flops_per_token


def plotted_rows(rows: Sequence[RunRow], metric: str, x_axis: str) -> list[RunRow]:
    """The rows the Pareto plot draws: those with ``metric`` and a value on the x axis."""
    return [r for r in rows if metric in r.metrics and _x_of(r, x_axis) is not None]


def front_withheld(rows: Sequence[RunRow], metric: str, x_axis: str) -> bool:
    """Whether the plot draws no front: its cells were scored in different ways."""
    return metric in _protocols_by_column(plotted_rows(rows, metric, x_axis))


def short_count(value: float) -> str:
    """A count as a tick label: 2300000 -> ``2.3M``, 150000 -> ``150k``, 1.5e9 -> ``1.5B``."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _count_tick_labels(axis: Any) -> None:
    """Label ``axis``'s log-scaled ticks as short counts (``2.3M``), on the ticks that
    matplotlib labels: on a range under a decade it labels the minor ticks, and eight
    ``2.3 x 10^6``-style labels ran into each other."""
    from matplotlib.ticker import Formatter

    class CountLabels(Formatter):
        def __init__(self, default: Formatter) -> None:
            self.default = default

        def __call__(self, x: float, pos: int | None = None) -> str:
            return short_count(x) if self.default(x, pos) else ""

        def format_ticks(self, values: Any) -> list[str]:
            shown = self.default.format_ticks(values)
            return [short_count(v) if text else "" for v, text in zip(values, shown, strict=True)]

    axis.set_major_formatter(CountLabels(axis.get_major_formatter()))
    axis.set_minor_formatter(CountLabels(axis.get_minor_formatter()))


def plot_pareto(rows: Sequence[RunRow], metric: str, x_axis: str, out: Path) -> Path | None:
    """Write the Pareto plot; None when no run has ``metric``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def x_of(row: RunRow) -> int | None:
        return _x_of(row, x_axis)

    kept = plotted_rows(rows, metric, x_axis)
    paper_task = next((t for t, key in PAPER_METRICS.items() if key == metric), None)
    if not kept:
        return None
    # The table's unit: a GLUE score read 62.50 there and 0.625 on the axis.
    scale, unit = (100.0, ", %") if in_percent(metric) else (1.0, "")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = "osD^v<>pPX*h"
    for k, variant in enumerate(sorted({r.variant for r in kept})):
        for finished in (True, False):  # an unfinished run (stopped, pruned...): hollow
            mine = [r for r in kept if r.variant == variant and r.finished is finished]
            if not mine:
                continue
            drawn = ax.scatter(
                [x_of(r) for r in mine],
                [scale * r.metrics[metric] for r in mine],
                marker=markers[k % len(markers)],
                label=variant if finished else f"{variant} (unfinished)",
                s=40,
                color=f"C{k % 10}",
            )
            if not finished:
                drawn.set_facecolor("none")
    # Through the runs that trained to their end: a stopped run's score is of a
    # shorter training, not a point a finished one can be compared with.
    done = [r for r in kept if r.finished]
    points = [(float(x_of(r) or 0), scale * r.metrics[metric]) for r in done]
    better_up = higher_is_better(metric)
    front = pareto_front(points, better_up)
    # Cells scored in different ways (another stride, window or split: compare.md's
    # (a), (b)) are not comparable as is: no front is drawn through them.
    if front_withheld(kept, metric, x_axis):
        ax.set_title(f"{metric} scored in different ways (compare.md): no Pareto front", fontsize=8)
    elif len(front) > 1:  # one run is no front: its marker says all
        ax.plot(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            "k--",
            lw=1,
            label="Pareto front (finished runs)",
        )
    # The paper's rows have parameter counts only: no FLOPs follow from its sizes.
    if paper_task is not None and x_axis == "params":
        ax.scatter(
            [p for _, p, _ in PAPER_ROWS],
            [v[paper_task] for _, _, v in PAPER_ROWS],
            marker="*",
            c="grey",
            s=80,
            label="paper (GPT2-xl scale)",
        )
    ax.set_xscale("log")
    _count_tick_labels(ax.xaxis)
    if is_perplexity(metric):  # a loss stays linear: its scale is already a log's
        ax.set_yscale("log")
    ax.set_xlabel("parameters" if x_axis == "params" else "forward FLOPs per token")
    ax.set_ylabel(f"{metric}{unit} ({'higher' if better_up else 'lower'} is better)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "pareto.png"
    with replacing(path) as tmp:  # a kill mid-write keeps the earlier plot
        fig.savefig(tmp, dpi=120, metadata={"Software": WRITER})
    plt.close(fig)
    return path


def newest_study(runs: list[Any]) -> tuple[list[Any], list[Any]]:
    """(kept, passed over) of ``runs``, one study name's runs: where several studies had
    that name (one removed and made again: each has an MLflow run of its own, tagged
    ``cofr.sweep: parent``), the newest one's run and trials, and the earlier ones'."""
    parents = [r for r in runs if r.data.tags.get("cofr.sweep") == "parent"]
    if len(parents) < 2:
        return runs, []
    newest = max(parents, key=lambda r: (r.info.start_time or 0, r.info.run_id)).info.run_id
    kept = [r for r in runs if newest in (r.info.run_id, r.data.tags.get("mlflow.parentRunId"))]
    ids = {r.info.run_id for r in kept}
    return kept, [r for r in runs if r.info.run_id not in ids and r not in parents]


class SweepTrials(NamedTuple):
    """Where a sweep file's trials are: :func:`sweep_trials`."""

    experiment: str
    study: str
    #: The dotted keys its ``space`` searches, in the file's order.
    searched: tuple[str, ...]


def sweep_trials(path: str, study: str | None = None) -> SweepTrials:
    """The MLflow experiment, the study and the searched keys of a sweep file's trials:
    its ``experiment``, else the study, which is ``study`` (the name its workers were
    given) or the file's own (as ``cofr sweep run`` names them), read without importing
    the sweeps. The file is found as ``cofr sweep`` finds it: here, else in the checkout
    (``sweeps/...``)."""
    from cofrgenet.recipes import bundled

    try:
        raw = yaml.safe_load(bundled(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        named = (
            ""
            if not isinstance(error, FileNotFoundError)
            or path.endswith((".yaml", ".yml", "/"))
            or "/" in path
            else f" (a study named {path}: compare its trials with --experiment EXPERIMENT, the "
            "sweep file's experiment, else the study's name)"
        )
        raise UserError(f"cannot read the sweep file {path}: {error}{named}") from None
    if not isinstance(raw, dict):  # empty, or a list: told by its missing study
        raw = {}
    study = study or raw.get("study")
    if not study:
        raise UserError(f"{path} names no study: is it a sweep file (sweeps/*.yaml)?")
    space = raw.get("space")
    return SweepTrials(
        str(raw.get("experiment") or study),
        str(study),
        tuple(str(key) for key in space) if isinstance(space, dict) else (),
    )


#: What marks compare.md (its first line) and pareto.png (its "Software" text) as
#: written by a compare, which may replace them; any other file of those names is kept.
WRITER = "cofr compare"


def _written_by_compare(path: Path) -> bool:
    """Whether ``path`` (compare.md or pareto.png) is an earlier compare's."""
    try:
        if path.suffix == ".md":
            with path.open(encoding="utf-8-sig", errors="replace") as file:
                return file.readline().strip() == f"# {WRITER}"  # an editor's BOM, CRLF
        from PIL import Image  # matplotlib's own dependency

        with Image.open(path) as image:
            return image.info.get("Software") == WRITER
    except Exception:  # unreadable, or no image: not one a compare wrote
        return False


def foreign_outputs(out: Path) -> list[str]:
    """The files of ``out`` a compare would replace that no compare wrote (a plot written
    before plots were marked counts as the compare's when its compare.md beside does)."""
    table, plot = out / "compare.md", out / "pareto.png"
    own_table = _written_by_compare(table)
    foreign = [table.name] if table.exists() and not own_table else []
    if plot.exists() and not (own_table or _written_by_compare(plot)):
        foreign.append(plot.name)
    return foreign


def check_out_folder(out: Path, option: str = "--out-dir") -> None:
    """``--out-dir`` is a folder (compare.md and pareto.png go in it), or can be made one,
    and holds no compare.md or pareto.png that a compare did not write (it would replace
    them). ``option``: what gave ``out``, named in the message (``--runs-dir`` for the
    default, ``<runs-dir>/compare/``, whose own files stay: a compare writes below it)."""
    if out.exists() and not out.is_dir():
        raise UserError(
            f"{option} {out} is a file: give a folder for compare.md and pareto.png "
            "(made if missing)"
        )
    parent = nearest_existing(out.absolute().parent)
    if not parent.is_dir():
        raise UserError(f"{option} {out}: {parent} is a file, not a folder")
    foreign = foreign_outputs(out) if option == "--out-dir" and out.is_dir() else []
    if foreign:
        them = "them" if len(foreign) > 1 else "it"
        raise UserError(
            f"{option} {out} holds {' and '.join(foreign)}, not written by cofr compare, "
            f"which would replace {them}: give another folder, or move {them} away"
        )


def check_runs_dir(runs_dir: Path) -> None:
    """``--runs-dir`` is a folder, or not there (its missing store is said later): a file
    there was blamed on ``--out``, whose default folder is below it."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise UserError(
            f"--runs-dir {runs_dir} is a file: give the runs folder (the one holding "
            "mlflow.db and compare/)"
        )


def make_out_folder(out: Path | None, runs_dir: Path) -> Path:
    """The folder compare.md goes to: ``out`` (made if missing), else a new
    ``<runs_dir>/compare/<time>[-N]/`` (two compares in the same second get two)."""
    try:
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            return out
        return create_numbered(
            runs_dir / "compare",
            time.strftime("%Y%m%d-%H%M%S"),
            "",
            lambda path: path.mkdir(parents=True) or path,
        )
    except OSError as error:  # made or changed since the checks before the store was read
        option, folder = ("--out-dir", out) if out is not None else ("--runs-dir", runs_dir)
        raise UserError(
            f"{option} {folder}: cannot make the folder ({why_no_folder(folder, error)})"
        ) from None


def check_metric(metric: str, rows: Sequence[RunRow]) -> None:
    """``--metric`` is a metric some run has: a typo is refused with the closest name."""
    if any(metric in row.metrics for row in rows):
        return
    # The metrics a plot is usually made of first, the diagnostics (ladder/, opt/) after.
    usual = ("val/", "eval/", "train/", "perf/")
    names = sorted(
        {n for row in rows for n in row.metrics}, key=lambda n: (not n.startswith(usual), n)
    )
    listed = short_list(names)
    hint = did_you_mean(metric, names)
    if not hint and metric.startswith("eval/"):
        hint = " (`cofr eval --ckpt CKPT` logs eval/<task>/<metric> onto a checkpoint's run)"
    raise UserError(
        f"--metric {metric}: no run has it{hint}; the runs have: {listed or 'no metrics'}"
    )


def check_columns(keys: Sequence[str], rows: Sequence[RunRow]) -> None:
    """Each ``--column`` key is a setting some run has: a typo is refused with the
    closest key (a column no run fills would read as a setting left unset)."""
    known = sorted({key for row in rows for key in row.settings})
    for key in keys:
        if key in known:
            continue
        if any(k.startswith(f"{key}.") for k in known):
            raise UserError(
                f"--column {key} holds several settings: name one, e.g. "
                f"{next(k for k in known if k.startswith(f'{key}.'))}"
            )
        ends = [k for k in known if k.endswith(f".{key}")]
        hint = f" (did you mean {ends[0]!r}?)" if len(ends) == 1 else did_you_mean(key, known)
        raise UserError(
            f"--column {key}: no run's config has it{hint}; give a dotted key of the "
            "run's config.yaml, e.g. model.optimizer.lr"
        )


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    from cofrgenet.training.run_store import (
        RunConfig,
        check_store_exists,
        check_tracking_uri,
        tracking_uri,
        tracking_uri_source,
    )

    experiments = list(args.experiment)
    if args.study_name is not None and not args.sweep:
        raise UserError(
            f"--study {args.study_name} names the study of a sweep file: give it with --sweep "
            f"FILE, or compare the study's trials with --experiment {args.study_name}"
        )
    studies: dict[str, str] = {}
    columns = list(dict.fromkeys(args.columns))
    if args.sweep:
        experiment, studies[experiment], searched = sweep_trials(args.sweep, args.study_name)
        experiments.append(experiment)
        columns += [key for key in searched if key not in (*SHOWN_SETTINGS, *columns)]
    runs_dir = Path(args.runs_dir)
    check_runs_dir(runs_dir)
    given_out = Path(args.out) if args.out else None
    # Before the store is read: nothing is computed only to be lost.
    if given_out is not None:
        check_out_folder(given_out)
    else:
        check_out_folder(runs_dir / "compare", "--runs-dir")
    uri = tracking_uri(RunConfig(runs_dir=args.runs_dir, tracking_uri=args.tracking_uri))
    named_by = tracking_uri_source(args.tracking_uri)
    check_store_exists(uri, named_by)
    check_tracking_uri(uri, fix=f"fix {named_by or '--tracking-uri'}")
    client = MlflowClient(uri)
    metric = DEFAULT_METRIC if args.metric is None else args.metric
    rows, skipped = collect_runs(client, args.runs, experiments, studies, metric)
    if not rows:
        raise UserError(no_rows(skipped))
    rows.sort(key=lambda r: (r.experiment, r.variant, r.name))
    if args.metric is not None:  # asked for: a name no run has is a typo or a missing eval
        check_metric(metric, rows)
    check_columns(args.columns, rows)
    out = make_out_folder(given_out, runs_dir)
    table = markdown_table(rows, settings=columns)
    footer = (
        "Our perplexity columns are `eval/<task>/word_ppl` (WikiText: the `<unk>` releases, "
        "`wikitext-2-v1` and `wikitext-103-v1`; PTB: `word_ppl_eos`, line ends counted as "
        "words; LAMBADA: target-word `ppl`) from "
        "`cofr eval`; the paper's rows are GPT2-xl-sized models on OpenWebText (spec section 5)"
    )
    if any(in_percent(key) for row in rows for key in row.metrics):
        footer += (
            "; GLUE columns are dev scores in %, the paper's (GPT2-xl, CoFrGeNet-F) in the "
            "accuracy columns"
        )
    footer += ".\n"
    write_text_atomic(
        out / "compare.md",
        f"# {WRITER}\n\n`{getattr(args, 'command_line', 'cofr compare')}`\n\n{table}\n" + footer,
    )
    print(table)
    print(footer)  # what the columns read: an empty one is explained here too
    plot = plot_pareto(rows, metric, args.x, out)
    print(f"table: {out / 'compare.md'}")
    if not any(metric in row.metrics for row in rows):  # the default, not logged (yet)
        no_plot = f"no Pareto plot: no run has {metric!r} (--metric picks another)"
    else:
        x_name = "parameter count" if args.x == "params" else "FLOPs count"
        no_plot = f"no Pareto plot: no run with {metric!r} has a {x_name}"
    stale = out / "pareto.png"
    if plot is None and stale.exists():  # an earlier compare's, beside this compare.md
        stale.unlink()
        no_plot += f"; the earlier {stale} removed"
    mixed = plot is not None and front_withheld(rows, metric, args.x)
    said = f" (no front: its {metric} cells were scored in different ways)" if mixed else ""
    print(f"Pareto plot: {plot}{said}" if plot else no_plot)
    for why, passed in skipped.items():
        more = f" ... ({len(passed)} in all)" if len(passed) > 5 else ""
        print(f"passed over ({why}): {', '.join(passed[:5])}{more}")
    return 0

"""``cofr sweep status``: the trials of a study as a rich table."""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.table import Table

from cofrgenet import terminal
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.spec import StorageOptions, SweepError, counted, parse_sweep

STATE_STYLE = {
    "COMPLETE": "green",
    "PRUNED": "yellow",
    "FAIL": "red",
    "RUNNING": "cyan",
    "WAITING": "magenta",
}


def duration(trial: FrozenTrial, until: float | None = None, interval: float = 60.0) -> str:
    """Start to end (or now). A lost trial's ends at its last heartbeat (``until``, or
    the one kept when it was failed), not when another worker noticed; its worker may
    have lived up to a heartbeat ``interval`` longer, so it shows as a bound: ``≥1:05``,
    or ``<1:00`` when it died before its first heartbeat."""
    start = trial.datetime_start
    if start is None:
        return ""
    end = trial.user_attrs.get(st.LAST_SEEN, until)
    lost = end is not None
    if end is None:
        complete = trial.datetime_complete
        end = complete.timestamp() if complete else time.time()
    seconds = max(0.0, float(end) - start.timestamp())
    if lost and round(seconds) == 0:
        return f"<{_clock(interval)}"
    return f"≥{_clock(seconds)}" if lost else _clock(seconds)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def retried_as(trials: list[FrozenTrial]) -> dict[int, int]:
    """Attempt number -> the attempt that retries it (the next one, not the last)."""
    retried = {}
    for trial in trials:
        history = trial.system_attrs.get("retry_history") or []
        if history:
            retried[history[-1]] = trial.number
    return retried


def note(trial: FrozenTrial, retried: dict[int, int], lost: dict[int, str]) -> str:
    """Why the trial is in its state: fail reason, pruning step, retries, staleness.

    ``lost``: why RUNNING trials' workers seem gone (:func:`st.lost_trials`).
    """
    parts = []
    if trial.state == TrialState.FAIL:
        parts.append(str(trial.user_attrs.get(st.FAIL_REASON, "no reason recorded")))
    if trial.state == TrialState.PRUNED:
        parts.append(
            str(trial.user_attrs.get(st.PRUNE_REASON, f"pruned at step {trial.last_step}"))
        )
    if trial.state == TrialState.RUNNING:
        if trial.number in lost:
            parts.append(f"stale? {lost[trial.number]}")
        if trial.user_attrs.get(st.REQUEUED):
            parts.append("waiting for its SLURM requeue")
    history = trial.system_attrs.get("retry_history")
    if history:
        parts.append(f"retry of #{history[-1]}")
    if trial.number in retried:
        parts.append(f"retried as #{retried[trial.number]}")
    resumed = trial.user_attrs.get(st.RESUMED)
    if resumed:
        parts.append(f"resumed at step {resumed}")
    # One line: a reason may hold newlines (an exception's message), which broke the
    # status table's rows and the report's Markdown table.
    return " ".join("; ".join(parts).split())


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def budget_line(study: optuna.Study, trials: list[FrozenTrial]) -> str | None:
    """``budget: 4 of 10 trials used (2 complete, 1 pruned, 1 fail)``: the trials that
    count against the study's budget (``n_trials``, or the grid's points) as the study's
    own copy of its sweep file sets it (the last ``cofr sweep run`` stores it); None for
    a study without one."""
    raw = study.user_attrs.get("cofr.sweep")
    if not isinstance(raw, dict):
        return None
    try:
        total = parse_sweep(raw, resolve=False).total_trials
    except SweepError:  # a copy this cofr cannot read: the table says the rest
        return None
    used = st.budget_trials(trials)
    counts = f" ({st.state_counts(used)})" if used else ""
    return f"budget: {len(used)} of {counted(total, 'trial')} used{counts}"


def status_table(
    study: optuna.Study, storage: BaseStorage, options: StorageOptions | None = None
) -> Table:
    """``storage``: the one the study was loaded from (:func:`st.open_storage`)."""
    options = options or StorageOptions()
    lost = st.lost_trials(study, storage, options)  # before get_trials: none missed
    trials = study.get_trials(deepcopy=False)
    keys = sorted({k for t in trials for k in st.trial_params(t)})
    shorts = [k.rsplit(".", 1)[-1] for k in keys]
    if len(set(shorts)) < len(shorts):
        shorts = keys
    retried = retried_as(trials)
    summary = st.state_counts(trials)
    try:
        best = study.best_trial
        best_text = f"; best #{best.number} = {best.value:.6g}"
    except ValueError:
        best_text = ""
    count = counted(len(trials), "trial")
    table = Table(
        title=f"study {study.study_name}: {count} ({summary or 'none'}){best_text}",
        title_justify="left",
        caption=budget_line(study, trials),
        caption_justify="left",
    )
    for column in ("#", "state", *shorts, "value", "duration", "worker / SLURM job", "note"):
        table.add_column(column, justify="right" if column in ("#", "value") else "left")
    for trial in trials:
        state = trial.state.name
        value = trial.value if trial.value is not None else None
        worker = trial.user_attrs.get(st.WORKER, "")
        table.add_row(
            str(trial.number),
            f"[{STATE_STYLE.get(state, '')}]{state}[/]",
            *[_fmt(st.trial_params(trial).get(k)) for k in keys],
            _fmt(value),
            duration(
                trial,
                st.last_seen(trial, storage) if trial.number in lost else None,
                options.heartbeat_interval,
            ),
            str(worker),
            note(trial, retried, lost),
        )
    return table


def print_status(
    study: optuna.Study,
    storage: BaseStorage,
    options: StorageOptions | None = None,
    console: Console | None = None,
) -> None:
    if console is None:
        console = terminal.console()
    console.print(status_table(study, storage, options))

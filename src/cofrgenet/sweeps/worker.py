"""``cofr sweep run``: a worker that asks trials, trains them and tells the results.

Any number of workers run against one storage at once (processes on one host with the
journal file, on many hosts with PostgreSQL). A worker stops after ``--n-trials`` trials
of its own, or when the study's budget (``n_trials``, or the grid) is used up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from cofrgenet.atomic import missing_folders, remove_empty_folders
from cofrgenet.dotted import get_dotted
from cofrgenet.errors import UserError
from cofrgenet.folder_lock import waiting_for
from cofrgenet.redact import hide_passwords
from cofrgenet.signals import Terminated, signal_name, signals_held, sigterm_raises
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.fitconfig import (
    MERGING_VERSION,
    check_keys,
    check_model_values,
    check_optimizer_values,
    effective_settings,
    kept_since_merging,
    model_setting,
)
from cofrgenet.sweeps.objective import (
    NO_MODEL_HERE,
    NON_FINITE,
    REQUEUE,
    RUN_DIR_ATTR,
    UID_ATTR,
    Outcome,
    TrialContext,
    finish_mlflow,
    run_trial,
    trial_of_this_name,
)
from cofrgenet.sweeps.spec import (
    Sweep,
    SweepError,
    budget_steps,
    build_pruner,
    build_sampler,
    check_budget,
    check_extra,
    check_same_objective,
    check_validates,
    config_settings,
    counted,
    data_parallel_width,
    grid_points,
    parse_param,
    pruner_idle_in_budget,
    pruner_waits_past_budget,
    pruning_before_ladders,
    trial_config,
)
from cofrgenet.sweeps.tracking import PARENT_ATTR

log = logging.getLogger("cofrgenet.sweeps")


#: A worker stops after this many trials in a row failed for the same reason.
MAX_SAME_FAILURES = 3


def make_sampler(sweep: Sweep, offset: int) -> optuna.samplers.BaseSampler:
    """The sweep's sampler; its seed is offset per worker so workers do not draw alike.

    ``offset`` also counts the trials the study held when the worker started, so a worker
    restarted with the same index draws a new sequence instead of repeating its points.
    """
    seed = sweep.sampler.get("seed")
    # numpy takes seeds in [0, 2**32): wrapped, a large seed plus a pid still fits.
    seed = None if seed is None else (int(seed) + offset) % 2**32
    return build_sampler(sweep.sampler, seed)


def open_study(
    sweep: Sweep,
    storage: optuna.storages.BaseStorage,
    offset: int,
    extra: dict[str, Any] | None = None,
    grid_lock: Path | None = None,
    width: int | None = None,
    steps: int | None = None,
    bases: list[dict[str, str]] | None = None,
    url: str | None = None,
) -> tuple[optuna.Study, bool]:
    """Create the study (True) or load it (False); exactly one worker creates it.
    ``extra``: this worker's ``--set`` settings, checked against the study's; ``width``:
    its trials' data-parallel width (:func:`data_parallel_width`), likewise; ``steps``:
    the steps a trial trains, for the pruner (Hyperband's ``max_resource``); ``bases``: what its
    base files hold (:func:`base_digests`), checked against the study's; ``url``: the
    storage's, named in the command that deletes a study whose setup never finished. A grid
    sweep whose grid grew (ranges' values added, none removed) queues its new points once
    every check passed, under ``grid_lock`` (a file) so that workers starting together
    queue each once."""
    extra = dict(extra or {})
    kwargs = {
        "study_name": sweep.study,
        "storage": storage,
        "sampler": make_sampler(sweep, offset),
        # Hyperband's max_resource defaults to the steps a trial trains (budget_steps:
        # also those a tokens budget makes), else to budget.steps.
        "pruner": build_pruner(sweep.pruner, sweep.budget.steps if steps is None else steps),
    }
    try:
        study = optuna.create_study(direction=sweep.objective.direction, **kwargs)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(**kwargs)
        created = False
        wait_for_setup(study, sweep, points=0, url=url)
        stored_sweep = study.user_attrs.get("cofr.sweep")
        points = len(sweep.grid) if sweep.is_grid else 0
        if isinstance(stored_sweep, dict):  # before waiting for a grid it may not have
            old_points = grown_grid(sweep, stored_sweep)
            if old_points is None:
                check_same_trials(sweep, stored_sweep)
            else:
                points = len(old_points)
        wait_for_setup(study, sweep, points=points, url=url)  # the grid its creator queued
        check_same_objective(study, sweep, "use another study name")
        check_budget_not_below_used(study, sweep, stored_sweep)
        check_same_settings(study, extra)
        check_same_merging(study, sweep, extra)
        check_same_width(study, width)
        check_same_bases(study, bases)
        if sweep.is_grid:  # only once this worker may join: a refused one changes nothing
            queue_missing_points(study, storage, sweep, grid_lock)
        existing = len(study.get_trials(deepcopy=False))
        study.sampler = make_sampler(sweep, offset + 7919 * existing)
    stored_sweep = study.user_attrs.get("cofr.sweep") or {}
    if not created and stored_sweep != sweep.raw:
        # Its trials are the same (checked above); n_trials, the sampler, the pruner or
        # a grown grid may have changed: `cofr sweep status/report STUDY` read this copy.
        study.set_user_attr("cofr.sweep", sweep.raw)
    if created:
        study.set_user_attr(SETTINGS_ATTR, training_settings(extra))  # before setup_done's
        study.set_user_attr(MERGED_ATTR, MERGING_VERSION)
        if width is not None:
            study.set_user_attr(WIDTH_ATTR, width)
        if bases is not None:
            study.set_user_attr(BASES_ATTR, bases)
        study.set_user_attr(UID_ATTR, uuid.uuid4().hex)
        study.set_user_attr("cofr.sweep", sweep.raw)
        if sweep.is_grid:
            for point in sweep.grid:
                study.enqueue_trial(point, user_attrs={st.GRID_POINT: point})
    return study, created


def grown_grid(sweep: Sweep, stored: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The study's grid points (from ``stored``, the sweep file it was created from) when
    ``sweep`` only grows that grid: both grid sweeps, the same searched keys, every old
    point still in the new grid, the rest of the trial sections alike, and no list of
    choices changed (Optuna keeps a parameter's choices fixed within a study: every
    trial would fail). None otherwise."""
    if not sweep.is_grid or (stored.get("sampler") or {}).get("name") != "grid":
        return None
    others = [
        change
        for section in TRIAL_SECTIONS
        if section != "space"
        for change in _section_changes(section, stored.get(section), sweep.raw.get(section))
    ]
    if others:
        return None
    try:
        old_space = [parse_param(str(k), v) for k, v in (stored.get("space") or {}).items()]
        old = grid_points(old_space)
    except SweepError:
        return None
    if [p.key for p in old_space] != [p.key for p in sweep.space]:
        return None
    if any(
        old_param.kind == "categorical" and old_param.choices != new_param.choices
        for old_param, new_param in zip(old_space, sweep.space, strict=True)
    ):
        return None
    new = sweep.grid
    return None if any(point not in new for point in old) else old


def queue_missing_points(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    sweep: Sweep,
    lock: Path | None = None,
) -> None:
    """Queue the grid points no trial of the study is for (queued, run, or retried): the
    points a grown grid added. Under ``lock`` (a file), taken only when points are
    missing. Where the file system cannot lock across hosts, two workers starting
    together may both queue a point: the later copy is then failed as a duplicate while
    it still waits (:func:`fail_duplicate_points`)."""

    def missing() -> list[dict[str, Any]]:
        have = [st.grid_point(t) for t in study.get_trials(deepcopy=False)]
        return [point for point in sweep.grid if point not in have]

    if not missing():
        return
    with contextlib.ExitStack() as stack:
        if lock is not None:
            stack.enter_context(waiting_for(lock, "queueing the grown grid's points"))
        for point in missing():  # again, inside the lock: another worker may have
            study.enqueue_trial(point, user_attrs={st.GRID_POINT: point})
    fail_duplicate_points(study, storage)


def fail_duplicate_points(study: optuna.Study, storage: optuna.storages.BaseStorage) -> None:
    """Fail each waiting trial whose grid point an earlier trial (waiting, running or
    ended other than failed) is for already; retries (of a failed one) are left alone.
    Every worker that queued points runs this after, so the later of two copies goes."""
    first: dict[str, int] = {}
    for trial in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if trial.state == TrialState.FAIL or not trial.user_attrs.get(st.GRID_POINT):
            continue
        key = json.dumps(st.grid_point(trial), sort_keys=True, default=str)
        retry = bool(trial.system_attrs.get("retry_history"))
        if key not in first:
            first[key] = trial.number
        elif trial.state == TrialState.WAITING and not retry:
            reason = (
                f"duplicate of trial {first[key]}: two workers queued this point of the grown "
                "grid at once (no lock across their hosts)"
            )
            st.fail_trial(storage, st.trial_id(storage, study, trial.number), reason)


#: The sweep file's sections that say what a trial trains: a study's trials are ranked
#: against each other only while these stay as the study was created with. n_trials,
#: sampler, pruner, storage and tracking settings may change between runs.
TRIAL_SECTIONS = ("base", "overrides", "space", "budget")


def check_not_stored_elsewhere(
    sweep: Sweep, storage: optuna.storages.BaseStorage, url: str, runs_dir: str
) -> None:
    """Refuse to start a study whose name has trials in the runs folder already: they
    are another storage's study of that name (an unset variable in the sweep's
    ``storage:``, another ``--storage``), whose checkpoints the new one would move aside
    while that study still points to them."""
    if sweep.study in optuna.get_all_study_names(storage):
        return
    found = trial_of_this_name(sweep, runs_dir)
    if found is not None:
        folder, storage = found
        used = f"--storage {storage}" if storage else "--storage"
        raise SweepError(
            f"study {sweep.study!r} is not in {hide_passwords(url)}, but {folder} holds a "
            "trial of a study of that name, stored elsewhere: give the storage its workers "
            f"used ({used}, or the sweep's storage:), a new --study NAME, or move "
            f"{folder.parent} away to start the study anew"
        )


def check_budget_not_below_used(study: optuna.Study, sweep: Sweep, stored: Any) -> None:
    """Refuse a sweep file whose ``n_trials`` is below the trials the study has used
    (``stored``: the sweep the study keeps): it became the study's budget ("3 of 1 trial
    used"), and its report was written again, for a study that had ended."""
    kept = stored.get("n_trials") if isinstance(stored, dict) else None
    # The study's own budget stands, overshot or not (workers that took the last trials
    # together may use a few more).
    if sweep.is_grid or sweep.n_trials is None or sweep.n_trials == kept:
        return
    used = st.budget_used(study.get_trials(deepcopy=False))
    if sweep.n_trials >= used:
        return
    leave = f", or leave it at {kept}" if kept is not None and kept >= used else ""
    raise SweepError(
        f"study {sweep.study!r} has used {counted(used, 'trial')}, more than the sweep's "
        f"n_trials: {sweep.n_trials}: give n_trials >= {used} (the trials it keeps){leave}"
    )


def check_same_trials(sweep: Sweep, stored: dict[str, Any]) -> None:
    """SweepError naming what changed when ``sweep`` trains other trials than the sweep
    file the study was created from (``stored``, its raw YAML)."""
    changes = [
        change
        for section in TRIAL_SECTIONS
        for change in _section_changes(section, stored.get(section), sweep.raw.get(section))
    ]
    if changes:
        in_space = all(change.startswith("space") for change in changes)
        grows = (
            " (a grid may grow: values added to int or float ranges, none removed; a "
            "list of choices is fixed for the study's life, as Optuna keeps it)"
        )
        grows = grows if sweep.is_grid and in_space else ""
        raise SweepError(
            f"study {sweep.study!r} was created from another version of this sweep "
            f"({_first_four(changes)}): "
            "its trials would be ranked against trials trained otherwise. Put the file back, "
            f"or give the changed sweep a new study name (study: ...){grows}"
        )


#: The study's first worker's ``--set`` settings (later workers must train alike).
SETTINGS_ATTR = "cofr.settings"
#: ``--set`` keys that say where or on what a worker runs, not what a trial trains: they
#: may differ between workers (a node-local copy of the data, another runs folder); the
#: devices and nodes only as long as their product does not (:func:`check_same_width`).
WORKER_LOCAL_SETTINGS = ("run.", "data.data_dir", "data.num_workers", "trainer.devices",
                         "trainer.num_nodes", "trainer.accelerator", "trainer.strategy",
                         "trainer.enable_progress_bar", "trainer.enable_model_summary")  # fmt: skip


def training_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The ``--set`` settings that change what a trial trains, as JSON keeps them (the
    study stores these: not ``run.*``, whose tracking URI may hold a password)."""
    kept = {k: v for k, v in settings.items() if not k.startswith(WORKER_LOCAL_SETTINGS)}
    return json.loads(json.dumps(kept, default=str))  # a YAML date is its text


def check_same_settings(study: optuna.Study, extra: dict[str, Any], record: bool = True) -> None:
    """SweepError when this worker's ``--set`` trains otherwise than the study's first
    worker's. A study made before they were stored takes this worker's (``record``; else
    nothing is compared), and is read back: of workers starting together, the last to
    write wins and the others compare."""
    if not isinstance(study.user_attrs.get(SETTINGS_ATTR), dict):
        if not record:
            return
        study.set_user_attr(SETTINGS_ATTR, training_settings(extra))
    # Compared as cofr fit reads them: `model.optimizer={eps: 1e-6}` is
    # `model.optimizer.eps=1.0e-6`.
    mine = training_settings(effective_settings(list(extra.items())))
    stored = study.user_attrs.get(SETTINGS_ATTR) or {}
    theirs = training_settings(effective_settings(list(stored.items())))
    changes = [
        f"{key} only in the study's" if key not in mine
        else f"{key} only in this worker's" if key not in theirs
        else f"{key}: {theirs[key]!r} in the study's, {mine[key]!r} here"
        for key in sorted(set(theirs) | set(mine))
        if key not in theirs or key not in mine or theirs[key] != mine[key]
    ]  # fmt: skip
    if changes:
        raise SweepError(
            f"study {study.study_name!r} was started with other --set settings "
            f"({_first_four(changes)}): "
            "its trials would be ranked against trials trained otherwise. Give the same "
            "--set as its first worker, or another study name (--study)"
        )


#: The merging version (:data:`fitconfig.MERGING_VERSION`) of the cofr that made a study:
#: true for 1 (mappings to groups of options merged with the settings beside them, as
#: :func:`fitconfig.option_settings` does, but not a mapping to ``model.optimizer``);
#: absent for 0 (an older one dropped the settings under a mapping given after them).
MERGED_ATTR = "cofr.group_mappings_merged"


def check_same_merging(study: optuna.Study, sweep: Sweep, extra: dict[str, Any]) -> None:
    """SweepError for a study made by a cofr that dropped settings this one keeps (the
    overrides or ``--set`` given before a mapping above them): its trials
    trained without them, this worker's would train with them."""
    version = int(study.user_attrs.get(MERGED_ATTR) or 0)
    if version >= MERGING_VERSION:
        return
    kept = kept_since_merging(config_settings(sweep, extra=extra), version)
    if kept:
        raise SweepError(
            f"study {study.study_name!r} was made by an older cofr, which dropped "
            f"{_first_four(kept)} (given before a mapping above them, such as `model: "
            "{...}` or `model.optimizer: {...}`); this cofr keeps them, so its trials "
            "would be ranked against trials trained otherwise. Give the sweep a new study "
            "name (study: ..., or --study NAME)"
        )


#: The data-parallel width (devices x nodes) of the study's trials.
WIDTH_ATTR = "cofr.data_parallel_width"


def check_same_width(study: optuna.Study, width: int | None, record: bool = True) -> None:
    """SweepError when this worker trains its trials on another number of devices x nodes
    than the study's: the global batch is that many times ``data.batch_size``, so its
    trials (and a ``tokens`` budget's steps, the ladders' release steps) would differ. A
    study made before widths were stored takes this worker's (``record``)."""
    if width is None:
        return
    theirs = study.user_attrs.get(WIDTH_ATTR)
    if not isinstance(theirs, int):
        if not record:
            return
        study.set_user_attr(WIDTH_ATTR, width)
        theirs = study.user_attrs.get(WIDTH_ATTR)
    if theirs != width:
        raise SweepError(
            f"study {study.study_name!r} trains each trial on {theirs} device(s) in all "
            f"(trainer.devices x trainer.num_nodes), this worker on {width}: the global "
            f"batch, hence the trials, would differ. Give this worker {theirs} device(s) "
            "(--set trainer.devices=N, --gpus-per-worker), or another study name (--study)"
        )


#: What the study's base files held: [{entry, path, sha256}], one per ``base:`` entry.
BASES_ATTR = "cofr.bases"


def base_digests(sweep: Sweep) -> list[dict[str, str]]:
    """Each ``base:`` entry of the sweep as written, the file this worker found for it,
    and the SHA-256 of what a trial reads for it: the settings of that file and of the
    bases it names itself, found as ``cofr fit`` finds them (parsed: a comment or a
    layout change is no other setting)."""
    import hashlib

    from cofrgenet.recipes import config_entries, load_yaml

    entries = sweep.raw.get("base") or []
    entries = [entries] if isinstance(entries, str) else list(entries)
    out = []
    for entry, path in zip(entries, sweep.base, strict=False):
        digest = hashlib.sha256()
        for _, files in config_entries(["--config", str(path)]):
            for file in files:  # a missing or broken one hashes as null: the parser says why
                settings = load_yaml(file)
                digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
        out.append({"entry": str(entry), "path": str(path), "sha256": digest.hexdigest()})
    return out


def check_same_bases(
    study: optuna.Study, bases: list[dict[str, str]] | None, record: bool = True
) -> None:
    """SweepError naming the first base file whose content differs from what the study's
    first worker read (another checkout, a copy in another working directory, an edit):
    its trials would train another config under the same sweep file. A study made before
    these were stored takes this worker's (``record``)."""
    if bases is None:
        return
    theirs = study.user_attrs.get(BASES_ATTR)
    if not isinstance(theirs, list):
        if record:
            study.set_user_attr(BASES_ATTR, bases)
        return
    for mine, first in zip(bases, theirs, strict=False):
        if not isinstance(first, dict) or mine["sha256"] == first.get("sha256"):
            continue
        where = (
            f"{mine['path']} here, {first.get('path')} for the study's first worker"
            if mine["path"] != first.get("path")
            else f"{mine['path']}, changed since the study's first worker read it"
        )
        raise SweepError(
            f"study {study.study_name!r}: base {mine['entry']} holds other settings "
            f"({where}): its trials would be ranked against trials trained otherwise. Give "
            "this worker the same file (the same checkout; a base named by an absolute path "
            "or ${VAR}), or another study name (--study)"
        )


def _first_four(changes: list[str]) -> str:
    more = f" and {len(changes) - 4} more" if len(changes) > 4 else ""
    return ", ".join(changes[:4]) + more


def _section_changes(section: str, old: Any, new: Any) -> list[str]:
    """What differs between two versions of a sweep file section, key by key."""
    if section == "base":  # `base: x.yaml` is `base: [x.yaml]`
        old, new = ([b] if isinstance(b, str) else list(b or []) for b in (old, new))
    old = {} if old is None else old
    new = {} if new is None else new
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return [] if old == new else [f"{section}: {old!r} -> {new!r}"]
    changes = []
    for key in sorted(set(old) | set(new), key=str):
        if key not in new:
            changes.append(f"{section}.{key} removed")
        elif key not in old:
            changes.append(f"{section}.{key} added")
        elif old[key] != new[key]:
            changes.append(f"{section}.{key}: {old[key]!r} -> {new[key]!r}")
    return changes


def check_data_folder(sweep: Sweep, probe: dict[str, Any]) -> None:
    """SweepError when the trials' data folder is not a prepared one, or a data setting is
    one the trials' data module refuses (``data.batch_size: 0``): every trial would fail
    on it, and each failure would use up the study's budget."""
    from cofrgenet.data.datamodule import DEFAULT_DATA_DIR, TokenDataModule
    from cofrgenet.data.meta import DataFolderError

    settings = dict(probe.get("data") or {})
    settings["data_dir"] = settings.get("data_dir") or DEFAULT_DATA_DIR
    if settings.get("block_size") is None:  # unset: the model's, any valid one here
        settings["block_size"] = 1
    where = sweep.path or sweep.study
    try:
        data = TokenDataModule(**settings)
    except DataFolderError as error:
        raise SweepError(f"{where}: data.data_dir: {error}") from None
    except UserError as error:
        raise SweepError(f"{where}: {error}") from None
    varied = {p.key for p in sweep.space}
    # A setting the space varies: trials whose model is too small fail alone.
    block = model_setting(probe, "block_size")
    given = (probe.get("data") or {}).get("block_size")
    fixed = not varied & {"model.preset", "model.config.block_size", "data.block_size"}
    if fixed and block is not None and given is not None and given > block:
        raise SweepError(
            f"{where}: data.block_size={given} exceeds the model's block_size={block}: "
            "every trial would fail on it; lower data.block_size or raise "
            "model.config.block_size"
        )
    if varied & {"model.preset", "model.config.vocab_size"}:
        return
    vocab = model_setting(probe, "vocab_size")
    if vocab is not None:
        try:
            data.check_vocab(vocab)
        except UserError as error:
            raise SweepError(f"{where}: {error}") from None


#: How long a worker waits for the worker that created the study to finish setting it up.
SETUP_TIMEOUT_S = 120.0


def setup_done(study: optuna.Study, points: int) -> bool:
    """Whether the creating worker has set the study's attributes and queued its grid's
    ``points`` (the last thing :func:`open_study` does for a new study)."""
    attrs = study.user_attrs
    if UID_ATTR not in attrs or "cofr.sweep" not in attrs:
        return False
    return points == 0 or len(study.get_trials(deepcopy=False)) >= points


#: A worker still waiting for the study's setup after this many seconds says so, once.
SETUP_NOTE_S = 1.0


def wait_for_setup(
    study: optuna.Study,
    sweep: Sweep,
    points: int,
    timeout: float | None = None,
    url: str | None = None,
) -> None:
    """Wait until the study is set up, its grid's ``points`` queued. Workers start
    together (a SLURM array): one that loses the race to create the study would
    otherwise find no queued grid point and leave at once, or run its trials without
    the study's id. ``url``: the storage's, for the command that deletes the study."""
    timeout = SETUP_TIMEOUT_S if timeout is None else timeout
    start = time.monotonic()
    said = False
    while not setup_done(study, points):
        waited = time.monotonic() - start
        if waited > timeout:
            delete = st.delete_study_command(sweep.study, url) if url else (
                f"optuna delete-study --study-name {sweep.study} --storage URL"
            )  # fmt: skip
            raise SweepError(
                f"study {sweep.study!r} exists but its setup never finished (the worker "
                f"that created it died, or the sweep's grid differs from the study's): "
                f"use another study name, or delete it ({delete})"
            )
        if waited > SETUP_NOTE_S and not said:  # a minute and more of silence otherwise
            said = True
            log.info(
                f"study {sweep.study!r} exists but is not set up yet: waiting up to "
                f"{timeout:g} s for the worker that created it"
            )
        time.sleep(0.2)


def next_trial(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    sweep: Sweep,
    worker: st.Worker,
    on_lost: Callable[[int, int | None], None] | None = None,
) -> tuple[optuna.Trial | None, bool]:
    """(trial, resumed): this worker's own unfinished trial, a queued one, a new one.

    ``storage``: the one the study was opened with (:func:`st.open_storage`). Trials whose
    worker is gone are failed first (and retried); ``on_lost(number, retry)`` for each.
    """
    options = sweep.storage_options
    for number, retry in st.fail_lost_trials(study, storage, options, worker.worker_id):
        note = f"retried as trial {retry}" if retry is not None else "no retries left"
        log.warning(f"trial {number}: its worker is gone; marked FAIL, {note}")
        if on_lost is not None:
            on_lost(number, retry)
    trials = study.get_trials(deepcopy=False)
    if worker.worker_id:
        for trial in trials:
            if (
                trial.state == TrialState.RUNNING
                and trial.user_attrs.get(st.WORKER_ID) == worker.worker_id
                # A live process with the same id (a second worker started in one SLURM
                # allocation by hand) still trains it: not a trial left by a requeue.
                and not st.held_by_live_process(trial)
            ):
                st.claim(storage, study, trial.number, worker)
                if trial.user_attrs.get(st.REQUEUED) is not None:  # back from the requeue
                    tid = st.trial_id(storage, study, trial.number)
                    storage.set_trial_user_attr(tid, st.REQUEUED, None)
                return st.open_trial(storage, study, trial.number), True
    while True:
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if not waiting and (sweep.is_grid or st.budget_used(trials) >= sweep.total_trials):
            return None, False
        with warnings.catch_warnings():
            # Optuna expects heartbeats under Study.optimize; the worker beats them itself.
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
            trial = study.ask()
        if sweep.is_grid and not _queued(st.frozen_trial(storage, study, trial.number)):
            # Another worker took the last queued point between get_trials and ask: ask
            # made a new trial, which the stand-by sampler would fill with a point that
            # runs already. Fail it untrained, counted for nothing, and look again.
            _discard(storage, study, trial.number)
            trials = study.get_trials(deepcopy=False)
            continue
        st.claim(storage, study, trial.number, worker)
        trial.set_user_attr(st.STARTED, time.time())
        return trial, False


def _queued(trial: optuna.trial.FrozenTrial) -> bool:
    """Whether a trial that ask() returned was queued (a grid point or a retry: its values
    fixed), rather than made new for the sampler to fill."""
    fixed = trial.system_attrs.get("fixed_params")
    return bool(fixed or trial.params or trial.user_attrs.get(st.GRID_POINT))


def _discard(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> None:
    tid = st.trial_id(storage, study, number)
    storage.set_trial_user_attr(tid, st.DISCARDED, True)
    reason = "not trained: no grid point was left (another worker took the last queued one)"
    st.fail_trial(storage, tid, reason)
    log.info(f"trial {number}: {reason}")


def study_done(study: optuna.Study, sweep: Sweep) -> bool:
    trials = study.get_trials(deepcopy=False)
    busy = any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    # A retry its worker was killed before queueing: the next worker queues it.
    busy = busy or bool(st.unqueued_retries(trials, sweep.storage_options.max_retry))
    return not busy and st.budget_used(trials) >= sweep.total_trials


def check_before_submit(
    sweep: Sweep,
    url: str,
    settings: dict[str, Any],
    data: bool,
    here: bool = True,
    probe: dict[str, Any] | None = None,
) -> None:
    """What ``cofr sweep run`` would refuse at once, checked by ``cofr sweep submit``
    before ``sbatch``: else every array task fails on it after the queue's wait. The
    study in ``url`` (when this host can read it: its file exists, or a database that
    answered) must be this sweep's (trials, objective) and have trials left; with
    ``data``, the trials' data folder (under ``settings``, the workers' ``--set``) must
    be a prepared one, as seen from the submit folder (the tasks' working folder). A
    database ``url`` is one the caller found reachable (:func:`~cofrgenet.sweeps.storage.check_reachable`).
    The workers' ``--set``, data-parallel width and base files must be the study's too
    (the base files only where the tasks run ``here``, in the submit folder: an
    ``--sbatch --chdir`` may have them read others)."""
    if probe is None:  # a trial's config at the space's first values (submit has it)
        probe = trial_config(sweep, {p.key: p.default() for p in sweep.space}, settings)
    if data:
        check_data_folder(sweep, probe)
    file = st.storage_file(url)
    if file is not None and not file.exists():
        return  # no study yet: the first task makes it
    # A database submit found reachable: read, not opened as a storage (which makes the
    # tables), until it is known to hold studies; the first task makes them.
    if st.journal_path(url) is None and not st.holds_studies(url):
        return
    storage = st.open_storage(url, sweep.storage_options)
    if sweep.study not in optuna.get_all_study_names(storage):
        return
    study = optuna.load_study(study_name=sweep.study, storage=storage)
    stored = study.user_attrs.get("cofr.sweep")
    if isinstance(stored, dict) and grown_grid(sweep, stored) is None:
        check_same_trials(sweep, stored)
    check_same_objective(study, sweep, "use another study name")
    check_same_merging(study, sweep, settings)
    # Read only: the study's first worker records these, not a submit.
    check_same_settings(study, settings, record=False)
    check_same_width(study, data_parallel_width(probe), record=False)
    if here:
        check_same_bases(study, base_digests(sweep), record=False)
    if study_done(study, sweep):
        raise SweepError(
            f"study {sweep.study!r} is done: its {sweep.total_trials} trials have run, so "
            f"workers would start none. {done_hint(sweep)}"
        )


def done_hint(sweep: Sweep) -> str:
    """How to get more trials out of a done study: ``n_trials`` in the sweep file bounds
    the study's trials (``--n-trials`` only a worker's)."""
    where = sweep.path or "the sweep file"
    if sweep.is_grid:
        return f"Add values to the grid's ranges in {where}, or give a new --study NAME"
    return (
        f"Raise n_trials in {where} to add trials (--n-trials bounds one worker's alone), "
        "or give a new --study NAME"
    )


@dataclass
class WorkerResult:
    study: optuna.Study
    outcomes: list[tuple[int, Outcome]] = field(default_factory=list)
    done: bool = False
    requeued: bool = False
    #: Why a requeue the worker stopped for was not made (then it exits 1: the job's
    #: state must not read as a success while its trial waits for a worker).
    not_requeued: str | None = None
    #: Set when the worker stopped because trials kept failing for one reason.
    failing: str | None = None
    #: 128 + the signal (SIGTERM, Ctrl-C) that stopped the worker during a trial.
    signal_status: int | None = None
    #: 128 + the signal that stopped the end-of-study report half-written.
    report_stopped: int | None = None

    @property
    def failed(self) -> list[Outcome]:
        """This worker's failed trials, interrupted ones (retried) and those another worker
        ended (its retry goes on with them) left out."""
        return [
            o
            for _, o in self.outcomes
            if o.state == TrialState.FAIL and not (o.retry or o.ended_elsewhere)
        ]

    @property
    def none_completed(self) -> bool:
        """Trials failed and none ended COMPLETE or PRUNED (and the worker did not stop
        for a requeue): ``cofr sweep run`` exits with 1."""
        finished = (TrialState.COMPLETE, TrialState.PRUNED)
        if self.requeued or not self.failed:
            return False
        return not any(o.state in finished for _, o in self.outcomes)


def _requeue_job(worker: st.Worker) -> str | None:
    """Ask SLURM to requeue this job; None once asked, else why it was not."""
    job = worker.slurm.get(st.SLURM_JOB)
    if worker.slurm.get(st.SLURM_ARRAY_JOB) and worker.slurm.get(st.SLURM_ARRAY_TASK):
        job = f"{worker.slurm[st.SLURM_ARRAY_JOB]}_{worker.slurm[st.SLURM_ARRAY_TASK]}"
    if not job or shutil.which("scontrol") is None:
        why = "this is not a SLURM job"
    else:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        if done.returncode == 0:
            log.info(f"requeued SLURM job {job}")
            return None
        why = f"scontrol requeue {job} failed: {done.stderr.strip() or done.returncode}"
    log.warning(f"stopped for a requeue, but {why}: run the worker again")
    return why


def _seed_offset(worker: st.Worker, worker_index: int | None) -> int:
    if worker_index is not None:
        return worker_index
    if worker.index is not None:
        return worker.index
    return worker.pid


def _tell(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    trial: optuna.Trial,
    outcome: Outcome,
    sweep: Sweep,
) -> bool:
    """Tell the study how ``trial`` ended; False when it had been ended already (another
    worker took it for lost), so that this outcome is not recorded."""
    now = st.frozen_trial(storage, study, trial.number)
    if now.state.is_finished():
        reason = now.user_attrs.get(st.FAIL_REASON)
        log.warning(
            f"trial {trial.number} was ended as {now.state.name} by another worker"
            f"{f' ({reason})' if reason else ''} while this one trained it: its "
            f"{outcome.state.name} here is not recorded"
        )
        return False
    if outcome.state == TrialState.FAIL:
        trial.set_user_attr(st.FAIL_REASON, outcome.reason or "?")
        if outcome.retry:  # before the FAIL: a kill before the retry is queued loses no point
            trial.set_user_attr(st.RETRY_WANTED, st.retry_intent())
            if outcome.signal_status is not None:  # a stop: not one of max_retry's attempts
                trial.set_user_attr(st.STOPPED, signal_name(outcome.signal_status))
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if outcome.retry:
            frozen = st.frozen_trial(storage, study, trial.number)
            max_retry = sweep.storage_options.max_retry
            retry = st.retry_trial(study, frozen, max_retry)
            if retry is not None:
                outcome.retried_as = retry
                log.warning(f"trial {trial.number} will be retried as trial {retry}")
            else:  # a failed trial now, and nothing resumes it
                outcome.retry = False
                outcome.reason = f"{outcome.reason}; no retries left (max_retry {max_retry})"
                log.warning(f"trial {trial.number}: no retries left (max_retry {max_retry})")
    elif outcome.state == TrialState.PRUNED:
        if outcome.reason:
            trial.set_user_attr(st.PRUNE_REASON, outcome.reason)
        study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
    else:
        study.tell(trial, outcome.value, skip_if_finished=True)
    return True


def run_worker(
    sweep: Sweep,
    n_trials: int | None = None,
    storage_url: str | None = None,
    runs_dir: str | None = None,
    extra: dict[str, Any] | None = None,
    worker_index: int | None = None,
    report: bool = True,
    mlflow: bool = True,
    again: str | None = None,
) -> WorkerResult:
    """Run trials of ``sweep`` until ``n_trials`` of this worker or the study's budget.
    ``again``: the command that goes on with the study (said on its MLflow run when the
    last worker leaves it unfinished; default: ``cofr sweep run <the sweep file>``)."""
    if n_trials is not None and n_trials < 1:  # would only create the study
        raise SweepError(f"n_trials for this worker must be >= 1, got {n_trials}")
    runs_dir = runs_dir or sweep.runs_dir
    home = st.home_storage(sweep, runs_dir)
    st.check_given_storage(storage_url, home, sweep.study)
    url = storage_url or home
    probe = _checked_trial_config(sweep, extra, mlflow)
    if idle_pruner := pruner_waits_past_budget(sweep):
        log.warning(idle_pruner)
    if mlflow:  # before the study is made: MLflow's client retries a dead server for minutes
        _check_tracking(sweep, runs_dir)

    worker = st.Worker.current()
    journal = st.journal_path(url)
    # As a sqlite file's: a journal named outside the runs folder must have its folder
    # there (a typo made folders, down from / for an absolute path); the runs folder's
    # own (the default journal's among them) are made.
    inside = journal is not None and journal.resolve().is_relative_to(Path(runs_dir).resolve())
    if journal is not None and not inside and not journal.parent.exists():
        raise SweepError(
            f"storage {url!r}: no folder {journal.parent} for the journal file (one in the "
            f"runs folder {runs_dir} is made)"
        )
    new_journal = journal is not None and not journal.exists()
    folder = st.study_folder(sweep, runs_dir)
    # Before the storage: a default journal's folder is the study folder (made there).
    made = [missing_folders(folder), missing_folders(journal.parent) if journal else []]
    storage = st.open_storage(url, sweep.storage_options)
    st.make_folder(folder, "the study's files", "--runs-dir or the sweep's runs_dir")
    try:
        check_not_stored_elsewhere(sweep, storage, url, runs_dir)
        study, created = open_study(
            sweep,
            storage,
            _seed_offset(worker, worker_index),
            extra,
            folder / ".grid.lock",
            width=data_parallel_width(probe),
            steps=budget_steps(sweep, probe),
            bases=base_digests(sweep),
            url=url,
        )
    except SweepError:
        # A refused worker leaves no journal or folder it made (an empty journal would
        # pass for the study's home; a folder another worker, starting too, wrote in stays).
        if new_journal and journal.exists() and journal.stat().st_size == 0:
            journal.unlink(missing_ok=True)
        for folders in made:
            remove_empty_folders(folders)
        raise
    client, parent = _parent_run(sweep, runs_dir, study, url) if mlflow else (None, None)
    stop_file = folder / "workers" / f"{worker.worker_id or worker.pid}.stop"
    stop_file.parent.mkdir(parents=True, exist_ok=True)
    ctx = TrialContext(
        sweep=sweep,
        study=study,
        storage=storage,
        storage_url=url,
        runs_dir=runs_dir,
        extra=dict(extra or {}),
        worker=worker,
        mlflow_client=client,
        parent_run_id=parent,
        stop_file=stop_file,
        # This process's own: two workers of one worker id (one SLURM job) must not stop
        # each other's fits.
        ended_file=folder / "workers" / f"{worker.host}-{worker.pid}.ended",
        run_mlflow=bool(get_dotted(probe, "run.mlflow", True)),
        track=mlflow,
    )
    log.info(
        f"worker {worker.label}: study {sweep.study} on {hide_passwords(url)} "
        f"({'created' if created else 'loaded'})"
    )
    result = WorkerResult(study)
    try:
        with _requeue_on_usr1(stop_file):
            _run_trials(ctx, result, n_trials)
    finally:
        with signals_held(*STOPS) as arrived:  # the study's MLflow run is settled whole
            if client is None and not mlflow:  # earlier workers' parent run: settled too
                client, parent = _recorded_parent_run(sweep, runs_dir, study)
            if client is not None and parent is not None:
                _settle_parent_run(client, parent, study, sweep, again)
        if arrived and result.signal_status is None:
            result.signal_status = _stop_status(arrived)

    result.done = study_done(study, sweep)
    if result.done and report:
        from cofrgenet.sweeps.report import write_report

        try:
            # SLURM's kill: said, not a silent half-written folder; its requeue warning
            # (SIGUSR1, whose default action kills too) asks nothing of a done study.
            with signals_held(signal.SIGUSR1), sigterm_raises():
                files = write_report(study, sweep, folder / "report", client, parent)
            log.info(f"study {sweep.study} done: report in {folder / 'report'} "
                     f"({', '.join(sorted(files))})")  # fmt: skip
        except (KeyboardInterrupt, Terminated) as stop:
            result.report_stopped = 130 if isinstance(stop, KeyboardInterrupt) else 143
        except Exception as error:
            log.warning(f"report failed: {type(error).__name__}: {error}")
    return result


def _settle_parent_run(
    client: Any, parent: str, study: optuna.Study, sweep: Sweep, again: str | None = None
) -> None:
    """The study's MLflow run as a leaving worker finds the study: FINISHED when it is
    done; KILLED, with the tag ``cofr.study_state`` saying how far it got, when no trial
    is running any more (the last worker left early: its ``--n-trials``, a stop, an
    error), so the UI shows no run as live that nobody works on; else left RUNNING.
    Never raises: it runs on the way out of an error too."""
    from cofrgenet.sweeps import tracking

    def running() -> bool:
        return any(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))

    try:
        if study_done(study, sweep):
            tracking.set_tags(client, parent, {tracking.STUDY_STATE_TAG: "complete"})
            tracking.set_parent_status(client, parent, "FINISHED")
        elif not running():
            used = st.budget_used(study.get_trials(deepcopy=False))
            where = f" {sweep.path}" if sweep.path else ""
            state = (
                f"stopped at {used} of {counted(sweep.total_trials, 'trial')}: "
                f"`{again or f'cofr sweep run{where}'}` goes on"
            )
            tracking.set_tags(client, parent, {tracking.STUDY_STATE_TAG: state})
            tracking.set_parent_status(client, parent, "KILLED")
            if running():  # another worker took a trial meanwhile: the study is live
                tracking.mark_parent_running(client, parent)
    except Exception as error:  # the storage or the server is gone: the run stays as it was
        log.warning(f"the study's MLflow run {parent} was left as it was: {error}")


def _recorded_parent_run(sweep: Sweep, runs_dir: str, study: optuna.Study) -> tuple[Any, Any]:
    """(client, parent run) of the study's MLflow run that earlier workers made, for a
    worker under --no-mlflow to settle on its way out (a last worker that leaves it
    RUNNING leaves it so for good): when the study names one, in the store this worker
    would log to, which the study records as that run's. (None, None) otherwise; never
    raises, nor makes a store."""
    parent = study.user_attrs.get(PARENT_ATTR)
    if parent is None:
        return None, None
    from cofrgenet.sweeps import tracking

    try:
        run = tracking.run_config(sweep, runs_dir)
        recorded = study.user_attrs.get(tracking.PARENT_STORE_ATTR)
        if recorded is not None and recorded != hide_passwords(tracking.tracking_uri(run)):
            log.info(f"the study's MLflow run {parent} is in {recorded}: left as it is")
            return None, None
        client = tracking.existing_client(run)
        if client is None or tracking.run_missing(client, parent):
            return None, None
        return client, parent
    except Exception as error:  # tracking trouble must not stop the worker's way out
        log.warning(f"the study's MLflow run {parent} was left as it was: {error}")
        return None, None


def _checked_trial_config(
    sweep: Sweep, extra: dict[str, Any] | None, mlflow: bool
) -> dict[str, Any]:
    """The config of a trial at the space's defaults, after checking that the sweep's
    trials could train as asked.

    Fails fast, before the study exists: a --set the sweep overrides, a key that is not
    cofr fit's (a typo), a config that does not parse (open_storage then refuses a storage
    URL that is none), a model or optimizer value out of range, a missing data folder.
    """
    check_extra(sweep, extra, mlflow)
    check_keys(sweep, extra)
    try:
        probe = trial_config(sweep, {p.key: p.default() for p in sweep.space}, extra)
        check_model_values(sweep, probe)
        check_optimizer_values(sweep, probe)
        check_budget(sweep, probe)
        check_validates(sweep, probe)
        for warning in (pruning_before_ladders(sweep, probe), pruner_idle_in_budget(sweep, probe)):
            if warning is not None:
                log.warning(warning)
    except SweepError as error:
        where = str(sweep.path or sweep.study)
        given = [key for key in (extra or {}) if key in str(error)]  # a --set of the user's
        if given:
            where += f" with --set {given[0]}={(extra or {})[given[0]]}"
        raise SweepError(f"{where}: {error}") from None
    check_data_folder(sweep, probe)
    return probe


def _check_tracking(sweep: Sweep, runs_dir: str) -> None:
    """One line, before any work, for a tracking store MLflow cannot use or a server that
    does not answer (:func:`~cofrgenet.training.run_store.check_tracking_uri`)."""
    from cofrgenet.sweeps import tracking
    from cofrgenet.training.run_store import check_tracking_uri

    uri = tracking.tracking_uri(tracking.run_config(sweep, runs_dir))
    fix = "fix the sweep's tracking_uri (or MLFLOW_TRACKING_URI), or run with --no-mlflow"
    check_tracking_uri(uri, fix=fix)


def _parent_run(sweep: Sweep, runs_dir: str, study: optuna.Study, url: str) -> tuple[Any, str]:
    """The MLflow client and the study's parent run (created by the first worker), RUNNING
    unless the study is done."""
    from cofrgenet.sweeps import tracking

    run = tracking.run_config(sweep, runs_dir)
    client = tracking.client_for(run)
    # One parent run per study: created under a lock beside the run store, so workers that
    # start together on a new study make one (the study attribute names it).
    lock = Path(runs_dir) / ".sweep-parent.lock"
    with waiting_for(
        lock, "making the study's MLflow parent run (workers starting together may each make one)"
    ):
        parent = study.user_attrs.get(PARENT_ATTR)
        if parent is not None and tracking.run_missing(client, parent):
            # Trials would name a parent this store does not have (not nested in the UI).
            log.warning(
                f"the study's MLflow parent run {parent} is not in "
                f"{hide_passwords(tracking.tracking_uri(run))} (tracking_uri changed, or "
                "the store was removed): a new parent run is made there"
            )
            parent = None
        if parent is None:
            made = tracking.create_parent(client, run, sweep, hide_passwords(url))
            parent = tracking.settle_parent(client, run, sweep, hide_passwords(url), made)
            study.set_user_attr(PARENT_ATTR, parent)
        else:
            tracking.update_parent(client, parent, sweep)
        store = hide_passwords(tracking.tracking_uri(run))
        if study.user_attrs.get(tracking.PARENT_STORE_ATTR) != store:
            study.set_user_attr(tracking.PARENT_STORE_ATTR, store)
    if not study_done(study, sweep):  # live again: without the tag of an earlier stop
        tracking.mark_parent_running(client, parent)
    return client, parent


@contextlib.contextmanager
def _requeue_on_usr1(stop_file: Path) -> Iterator[None]:
    """SIGUSR1 (SLURM's warning before a time limit) asks for a requeue: it sets
    ``REQUEUE`` and touches ``stop_file``, which the training trial polls."""

    def on_usr1(signum: int, frame: Any) -> None:
        REQUEUE.set()
        with contextlib.suppress(OSError):
            stop_file.touch()

    stop_file.unlink(missing_ok=True)
    previous = signal.signal(signal.SIGUSR1, on_usr1)
    REQUEUE.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)
        stop_file.unlink(missing_ok=True)


#: The signals that stop a worker: between trials they wait for its bookkeeping.
STOPS = (signal.SIGINT, signal.SIGTERM)


def _stop_status(arrived: set[int]) -> int:
    """The exit status of a worker stopped by the signals ``arrived`` (SIGTERM's first)."""
    return 128 + (signal.SIGTERM if signal.SIGTERM in arrived else signal.SIGINT)


def _run_trials(ctx: TrialContext, result: WorkerResult, n_trials: int | None) -> None:
    """Take and train trials until ``n_trials``, the study's budget, a requeue, a signal or
    a run of identical failures; each outcome goes to ``result``.

    A SIGTERM or Ctrl-C between trials (taking one, telling the study how one ended)
    waits for that to finish, then stops the worker as one during a trial does: a trial
    it had taken is failed for a retry. Before, it killed the worker there, leaving the
    trial RUNNING until taken for lost, the study's MLflow run RUNNING, and no word."""
    study, storage, sweep, worker = ctx.study, ctx.storage, ctx.sweep, ctx.worker
    while n_trials is None or len(result.outcomes) < n_trials:
        with signals_held(*STOPS) as arrived:
            if REQUEUE.is_set():  # SIGUSR1 between trials: come back after the requeue
                result.requeued = True
                result.not_requeued = _requeue_job(worker)
                return
            trial, resumed = next_trial(
                study, storage, sweep, worker, lambda n, retry: _end_lost_run(ctx, n, retry)
            )
        if arrived and trial is None:
            result.signal_status = _stop_status(arrived)
            return
        if trial is None:
            return
        if arrived:
            status = _stop_status(arrived)
            outcome = _stopped_before_training(status, f"by {signal_name(status)} as it was taken")
        else:
            log.info(f"trial {trial.number}: {'resuming' if resumed else 'starting'}")
            interval = sweep.storage_options.heartbeat_interval
            try:
                # run_trial's own handlers cover its waits and its fit; this one the rest.
                with (
                    sigterm_raises(),
                    st.Heartbeat(storage, study, trial.number, interval, ctx.ended_file),
                ):
                    outcome = run_trial(ctx, trial)
            except (KeyboardInterrupt, Terminated) as stop:
                status = 130 if isinstance(stop, KeyboardInterrupt) else 143
                outcome = _stopped_before_training(status, f"by {signal_name(status)}")
        with signals_held(*STOPS) as arrived:
            stop_worker = _record(ctx, result, trial, outcome)
        if arrived and result.signal_status is None:
            result.signal_status = _stop_status(arrived)
            return
        if stop_worker:
            return


#: The end of the reason of a trial a signal stopped before its fit began.
STOPPED_BEFORE_FIT = "before its fit began"


def _stopped_before_training(status: int, how: str) -> Outcome:
    """A trial a signal stopped before its fit began: failed for a retry, and the worker
    stops with ``status``."""
    reason = f"stopped {how} {STOPPED_BEFORE_FIT}"
    return Outcome(
        TrialState.FAIL, reason=reason, retry=True, stop_worker=True, signal_status=status
    )


def _record(ctx: TrialContext, result: WorkerResult, trial: optuna.Trial, outcome: Outcome) -> bool:
    """Tell the study how ``trial`` ended and note it in ``result``; True when the worker
    stops after it."""
    study, storage, sweep, worker = ctx.study, ctx.storage, ctx.sweep, ctx.worker
    result.outcomes.append((trial.number, outcome))
    if outcome.requeue:
        if not outcome.ended_elsewhere:  # a finished trial takes no attributes
            trial.set_user_attr(st.REQUEUED, time.time())
        result.requeued = True
        result.not_requeued = _requeue_job(worker)
        if result.not_requeued is not None and not outcome.ended_elsewhere:
            _fail_for_a_retry(ctx, trial, outcome, result.not_requeued)
        return True
    if outcome.ended_elsewhere:
        pass  # the trial and its MLflow run are its retry's: nothing to record
    elif not _tell(study, storage, trial, outcome, sweep):
        outcome.reason = "; ".join(
            filter(None, [outcome.reason, "not recorded: another worker ended it first"])
        )
    elif outcome.state == TrialState.FAIL:
        _note_retry(ctx, outcome)
    value = "" if outcome.value is None else f" value {outcome.value:.6g}"
    why = f" ({outcome.reason})" if outcome.reason else ""
    log.info(f"trial {trial.number}: {outcome.state.name}{value}{why}")
    if outcome.stop_worker:
        result.signal_status = outcome.signal_status
        return True
    if _same_failures(result.outcomes) >= MAX_SAME_FAILURES:
        result.failing = outcome.reason
        log.error(
            f"the last {MAX_SAME_FAILURES} trials failed for the same reason; stopping "
            f"this worker: {outcome.reason}"
        )
        return True
    return False


def _fail_for_a_retry(ctx: TrialContext, trial: optuna.Trial, outcome: Outcome, why: str) -> None:
    """A trial saved for a requeue that will not come (SIGUSR1 outside SLURM, scontrol
    refused): failed with a retry now, as a SIGTERM's stop is. Left RUNNING for the
    requeue, the next worker waited out the grace period before resuming it."""
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # _tell says it
        trial.set_user_attr(st.REQUEUED, None)
    outcome.state, outcome.retry = TrialState.FAIL, True
    outcome.signal_status = 128 + signal.SIGUSR1  # a stop: not one of max_retry's attempts
    outcome.reason = f"{outcome.reason}, but {why}"
    if _tell(ctx.study, ctx.storage, trial, outcome, ctx.sweep):
        finish_mlflow(ctx, outcome)  # left KILLED for the requeue: failed, for its retry
    log.info(f"trial {trial.number}: {outcome.state.name} ({outcome.reason})")


def _note_retry(ctx: TrialContext, outcome: Outcome) -> None:
    """Tag a failed trial's MLflow run with the trial queued to resume it (the run ended
    FAILED before the retry was queued). An attempt that failed before it reached the
    run (a retry's, whose earlier attempt's tag named it) moves the tag to its own retry,
    or drops it: the run would read "retried" for good."""
    from cofrgenet.sweeps import tracking

    client = ctx.mlflow_client
    if client is None or (outcome.mlflow_run is not None and outcome.retried_as is None):
        return  # no tracking, or the run's end (finish_child) dropped the tag already
    try:
        run_id = outcome.mlflow_run
        if run_id is None and outcome.run_dir is not None:
            run_id = tracking.run_id_in(outcome.run_dir)
        if run_id is None:
            return
        if outcome.retried_as is not None:
            tracking.set_tags(client, run_id, {tracking.RETRIED_AS_TAG: outcome.retried_as})
        elif tracking.RETRIED_AS_TAG in client.get_run(run_id).data.tags:
            client.delete_tag(run_id, tracking.RETRIED_AS_TAG)
    except Exception as error:  # tracking trouble must not stop the worker
        log.warning(f"MLflow: {error}")


def _end_lost_run(ctx: TrialContext, number: int, retry: int | None) -> None:
    """End the MLflow run of a trial failed as lost FAILED, with why: it would read
    RUNNING until a retry resumes it, or for ever without one."""
    if ctx.mlflow_client is None:
        return
    from cofrgenet.sweeps import tracking

    frozen = st.frozen_trial(ctx.storage, ctx.study, number)
    run_dir = frozen.user_attrs.get(RUN_DIR_ATTR)
    reason = str(frozen.user_attrs.get(st.FAIL_REASON) or "its worker is gone")
    reason += f"; retried as trial {retry}" if retry is not None else "; no retries left"
    try:
        run_id = tracking.run_id_in(Path(run_dir)) if run_dir else None
        if run_id is not None:  # None: lost before its run was made
            outcome = Outcome(TrialState.FAIL, reason=reason, retried_as=retry)
            tracking.finish_child(ctx.mlflow_client, run_id, outcome)
    except Exception as error:  # tracking trouble must not stop the worker
        log.warning(f"MLflow: {error}")


#: Failures that depend on the sampled point (a learning rate that diverges, a model too
#: big for the GPU, values that build no model together): the study goes on past any
#: number of them, as it would past bad values.
POINT_FAILURES = (NON_FINITE, "out of memory:", NO_MODEL_HERE)


def _same_failures(outcomes: list[tuple[int, Outcome]]) -> int:
    """How many of the latest outcomes in a row are failures for the latest's reason
    (:func:`failure_kind`: the same error naming another trial's folder is the same
    reason); 0 when the latest is a :data:`POINT_FAILURES` one."""
    count = 0
    latest = failure_kind(outcomes[-1][1].reason) if outcomes else ""
    for _, outcome in reversed(outcomes):
        if outcome.ended_elsewhere:  # another worker's doing, not a failure here
            continue
        reason = outcome.reason or ""
        if outcome.state != TrialState.FAIL or reason.startswith(POINT_FAILURES):
            break
        if failure_kind(reason) != latest:
            break
        count += 1
    return count


def failure_kind(reason: str | None) -> str:
    """A failure's reason without what differs from trial to trial: paths (each trial's
    checkpoint), numbers and nan/inf (the step, the size an allocation asked for)."""
    kind = re.sub(r"\S*[/\\]\S*", "<path>", reason or "")
    return re.sub(r"-?\b(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)\b", "<n>", kind)


def print_summary(result: WorkerResult, out: Any = sys.stdout) -> None:
    for number, outcome in result.outcomes:
        value = "" if outcome.value is None else f" value={outcome.value:.6g}"
        why = f" ({outcome.reason})" if outcome.reason else ""
        print(f"trial {number}: {outcome.state.name}{value}{why}", file=out)
    if result.done:
        print(f"study {result.study.study_name}: done", file=out)

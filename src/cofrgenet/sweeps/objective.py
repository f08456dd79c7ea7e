"""One trial: the sampled config, trained in-process through ``cofr fit``'s LightningCLI.

The objective is reported to Optuna at every validation at the trainer's *global step*
(not per epoch), so pruners see the curve at the granularity it is validated. Trials
that fail (NaN loss, out of memory, a sampled config the model rejects) end FAIL with
their reason in the ``fail_reason`` user attribute; the worker goes on.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import shlex
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from lightning.pytorch import Callback, LightningModule, Trainer
from optuna.trial import TrialState

from cofrgenet.atomic import write_text_atomic
from cofrgenet.dotted import get_dotted
from cofrgenet.errors import is_out_of_memory
from cofrgenet.redact import hide_passwords
from cofrgenet.signals import lightning_sigterm, signal_name, signals_held, sigterm_raises
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.fitconfig import checked_config, model_problem, trial_words
from cofrgenet.sweeps.spec import Sweep, SweepError
from cofrgenet.training import checkpoints
from cofrgenet.training.callbacks import (
    NonFiniteLossGuard,
    StepBoundaries,
    StopOnSignal,
    late_stop,
    validates_after_this_step,
)
from cofrgenet.training.cli import CofrCLI, given_args, stop_status
from cofrgenet.training.lightning_cli import with_default_plugin
from cofrgenet.training.runlock import RunFolderBusyError, RunLock
from cofrgenet.training.tracking import CofrMLFlowLogger

TRIAL_FILE = "trial.json"
PRUNED_AT, REQUEUED_AT, LAST_REPORT = "cofr.pruned_at", "cofr.stopped_at", "cofr.last_report"
UID_ATTR = "cofr.uid"
#: The reason's start for a trial whose sampled values build no model together
#: (``n_head 7`` drawn beside a width of 64): that point fails, the sweep goes on.
NO_MODEL_HERE = "no model at this point:"
#: The reason's start for a trial whose loss went NaN or inf, in training or in its final
#: objective: it depends on the sample (a diverging learning rate), the sweep goes on.
NON_FINITE = "non-finite loss:"

#: Set by the worker's SIGUSR1 handler: save, stop and leave the trial for a requeue.
REQUEUE = threading.Event()


@dataclass
class Outcome:
    state: TrialState
    value: float | None = None
    reason: str | None = None
    #: The optimizer step ``value`` was measured at.
    step: int | None = None
    #: The worker must stop after this trial (SIGTERM, Ctrl-C, requeue).
    stop_worker: bool = False
    #: Queue a retry of this failed trial (it was interrupted, not wrong).
    retry: bool = False
    #: The trial queued to go on with this failed one, once queued.
    retried_as: int | None = None
    requeue: bool = False
    run_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: A signal stopped the trial: the status the worker exits with (128 + its number).
    signal_status: int | None = None
    #: Another worker ended the trial while it trained here (it took this worker for
    #: lost): neither the study nor the MLflow run hear of this attempt's end.
    ended_elsewhere: bool = False
    #: The trial's MLflow run, once made (for an end told after the trial's own).
    mlflow_run: str | None = None


#: The reason of an attempt whose trial another worker ended while it trained.
ENDED_ELSEWHERE = "ended by another worker, which took this one for lost"


def trial_name(number: int) -> str:
    return f"trial-{number:04d}"


#: The trial attribute that names its run folder (as the worker saw it: --runs-dir).
RUN_DIR_ATTR = "cofr.run_dir"


def trial_run_dir(sweep: Sweep, runs_dir: str | Path, root: int) -> Path:
    """The run folder of the trial whose first attempt is number ``root``.

    ``<runs_dir>/<experiment>/trial-NNNN``; when the sweep names an experiment other than
    its study, ``<study>-trial-NNNN``: studies that share an experiment (one sweep file
    run as several studies with ``--study``) must not share their trials' checkpoints.
    """
    name = trial_name(root)
    if sweep.experiment != sweep.study:
        name = f"{sweep.study}-{name}"
    return Path(runs_dir) / sweep.experiment / name


class PruneAtStep(StepBoundaries):
    """Report ``monitor`` to the Optuna trial after each validation, at the global step.

    Prunes by stopping the trainer (the run ends normally, its MLflow run is kept); the
    objective then tells PRUNED. Also stops, after saving ``last.ckpt``, when the worker
    got SIGUSR1 (SLURM's warning before the time limit) or ``stop_file`` appears, and
    when ``ended_file`` appears: another worker ended the trial, and its retry resumes
    from that checkpoint (:class:`~cofrgenet.sweeps.storage.Heartbeat`).
    Under several devices rank 0 talks to Optuna and broadcasts the decisions. Picklable
    (``ddp_spawn``): ranks in other processes reopen the storage from its URL, with the
    study's pruner (``pruner``; default the trial's study's), not Optuna's default one.
    """

    def __init__(
        self,
        trial: optuna.Trial,
        monitor: str,
        storage_url: str,
        study_name: str,
        stop_file: str | None = None,
        pruner: optuna.pruners.BasePruner | None = None,
        ended_file: str | None = None,
    ) -> None:
        self._trial: optuna.Trial | None = trial
        self.pruner = trial.study.pruner if pruner is None else pruner
        self.number = trial.number
        self.monitor = monitor
        self.storage_url = storage_url
        self.study_name = study_name
        self.stop_file = stop_file
        self.ended_file = ended_file
        self.last_step: int | None = None
        self.last_value: float | None = None
        self.pruned_at: int | None = None
        self.requeued_at: int | None = None
        #: The step at which the fit stopped because another worker ended the trial.
        self.ended_at: int | None = None
        self.start_step: int | None = None
        #: The storage failed a prune check already: said once, not at every validation.
        self.prune_check_failed = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_trial"] = None
        state["_remote"] = True  # unpickled in another process (ddp_spawn)
        return state

    _remote = False

    def _share(self, key: str, value: Any) -> None:
        """In a spawned rank, leave what the worker must know in the trial's attributes
        (not in one another worker ended: its worker learns that from the storage)."""
        if self._remote:
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self.trial.set_user_attr(key, value)

    def recover(self, storage: optuna.storages.BaseStorage, study: optuna.Study) -> None:
        """After a ``ddp_spawn`` fit: read back what rank 0 decided in its process."""
        attrs = st.frozen_trial(storage, study, self.number).user_attrs
        if self.pruned_at is None:
            self.pruned_at = attrs.get(PRUNED_AT)
        if self.requeued_at is None:
            self.requeued_at = attrs.get(REQUEUED_AT)
        if self.last_step is None and attrs.get(LAST_REPORT):
            self.last_step, self.last_value = attrs[LAST_REPORT]

    @property
    def trial(self) -> optuna.Trial:
        if self._trial is None:
            storage = st.open_storage(self.storage_url)
            study = optuna.load_study(
                study_name=self.study_name, storage=storage, pruner=self.pruner
            )
            self._trial = st.open_trial(storage, study, self.number)
        return self._trial

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start_step = trainer.global_step
        if trainer.is_global_zero and trainer.global_step > 0:
            # A trial another worker ended meanwhile trains until its heartbeat says so.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self.trial.set_user_attr(st.RESUMED, int(trainer.global_step))
            # A retry resumed from its attempt's checkpoint: the attempt's scores up to
            # there are its own (the pruner compares whole curves of completed trials);
            # past there it trains again, and reports anew.
            earlier = self.trial.user_attrs.get(st.ATTEMPT_SCORES) or {}
            for step, value in sorted((int(k), v) for k, v in earlier.items()):
                if step <= trainer.global_step:
                    self.report_score(value, step)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self.ended_at is not None:
            return
        metric = trainer.callback_metrics.get(self.monitor)
        step = trainer.global_step
        prune = False
        if metric is not None and trainer.is_global_zero:
            value = float(metric)
            self.last_step, self.last_value = step, value
            self._share(LAST_REPORT, [step, value])
            self.report_score(value, step)
            # At the budget's last step pruning saves nothing: the trial is complete, with
            # its value (PRUNED there left trained trials out of the results).
            # (max_steps, or the steps its epochs hold where max_epochs bounds the fit)
            bound = (
                trainer.max_steps if trainer.max_steps > 0 else trainer.estimated_stepping_batches
            )
            last = 0 < bound <= step
            prune = not last and self._should_prune(step)
        self.last_step = step if metric is not None else self.last_step
        if trainer.world_size > 1:
            prune = trainer.strategy.broadcast(prune, src=0)
        if prune:
            self.pruned_at = step
            if trainer.is_global_zero:
                self._share(PRUNED_AT, step)
            trainer.should_stop = True
        elif self._requeue_after_validation:  # scored: now the requeue's save and stop
            self._save_and_stop(trainer, ended=False)

    def report_score(self, value: float, step: int) -> None:
        """Report a score; a step already reported (by the resumed checkpoint's attempt)
        keeps its score: Optuna ignores the second one, and would say so each time."""
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The reported value is ignored")
            self.trial.report(value if math.isfinite(value) else float("nan"), step)

    def _should_prune(self, step: int) -> bool:
        """The pruner's decision; False when it cannot read the study (a database or
        NFS blip): a healthy trial must not fail for it, the next validation asks again."""
        try:
            return self.trial.should_prune()
        except Exception as error:
            if not service_error(error):  # a pruner's bug: not hidden for the whole study
                raise
            if not self.prune_check_failed:
                self.prune_check_failed = True
                logging.getLogger("cofrgenet.sweeps").warning(
                    f"trial {self.number}: the pruner could not read the study at step "
                    f"{step} ({type(error).__name__}: {str(error)[:200]}); not pruned "
                    "there, it judges again at the next validation (said once per trial)"
                )
            return False

    def _stop_requested(self) -> bool:
        return REQUEUE.is_set() or bool(self.stop_file and os.path.exists(self.stop_file))

    def on_step_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Not inside a gradient accumulation: a checkpoint there would resume past
        # micro-batches whose gradients it does not hold.
        stop = self._stop_requested() if trainer.is_global_zero else False
        ended = bool(self.ended_file and os.path.exists(self.ended_file))
        if trainer.world_size > 1:
            stop, ended = trainer.strategy.broadcast((stop, ended), src=0)
        if not (stop or ended) or self.requeued_at is not None or self.ended_at is not None:
            return
        if stop and not ended and validates_after_this_step(trainer):
            # Saved now, before this step's validation, the resumed trial would take it as
            # done (Lightning does) and the pruner would never see that score: the
            # requeue waits for it (on_validation_end). An ended trial stops at once: its
            # retry trains on.
            self._requeue_after_validation = True
            return
        self._save_and_stop(trainer, ended)

    _requeue_after_validation = False  # a requeue asked in a step that a validation follows

    def _save_and_stop(self, trainer: Trainer, ended: bool) -> None:
        self._requeue_after_validation = False
        folder = Path(trainer.default_root_dir) / "checkpoints"
        trainer.save_checkpoint(folder / "last.ckpt", weights_only=False)
        trainer.should_stop = True
        # Lightning validates before a requested stop: minutes of SLURM's warning, or of
        # the retry's wait, for a score off the trial's schedule.
        trainer.limit_val_batches = 0
        if ended:  # the trial is its retry's now, and so is its MLflow run
            self.ended_at = trainer.global_step
            for logger in trainer.loggers:
                if isinstance(logger, CofrMLFlowLogger):
                    logger.hand_over()
            return
        self.requeued_at = trainer.global_step
        if trainer.is_global_zero:
            self._share(REQUEUED_AT, trainer.global_step)


class SweepCLI(CofrCLI):
    """``cofr fit`` with the sweep's callbacks and, under SLURM, no Lightning requeue.

    A sweep worker is one process: SLURM's allocation is not a Lightning process group,
    and SIGUSR1 is handled by the worker (see PruneAtStep), so the trainer gets a plain
    LightningEnvironment.
    """

    run_id_from_caller = True  # the trial's MLflow child run, made by sweeps.tracking
    own_cluster_environment = True  # build_trainer's LightningEnvironment

    def check_steps_left(
        self, checkpoint: str, step: int | None, saved: dict[str, Any] | None = None
    ) -> None:
        """A retried trial whose checkpoint is at its last step (the worker died before
        the study heard of it) is measured as it stands: no check."""

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        from lightning.fabric.plugins.environments import ClusterEnvironment
        from lightning.pytorch.plugins.environments import LightningEnvironment

        config["plugins"] = with_default_plugin(
            config.get("plugins"), ClusterEnvironment, LightningEnvironment
        )
        configured = config.get("callbacks") or []
        for callback in [
            *(configured if isinstance(configured, list) else [configured]),
            *callbacks,
        ]:
            if isinstance(callback, NonFiniteLossGuard):  # the sweep's or one the file lists
                callback.restart_hint = False  # a trial is started again by no one's hand
        return super().build_trainer(config, callbacks)


@dataclass
class TrialContext:
    """What every trial of one worker shares."""

    sweep: Sweep
    study: optuna.Study
    #: The storage the study was opened with (st.open_storage), for trial-level writes.
    storage: optuna.storages.BaseStorage
    storage_url: str
    runs_dir: str
    extra: dict[str, Any]
    worker: st.Worker
    mlflow_client: Any = None
    parent_run_id: str | None = None
    stop_file: Path | None = None
    #: ``run.mlflow`` of the sweep's config: child runs for trials (even unparsable ones).
    run_mlflow: bool = True
    #: False (``cofr sweep run --no-mlflow``): the trials' fits track nothing either.
    track: bool = True
    #: Touched by the trial's heartbeat when another worker ended the trial (see
    #: :class:`~cofrgenet.sweeps.storage.Heartbeat`); the fit polls it.
    ended_file: Path | None = None

    def trial_ended(self, number: int) -> bool:
        """Whether another worker ended trial ``number`` (which this one trains): its
        heartbeat said so (``ended_file``), or the storage says so now. False when the
        storage cannot be read: the worker's own tell finds out then."""
        if self.ended_file is not None and self.ended_file.exists():
            return True
        try:
            return st.frozen_trial(self.storage, self.study, number).state.is_finished()
        except Exception:
            return False


def trial_of_this_name(sweep: Sweep, runs_dir: str | Path) -> tuple[Path, str | None] | None:
    """(a trial folder in the runs folder made by a study of this sweep's name, whatever
    its storage; that storage as its trial.json records it, a password hidden, None in
    folders from before it was recorded), or None."""
    first = trial_run_dir(sweep, runs_dir, 0)
    every = first.name.replace(trial_name(0), "trial-*")  # also those moved aside (.old-)
    for marker in sorted(first.parent.glob(f"{every}/{TRIAL_FILE}")):
        try:
            owner = json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and owner.get("study") == sweep.study:
            storage = owner.get("storage")
            return marker.parent, storage if isinstance(storage, str) else None
    return None


def _claim_folder(run_dir: Path, identity: dict[str, Any]) -> None:
    """Make ``run_dir`` this trial's: a folder left by another study is moved aside."""
    marker = run_dir / TRIAL_FILE
    if run_dir.exists():
        try:
            owner = json.loads(marker.read_text())
        except (OSError, ValueError):
            owner = None
        same = owner is not None and all(
            owner.get(k) == identity[k] for k in ("study", "uid", "root_number")
        )
        if not same:
            # Not from under a process that trains in it (RunFolderBusyError names it).
            lock = RunLock(run_dir)
            lock.acquire()
            aside = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
            logging.getLogger("cofrgenet.sweeps").warning(
                f"{run_dir} belongs to another study: moved to {aside}"
            )
            try:  # moved while held: no process can start in it on the way
                run_dir.rename(aside)
            finally:
                lock.release()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, json.dumps(identity, indent=2, default=str) + "\n")


def classify(error: BaseException) -> tuple[str, bool, bool, int | None]:
    """(reason, retry, stop_worker, signal_status) of an exception raised by a trial;
    signal_status: 128 + the signal that stopped it, read as ``cofr fit`` reads it
    (:func:`~cofrgenet.training.cli.stop_status`), else None."""
    from cofrgenet.training.callbacks import NonFiniteLossError

    # A bare KeyboardInterrupt() has no message: its name alone, not "KeyboardInterrupt:".
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    status = stop_status(error)
    if status == 128 + signal.SIGINT:
        return "worker interrupted (Ctrl-C) during the trial", True, True, status
    if status is not None:
        return f"worker terminated ({signal_name(status)}) during the trial", True, True, status
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        return f"worker interrupted during the trial ({text})", True, True, None
    if isinstance(error, NonFiniteLossError):
        return f"{NON_FINITE} {error}", False, False, None
    if isinstance(error, RunFolderBusyError):  # taken between the wait and the fit's lock
        return text, True, False, None
    if is_out_of_memory(error):
        return f"out of memory: {error}", False, False, None
    return text, False, False, None


def _free_memory() -> None:
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def failed_outcome(error: BaseException, run_dir: Path) -> Outcome:
    """The FAIL outcome of a trial that ``error`` ended (:func:`classify` says how)."""
    reason, retry, stop, status = classify(error)
    return Outcome(
        TrialState.FAIL,
        reason=reason,
        retry=retry,
        stop_worker=stop,
        run_dir=run_dir,
        signal_status=status,
    )


def run_trial(ctx: TrialContext, trial: optuna.Trial) -> Outcome:
    """Train one trial and say how it ended (the worker tells Optuna)."""
    sweep, study = ctx.sweep, ctx.study
    frozen = st.frozen_trial(ctx.storage, study, trial.number)
    # What a ddp_spawn rank of an earlier attempt left (PruneAtStep.recover reads them):
    # a resumed attempt decides afresh.
    for key in (PRUNED_AT, REQUEUED_AT, LAST_REPORT):
        if frozen.user_attrs.get(key) is not None:
            trial.set_user_attr(key, None)
    root = st.root_number(frozen)
    run_dir = trial_run_dir(sweep, ctx.runs_dir, root)
    if root != trial.number:
        run_dir = first_attempt_folder(ctx, trial.number, root, run_dir)
    trial.set_user_attr(RUN_DIR_ATTR, str(run_dir.resolve()))
    try:
        params = {p.key: p.suggest(trial) for p in sweep.space}
    except Exception as error:
        return Outcome(TrialState.FAIL, reason=f"bad sample: {type(error).__name__}: {error}")

    identity = {
        "study": sweep.study,
        "uid": study.user_attrs.get(UID_ATTR),
        "root_number": root,
        "trial_number": trial.number,
        "params": params,
        # Said when a worker started without it finds this folder (a password hidden).
        "storage": hide_passwords(ctx.storage_url),
    }
    try:
        # Before the folder or the MLflow run is touched: an earlier attempt taken for
        # lost may still train there. SLURM's SIGTERM may come during a wait of minutes.
        with _sigterm_raises():
            busy = wait_for_run_folder(run_dir, sweep.storage_options.grace_period, trial.number)
    except (KeyboardInterrupt, SystemExit) as exc:  # SIGTERMException is a SystemExit
        return failed_outcome(exc, run_dir)
    if busy is not None:
        return Outcome(TrialState.FAIL, reason=busy, retry=True, run_dir=run_dir)
    try:
        _claim_folder(run_dir, identity)
    except RunFolderBusyError as busy_error:
        return Outcome(TrialState.FAIL, reason=str(busy_error))

    child: list[str] = []  # the trial's MLflow run, once made
    try:
        with _sigterm_raises():  # until the fit's StopOnSignal takes the signal over
            outcome = _config_and_train(ctx, trial, frozen, root, params, run_dir, child)
    except BaseException as exc:  # SIGTERM or Ctrl-C before the fit took them over
        outcome = failed_outcome(exc, run_dir)
        if outcome.signal_status is None:
            if not isinstance(exc, Exception):
                raise
            # Left to the worker, it would die with the trial RUNNING until taken for lost.
            outcome = setup_failed(exc, trial.number, run_dir)
    # The trial's end is recorded whole; a stop meanwhile (MLflow's calls may take
    # seconds) stops the worker after it, the outcome kept.
    with signals_held(signal.SIGINT, signal.SIGTERM) as arrived:
        # Read from the storage, not only the heartbeat's last look: a trial ended since
        # then must not have its run, the retry's now, ended here.
        if outcome.ended_elsewhere or ctx.trial_ended(trial.number):
            if not outcome.ended_elsewhere:  # it ended here too: a signal, an error
                outcome.reason = "; ".join(filter(None, [outcome.reason, ENDED_ELSEWHERE]))
                outcome.ended_elsewhere = True
        else:
            outcome.mlflow_run = child[0] if child else None
            finish_mlflow(ctx, outcome)
    return stops_the_worker(outcome, sorted(arrived), "as its end was recorded")


#: The reason's start for a trial whose MLflow run or storage could not be written
#: while it was set up (a locked tracking database, a server blip): not the trial's
#: fault, so it is retried.
NOT_REACHED = "tracking or storage unavailable:"
#: Modules whose exceptions say the tracking store or the study's database failed
#: (MLflow's own are judged by their error code: see :func:`service_error`).
_SERVICE_MODULES = ("sqlalchemy", "requests", "urllib3", "psycopg", "sqlite3")
#: MLflow's error codes of a store that failed for the moment (a locked or unreachable
#: database, a server down): not those of a request it refuses (a bad parameter).
_TRANSIENT_MLFLOW_CODES = ("TEMPORARILY_UNAVAILABLE", "INTERNAL_ERROR", "REQUEST_LIMIT_EXCEEDED")


def service_error(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failure of the tracking
    store or the study's storage, not of the trial: a database driver's or an HTTP
    client's error, Optuna's storage error, an OS error (a journal file on NFS, a
    network), or an MLflow error with a code of :data:`_TRANSIENT_MLFLOW_CODES`."""
    from mlflow.exceptions import MlflowException

    current: BaseException | None = error
    for _ in range(8):  # raised from ... raised from: a short chain
        if current is None:
            return False
        module = type(current).__module__ or ""
        if isinstance(current, MlflowException):  # by its code alone: MLflow wraps any
            # database error, a refused write too (BAD_REQUEST), around the driver's
            return current.error_code in _TRANSIENT_MLFLOW_CODES
        if module.split(".")[0] in _SERVICE_MODULES or isinstance(
            current, OSError | optuna.exceptions.StorageInternalError
        ):
            return True
        current = current.__cause__
    return False


def setup_failed(error: Exception, number: int, run_dir: Path) -> Outcome:
    """The FAIL outcome of a trial whose set-up (its config, its MLflow run) raised
    ``error``: retried when a service failed (:func:`service_error`). The traceback goes
    to the trial's ``error.txt``, and to the log for an error that is neither a service's
    nor the user's (a bug), or under ``COFR_DEBUG``."""
    from cofrgenet.environment import debug_requested
    from cofrgenet.errors import UserError, first_line

    traceback_text = "".join(traceback.format_exception(error))
    with contextlib.suppress(OSError):
        (run_dir / "error.txt").write_text(traceback_text)
    debug = debug_requested(strict=False)  # a bad value: cofr said so at its start
    log = logging.getLogger("cofrgenet.sweeps")
    if service_error(error):
        reason = f"{NOT_REACHED} {type(error).__name__}: {first_line(error)[:300]}"
        log.warning(f"trial {number}: {reason}; it is retried")
        if debug:
            log.warning(traceback_text)
        return Outcome(TrialState.FAIL, reason=reason, retry=True, run_dir=run_dir)
    outcome = failed_outcome(error, run_dir)
    bug = not isinstance(error, UserError) and not is_out_of_memory(error)
    log.error(
        f"trial {number}: its set-up failed: {outcome.reason} (traceback in "
        f"{run_dir / 'error.txt'})",
        exc_info=error if bug or debug else None,
    )
    return outcome


def first_attempt_folder(ctx: TrialContext, number: int, root: int, here: Path) -> Path:
    """The run folder a retry resumes: the one its first attempt (trial ``root``) recorded
    when it exists, else ``here`` (this worker's runs folder). A worker started from
    another directory, or with another ``--runs-dir``, on shared storage would otherwise
    train the retry from scratch beside the first attempt's checkpoints."""
    recorded = st.frozen_trial(ctx.storage, ctx.study, root).user_attrs.get(RUN_DIR_ATTR)
    if not recorded:
        return here
    first = Path(str(recorded))
    # Its runs folder holds it as <experiment>/<name>: the fit's run.* settings name it so.
    same_names = (first.parent.name, first.name) == (here.parent.name, here.name)
    if first == here.resolve() or not same_names or not first.is_dir():
        return here
    logging.getLogger("cofrgenet.sweeps").info(
        f"trial {number}: resuming in {first}, the run folder trial {root} (its first "
        f"attempt) recorded, not {here}"
    )
    return first


def _sigterm_raises() -> contextlib.AbstractContextManager[None]:
    """SIGTERM raises Lightning's SIGTERMException (as StopOnSignal's does before the
    first step) while a trial is set up: the config parse and the model and data building
    before the fit's own handler would otherwise end the worker with its trial RUNNING,
    no retry queued and no resume hint."""
    return sigterm_raises(lightning_sigterm)


def _config_and_train(
    ctx: TrialContext,
    trial: optuna.Trial,
    frozen: optuna.trial.FrozenTrial,
    root: int,
    params: dict[str, Any],
    run_dir: Path,
    child: list[str],
) -> Outcome:
    """The trial's config, its MLflow child run (its id appended to ``child``) and its
    fit: how it ended."""
    sweep = ctx.sweep
    args, config, error = _trial_config(ctx, params, run_dir)
    mlflow_on = ctx.run_mlflow if config is None else get_dotted(config, "run.mlflow", True)
    if ctx.mlflow_client is not None:  # not imported otherwise: mlflow is slow to import
        from cofrgenet.sweeps import tracking

        if mlflow_on:
            tags = {
                "optuna.study": sweep.study,
                "optuna.trial_number": trial.number,
                "optuna.first_trial_number": root,
                "optuna.retry_history": frozen.system_attrs.get("retry_history"),
                "optuna.state": "RUNNING",
                "optuna.worker": ctx.worker.label,
                **ctx.worker.slurm,
            }
            run = tracking.run_config(sweep, ctx.runs_dir)
            child.append(
                tracking.child_run(ctx.mlflow_client, run, run_dir, ctx.parent_run_id, tags, params)
            )
        if ctx.parent_run_id:
            # A worker that left early marked the study's run KILLED: it is live again.
            tracking.mark_parent_running(ctx.mlflow_client, ctx.parent_run_id)

    if error is not None:
        reason = f"bad sample or sweep config: {error}"
    elif (problem := model_problem(config or {})) is not None:  # before the fit's start-up
        reason = f"{NO_MODEL_HERE} {problem}"
    else:
        return _train(ctx, trial, args, run_dir)
    return Outcome(TrialState.FAIL, reason=reason, run_dir=run_dir)


def _trial_config(
    ctx: TrialContext, params: dict[str, Any], run_dir: Path
) -> tuple[list[str], dict[str, Any] | None, str | None]:
    """``cofr fit``'s words for this trial, its resolved config (None if the words do not
    parse) and the parse error. The config is written to ``sweep-trial.yaml`` under the
    command line that reproduces it."""
    sweep = ctx.sweep
    runs_dir = str(ctx.runs_dir)
    if run_dir.parent.parent != Path(runs_dir):  # a retry in its first attempt's folder
        runs_dir = str(run_dir.parent.parent)
    run = [
        ("run.experiment", sweep.experiment),
        ("run.name", run_dir.name),
        ("run.runs_dir", runs_dir),
    ]
    if sweep.tracking_uri:
        run.append(("run.tracking_uri", sweep.tracking_uri))
    elif runs_dir != str(ctx.runs_dir) and ctx.track:
        # The trial's MLflow run is in this worker's store, not that runs folder's.
        from cofrgenet.training.run_store import RunConfig, tracking_uri

        run.append(("run.tracking_uri", tracking_uri(RunConfig(runs_dir=str(ctx.runs_dir)))))
    if not ctx.track:
        run.append(("run.mlflow", False))
    # The trial trains with these words, merged by cofr fit's parser (fitconfig.py).
    args: list[str] = []
    try:
        args = trial_words(sweep, params, ctx.extra, run_dir / "sweep-settings.yaml", run)
        config, text = checked_config(args)
    except SweepError as parse_error:
        return args, None, str(parse_error)
    seed = config.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool):
        # The seed resolved here (`seed_everything: true` draws one) is the fit's too.
        args += ["--seed_everything", str(seed)]
    command = shlex.join(["cofr", "fit", *args]).splitlines()
    header = "".join(f"# {line}\n" for line in command)
    (run_dir / "sweep-trial.yaml").write_text(header + text)
    return args, config, None


def _train(ctx: TrialContext, trial: optuna.Trial, args: list[str], run_dir: Path) -> Outcome:
    """Fit the trial with ``cofr fit``'s ``args`` (resuming its last checkpoint if any)."""
    callback = PruneAtStep(
        trial,
        ctx.sweep.objective.metric,
        ctx.storage_url,
        ctx.sweep.study,
        stop_file=str(ctx.stop_file) if ctx.stop_file else None,
        ended_file=str(ctx.ended_file) if ctx.ended_file else None,
    )
    args = ["fit", *args]
    if checkpoints.candidates(run_dir):  # any: a kill may come between two saves
        args += ["--ckpt_path", "last"]
    cli = None
    # No resume hint from the fit: `cofr sweep run` says it once, as it stops (the worker
    # resumes the trial, not a cofr fit), or that the trial failed for good.
    stop = StopOnSignal(resume_hint=_no_resume_hint)
    with _noted_once_the_fit_ended(stop) as after_the_fit:
        try:
            with given_args():
                extra = [callback, stop]
                cli = SweepCLI(args=args, extra_callbacks=extra)
            callback.recover(ctx.storage, ctx.study)
            outcome = _fit_outcome(ctx, trial, cli, callback, run_dir)
            if outcome.state != TrialState.FAIL:  # an earlier attempt's traceback: not this one's
                (run_dir / "error.txt").unlink(missing_ok=True)
        except BaseException as exc:
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(exc)))
            outcome = failed_outcome(exc, run_dir)
        finally:
            del cli
            _free_memory()
    # A signal after the last step (then, maybe, an error: the final validation's): the
    # trial keeps its outcome and the worker still stops or requeues as the signal asked.
    stop.late_signals = sorted({*stop.late_signals, *after_the_fit})
    return after_late_signals(outcome, stop)


@contextlib.contextmanager
def _noted_once_the_fit_ended(stop: StopOnSignal) -> Iterator[set[int]]:
    """SIGTERM and Ctrl-C raise (SIGTERMException, KeyboardInterrupt) until ``stop``'s fit
    has ended, as in the trial's setup and the fit's own (before it takes them over);
    once the fit has ended and given the signals back (the outcome read, the memory
    freed) they are noted in the set yielded, as ``stop.late_signals`` are: raised there,
    one ended a trained trial as FAIL, or, inside a garbage collection's callback, was
    dropped ("Exception ignored") and the worker trained on. A second one (of a signal
    noted here or in ``stop.late_signals``: "press it again to abort") acts at once."""
    noted: set[int] = set()
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return

    def on_signal(signum: int, frame: Any) -> None:
        if stop.fit_ended and signum not in noted and signum not in stop.late_signals:
            noted.add(signum)
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise lightning_sigterm()

    signums = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN]
    previous = {signum: signal.signal(signum, on_signal) for signum in signums}
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _no_resume_hint(run_name: str) -> None:
    """A trial's fit names no resume command. Module-level, not a lambda: ddp_spawn
    (``--gpus-per-worker`` > 1) pickles the callbacks into each process."""
    return None


#: How often a trial waiting for its run folder looks again (seconds).
FOLDER_POLL = 2.0


def wait_for_run_folder(run_dir: Path, timeout: float, number: int) -> str | None:
    """Wait up to ``timeout`` seconds until no process trains in ``run_dir``; None once
    free, else why not. A retry of a trial whose worker was taken for lost while alive
    finds that worker still in the folder: it stops at its next step once its heartbeat
    sees the trial ended (:class:`~cofrgenet.sweeps.storage.Heartbeat`) and saves, and
    the retry resumes from there rather than failing for good on a busy folder."""
    if not run_dir.is_dir():  # nothing trains in a folder not made yet
        return None
    lock = RunLock(run_dir)
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            if lock.try_acquire():
                break
        except OSError:  # no flock here: cofr fit's own lock says what is wrong
            return None
        holder = lock.describe_holder()
        if time.monotonic() >= deadline:
            return f"run folder {run_dir} still in use by {holder} after {timeout:g} s"
        if not said:
            said = True
            logging.getLogger("cofrgenet.sweeps").warning(
                f"trial {number}: run folder {run_dir} is in use by {holder}; waiting up to "
                f"{timeout:g} s (storage_options.grace_period) for it to end"
            )
        time.sleep(max(0.0, min(FOLDER_POLL, deadline - time.monotonic())))
    lock.release()
    return None


def after_late_signals(outcome: Outcome, stop: StopOnSignal) -> Outcome:
    """``outcome`` of a fit that ended, then got a signal after its last step (while its
    final checkpoint was saved: ``stop.late_signals``). The trial keeps its result;
    SIGTERM or Ctrl-C stops the worker after it is told, SIGUSR1 requeues the job as
    between two trials."""
    late = stop.late_signals
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 in late:
        REQUEUE.set()
    return stops_the_worker(outcome, late, "after the last step")


def stops_the_worker(outcome: Outcome, signums: Sequence[int], when: str) -> Outcome:
    """``outcome``, kept, of a trial that got ``signums`` (sorted) ``when`` its result
    was in: Ctrl-C or SIGTERM among them stops the worker after it is told."""
    ending = late_stop(signums)
    if ending is not None and not outcome.stop_worker:
        outcome.stop_worker, outcome.signal_status = True, 128 + ending
        name = signal.Signals(ending).name
        outcome.reason = "; ".join(
            filter(None, [outcome.reason, f"{name} {when}: the worker stops"])
        )
    return outcome


def _fit_outcome(
    ctx: TrialContext,
    trial: optuna.Trial,
    cli: SweepCLI,
    callback: PruneAtStep,
    run_dir: Path,
) -> Outcome:
    """How a fit that returned ended: handed over (another worker ended the trial),
    requeued, pruned, or its objective at the last step (validating the final model when
    the last validation came before it)."""
    trainer, metric_name = cli.trainer, ctx.sweep.objective.metric
    # Under ddp_spawn the main process's trainer does not see the ranks' step.
    final_step = max(trainer.global_step, callback.last_step or 0)
    if callback.ended_at is not None:
        return Outcome(
            TrialState.FAIL,
            reason=f"{ENDED_ELSEWHERE}; stopped at step {callback.ended_at}, saved for its retry",
            run_dir=run_dir,
            ended_elsewhere=True,
        )
    if callback.requeued_at is not None:
        return Outcome(
            TrialState.RUNNING,
            reason=f"stopped at step {callback.requeued_at} for a requeue",
            stop_worker=True,
            requeue=True,
            run_dir=run_dir,
        )
    if callback.pruned_at is not None:
        return Outcome(
            TrialState.PRUNED,
            value=callback.last_value,
            step=callback.last_step,
            reason=_prune_reason(ctx, callback.pruned_at, callback.last_value),
            run_dir=run_dir,
        )
    if ctx.trial_ended(callback.number):  # the retry measures the checkpoint: not here
        reason = f"{ENDED_ELSEWHERE}; its fit had ended at step {final_step}"
        return Outcome(TrialState.FAIL, reason=reason, run_dir=run_dir, ended_elsewhere=True)
    logged = dict(trainer.callback_metrics)
    if callback.last_step != final_step:
        # The last validation was before the end: measure the final model. It resets the
        # logged metrics: train/loss is the last step's, from before.
        trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)
        logged.update(trainer.callback_metrics)
    metric = logged.get(metric_name)
    if metric is None:
        reason = f"objective metric {metric_name!r} was never logged; logged: {sorted(logged)}"
        return Outcome(TrialState.FAIL, reason=reason, run_dir=run_dir)
    value = float(metric)
    if callback.last_step != final_step:  # else on_validation_end reported it
        callback.report_score(value, final_step)
    if not math.isfinite(value):  # a point failure, as a NaN training loss is
        reason = f"{NON_FINITE} the objective {metric_name} is {value} at step {final_step}"
        return Outcome(TrialState.FAIL, reason=reason, run_dir=run_dir)
    return Outcome(TrialState.COMPLETE, value=value, step=final_step, run_dir=run_dir)


def finish_mlflow(ctx: TrialContext, outcome: Outcome) -> None:
    """End the trial's MLflow run (:attr:`Outcome.mlflow_run`) as ``outcome`` says."""
    if outcome.mlflow_run is None or ctx.mlflow_client is None:
        return
    from cofrgenet.sweeps.tracking import finish_child

    try:
        finish_child(ctx.mlflow_client, outcome.mlflow_run, outcome)
    except Exception as error:  # tracking trouble must not lose the trial's result
        logging.getLogger("cofrgenet.sweeps").warning(f"MLflow: {error}")


def _prune_reason(ctx: TrialContext, step: int, value: float | None) -> str:
    """``pruned at step 6 by the hyperband pruner (val/loss 5.21 there)``: when, by which
    rule, at what value (Optuna's pruners do not say against which trials)."""
    at = "" if value is None else f" ({ctx.sweep.objective.metric} {value:.4g} there)"
    return f"pruned at step {step} by the {ctx.sweep.pruner.get('name')} pruner{at}"

"""The MLflow logger of ``cofr fit``: one MLflow run per training run, kept across resumes
(the run folders and the store's location: :mod:`cofrgenet.training.run_store`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from cofrgenet.atomic import write_text_atomic
from cofrgenet.errors import ConfigError
from cofrgenet.training.run_store import (
    HISTORY_KEY,
    RUN_DIR_TAG,
    RUN_ID_FILE,
    STOPPED_AT_TAG,
    code_tags,
    flatten,
    log_params_tagging_changes,
    make_store,
    reach_run,
    scored_already,
    slurm_tags,
    sqlite_database,
)

#: Top-level keys of ``cofr fit``'s config that are how it was invoked, not what trains:
#: the config files read and the checkpoint resumed (it changes at each resume).
INVOCATION_KEYS = ("config", "ckpt_path")
#: Params whose text may differ between attempts of one run with nothing changed (a
#: sweep trial begun with ``--runs-dir /home/me/runs``, resumed with ``runs``): not
#: tagged ``latest/<key>``. The run's folder is the same by construction (the tag
#: ``run_dir`` holds it absolute); the data folder's absolute path and contents are the
#: params ``data.folder`` and ``data.<split>_tokens``, which are.
SPELLING_ONLY = ("run.runs_dir", "data.data_dir")


def run_params(config: dict[str, Any], model_config: Any = None) -> dict[str, str]:
    """The run's MLflow params: ``config`` flattened without unset (None) values and
    invocation keys; ``model.config.*`` are the resolved model's (a preset's depth and
    ladder count too, so runs can be filtered by them), ``model_config`` a ModelConfig."""
    config = {k: v for k, v in config.items() if k not in INVOCATION_KEYS}
    params = {k: v for k, v in flatten(config).items() if v != "None"}
    if model_config is not None:
        params = {k: v for k, v in params.items() if not k.startswith("model.config.")}
        resolved = flatten(model_config.to_dict(), "model.config")
        params.update({k: v for k, v in resolved.items() if v != "None"})
    return params


def data_params(datamodule: Any) -> dict[str, str]:
    """What a run trained on, from its prepared folder's ``meta.json``: the folder (as an
    absolute path; the config may hold a relative one), source, tokenizer and the tokens
    of each split. Empty for a datamodule without a prepared folder."""
    meta, folder = getattr(datamodule, "meta", None), getattr(datamodule, "data_dir", None)
    if meta is None or folder is None:
        return {}
    params = {
        "data.folder": str(Path(folder).resolve()),
        "data.source": meta.source,
        "data.tokenizer": meta.tokenizer,
    }
    params.update({f"data.{name}_tokens": str(info.tokens) for name, info in meta.splits.items()})
    return params


def model_metrics(model_config: Any) -> dict[str, float]:
    """Sizes of the model, as metrics (numbers sort and filter as numbers in MLflow):
    parameters in all, in ladders and outside the embeddings, and training FLOPs per
    token at the model's block size."""
    from cofrgenet.models import count_parameters, estimate_flops_per_token

    count = count_parameters(model_config)
    return {
        "model/n_params": float(count.total),
        "model/n_params_ladder": float(count.ladder),
        "model/n_params_non_embedding": float(count.total - count.embedding),
        "model/training_flops_per_token": float(estimate_flops_per_token(model_config).training),
    }


def check_own_run(run_dir: Path, uri: str) -> None:
    """Refuse a fit of run folder ``run_dir`` that would log onto an MLflow run it cannot
    go on: one the store at ``uri`` does not hold (a folder moved to another runs
    folder: MLflow's "Run not found" traceback came at the first step), or the run of the
    folder it was copied from (the copy's steps went into that run's history, and the
    original's own, resumed, were then dropped as replayed)."""
    id_file = run_dir / RUN_ID_FILE
    if not id_file.is_file():
        return
    run_id = id_file.read_text().strip()
    new_run = f"deleting {id_file} logs this folder's run as a new MLflow run"
    run, problem = reach_run(uri, run_id, f"--run.tracking_uri gives its store; {new_run}")
    if problem is not None:
        raise ConfigError(f"cannot go on with {run_dir}'s MLflow run: {problem}")
    tagged = run.data.tags.get(RUN_DIR_TAG)
    other = Path(tagged) if tagged else None
    if other is None or other == run_dir.resolve() or not (other / RUN_ID_FILE).is_file():
        return  # the run's own folder, or one moved: the tag follows it (remember_run)
    if other.samefile(run_dir) or (other / RUN_ID_FILE).read_text().strip() != run_id:
        return
    from cofrgenet.training.pretrained import tracking_uri_of

    if not same_store(tracking_uri_of(other), uri):  # a whole runs folder copied, its store too
        return
    raise ConfigError(
        f"{run_dir} is a copy of {other}: both name MLflow run {run_id} in {RUN_ID_FILE}, "
        f"so this fit would write its steps into {other.name}'s history. To go on with the "
        f"copy, {new_run}; or resume {other} itself"
    )


def same_store(one: str, other: str) -> bool:
    """Whether tracking URIs ``one`` and ``other`` name one store (sqlite files by their
    resolved paths)."""
    files = sqlite_database(one), sqlite_database(other)
    if files[0] is not None and files[1] is not None:
        return files[0].resolve() == files[1].resolve()
    return one == other


class CofrMLFlowLogger(MLFlowLogger):
    """MLFlowLogger that resumes its run from the run folder and logs the whole config.

    Lightning's own hyperparameter call (the module's init arguments) is replaced by
    :meth:`log_config`, which logs the full resolved configuration flattened, once per
    run (values already logged by a previous attempt of the same run are skipped, since
    MLflow refuses to change a parameter).

    evaluation: ``cofr validate``/``test`` logging onto the run that saved the checkpoint:
    every metric goes at ``eval_step`` (the checkpoint's step, when known), and the run's
    status is left as it is. ``eval_data``: the data folder scored when it is not the one
    the run trained on; its scores go under ``eval/<split>/<folder's name>/`` (``val/loss``
    of ``data/owt`` is ``eval/val/owt/loss``, with the folder's path as the tag
    ``.../data_dir``), so the run's own curves stay the training data's. Otherwise
    (training) metrics of steps the run has logged already are dropped: a resume replays
    them.
    """

    def __init__(
        self,
        run_dir: Path,
        evaluation: bool = False,
        eval_step: int | None = None,
        eval_data: str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.evaluation = evaluation
        #: An evaluation's metrics go at the step of the checkpoint it evaluates.
        self.eval_step = eval_step
        #: The data folder an evaluation scored, when not the training's.
        self.eval_data = None if eval_data is None else Path(eval_data).resolve()
        #: Set by :meth:`score_apart`: an evaluation of other blocks than the run scored.
        self._apart: tuple[str, str] | None = None
        self.store_uri: str | None = kwargs.get("tracking_uri")
        self.experiment_name: str = kwargs.get("experiment_name", "Default")
        id_file = self.run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else None
        # A resumed run replays the steps between its checkpoint and where it stopped:
        # those are in the history already (the resume is bit for bit), so they are not
        # logged twice. None: not looked up yet; -1: nothing logged before.
        self._logged_through: int | None = None if run_id else -1
        #: The same for each validation key: a validation logged after the last train/loss
        #: (killed before the next step's) is replayed at a step train/loss had not reached.
        self._validated_through: dict[str, int] = {}
        self._resumed = run_id is not None
        if self.store_uri is not None:
            make_store(self.store_uri)  # whole, or not at all: not half by a Ctrl-C
        super().__init__(run_id=run_id, **kwargs)

    def logged_through(self) -> int:
        """The last step this run logged before this process (-1 for a new run)."""
        if self._logged_through is None:
            history = self.experiment.get_metric_history(self.run_id, HISTORY_KEY)
            self._logged_through = max((m.step for m in history), default=-1)
        return self._logged_through

    def _replayed(self, key: str, step: int) -> bool:
        """Whether ``key`` at ``step`` is in the run's history already."""
        if not self._resumed:
            return False
        if step <= self.logged_through():
            return True
        if not key.startswith("val/"):
            return False
        if key not in self._validated_through:
            history = self.experiment.get_metric_history(self.run_id, key)
            self._validated_through[key] = max((m.step for m in history), default=-1)
        return step <= self._validated_through[key]

    def score_apart(self, label: str, why: str, split: str = "val") -> str | None:
        """An evaluation that scores other blocks of the run's val split than its fit did
        (other processes or batches; ``why`` says which), or a test of part of it, logs
        under ``eval/<split>/<label>/`` with ``why`` as the tag ``.../note``, not onto the
        run's own curve at the checkpoint's step, where it would stand as the run's
        score. Returns that prefix for ``split`` (None where nothing moves: a fit, or
        other data's scores already)."""
        if not self.evaluation or self.eval_data is not None:
            return None
        self._apart = (label, why)
        return f"eval/{split}/{label}/"

    def evaluation_key(self, key: str) -> str:
        """``val/loss`` -> ``eval/val/<data>/loss`` (keys without a split kept as they are)."""
        split, _, metric = key.partition("/")
        label = self.eval_data.name if self.eval_data is not None else None
        label = self._apart[0] if self._apart is not None else label
        if not metric or label is None:
            return key
        return f"eval/{split}/{label}/{metric}"

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        if self.evaluation:
            step = self.eval_step if self.eval_step is not None else step
            if self.eval_data is not None or self._apart is not None:  # beside the curves
                from mlflow.entities import RunTag

                metrics = {self.evaluation_key(k): v for k, v in metrics.items()}
                folders = {k.rsplit("/", 1)[0] for k in metrics if k.startswith("eval/")}
                if self._apart is not None:
                    tags = [RunTag(f"{f}/note", self._apart[1]) for f in sorted(folders)]
                else:
                    tags = [RunTag(f"{f}/data_dir", str(self.eval_data)) for f in sorted(folders)]
                self.experiment.log_batch(self.run_id, tags=tags)
            if step is not None:  # the same checkpoint scored again: one point, not two
                client, run_id = self.experiment, self.run_id
                metrics = {
                    k: v
                    for k, v in metrics.items()
                    if not scored_already(client, run_id, k, step, v)
                }
                if not metrics:
                    return
        elif step is not None:  # a replayed step's values are in the run's history already
            metrics = {k: v for k, v in metrics.items() if not self._replayed(k, step)}
            if not metrics:
                return
        super().log_metrics(metrics, step)

    @rank_zero_only
    def remember_run(self) -> None:
        """Create the MLflow run if needed and store its id in the run folder; a resumed
        run (KILLED, FAILED or FINISHED by its last attempt) reads RUNNING again."""
        from mlflow.entities import RunTag

        self._remembered = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        id_file = self.run_dir / RUN_ID_FILE
        if not id_file.exists():
            write_text_atomic(id_file, self.run_id + "\n")
        else:
            self._mark_running()
        # This attempt's code (a resume may run another commit) and SLURM job (an earlier
        # attempt's job tags stay when this one runs outside SLURM), and its folder (moved
        # since the run began, maybe).
        folder = {RUN_DIR_TAG: str(self.run_dir.resolve())}
        tags = [RunTag(k, v) for k, v in {**code_tags(), **slurm_tags(), **folder}.items()]
        self.experiment.log_batch(self.run_id, tags=tags)

    _killed = False
    _handed_over = False
    _remembered = False  # remember_run has run: this attempt's MLflow run exists

    def mark_killed(self, step: int) -> None:
        """The run was stopped by a signal after ``step``: end it as KILLED, not FAILED,
        with that step as a tag (:data:`STOPPED_AT_TAG`); its last logged step lags by up
        to ``log_every_n_steps``. KILLED is written now, not at :meth:`finalize`: a second
        SIGTERM on the way out (SLURM's, a user's) ended the process before that, and the
        run stayed RUNNING. Nothing once the run is handed over (:meth:`hand_over`)."""
        if self._handed_over:
            return
        self._killed = True
        if self._remembered or self._resumed:  # else no run yet: asking for one made it
            self._tag_stopped_at(step)

    def mark_going_on(self) -> None:
        """Take back :meth:`mark_killed`: the run went on (a requeue that did not come)."""
        if self._killed and not self._handed_over:
            self._killed = False
            if not self.evaluation:
                self._mark_running()

    @rank_zero_only
    def _mark_running(self) -> None:
        """RUNNING, without the tag of a stop that is over (a resume, or a requeue that
        did not come)."""
        run = self.experiment.get_run(self.run_id)
        if run.info.status != "RUNNING":
            self.experiment.update_run(self.run_id, status="RUNNING")
        if STOPPED_AT_TAG in run.data.tags:
            self.experiment.delete_tag(self.run_id, STOPPED_AT_TAG)

    @rank_zero_only
    def _tag_stopped_at(self, step: int) -> None:
        if not self.evaluation:
            self.experiment.set_tag(self.run_id, STOPPED_AT_TAG, str(step))
            self.experiment.update_run(self.run_id, status="KILLED")

    def hand_over(self) -> None:
        """Another process takes the run over (a sweep trial's retry, which resumes this
        fit's checkpoint): from now on the run's status is its to set, and neither
        :meth:`finalize` nor a signal stop (:meth:`mark_killed`) changes it here."""
        self._handed_over = True

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self.evaluation or self._handed_over:
            # The training run's status is not an evaluation's: that run may be KILLED
            # awaiting its resume, or training in another process.
            return
        super().finalize("KILLED" if self._killed else status)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        return

    @rank_zero_only
    def log_config(
        self,
        config: dict[str, Any],
        yaml_text: str,
        model_config: Any = None,
        data: dict[str, str] | None = None,
    ) -> None:
        """Params (:func:`run_params`, and ``data``: :func:`data_params`), the model's sizes
        (:func:`model_metrics`, at step 0) and the config as artifacts. A resume that
        changed a param (a larger max_steps) keeps the first value, as MLflow params cannot
        change, and sets the new one as the tag ``latest/<key>`` (removed again by a resume
        back at the first value)."""
        client, run_id = self.experiment, self.run_id
        params = {**run_params(config, model_config), **(data or {})}
        changed = log_params_tagging_changes(client, run_id, params, untagged=SPELLING_ONLY)
        if changed:
            shown = ", ".join(changed[:5]) + ("..." if len(changed) > 5 else "")
            rank_zero_info(  # a resume with more steps is routine: no warning
                f"MLflow: {shown} changed since the run began; its params keep the first "
                "values (they cannot change) and the tags latest/<key> hold the new ones"
            )
        if model_config is not None:
            from mlflow.entities import Metric

            logged = client.get_run(run_id).data.metrics
            now = int(time.time() * 1000)
            sizes = model_metrics(model_config)
            items = [Metric(k, v, now, 0) for k, v in sizes.items() if k not in logged]
            client.log_batch(run_id, metrics=items)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        client.log_text(run_id, yaml_text, "config.yaml")
        client.log_text(run_id, yaml_text, f"configs/config-{stamp}.yaml")

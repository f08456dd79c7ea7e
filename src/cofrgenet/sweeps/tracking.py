"""MLflow for sweeps: one parent run per study, one nested child run per trial.

The child run is created before the trial trains and its id written to the trial's run
folder, so the training logger (``CofrMLFlowLogger``) logs into it, and a resumed or
retried trial goes on in the same MLflow run. ``mlflow.parentRunId`` nests it under the
study's run in the UI; the sampled params are MLflow params under their config keys.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from cofrgenet.atomic import write_text_atomic
from cofrgenet.errors import ConfigError
from cofrgenet.folder_lock import waiting_for
from cofrgenet.sweeps.spec import Sweep
from cofrgenet.training.run_store import (
    RUN_ID_FILE,
    RunConfig,
    artifact_location,
    check_tracking_uri,
    code_tags,
    cut,
    flatten,
    log_new_params,
    log_params_tagging_changes,
    make_store,
    sqlite_database,
    tracking_uri,
)

if TYPE_CHECKING:
    from cofrgenet.sweeps.objective import Outcome  # which imports this module

PARENT_ATTR = "mlflow_parent_run_id"
#: The store of the study's parent run (its tracking URI, passwords hidden): a worker
#: under --no-mlflow settles the run there only when its own store is that one.
PARENT_STORE_ATTR = "cofr.mlflow_store"


def run_config(sweep: Sweep, runs_dir: str | None = None) -> RunConfig:
    return RunConfig(
        experiment=sweep.experiment,
        runs_dir=runs_dir or sweep.runs_dir,
        tracking_uri=sweep.tracking_uri,
    )


def client_for(run: RunConfig) -> MlflowClient:
    """A client on the run store; a fresh sqlite store is created under a file lock, since
    workers that start together would otherwise race on its schema migration."""
    uri = tracking_uri(run)
    if not uri.startswith("sqlite:"):
        return MlflowClient(uri)
    with waiting_for(
        Path(run.runs_dir) / ".mlflow.lock",
        f"opening {uri} (workers starting together may race to make its tables)",
    ):
        make_store(uri)  # a new store whole, or not at all
        client = MlflowClient(uri)  # opening an older store migrates its schema
        client.search_experiments(max_results=1)
    return client


def existing_client(run: RunConfig) -> MlflowClient | None:
    """A client on the run store when it exists (a local sqlite store that is not there
    is not made) and answers (a server that does not: MLflow's client would retry for
    minutes); None otherwise."""
    uri = tracking_uri(run)
    database = sqlite_database(uri)
    if database is not None and not database.is_file():
        return None
    try:
        check_tracking_uri(uri)
    except ConfigError:
        return None
    return MlflowClient(uri)


def experiment_id(client: MlflowClient, run: RunConfig) -> str:
    found = client.get_experiment_by_name(run.experiment)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(run.experiment, artifact_location=artifact_location(run))
    except MlflowException:  # another worker created it first
        found = client.get_experiment_by_name(run.experiment)
        if found is None:
            raise
        return found.experiment_id


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params not yet on the run (MLflow params cannot change)."""
    log_new_params(client, run_id, {k: cut(v) for k, v in params.items()})


def sweep_params(sweep: Sweep) -> dict[str, Any]:
    params: dict[str, Any] = {
        "sampler": sweep.sampler,
        "pruner": sweep.pruner,
        "objective.metric": sweep.objective.metric,
        "objective.direction": sweep.objective.direction,
        "budget.steps": sweep.budget.steps,
        "budget.tokens": sweep.budget.tokens,
        "budget.val_every": sweep.budget.val_every,
        "n_trials": sweep.total_trials,
        "base": [str(p) for p in sweep.base],
    }
    params.update({f"space.{k}": v for k, v in sweep.raw.get("space", {}).items()})
    # Nested options one param each (sampler.name, pruner.n_startup_trials), not a repr.
    return flatten({k: v for k, v in params.items() if v is not None})


def created_by() -> dict[str, str]:
    """Tags of a run this module creates: who (as MLflow's own runs have) and which code."""
    import getpass

    with contextlib.suppress(Exception):  # no user name in some containers
        return {"mlflow.user": getpass.getuser(), **code_tags()}
    return code_tags()


def create_parent(client: MlflowClient, run: RunConfig, sweep: Sweep, storage: str) -> str:
    exp = experiment_id(client, run)
    parent = client.create_run(
        exp,
        run_name=f"study-{sweep.study}",
        tags={
            "optuna.study": sweep.study,
            "optuna.storage": storage,
            "cofr.sweep": "parent",
            "cofr.sweep_file": str(sweep.path or ""),
            **created_by(),
        },
    )
    run_id = parent.info.run_id
    update_parent(client, run_id, sweep)
    return run_id


#: Parent runs made this close together (seconds) are workers racing to make the
#: study's first: the time between reading the study's parent attribute and setting it.
SETTLE_WINDOW_S = 600


def settle_parent(
    client: MlflowClient, run: RunConfig, sweep: Sweep, storage: str, mine: str
) -> str:
    """The study's parent run once this worker has made ``mine``: the oldest parent of
    the study (and ``storage``) in the experiment. Workers that each made one at once
    (another ``--runs-dir``, whose file lock they do not share, or no lock across hosts)
    then all take the same, and delete their own, so trials nest under one run."""
    exp = experiment_id(client, run)
    made = client.get_run(mine).info.start_time
    # Made at about the same time: not the parent of an earlier study of this name (its
    # storage removed and made again), which trials must not join. A study name is
    # letters, digits, '.', '_' and '-' (spec): nothing to escape.
    found = client.search_runs(
        [exp],
        filter_string=(
            f"tags.`cofr.sweep` = 'parent' and tags.`optuna.study` = '{sweep.study}' and "
            f"attributes.start_time >= {made - SETTLE_WINDOW_S * 1000}"
        ),
        order_by=["attributes.start_time ASC"],
        max_results=100,
    )
    parents = [r for r in found if r.data.tags.get("optuna.storage") == storage]
    if not parents:  # the store cannot say yet: keep this worker's own
        return mine
    first = min(parents, key=lambda r: (r.info.start_time, r.info.run_id)).info.run_id
    if first != mine:
        with contextlib.suppress(MlflowException):
            client.delete_run(mine)
    return first


def update_parent(client: MlflowClient, run_id: str, sweep: Sweep) -> None:
    """The sweep file a worker runs, on the study's run (the first, from
    :func:`create_parent`, or a later one's): the params it adds, for those it changes
    (``n_trials`` extended, another pruner) the tag ``latest/<key>`` as MLflow params
    cannot change, and the file itself as ``sweep.yaml``."""
    log_params_tagging_changes(client, run_id, {k: cut(v) for k, v in sweep_params(sweep).items()})
    if sweep.path is not None and sweep.path.is_file():
        client.log_text(run_id, sweep.path.read_text(), "sweep.yaml")


def run_missing(client: MlflowClient, run_id: str) -> bool:
    """Whether ``run_id`` is surely not a live run of this store (in another store,
    deleted, or in a store since removed); False when the store cannot say (a server
    briefly down is no reason to make another parent run)."""
    try:
        return client.get_run(run_id).info.lifecycle_stage != "active"
    except MlflowException as error:
        return error.error_code == "RESOURCE_DOES_NOT_EXIST"


def set_parent_status(client: MlflowClient, run_id: str, status: str) -> None:
    with contextlib.suppress(MlflowException):
        client.update_run(run_id, status=status)


#: The study's run's tag that says how far a study its last worker left got.
STUDY_STATE_TAG = "cofr.study_state"


def mark_parent_running(client: MlflowClient, run_id: str) -> None:
    """The study's run is live again: RUNNING, without the tag of an earlier stop."""
    set_parent_status(client, run_id, "RUNNING")
    with contextlib.suppress(MlflowException):  # no such tag: nothing to take back
        client.delete_tag(run_id, STUDY_STATE_TAG)


def run_id_in(run_dir: Path) -> str | None:
    """The MLflow run id a trial's run folder names (None before its run was made)."""
    id_file = run_dir / RUN_ID_FILE
    return (id_file.read_text().strip() or None) if id_file.exists() else None


def child_run(
    client: MlflowClient,
    run: RunConfig,
    run_dir: Path,
    parent_id: str,
    tags: dict[str, Any],
    params: dict[str, Any],
) -> str:
    """The trial's MLflow run: the one named in ``run_dir`` (a resume) or a new child."""
    id_file = run_dir / RUN_ID_FILE
    run_id = run_id_in(run_dir)
    if run_id:
        try:
            client.get_run(run_id)
        except MlflowException:
            run_id = None
    if run_id is None:
        created = client.create_run(
            experiment_id(client, run),
            run_name=run_dir.name,
            tags={"mlflow.parentRunId": parent_id, **created_by()},
        )
        run_id = created.info.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(id_file, run_id + "\n")
    else:
        client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
    set_tags(client, run_id, tags)
    log_params(client, run_id, params)
    return run_id


def set_tags(client: MlflowClient, run_id: str, tags: dict[str, Any]) -> None:
    from mlflow.entities import RunTag

    items = [RunTag(k, str(v)[:5000]) for k, v in tags.items() if v is not None]
    client.log_batch(run_id, tags=items)  # split at MLflow's limits by the client


#: The tag that holds an outcome's reason, by Optuna state (RUNNING: a requeued trial
#: that goes on later). A run keeps only its latest state's: a retry that completes
#: drops the failed attempt's fail_reason.
REASON_TAGS = {
    "FAIL": "optuna.fail_reason",
    "PRUNED": "optuna.prune_reason",
    "RUNNING": "optuna.stop_reason",
}
#: The trial queued to go on with a failed one (it resumes this run): ``cofr compare``
#: says so beside "failed". A later end of the run drops it.
RETRIED_AS_TAG = "optuna.retried_as"


def finish_child(client: MlflowClient, run_id: str, outcome: Outcome) -> None:
    """End a trial's run with its :class:`~cofrgenet.sweeps.objective.Outcome`: the state
    as a tag, its reason under the state's tag (:data:`REASON_TAGS`), and the objective's
    value at the step it was measured."""
    state = outcome.state.name
    tags: dict[str, Any] = {"optuna.state": state, RETRIED_AS_TAG: outcome.retried_as}
    if outcome.reason and state in REASON_TAGS:
        tags[REASON_TAGS[state]] = outcome.reason
    set_tags(client, run_id, tags)  # (a None value is not set)
    tags = {k: v for k, v in tags.items() if v is not None}
    earlier = client.get_run(run_id).data.tags
    for tag in [*REASON_TAGS.values(), RETRIED_AS_TAG]:
        if tag in earlier and tag not in tags:
            client.delete_tag(run_id, tag)
    if outcome.value is not None:
        client.log_metric(run_id, "optuna/value", outcome.value, step=outcome.step or 0)
    status = "FAILED" if state == "FAIL" else "FINISHED"
    if state == "RUNNING":  # requeued: it goes on later
        status = "KILLED"
    set_parent_status(client, run_id, status)

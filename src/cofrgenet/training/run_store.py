"""Where runs live, without Lightning: run folders and the MLflow store.

Layout under ``runs_dir`` (default ``runs/``)::

    runs/mlflow.db                      the MLflow store (sqlite, no server needed)
    runs/mlartifacts/                   MLflow artifacts
    runs/<experiment>/<run>/            one training run
        checkpoints/last.ckpt, step*.ckpt
        config.yaml                     the resolved configuration
        mlflow_run_id                   so a resumed or requeued run logs into the same run

Commands that only read or name runs (``cofr ui``, ``compare``, ``finetune glue``, the
demo) import this module, not :mod:`cofrgenet.training.tracking` (whose logger imports
Lightning, seconds at start-up).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cofrgenet import package_version
from cofrgenet.atomic import nearest_existing
from cofrgenet.config_variables import expand_variables
from cofrgenet.databases import connection_error, is_server_url
from cofrgenet.databases import reason as driver_reason
from cofrgenet.errors import ConfigError
from cofrgenet.redact import hide_passwords, shown_command_line

RUN_ID_FILE = "mlflow_run_id"
#: The run folder's copy of its data folder's tokenizer (``meta.json``, ``tokenizer/``),
#: made when the run starts: the checkpoints keep it if the data folder changes.
RUN_TOKENIZER_DIR = "tokenizer"
#: The metric whose history says up to which step a run has logged.
HISTORY_KEY = "train/loss"
#: The tag of the step a run stopped after when a signal stopped it (KILLED).
STOPPED_AT_TAG = "cofr.stopped_at_step"
#: The tag of the checkpoint a run's weights started from: another run's, resumed into a
#: new run folder (``--ckpt_path FILE``), or ``model.init_from``'s.
STARTED_FROM_TAG = "cofrgenet.started_from"
#: The tag of a training run's MLflow run that holds its run folder's absolute path.
RUN_DIR_TAG = "run_dir"
#: The user's MLFLOW_TRACKING_URI, read once: mlflow.set_tracking_uri (which Lightning's
#: logger calls) writes the variable, so reading it later would pick up the previous run's
#: store in a process that trains several runs (sweeps, tests).
USER_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")
#: Parameter values longer than this are cut (MLflow refuses values over 6000 characters,
#: and long values are unreadable in the UI); the full config is an artifact.
MAX_PARAM_LENGTH = 500


@dataclass
class RunConfig:
    """Where a run lives and where it is tracked.

    The run's folder is ``<runs_dir>/<experiment>/<name>/``.

    Args:
        experiment: MLflow experiment and folder name.
        name: the run's folder and MLflow run name; None: ``slurm-<job id>`` under SLURM
            (a requeued job keeps its id, so it finds its checkpoint and MLflow run
            again), else a timestamp; with ``--ckpt_path last`` and no name, the run of
            the experiment with the newest checkpoint.
        runs_dir: the folder of every experiment's runs, and of the default MLflow
            store.
        tracking_uri: any MLflow URI; None: ``MLFLOW_TRACKING_URI``, else
            ``sqlite:///<runs_dir>/mlflow.db``.
        checkpoint_every_n_steps: a checkpoint ``step<N>.ckpt`` every N optimizer steps
            (and ``last.ckpt`` at each save and at the end).
        keep_checkpoints: how many of the newest ``step*.ckpt`` to keep (-1: all).
        mlflow: log the run to MLflow; false trains without tracking.
    """

    experiment: str = "default"
    name: str | None = None
    runs_dir: str = "runs"
    tracking_uri: str | None = None
    checkpoint_every_n_steps: int = 500
    keep_checkpoints: int = 2
    mlflow: bool = True

    def __post_init__(self) -> None:
        # ${VAR} and ~ as in a shell: a literal "$HOME/runs" folder helps no one.
        self.runs_dir = str(Path(expand_variables(self.runs_dir, "run.runs_dir")).expanduser())
        if self.tracking_uri is not None:
            self.tracking_uri = expand_variables(self.tracking_uri, "run.tracking_uri")
        for key, value in (("experiment", self.experiment), ("name", self.name)):
            if value is None and key == "name":
                continue
            # The folder runs/<experiment>/<name>: "", "." or ".." would land elsewhere.
            if not isinstance(value, str) or not folder_name(value, ""):
                raise ConfigError(
                    f"run.{key} {value!r} is not a folder name: use letters, digits, "
                    "'.', '_' or '-', not only dots"
                )
            if "/" in value or "\\" in value:  # it would not make a nested folder
                raise ConfigError(
                    f"run.{key} {value!r} has a path separator: runs are one folder deep "
                    f"(<runs_dir>/<experiment>/<name>); use {folder_name(value)!r}"
                )
            # The folder's name is the MLflow experiment's and run's: "my exp" would share
            # runs/my-exp with the experiment "my-exp".
            check_folder_name(f"run.{key}", value)
        if self.keep_checkpoints == 0 or self.keep_checkpoints < -1:
            raise ConfigError(
                f"run.keep_checkpoints must be >= 1, or -1 for all, got {self.keep_checkpoints}"
            )
        if self.checkpoint_every_n_steps < 1:  # Lightning's 0 silently saves only at the end
            raise ConfigError(
                "run.checkpoint_every_n_steps must be >= 1 (a large value saves only "
                f"last.ckpt, at the end), got {self.checkpoint_every_n_steps}"
            )


def folder_name(name: str, empty: str = "run") -> str:
    """``name`` as a folder name: other characters become '-', and a leading '.' is dropped
    (no hidden folder, no '..')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).lstrip("-.").rstrip("-") or empty


def check_folder_name(option: str, name: str) -> None:
    """Refuse an experiment or run name that its folder would not keep as given: "run 1"
    and "run-1" would be one folder, "über" would be "ber"."""
    if folder_name(name, "") != name:
        # The suggestion keeps accented letters' base letters ("über" -> "uber").
        plain = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
        first = ", not '.' or '-' first" if name[:1] in (".", "-") else ""
        raise ConfigError(
            f"{option} {name!r} is not a folder name as given: use letters, digits, '.', "
            f"'_' or '-'{first}, e.g. {folder_name(plain)!r}"
        )


#: MLflow tags of the SLURM job a process runs in, and their environment variables.
SLURM_TAGS = {
    "slurm.job_id": "SLURM_JOB_ID",
    "slurm.array_job_id": "SLURM_ARRAY_JOB_ID",
    "slurm.array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm.procid": "SLURM_PROCID",
}


def slurm_tags() -> dict[str, str]:
    """The SLURM job this process runs in, as MLflow tags; none outside SLURM."""
    return {tag: os.environ[var] for tag, var in SLURM_TAGS.items() if os.environ.get(var)}


def slurm_run_name() -> str | None:
    """A name stable across requeues: the array job and task, or the job id."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"slurm-{array_job}_{task}"
    job = os.environ.get("SLURM_JOB_ID")
    return f"slurm-{job}" if job else None


def latest_run(experiment_dir: Path) -> Path | None:
    """The run folder of ``experiment_dir`` with the newest checkpoint; None if none has one.

    Folders without a checkpoint (a run that failed before its first save) are passed
    over: resuming one would silently start from scratch.
    """
    from cofrgenet.training.checkpoints import candidates

    if not experiment_dir.is_dir():
        return None
    newest: dict[Path, float] = {}
    for run in experiment_dir.iterdir():
        saved = candidates(run)  # newest first
        if saved:
            newest[run] = saved[0].stat().st_mtime
    return max(newest, key=newest.__getitem__) if newest else None


def resolve_run_dir(run: RunConfig, resume_last: bool) -> Path:
    experiment_dir = Path(run.runs_dir) / folder_name(run.experiment)
    name = run.name or slurm_run_name()
    if name is None and resume_last:
        found = latest_run(experiment_dir)
        if found is not None:
            return found
    if name is None:
        name = time.strftime("%Y%m%d-%H%M%S")
    return experiment_dir / folder_name(name)


def tracking_uri(run: RunConfig) -> str:
    """The run's store: ``run.tracking_uri``, else the user's ``MLFLOW_TRACKING_URI``, else
    ``sqlite:///<runs_dir>/mlflow.db``."""
    if run.tracking_uri:
        return run.tracking_uri
    if USER_TRACKING_URI:
        return USER_TRACKING_URI
    return f"sqlite:///{Path(run.runs_dir).resolve() / 'mlflow.db'}"


def ui_command_line(uri: str) -> str:
    """The ``cofr ui`` command, as one would type it here, that serves store ``uri``: bare
    for the store it serves by default (a run kept elsewhere is not in that one), else
    with ``--runs-dir`` for a ``<folder>/mlflow.db``, else with ``--tracking-uri``."""
    default = tracking_uri(RunConfig())
    database, default_database = sqlite_database(uri), sqlite_database(default)
    if uri == default or (
        database is not None
        and default_database is not None
        and database.expanduser().resolve() == default_database.expanduser().resolve()
    ):
        return "cofr ui"
    # MLFLOW_TRACKING_URI wins over --runs-dir in cofr ui: the store is named whole then.
    if database is not None and database.name == "mlflow.db" and not USER_TRACKING_URI:
        folder = database.expanduser().resolve().parent
        with contextlib.suppress(ValueError):  # a folder below this one: its short name
            folder = folder.relative_to(Path.cwd().resolve())
        return shlex.join(["cofr", "ui", "--runs-dir", str(folder)])
    return shlex.join(["cofr", "ui", "--tracking-uri", uri])


def tracking_uri_source(given: str | None, option: str = "--tracking-uri") -> str | None:
    """What named a command's store, for its messages: ``option`` when ``given``, else
    ``MLFLOW_TRACKING_URI`` when the user set it, else None (the runs folder's own)."""
    if given:
        return option
    return "MLFLOW_TRACKING_URI" if USER_TRACKING_URI else None


def check_tracking_uri(uri: str, timeout: float = 5.0, fix: str | None = None) -> None:
    """Refuse a tracking URI before a run starts: a scheme MLflow does not know, or a
    server that does not answer (MLflow's own client retries for minutes, silently).
    ``fix``: what the message tells the user to change (default: ``cofr fit``'s options)."""
    import urllib.error
    import urllib.request

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    fix = fix or "fix --run.tracking_uri (or MLFLOW_TRACKING_URI), or train with --run.mlflow false"
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout):
                return
        except urllib.error.HTTPError:
            return  # it answers: an older server without /health, or behind a proxy
        except (OSError, ValueError) as error:
            reason = getattr(error, "reason", error)
            raise ConfigError(
                f"no MLflow server answers at {uri} ({reason}): start it, or {fix}"
            ) from None
    database = sqlite_database(uri)
    if database is not None:  # a local store: made on first use, unless a file is in the way
        check_not_a_folder(database, fix)
        if database.expanduser().is_file():
            check_not_damaged(database, fix)
            if _experiment_count(database.expanduser()) == 0:
                raise ConfigError(f"{database} is {UNFINISHED_STORE}: {MOVE_IT_ASIDE}, or {fix}")
        return
    if is_server_url(uri):  # MLflow's client retried a server that is down for minutes
        error = connection_error(uri)
        shown = hide_passwords(uri)
        if isinstance(error, ImportError):
            raise ConfigError(
                f"MLflow cannot use {shown}: its database driver is not installed "
                f"({driver_reason(error)}): install it, or {fix}"
            )
        if error is not None:
            raise ConfigError(
                f"cannot reach the MLflow database {shown}: is the server up, and its host, "
                f"port, user and password right? ({driver_reason(error)}); {fix}"
            )
    try:
        MlflowClient(uri)
    except MlflowException as error:
        raise ConfigError(f"MLflow cannot use {uri!r}: {mlflow_refusal(error)}; {fix}") from None


def mlflow_refusal(error: Exception) -> str:
    """Why MLflow refused a store, for a one-line message: its file store refusal put
    plainly with the ways out; another message whole, less the sentences that only point
    to a web page (its first sentence alone dropped what it says to do)."""
    message = " ".join(str(error).split())
    if "MLFLOW_ALLOW_FILE_STORE" in message:  # MLflow 3: a folder of runs (./mlruns)
        return (
            "MLflow refuses a file store (a plain path or a file:// URI) unless "
            "MLFLOW_ALLOW_FILE_STORE=true is set: use a sqlite store such as "
            "sqlite:///runs/mlflow.db (the default; `mlflow migrate-filestore` moves a file "
            "store's runs into one), or set that variable"
        )
    sentences = [s for s in message.split(". ") if not s.startswith("See ")]
    return ". ".join(sentences or [message]).rstrip(".")


def artifact_location(run: RunConfig | str) -> str | None:
    """Where a new experiment keeps its artifacts: ``mlartifacts/`` beside a sqlite store's
    database file (``.../mlflow.db`` -> ``.../mlartifacts``), as a ``file:`` URI; None for a
    server, which decides for itself. ``run``: a run's settings or a tracking URI."""
    database = sqlite_database(tracking_uri(run) if isinstance(run, RunConfig) else run)
    return None if database is None else (database.resolve().parent / "mlartifacts").as_uri()


def check_store_exists(uri: str, named_by: str | None) -> None:
    """ConfigError when ``uri`` is a local sqlite store whose database file is not there
    (reading it would make an empty one, and a mistyped path would show no runs), or holds
    no MLflow store (:func:`store_problem`: an empty file, a damaged one, another
    program's database; MLflow's traceback ended "file is not a database").
    ``named_by``: the option or variable that gave ``uri`` (None: the default store of
    ``--runs-dir``), which the message tells the user to fix."""
    database = sqlite_database(uri)
    if database is None:
        return
    fix = f"fix {named_by}" if named_by else "name the runs folder with --runs-dir"
    check_not_a_folder(database, fix)
    if not database.expanduser().is_file():
        raise ConfigError(f"no run store at {database}: train a run first (cofr fit), or {fix}")
    # MLflow's client writes its schema into an empty file or another program's database:
    # a command that only reads (compare, ui) must leave it as it is.
    problem = store_problem(database.expanduser())
    if problem == EMPTY_FILE:
        raise ConfigError(
            f"{database} is an empty file, no MLflow store yet: it has no runs (cofr fit "
            f"makes them there), or {fix}"
        )
    if problem == UNFINISHED_STORE:
        raise ConfigError(f"{database} is {UNFINISHED_STORE}: {MOVE_IT_ASIDE}, or {fix}")
    if problem is not None:
        raise ConfigError(
            f"{database} is not an MLflow database ({problem}): move it aside (the next "
            f"cofr fit makes a new store), or {fix}"
        )


def check_not_a_folder(database: Path, fix: str) -> None:
    """ConfigError when the sqlite store's path ``database`` is a folder (SQLite's
    "unable to open database file" came as a traceback); ``fix``: the other way out."""
    if database.expanduser().is_dir():
        raise ConfigError(
            f"{database} is a folder, not an MLflow database file: give the database's own "
            f"path (sqlite:///<folder>/mlflow.db), or {fix}"
        )


def check_store_writable(uri: str, fix: str) -> None:
    """ConfigError when the local sqlite store ``uri`` cannot be written: its file, or the
    folder SQLite keeps its journal in (a fit failed with a screen of MLflow tracebacks
    after it had rewritten the run's config.yaml); a server's store is its own to say."""
    database = sqlite_database(uri)
    if database is None:
        return
    path = database.expanduser()
    folder = nearest_existing(path.absolute().parent)  # a file there: said where it is made
    for what, where, access in (("file", path, os.W_OK), ("folder", folder, os.W_OK | os.X_OK)):
        if (where.is_file() if what == "file" else where.is_dir()) and not os.access(where, access):
            raise ConfigError(
                f"cannot write the MLflow store {database}: its {what} {where} is read-only; "
                f"make it writable, or {fix}"
            )


def check_not_damaged(database: Path, fix: str) -> None:
    """ConfigError when the file ``database`` is not a readable SQLite database (MLflow's
    traceback ended "file is not a database"); ``fix``: the other way out, said last."""
    damage = sqlite_damage(database.expanduser())
    if damage is not None:
        raise ConfigError(
            f"{database} is not an MLflow database ({damage}): move it aside (the next "
            f"cofr fit makes a new store), or {fix}"
        )


def sqlite_damage(database: Path) -> str | None:
    """What SQLite says is wrong with ``database`` (``file is not a database``, ``database
    disk image is malformed``), or None when it reads; read-only, nothing is made."""
    tables = _sqlite_tables(database)
    return tables if isinstance(tables, str) else None


#: What :func:`store_problem` says of a 0-byte file.
EMPTY_FILE = "an empty file"
#: A store whose making was cut short (before :func:`make_store` made it whole): its
#: tables half there, every command that opened it failed in MLflow's migrations.
UNFINISHED_STORE = (
    "an MLflow store whose making was cut short (it has no experiment, not even MLflow's "
    "Default: a Ctrl-C as a first run started?)"
)
MOVE_IT_ASIDE = "move it aside (it holds no run; the next cofr fit makes a new store)"


def make_store(uri: str) -> None:
    """Make the local sqlite store ``uri`` when its file is not there: its tables are
    made in a file beside it, then linked in whole (never over a store another process
    made meanwhile). MLflow makes them in place over seconds, and a kill then (a Ctrl-C
    as a first fit started) left a store that every later command failed to open."""
    import secrets

    from mlflow.tracking import MlflowClient

    database = sqlite_database(uri)
    if database is None or database.expanduser().exists():
        return
    path = database.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    making = path.with_name(f".{path.name}.making-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        # search_experiments: opening makes the tables, the Default experiment after them.
        MlflowClient(f"sqlite:///{making}").search_experiments(max_results=1)
        try:
            os.link(making, path)  # the store's journal is a rollback one: the file is whole
        except FileExistsError:  # another process made it first: that one is kept
            pass
        except OSError:  # a file system without hard links: moved in unless one is there
            if not path.exists():
                os.replace(making, path)
    finally:
        making.unlink(missing_ok=True)


def unreachable_run(uri: str, run_id: str, fix: str = "--no-mlflow skips logging") -> str | None:
    """Why the training run ``run_id`` cannot be logged onto at ``uri`` (a local store
    that is not there: a moved or copied run folder; a run the store lacks; a server
    down), or None when it can; ``fix`` ends the reason. Creates no store on the way."""
    return reach_run(uri, run_id, fix)[1]


def reach_run(
    uri: str, run_id: str, fix: str = "--no-mlflow skips logging"
) -> tuple[Any, str | None]:
    """(MLflow's Run ``run_id`` at ``uri``, None) when it can be logged onto, else (None,
    why not: :func:`unreachable_run`'s reason). Creates no store on the way."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    moved = f"was the run folder moved or copied? {fix}"
    database = sqlite_database(uri)
    if database is not None:
        if not database.is_file():
            return None, f"no MLflow store at {uri} ({moved})"
        # SQLite takes an empty file for an empty database, and MLflow made its tables in it.
        damage = EMPTY_FILE if database.stat().st_size == 0 else sqlite_damage(database)
        if damage is not None:
            return None, f"{database} is not an MLflow database ({damage}; {moved})"
    try:
        return MlflowClient(uri).get_run(run_id), None
    except MlflowException as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return None, f"MLflow run {run_id} is not in {uri}: {first} ({moved})"


def store_problem(database: Path) -> str | None:
    """Why the SQLite file ``database`` holds no MLflow store: :data:`EMPTY_FILE`, what
    SQLite says is wrong with it, or that it has no MLflow tables (another program's
    database); None when it has them, or cannot be read now. One read-only look."""
    if database.stat().st_size == 0:
        return EMPTY_FILE
    tables = _sqlite_tables(database)
    if tables is None or isinstance(tables, str):
        return tables
    if "experiments" not in tables:
        return "an SQLite database without MLflow's tables"
    return UNFINISHED_STORE if _experiment_count(database) == 0 else None


def _experiment_count(database: Path) -> int | None:
    """How many experiments the MLflow store ``database`` holds (None: it cannot be read
    now, or has no such table). Read-only."""
    rows = _query(database, "SELECT COUNT(*) FROM experiments")
    return None if rows is None or isinstance(rows, str) else int(rows[0][0])


def _sqlite_tables(database: Path) -> list[str] | str | None:
    """The table names of the SQLite file ``database``; what SQLite says is wrong with it
    (damage); None when it cannot be read now (permissions: MLflow's own error says it
    better; locked by a writer: not damage). Read-only, nothing is made."""
    rows = _query(database, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return rows if rows is None or isinstance(rows, str) else [name for (name,) in rows]


def _query(database: Path, sql: str) -> list[tuple[Any, ...]] | str | None:
    """The rows of ``sql`` on the SQLite file ``database``, read-only; what SQLite says is
    wrong with the file (damage); None when it cannot be read now (permissions, a writer's
    lock, a table it lacks)."""
    import sqlite3

    try:
        # timeout 0: a store a writer holds locked is fine, and said so at once (5 s).
        connection = sqlite3.connect(f"{database.absolute().as_uri()}?mode=ro", uri=True, timeout=0)
    except sqlite3.Error:
        return None
    try:
        return connection.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return None
    except sqlite3.DatabaseError as error:
        return str(error)
    finally:
        connection.close()


def sqlite_database(uri: str) -> Path | None:
    """The database file of a local ``sqlite:///PATH[?options]`` store; None for others."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def cut(value: Any) -> str:
    """``value`` as an MLflow param value: text of at most MAX_PARAM_LENGTH characters."""
    text = str(value)
    return text if len(text) <= MAX_PARAM_LENGTH else text[: MAX_PARAM_LENGTH - 3] + "..."


def log_new_params(client: Any, run_id: str, params: dict[str, str]) -> list[str]:
    """Log the params the run does not have yet (a param cannot change once logged);
    returns the keys it has already with another value. (``MlflowClient.log_batch``
    splits a batch at MLflow's limits itself: 100 params or tags, 1000 metrics a call.)"""
    from mlflow.entities import Param

    existing = client.get_run(run_id).data.params
    client.log_batch(run_id, params=[Param(k, v) for k, v in params.items() if k not in existing])
    return [k for k, v in params.items() if k in existing and existing[k] != v]


def log_params_tagging_changes(
    client: Any, run_id: str, params: dict[str, str], untagged: tuple[str, ...] = ()
) -> list[str]:
    """:func:`log_new_params`, and for each param the run holds with another value the
    tag ``latest/<key>`` with the new one (a resume with more steps, a sweep's extended
    ``n_trials``: MLflow params cannot change); returns those keys. A param back at its
    first value loses the ``latest/<key>`` an earlier change set (the param is the latest).
    ``untagged``: params whose changes are no news (logged the first time only)."""
    from mlflow.entities import RunTag

    changed = [k for k in log_new_params(client, run_id, params) if k not in untagged]
    if changed:
        client.log_batch(run_id, tags=[RunTag(f"latest/{k}", params[k]) for k in changed])
    # lr 6e-4, resumed at 1e-4, then at 6e-4 again: the tag would still say 1e-4.
    tags = client.get_run(run_id).data.tags
    for key in params:
        if key not in changed and f"latest/{key}" in tags:
            client.delete_tag(run_id, f"latest/{key}")
    return changed


def scored_already(client: Any, run_id: str, key: str, step: int, value: Any) -> bool:
    """Whether ``value`` is the newest point of run ``run_id``'s ``key`` at ``step``: the
    same checkpoint scored again, one point, not two. Another value is logged, and so is
    a value back after another (the run's latest must be the newest score, which tags
    such as ``cofr eval``'s protocol describe)."""
    at_step = [m for m in client.get_metric_history(run_id, key) if m.step == step]
    return bool(at_step) and max(at_step, key=lambda m: m.timestamp).value == float(value)


def flatten(config: Any, prefix: str = "") -> dict[str, str]:
    """Nested dicts/lists -> {"a.b.0": "value"} with values cut to MAX_PARAM_LENGTH."""
    flat: dict[str, str] = {}
    if isinstance(config, dict):
        items = config.items()
    elif isinstance(config, (list, tuple)) and any(isinstance(v, (dict, list)) for v in config):
        items = ((str(i), v) for i, v in enumerate(config))
    else:
        return {prefix: cut(config)}
    for key, value in items:
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


@functools.cache  # the code a process runs is the one it imported: two git calls once
def _code_version() -> dict[str, str]:
    """cofrgenet's version and git commit and state (read only; callers copy it)."""
    tags: dict[str, str] = {}
    if (installed := package_version()) != "unknown":
        tags["cofrgenet.version"] = installed
    source = Path(__file__).resolve().parents[1]  # the package's folder

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit:  # an installed copy outside a checkout has none
        tags["mlflow.source.git.commit"] = commit
        changes = git("status", "--porcelain", "--untracked-files=no", "--", ".")
        tags["cofrgenet.git_dirty"] = "true" if changes else "false"
    return tags


def code_description() -> str:
    """The code that runs, in words for a report: ``cofrgenet 0.1.0, commit 1a2b3c4``, with
    ``(uncommitted changes)`` when its checkout has them."""
    tags = _code_version()
    words = [f"cofrgenet {tags.get('cofrgenet.version', 'unknown')}"]
    if commit := tags.get("mlflow.source.git.commit"):
        dirty = " (uncommitted changes)" if tags.get("cofrgenet.git_dirty") == "true" else ""
        words.append(f"commit {commit[:7]}{dirty}")
    return ", ".join(words)


def code_tags() -> dict[str, str]:
    """Which code made a run, as MLflow tags: cofrgenet's version, the git commit of its
    source (MLflow's "Git commit"; ``cofrgenet.git_dirty``: uncommitted changes in it)
    when it is a checkout, and the command line (``cofrgenet.command``, passwords hidden)."""
    return {**_code_version(), "cofrgenet.command": cut(shown_command_line())}

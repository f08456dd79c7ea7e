"""Where a study lives, who runs its trials, and what happens to a lost worker's trial.

Storage URLs:

* ``journal:PATH`` (or a path ending in ``.journal``): Optuna's journal file, for workers
  on one host. The default: ``journal:<runs_dir>/sweeps/<study>/optuna.journal``. Hosts
  that all mount one shared file system (NFSv3+, Lustre) may share it: its lock is
  Optuna's open()-based one (an ``O_EXCL`` lock file, atomic there; no ``flock``), and
  their clocks must agree, as heartbeats are compared across hosts. ``cofr sweep submit``
  asks ``--shared-journal`` for that with the default journal.
* ``postgresql://...`` (``mysql://``, ``sqlite:///...``): an RDB server, the sturdy choice
  for workers on many hosts. Never put sqlite files on NFS (its locks are unreliable
  there). Any other URL (a scheme SQLAlchemy does not know) is refused at once
  (:func:`check_rdb_url`).

Liveness. Every RUNNING trial carries its worker in user attributes (``cofr.host``,
``cofr.pid``, ``cofr.pid_start``: the process start time, so a reused pid is not taken
for the worker; ``cofr.worker_id``: ``slurm-<array job>_<task>`` under SLURM). Before it
asks for a trial, a worker fails the RUNNING trials whose worker is gone and queues a
retry of each (same params, ``failed_trial``/``retry_history`` system attributes as
Optuna's ``RetryHeartbeatStaleTrialCallback``, at most ``max_retry`` times), and the
retries that a worker killed between failing a trial and queueing it left behind
(:data:`RETRY_WANTED`). A worker is gone when

* it ran on this host and its process is dead (found at once: a killed local worker), or
* its heartbeat is older than ``grace_period`` seconds: RDB storages use Optuna's
  heartbeat table; journal storages a ``cofr.heartbeat`` user attribute that the worker
  rewrites every ``heartbeat_interval`` seconds (journal files have no heartbeat).

A SLURM array task that comes back after a requeue takes over its own RUNNING trial
(same ``cofr.worker_id``) before the grace period ends; a retry (any worker) resumes the
checkpoint of the trial it retries, since the run folder is named by the first attempt.

Optuna's API. The sweeps use Optuna's public API, with the storage object that
:func:`open_storage` returned (a study keeps its own, wrapped, copy privately). The one
thing it has no public equivalent for, listing an RDB study's heartbeat-stale trials
without failing them, is :func:`stale_trial_numbers`, at the end of this module;
``tests/test_sweeps.py`` holds it to the Optuna versions in :data:`OPTUNA_TESTED`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, TrialState

from cofrgenet.atomic import why_no_folder
from cofrgenet.databases import connection_error
from cofrgenet.databases import reason as driver_reason
from cofrgenet.errors import did_you_mean
from cofrgenet.redact import hide_passwords
from cofrgenet.sweeps.spec import StorageOptions, Sweep, SweepError
from cofrgenet.training.run_store import (
    SLURM_TAGS,
    slurm_run_name,
    slurm_tags,
    sqlite_database,
)

log = logging.getLogger("cofrgenet.sweeps")

# User attributes a worker writes on its trials.
HOST, PID, PID_START, WORKER, WORKER_ID = (
    "cofr.host",
    "cofr.pid",
    "cofr.pid_start",
    "cofr.worker",
    "cofr.worker_id",
)
HEARTBEAT, STARTED, FAIL_REASON, RESUMED = (
    "cofr.heartbeat",
    "cofr.started",
    "fail_reason",
    "cofr.resumed_from_step",
)
#: Why a trial was pruned (the pruner's step and values), beside FAIL_REASON.
PRUNE_REASON = "pruned"
#: A lost trial's last heartbeat, kept when it is failed: its duration ends there, not
#: when another worker noticed.
LAST_SEEN = "cofr.last_seen"
#: When a worker left its RUNNING trial for a SLURM requeue (seconds since the epoch);
#: cleared when the requeued task takes it up again.
REQUEUED = "cofr.requeued_at"
#: A queued grid point's values (Optuna gives a WAITING trial no params until it runs).
GRID_POINT = "cofr.grid_point"
#: Set on a trial failed untrained because it was made by mistake (a grid worker's ask
#: found the last queued point taken by another worker): it counts for no budget.
DISCARDED = "cofr.discarded"
#: Set on a trial before it is failed for a retry: who failed it and when ({cofr.host,
#: cofr.pid, cofr.pid_start, at}). Failing and queueing the retry are two writes; a
#: worker killed between them leaves this, and the next check for lost trials queues the
#: retry (:func:`queue_missing_retries`), else the point would never run again.
RETRY_WANTED = "cofr.retry_wanted"
#: Set on a trial a signal stopped (SIGTERM or Ctrl-C, from the user or the scheduler):
#: the signal's name. Its retry does not count towards ``max_retry``, which bounds the
#: attempts of lost or failing workers; a stop is no fault of the trial's.
STOPPED = "cofr.stopped_by"
#: The system attribute that carries, from retry to retry, the numbers of the earlier
#: attempts a signal stopped (:data:`STOPPED`): :func:`counted_attempts` leaves them out.
STOPPED_ATTEMPTS = "cofr.stopped_attempts"
#: A retry's copy of the scores its failed attempt reported ({step: value}): the retry
#: reports those up to the step it resumes from (PruneAtStep.on_train_start), so that
#: the pruner sees its whole curve once it completes, and none it trains again.
ATTEMPT_SCORES = "cofr.attempt_scores"
SLURM_JOB, SLURM_ARRAY_JOB, SLURM_ARRAY_TASK, SLURM_PROC = SLURM_TAGS  # the keys of slurm_tags()


def default_storage(sweep: Sweep, runs_dir: str | None = None) -> str:
    folder = Path(runs_dir or sweep.runs_dir) / "sweeps" / sweep.study
    return f"journal:{(folder / 'optuna.journal').resolve()}"


def home_storage(sweep: Sweep, runs_dir: str | None = None) -> str:
    """Where the sweep file keeps its study: its ``storage``, else the default journal.

    A ``storage`` naming an unset variable inside a longer URL is refused here, where it
    would be used (a ``--storage`` given instead never gets here)."""
    if sweep.storage_error:
        raise SweepError(sweep.storage_error)
    return sweep.storage or default_storage(sweep, runs_dir)


def study_folder(sweep: Sweep, runs_dir: str | None = None) -> Path:
    """``<runs_dir>/sweeps/<study>/``: the journal, worker logs, reports, sbatch files."""
    return Path(runs_dir or sweep.runs_dir) / "sweeps" / sweep.study


def journal_path(url: str) -> Path | None:
    """The journal file of a ``journal:PATH`` or bare ``*.journal`` storage, else None."""
    if url.startswith("journal:"):
        return _journal_file(url, url[len("journal:") :].removeprefix("//"))
    if url.endswith((".journal", ".log")) and "://" not in url:
        scheme = re.match(r"([A-Za-z][\w+.-]*):", url)
        if scheme:  # "jornal:/x.journal" would be a folder named "jornal:" in the cwd
            hint = did_you_mean(scheme.group(1), ["journal"])
            raise SweepError(
                f"storage {url!r}: unknown scheme {scheme.group(1) + ':'!r}{hint}; use "
                f"{STORAGE_FORMS}"
            )
        return _journal_file(url, url)
    return None


def _journal_file(url: str, path: str) -> Path:
    """``path``, the journal file of storage ``url``; SweepError for an empty path or a
    folder (``journal:`` is the working directory), which Optuna fails to open with a
    traceback once the study is opened (and ``submit`` wrote into its script)."""
    if not path.strip():
        raise SweepError(
            f"storage {url!r}: a journal needs a file path, and none is given: give one, "
            "e.g. journal:runs/sweeps/<study>/optuna.journal"
        )
    if path.endswith(("/", os.sep)) or Path(path).expanduser().is_dir():
        folder = path.rstrip("/" + os.sep) or path
        raise SweepError(
            f"storage {url!r}: a journal needs a file path, and {path} is a folder: give a "
            f"file in it, e.g. journal:{folder}/optuna.journal"
        )
    return Path(path)


def storage_file(url: str) -> Path | None:
    """The file a journal or sqlite storage lives in; None for a database server."""
    path = journal_path(url) or sqlite_database(url)
    return None if path is None else path.expanduser()


def check_given_storage(given: str | None, home: str, study: str) -> None:
    """SweepError for a ``--storage`` file that does not exist while the study's own
    storage ``home`` (the sweep file's, or the default journal) does: Optuna would start
    the study anew in the mistyped file, and its trials would repeat the study's."""
    given_file, home_file = storage_file(given or ""), storage_file(home)
    if given_file is None or given_file.exists() or home_file is None:
        return
    if not home_file.exists() or given_file.resolve() == home_file.resolve():
        return
    if journal_path(home) is not None and study not in _journal_study_names(home_file):
        return  # the study is not there either (an empty journal a refused start left)
    raise SweepError(
        f"--storage {hide_passwords(given or '')}: no such file, and study {study!r} is "
        f"stored in {home_file}: leave out --storage to go on with it, or give --study "
        "NAME to start a new study in that file"
    )


def delete_study_command(study: str, url: str) -> str:
    """The ``optuna delete-study`` command for ``study`` in ``url``, as Optuna's CLI takes
    it: a journal file by its path and storage class (``journal:PATH`` it cannot guess),
    a database URL with its password hidden."""
    import shlex

    words = ["optuna", "delete-study", "--study-name", study, "--storage"]
    path = journal_path(url)
    if path is not None:
        words += [str(path), "--storage-class", "JournalFileBackend"]
    else:
        words.append(hide_passwords(url))
    return shlex.join(words)


def _journal_study_names(path: Path) -> list[str]:
    """The studies a journal file holds ([] when it cannot be read as one)."""
    try:
        return optuna.get_all_study_names(JournalStorage(JournalFileBackend(str(path))))
    except Exception:
        return []


def open_storage(url: str, options: StorageOptions | None = None) -> BaseStorage:
    """A journal or RDB storage; RDB ones with heartbeats (``heartbeat_interval``)."""
    options = options or StorageOptions()
    path = journal_path(url)
    if path is not None:
        return _open_journal(path)
    check_rdb_url(url)
    check_reachable(url)
    # Workers that start together on a new database race to create Optuna's tables; the
    # losers fail on a duplicate type or table. Creation is idempotent: try again.
    for attempt in range(6):
        try:
            with warnings.catch_warnings():  # "heartbeat_interval is experimental": chosen
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    url,
                    engine_kwargs=None if url.startswith("sqlite") else {"pool_pre_ping": True},
                    heartbeat_interval=options.heartbeat_interval,
                    grace_period=options.grace_period,
                )
        except ImportError as error:
            driver = (
                "MySQL: pip install mysqlclient, or PyMySQL with mysql+pymysql://"
                if url.startswith("mysql")
                else "PostgreSQL: pip install 'psycopg[binary]'"
            )
            raise SweepError(
                f"storage {hide_passwords(url)!r}: {error}; install its database driver ({driver})"
            ) from None
        except Exception as error:
            from sqlalchemy.exc import DBAPIError

            database = isinstance(error, DBAPIError)
            if database and (attempt == 5 or _sqlite_cannot_write(url, error)):
                raise SweepError(_unreachable(url, error)) from None
            if attempt == 5:
                raise
            log.warning(f"opening {hide_passwords(url)} failed ({error!r:.200}); retrying")
            time.sleep(0.5 + random.random() * 2)
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ journal files


class _RepairingLock(JournalFileOpenLock):
    """Optuna's open() lock on a journal file (the one every append takes), cutting a torn
    last record off before its holder appends.

    A record is torn when its writer died, or the disk filled, in the middle of an append;
    the next append would glue a whole record onto it, a line no reader parses again. The
    check, the copy and the cut run under the lock every writer holds while it appends, so
    no append can land in between, and a second worker that takes the lock next finds the
    file whole and leaves it alone (two workers starting together cannot both cut). It runs
    at every append, not only at start, so workers already running when another one died
    mid-write are covered too. Readers take no lock, but they skip an unterminated last
    line, so the cut only removes bytes they never counted.
    """

    def __init__(self, journal: Path) -> None:
        super().__init__(str(journal))
        self.journal = journal

    def acquire(self) -> bool:
        super().acquire()
        try:
            repair_torn_tail(self.journal)
        except BaseException:
            self.release()
            raise
        return True


def _open_journal(path: Path) -> JournalStorage:
    make_folder(path.parent, "the study's storage", "--storage or --runs-dir")
    if not path.exists():  # made here, as Optuna would, to say why it cannot be
        try:
            path.touch()
        except OSError as error:
            raise SweepError(
                f"cannot make the study's journal {path}: {error.strerror or error}; "
                "choose another with --storage or --runs-dir"
            ) from None
    # The open() lock works on NFSv3+ and Lustre too (see the module's docstring), and is
    # released after 30 s if its holder died.
    lock = _RepairingLock(path)
    try:  # once now: a torn tail is cut (and reported) before the study is read
        lock.acquire()
        lock.release()
    except OSError as error:  # e.g. a read-only copy: reading works without the check
        log.warning(f"{path}: cannot take its lock to check its last record ({error})")
    backend = JournalFileBackend(str(path), lock_obj=lock)
    try:
        return JournalStorage(backend)
    except ValueError as error:  # json.JSONDecodeError, or Optuna's "Invalid log format."
        raise SweepError(damaged_journal(path, error)) from None


def make_folder(folder: Path, what: str, options: str) -> None:
    """``mkdir -p folder``, or a one-line SweepError naming ``what`` it is for and the
    ``options`` that choose another."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SweepError(
            f"cannot make {folder}, the folder of {what}: {why_no_folder(folder, error)}; "
            f"choose another with {options}"
        ) from None


def _torn_copy(journal: Path) -> Path:
    """A new ``<journal>.torn-<UTC time>`` path (never one that exists)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        copy = journal.with_name(f"{journal.name}.torn-{stamp}" + (f"-{n}" if n else ""))
        if not copy.exists():
            return copy
    raise SweepError(f"{journal}: too many {journal.name}.torn-* copies; remove old ones")


def repair_torn_tail(journal: Path) -> Path | None:
    """Cut a last record without its newline off ``journal``, after copying the whole file
    to ``<journal>.torn-<UTC time>``; that copy, or None when the file ends whole.

    Call it holding the journal's lock (:class:`_RepairingLock`).
    """
    try:
        with open(journal, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return None
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return None
            # Back to the last newline: the torn record is at most one record long.
            end, chunk = size, 1 << 16
            while end > 0:
                start = max(0, end - chunk)
                handle.seek(start)
                found = handle.read(end - start).rfind(b"\n")
                if found >= 0:
                    end = start + found + 1
                    break
                end = start
            handle.seek(end)
            torn = handle.read()
    except FileNotFoundError:
        return None
    copy = _torn_copy(journal)
    try:
        with open(journal, "rb") as source, open(copy, "xb") as target:
            shutil.copyfileobj(source, target)
            target.flush()
            os.fsync(target.fileno())
    except OSError as error:
        copy.unlink(missing_ok=True)
        # Never cut without a copy: the journal stays as it is, and nobody appends.
        raise SweepError(
            f"{journal} ends in a cut-off record, and keeping a copy before removing it "
            f"failed ({error}); free disk space and run again"
        ) from None
    with open(journal, "r+b") as handle:
        handle.truncate(end)
        handle.flush()
        os.fsync(handle.fileno())
    trial = re.search(rb'"trial_id":\s*(\d+)', torn)
    what = f" of trial id {int(trial.group(1))}" if trial else ""
    log.warning(
        f"{journal}: removed its last record{what} ({len(torn)} bytes without a newline: a "
        f"worker died or the disk filled while writing it); the whole file is kept as "
        f"{copy}. A trial it belonged to may stay RUNNING until a worker fails it as lost"
    )
    return copy


def damaged_journal(journal: Path, error: Exception) -> str:
    """What is wrong with a journal Optuna cannot read, and how to repair it by hand."""
    number, how = None, "delete that line"
    try:
        with open(journal, "rb") as handle:
            for number, line in enumerate(handle, start=1):  # noqa: B007 - read after
                try:
                    json.loads(line)
                    if line.endswith(b"\n"):
                        continue
                except ValueError:
                    pass
                glued = line.rfind(b'{"op_code"')
                if glued > 0:
                    with contextlib.suppress(ValueError):
                        json.loads(line[glued:])
                        how = (
                            f"delete its first {glued} bytes (a cut-off record that a "
                            "later one was appended to)"
                        )
                break
    except OSError:
        number = None
    where = f"line {number}" if number else f"a line ({str(error)[:80]})"
    return (
        f"the study journal {journal} is damaged: {where} is not a whole JSON record; "
        f"keep a copy of the file, then {how}"
    )


# ------------------------------------------------------------------ databases


def check_reachable(url: str) -> None:
    """SweepError, after a few tries, for a database server that cannot be reached (down,
    wrong host, port, user or password): at once, not as a driver traceback after the
    table-creation retries of :func:`open_storage`."""
    from sqlalchemy.engine import make_url

    if make_url(url).get_backend_name() == "sqlite":  # a file: check_rdb_url checked its folder
        return
    error = connection_error(url, tries=3)
    if error is not None and not isinstance(error, ImportError):  # open_storage names a driver
        raise SweepError(_unreachable(url, error))


def holds_studies(url: str) -> bool:
    """Whether the database at ``url`` holds Optuna's tables, asked without making them
    (opening it as a storage does): a preview (``submit --dry-run``) writes nothing."""
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        return inspect(engine).has_table("studies")
    finally:
        engine.dispose()


def _sqlite_cannot_write(url: str, error: Exception) -> bool:
    """Whether ``error`` says a sqlite file cannot be made or written (a read-only
    folder), or is damaged: no retry mends that."""
    text = str(getattr(error, "orig", None) or error)
    cannot = ("unable to open database file", "readonly database", "read-only file system")
    return sqlite_database(url) is not None and any(
        c in text.lower() for c in (*cannot, *SQLITE_DAMAGE)
    )


#: SQLite's words for a file that is no database, or a damaged one.
SQLITE_DAMAGE = ("file is not a database", "database disk image is malformed")


def _unreachable(url: str, error: Exception) -> str:
    reason = driver_reason(error)
    if (path := sqlite_database(url)) is not None and any(d in reason for d in SQLITE_DAMAGE):
        return (
            f"the study database {path} is damaged ({reason}): restore it from a copy, or "
            "move it aside to start its studies anew, or choose another with --storage"
        )
    if path is not None:  # a local file: no server to ask about
        return (
            f"cannot open the study database {path} ({reason}): its folder must be "
            "writable; choose another with --storage"
        )
    return (
        f"cannot reach the study database {hide_passwords(url)}: is the server up, and "
        f"its host, port, user and password right? ({reason})"
    )


STORAGE_FORMS = (
    "journal:PATH (or a *.journal path), sqlite:///PATH.db or "
    "postgresql://user:password@host:5432/db"
)


def check_rdb_url(url: str) -> None:
    """SweepError at once for a storage that is no journal and no database URL
    SQLAlchemy knows (instead of retrying it), or a sqlite file in a missing folder."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = hide_passwords(url)
    if "://" not in url:
        raise SweepError(
            f"storage {shown!r}: not a journal file or database URL; use {STORAGE_FORMS}"
        )
    scheme = url.split("://", 1)[0]
    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError):
        hint = did_you_mean(scheme.split("+")[0], ["journal", "sqlite", "postgresql", "mysql"])
        raise SweepError(
            f"storage {shown!r}: unknown URL scheme {scheme + '://'!r}{hint}; use {STORAGE_FORMS}"
        ) from None
    database = parsed.database
    if parsed.get_backend_name() == "sqlite" and database in (None, "", ":memory:"):
        raise SweepError(
            f"storage {shown!r} is an in-memory database: the study would end with the "
            "worker; give a file, sqlite:///PATH.db"
        )
    if parsed.get_backend_name() == "sqlite":
        folder = Path(database).expanduser().parent
        if not folder.is_dir():
            raise SweepError(f"storage {shown!r}: no folder {folder} for the sqlite file")


# ----------------------------------------------------------------------- the worker


def _pid_start(pid: int) -> str | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so count from its ")".
    return stat.rsplit(")", 1)[1].split()[19]


def _pid_zombie(pid: int) -> bool:
    """Whether ``pid`` has ended but is not yet reaped (state Z in ``/proc/PID/stat``; a
    SIGKILLed worker whose parent has not waited for it): kill(pid, 0) still finds it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False  # no /proc (not Linux), or gone: kill() decides
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # field 3, after the command name


def pid_alive(pid: int, start: str | None) -> bool:
    """Whether process ``pid`` of this host, started at ``start`` (:func:`_pid_start`;
    None: any start) still runs: a zombie has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return not _pid_zombie(pid)
    if _pid_zombie(pid):
        return False
    if start is None or not Path("/proc").is_dir():
        return True
    return _pid_start(pid) == start


@dataclass(frozen=True)
class Worker:
    """This process as a sweep worker."""

    host: str
    pid: int
    pid_start: str | None
    #: Stable across requeues under SLURM (the array task or the job, and the task of a
    #: step that runs several: ``srun -n 2 cofr sweep run``); None elsewhere.
    worker_id: str | None
    slurm: dict[str, str]

    @classmethod
    def current(cls) -> Worker:
        slurm = slurm_tags()
        worker_id = slurm_run_name()  # the array job and task, or the job
        if worker_id and slurm.get(SLURM_PROC, "0") != "0":  # one of several srun tasks
            worker_id += f".{slurm[SLURM_PROC]}"
        pid = os.getpid()
        return cls(socket.gethostname(), pid, _pid_start(pid), worker_id, slurm)

    @property
    def label(self) -> str:
        where = f"{self.host}:{self.pid}"
        return f"{self.worker_id} ({where})" if self.worker_id else where

    @property
    def index(self) -> int | None:
        """The SLURM array task index, when there is one (seeds samplers apart)."""
        task = self.slurm.get(SLURM_ARRAY_TASK)
        return int(task) if task and task.isdigit() else None

    def attrs(self) -> dict[str, Any]:
        return {
            HOST: self.host,
            PID: self.pid,
            PID_START: self.pid_start,
            WORKER: self.label,
            WORKER_ID: self.worker_id,
            **self.slurm,
        }


# ------------------------------------------------------------------ trials by number


def trial_id(storage: BaseStorage, study: optuna.Study, number: int) -> int:
    """The storage's id of trial ``number`` (what BaseStorage's trial methods take).

    Optuna keeps a trial's id private (``Trial._trial_id``); the storage maps study name
    and trial number to it publicly.
    """
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def frozen_trial(storage: BaseStorage, study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` as stored now (an ``optuna.Trial``'s own attributes are a cache)."""
    return storage.get_trial(trial_id(storage, study, number))


def open_trial(storage: BaseStorage, study: optuna.Study, number: int) -> optuna.Trial:
    """A handle on RUNNING trial ``number``, for a process other than the one that asked it.

    A requeued SLURM task resumes its own trial and a ``ddp_spawn`` rank reports to its
    parent's; ``study.ask`` only makes new trials or takes WAITING ones. Optuna's docs
    advise against calling the (public) ``Trial`` constructor directly: this is the one
    place that does.
    """
    return optuna.Trial(study, trial_id(storage, study, number))


def uses_heartbeat_table(storage: BaseStorage) -> bool:
    """An RDB storage opened with heartbeats: liveness is Optuna's heartbeat table.

    ``storage`` is the one :func:`open_storage` returned: a study wraps an RDB storage
    in a cache that is not an ``RDBStorage``.
    """
    return isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None


def claim(storage: BaseStorage, study: optuna.Study, number: int, worker: Worker) -> None:
    """Mark RUNNING trial ``number`` as this worker's and beat its heart once."""
    tid = trial_id(storage, study, number)
    for key, value in {**worker.attrs(), HEARTBEAT: time.time()}.items():
        storage.set_trial_user_attr(tid, key, value)
    if uses_heartbeat_table(storage):
        storage.record_heartbeat(tid)


class Heartbeat:
    """A thread that keeps a trial alive in the storage while it trains.

    After each beat it reads the trial's state: a trial that another worker ended (it
    took this worker for lost: a storage that refused its heartbeats for a grace period,
    hosts whose clocks disagree) touches ``ended_file``, which the fit polls
    (:class:`~cofrgenet.sweeps.objective.PruneAtStep`) to save and stop, leaving the run
    folder to the trial's retry. The beats stop there.
    """

    def __init__(
        self,
        storage: BaseStorage,
        study: optuna.Study,
        number: int,
        interval: float,
        ended_file: Path | None = None,
    ) -> None:
        self.storage = storage
        self.number = number
        self.trial_id = trial_id(storage, study, number)
        self.interval = max(1.0, float(interval))
        self.ended_file = ended_file
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cofr-heartbeat", daemon=True)

    def beat(self) -> None:
        if uses_heartbeat_table(self.storage):
            self.storage.record_heartbeat(self.trial_id)
        else:
            self.storage.set_trial_user_attr(self.trial_id, HEARTBEAT, time.time())

    def trial_finished(self) -> bool:
        """Whether the trial is finished in the storage: by another worker, since this one
        never finishes it while the heartbeat runs."""
        return self.storage.get_trial(self.trial_id).state.is_finished()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
                ended = self.trial_finished()
            except optuna.exceptions.UpdateFinishedTrialError:
                ended = True
            except Exception as error:  # a flaky database must not kill the training
                log.warning(f"heartbeat: {error}")
                continue
            if ended and not self._stop.is_set():
                self._mark_ended()
                return

    def _mark_ended(self) -> None:
        log.warning(
            f"trial {self.number} was ended by another worker, which took this one for "
            "lost: this worker saves its checkpoint and stops the fit; the trial's retry, "
            "if it has one, resumes from it"
        )
        if self.ended_file is not None:
            try:
                self.ended_file.touch()
            except OSError as error:
                log.warning(f"heartbeat: cannot write {self.ended_file}: {error}")

    def __enter__(self) -> Heartbeat:
        if self.ended_file is not None:
            self.ended_file.unlink(missing_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.ended_file is not None:
            self.ended_file.unlink(missing_ok=True)


# ------------------------------------------------------------------ lost workers


def held_by_live_process(trial: FrozenTrial) -> bool:
    """Whether the process that claimed ``trial`` runs on this host now (this one included)."""
    attrs = trial.user_attrs
    host, pid = attrs.get(HOST), attrs.get(PID)
    if host != socket.gethostname() or not isinstance(pid, int):
        return False
    return pid == os.getpid() or pid_alive(pid, attrs.get(PID_START))


def last_seen(trial: FrozenTrial, storage: BaseStorage) -> float | None:
    """When a trial's worker last beat its heart (seconds since the epoch), where the
    trial's own attributes say it (not on an RDB with Optuna's heartbeat table)."""
    beat = trial.user_attrs.get(HEARTBEAT)
    if beat is None or uses_heartbeat_table(storage):
        return None
    return float(beat)


def lost_reason(trial: FrozenTrial, storage: BaseStorage, options: StorageOptions) -> str | None:
    """Why a RUNNING trial's worker is gone, or None while it may be alive."""
    attrs = trial.user_attrs
    if held_by_live_process(trial):  # on this host: its process decides, not the clock
        return None
    requeued = attrs.get(REQUEUED)
    if isinstance(requeued, int | float):  # its process is gone by design: the clock decides
        waited = time.time() - requeued
        if waited <= options.grace_period:
            return None
        return (
            f"worker {attrs.get(WORKER, '?')} left it for a SLURM requeue {waited:.0f} s ago "
            f"and has not come back (grace period {options.grace_period} s)"
        )
    host, pid = attrs.get(HOST), attrs.get(PID)
    if host == socket.gethostname() and isinstance(pid, int) and pid != os.getpid():
        return f"worker {attrs.get(WORKER, pid)} died during the trial (process gone)"
    beat = attrs.get(HEARTBEAT)
    if beat is not None and uses_heartbeat_table(storage):
        # Claimed, so it has a row in Optuna's heartbeat table, which decides (lost_trials).
        return None
    if beat is None:
        start = trial.datetime_start.timestamp() if trial.datetime_start else None
        beat = start
    if beat is not None and time.time() - float(beat) > options.grace_period:
        return (
            f"worker {attrs.get(WORKER, '?')} lost: no heartbeat for more than "
            f"{options.grace_period} s"
        )
    return None


def counted_attempts(trial: FrozenTrial) -> int:
    """The attempts of ``trial``'s point, itself included, that count towards
    ``max_retry``: all but those a signal stopped (:data:`STOPPED`)."""
    stopped = len(trial.system_attrs.get(STOPPED_ATTEMPTS) or [])
    stopped += 1 if trial.user_attrs.get(STOPPED) else 0
    return len(trial.system_attrs.get("retry_history") or []) + 1 - stopped


def retry_trial(study: optuna.Study, trial: FrozenTrial, max_retry: int | None) -> int | None:
    """Queue a WAITING copy of a failed trial; its number, or None past ``max_retry``
    (attempts a signal stopped not counted: :func:`counted_attempts`)."""
    if max_retry is not None and counted_attempts(trial) > max_retry:
        return None
    system_attrs: dict[str, Any] = {
        "failed_trial": trial.number,
        "retry_history": [],
        **trial.system_attrs,
    }
    system_attrs["retry_history"] = [*system_attrs["retry_history"], trial.number]
    if trial.user_attrs.get(STOPPED):
        stopped = system_attrs.get(STOPPED_ATTEMPTS) or []
        system_attrs[STOPPED_ATTEMPTS] = [*stopped, trial.number]
    user_attrs = {
        k: v for k, v in trial.user_attrs.items() if not k.startswith(("cofr.", "slurm."))
    }
    user_attrs.pop(FAIL_REASON, None)
    if GRID_POINT in trial.user_attrs:  # the point it retries (queue_missing_points)
        user_attrs[GRID_POINT] = trial.user_attrs[GRID_POINT]
    if trial.intermediate_values:  # JSON: steps as text
        user_attrs[ATTEMPT_SCORES] = {str(k): v for k, v in trial.intermediate_values.items()}
    # Grid bookkeeping belongs to the failed attempt.
    system_attrs.pop("grid_id", None)
    system_attrs.pop("search_space", None)
    study.add_trial(
        optuna.create_trial(
            state=TrialState.WAITING,
            params=trial.params,
            distributions=trial.distributions,
            user_attrs=user_attrs,
            system_attrs=system_attrs,
        )
    )
    for queued in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        history = queued.system_attrs.get("retry_history") or []
        if history and history[-1] == trial.number:
            return queued.number
    return None


def trial_params(trial: FrozenTrial) -> dict[str, Any]:
    """The trial's parameter values: its params, or the grid point it is queued for."""
    return trial.params or dict(trial.user_attrs.get(GRID_POINT) or {})


def grid_point(trial: FrozenTrial) -> dict[str, Any]:
    """The grid point a trial is for: the one it was queued for, which a trial that
    failed before suggesting every parameter holds whole (its params do not)."""
    point = trial.user_attrs.get(GRID_POINT)
    return dict(point) if point else dict(trial.params)


def retry_intent() -> dict[str, Any]:
    """The :data:`RETRY_WANTED` value of this process: who fails the trial, and when."""
    pid = os.getpid()
    return {HOST: socket.gethostname(), PID: pid, PID_START: _pid_start(pid), "at": time.time()}


def fail_trial(storage: BaseStorage, trial_id: int, reason: str, retry: bool = False) -> bool:
    """RUNNING -> FAIL with ``fail_reason``; False when another process finished it first.
    ``retry``: the caller queues a retry next; recorded first (:data:`RETRY_WANTED`)."""
    try:
        storage.set_trial_user_attr(trial_id, FAIL_REASON, reason[:2000])
        if retry:
            storage.set_trial_user_attr(trial_id, RETRY_WANTED, retry_intent())
        return bool(storage.set_trial_state_values(trial_id, TrialState.FAIL))
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def lost_trials(
    study: optuna.Study,
    storage: BaseStorage,
    options: StorageOptions,
    spare: str | None = None,
    stale: set[int] | None = None,
) -> dict[int, str]:
    """The RUNNING trials whose worker is gone: {trial number: why}.

    ``spare``: a worker id whose trials are left alone (a requeued SLURM task about to
    resume its own trial). ``stale``: the numbers of RDB trials whose heartbeat is too
    old (:func:`stale_trial_numbers`); read here when not given.
    """
    if stale is None:
        stale = stale_trial_numbers(storage, study) or set()
    lost: dict[int, str] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if spare and trial.user_attrs.get(WORKER_ID) == spare:
            continue
        reason = lost_reason(trial, storage, options)
        if reason is None and trial.number in stale and not held_by_live_process(trial):
            reason = (
                f"worker {trial.user_attrs.get(WORKER, '?')} lost: no heartbeat for more "
                f"than {options.grace_period} s"
            )
        if reason is not None:
            lost[trial.number] = reason
    return lost


def fail_lost_trials(
    study: optuna.Study,
    storage: BaseStorage,
    options: StorageOptions,
    spare: str | None = None,
) -> list[tuple[int, int | None]]:
    """Fail the RUNNING trials whose worker is gone and queue their retries.

    ``spare`` as in :func:`lost_trials`. Returns (failed trial number, retry number or
    None) for the trials this process failed (another worker may fail one first).
    """
    stale = stale_trial_numbers(storage, study)
    if stale is None and uses_heartbeat_table(storage):
        # Without the stale list: Optuna's public sweep fails them, with no reason or retry.
        optuna.storages.fail_stale_trials(study)
    done: list[tuple[int, int | None]] = []
    for number, reason in lost_trials(study, storage, options, spare, stale or set()).items():
        tid = trial_id(storage, study, number)
        seen = last_seen(storage.get_trial(tid), storage)
        if seen is not None:
            storage.set_trial_user_attr(tid, LAST_SEEN, seen)
        if fail_trial(storage, tid, reason, retry=True):
            frozen = storage.get_trial(tid)
            done.append((number, retry_trial(study, frozen, options.max_retry)))
    queue_missing_retries(study, storage, options)
    return done


def retry_left_behind(intent: Any, options: StorageOptions) -> bool:
    """Whether the process that failed a trial for a retry (``intent``, its
    :data:`RETRY_WANTED`) can no longer queue it: this process (it queues right after
    failing, so it got here without), one on this host that is dead, or one elsewhere
    more than ``grace_period`` seconds ago. A live one is left to queue it itself."""
    if not isinstance(intent, dict):
        return True
    host, pid = intent.get(HOST), intent.get(PID)
    if host == socket.gethostname() and isinstance(pid, int):
        return pid == os.getpid() or not pid_alive(pid, intent.get(PID_START))
    at = intent.get("at")
    return not isinstance(at, int | float) or time.time() - at > options.grace_period


def unqueued_retries(trials: list[FrozenTrial], max_retry: int | None) -> list[FrozenTrial]:
    """The failed trials that want a retry (:data:`RETRY_WANTED`, within ``max_retry``)
    which no trial is yet: the study is not done while there are any."""
    retried = retried_numbers(trials)
    out = []
    for trial in trials:
        if trial.state != TrialState.FAIL or not trial.user_attrs.get(RETRY_WANTED):
            continue
        within = max_retry is None or counted_attempts(trial) <= max_retry
        if trial.number not in retried and within:
            out.append(trial)
    return out


def queue_missing_retries(
    study: optuna.Study, storage: BaseStorage, options: StorageOptions
) -> list[tuple[int, int]]:
    """Queue the retry of each failed trial that wanted one (:data:`RETRY_WANTED`) when no
    trial retries it and the worker that failed it cannot queue it any more (killed
    between the two writes). Returns (failed trial, its retry). Workers that do this at
    once queue a copy each: all but one are then discarded (:func:`drop_duplicate_retries`)."""
    done: list[tuple[int, int]] = []
    for trial in unqueued_retries(study.get_trials(deepcopy=False), options.max_retry):
        if not retry_left_behind(trial.user_attrs.get(RETRY_WANTED), options):
            continue
        retry = retry_trial(study, trial, options.max_retry)
        if retry is not None:
            log.warning(
                f"trial {trial.number}: its worker failed it for a retry but stopped before "
                f"queueing it; retried as trial {retry}"
            )
            done.append((trial.number, retry))
    if done:
        drop_duplicate_retries(study, storage)
    return done


def drop_duplicate_retries(study: optuna.Study, storage: BaseStorage) -> None:
    """Discard (:data:`DISCARDED`, FAIL) the waiting retries of a trial beyond one: the
    one a worker took already, else the first. Each worker that queued a missing retry
    runs this after, so of copies queued at once, every such worker keeps the same one."""
    by_failed: dict[int, list[FrozenTrial]] = {}
    for trial in study.get_trials(deepcopy=False):
        history = trial.system_attrs.get("retry_history")
        if history and not trial.user_attrs.get(DISCARDED):
            by_failed.setdefault(history[-1], []).append(trial)
    for failed, retries in by_failed.items():
        keep = min(retries, key=lambda t: (t.state == TrialState.WAITING, t.number))
        for trial in retries:
            if trial.number != keep.number and trial.state == TrialState.WAITING:
                tid = trial_id(storage, study, trial.number)
                # Taken from the queue first, as ask() takes a trial: False when a worker
                # took it since the listing (it trains: kept, not failed under it).
                try:
                    if not storage.set_trial_state_values(tid, TrialState.RUNNING):
                        continue
                except optuna.exceptions.UpdateFinishedTrialError:
                    continue  # another worker discarded it first
                storage.set_trial_user_attr(tid, DISCARDED, True)
                why = (
                    f"duplicate retry of trial {failed} (trial {keep.number} retries it): "
                    "queued by two workers at once"
                )
                fail_trial(storage, tid, why)


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials that a later trial retries."""
    out: set[int] = set()
    for trial in trials:
        out.update(trial.system_attrs.get("retry_history") or [])
    return out


def state_counts(trials: list[FrozenTrial]) -> str:
    """``3 complete, 2 fail (2 retried)``: trials by state, failures that a later attempt
    retries told apart (an interrupted attempt is not a failed trial)."""
    retried = retried_numbers(trials)
    parts = []
    for state in TrialState:
        count = sum(1 for t in trials if t.state == state)
        if not count:
            continue
        again = sum(1 for t in trials if t.state == state and t.number in retried)
        parts.append(f"{count} {state.name.lower()}" + (f" ({again} retried)" if again else ""))
    return ", ".join(parts)


def budget_trials(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials that count against ``n_trials``: all but WAITING ones, retried failures and
    discarded trials (:data:`DISCARDED`)."""
    retried = retried_numbers(trials)
    return [
        t
        for t in trials
        if t.state != TrialState.WAITING
        and t.number not in retried
        and not t.user_attrs.get(DISCARDED)
    ]


def budget_used(trials: list[FrozenTrial]) -> int:
    """How many trials count against ``n_trials`` (:func:`budget_trials`)."""
    return len(budget_trials(trials))


def root_number(trial: FrozenTrial) -> int:
    """The first attempt's number: retries share its run folder and MLflow run."""
    first = trial.system_attrs.get("failed_trial")
    return int(first) if first is not None else trial.number


# ------------------------------------------------------------ Optuna's private API
# What the public API lacks, one named function each; test_optuna_private_api_is_pinned
# in tests/test_sweeps.py fails when an Optuna outside OPTUNA_TESTED is installed or one
# of these attributes is gone.

#: The Optuna versions the functions below were written for: [low, high).
OPTUNA_TESTED = ((5, 0), (6, 0))

#: (class, attribute) of every private Optuna name this module uses.
OPTUNA_PRIVATE = ((RDBStorage, "_get_stale_trial_ids"),)


def stale_trial_numbers(storage: BaseStorage, study: optuna.Study) -> set[int] | None:
    """Numbers of the RDB study's RUNNING trials whose heartbeat is older than the grace
    period, by the database's clock; empty without a heartbeat table, None when this
    Optuna no longer has the private method.

    Private because the public ``optuna.storages.fail_stale_trials`` fails those trials
    at once: a worker could no longer record why (``fail_reason``; a finished trial takes
    no attributes), and ``cofr sweep status`` could not show them as stale without
    changing them. ``RDBStorage._get_stale_trial_ids`` is the query that function runs.
    """
    if not uses_heartbeat_table(storage):
        return set()
    assert isinstance(storage, RDBStorage)
    query = getattr(storage, "_get_stale_trial_ids", None)
    if query is None:
        log.warning(
            f"optuna {optuna.__version__} has no RDBStorage._get_stale_trial_ids: stale "
            "trials are failed by optuna.storages.fail_stale_trials, without a reason"
        )
        return None
    try:
        study_id = storage.get_study_id_from_name(study.study_name)
        return {storage.get_trial(tid).number for tid in query(study_id)}
    except Exception as error:  # a flaky database: look again before the next trial
        log.warning(f"reading stale trials: {error!r:.300}")
        return set()

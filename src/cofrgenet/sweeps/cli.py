"""``cofr sweep run | status | report | submit``."""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from cofrgenet.dataclass_options import at_least
from cofrgenet.errors import did_you_mean
from cofrgenet.recipes import bundled
from cofrgenet.redact import hide_passwords, shown_command_line
from cofrgenet.sweeps.spec import (
    StorageOptions,
    Sweep,
    SweepError,
    check_extra,
    check_same_objective,
    load_sweep,
    parse_assignment,
    parse_sweep,
)

if TYPE_CHECKING:
    import optuna
    from optuna.storages import BaseStorage

EXAMPLES = """examples:
  cofr sweep run sweeps/tiny-cpu.yaml                      # one worker (start several)
  cofr sweep run sweeps/tiny-cpu.yaml --n-trials 2 --set data.data_dir=/data/pydoc-byte
  cofr sweep status tiny-cpu                               # or the sweep file
  cofr sweep report tiny-cpu                               # -> runs/sweeps/tiny-cpu/report/
  COFR_SWEEP_STORAGE=postgresql://... \\
  cofr sweep submit sweeps/tpe-depth-ladders-lr.yaml --workers 8 --gpus-per-worker 1 --dry-run
"""


def _common(
    parser: argparse.ArgumentParser,
    runs_help: str = "runs folder (default: the sweep's runs_dir, runs)",
) -> None:
    parser.add_argument(
        "--storage",
        default=None,
        type=storage_argument,
        help="Optuna storage: journal:PATH or an RDB URL, or env:NAME for the URL in "
        "environment variable NAME (a password stays off the command line) (default: the "
        "sweep's, else journal:<runs-dir>/sweeps/<study>/optuna.journal)",
    )
    parser.add_argument("--runs-dir", default=None, help=runs_help)


def storage_argument(value: str) -> str:
    """An argparse type: ``--storage``'s URL; ``env:NAME`` reads it from the environment,
    so that a password is not on the command line, where ``ps`` and MLflow tags show it
    (a rendered SLURM script passes it so). A journal's path is checked here, before
    anything runs (:func:`~cofrgenet.sweeps.storage.journal_path`)."""
    if not value.startswith("env:"):
        return _checked_journal(StorageURL(value, given=value))
    name = value.removeprefix("env:")
    url = os.environ.get(name, "")
    if not url.strip():
        raise argparse.ArgumentTypeError(f"{value}: ${name} is not set in the environment")
    if not (url.startswith("journal:") or "://" in url or url.endswith((".journal", ".log"))):
        # Its value is not echoed in any error: ${PGPASSWORD} given by mistake, say.
        raise argparse.ArgumentTypeError(
            f"{value}: ${name} holds no storage URL (journal:PATH, a *.journal file or "
            "scheme://...; its value is not shown)"
        )
    return _checked_journal(StorageURL(url, given=value))


def _checked_journal(url: StorageURL) -> StorageURL:
    """``url``, unless it is a journal without a file path (an argparse error then)."""
    from cofrgenet.sweeps.storage import journal_path

    try:
        journal_path(url)
    except SweepError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return url


def plain(url: str | None) -> str | None:
    """A :class:`StorageURL` as a plain ``str``, for what stores or dumps it (YAML)."""
    return None if url is None else str.__str__(url)


class StorageURL(str):
    """``--storage``'s URL, which remembers how it was given (``env:NAME``), for the
    commands a message suggests."""

    given: str

    def __new__(cls, url: str, given: str | None = None) -> StorageURL:
        self = super().__new__(cls, url)
        self.given = url if given is None else given
        return self


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1 (``--n-trials 0`` would run nothing)."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return number


def _worker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--n-trials",
        type=_at_least_one,
        default=None,
        help="trials each worker runs at most (default: until the study's budget, the "
        "sweep's n_trials or grid, is used up)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a training config key for every trial (YAML value), e.g. data.data_dir=DIR",
    )
    parser.add_argument("--study", default=None, help="override the sweep's study name")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXAMPLES
    parser.add_argument("sweep", help="sweep file (sweeps/*.yaml)")
    _common(parser)
    _worker_options(parser)
    parser.add_argument(
        "--worker-index",
        type=at_least(int, 0),
        default=None,
        help="offsets the sampler seed (default: the SLURM array index, else the pid)",
    )
    parser.add_argument(
        "--no-report", action="store_true", help="do not write the report when the study ends"
    )
    parser.add_argument(
        "--no-mlflow",
        action="store_true",
        help="no MLflow runs: neither the study's parent run nor the trials' runs",
    )


def add_study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="a study name or its sweep file")
    # A study name has no sweep file to read a runs_dir from.
    _common(parser, "runs folder (default: a sweep file's runs_dir; with a study name, runs)")
    parser.add_argument(
        "--study",
        dest="study_name",
        default=None,
        help="with a sweep file: the study its workers ran with --study (default: the file's)",
    )


def _status_command(args: argparse.Namespace) -> str:
    """The `cofr sweep status` of the study this command ran (the file's own, or --study's,
    in --storage and --runs-dir as given)."""
    return _study_command(args, "status")


def _study_command(args: argparse.Namespace, subcommand: str) -> str:
    """``cofr sweep <subcommand>`` of the study this command ran, as :func:`_status_command`."""
    words = ["cofr", "sweep", subcommand, args.sweep]
    if getattr(args, "study", None) is not None and args.study != args.sweep:
        words += ["--study", args.study]
    if getattr(args, "storage", None) is not None:  # as given: env:NAME, or passwords hidden
        words += ["--storage", hide_passwords(getattr(args.storage, "given", args.storage))]
    if getattr(args, "runs_dir", None) is not None:
        words += ["--runs-dir", args.runs_dir]
    return shlex.join(words)


def _run_again_command(args: argparse.Namespace) -> str:
    """The `cofr sweep run` that goes on with the study this worker ran: its study,
    storage, runs folder and --set settings (a study refuses other ones)."""
    command = _study_command(args, "run")  # an MLflow tag others read: passwords hidden
    return hide_passwords(" ".join([command, *(shlex.join(["--set", s]) for s in args.settings)]))


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    add_study_arguments(parser)
    parser.add_argument(
        "--out-dir",
        "--out",  # its older name
        dest="out",
        default=None,
        help="a folder, made if missing (default: <runs-dir>/sweeps/<study>/report)",
    )
    parser.add_argument("--no-mlflow", action="store_true", help="do not log to the parent run")


def add_submit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", help="sweep file")
    _common(parser)
    _worker_options(parser)
    parser.add_argument(
        "--workers", type=_at_least_one, default=1, help="array tasks (workers) (default: 1)"
    )
    parser.add_argument(
        "--partition",
        default=None,
        help="the SLURM partition (default: the sweep's slurm.partition)",
    )
    parser.add_argument(
        "--gpus-per-worker",
        type=at_least(int, 0),
        default=None,
        help="GPUs per array task, all for one trial at a time (ddp_spawn above 1); 0: CPU "
        "(default: the sweep's slurm.gpus_per_worker, else the config's GPU devices)",
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=_at_least_one,
        default=None,
        help="CPUs per array task, at least data.num_workers + 1 (default: the sweep's "
        "slurm.cpus_per_worker, else data.num_workers + 1, else 4 per GPU + 1)",
    )
    parser.add_argument("--time", default=None, help="per task, e.g. 04:00:00")
    parser.add_argument("--mem", default=None, help="per task, e.g. 64G")
    parser.add_argument(
        "--sbatch",
        dest="sbatch_args",
        action="append",
        default=[],
        metavar="OPTION",
        help="another #SBATCH option, e.g. --sbatch=--account=abc",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check as a submit does, print the script, submit nothing",
    )
    parser.add_argument("--wait", action="store_true", help="sbatch --wait: block until done")
    parser.add_argument(
        "--no-storage-check",
        action="store_true",
        help="submit without asking a database storage or tracking server, or looking "
        "for the trials' data folder, from this host first (where only the compute "
        "nodes reach them)",
    )
    parser.add_argument(
        "--shared-journal",
        action="store_true",
        help="the journal file storage is on a file system every node mounts: more than "
        "one worker may share it (the default journal is refused for --workers > 1 without)",
    )


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return dict(parse_assignment(text) for text in args.settings)


def _sweep(path: str, args: argparse.Namespace) -> Sweep:
    overrides: dict[str, Any] = {}
    if getattr(args, "study", None) is not None and path != args.study:
        overrides["study"] = args.study
    return load_sweep(path, overrides)


def _load_study(args: argparse.Namespace) -> tuple[optuna.Study, Sweep, BaseStorage]:
    """(study, sweep, storage) from a sweep file or a study name."""
    import optuna

    from cofrgenet.sweeps import storage as st

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    given_name = getattr(args, "study_name", None)
    if args.study.endswith((".yaml", ".yml")) or bundled(args.study).is_file():
        sweep = load_sweep(args.study, {"study": given_name} if given_name else None)
        runs_dir = args.runs_dir or sweep.runs_dir
        url = args.storage or st.home_storage(sweep, runs_dir)
        name = sweep.study
    else:
        if given_name is not None:
            raise SweepError(
                f"--study {given_name}: give it with a sweep file; {args.study!r} is a study "
                "name already"
            )
        name = args.study
        runs_dir = args.runs_dir or "runs"
        url = args.storage
        if url is None:
            path = Path(runs_dir) / "sweeps" / name / "optuna.journal"
            if not path.exists():
                _check_submitted(name, path.parent, f"journal:{path.resolve()}")
                studies = [p.parent.name for p in path.parent.parent.glob("*/optuna.journal")]
                raise SweepError(
                    f"no study {name!r} at {path}{did_you_mean(name, studies)}: give its "
                    "sweep file, the --runs-dir its workers ran in, or the --storage URL "
                    "they were given"
                )
            url = f"journal:{path.resolve()}"
        sweep = None
    # Where submit leaves its script: the sweep's own folder, or the name's (--storage).
    folder = st.study_folder(sweep, runs_dir) if sweep else Path(runs_dir) / "sweeps" / name
    file = st.storage_file(url)
    if file is not None and not file.exists():  # opening it would make an empty one
        _check_submitted(name, folder, url)
        hint = (
            "give --storage as its workers were given it"
            if args.storage is None
            else "check the path, or leave --storage out for the sweep's own storage"
        )
        raise SweepError(
            f"no study {name!r} yet: {file} does not exist (`cofr sweep run` starts it; "
            f"a study run elsewhere: {hint}){_storage_of_its_trials(sweep, runs_dir, url)}"
        )
    storage = st.open_storage(url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        _check_submitted(name, folder, url)
        raise SweepError(
            f"no study {name!r} in {hide_passwords(url)}"
            f"{_storage_of_its_trials(sweep, runs_dir, url)}"
        ) from None
    if sweep is None:
        raw = study.user_attrs.get("cofr.sweep")
        if not raw:
            raise SweepError(f"study {name!r} was not made by cofr sweep run")
        sweep = parse_sweep(raw, resolve=False)
    else:
        check_same_objective(study, sweep, f"give the study's own sweep file, or its name ({name})")
        sweep = _the_studys_trials(study, sweep)
    if st.uses_heartbeat_table(storage) and sweep.storage_options != StorageOptions():
        # Staleness by the sweep's own heartbeat interval and grace period.
        storage = st.open_storage(url, sweep.storage_options)
        study = optuna.load_study(study_name=name, storage=storage)
    if args.runs_dir:
        sweep.runs_dir = args.runs_dir
    return study, sweep, storage


class NotStartedYet(SweepError):
    """A study that ``cofr sweep submit`` queued, none of whose workers has started: it
    has no trials yet (its storage is made by the first worker). ``status`` says so and
    exits 0; ``report``, with nothing to report, stops on it."""

    def __init__(self, study: str, script: Path) -> None:
        super().__init__(
            f"study {study}: no trials yet: {script} was submitted, and none of its workers "
            "has started (squeue shows the job)"
        )


def _has_checkpoint(run_dir: Path | None) -> bool:
    """Whether a trial's run folder holds a checkpoint its retry resumes from (unknown:
    taken as yes). Not read: said as a signal stops the worker, with seconds before a
    SIGKILL, and checking a large checkpoint whole reads all of it."""
    from cofrgenet.training.checkpoints import candidates

    return run_dir is None or bool(candidates(run_dir))


def _storage_of_its_trials(sweep: Sweep | None, runs_dir: str, url: str) -> str:
    """``; its trials (in F) were run with --storage URL``, where the runs folder holds a
    trial of the sweep's study that records another storage than ``url`` (as ``cofr
    sweep run`` names it when it refuses to start the study anew), else ``""``."""
    from cofrgenet.sweeps.objective import trial_of_this_name

    found = trial_of_this_name(sweep, runs_dir) if sweep is not None else None
    if found is None or found[1] in (None, hide_passwords(url)):  # a study deleted there
        return ""
    return f"; its trials ({found[0]}) were run with --storage {found[1]}"


def _check_submitted(study: str, folder: Path, url: str) -> None:
    """NotStartedYet when the study's folder (``<runs_dir>/sweeps/<study>``) holds a
    script that submit queued for its workers to run ``study`` in ``url`` (a mistyped
    storage is still an error)."""
    scripts = [
        p for p in (folder / "slurm").glob("sweep-*.sbatch") if _submitted_for(p, study, url)
    ]
    if scripts:
        raise NotStartedYet(study, max(scripts, key=lambda p: p.stat().st_mtime))


def _submitted_for(script: Path, study: str, url: str) -> bool:
    """Whether ``script`` (one submit wrote) runs ``study`` in the storage ``url``: its
    workers' ``--study`` and ``--storage`` (a URL it exports, or a file by its path)."""
    from cofrgenet.sweeps import storage as st

    try:
        lines = script.read_text().splitlines()
        words = next(shlex.split(x) for x in lines if x.startswith("if [ $# -eq 0 ]; then set"))
        given = dict(itertools.pairwise(words))
        storage = given["--storage"]
        exported = [x.partition("=")[2] for x in lines if x.startswith(f"export {storage[4:]}=")]
        if storage.startswith("env:") and exported:
            storage = shlex.split(exported[0])[0]
    except (OSError, StopIteration, KeyError, ValueError):
        return False
    ours, theirs = st.storage_file(url), st.storage_file(storage)
    if ours is not None and theirs is not None:
        same = ours.resolve() == theirs.resolve()
    else:
        same = storage == url
    return same and given.get("--study") == study


def _the_studys_trials(study: optuna.Study, sweep: Sweep) -> Sweep:
    """``sweep``, or, where the file now trains other trials than the study was made from
    (``cofr sweep run`` refuses it), the study's stored copy with the file's places
    (storage, runs folder, tracking URI), said in a note: status and report show the
    study's trials and space (a report drew the file's axes: a depth never searched)."""
    from dataclasses import replace

    from cofrgenet.sweeps.worker import check_same_trials, grown_grid

    stored = study.user_attrs.get("cofr.sweep")
    if not isinstance(stored, dict) or grown_grid(sweep, stored) is not None:
        return sweep  # a grown grid is the study's (`run` takes it)
    try:
        check_same_trials(sweep, stored)
    except SweepError as error:
        print(f"note: the study's trials are shown, not this file's: {error}", file=sys.stderr)
        places = ("storage", "storage_options", "runs_dir", "tracking_uri", "slurm")
        own = parse_sweep(stored, resolve=False)
        return replace(own, path=sweep.path, **{k: getattr(sweep, k) for k in places})
    return sweep


def run(args: argparse.Namespace) -> int:
    # The sweep file first: its errors need none of the imports below. Errors in what the
    # user gave (SweepError) are printed by `cofr` as one line, exit status 2.
    sweep = _sweep(args.sweep, args)
    extra = _settings(args)
    check_extra(sweep, extra, mlflow=not args.no_mlflow)
    import optuna

    from cofrgenet.sweeps.slurm import AGAIN_VARIABLE
    from cofrgenet.sweeps.worker import (
        MAX_SAME_FAILURES,
        STOPPED_BEFORE_FIT,
        done_hint,
        print_summary,
        run_worker,
    )

    def again() -> str:  # a submitted job's worker: its task's sbatch
        return os.environ.get(AGAIN_VARIABLE) or shown_command_line()

    optuna.logging.set_verbosity(optuna.logging.INFO)
    logger = logging.getLogger("cofrgenet.sweeps")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname).1s %(asctime)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    result = run_worker(
        sweep,
        n_trials=args.n_trials,
        storage_url=plain(args.storage),
        runs_dir=args.runs_dir,
        extra=extra,
        worker_index=args.worker_index,
        report=not args.no_report,
        mlflow=not args.no_mlflow,
        again=os.environ.get(AGAIN_VARIABLE) or _run_again_command(args),
    )
    print_summary(result)
    if result.report_stopped is not None:
        print(
            f"cofr sweep run: stopped by a signal while writing the report of study "
            f"{sweep.study}, which is done: write it with `{_study_command(args, 'report')}`",
            file=sys.stderr,
        )
        return result.report_stopped
    if result.done and not result.outcomes:  # done before this worker: "done" alone puzzled
        print(
            f"cofr sweep run: study {sweep.study} has run all its trials, so this worker "
            f"started none. {done_hint(sweep)}",
            file=sys.stderr,
        )
    if result.signal_status is not None:
        last = result.outcomes[-1][1] if result.outcomes else None
        failed = last is not None and last.state == optuna.trial.TrialState.FAIL
        between = not failed  # no trial was stopped: it ended before the signal, or none ran
        # Ended elsewhere: its retry trains in another worker, which this one was taken for.
        if failed and not last.retry and not last.ended_elsewhere:
            # No retry was queued (max_retry used up): nothing resumes the trial.
            print(
                f"cofr sweep run: stopped by a signal; the trial failed: {last.reason} "
                f"(`{_status_command(args)}`)",
                file=sys.stderr,
            )
        elif between and result.done:
            print(f"cofr sweep run: stopped by a signal; study {sweep.study} is done",
                  file=sys.stderr)  # fmt: skip
        elif between:
            print(
                f"cofr sweep run: stopped by a signal between trials; the study goes on when "
                f"a worker runs again: {again()}",
                file=sys.stderr,
            )
        else:
            # Stopped before its fit began, or before its first save, a trial has no
            # checkpoint: it starts again.
            fresh = STOPPED_BEFORE_FIT in (last.reason or "") or not _has_checkpoint(last.run_dir)
            how = "is retried" if fresh else "resumes from its checkpoint"
            print(
                f"cofr sweep run: stopped by a signal; the trial {how} when a worker runs "
                f"again: {again()}",
                file=sys.stderr,
            )
        return result.signal_status
    if result.not_requeued is not None:
        print(
            f"cofr sweep run: stopped for a requeue, but {result.not_requeued}; the trial "
            f"resumes from its checkpoint when a worker runs again: {again()}",
            file=sys.stderr,
        )
        return 1
    if result.failing is not None:
        print(
            f"cofr sweep run: stopped: {MAX_SAME_FAILURES} trials in a row failed with: "
            f"{result.failing}",
            file=sys.stderr,
        )
        return 1
    if result.none_completed:
        failed = result.failed
        print(
            f"cofr sweep run: no trial of this worker completed: {len(failed)} failed, the "
            f"last with: {failed[-1].reason} (`{_status_command(args)}`)",
            file=sys.stderr,
        )
        return 1
    asked = args.n_trials is None or len(result.outcomes) < args.n_trials
    if asked and not (result.done or result.requeued):  # nothing left: said, not a bare 0
        running = sum(
            t.state == optuna.trial.TrialState.RUNNING
            for t in result.study.get_trials(deepcopy=False)
        )
        print(
            f"study {sweep.study}: no trial left for this worker to take; other workers "
            f"train the last {running} (`{_status_command(args)}`)",
        )
    return 0


def status(args: argparse.Namespace) -> int:
    from cofrgenet.sweeps.status import print_status

    try:
        study, sweep, storage = _load_study(args)
    except NotStartedYet as queued:  # `cofr sweep submit` says to follow with status
        print(queued)
        return 0
    print_status(study, storage, sweep.storage_options)
    return 0


def report(args: argparse.Namespace) -> int:
    from cofrgenet.sweeps import storage as st
    from cofrgenet.sweeps.report import write_report
    from cofrgenet.sweeps.tracking import PARENT_ATTR, client_for, run_config, run_missing

    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise SweepError(
            f"--out-dir {args.out} is a file: --out-dir must be a folder (made if missing)"
        )
    study, sweep, _ = _load_study(args)
    out = Path(args.out) if args.out else st.study_folder(sweep) / "report"
    client = parent = None
    if not args.no_mlflow and study.user_attrs.get(PARENT_ATTR):
        from cofrgenet.sweeps.tracking import tracking_uri
        from cofrgenet.training.run_store import check_tracking_uri

        # A damaged store or a dead server: one line, not MLflow's traceback or retries.
        fix = "fix the sweep's tracking_uri (or MLFLOW_TRACKING_URI), or report with --no-mlflow"
        check_tracking_uri(tracking_uri(run_config(sweep)), fix=fix)
        client = client_for(run_config(sweep))
        parent = study.user_attrs[PARENT_ATTR]
        if run_missing(client, parent):  # the store changed since: report files only
            print(
                f"note: the study's MLflow parent run {parent} is not in this run store "
                "(tracking_uri changed, or the store was removed): the report is not logged "
                "to MLflow; the next `cofr sweep run` makes a new parent run"
            )
            client = parent = None
    st.make_folder(out, "the report", "--out-dir")
    try:
        files = write_report(study, sweep, out, client, parent)
    except OSError as error:  # a read-only folder
        where = error.filename or out
        if Path(out).resolve() not in (Path(where).resolve(), *Path(where).resolve().parents):
            raise SweepError(  # the MLflow artifact store's, not --out's
                f"cannot log the report to MLflow run {parent}: {where}: "
                f"{error.strerror or error}; its files are in {out} (--no-mlflow skips MLflow)"
            ) from None
        raise SweepError(
            f"cannot write the report: {where}: {error.strerror or error}; choose another "
            "folder with --out-dir"
        ) from None
    print(f"report of {study.study_name} in {out}: {', '.join(sorted(files))}")
    if parent:
        print(f"logged to MLflow run {parent} (artifacts/report)")
    return 0


def submit(args: argparse.Namespace) -> int:
    from cofrgenet.sweeps.slurm import SubmitOptions
    from cofrgenet.sweeps.slurm import submit as do_submit

    if args.dry_run and args.wait:
        raise SweepError("--wait waits for the submitted job, and --dry-run submits none: drop one")
    options = SubmitOptions(
        workers=args.workers,
        partition=args.partition,
        gpus_per_worker=args.gpus_per_worker,
        cpus_per_worker=args.cpus_per_worker,
        time=args.time,
        mem=args.mem,
        n_trials=args.n_trials,
        storage=plain(args.storage),
        runs_dir=args.runs_dir,
        settings=_settings(args),
        sbatch_args=args.sbatch_args,
        check_storage=not args.no_storage_check,
        shared_journal=args.shared_journal,
    )
    sweep = _sweep(args.sweep, args)
    path, job, failed = do_submit(sweep, options, dry_run=args.dry_run, wait=args.wait)
    if args.dry_run:  # the script, with any password hidden (the file would hold it)
        print(hide_passwords(path), end="")
        return 0
    workers = f"{args.workers} worker{'s' if args.workers > 1 else ''}"
    print(f"submitted {path} as job {job} ({workers})")
    if failed is not None:  # --wait: the job ended, and not well
        print(f"cofr sweep submit: {failed} (`{_status_command(args)}`)", file=sys.stderr)
        return 1
    print(f"follow with: {_status_command(args)}")
    return 0


# The commands, in the one shape the dispatcher calls (cofrgenet/cli.py): an object with
# add_arguments(parser) and run(args).
RunCommand = SimpleNamespace(add_arguments=add_run_arguments, run=run)
StatusCommand = SimpleNamespace(add_arguments=add_study_arguments, run=status)
ReportCommand = SimpleNamespace(add_arguments=add_report_arguments, run=report)
SubmitCommand = SimpleNamespace(add_arguments=add_submit_arguments, run=submit)

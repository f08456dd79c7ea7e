"""``cofr sweep submit``: render ``slurm/sweep.sbatch`` for a sweep and submit it.

One array task = one worker process on one node. Its ``#SBATCH`` resources are derived
from the trainer settings the worker will use (and those settings are pinned on the
worker's command line), so they cannot disagree:

* ``--nodes=1``, ``--ntasks-per-node=1``: a worker is one process; ``trainer.num_nodes``
  must be 1 (a multi-node trial is a ``slurm/train.sbatch`` job, not a sweep worker).
* ``--gres=gpu:G`` with ``trainer.accelerator=gpu``, ``trainer.devices=G`` (G > 1 trains
  with ``ddp_spawn`` inside the worker); no GPU line for CPU sweeps.
* ``--cpus-per-task=C`` with ``data.num_workers`` at most ``C / G - 1`` (G ranks each
  start their loaders; unset, each rank takes ``SLURM_CPUS_PER_TASK // G - 1``).
* ``--signal=B:USR1@90`` + ``--requeue``: the worker saves the trial's ``last.ckpt``,
  leaves the trial RUNNING and requeues its task, which then resumes that trial.

An ``--sbatch`` option (or the sweep's ``slurm.extra``) cannot replace these lines
(:data:`SUBMIT_DECIDES`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cofrgenet.atomic import create_numbered, missing_folders, remove_empty_folders
from cofrgenet.dotted import get_dotted
from cofrgenet.redact import hide_passwords
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.spec import (
    Sweep,
    SweepError,
    base_config,
    check_budget,
    check_extra,
    check_validates,
    flow_yaml,
    trial_config,
)

TEMPLATE = Path(__file__).resolve().parents[3] / "slurm" / "sweep.sbatch"
#: The worker's requeue signal: SIGUSR1 to the batch shell 90 s before the time limit.
REQUEUE_SIGNAL = "B:USR1@90"
#: Strategies that start their ranks from the one worker process (Lightning's names).
SPAWN_STRATEGIES = tuple(
    f"{kind}{variant}"
    for kind in ("ddp_spawn", "ddp_notebook", "ddp_fork")
    for variant in ("", "_find_unused_parameters_false", "_find_unused_parameters_true")
)


def _has_callback(config: dict[str, Any], name: str) -> bool:
    """Whether the trainer's callbacks include one of class ``name``."""
    callbacks = get_dotted(config, "trainer.callbacks", None) or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    paths = [c.get("class_path", "") if isinstance(c, dict) else str(c) for c in callbacks]
    return any(path.rpartition(".")[2] == name for path in paths)


@dataclass
class SubmitOptions:
    workers: int = 1
    partition: str | None = None
    gpus_per_worker: int | None = None
    cpus_per_worker: int | None = None
    time: str | None = None
    mem: str | None = None
    n_trials: int | None = None
    storage: str | None = None
    runs_dir: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    sbatch_args: list[str] = field(default_factory=list)
    #: Ask a database storage from this host before sbatch (off where only the compute
    #: nodes reach it).
    check_storage: bool = True
    #: The user says the journal file is on a file system every node mounts
    #: (``--shared-journal``): several array tasks may then share it.
    shared_journal: bool = False


#: The environment variable a rendered script gives its workers a storage URL with a
#: password in (``--storage env:COFR_SWEEP_STORAGE_URL``).
STORAGE_VARIABLE = "COFR_SWEEP_STORAGE_URL"
#: The environment variable a submitted script gives its workers the command that runs
#: one of them again with: its own ``sbatch`` (its command line's ``--storage
#: env:COFR_SWEEP_STORAGE_URL`` is set in the script alone).
AGAIN_VARIABLE = "COFR_SWEEP_AGAIN"


@dataclass
class Rendered:
    script: str
    #: Trainer/data settings pinned on the worker's command line (``--set``).
    settings: dict[str, Any]
    resources: dict[str, str]
    worker_args: list[str]
    #: The study's storage URL the workers get.
    storage: str


def _accelerator_gpus(config: dict[str, Any]) -> int:
    accelerator = str(get_dotted(config, "trainer.accelerator", "auto") or "auto")
    devices = get_dotted(config, "trainer.devices", 1)
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)  # as Lightning reads it
    if accelerator in ("gpu", "cuda"):
        if isinstance(devices, int) and devices > 0:
            return devices
        if isinstance(devices, (list, tuple)):
            return len(devices)
        return 1
    return 0


def resources(sweep: Sweep, options: SubmitOptions) -> tuple[dict[str, str], dict[str, Any]]:
    """(#SBATCH options, trainer/data settings for the worker) that agree with each other."""
    from cofrgenet.sweeps.fitconfig import (  # imports Lightning
        check_model_values,
        check_optimizer_values,
    )

    check_extra(sweep, options.settings)
    config = base_config(sweep, options.settings)
    check_model_values(sweep, config)  # before sbatch: every array task would fail
    check_optimizer_values(sweep, config)
    check_validates(sweep, config)
    settings: dict[str, Any] = dict(options.settings)
    nodes = int(get_dotted(config, "trainer.num_nodes", 1) or 1)
    if nodes != 1:
        raise SweepError(
            f"trainer.num_nodes is {nodes}: a sweep worker trains on one node. Set "
            "trainer.num_nodes: 1 in the sweep (multi-node runs: slurm/train.sbatch)"
        )
    gpus = options.gpus_per_worker
    if gpus is None:  # an explicit 0 in the sweep file is a CPU worker, as --gpus-per-worker 0
        gpus = sweep.slurm.gpus_per_worker
    if gpus is None:
        gpus = _accelerator_gpus(config)
    if gpus < 0:
        raise SweepError("--gpus-per-worker must be >= 0")
    if gpus > 0:
        settings["trainer.accelerator"] = "gpu"
        settings["trainer.devices"] = gpus
        strategy = get_dotted(config, "trainer.strategy", "auto")
        if gpus > 1 and not (isinstance(strategy, str) and strategy in SPAWN_STRATEGIES):
            # Frozen ladder depths get no gradient: DDP must be told (DyadicUnfreezing
            # refuses to train otherwise).
            frozen = _has_callback(config, "DyadicUnfreezing")
            settings["trainer.strategy"] = (
                "ddp_spawn_find_unused_parameters_true" if frozen else "ddp_spawn"
            )
    else:
        settings["trainer.accelerator"] = "cpu"
        settings["trainer.devices"] = 1
        strategy = get_dotted(config, "trainer.strategy", "auto")
        if strategy not in (None, "auto"):
            settings["trainer.strategy"] = "auto"
    settings["trainer.num_nodes"] = 1
    for key, value in options.settings.items():
        if settings.get(key) != value:  # the #SBATCH resources decide it: say so, not replace
            raise SweepError(
                f"--set {key}={flow_yaml(value)}: submit sets {key} to {flow_yaml(settings[key])} "
                "to match the SLURM resources; give --gpus-per-worker (GPUs per worker, 0 "
                "for CPU) instead"
            )
    num_workers = get_dotted(config, "data.num_workers")
    ranks = max(1, gpus)  # ddp_spawn: every rank in the task starts its own loaders
    needed = ranks * (num_workers + 1) if isinstance(num_workers, int) else None
    cpus = options.cpus_per_worker or sweep.slurm.cpus_per_worker
    # Named as the user gave it: the flag, else the sweep file's field.
    where = "--cpus-per-worker" if options.cpus_per_worker else "slurm.cpus_per_worker"
    if cpus is None:
        cpus = needed if needed is not None else max(2, 4 * gpus + 1)
    if needed is not None and needed > cpus:
        each, share = (f"each of {ranks} ranks' ", f" // {ranks}") if ranks > 1 else ("", "")
        raise SweepError(
            f"{where} {cpus} cannot feed {each}data.num_workers {num_workers} "
            f"loader processes plus the trainer: give at least {needed} "
            f"CPUs, or lower data.num_workers (unset, it follows SLURM_CPUS_PER_TASK{share} "
            "- 1)"
        )
    time_limit = options.time or sweep.slurm.time
    sbatch = {
        "job-name": f"sweep-{sweep.study}",
        "array": f"0-{options.workers - 1}",
        "nodes": "1",
        "ntasks-per-node": "1",
        "cpus-per-task": str(cpus),
        # slurm.time: null leaves the time limit to the partition.
        **({"time": str(time_limit)} if time_limit is not None else {}),
        "signal": REQUEUE_SIGNAL,
        "requeue": "",
        "open-mode": "append",
    }
    if gpus > 0:
        sbatch["gres"] = f"gpu:{gpus}"
    partition = options.partition or sweep.slurm.partition
    if partition:
        sbatch["partition"] = partition
    mem = options.mem or sweep.slurm.mem
    if mem:
        sbatch["mem"] = str(mem)  # mem: 16000 (megabytes) is a number in YAML
    return sbatch, settings


_SBATCH_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def check_sbatch_value(option: str, value: Any) -> str:
    """``value`` as text for an ``#SBATCH`` line; SweepError naming ``option`` when it
    cannot be one: a newline (or another control character) would start a line of the
    script of its own, and SLURM reads a header value only up to the first space."""
    text = str(value)
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise SweepError(
            f"{option} {text!r}: an #SBATCH value cannot hold a newline or other control "
            "character; give it on one line"
        )
    if any(c.isspace() for c in text):
        raise SweepError(
            f"{option} {text!r}: SLURM reads an #SBATCH value only up to the first space; "
            "give it without spaces"
        )
    return text


#: sbatch options that take a value of their own (not an optional one, as --exclusive's):
#: one given bare (``--sbatch=--account``) makes sbatch fail on the script, after submit.
SBATCH_NEEDS_VALUE = frozenset(
    (
        "account", "array", "begin", "chdir", "clusters", "comment", "constraint",
        "cpus-per-gpu", "cpus-per-task", "dependency", "error", "exclude", "gpus",
        "gpus-per-node", "gpus-per-task", "gres", "input", "job-name", "licenses",
        "mail-type", "mail-user", "mem", "mem-per-cpu", "mem-per-gpu", "nodelist", "nodes",
        "ntasks", "ntasks-per-node", "output", "partition", "qos", "reservation", "signal",
        "time", "time-min", "wckey",
    )
)  # fmt: skip


#: sbatch's one-letter options (its man page) by their long names, which the #SBATCH
#: line is written with: ``-t 1`` would otherwise become ``--t=1``, and a ``-a`` or ``-t``
#: would escape the checks below.
SBATCH_SHORT = {
    "A": "account", "a": "array", "B": "extra-node-info", "b": "begin", "C": "constraint",
    "c": "cpus-per-task", "D": "chdir", "d": "dependency", "e": "error", "F": "nodefile",
    "G": "gpus", "h": "help", "i": "input", "J": "job-name", "k": "no-kill",
    "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes", "n": "ntasks",
    "O": "overcommit", "o": "output", "p": "partition", "Q": "quiet", "q": "qos",
    "S": "core-spec", "s": "oversubscribe", "t": "time", "V": "version", "v": "verbose",
    "W": "wait", "w": "nodelist", "x": "exclude",
}  # fmt: skip
#: The one-letter options that take no value.
SBATCH_SHORT_FLAGS = frozenset("hkOQsVvW")

_NODE_FIX = (
    "a sweep worker is one process on one node: give --gpus-per-worker (the sweep's "
    "slurm.gpus_per_worker) for more GPUs in it, or use slurm/train.sbatch for a "
    "multi-node run"
)
_GPU_FIX = (
    "give --gpus-per-worker instead (the sweep's slurm.gpus_per_worker; 0: a CPU worker), "
    "which sets the trainer's devices to match"
)
_CPU_FIX = (
    "give --cpus-per-worker instead (the sweep's slurm.cpus_per_worker), which is checked "
    "against data.num_workers"
)
#: sbatch options whose #SBATCH line submit derives itself (the module's docstring), with
#: what to give instead: given again they would replace a line the worker's trainer
#: settings were made to agree with, or the --workers that the storage check counted.
SUBMIT_DECIDES = {
    "array": "give --workers N instead (one array task per worker)",
    "nodes": _NODE_FIX,
    "ntasks": _NODE_FIX,
    "ntasks-per-node": _NODE_FIX,
    "gpus": _GPU_FIX,
    "gpus-per-node": _GPU_FIX,
    "gpus-per-task": _GPU_FIX,
    "cpus-per-task": _CPU_FIX,
    "cpus-per-gpu": _CPU_FIX,
}


def _split_sbatch_option(text: str, where: str) -> tuple[str, str, str]:
    """(long name, value, the option as given) of an extra #SBATCH option: ``--key=value``
    or ``--flag``, or a one-letter ``-t 1``, ``-t1`` (``-t=1`` read as ``-t 1``)."""
    text = str(text)
    if re.match(r"-[A-Za-z]", text) and not text.startswith("--"):
        letter, value = text[1], text[2:].lstrip(" =")
        if letter not in SBATCH_SHORT:
            raise SweepError(
                f"{where} {text!r}: not a one-letter sbatch option (-t 1 for --time); give "
                "its long form, --NAME=VALUE or --NAME (e.g. --sbatch=--account=abc)"
            )
        key = SBATCH_SHORT[letter]
        if value and letter in SBATCH_SHORT_FLAGS:
            raise SweepError(
                f"{where} {text!r}: sbatch's -{letter} (--{key}) takes no value; give one "
                "option per --sbatch"
            )
        if not value and letter not in SBATCH_SHORT_FLAGS:
            raise SweepError(
                f"{where} {text!r}: sbatch's -{letter} (--{key}) needs a value; give it as "
                f"--{key}=VALUE"
            )
        return key, value, f"-{letter} {value}".rstrip()
    key, _, value = text.lstrip("-").partition("=")
    if not _SBATCH_OPTION.fullmatch(key):
        raise SweepError(
            f"{where} {text!r}: expected an sbatch option, --NAME=VALUE or --NAME "
            "(e.g. --sbatch=--account=abc)"
        )
    if key in SBATCH_NEEDS_VALUE and not value:
        raise SweepError(
            f"{where} {text!r}: sbatch's --{key} needs a value; give it as --{key}=VALUE"
        )
    return key, value, f"--{key}={value}" if value else f"--{key}"


def _sbatch_option(text: str, where: str) -> tuple[str, str]:
    """(long name, value) of an extra #SBATCH option (:func:`_split_sbatch_option`);
    SweepError for one submit decides itself (:data:`SUBMIT_DECIDES`, a GPU ``--gres``),
    or a ``--time`` or ``--mem`` that is not in SLURM's format, as for submit's own."""
    key, value, given = _split_sbatch_option(text, where)
    value = check_sbatch_value(f"{where} {key}", value)  # first: no newline in what is said
    fix = SUBMIT_DECIDES.get(key)
    if key == "gres" and any(_gres_name(item) in ("gpu", "none") for item in value.split(",")):
        fix = f"{_GPU_FIX}; other generic resources may be given with --gres"
    if fix is not None:
        raise SweepError(f"{where} {given}: submit sets sbatch's --{key} itself; {fix}")
    pattern, example = _FORMATS.get(key, (None, ""))
    if pattern is not None and not pattern.fullmatch(value):
        raise SweepError(f"{where} --{key} {value!r} is not a SLURM {key}: {example}")
    return key, value


def _gres_name(item: str) -> str:
    """The resource's name of one ``--gres`` item (``gpu:a100:2`` -> ``gpu``)."""
    return item.strip().split(":")[0].lower()


#: sbatch's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds, or no limit.
SLURM_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|unlimited|infinite", re.IGNORECASE)
#: sbatch's --mem: a size in megabytes, or with a K, M, G or T unit.
SLURM_MEM = re.compile(r"\d+([KMGT]B?)?", re.IGNORECASE)
_FORMATS = {
    "time": (SLURM_TIME, "e.g. 04:00:00, 90 (minutes) or 2-00:00:00 (days-hours:minutes:seconds)"),
    "mem": (SLURM_MEM, "e.g. 64G or 16000 (megabytes)"),
}


def time_seconds(text: str) -> int | None:
    """sbatch's ``--time`` (a :data:`SLURM_TIME`) in seconds; None for no limit
    (``unlimited``, ``infinite``, or 0)."""
    text = text.strip().lower()
    if text in ("unlimited", "infinite"):
        return None
    days, dash, clock = text.rpartition("-")
    parts = [int(part) for part in clock.split(":")]
    if dash:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = parts
    else:  # minutes[:seconds]
        hours, (minutes, seconds) = 0, [*parts, 0][:2]
    total = (((int(days or 0) * 24) + hours) * 60 + minutes) * 60 + seconds
    return total or None  # SLURM's --time=0: no limit


def signal_lead(text: str) -> int | None:
    """The seconds before the time limit at which sbatch's ``--signal=[{R|B}:]SIG[@TIME]``
    sends its signal (SLURM's default: 60); None when ``text`` is no such value."""
    match = re.fullmatch(r"(?:[A-Za-z]+:)?[A-Za-z0-9]+(?:@(\d+))?", text.strip())
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) is not None else 60


def _check_header_inputs(sweep: Sweep, options: SubmitOptions) -> None:
    """Every value that goes into an #SBATCH line, checked before the (slow) config parse,
    named as the user gave it: the flag, else the sweep's ``slurm.*`` key."""
    given: dict[str, tuple[str, str]] = {}  # time, signal: (how it was given, its value)
    for name in ("time", "mem", "partition"):
        flag, default = getattr(options, name), getattr(sweep.slurm, name)
        option = f"--{name}" if flag else f"slurm.{name} (in the sweep)"
        value = flag or default
        if not value:
            continue
        text = check_sbatch_value(option, value)
        pattern, example = _FORMATS.get(name, (None, ""))
        if pattern is not None and not pattern.fullmatch(text):
            raise SweepError(f"{option} {text!r} is not a SLURM {name}: {example}")
        given[name] = (option, text)
    given["signal"] = ("submit's", REQUEUE_SIGNAL)
    memory = {"mem": given["mem"][0]} if "mem" in given else {}  # option: how it was given
    extras = [(e, "slurm.extra (in the sweep)") for e in sweep.slurm.extra]
    for extra, where in [*extras, *((e, "--sbatch") for e in options.sbatch_args)]:
        key, value = _sbatch_option(extra, where)
        if key == "time":  # replaces submit's own #SBATCH line
            given[key] = (f"{where} --time", value)
        elif key == "signal":
            _check_requeue_signal(where, value)
            given[key] = (where, value)
        elif key in SBATCH_MEMORY:  # --mem replaces submit's own line, as --time
            memory[key] = f"{where} --{key}"
    if len(memory) > 1:
        said = " and ".join(memory.values())
        raise SweepError(
            f"{said}: sbatch takes only one of --mem, --mem-per-cpu and --mem-per-gpu "
            "(it refuses the script otherwise); give one of them"
        )
    _check_signal_before_end(given)


#: sbatch's memory options, of which a job gives at most one.
SBATCH_MEMORY = ("mem", "mem-per-cpu", "mem-per-gpu")


def _check_requeue_signal(where: str, value: str) -> None:
    """SweepError for a ``--signal`` that replaces submit's ``B:USR1@90`` with one the
    worker does not requeue on: without ``B:`` only job steps get it (a worker is none),
    and the batch shell passes on SIGUSR1 alone; only the lead time may change."""
    if re.fullmatch(r"B:((SIG)?USR1|10)(@\d+)?", value.strip(), re.IGNORECASE) is None:
        raise SweepError(
            f"{where} --signal={value}: the worker saves and requeues its trial on SIGUSR1 "
            f"sent to the batch shell, so only the lead time may change: give "
            f"--signal=B:USR1@SECONDS (e.g. B:USR1@300), or leave it out for {REQUEUE_SIGNAL}"
        )


def _check_signal_before_end(given: dict[str, tuple[str, str]]) -> None:
    """SweepError when the job's time limit is no longer than the lead of its requeue
    signal: SLURM would end the task before the signal, which saves and requeues the
    trial, could come."""
    if "time" not in given or not SLURM_TIME.fullmatch(given["time"][1]):
        return  # no --time (the partition's limit), or one sbatch itself refuses
    (time_option, text), (signal_option, signal) = given["time"], given["signal"]
    limit, lead = time_seconds(text), signal_lead(signal)
    if limit is not None and lead is not None and limit <= lead:
        raise SweepError(
            f"{time_option} {text!r} is {limit} s: no longer than the {lead} s before the end "
            f"at which {signal_option} --signal={signal} asks the worker to save and requeue, "
            f"so the signal would never come; give a time above {lead} s (e.g. 04:00:00)"
        )


def _template_body() -> str:
    """The template after its header (comments and #SBATCH lines)."""
    lines = TEMPLATE.read_text().splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    return "\n".join(lines[last + 1 :]).lstrip("\n")


def render(sweep: Sweep, options: SubmitOptions) -> Rendered:
    if sweep.path is None:
        raise SweepError("submit needs a sweep file")
    if options.workers < 1:
        raise SweepError("--workers must be >= 1")
    _check_header_inputs(sweep, options)
    runs_dir = Path(options.runs_dir or sweep.runs_dir).resolve()
    home = st.home_storage(sweep, str(runs_dir))
    st.check_given_storage(options.storage, home, sweep.study)  # before the config's parse
    url = options.storage or home
    sbatch, settings = resources(sweep, options)
    if options.workers > sweep.total_trials:
        # Each array task runs a worker; those past the trials start none (and queue).
        print(
            f"warning: --workers {options.workers} for a study of {sweep.total_trials} "
            f"trials: at least {options.workers - sweep.total_trials} array tasks would find "
            f"no trial to train; --workers {sweep.total_trials} is enough",
            file=sys.stderr,
        )
    elif options.n_trials is not None and options.workers * options.n_trials < sweep.total_trials:
        # Each worker stops after its --n-trials: the job ends with the study unfinished.
        print(
            f"warning: --workers {options.workers} x --n-trials {options.n_trials}: this "
            f"job's workers stop after {options.workers * options.n_trials} trials in all, "
            f"of the study's {sweep.total_trials} (fewer are left if some ran already); more "
            "workers, a larger --n-trials or a later submit run the rest",
            file=sys.stderr,
        )
    journal = st.journal_path(url)
    if journal is None and url.startswith("sqlite"):
        print("warning: sqlite storage is unsafe on a shared file system", file=sys.stderr)
    elif journal is not None and options.workers > 1 and not options.shared_journal:
        # Array tasks land on several nodes: they share the journal only through a file
        # system they all mount. Nobody chose the default one for that: say so, or not.
        if not options.storage and not sweep.storage:
            raw = sweep.raw.get("storage")
            named = f"{raw} in the environment, " if isinstance(raw, str) and "${" in raw else ""
            # The bundled sweeps' variable, set for a file that does not read it.
            unread = "COFR_SWEEP_STORAGE" if os.environ.get("COFR_SWEEP_STORAGE") else None
            if unread and not named:
                named = f"--storage env:{unread}, which this file does not read, "
            raise SweepError(
                f"--workers {options.workers} would share the default journal file "
                f"{journal} across nodes: give a PostgreSQL storage ({named}storage: or "
                "--storage), or --shared-journal if every node mounts that folder "
                "(docs/sweeps.md)"
            )
        print(
            f"warning: {options.workers} array tasks share the journal file "
            f"{journal}: it must be on a file system every node mounts (--shared-journal "
            "says it is); for many hosts a PostgreSQL storage is sturdier (docs/sweeps.md)",
            file=sys.stderr,
        )
    logs = st.study_folder(sweep, str(runs_dir)).resolve() / "slurm"
    sbatch["output"] = check_sbatch_value("the runs folder (--runs-dir)", logs / "%A_%a.out")
    extras = [(e, "slurm.extra (in the sweep)") for e in sweep.slurm.extra]
    for extra, where in [*extras, *((e, "--sbatch") for e in options.sbatch_args)]:
        key, value = _sbatch_option(extra, where)
        if key == "gres" and "gres" in sbatch:  # another resource beside the worker's GPUs
            value = f"{sbatch['gres']},{value}"
        sbatch[key] = value
    # A password goes to the workers in the environment, not on their command lines
    # (ps, logs and MLflow's command tag show those): the script is the user's alone.
    private = hide_passwords(url) != url
    exports = [f"export {STORAGE_VARIABLE}={shlex.quote(url)}"] if private else []
    storage = f"env:{STORAGE_VARIABLE}" if private else url
    # --study always: the file's own, or the one `submit --study` gave.
    args = [str(sweep.path), "--study", sweep.study, "--storage", storage]
    args += ["--runs-dir", str(runs_dir)]
    if options.n_trials is not None:
        args += ["--n-trials", str(options.n_trials)]
    for key, value in settings.items():
        args += ["--set", f"{key}={flow_yaml(value)}"]
    header = [f"#SBATCH --{k}={v}" if v != "" else f"#SBATCH --{k}" for k, v in sbatch.items()]
    script = "\n".join(
        [
            "#!/bin/bash",
            f"# Rendered by `cofr sweep submit` from {sweep.path} on {time.strftime('%F %T')}.",
            *header,
            "",
            python_line(),
            *exports,
            "# The worker's arguments, unless given on the sbatch command line.",
            f"if [ $# -eq 0 ]; then set -- {shlex.join(args)}; fi",
            "",
            _template_body(),
        ]
    )
    return Rendered(script.rstrip() + "\n", settings, sbatch, args, url)


def python_line() -> str:
    """The script's line naming the Python its workers run (after which submit adds the
    task's own resubmission)."""
    return f"export COFR_PYTHON={shlex.quote(sys.executable)}"


def parse_sbatch_header(script: str) -> dict[str, str]:
    """``#SBATCH --key=value`` lines of a script as {key: value}."""
    out: dict[str, str] = {}
    for line in script.splitlines():
        match = re.match(r"#SBATCH\s+--([\w-]+)(?:[=\s]+(\S+))?", line)
        if match:
            out[match.group(1)] = match.group(2) or ""
    return out


def job_logs(rendered: Rendered, job: str) -> str:
    """Where the array tasks of ``job`` write their output: the ``#SBATCH --output``
    pattern with the job's id (``%A``, ``%j``) in, any task (``%a``) as ``*``."""
    pattern = rendered.resources.get("output") or "slurm-%A_%a.out"
    return pattern.replace("%A", job).replace("%j", job).replace("%a", "*")


def submit(
    sweep: Sweep, options: SubmitOptions, dry_run: bool, wait: bool
) -> tuple[str, str, str | None]:
    """(script path, job id or "", why the job failed or None): writes the script and
    runs sbatch. With ``wait``, sbatch returns when the job ends: non-zero when a task of
    it failed, the job id printed all the same. With ``dry_run``: (the script, "", None)
    after the same checks, writing nothing: the preview says what the submit would."""
    rendered = render(sweep, options)
    if not dry_run and shutil.which("sbatch") is None:
        raise SweepError("sbatch not found: is this a SLURM login node? (--dry-run prints)")
    if st.journal_path(rendered.storage) is None:  # a database: reachable now, not after
        st.check_rdb_url(rendered.storage)  # the queue's wait, from every task at once
        if options.check_storage:
            try:
                st.check_reachable(rendered.storage)
            except SweepError as error:
                raise SweepError(
                    f"{error} (where only the compute nodes reach it: --no-storage-check)"
                ) from None
    runs_dir = Path(options.runs_dir or sweep.runs_dir).resolve()
    if options.check_storage and sweep.tracking_uri:  # as every task would, after the queue
        from cofrgenet.training.run_store import check_tracking_uri

        fix = "fix the sweep's tracking_uri (where only the compute nodes reach it: "
        check_tracking_uri(sweep.tracking_uri, fix=fix + "--no-storage-check)")
    from cofrgenet.sweeps.worker import check_before_submit

    # A database only when it answered above; the data folder only as the tasks see it:
    # from the submit folder, their working folder unless an --sbatch --chdir moves them.
    readable = options.check_storage or st.storage_file(rendered.storage) is not None
    # A trial's config as the workers read it (their pinned devices set a tokens budget's
    # steps), parsed once: its budget needs no storage, so it is checked even unread.
    probe = trial_config(sweep, {p.key: p.default() for p in sweep.space}, rendered.settings)
    check_budget(sweep, probe)
    if readable:
        here = "chdir" not in rendered.resources
        try:
            check_before_submit(
                sweep,
                rendered.storage,
                rendered.settings,
                options.check_storage and here,
                here,
                probe,
            )
        except SweepError as error:
            escape = " (where only the compute nodes see it: --no-storage-check)"
            raise SweepError(f"{error}{escape if 'data_dir' in str(error) else ''}") from None
    if dry_run:
        return rendered.script, "", None
    folder = st.study_folder(sweep, str(runs_dir)).resolve() / "slurm"
    made = missing_folders(folder)  # removed again, if still empty, when nothing is queued
    st.make_folder(folder, "the SLURM script and logs", "--runs-dir or the sweep's runs_dir")

    def write_script(path: Path) -> Path:
        python = python_line() + "\n"
        # The task's own resubmission, said by a worker that stops before its study ends.
        task = "${SLURM_ARRAY_TASK_ID:-0}"
        again = f'export {AGAIN_VARIABLE}="sbatch --array={task} {shlex.quote(str(path))}"\n'
        text = rendered.script.replace(python, python + again, 1)
        # Only its owner reads it: it may hold the storage's password (render).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as script:
            script.write(text)
        return path

    # Two submits in one second: -2, -3, ...
    try:
        path = create_numbered(
            folder, f"sweep-{time.strftime('%Y%m%d-%H%M%S')}", ".sbatch", write_script
        )
    except OSError as error:  # a read-only folder
        raise SweepError(
            f"cannot write the SLURM script in {folder}: {error.strerror or error}; choose "
            "another with --runs-dir or the sweep's runs_dir"
        ) from None
    command = ["sbatch", "--parsable"]
    if wait:
        command.append("--wait")
    result = subprocess.run([*command, str(path)], capture_output=True, text=True)
    job = result.stdout.strip().split(";")[0]
    if result.returncode != 0 and not (wait and job):
        path.unlink(missing_ok=True)  # nothing was submitted: no script left to name a job
        remove_empty_folders(made)
        raise SweepError(f"sbatch failed ({result.returncode}): {result.stderr.strip()}")
    failed = None
    if result.returncode != 0:  # --wait: the job was submitted, and ended badly
        failed = (
            f"job {job} failed (sbatch --wait exit status {result.returncode}); its logs: "
            f"{job_logs(rendered, job)}"
        )
    return str(path), job, failed

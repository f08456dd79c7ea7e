"""``TokenDataModule``: stream a prepared data folder in blocks of ``block_size + 1`` tokens.

Each item is ``block_size + 1`` consecutive tokens (litdata ``TokensLoader``); a batch is
a ``(B, block_size + 1)`` int64 tensor, and :func:`batch_to_xy` cuts it into inputs
``x = batch[:, :-1]`` and targets ``y = batch[:, 1:]``.

Resume: the training loader is a ``StreamingDataLoader`` whose position is part of the
state (``state_dict`` / ``load_state_dict``; Lightning stores it in checkpoints), so a
resumed run continues with exactly the next batch. The order is fixed by ``seed`` (and
the epoch); resume with the same ``batch_size`` and ``num_workers`` for an identical
sequence (``num_workers`` left unset follows the checkpoint's).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.util
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.item_loader import TokensLoader
from torch import Tensor

from cofrgenet.config_variables import expand_variables
from cofrgenet.data.cpus import (
    available_cpus,
    default_loader_workers,
    processes_sharing_cpus,
)
from cofrgenet.data.meta import (
    READERS_LOCK,
    DataFolderError,
    DataMeta,
    check_vocab,
    chunk_layout,
    chunks_cut_by_size,
    read_meta,
    remake_command,
    split_blocks,
    tokenizer_changes,
    tokenizer_digest,
)
from cofrgenet.errors import ConfigError, check_seed
from cofrgenet.folder_lock import ReadersLock, close_inherited_reader_locks


def collate_tokens(items: list[Tensor]) -> Tensor:
    """Stack token blocks into a ``(B, T + 1)`` int64 batch (stored as uint16/int32)."""
    return torch.stack(items).long()


def batch_to_xy(batch: Tensor) -> tuple[Tensor, Tensor]:
    """``(B, T + 1)`` tokens -> inputs ``(B, T)`` and next-token targets ``(B, T)``, int64."""
    batch = batch.long()
    return batch[:, :-1], batch[:, 1:]


#: Signals that ask the trainer to stop or requeue (Ctrl-C, SLURM's kill and its warning).
STOP_SIGNALS: tuple[int, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, name)
)


class IgnoreStopSignals:
    """A loader worker's ``worker_init_fn``: the stop signals are the trainer's alone.

    SLURM signals every process of a job step, and a terminal's Ctrl-C every process of
    its group, workers included. torch's SIGTERM handler killed a worker, whose death
    then raised in the trainer mid-step ("DataLoader worker ... killed by signal"): no
    step-end save. A worker forked with Lightning's SIGUSR1 handler ran the requeue
    (a checkpoint of its stale copy, ``scontrol requeue``) itself. The trainer stops at
    a step's end and ends its workers; a worker whose trainer died ends by torch's
    watchdog (it checks its parent every few seconds).

    One SIGTERM is obeyed: multiprocessing's, when the parent's interpreter exits with a
    loader still iterating (a script's, a notebook's), after which it waits for its
    workers without a timeout. The parent sets ``exiting`` at exit, before that.
    """

    def __init__(self, exiting: Any) -> None:
        self.exiting = exiting  # a multiprocessing Event, shared with the workers

    def __call__(self, worker_id: int) -> None:
        # SIGTERM's handler first and never SIG_IGN: multiprocessing's SIGTERM can come
        # as this runs (a rank that exits at once), and one taken while it was ignored
        # was lost, the parent's join of this worker then hung.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        for signum in STOP_SIGNALS:
            if signum != signal.SIGTERM:
                signal.signal(signum, signal.SIG_IGN)
        # Not the trainer's hold on the data folder: a worker outlives a killed trainer
        # by a few seconds, in which the folder looked in use.
        close_inherited_reader_locks()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.exiting.is_set():
            os._exit(0)


_parent_exiting: Any = None


def stop_signals_ignored() -> IgnoreStopSignals:
    """The workers' ``worker_init_fn``, with the event this process sets at its exit
    (made once). Set by a multiprocessing finalizer, which runs before multiprocessing
    ends the workers both where this process exits through ``atexit`` (a script) and
    where it is itself a multiprocessing child (a ``ddp_spawn`` rank), which skips
    ``atexit``: there the workers ignored the SIGTERM and the rank's join of them hung."""
    global _parent_exiting
    if _parent_exiting is None:
        _parent_exiting = multiprocessing.Event()
        multiprocessing.util.Finalize(None, _parent_exiting.set, exitpriority=100)
    return IgnoreStopSignals(_parent_exiting)


class ValidationShare(torch.utils.data.IterableDataset):
    """One process's share of the val split: blocks ``rank * m`` to ``(rank + 1) * m - 1``
    of the split in order, ``m = blocks // processes``.

    Every process gets as many blocks, so as many batches: a process with an extra
    batch ran a forward the others did not join, which hangs a model whose forward holds
    collectives (FSDP wrapped per block). litdata's own split gave the last process the
    rest (2, 2, 2 and 5 batches for 84 blocks of 8 on 4 processes). The last
    ``blocks % processes`` blocks (fewer than the processes) go unscored (a single
    process scores every block). Iterable, so that Lightning adds no sampler of its own.
    """

    def __init__(self, dataset: StreamingDataset, blocks: int, rank: int, processes: int):
        self.dataset = dataset
        share = blocks // processes
        self.start, self.stop = rank * share, (rank + 1) * share

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Any:
        for index in range(self.start, self.stop):
            yield self.dataset[index]  # a global block index: no rank of litdata's


#: The training order: blocks shuffled across the whole of each chunk ("full"), chunks
#: shuffled, each epoch anew. litdata's default shuffles a chunk's blocks only within
#: windows of 256 (or $LITDATA_ITEM_SHUFFLE_WINDOW): a step's batch then came from a few
#: consecutive documents. Named in the checkpoint (DATA_ORDER): a resume needs the same.
ITEM_SHUFFLE_WINDOW = "full"
DATA_ORDER = "chunks and blocks fully shuffled (FullShuffle)"


def pin_shuffle(dataset: StreamingDataset) -> None:
    """The same order on every file system. litdata shuffles by windows of chunks and
    blocks (``WindowShuffle``) where it reads a folder on NFS, Lustre, GPFS, BeeGFS or
    VAST (or with ``LITDATA_POSIX_FAST=1``), but fully on a local disk: a folder staged
    from one to the other resumed into another order, and with several loader workers
    an epoch read about 12% fewer blocks. Its in-place reads stay."""
    profile = dataset.posix_fast
    if profile is not None and profile.window_shuffle:
        dataset.posix_fast = dataclasses.replace(profile, kind="posix")


#: The private ``StreamingDataLoader`` attributes ``ResumableStreamingDataLoader`` sets:
#: ``_worker_idx``, litdata's cycle over the workers, which its ``load_state_dict`` makes
#: afresh only while it is None. tests/test_data.py checks that litdata still has and
#: reads them: were one renamed, the reset below would silently do nothing.
LITDATA_PRIVATE = ("_worker_idx",)


#: The key of a training loader's state that says the fit's epoch ended there.
EPOCH_OVER = "cofr_epoch_over"


class ResumableStreamingDataLoader(StreamingDataLoader):
    """A ``StreamingDataLoader`` whose resumed epoch ends like any other, and that may
    load its state more than once (litdata 0.2.76).

    After ``load_state_dict`` litdata's loader replays the loaded position on every
    ``iter()`` until one iteration runs to exhaustion. Lightning ends an epoch by
    counting batches (the loader has a length), so the epoch after a resumed one would
    restart from the checkpoint's position, in the old order. Here, once the resumed
    iteration has yielded a batch, the next ``iter()`` starts a new epoch as usual.

    Lightning may end an epoch before the loader runs out (``trainer.limit_train_batches``):
    :attr:`epoch_over` (set by the data module) says so, the state records it, and a
    resume from it starts the next epoch, as the fit would have, not the old one's rest.
    """

    _resumed_epoch_started = False

    #: Whether the fit's epoch ended at the batch last yielded (None: never).
    epoch_over: Callable[[], bool] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.epoch_over is not None and self.epoch_over():
            state[EPOCH_OVER] = True
        return state

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        # litdata steps its cycle over the workers on to the saved position, but reuses a
        # cycle it made before: a second load (the data module's, then Lightning's)
        # stepped it on twice, and the resumed epoch took the workers' batches in
        # another order. A fresh cycle makes each load start from the first worker.
        self._worker_idx = None
        super().load_state_dict({k: v for k, v in obj.items() if k != EPOCH_OVER})
        self._resumed_epoch_started = bool(obj.get(EPOCH_OVER))

    def __iter__(self) -> Any:
        if self.restore and self._resumed_epoch_started:
            self.restore = False  # the resumed epoch is over: a new one begins
        resuming = self.restore
        for batch in super().__iter__():
            if resuming:
                self._resumed_epoch_started = True
            yield batch


def resolve_num_workers(num_workers: int | None) -> int:
    """``num_workers`` as given; None: ``SLURM_CPUS_PER_TASK - 1``, else ``min(4, cpus - 1)``."""
    if num_workers is None:
        return default_loader_workers()
    if num_workers < 0:
        raise ConfigError(
            f"data.num_workers must be >= 0 (0: load in the main process), got {num_workers}"
        )
    return num_workers


#: The data folder a run reads unless data.data_dir says otherwise (`cofr data prepare`'s).
DEFAULT_DATA_DIR = "data/pydoc-byte"


class TokenDataModule(L.LightningDataModule):
    """Train/val token streams of a folder made by ``cofr data prepare``.

    Args:
        data_dir: the prepared folder (``meta.json``, ``train/``, ``val/``).
        block_size: T, the training context; items hold T + 1 tokens. None (the default):
            the model's block size, which ``cofr fit`` fills in; a shorter one trains on
            shorter sequences, a longer one is refused before the run starts.
        batch_size: sequences per batch (per device).
        num_workers: loader processes; None: ``SLURM_CPUS_PER_TASK - 1`` under SLURM,
            else ``min(4, cpus - 1)``.
        seed: shuffling seed of the training stream.
        shuffle: shuffle the training stream (validation is never shuffled).
        val_batch_size: validation batch size (default: ``batch_size``).
    """

    def __init__(
        self,
        data_dir: str = DEFAULT_DATA_DIR,
        block_size: int | None = None,
        batch_size: int = 16,
        num_workers: int | None = None,
        seed: int = 42,
        shuffle: bool = True,
        val_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if block_size is None:
            raise ValueError(
                "TokenDataModule needs block_size (cofr fit sets it to the model's block size)"
            )
        for key, value in (
            ("block_size", block_size),
            ("batch_size", batch_size),
            ("val_batch_size", 1 if val_batch_size is None else val_batch_size),
        ):
            if value < 1:
                raise ConfigError(f"data.{key} must be >= 1, got {value}")
        check_seed(seed, "data.seed")
        # Absolute in the saved hyperparameters: a checkpoint read from another working
        # directory (cofr generate, eval) still finds the folder and its tokenizer.
        self.data_dir = (
            Path(expand_variables(str(data_dir), "data.data_dir")).expanduser().resolve()
        )
        self.hparams["data_dir"] = str(self.data_dir)
        # Fails fast on a missing or half-written folder.
        self.meta: DataMeta = read_meta(self.data_dir)
        self.tokenizer_sha256 = tokenizer_digest(self.data_dir)  # read once: in every save
        self.train_layout = chunk_layout(self.data_dir / "train")  # likewise
        self.block_size = block_size
        self.batch_size = batch_size
        self.val_batch_size = val_batch_size or batch_size
        self.num_workers = resolve_num_workers(num_workers)
        self._num_workers_given = num_workers is not None
        self.seed = seed
        self.shuffle = shuffle
        self._train_loader: Any = None
        self._pending_state: dict[str, Any] | None = None
        self._val_block_count: int | None = None

    # ------------------------------------------------------------------ metadata

    @property
    def vocab_size(self) -> int:
        """Token ids of the data are ``0 .. vocab_size - 1``."""
        return self.meta.vocab_size

    @property
    def eos_id(self) -> int:
        return self.meta.eos_id

    def check_vocab(self, model_vocab_size: int) -> None:
        """Raise a clear error when the model's vocabulary is smaller than the data's."""
        check_vocab(self.meta, model_vocab_size)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Refuse a ``(B, T + 1)`` batch holding ids outside the tokenizer's (a chunk
        damaged on disk, its size intact): the embedding raised an IndexError on one
        rank (a device-side assert on CUDA) and the others a lost peer. On the CPU copy,
        before it moves: no device sync."""
        if isinstance(batch, Tensor) and batch.numel():
            low, high = (int(end) for end in torch.aminmax(batch))  # one pass
            if low < 0 or high >= self.meta.vocab_size:
                bad = high if high >= self.meta.vocab_size else low
                raise DataFolderError(
                    f"{self.data_dir} holds token id {bad}, outside its tokenizer's "
                    f"{self.meta.vocab_size} ids: a chunk file is damaged. Prepare it "
                    f"again: {remake_command(self.data_dir, self.meta)}"
                )
        return batch

    # ---------------------------------------------------------------- the folder

    _readers: ReadersLock | None = None
    _processes = 1  # training processes sharing this one's CPUs (setup reads the trainer)

    def setup(self, stage: str) -> None:
        """Share the data folder's readers lock while Lightning uses this module: a
        ``cofr data prepare --overwrite`` of the folder waits for no run that streams it
        (it would replace the chunks under the run's index) and refuses instead."""
        if self._readers is None:
            readers = ReadersLock(self.data_dir / READERS_LOCK)
            if not readers.read():
                raise ConfigError(
                    f"{self.data_dir} is being prepared again (cofr data prepare "
                    "--overwrite): wait for it to finish, then start this run"
                )
            self._readers = readers
        self._share_cpus_with_the_other_ranks()

    def _share_cpus_with_the_other_ranks(self) -> None:
        """The default worker count split among the ranks that share these CPUs: under
        ddp_spawn in one SLURM task (a sweep's --gpus-per-worker G) each of G ranks took
        SLURM_CPUS_PER_TASK - 1 loader processes, G times the CPUs there are."""
        trainer = self.trainer
        if trainer is None:
            return
        self._processes = processes_sharing_cpus(trainer.num_devices)
        if not self._num_workers_given and self._train_loader is None:
            self.num_workers = default_loader_workers(self._processes)

    def teardown(self, stage: str) -> None:
        if self._readers is not None:
            self._readers.release()
            self._readers = None

    # ---------------------------------------------------------------- datasets

    def _dataset(self, split: str, shuffle: bool, drop_last: bool) -> Any:
        dataset = StreamingDataset(
            str(self.data_dir / split),
            item_loader=TokensLoader(block_size=self.block_size + 1),
            shuffle=shuffle,
            seed=self.seed,
            drop_last=drop_last,
            # The folder may move between runs (e.g. staged to node-local disk): the
            # fingerprint check in load_state_dict stands in for litdata's path check.
            force_override_state_dict=True,
            item_shuffle_window=ITEM_SHUFFLE_WINDOW,
        )
        pin_shuffle(dataset)
        if split == "train" and len(dataset) == 0:  # val: checked over all processes
            raise self._no_block(split)
        return dataset

    def _no_block(self, split: str, fitting: bool = True) -> ConfigError:
        """``fitting``: a fit reads the split (a validate or test cannot leave its
        validation out)."""
        tokens = self.meta.splits[split].tokens
        largest = chunks_cut_by_size(self.data_dir / split)
        if largest is not None and tokens > self.block_size:
            # The data holds a block; the chunk size, cutting it, leaves none whole.
            return ConfigError(
                f"the {split} split of {str(self.data_dir)!r} ({tokens:,} tokens) holds no "
                f"block of block_size + 1 = {self.block_size + 1} tokens: its chunks hold at "
                f"most {largest:,} tokens each, and a block never spans two; prepare it "
                "again with a larger --chunk-bytes (default 64MB), or lower block_size"
            )
        more = (
            "a larger --val-fraction)"
            + (", or fit without validation (--trainer.limit_val_batches 0)" if fitting else "")
            if split == "val"
            else "a small train split keeps more with fewer prepare --num-workers, each of "
            "which ends its own chunks)"
        )
        return ConfigError(
            f"the {split} split of {str(self.data_dir)!r} ({tokens:,} tokens in "
            f"{self.meta.splits[split].chunks} chunk(s)) holds no block of block_size + 1 = "
            f"{self.block_size + 1} tokens: lower block_size or prepare more data ({more}"
        )

    def _loader(
        self, split: str, batch_size: int, shuffle: bool, drop_last: bool, num_workers: int
    ) -> Any:
        return ResumableStreamingDataLoader(
            self._dataset(split, shuffle, drop_last),
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=collate_tokens,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=False,
            worker_init_fn=stop_signals_ignored() if num_workers > 0 else None,
            # Each new iterator draws its workers' base seed from this generator, not
            # from the global random state, which is the model's (dropout).
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> Any:
        # Full batches only: one shape for torch.compile.
        loader = self._loader(
            "train", self.batch_size, self.shuffle, drop_last=True, num_workers=self.num_workers
        )
        if len(loader) == 0:  # else Lightning ends the fit at once, with exit status 0
            raise self._no_full_batch()
        self._check_val_interval(len(loader))
        loader.epoch_over = self._fit_epoch_over
        if self._pending_state is not None:
            loader.load_state_dict(self._pending_state)
            self._pending_state = None
        self._train_loader = loader
        return loader

    def _no_full_batch(self) -> ConfigError:
        tokens = self.meta.splits["train"].tokens
        return ConfigError(
            f"the train split of {str(self.data_dir)!r} ({tokens:,} tokens) gives no full "
            f"batch of data.batch_size={self.batch_size} sequences of block_size + 1 = "
            f"{self.block_size + 1} tokens per process: lower data.batch_size or "
            "block_size, or prepare more text"
        )

    def check_sizes(self, train: bool, val: bool) -> None:
        """Refuse a block or batch that the splits a command reads (``train``: a fit;
        ``val``: its validation, or a validate or test) cannot fill even in one process,
        read from their indexes: before a run folder or an MLflow run exists (the loaders,
        later, check what each of several processes gets)."""
        if train:
            blocks = split_blocks(self.data_dir / "train", self.block_size + 1)
            if blocks == 0:
                raise self._no_block("train")
            if blocks < self.batch_size:
                raise self._no_full_batch()
        if val and self._val_blocks() == 0:
            raise self._no_block("val", fitting=train)

    def _check_val_interval(self, batches: int) -> None:
        """Lightning refuses a val_check_interval of more batches than an epoch holds
        (when it validates per epoch) with a traceback: a small corpus says so in one line."""
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return
        interval = trainer.val_check_interval
        per_epoch = trainer.check_val_every_n_epoch is not None
        if isinstance(interval, int) and per_epoch and interval > batches:
            raise ConfigError(
                f"trainer.val_check_interval is {interval} batches, but an epoch of "
                f"{str(self.data_dir)!r} holds {batches} (data.batch_size={self.batch_size}): "
                f"lower it to at most {batches}, or set trainer.check_val_every_n_epoch: null "
                "to count batches across epochs"
            )

    def val_dataloader(self) -> Any:
        """The val split in order, this process's share of it (:class:`ValidationShare`),
        in batches of ``val_batch_size`` (the last one partial)."""
        blocks = self._val_blocks()
        processes, rank = self._world_size(), self._global_rank()
        if blocks == 0:
            trainer = getattr(self, "trainer", None)
            raise self._no_block("val", fitting=trainer is None or trainer.state.fn == "fit")
        if blocks < processes:
            raise ConfigError(
                f"the val split of {str(self.data_dir)!r} holds {blocks} block(s) of "
                f"block_size + 1 = {self.block_size + 1} tokens, fewer than the {processes} "
                "processes that score it: lower block_size, prepare a larger "
                "--val-fraction, or validate on fewer devices"
            )
        # In the main process: litdata's workers take chunks in turn, so with
        # limit_val_batches (every conf/trainer file sets it) the blocks scored, and
        # val/loss, depended on data.num_workers, which differs between machines.
        dataset = self._dataset("val", shuffle=False, drop_last=False)
        return torch.utils.data.DataLoader(
            ValidationShare(dataset, blocks, rank, processes),
            batch_size=self.val_batch_size,
            num_workers=0,
            collate_fn=collate_tokens,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator(),  # its iterators draw no seed from the model's
        )

    def test_dataloader(self) -> Any:
        """The held-out ``val`` split (prepared folders have no separate test split)."""
        return self.val_dataloader()

    # ------------------------------------------------------------------- resume

    def _fingerprint(self) -> dict[str, Any]:
        """What must not change across a resume for the batches to continue exactly."""
        return {
            "source": self.meta.source,
            "tokenizer": self.meta.tokenizer,
            "vocab_size": self.meta.vocab_size,
            "tokenizer_sha256": self.tokenizer_sha256,
            "train_tokens": self.meta.train_tokens,
            "train_chunks": self.meta.splits["train"].chunks,
            # Checkpoints from before it lack it: compared where both have it.
            "train_chunk_layout": self.train_layout,
            "block_size": self.block_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (plus what it depends on); {} before the loader exists."""
        if self._train_loader is None:
            if self._pending_state is None:
                return {}
            loader_state = self._pending_state
        else:
            loader_state = self._train_loader.state_dict()
        return {
            "train_loader": loader_state,
            "fingerprint": self._fingerprint(),
            "loader": self._loader_settings(),
            "val_split": self._val_split(),
            "val_scored": self._val_scored(),
            # Beside "loader", whose keys versions before it compare one by one.
            "order": self._order(),
        }

    def _order(self) -> str:
        """The training stream's order (:data:`DATA_ORDER` when shuffled)."""
        return DATA_ORDER if self.shuffle else "in order (not shuffled)"

    def _val_split(self) -> dict[str, Any]:
        """What val/loss is measured on: another split may resume, but the curve jumps."""
        val = self.meta.splits["val"]
        return {"tokens": val.tokens, "chunks": val.chunks, "split_args": self.meta.split_args}

    def validates_as(self, state: dict[str, Any]) -> bool | None:
        """Whether this folder's val split is the one a checkpoint's run validated on (the
        datamodule ``state`` it saved), by what the split holds, wherever the folder is
        now; None where the checkpoint does not say (saved before it was kept)."""
        saved = state.get("val_split")
        return None if saved is None else saved == self._val_split()

    def _val_blocks(self) -> int:
        """Blocks of ``block_size + 1`` tokens in the val split, read from its index once
        (every checkpoint records how many were scored; the readers lock keeps the folder
        as it is while the run reads it)."""
        if self._val_block_count is None:
            self._val_block_count = split_blocks(self.data_dir / "val", self.block_size + 1)
        return self._val_block_count

    def _val_scored(self, limit_key: str | None = "limit_val_batches") -> dict[str, Any]:
        """Which blocks of the val split val/loss averages: with W processes, each scores
        the first ``blocks_each`` of its equal share (:class:`ValidationShare`), the
        share cut to the trainer's ``limit_key`` (``limit_test_batches`` for test/loss;
        None: uncut) batches of ``val_batch_size`` (Lightning's rule: an int caps the
        batches, a float scales their count, rounded down), of ``block_size`` tokens each.
        val/loss is token-weighted, so how the blocks are batched changes nothing."""
        processes = self._world_size()
        share = self._val_blocks() // processes
        batches = -(-share // self.val_batch_size)
        trainer = getattr(self, "trainer", None)
        limit = getattr(trainer, limit_key, None) if limit_key else None
        if isinstance(limit, float):
            batches = int(batches * limit)
        elif isinstance(limit, int):
            batches = min(batches, limit)
        blocks_each = min(share, batches * self.val_batch_size)
        return {"processes": processes, "blocks_each": blocks_each, "block_size": self.block_size}

    def _scored_elsewhere(self, state_dict: dict[str, Any]) -> str | None:
        """What says that val/loss will average other blocks than the checkpoint's run
        did (at a step, another number than that run scored or would have scored there
        for the same weights), or that test/loss will not be of the whole split at the
        run's block length; None where it will be."""
        saved = state_dict.get("val_scored")
        trainer = getattr(self, "trainer", None)
        if getattr(trainer, "state", None) is None:
            return None
        if state_dict.get("val_split") not in (None, self._val_split()):
            return None  # another corpus's val split: other blocks by design, no comparison
        if trainer.state.fn == "test":
            return self._tested_in_part(saved)
        if saved is None or trainer.state.fn not in ("fit", "validate"):
            return None
        now = self._val_scored()
        names = {
            "processes": "processes (trainer.devices x num_nodes)",
            "blocks_each": "blocks each scores (limit_val_batches x data.val_batch_size)",
            "block_size": "tokens per block (data.block_size)",
        }
        changed = [
            f"{names.get(k, k)} {saved[k]} -> {now[k]}"
            for k in now
            if k in saved and saved[k] != now[k]
        ]
        if not changed or self._same_blocks_scored(saved, now):
            return None
        return (
            f"val/loss scores other blocks of the val split than the checkpoint's run did "
            f"({', '.join(changed)}): not comparable with what that run scored, or would "
            "have, at the same steps (give its settings to compare)"
        )

    def _same_blocks_scored(self, saved: dict[str, Any], now: dict[str, Any]) -> bool:
        """Whether two :meth:`_val_scored` records of this val split score the same blocks,
        at the same length, however many processes share them (2 processes x 4 blocks and
        1 x 8 are the whole of an 8-block split alike)."""
        if saved.get("block_size") != now["block_size"] or "processes" not in saved:
            return False
        total = self._val_blocks()

        def scored(record: dict[str, Any]) -> set[int]:
            share = total // int(record["processes"])
            each = int(record["blocks_each"])
            return {r * share + i for r in range(int(record["processes"])) for i in range(each)}

        return scored(saved) == scored(now)

    def _tested_in_part(self, saved: dict[str, Any] | None) -> str | None:
        """What keeps test/loss from the run's test score, the whole val split in blocks
        of the run's length: ``limit_test_batches`` cutting it, another ``block_size``
        than the checkpoint's run's (``saved``: its ``val_scored``)."""
        now, whole = self._val_scored("limit_test_batches"), self._val_scored(None)
        changed = []
        if now["blocks_each"] < whole["blocks_each"]:
            limit = getattr(self.trainer, "limit_test_batches", None)
            changed.append(
                f"{now['blocks_each']} of the {whole['blocks_each']} blocks each process "
                f"holds: trainer.limit_test_batches {limit}"
            )
        trained = (saved or {}).get("block_size")
        if trained not in (None, self.block_size):
            changed.append(f"tokens per block (data.block_size) {trained} -> {self.block_size}")
        if not changed:
            return None
        return (
            "test/loss is not the run's test score, the whole val split in blocks of the "
            f"run's length ({'; '.join(changed)})"
        )

    def _scored_apart(self, why: str, saved_block_size: int | None = None) -> str:
        """Ask the trainer's loggers to keep an evaluation of other blocks off the run's
        val/ (or test/) curve (a logger with ``score_apart``, cofr's MLflow one); what the
        warning adds of where the scores went. ``saved_block_size``: the checkpoint's
        run's."""
        split = "test" if self.trainer.state.fn == "test" else "val"
        now = self._val_scored(f"limit_{split}_batches")
        label = f"{now['processes']}x{now['blocks_each']}blocks"
        if saved_block_size not in (None, self.block_size):  # not the run's blocks' length
            label += f"-of-{self.block_size}"
        for logger in getattr(self.trainer, "loggers", None) or []:
            apart = getattr(logger, "score_apart", None)
            prefix = apart(label, why, split) if callable(apart) else None
            if prefix:
                return f"; logged as {prefix}loss and .../ppl, beside the run's {split}/ curve"
        return ""

    def _loader_settings(self) -> dict[str, Any]:
        """Settings a resume may change (a larger batch, more devices, another node's CPU
        count), but then the batches do not continue exactly: said, not refused."""
        return {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "world_size": self._world_size(),
        }

    def _world_size(self) -> int:
        """The processes training together (1 before a trainer is attached)."""
        trainer = getattr(self, "trainer", None)
        return trainer.world_size if trainer is not None else 1

    def _global_rank(self) -> int:
        """This process's rank among them (0 before a trainer is attached)."""
        trainer = getattr(self, "trainer", None)
        return trainer.global_rank if trainer is not None else 0

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved position: applied to the current or the next training loader."""
        if not state_dict:
            return
        scored_elsewhere = self._scored_elsewhere(state_dict)
        if not self._resuming_fit():
            if scored_elsewhere:
                saved_block_size = (state_dict.get("val_scored") or {}).get("block_size")
                apart = self._scored_apart(scored_elsewhere, saved_block_size)
                rank_zero_warn(scored_elsewhere + apart)
            # An evaluation reads no training stream: any data will do that the model's
            # tokenizer wrote (a held-out corpus of its own, say).
            self.check_same_tokenizer(state_dict)
            return
        self.check_resumable(state_dict)
        self._follow_saved_workers(state_dict.get("loader") or {})
        now_loader = self._loader_settings()
        # litdata's own state has the world size of checkpoints from before it was saved here.
        saved_world = (state_dict["train_loader"].get("dataset") or {}).get("world_size", 1)
        saved_loader = {"world_size": saved_world, **(state_dict.get("loader") or {})}
        # Checkpoints from before the order was pinned: litdata's window shuffle.
        earlier = "blocks shuffled within windows (litdata's default)"
        now_loader["order"] = self._order()
        saved_loader["order"] = state_dict.get("order", earlier if self.shuffle else self._order())
        names = {"world_size": "processes", "order": "the data order"}
        moved = [
            f"{names.get(k, f'data.{k}')} {v} -> {now_loader.get(k)}"
            for k, v in saved_loader.items()
            if now_loader.get(k) != v
        ]
        if moved:
            before = saved_loader.get("batch_size", self.batch_size) * saved_loader["world_size"]
            after = self.batch_size * now_loader["world_size"]
            skipped = (
                f"; {before} -> {after} sequences per step: Lightning counts the resumed "
                "epoch's batches at the old size, so it ends that epoch early and part of "
                "its data is not read (resume from a checkpoint at an epoch's end, or with "
                "the old batch size and processes)"
                if after > before
                else ""
            )
            also = f". And {scored_elsewhere}" if scored_elsewhere else ""  # one warning
            rank_zero_warn(
                f"{', '.join(moved)} since the checkpoint: training goes on, but not with "
                "exactly the batches an uninterrupted run would have read (blocks of the "
                f"resumed epoch may be skipped or read twice){skipped}{also}"
            )
        elif scored_elsewhere:
            rank_zero_warn(scored_elsewhere)
        saved_val = state_dict.get("val_split")
        if saved_val is not None and saved_val != self._val_split():
            rank_zero_warn(
                f"{self.data_dir}'s validation split is not the one the checkpoint's run "
                "validated on: val/loss before and after this resume are not comparable "
                "(resume with the folder the run validated on to keep one curve)"
            )
        loader_state = state_dict["train_loader"]
        if self._train_loader is not None:
            self._train_loader.load_state_dict(loader_state)
        else:
            self._pending_state = loader_state

    def _follow_saved_workers(self, saved_loader: dict[str, Any]) -> None:
        """A resume with ``data.num_workers`` unset keeps the checkpoint's worker count:
        the default follows the machine's CPUs, and litdata's position in an epoch does not
        carry exactly to another count (blocks skipped or read twice). Not more workers
        than this machine has CPUs for: then the default, with the warning."""
        saved = saved_loader.get("num_workers")
        if self._num_workers_given or self._train_loader is not None or saved is None:
            return
        if saved > max(0, available_cpus() // self._processes - 1):  # a larger node's
            return
        if saved != self.num_workers:
            rank_zero_info(
                f"data.num_workers: {saved} loader processes, as the checkpoint's run had "
                f"(this machine's default is {self.num_workers}; set data.num_workers to "
                "change it, at the cost of an inexact resume of this epoch)"
            )
            self.num_workers = int(saved)

    def check_same_tokenizer(
        self,
        state_dict: dict[str, Any],
        fix: str = "evaluate on data prepared with the model's tokenizer",
    ) -> None:
        """Refuse a checkpoint's model (``state_dict``: the checkpoint's state of this
        module) that trained on another tokenizer's ids than this folder holds: they would
        mean other text. ``fix``: what to do instead, said after the problem."""
        changed = tokenizer_changes(state_dict.get("fingerprint", {}), self._fingerprint())
        if changed:
            details = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            raise ConfigError(
                f"{self.data_dir} was made with another tokenizer than the checkpoint's "
                f"model trained with ({details}): {fix}"
            )

    def changes_since(self, state_dict: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
        """{setting: (saved, now)} of the data settings a resume must keep (the corpus,
        its tokenizer and chunks, block size, seed, order) that differ from
        ``state_dict``'s (a checkpoint's state of this module); a setting one side lacks
        (an older checkpoint) is not compared."""
        saved, now = state_dict.get("fingerprint", {}), self._fingerprint()
        return {k: (saved[k], now[k]) for k in now if k in saved and saved[k] != now[k]}

    def check_resumable(self, state_dict: dict[str, Any]) -> None:
        """Refuse to resume training from ``state_dict`` (a checkpoint's state of this
        module) when the data settings changed since: the batches would not continue."""
        changed = self.changes_since(state_dict)
        if changed:
            details = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            # Two digests say nothing by themselves; the hint holds only for equal counts
            # (another folder's other tokens are cut elsewhere too).
            saved_tokens = state_dict.get("fingerprint", {}).get("train_tokens")
            if "train_chunk_layout" in changed and saved_tokens == self.meta.train_tokens:
                details += (
                    " (the same number of training tokens cut into other chunks: the folder "
                    "was prepared again, with another --num-workers?)"
                )
            raise ConfigError(
                f"cannot resume the data stream exactly: the data settings changed since the "
                f"checkpoint ({details}). Resume with the original data folder and settings."
            )

    def _fit_epoch_over(self) -> bool:
        """Whether the fit's training epoch has ended at its last batch."""
        trainer = getattr(self, "trainer", None)
        return trainer is not None and trainer.state.fn == "fit" and bool(trainer.is_last_batch)

    def _resuming_fit(self) -> bool:
        """Whether the state is loaded to resume training (not to evaluate a checkpoint)."""
        trainer = getattr(self, "trainer", None)
        return trainer is None or trainer.state.fn == "fit"

    def __repr__(self) -> str:
        return (
            f"TokenDataModule({str(self.data_dir)!r}, block_size={self.block_size}, "
            f"batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"vocab_size={self.vocab_size}, train_tokens={self.meta.train_tokens:,})"
        )

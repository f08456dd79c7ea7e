"""A trained checkpoint, ready to use: its model, its tokenizer and its MLflow run.

``cofr generate`` and every evaluation tool (``cofr eval``, GLUE fine-tuning, the lm-eval
adapter, the Hugging Face export) start from :func:`load_checkpoint`, so they all load
weights one way: checked first, unpickled with ``weights_only=True``, built from the run's
``model.preset`` and ``model.config`` as ``LanguageModel.load_from_checkpoint`` would (old
and compiled checkpoints included) but without importing Lightning
(:func:`cofrgenet.training.checkpoints.restore_model`).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from cofrgenet.data import ByteTokenizer, Tokenizer, load_tokenizer
from cofrgenet.data.meta import (
    TOKENIZER_FILE,
    TOKENIZER_KEYS,
    DataFolderError,
    read_meta,
    tokenizer_changes,
    tokenizer_digest,
)
from cofrgenet.errors import UserError, first_line
from cofrgenet.models import ModelConfig
from cofrgenet.training.run_store import (
    RUN_ID_FILE,
    RUN_TOKENIZER_DIR,
    scored_already,
    unreachable_run,
)


class TokenizerNotFound(UserError, FileNotFoundError):
    """The data folder whose tokenizer a checkpoint needs is not on this machine."""


class TokenizerUnreadable(UserError, ValueError):
    """The data folder whose tokenizer a checkpoint needs is here, but damaged or
    half-written: unlike a folder not on this machine, something to mend."""


class TokenizerMismatch(UserError, ValueError):
    """A tokenizer folder whose tokenizer is not the one the checkpoint trained with."""


class CheckpointNotFound(UserError, FileNotFoundError):
    """A checkpoint path that names no file (nothing there, or a folder)."""


def checkpoint_file(path: str | Path) -> Path:
    """``path`` if it is a file (or a sharded FSDP checkpoint folder, which
    :func:`cofrgenet.training.checkpoints.load` explains), else a one-line
    :class:`CheckpointNotFound`: every reader of checkpoints (generate, eval, export,
    GLUE) checks its argument with this first, before any other work.

    A file must also be a zip archive whose directory reads (a save cut short has none):
    a cheap look at its end, so that a damaged checkpoint fails before the data or the
    hub are touched; the members' checksums are checked when it is loaded."""
    from cofrgenet.training import checkpoints

    path = Path(path)
    if path.is_file():
        if not zipfile.is_zipfile(path):
            raise checkpoints.damaged(path)
        return path
    if path.exists() and not path.is_dir():  # /dev/null, a pipe: there, but no file
        raise CheckpointNotFound(
            f"{path} is not a regular file: give a checkpoint file, e.g. "
            f"{checkpoints.RUN_CHECKPOINTS}last.ckpt"
        )
    if not path.is_dir():
        raise CheckpointNotFound(checkpoints.missing(path))
    if checkpoints.has_shard_markers(path):
        return path  # a sharded checkpoint: checkpoints.load says how to consolidate it
    raise CheckpointNotFound(checkpoints.folder_hint(path))


def _prepared(folder: Path) -> bool:
    return (folder / "meta.json").is_file()


def _one_line(error: Exception) -> str:
    """A data folder error's message on one line (read_meta's quote a command below)."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip())


def data_dir_candidates(stored: str, ckpt: Path, run_dir: Path | None) -> list[Path]:
    """Where the training data folder ``stored`` (as the checkpoint holds it) may be.

    An absolute path is itself. A relative one was relative to the training run's
    working folder, which the checkpoint does not hold: it is tried relative to the
    current folder, then to each folder above the run folder (or the checkpoint's
    folder), nearest first: a run trained in ``proj/`` with ``runs_dir: runs`` lies in
    ``proj/runs/<experiment>/<run>``, whose parents hold ``proj/``.
    """
    path = Path(stored).expanduser()
    if path.is_absolute():
        return [path]
    # Absolute: a relative run folder's last parent, ".", would name the current folder
    # again, as a relative path (listed twice in the error).
    anchor = run_dir.absolute() if run_dir is not None else ckpt.resolve().parent
    tried: list[Path] = []
    for base in (Path.cwd(), *anchor.parents):
        candidate = base / path
        if candidate not in tried:
            tried.append(candidate)
    return tried


@dataclass
class LoadedCheckpoint:
    """What evaluation needs from a checkpoint.

    model: the network in eval mode (token ids (B, T) -> logits (B, T, vocab_size)).
    run_dir: ``runs/<experiment>/<run>`` when the checkpoint lies in a run folder.
    mlflow_run_id / tracking_uri: the training run in MLflow, when it was tracked.
    """

    path: Path
    step: int
    model: nn.Module
    config: ModelConfig
    data_dir: str | None
    run_dir: Path | None
    mlflow_run_id: str | None
    #: Why the checkpoint's results are not the run folder's to log (a checkpoint copied
    #: from another run), else None.
    foreign: str | None = None
    #: data_dir came from ``--tokenizer`` (the user's), not from the checkpoint.
    tokenizer_given: bool = False
    #: How the caller's user names that folder, for the errors: a command's flag, or a
    #: keyword (``tokenizer_dir``: lm_eval's ``--model_args``).
    tokenizer_option: str = "--tokenizer"
    #: The tokenizer the model trained with, as the checkpoint's data state names it:
    #: {"tokenizer": kind, "vocab_size": n}; empty for a checkpoint without one.
    trained_with: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The sequence length the model trained at (``data.block_size``), when the
    #: checkpoint records it; a run may train shorter than the model's block size.
    trained_length: int | None = None
    _tokenizer: Tokenizer | None = None

    @functools.cached_property
    def tracking_uri(self) -> str | None:
        """The tracking URI of the training run, None if it was not tracked (read on first
        use: it needs Lightning's MLflow logger, which ``cofr generate`` never imports)."""
        if self.mlflow_run_id is None or self.run_dir is None:
            return None
        return tracking_uri_of(self.run_dir)

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def context_length(self) -> int:
        """The longest context the model trained on: ``trained_length`` when it is
        shorter than the block size (later positions never trained), else the block."""
        if self.trained_length is None:
            return self.block_size
        return min(self.trained_length, self.block_size)

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the data the model trained on (or of ``tokenizer_dir``). A byte
        tokenizer needs no files: a checkpoint trained on bytes has it without the data
        folder."""
        if self._tokenizer is None and not self.tokenizer_given:
            byte = ByteTokenizer()
            trained = self.trained_with.get("tokenizer"), self.trained_with.get("vocab_size")
            if trained == (byte.kind, byte.vocab_size):
                self._tokenizer = byte
        if self._tokenizer is None:
            folder = self._tokenizer_folder()
            try:
                tokenizer = load_tokenizer(folder)
            except DataFolderError as error:
                raise TokenizerUnreadable(_one_line(error)) from None
            self._check_trained_with(tokenizer, folder)
            self._tokenizer = tokenizer
        return self._tokenizer

    def _check_trained_with(self, tokenizer: Tokenizer, folder: Path) -> None:
        """Refuse a folder whose tokenizer is not the model's (a data folder prepared
        again with another tokenizer, or the wrong ``--tokenizer``): its ids would be
        scored, sampled and exported as if they were, without any error."""
        found = {
            "tokenizer": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size,
            "tokenizer_sha256": tokenizer_digest(folder),
        }
        changed = tokenizer_changes(self.trained_with, found)
        vocab = self.config.vocab_size
        if not changed and tokenizer.vocab_size <= vocab:
            return
        theirs = f"{tokenizer.kind} tokenizer of {tokenizer.vocab_size} ids"
        if not changed:  # a checkpoint that names no tokenizer: its ids would overflow
            raise TokenizerMismatch(
                f"{folder} holds a {theirs}, more ids than {self.path}'s model has "
                f"({vocab}): give the data folder the model trained on ({self._option('DIR')})"
            )
        ours = (
            f"a {self.trained_with.get('tokenizer')} tokenizer of "
            f"{self.trained_with.get('vocab_size')} ids"
        )
        if set(changed) == {"tokenizer_sha256"}:  # same kind and size, other merges
            ours = f"another one (their {TOKENIZER_FILE} files differ)"
        hint = (
            f"give the data folder the model trained on ({self._option('DIR')})"
            if self.tokenizer_given
            else "the folder was prepared again since; pass one with the model's tokenizer "
            f"({self._option('DIR')})"
        )
        raise TokenizerMismatch(
            f"{folder} holds a {theirs}, and {self.path} was trained with {ours}: {hint}"
        )

    def _option(self, value: str) -> str:
        """The tokenizer option given ``value``, as the user writes it."""
        option = self.tokenizer_option
        return f"{option} {value}" if option.startswith("-") else f"{option}={value}"

    def _run_copy(self) -> Path | None:
        """The run folder's copy of the tokenizer it trained with (made at the run's start:
        it outlives a data folder prepared again or moved), when it is this checkpoint's
        (a checkpoint copied into another run's folder may not be); else None."""
        folder = None if self.run_dir is None else self.run_dir / RUN_TOKENIZER_DIR
        if folder is None or not _prepared(folder):
            return None
        try:
            meta = read_meta(folder, splits=False)
        except DataFolderError:
            return None
        found = {
            "tokenizer": meta.tokenizer,
            "vocab_size": meta.vocab_size,
            "tokenizer_sha256": tokenizer_digest(folder),
        }
        return None if tokenizer_changes(self.trained_with, found) else folder

    def _tokenizer_folder(self) -> Path:
        """The prepared data folder to read the tokenizer from, or a one-line error."""
        if self.tokenizer_given:
            assert self.data_dir is not None
            folder = Path(self.data_dir).expanduser()
            if folder.is_file():
                hint = f": did you mean {folder.parent}?" if folder.name == "meta.json" else ""
                raise TokenizerNotFound(
                    f"{self._option(str(self.data_dir))} is a file, not a prepared data folder "
                    f"(one with meta.json, as `cofr data prepare` writes){hint}"
                )
            if not folder.is_dir():
                raise TokenizerNotFound(
                    f"{self._option(str(self.data_dir))}: no such folder; give a prepared data folder "
                    "(one with meta.json, as `cofr data prepare` writes)"
                )
            if not _prepared(folder):
                raise TokenizerNotFound(
                    f"{self._option(str(self.data_dir))} is not a prepared data folder (no meta.json); "
                    "give the folder `cofr data prepare` wrote"
                )
            return folder
        kept = self._run_copy()
        if kept is not None:
            return kept
        if self.data_dir is None:
            raise TokenizerNotFound(
                f"{self.path} does not say which data it was trained on: pass the "
                f"prepared data folder whose tokenizer to use ({self._option('DIR')})"
            )
        tried = data_dir_candidates(self.data_dir, self.path, self.run_dir)
        for folder in tried:
            if _prepared(folder):
                return folder
        # A folder there without meta.json (half-written): load_tokenizer says what is wrong.
        present = next((folder for folder in tried if folder.is_dir()), None)
        if present is not None:
            return present
        if len(tried) == 1:  # an absolute path
            raise TokenizerNotFound(
                f"the tokenizer of {self.path} lives in its training data folder "
                f"{self.data_dir}, which is not on this machine: copy that folder's "
                f"meta.json and tokenizer/ here, or pass {self._option('DIR')}"
            )
        raise TokenizerNotFound(
            f"the tokenizer of {self.path} lives in its training data folder "
            f"{self.data_dir!r} (relative to where it was trained), not found as "
            f"{', '.join(map(str, tried))}: run from the folder it was trained in, or pass "
            f"{self._option('DIR')}"
        )


def run_dir_of(ckpt: Path) -> Path | None:
    """``runs/<exp>/<run>`` for ``runs/<exp>/<run>/checkpoints/x.ckpt`` (or an hpc_ckpt)."""
    for folder in (ckpt.parent.parent, ckpt.parent):
        if (folder / "config.yaml").is_file() or (folder / RUN_ID_FILE).is_file():
            return folder
    return None


def foreign_checkpoint(
    path: Path, checkpoint: dict[str, Any], run_dir: Path, run_id: str
) -> str | None:
    """Why checkpoint ``path`` (its loaded dict) is not run ``run_id``'s though it lies in
    that run's folder (a copy from another run: its scores would go onto another model's
    MLflow run, where the newest step's win), or None when it is. Read from the run id
    the checkpoint recorded; a checkpoint older than that is compared by its model."""
    from cofrgenet.training.checkpoints import changed_settings
    from cofrgenet.training.model_options import model_config_of

    saved = checkpoint.get("mlflow_run_id")
    if saved is not None:
        if saved == run_id:
            return None
        return f"{path} was saved by MLflow run {saved}, not by {run_dir.name}'s run {run_id}"
    config_file = run_dir / "config.yaml"
    theirs = checkpoint.get("model_config")
    if not isinstance(theirs, dict) or not config_file.is_file():
        return None
    try:
        model = (yaml.safe_load(config_file.read_text()) or {}).get("model")
        ours = model_config_of(model).to_dict()
    except (yaml.YAMLError, ValueError, TypeError, AttributeError, UserError):
        return None  # a config.yaml this code cannot read says nothing against it
    differ = changed_settings(theirs, ours)
    if not differ:
        return None
    return f"{path} holds another model than {run_dir.name}'s config.yaml ({differ[0]} differs)"


def run_id_of(run_dir: Path | None) -> str | None:
    """The MLflow run id of a run folder, if it was tracked."""
    if run_dir is None or not (run_dir / RUN_ID_FILE).is_file():
        return None
    return (run_dir / RUN_ID_FILE).read_text().strip()


def tracking_uri_of(run_dir: Path) -> str:
    """The MLflow tracking URI of a tracked run folder: its config.yaml's
    ``run.tracking_uri``, else the user's ``MLFLOW_TRACKING_URI``, else the store of the
    runs folder holding it (``<runs_dir>/<experiment>/<run>``: the folder two levels up,
    wherever it was moved, never a runs folder of that name under the working directory)."""
    from cofrgenet.training.run_store import RunConfig, tracking_uri

    run: dict[str, Any] = {}
    config_file = run_dir / "config.yaml"
    if config_file.is_file():
        run = (yaml.safe_load(config_file.read_text()) or {}).get("run") or {}
    runs_dir = str(run_dir.absolute().parent.parent)  # a symlinked folder's own parents
    return tracking_uri(RunConfig(runs_dir=runs_dir, tracking_uri=run.get("tracking_uri")))


class NotLogged(Exception):
    """Results could not go onto a training run in MLflow; the message says why."""


def log_onto_run(
    uri: str, run_id: str, metrics: dict[str, float], step: int, tags: dict[str, str]
) -> int:
    """Log ``metrics`` (at ``step``) and ``tags`` onto the training run ``run_id`` (what an
    evaluation or a fine-tuning of its checkpoint measured), in one call: the client splits
    it at MLflow's limits. Raises NotLogged, with the reason, when the run cannot be
    reached (a moved or copied run folder, a server down); no store is made on the way.
    A metric the run holds at ``step`` with the same value is not logged again (the same
    checkpoint scored again: one point, not two, as ``cofr validate`` and ``test`` do),
    nor the time it took (``<prefix>/seconds``), which is logged beside a new score of
    its ``<prefix>`` only. Returns how many metrics were logged."""
    from mlflow.entities import Metric, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    problem = unreachable_run(uri, run_id)
    if problem is not None:
        raise NotLogged(problem)
    now = int(time.time() * 1000)
    try:
        client = MlflowClient(uri)
        logged = client.get_run(run_id).data.metrics  # a key never logged has no history
        new = {
            key: value
            for key, value in metrics.items()
            if key not in logged or not scored_already(client, run_id, key, step, value)
        }
        rescored = {key.rpartition("/")[0] for key in new if not key.endswith("/seconds")}
        new = {
            key: value
            for key, value in new.items()
            if not key.endswith("/seconds") or key.rpartition("/")[0] in rescored
        }
        client.log_batch(
            run_id,
            metrics=[Metric(key, float(value), now, step) for key, value in new.items()],
            tags=[RunTag(key, value) for key, value in tags.items()],
        )
    except (MlflowException, OSError) as error:  # a deleted run, a server gone meanwhile
        raise NotLogged(f"MLflow run {run_id} at {uri}: {first_line(error)}") from None
    return len(new)


def load_checkpoint(
    path: str | Path,
    device: str = "cpu",
    tokenizer_dir: str | None = None,
    tokenizer_option: str = "--tokenizer",
) -> LoadedCheckpoint:
    """Load ``path`` (a ``cofr fit`` checkpoint) for inference on ``device``.

    tokenizer_dir: a prepared data folder whose tokenizer to use instead of the one the
    run trained on (same vocabulary), the commands' ``--tokenizer`` (``tokenizer_option``:
    its name in the errors).
    """
    from cofrgenet.training import checkpoints

    path = checkpoint_file(path)
    checkpoint = checkpoints.load(path)
    try:
        model, config = checkpoints.restore_model(checkpoint)
    except checkpoints.CheckpointError as error:  # it cannot name the file it was given
        raise checkpoints.CheckpointError(f"{path}: {error}") from None
    model.to(device).eval()
    data_dir = tokenizer_dir or checkpoint.get("datamodule_hyper_parameters", {}).get("data_dir")
    run_dir = run_dir_of(path.resolve())
    run_id = run_id_of(run_dir)
    foreign = None if run_id is None else foreign_checkpoint(path, checkpoint, run_dir, run_id)
    return LoadedCheckpoint(
        path=path,
        step=int(checkpoint.get("global_step", 0)),
        model=model,
        config=config,
        data_dir=None if data_dir is None else str(data_dir),
        run_dir=run_dir,
        mlflow_run_id=None if foreign else run_id,
        foreign=foreign,
        tokenizer_given=bool(tokenizer_dir),
        tokenizer_option=tokenizer_option,
        trained_with=_trained_tokenizer(checkpoint),
        trained_length=_trained_length(checkpoint),
    )


def _trained_length(checkpoint: dict[str, Any]) -> int | None:
    """``data.block_size`` of the fit (its data module's hyper-parameters), or None."""
    hparams = checkpoint.get("datamodule_hyper_parameters") or {}
    length = hparams.get("block_size") if isinstance(hparams, dict) else None
    return length if isinstance(length, int) and not isinstance(length, bool) else None


def _trained_tokenizer(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer kind and size in the checkpoint's data state (``TokenDataModule``'s
    resume fingerprint, saved under its class name), or {}."""
    state = checkpoint.get("TokenDataModule") or {}
    fingerprint = state.get("fingerprint") or {} if isinstance(state, dict) else {}
    return {k: fingerprint[k] for k in TOKENIZER_KEYS if k in fingerprint}

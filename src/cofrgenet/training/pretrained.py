"""A trained checkpoint, ready to use: its model, its tokenizer and its MLflow run.

``cofr generate`` and every evaluation tool (``cofr eval``, GLUE fine-tuning, the lm-eval
adapter, the Hugging Face export) start from :func:`load_checkpoint`, so they all load
weights one way: checked first, unpickled with ``weights_only=True``, built from the run's
``model.preset`` and ``model.config`` as ``LanguageModel.load_from_checkpoint`` would (old
and compiled checkpoints included) but without importing Lightning
(:func:`cofrgenet.training.checkpoints.restore_model`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from torch import nn

from cofrgenet.data import Tokenizer, load_tokenizer
from cofrgenet.errors import UserError
from cofrgenet.models import ModelConfig


class TokenizerNotFound(UserError, FileNotFoundError):
    """The data folder whose tokenizer a checkpoint needs is not on this machine."""


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
    #: The option that names another tokenizer folder, for the messages.
    tokenizer_flag: str = "--tokenizer"
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
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the data the model trained on (or of ``tokenizer_dir``)."""
        if self._tokenizer is None:
            if self.data_dir is None:
                raise TokenizerNotFound(
                    f"{self.path} does not say which data it was trained on: pass the "
                    f"prepared data folder whose tokenizer to use ({self.tokenizer_flag} DIR)"
                )
            if not Path(self.data_dir).is_dir():
                raise TokenizerNotFound(
                    f"the tokenizer of {self.path} lives in its training data folder "
                    f"{self.data_dir}, which is not on this machine: copy that folder's "
                    f"meta.json and tokenizer/ here, or pass {self.tokenizer_flag} DIR"
                )
            self._tokenizer = load_tokenizer(self.data_dir)
        return self._tokenizer


def run_dir_of(ckpt: Path) -> Path | None:
    """``runs/<exp>/<run>`` for ``runs/<exp>/<run>/checkpoints/x.ckpt`` (or an hpc_ckpt)."""
    for folder in (ckpt.parent.parent, ckpt.parent):
        if (folder / "config.yaml").is_file() or (folder / "mlflow_run_id").is_file():
            return folder
    return None


def run_id_of(run_dir: Path | None) -> str | None:
    """The MLflow run id of a run folder, if it was tracked."""
    if run_dir is None or not (run_dir / "mlflow_run_id").is_file():
        return None
    return (run_dir / "mlflow_run_id").read_text().strip()


def tracking_uri_of(run_dir: Path) -> str:
    """The MLflow tracking URI of a tracked run folder, from its config.yaml."""
    from cofrgenet.training.tracking import RunConfig, tracking_uri  # imports Lightning

    run: dict[str, Any] = {}
    config_file = run_dir / "config.yaml"
    if config_file.is_file():
        run = (yaml.safe_load(config_file.read_text()) or {}).get("run") or {}
    runs_dir = run.get("runs_dir") or str(run_dir.parent.parent)
    if not Path(runs_dir).is_absolute() and not Path(runs_dir).is_dir():
        runs_dir = str(run_dir.parent.parent)  # the run folder was moved or copied
    return tracking_uri(RunConfig(runs_dir=runs_dir, tracking_uri=run.get("tracking_uri")))


def load_checkpoint(
    path: str | Path,
    device: str = "cpu",
    tokenizer_dir: str | None = None,
    tokenizer_flag: str = "--tokenizer",
) -> LoadedCheckpoint:
    """Load ``path`` (a ``cofr fit`` checkpoint) for inference on ``device``.

    tokenizer_dir: a prepared data folder whose tokenizer to use instead of the one the
    run trained on (same vocabulary); tokenizer_flag: the command's option for it.
    """
    from cofrgenet.training import checkpoints

    path = Path(path)
    checkpoint = checkpoints.load(path)
    model, config = checkpoints.restore_model(checkpoint)
    model.to(device).eval()
    data_dir = tokenizer_dir or checkpoint.get("datamodule_hyper_parameters", {}).get("data_dir")
    run_dir = run_dir_of(path.resolve())
    return LoadedCheckpoint(
        path=path,
        step=int(checkpoint.get("global_step", 0)),
        model=model,
        config=config,
        data_dir=None if data_dir is None else str(data_dir),
        run_dir=run_dir,
        mlflow_run_id=run_id_of(run_dir),
        tokenizer_flag=tokenizer_flag,
    )

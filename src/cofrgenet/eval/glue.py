"""``cofr finetune glue``: fine-tune a pretrained checkpoint on a GLUE task.

A linear classification head reads the decoder's final hidden state (after its final
norm) at the last token of each sequence (``a <eos>`` or ``a <eos> b <eos>``, see
:func:`cofrgenet.eval.glue_data.encode_examples`), and the whole network is trained
with Lightning on cross-entropy. The dev sets are scored after every epoch (or every
``--eval-every`` steps): accuracy, F1 of the positive class (MRPC, QQP), Matthews
correlation (CoLA).

Tracking: the fine-tuning is an MLflow run of its own, in experiment ``glue-<task>``,
tagged ``cofr.pretrain_run_id``; its dev metrics are ``glue/<task>/<metric>`` (MNLI's
mismatched dev: ``glue/mnli-mm/<metric>``). The final dev metrics are also logged onto
the pretraining run (at its checkpoint's step), so the MLflow UI compares pretrained
models by them. docs/glue.md describes the protocol and its choices.

Torch and Lightning are imported inside functions: ``cofr finetune glue --help`` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cofrgenet import terminal
from cofrgenet.atomic import create_numbered, nearest_existing, why_no_folder, write_text_atomic
from cofrgenet.errors import UserError, check_seed
from cofrgenet.eval.glue_data import (
    DEFAULT_DATA_DIR,
    NOT_OFFERED,
    TASKS,
    Example,
    GlueTask,
    TaskData,
    default_data_dir,
    encode_examples,
    load_task,
)
from cofrgenet.eval.paths import (
    check_output_file,
    older_partial_note,
    partial_results_file,
    read_results,
    results_json,
    write_results,
)
from cofrgenet.hub import offline_unless_reachable
from cofrgenet.signals import lightning_sigterm, signal_name, signals_held, sigterm_raises

if TYPE_CHECKING:
    from torch import Tensor, nn

#: The paper's GLUE dev scores (OWT pretraining; spec section 5), in percent:
#: (GPT2-xl, CoFrGeNet-F). The paper does not say which metric; CoLA's 81.78 and
#: MRPC's 79.83 read as accuracies (a GPT-2's CoLA MCC is far lower), so the table
#: shows them beside our accuracy.
PAPER: dict[str, tuple[float, float]] = {
    "mnli": (86.89, 87.26),
    "qqp": (88.93, 89.95),
    "qnli": (91.35, 91.89),
    "sst2": (93.56, 94.16),
    "cola": (81.78, 82.59),
    "mrpc": (79.83, 80.21),
    "rte": (60.27, 61.35),
}
METRIC_NAMES = {"accuracy": "accuracy", "f1": "F1", "mcc": "MCC"}


@dataclass
class FinetuneConfig:
    """The fine-tuning protocol (docs/glue.md says where each default comes from).

    The spec's setup (AdamW, weight decay 0.1, no dropout) is kept; it gives no
    fine-tuning learning rate, epochs or batch size, so those follow the usual GLUE
    fine-tuning of GPT/BERT-style models: lr 2e-5, 3 epochs, batch 32, linear warmup
    over 6% of the steps then linear decay to 0, Adam betas (0.9, 0.999), clip 1.0.
    """

    lr: float = field(default=2e-5, metadata={"help": "peak AdamW learning rate"})
    epochs: int = field(default=3, metadata={"help": "passes over the training set"})
    batch_size: int = field(default=32, metadata={"help": "examples per optimizer step"})
    weight_decay: float = field(
        default=0.1, metadata={"help": "AdamW weight decay of matrices (the paper's 0.1)"}
    )
    warmup_ratio: float = field(
        default=0.06, metadata={"help": "share of the steps with linear warmup; then linear decay"}
    )
    betas: tuple[float, ...] = field(default=(0.9, 0.999), metadata={"help": "Adam betas"})
    head_dropout: float = field(
        default=0.0, metadata={"help": "dropout before the head (the paper uses none)"}
    )
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip (0: none)"})
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "tokens per example, cut to the model's block size (default: the "
            "length it trained at, its data.block_size)"
        },
    )
    max_steps: int | None = field(
        default=None, metadata={"help": "stop after this many optimizer steps"}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "train on a random subset of this size"}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "score each dev set on its first N examples"}
    )
    eval_every: int | None = field(
        default=None, metadata={"help": "steps between dev evaluations (default: each epoch)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the head, the shuffling, the subset"})

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        checks = [
            (self.lr > 0, "--lr must be positive"),
            (self.epochs >= 1, "--epochs must be >= 1"),
            (self.batch_size >= 1, "--batch-size must be >= 1"),
            (0 <= self.warmup_ratio < 1, "--warmup-ratio must be in [0, 1)"),
            # A negative clip meant none, as 0 does, unsaid.
            (self.grad_clip >= 0, f"--grad-clip must be >= 0 (0: none), got {self.grad_clip}"),
            (0 <= self.head_dropout < 1, "--head-dropout must be in [0, 1)"),
            (
                len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
                f"--betas takes two values in [0, 1), e.g. 0.9,0.999; got {self.betas}",
            ),
        ]
        for name in ("max_steps", "max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            checks.append((value is None or value >= 1, f"--{name.replace('_', '-')} must be >= 1"))
        checks.append(
            (
                self.max_length is None or self.max_length >= 4,
                f"--max-length must be >= 4 (what a sentence-pair task needs at least: two "
                f"texts and their two <eos>; one bound for every task), "
                f"got {self.max_length}",
            )
        )
        checks.append(
            (self.eval_every is None or self.eval_every >= 1, "--eval-every must be >= 1")
        )
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        check_seed(self.seed, "--seed")


# --------------------------------------------------------------------------- metrics


def accuracy(preds: Sequence[int], labels: Sequence[int]) -> float:
    """Share of predictions equal to the labels."""
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    return sum(p == y for p, y in zip(preds, labels, strict=True)) / max(1, len(labels))


def f1_score(preds: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of class ``positive`` (GLUE's MRPC/QQP F1): 2 TP / (2 TP + FP + FN); 0 when
    neither predictions nor labels hold the class (scikit-learn's convention)."""
    tp = sum(p == positive and y == positive for p, y in zip(preds, labels, strict=True))
    fp = sum(p == positive and y != positive for p, y in zip(preds, labels, strict=True))
    fn = sum(p != positive and y == positive for p, y in zip(preds, labels, strict=True))
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0


def matthews_corrcoef(preds: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation (CoLA's metric), the K-class form (Gorodkin 2004), which is
    the usual (TP TN - FP FN) / sqrt(...) for two classes; 0 when undefined (a constant
    prediction or label), as scikit-learn."""
    classes = sorted(set(preds) | set(labels))
    n = len(labels)
    correct = sum(p == y for p, y in zip(preds, labels, strict=True))
    pred_counts = [sum(p == k for p in preds) for k in classes]
    true_counts = [sum(y == k for y in labels) for k in classes]
    cov_py = correct * n - sum(p * t for p, t in zip(pred_counts, true_counts, strict=True))
    cov_pp = n * n - sum(p * p for p in pred_counts)
    cov_yy = n * n - sum(t * t for t in true_counts)
    if cov_pp == 0 or cov_yy == 0:
        return 0.0
    return cov_py / math.sqrt(cov_pp * cov_yy)


METRICS = {"accuracy": accuracy, "f1": f1_score, "mcc": matthews_corrcoef}


def task_metrics(task: GlueTask, preds: Sequence[int], labels: Sequence[int]) -> dict[str, float]:
    """The task's metrics (``task.metrics``) of ``preds`` against ``labels``, as fractions."""
    return {name: float(METRICS[name](preds, labels)) for name in task.metrics}


# ---------------------------------------------------------------------- the classifier


def strip_lm_head(model: nn.Module) -> int:
    """Make ``model`` (ids (B, T) -> logits (B, T, V)) return its final hidden states
    (B, T, C) instead, in place; returns C.

    Every decoder here ends ``lm_head(final_norm(x))`` (transformers) or
    ``lm_head(dropout(rnn_out))`` (recurrent ones), so replacing ``lm_head`` by the
    identity gives the features a head should read, without the (B, T, V) logits (the
    largest activation of a GPT-2 at V = 50257). A tied embedding keeps its weight: it is
    the same Parameter, still held by the embedding.
    """
    from torch import nn

    head = getattr(model, "lm_head", None)
    if not isinstance(head, nn.Linear):
        raise UserError(
            f"{type(model).__name__} has no linear `lm_head` to read hidden states before: "
            "GLUE fine-tuning supports the gpt, llama, rnn, lstm and gru architectures"
        )
    model.lm_head = nn.Identity()
    return head.in_features


def pool_last(hidden: Tensor, lengths: Tensor) -> Tensor:
    """hidden (B, T, C), lengths (B,) -> the state at each sequence's last token (B, C).

    Sequences are padded on the right; a causal decoder's state at position
    ``length - 1`` has not seen the padding, so pooling there is exact.
    """
    import torch

    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, lengths.to(hidden.device) - 1]


def collate(batch: Sequence[tuple[list[int], int]], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """[(ids, label)] -> ids (B, T) right-padded with ``pad_id`` to the longest, lengths
    (B,), labels (B,)."""
    import torch

    lengths = torch.tensor([len(ids) for ids, _ in batch], dtype=torch.long)
    ids = torch.full((len(batch), int(lengths.max())), pad_id, dtype=torch.long)
    for row, (seq, _) in enumerate(batch):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    labels = torch.tensor([label for _, label in batch], dtype=torch.long)
    return ids, lengths, labels


@functools.cache
def _classifier_class() -> type:
    """The LightningModule class, made on first use so that importing this module (for
    ``--help``) does not import Lightning."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch import nn

    from cofrgenet.training.optim import (
        ClipsGradients,
        OptimizerConfig,
        build_adamw,
        planned_steps,
        scales_loss,
        warmup_linear,
    )

    class GlueClassifier(ClipsGradients, L.LightningModule):
        """A decoder (hidden states (B, T, C), see :func:`strip_lm_head`) with a linear
        head on the last token's state: batches (ids (B, T), lengths (B,), labels (B,))
        -> class logits (B, K).

        Metrics: ``train/loss``, ``opt/lr``; per dev set ``glue/<key>/loss`` and
        ``glue/<key>/<metric>`` (fractions). ``results`` holds the last dev scores.
        """

        def __init__(
            self, backbone: nn.Module, hidden_size: int, task: GlueTask, config: FinetuneConfig
        ) -> None:
            super().__init__()
            self.backbone = backbone
            self.task = task
            self.config = config
            self.dropout = nn.Dropout(config.head_dropout)
            self.head = nn.Linear(hidden_size, task.num_labels)
            nn.init.normal_(self.head.weight, std=0.02)  # the decoder's own init scale
            nn.init.zeros_(self.head.bias)
            self.splits = task.dev_splits()
            self.results: dict[str, dict[str, float]] = {}
            self.validated_at: int | None = None
            self._outputs: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}

        def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
            """ids (B, T), lengths (B,) -> class logits (B, K)."""
            hidden = self.backbone(ids)  # (B, T, C)
            return self.head(self.dropout(pool_last(hidden, lengths)))

        def training_step(self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int) -> Tensor:
            ids, lengths, labels = batch
            loss = F.cross_entropy(self(ids, lengths).float(), labels)
            self.log("train/loss", loss, prog_bar=True)
            self.log("opt/lr", self.optimizers().param_groups[0]["lr"])
            return loss

        def on_validation_epoch_start(self) -> None:
            self._outputs = {}

        def validation_step(
            self, batch: tuple[Tensor, Tensor, Tensor], batch_idx: int, dataloader_idx: int = 0
        ) -> None:
            ids, lengths, labels = batch
            logits = self(ids, lengths).float()
            loss = F.cross_entropy(logits, labels, reduction="sum")
            self._outputs.setdefault(dataloader_idx, []).append(
                (logits.argmax(-1).cpu(), labels.cpu(), loss.detach().cpu())
            )

        def on_validation_epoch_end(self) -> None:
            if self.trainer.sanity_checking:
                return
            for index, split in enumerate(self.splits):
                outputs = self._outputs.get(index)
                if not outputs:
                    continue
                preds = torch.cat([o[0] for o in outputs]).tolist()
                labels = torch.cat([o[1] for o in outputs]).tolist()
                scores = task_metrics(self.task, preds, labels)
                scores["loss"] = float(sum(o[2] for o in outputs)) / len(labels)
                self.results[split.name] = {**scores, "examples": len(labels)}
                logged = {f"glue/{split.key}/{name}": value for name, value in scores.items()}
                for key, value in logged.items():  # the progress bar and callbacks
                    self.log(key, value, logger=False, add_dataloader_idx=False)
                # Logged directly at the optimizer steps done: Lightning's own step for
                # an end-of-epoch validation is one less than for a `validate` call.
                if self.logger is not None:
                    self.logger.log_metrics(logged, step=self.trainer.global_step)
            self.validated_at = self.trainer.global_step

        def configure_optimizers(self) -> dict[str, Any]:
            cfg = self.config
            optimizer = build_adamw(
                self,
                OptimizerConfig(
                    lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, warmup_steps=0
                ),
                grad_scaler=scales_loss(self.trainer),
            )
            total = max(1, planned_steps(self.trainer))
            warmup = round(cfg.warmup_ratio * total)
            schedule = torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: warmup_linear(step, total, warmup)
            )
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step"},
            }

    GlueClassifier.__qualname__ = "GlueClassifier"  # not `_classifier_class.<locals>...`
    return GlueClassifier


# ------------------------------------------------------------------------ the command


def check_trainer_options(accelerator: str, precision: str) -> None:
    """Refuse an ``--accelerator`` or ``--precision`` Lightning would refuse, as a
    :class:`UserError` naming the option, before the data and the model are loaded.

    Lightning knows what this machine and this Lightning can run: a Trainer with only
    these settings is made and thrown away (milliseconds), the accelerator alone first
    so that the error names the option at fault."""
    import logging
    import warnings

    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    names = ("lightning.pytorch", "lightning.fabric")
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for option, value, settings in (
        ("--accelerator", accelerator, {"accelerator": accelerator}),
        ("--precision", precision, {"accelerator": accelerator, "precision": precision}),
    ):
        try:
            # The real Trainer says its own "GPU available" lines and warnings later.
            with warnings.catch_warnings(), contextlib.ExitStack() as restore:
                warnings.simplefilter("ignore")
                for logger, level in zip(loggers, levels, strict=True):
                    logger.setLevel(logging.ERROR)
                    restore.callback(logger.setLevel, level)
                L.Trainer(
                    devices=1,
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    **settings,
                )
        except (MisconfigurationException, ValueError, ImportError) as error:
            hint = (
                "; leave it out (auto) or give one this machine has, e.g. cpu"
                if option == "--accelerator"
                else ""
            )
            # Lightning's first line is the message; its "!" or "." would come before the hint.
            first = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip("!. ")
            raise UserError(f"{option} {value}: {first}{hint}") from None


def _task_name(value: str) -> str:
    """``--task``: a name of :data:`TASKS`; STS-B and WNLI refused with the reason."""
    key = value.lower().replace("-", "")
    if key in NOT_OFFERED:
        raise argparse.ArgumentTypeError(
            f"{NOT_OFFERED[key]}: cofr finetune glue offers {', '.join(TASKS)}"
        )
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``cofr finetune glue``."""
    from cofrgenet.dataclass_options import add_checkpoint_argument, add_dataclass_arguments

    parser.add_argument(
        "--task",
        required=True,
        type=_task_name,
        choices=list(TASKS),
        help="the GLUE task (the seven classification tasks; STS-B, a regression, and WNLI "
        "are not offered)",
    )
    add_checkpoint_argument(parser)
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder of the original GLUE files (SST-2/train.tsv, MNLI/dev_matched.tsv, ...); "
        f"default: {DEFAULT_DATA_DIR} where it has the task's folder, else the hub's "
        "nyu-mll/glue through `datasets`",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="prepared data folder whose tokenizer to use (default: the checkpoint's)",
    )
    add_dataclass_arguments(parser, FinetuneConfig)
    parser.add_argument(
        "--accelerator", default="auto", help="Lightning accelerator (default: %(default)s)"
    )
    parser.add_argument(
        "--precision",
        default="32-true",
        help="Lightning precision, e.g. bf16-mixed on GPUs (default: %(default)s)",
    )
    parser.add_argument(
        "--runs-dir",
        default=None,
        help="where the fine-tuning's folder goes (default: the checkpoint's runs/ folder, else runs)",
    )
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow store of the fine-tuning run (default: the pretraining run's, else "
        "MLFLOW_TRACKING_URI or sqlite:///<runs-dir>/mlflow.db)",
    )
    parser.add_argument(
        "--experiment", default=None, help="MLflow experiment (default: glue-<task>)"
    )
    parser.add_argument("--name", default=None, help="run name (default: <pretraining run>-<time>)")
    # --no-mlflow, as every other command names it (--mlflow, the default, still parses).
    parser.add_argument(
        "--no-mlflow",
        dest="mlflow",
        action="store_false",
        help="no MLflow run: results on disk only",
    )
    parser.add_argument("--mlflow", dest="mlflow", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: when the terminal is interactive)",
    )
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results as JSON")


def _subset(items: list[Any], size: int | None, rng: random.Random | None) -> list[Any]:
    if size is None or size >= len(items):
        return items
    return rng.sample(items, size) if rng is not None else items[:size]


def _print_table(task: GlueTask, results: dict[str, dict[str, float]], header: str) -> None:
    from rich.table import Table

    table = Table(
        caption="paper: GPT2-xl / CoFrGeNet-F pretrained on OpenWebText (its CoLA and MRPC "
        "figures read as accuracies)",
        caption_justify="left",
    )
    table.add_column("dev set")
    table.add_column("examples", justify="right")
    for name in task.metrics:
        table.add_column(METRIC_NAMES[name], justify="right")
    table.add_column("loss", justify="right")
    table.add_column("paper", justify="right", no_wrap=True)
    for index, split in enumerate(task.dev_splits()):
        scores = results.get(split.name)
        if scores is None:
            continue
        paper = PAPER.get(task.name) if index == 0 else None
        table.add_row(
            split.key,
            f"{int(scores['examples']):,}",
            *(f"{100 * scores[m]:.2f}" for m in task.metrics),
            f"{scores['loss']:.4f}",
            f"{paper[0]:.2f} / {paper[1]:.2f}" if paper else "",
        )
    terminal.print_titled(table, header)


def dev_metrics(task: GlueTask, results: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{"glue/<key>/<metric>": value}`` of the dev results (the task's metrics only)."""
    return {
        f"glue/{split.key}/{name}": results[split.name][name]
        for split in task.dev_splits()
        if split.name in results
        for name in task.metrics
    }


def run(args: argparse.Namespace) -> int:
    """``cofr finetune glue``: fine-tune, score the dev sets, track, print, write JSON."""
    from cofrgenet.dataclass_options import dataclass_from_args
    from cofrgenet.eval.paths import check_data_dir
    from cofrgenet.training.pretrained import checkpoint_file
    from cofrgenet.training.run_store import check_folder_name

    if not args.mlflow and args.tracking_uri is not None:
        raise UserError(
            "--tracking-uri names the MLflow store, and --no-mlflow logs nothing: drop one"
        )
    config = dataclass_from_args(FinetuneConfig, args)
    for option, name in (("--experiment", args.experiment), ("--name", args.name)):
        if name is not None:  # each is a folder: runs/<experiment>/<name>
            check_folder_name(option, name)
    # Before the hub's probe (its note about an offline hub came before this error) and
    # the data: the hub may take a while.
    ckpt = checkpoint_file(args.ckpt)
    # Before the fine-tuning: results are never computed only to be lost.
    out = check_output_file(args.json, kind="metrics") if args.json else None
    check_data_dir(
        args.data_dir, "the folder of the original GLUE files", "the Hugging Face dataset"
    )
    check_runs_dir(args.runs_dir)
    # As cofr eval reads data/eval: the original files where they are, the hub otherwise.
    data_dir = default_data_dir(args.task) if args.data_dir is None else args.data_dir
    if data_dir is None:
        # Now: the checks below import Lightning, which imports the hub's client, and
        # the probe does nothing once that has read its settings (the hub's ~25 s of
        # retries came back). The checks above are of the arguments alone.
        offline_unless_reachable()
    check_trainer_options(args.accelerator, args.precision)  # before the data and the model
    task = TASKS[args.task]
    data = load_task(task.name, data_dir)  # first: a missing file costs no model load
    said: list[str] = []

    def say(warning: str) -> None:
        said.append(warning)
        print(f"warning: {warning}", file=sys.stderr)

    for warning in data.warnings():  # now, not only after the fine-tuning
        say(warning)
    result = finetune(
        ckpt,
        data,
        config,
        tokenizer_dir=args.tokenizer,
        accelerator=args.accelerator,
        precision=args.precision,
        runs_dir=args.runs_dir,
        tracking_uri=args.tracking_uri,
        experiment=args.experiment,
        name=args.name,
        mlflow=args.mlflow,
        progress=sys.stderr.isatty() if args.progress is None else args.progress,
        command_line=getattr(args, "command_line", None),
        say=say,
        json_out=out,
    )
    steps = result["steps"]
    header = f"GLUE {task.name} dev ({steps} step{'s' * (steps != 1)}, {result['source']}), %"
    _print_table(task, result["splits"], header)
    for warning in result["warnings"]:
        if warning not in said:
            print(f"warning: {warning}", file=sys.stderr)
    print(f"results: {Path(result['run_dir']) / 'results.json'}")
    if out is not None:
        print(f"results: {out}{older_partial_note(out)}")
    if result.get("run_id"):
        # The store named where it is not the pretraining run's (--tracking-uri): a UI
        # opened on that one does not show this run.
        store = _store_note(result["tracking_uri"], result["pretrain_tracking_uri"])
        print(f"MLflow run {result['run_id']} in experiment {result['experiment']!r}{store}")
    return 0


def _loaders(
    data: TaskData, config: FinetuneConfig, tokenizer: Any, max_length: int
) -> tuple[list[Example], dict[str, list[Example]], Any, list[Any]]:
    """The examples used (``--max-*-samples`` subsets) and their data loaders: training
    shuffled by ``config.seed``, each dev set sorted by length (less padding)."""
    import torch
    from torch.utils.data import DataLoader

    rng = random.Random(config.seed)
    train = _subset(data.train, config.max_train_samples, rng)
    dev = {k: _subset(v, config.max_eval_samples, None) for k, v in data.dev.items()}
    train_ids, train_labels = encode_examples(train, tokenizer, max_length)
    pad = tokenizer.eos_id  # any id: pooling never reads past a sequence's length
    collate_fn = functools.partial(collate, pad_id=pad)
    train_loader = DataLoader(
        list(zip(train_ids, train_labels, strict=True)),
        batch_size=config.batch_size,
        shuffle=True,
        collate_fn=collate_fn,
        generator=torch.Generator().manual_seed(config.seed),
    )
    dev_loaders = []
    for split in data.task.dev_splits():
        ids, labels = encode_examples(dev[split.name], tokenizer, max_length)
        pairs = sorted(zip(ids, labels, strict=True), key=lambda p: len(p[0]))
        dev_loaders.append(DataLoader(pairs, batch_size=config.batch_size, collate_fn=collate_fn))
    return train, dev, train_loader, dev_loaders


def finetune(
    ckpt: Path,
    data: TaskData,
    config: FinetuneConfig,
    *,
    tokenizer_dir: str | None = None,
    accelerator: str = "auto",
    precision: str = "32-true",
    runs_dir: str | None = None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    name: str | None = None,
    mlflow: bool = True,
    progress: bool = False,
    command_line: str | None = None,
    say: Callable[[str], None] | None = None,
    json_out: Path | None = None,
) -> dict[str, Any]:
    """Fine-tune checkpoint ``ckpt`` on ``data``; returns the results (the JSON of ``--json``,
    written to ``json_out`` with the run folder's ``results.json``).

    Results: ``metrics`` ({"glue/<key>/<metric>": fraction}), ``splits`` (per dev set:
    the metrics, ``loss``, ``examples``), ``run_id``/``tracking_uri``/``experiment`` of
    the fine-tuning run, ``pretrain_run_id``, ``config``, data sizes and ``warnings``,
    those known before the fine-tuning also passed to ``say`` then.
    """
    import lightning as L

    from cofrgenet.training.console import quiet_known_noise
    from cofrgenet.training.pretrained import load_checkpoint
    from cofrgenet.training.run_store import RUN_DIR_TAG, RunConfig, check_tracking_uri, folder_name
    from cofrgenet.training.run_store import tracking_uri as default_tracking_uri

    quiet_known_noise()
    check_trainer_options(accelerator, precision)  # before the model load and the MLflow run
    task = data.task
    loaded = load_checkpoint(ckpt, "cpu", tokenizer_dir)
    tokenizer = loaded.tokenizer  # checked against the model (ids it has embeddings for)
    # Default: the length the model trained at, as cofr eval's windows (later positions
    # never trained, and runs differing only in data.block_size would not compare).
    max_length = min(config.max_length or loaded.context_length, loaded.block_size)
    early = []
    if config.max_length is not None and config.max_length > loaded.block_size:
        early.append(
            f"--max-length {config.max_length} is more than the model's block size: "
            f"inputs are cut at {loaded.block_size} tokens"
        )
    elif config.max_length is None and max_length < loaded.block_size:
        early.append(
            f"inputs are cut at {max_length} tokens, the length {ckpt} trained at (its "
            f"block size: {loaded.block_size}; --max-length {loaded.block_size} for the whole "
            "block)"
        )
    for warning in early:  # now, not only after the fine-tuning
        if say is not None:
            say(warning)

    L.seed_everything(config.seed, workers=True, verbose=False)
    train, dev, train_loader, dev_loaders = _loaders(data, config, tokenizer, max_length)

    hidden = strip_lm_head(loaded.model)
    loaded.model.train()  # loaded in eval mode; Lightning keeps the modes it finds
    module = _classifier_class()(loaded.model, hidden, task, config)

    pretrain_name = loaded.run_dir.name if loaded.run_dir else ckpt.stem
    runs_root = Path(
        runs_dir or (loaded.run_dir.parent.parent if loaded.run_dir else "runs")
    ).resolve()
    experiment = experiment or f"glue-{task.name}"
    uri = (
        tracking_uri
        or loaded.tracking_uri
        or default_tracking_uri(RunConfig(runs_dir=str(runs_root)))
    )
    if mlflow:  # before the run folder: a store that cannot be used leaves nothing behind
        check_tracking_uri(uri, fix="fix --tracking-uri, or pass --no-mlflow")
    sizes = {"train_examples": len(train), **{f"dev_examples.{k}": len(v) for k, v in dev.items()}}
    steps_per_epoch = max(1, math.ceil(len(train) / config.batch_size))
    logger: Any = False
    run_dir: Path | None = None
    trainer: Any = None
    # SIGTERM raises from the run folder's making on, outside the fit too (Lightning
    # raises its own inside): its default action would leave the MLflow run RUNNING.
    with sigterm_raises(lightning_sigterm):
        try:
            run_dir = _new_run_dir(runs_root / folder_name(experiment), name, pretrain_name)
            if mlflow:
                logger, params = _mlflow_logger(
                    experiment, run_dir, uri, ckpt, loaded, data, config, sizes, max_length,
                    command_line, precision,
                )  # fmt: skip
                logger.log_hyperparams(params)  # makes the run: `logger` can end it
            trainer = _trainer(
                config, accelerator, precision, progress, logger, run_dir, steps_per_epoch
            )
            trainer.fit(module, train_dataloaders=train_loader, val_dataloaders=dev_loaders)
            if module.validated_at != trainer.global_step:  # stopped by max_steps meanwhile
                trainer.validate(module, dataloaders=dev_loaders, verbose=False)
        except (SystemExit, KeyboardInterrupt) as stopped:
            # Lightning ends a fit that Ctrl-C reached with sys.exit(1), and one that
            # SIGTERM reached (SLURM's time limit, scancel) with its SIGTERMException,
            # status 0; the run FAILED or FINISHED with the scores of a part of the
            # training. Outside the fit they raise KeyboardInterrupt and (here) the
            # SIGTERMException. The run is KILLED, the folder it made and left empty goes,
            # and the signal's status follows, after one line saying what was kept.
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            sigterm = isinstance(stopped, SIGTERMException)
            ctrl_c = isinstance(stopped, KeyboardInterrupt) or isinstance(
                stopped.__context__, KeyboardInterrupt
            )
            if not (sigterm or ctrl_c):
                raise
            run_id = None
            if logger is not False:
                run_id = logger.run_id
                logger.experiment.set_terminated(run_id, "KILLED")
            status = 128 + (signal.SIGTERM if sigterm else signal.SIGINT)
            step = trainer.global_step if trainer is not None else 0
            # The scores of the evaluations done, where MLflow does not keep them (--no-
            # mlflow) and where --json asks for them, marked partial as cofr eval's are.
            kept_in: list[Path] = []
            if module.validated_at is not None:
                ran = str(trainer.precision) if trainer is not None else precision
                # steps and epochs: the scores' (a stop after step 158 of scores at 150
                # said 158 beside them); where training stopped is the partial's own.
                scored = module.validated_at
                partial = {
                    **_scores_record(task, ckpt, module, scored, config),
                    **_how_it_ran(
                        scored, steps_per_epoch, len(train), max_length, ran, data, loaded
                    ),
                    "run_id": run_id,
                    "run_dir": str(run_dir) if run_id is None else None,
                    "partial": {  # as cofr eval's: the signal's name (SIGINT for Ctrl-C)
                        "stopped_by": signal.Signals(status - 128).name,
                        "scored_at": scored,
                        "stopped_at": step,
                    },
                }
                if run_id is None and run_dir is not None:
                    with contextlib.suppress(OSError):  # a full disk: said "not kept"
                        write_text_atomic(run_dir / "results.json", results_json(partial))
                        kept_in.append(run_dir / "results.json")
                if json_out is not None:
                    out = partial_results_file(json_out)
                    # Not over a file of something else there; a failed write prints the
                    # results to stdout (not lost) before its error.
                    try:
                        write_results(check_output_file(out, kind="metrics"), partial)
                        kept_in.append(out)
                    except UserError as error:
                        print(f"warning: {error}", file=sys.stderr)
            folder = None
            if run_dir is not None and run_dir / "results.json" not in kept_in:
                try:
                    run_dir.rmdir()
                    folder = f"its empty folder {run_dir} was removed"
                    if run_id is not None:  # the run's tag named it
                        with contextlib.suppress(Exception):  # a store gone: said below
                            logger.experiment.delete_tag(run_id, RUN_DIR_TAG)
                except FileNotFoundError:
                    folder = None
                except OSError:  # something (not cofr) wrote there meanwhile: not ours to delete
                    folder = f"its folder {run_dir} is kept (not empty)"
            print(
                _stopped_line(
                    signal_name(status), step, module.validated_at, run_id, folder,
                    _store_note(uri, loaded.tracking_uri), kept_in,
                ),
                file=sys.stderr,
            )  # fmt: skip
            raise SystemExit(status) from None

        # The scores exist: a SIGTERM or Ctrl-C now waits until they are written (the run
        # is FINISHED already; a second one stops at once).
        with signals_held(signal.SIGINT, signal.SIGTERM) as arrived:
            warnings = data.warnings() + early
            run_id = logger.run_id if mlflow else None
            result: dict[str, Any] = {
                **_scores_record(task, ckpt, module, trainer.global_step, config),
                **_how_it_ran(
                    trainer.global_step,
                    steps_per_epoch,
                    len(train),
                    max_length,
                    str(trainer.precision),
                    data,
                    loaded,
                ),
                "run_id": run_id,
                "tracking_uri": uri if mlflow else None,
                "experiment": experiment if mlflow else None,
                "run_dir": str(run_dir),
                "warnings": warnings,
            }
            if mlflow and loaded.foreign:
                warnings.append(f"not logged onto the pretraining run: {loaded.foreign}")
            if mlflow and loaded.mlflow_run_id:
                stopped_early = trainer.global_step < config.epochs * steps_per_epoch
                warning = _log_onto_pretraining_run(
                    loaded,
                    _cut_by(config, data, train, dev, stopped_early),
                    task.name,
                    result["metrics"],
                    loaded.step,
                    run_id,
                    uri,
                )
                if warning:
                    warnings.append(warning)
            run_dir.mkdir(parents=True, exist_ok=True)
            text = results_json(result)  # strict JSON: a NaN score is null
            write_text_atomic(run_dir / "results.json", text)
            if json_out is not None:
                write_results(json_out, result)
            if mlflow:
                logger.experiment.log_text(run_id, text, "glue_results.json")
    if signal.SIGTERM in arrived or signal.SIGINT in arrived:
        what = "SIGTERM" if signal.SIGTERM in arrived else "Ctrl-C"
        print(
            f"cofr finetune glue: stopped by {what} once its results were written to {run_dir}",
            file=sys.stderr,
        )
        if signal.SIGTERM in arrived:
            raise SystemExit(128 + signal.SIGTERM)
        raise KeyboardInterrupt
    return result


def _stopped_line(
    how: str,
    step: int,
    scored_at: int | None,
    run_id: str | None,
    folder: str | None,
    store: str = "",
    files: Sequence[Path] = (),
) -> str:
    """What a fine-tuning stopped by a signal (``how``: ``SIGTERM``, ``Ctrl-C``) after
    ``step`` optimizer steps kept: the dev scores of its evaluations up to step
    ``scored_at`` (None: none ran) in its KILLED MLflow run ``run_id`` (None: not
    tracked) and in ``files`` (partial results), and what became of its run folder
    (``folder``)."""
    places = [f"MLflow run {run_id}{store} (KILLED)"] if run_id is not None else []
    places += [f"{file} (partial)" for file in files]
    if scored_at is None:
        kept = "nothing scored" + (f"; MLflow run {run_id}{store} ended KILLED" if run_id else "")
    elif places:
        kept = f"dev scores up to step {scored_at} are in {' and '.join(places)}"
    else:
        kept = f"dev scores up to step {scored_at} are not kept (--no-mlflow)"
    return f"cofr finetune glue: stopped by {how} at step {step}: {kept}" + (
        f"; {folder}" if folder else ""
    )


def _store_note(uri: str, pretraining_uri: str | None) -> str:
    """`` of <uri>`` where the fine-tuning run's store is not the pretraining run's (a
    --tracking-uri of its own): an MLflow UI opened on the usual store does not show it."""
    if pretraining_uri is not None and uri == pretraining_uri:
        return ""
    from cofrgenet.redact import hide_passwords

    return f" of {hide_passwords(uri)}"


def _mlflow_logger(
    experiment: str,
    run_dir: Path,
    uri: str,
    ckpt: Path,
    loaded: Any,
    data: TaskData,
    config: FinetuneConfig,
    sizes: dict[str, int],
    max_length: int,
    command_line: str | None,
    precision: str,
) -> tuple[Any, dict[str, Any]]:
    """The fine-tuning run's MLFlowLogger, named as its folder, with the tags of a
    pretraining run (code version, command), and its settings as params to log (which
    makes the run)."""
    from lightning.pytorch.loggers import MLFlowLogger

    from cofrgenet.redact import hide_passwords
    from cofrgenet.training.run_store import (
        RUN_DIR_TAG,
        artifact_location,
        code_tags,
        cut,
        flatten,
        make_store,
    )

    tags = {
        **code_tags(),  # which code fine-tuned, as on a pretraining run
        "cofr.task": data.task.name,
        "cofr.ckpt": str(ckpt.resolve()),
        "cofr.data": data.source,
        RUN_DIR_TAG: str(run_dir),
    }
    if loaded.mlflow_run_id:
        tags["cofr.pretrain_run_id"] = loaded.mlflow_run_id
    if command_line:
        tags["cofrgenet.command"] = cut(hide_passwords(command_line))
    make_store(uri)  # whole, or not at all: not half by a Ctrl-C
    logger = MLFlowLogger(
        experiment_name=experiment,
        run_name=run_dir.name,
        tracking_uri=uri,
        artifact_location=artifact_location(uri),
        tags=tags,
    )
    params = {
        "task": data.task.name,
        "ckpt": str(ckpt.resolve()),
        "pretrain_run_id": loaded.mlflow_run_id or "",
        "pretrain_step": loaded.step,
        "data": data.source,
        **sizes,
        **asdict(config),
        "max_length": max_length,
        "precision": precision,  # as given (Lightning's resolved one is in the results)
        **flatten(loaded.config.to_dict(), "model"),
    }
    return logger, flatten(params)


def _how_it_ran(
    step: int,
    steps_per_epoch: int,
    train_examples: int,
    max_length: int,
    precision: str,
    data: TaskData,
    loaded: Any,
) -> dict[str, Any]:
    """What a fine-tuning's results say of how it ran (a stopped one's partial results
    too): after ``step`` steps, at ``precision`` (as Lightning resolved it: bf16-mixed),
    on ``data``, from checkpoint ``loaded`` (a :class:`LoadedCheckpoint`)."""
    return {
        # A fraction when --max-steps ended one part-way (Lightning's current_epoch
        # counted the epoch it was in: 1 after 3 steps of 4).
        "epochs": round(step / steps_per_epoch, 3),
        "train_examples": train_examples,
        "max_length": max_length,
        "precision": precision,
        "source": data.source,
        "pretrain_run_id": loaded.mlflow_run_id,
        "pretrain_step": loaded.step,
        "pretrain_tracking_uri": loaded.tracking_uri,
    }


def _trainer(
    config: FinetuneConfig,
    accelerator: str,
    precision: str,
    progress: bool,
    logger: Any,
    run_dir: Path,
    steps_per_epoch: int,
) -> Any:
    """The fine-tuning's Trainer: one device, no checkpoints, the dev sets scored every
    ``eval_every`` steps (else each epoch's end)."""
    import lightning as L
    from lightning.pytorch.callbacks import RichProgressBar

    total = min(config.max_steps or math.inf, config.epochs * steps_per_epoch)
    return L.Trainer(
        accelerator=accelerator,
        devices=1,  # the dev metrics are computed on one process
        precision=precision,
        max_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        gradient_clip_val=config.grad_clip or None,
        val_check_interval=config.eval_every,
        check_val_every_n_epoch=None if config.eval_every else 1,
        num_sanity_val_steps=0,
        # At least ~10 points of train/loss and opt/lr: every 50 steps logged none in a
        # run of fewer (a few hundred examples, --max-steps 10).
        log_every_n_steps=max(1, min(50, steps_per_epoch, total // 10)),
        logger=logger,
        callbacks=[RichProgressBar(leave=True)] if progress else [],
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )


def _new_run_dir(experiment_dir: Path, name: str | None, pretrain_name: str) -> Path:
    """The fine-tuning run's folder, made now, empty: a named one that holds anything (an
    earlier fine-tuning, or the pretraining run itself) is refused; a dated default name
    gets a suffix (-2, -3, ...) when another run took it in the same second."""
    from cofrgenet.training.run_store import folder_name

    if name is not None:
        run_dir = experiment_dir / folder_name(name)
        if run_dir.is_dir() and any(run_dir.iterdir()) and not _stopped_without_mlflow(run_dir):
            raise UserError(
                f"{run_dir} holds another run already (its results and MLflow run would be "
                "replaced): pick another --name or --experiment"
            )
        _make_folder(run_dir)
        return run_dir
    _make_folder(experiment_dir)

    def make(run_dir: Path) -> Path:
        run_dir.mkdir()  # exclusive: two runs started at once get two folders
        return run_dir

    stem = folder_name(f"{pretrain_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    return create_numbered(experiment_dir, stem, "", make)


def _scores_record(
    task: GlueTask, ckpt: Path, module: Any, steps: int, config: FinetuneConfig
) -> dict[str, Any]:
    """What a results record says of a fine-tuning, complete or stopped: the task, the
    checkpoint, the dev metrics and every split's scores, the steps trained, the options."""
    return {
        "task": task.name,
        "ckpt": str(ckpt),
        "metrics": dev_metrics(task, module.results),
        "splits": module.results,
        "steps": steps,
        "config": asdict(config),
    }


def _stopped_without_mlflow(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds only the partial ``results.json`` of a --no-mlflow
    fine-tuning a signal stopped: the same command again (a SLURM requeue) runs in it."""
    if [p.name for p in run_dir.iterdir()] != ["results.json"]:
        return False
    kept = read_results(run_dir / "results.json")
    return kept is not None and "partial" in kept and kept.get("run_id") is None


def _cut_by(
    config: FinetuneConfig,
    data: TaskData,
    train: list[Example],
    dev: dict[str, list[Example]],
    stopped_early: bool,
) -> list[str]:
    """The options that left part of the task out (``--max-train-samples 100``), as
    given: a cap at or above a set's size cuts nothing, and a --max-steps reached after
    the last epoch's end neither."""
    cuts = (
        ("max_train_samples", config.max_train_samples, len(train) < len(data.train)),
        (
            "max_eval_samples",
            config.max_eval_samples,
            any(len(dev[name]) < len(examples) for name, examples in data.dev.items()),
        ),
        ("max_steps", config.max_steps, stopped_early),
    )
    return [
        f"--{name.replace('_', '-')} {value}"
        for name, value, cut in cuts
        if cut and value is not None
    ]


def _make_folder(folder: Path) -> None:
    """``mkdir -p folder``, or a :class:`UserError` naming what stands in the way (a
    --runs-dir that is a file, a read-only disk)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"cannot make {folder}, a folder of the run: {why_no_folder(folder, error)}; choose "
            "another --runs-dir"
        ) from None


def check_runs_dir(runs_dir: str | None) -> None:
    """A ``--runs-dir`` given must be a folder, or one that can be made: checked before
    the data and the model are loaded (its folder is made only once they are)."""
    if runs_dir is None:
        return
    path = Path(runs_dir).absolute()
    blocker = nearest_existing(path)
    if not blocker.is_dir():
        raise UserError(
            f"--runs-dir {runs_dir}: {str(blocker)!r} is a file, not a folder; choose another "
            "--runs-dir"
        )


def _log_onto_pretraining_run(
    loaded: Any,
    partial: list[str],
    task: str,
    metrics: dict[str, float],
    pretrain_step: int,
    run_id: str | None,
    uri: str | None = None,
) -> str | None:
    """Log the dev ``metrics`` onto the run that pretrained the checkpoint (at its step),
    tagged with the fine-tuning run ``run_id`` and its store ``uri`` (a --tracking-uri
    may be another than the pretraining run's), unless only part of the task was used (``partial``: the options that cut
    it, see :func:`_cut_by`); returns a warning, or None."""
    if partial:  # a subset's scores would stand beside full ones under the same names
        return (
            f"not logged onto the pretraining run: the scores are of part of the task "
            f"({' and '.join(partial)}); its own fine-tuning run has them"
        )
    if not loaded.tracking_uri:
        return None
    from cofrgenet.redact import hide_passwords
    from cofrgenet.training.pretrained import NotLogged, log_onto_run

    tags = {f"glue.{task}.run_id": str(run_id)}
    if uri is not None:  # each time: an earlier fine-tuning's store is not left beside it
        tags[f"glue.{task}.tracking_uri"] = hide_passwords(uri)
    try:
        log_onto_run(loaded.tracking_uri, loaded.mlflow_run_id, metrics, pretrain_step, tags)
    except NotLogged as error:  # the fine-tuning's own results stand without it
        return f"could not log onto the pretraining run: {error}"
    return None

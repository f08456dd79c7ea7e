"""GLUE data for ``cofr finetune glue``: the tasks, their readers and their tokenisation.

Two sources give the same examples with the same label ids (the hub's ``ClassLabel``
order, so results do not depend on where the data came from):

* the original GLUE distribution (gluebenchmark.com, the ``download_glue_data.py``
  layout) under ``--data-dir``: ``SST-2/train.tsv``, ``MNLI/dev_matched.tsv``, ...
  Each reader knows its file's real columns (:data:`TASKS`); CoLA's train/dev files have
  no header row.
* the Hugging Face hub's ``nyu-mll/glue`` configs through ``datasets`` (when reachable
  or cached).

Only train and dev are read: GLUE's test labels are not public.

Nothing here imports torch; ``datasets`` is imported only for the hub.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from cofrgenet.errors import UserError, first_line
from cofrgenet.hub import offline_reason, offline_unless_reachable

#: Where the original files come from (named in every missing-file error).
ORIGINAL_SOURCE = (
    "the original GLUE data comes from https://gluebenchmark.com/tasks, in the "
    "download_glue_data.py layout"
)
GLUE_SOURCE = (
    f"{ORIGINAL_SOURCE}; without --data-dir, and with no data/glue/<task folder>, "
    "nyu-mll/glue is loaded from the hub with `datasets`"
)
HUB_NAMES = ("nyu-mll/glue", "glue")
#: Where ``cofr finetune glue`` reads a task's original files without ``--data-dir``,
#: when the task's folder is there (as ``cofr eval`` reads ``data/eval``).
DEFAULT_DATA_DIR = "data/glue"


class GlueDataNotFound(UserError, FileNotFoundError):
    """A GLUE file (or the hub's copy) is not available; the message names where to get it."""


class GlueFormatError(UserError, ValueError):
    """A GLUE file does not have the columns of the original distribution."""


class Example(NamedTuple):
    """One labelled example: ``text_b`` is None for single-sentence tasks (SST-2, CoLA)."""

    text_a: str
    text_b: str | None
    label: int


@dataclass(frozen=True)
class DevSplit:
    """A dev set: ``name`` in results, its TSV ``file``, the hub's ``hub_split``, and the
    ``key`` of its metrics (``glue/<key>/<metric>``)."""

    name: str
    file: str
    hub_split: str
    key: str


@dataclass(frozen=True)
class GlueTask:
    """A GLUE classification task and the layout of its original TSV files.

    columns: the text columns (header names, or indices for header-less files), one or
    two. label_column: likewise. label_values: label text in the file -> label id (the
    hub's order, ``labels[id]`` is its name). hub_fields: the hub's text fields.
    metrics: computed on every dev set (accuracy always; F1 of class 1 for MRPC/QQP;
    Matthews correlation for CoLA).
    """

    name: str
    folder: str
    labels: tuple[str, ...]
    columns: tuple[str, ...] | tuple[int, ...]
    label_column: str | int
    label_values: dict[str, int]
    hub_fields: tuple[str, ...]
    metrics: tuple[str, ...] = ("accuracy",)
    header: bool = True
    dev: tuple[DevSplit, ...] = field(default=())

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    @property
    def pair(self) -> bool:
        """Whether examples are sentence pairs."""
        return len(self.columns) == 2

    def dev_splits(self) -> tuple[DevSplit, ...]:
        return self.dev or (DevSplit("dev", "dev.tsv", "validation", self.name),)


_BINARY = {"0": 0, "1": 1}
_NLI2 = {"entailment": 0, "not_entailment": 1}

#: GLUE's two tasks left out, and why (said when one is asked for).
NOT_OFFERED = {
    "stsb": "STS-B is a regression (a similarity score), not a classification",
    "wnli": "WNLI is not in the paper's table (nor in GPT's or BERT's: its dev set is "
    "adversarial to its training set)",
}

#: The seven GLUE classification tasks (STS-B, a regression, and WNLI are not offered).
TASKS: dict[str, GlueTask] = {
    "mnli": GlueTask(
        "mnli",
        "MNLI",
        ("entailment", "neutral", "contradiction"),
        # train has label1 + gold_label, dev label1..label5 + gold_label: read by name.
        ("sentence1", "sentence2"),
        "gold_label",
        {"entailment": 0, "neutral": 1, "contradiction": 2},
        ("premise", "hypothesis"),
        dev=(
            DevSplit("dev_matched", "dev_matched.tsv", "validation_matched", "mnli"),
            DevSplit("dev_mismatched", "dev_mismatched.tsv", "validation_mismatched", "mnli-mm"),
        ),
    ),
    "qqp": GlueTask(
        "qqp",
        "QQP",
        ("not_duplicate", "duplicate"),
        ("question1", "question2"),
        "is_duplicate",
        _BINARY,
        ("question1", "question2"),
        metrics=("accuracy", "f1"),
    ),
    "qnli": GlueTask(
        "qnli",
        "QNLI",
        ("entailment", "not_entailment"),
        ("question", "sentence"),
        "label",
        _NLI2,
        ("question", "sentence"),
    ),
    "sst2": GlueTask(
        "sst2", "SST-2", ("negative", "positive"), ("sentence",), "label", _BINARY, ("sentence",)
    ),
    "cola": GlueTask(
        "cola",
        "CoLA",
        ("unacceptable", "acceptable"),
        (3,),  # source, label, original annotation ("*" or empty), sentence
        1,
        _BINARY,
        ("sentence",),
        metrics=("accuracy", "mcc"),
        header=False,
    ),
    "mrpc": GlueTask(
        "mrpc",
        "MRPC",
        ("not_equivalent", "equivalent"),
        ("#1 String", "#2 String"),  # Quality, #1 ID, #2 ID, #1 String, #2 String
        "Quality",
        _BINARY,
        ("sentence1", "sentence2"),
        metrics=("accuracy", "f1"),
    ),
    "rte": GlueTask(
        "rte",
        "RTE",
        ("entailment", "not_entailment"),
        ("sentence1", "sentence2"),
        "label",
        _NLI2,
        ("sentence1", "sentence2"),
    ),
}


@dataclass
class TaskData:
    """A task's examples: ``train`` and one list per dev split (by :attr:`DevSplit.name`).

    skipped: the line numbers of the rows left out, per file (too few columns, an unknown
    label: QQP's train file has a few such rows). source: "tsv:<absolute folder>" or
    "hub:<name>".
    """

    task: GlueTask
    train: list[Example]
    dev: dict[str, list[Example]]
    source: str
    skipped: dict[str, list[int]] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        """One line per file that had rows left out."""
        labels = sorted(self.task.label_values)
        return [
            f"{path}: skipped {len(lines)} malformed row{'s' * (len(lines) != 1)} "
            f"({_line_list(lines)}: too few columns, or a label not in {labels})"
            for path, lines in self.skipped.items()
        ]


def _line_list(numbers: list[int], shown: int = 5) -> str:
    """``line 3`` / ``lines 3, 8 and 2 more``: where to look, without a list of thousands."""
    head = ", ".join(map(str, numbers[:shown]))
    more = f" and {len(numbers) - shown} more" if len(numbers) > shown else ""
    return f"line{'s' * (len(numbers) != 1)} {head}{more}"


# ------------------------------------------------------------------------- TSV files


def task_folder(task: GlueTask, data_dir: Path) -> Path:
    """``data_dir/<Folder>`` (the glue_data root), or ``data_dir`` itself when it is the
    task's folder (``--data-dir glue_data/SST-2``)."""
    if not (data_dir / task.folder).is_dir() and data_dir.name == task.folder:
        return data_dir
    return data_dir / task.folder


def _expect_file(task: GlueTask, path: Path, split: str) -> Path:
    if not path.is_file():
        raise GlueDataNotFound(f"no GLUE {task.folder} {split} file at {path}: {GLUE_SOURCE}")
    return path


def _lines(path: Path) -> list[tuple[int, str]]:
    """The file's non-blank lines with their 1-based numbers. Split on "\\n" only: GLUE sentences can hold a stray "\\r" or
    unbalanced quotes, so neither universal newlines nor csv quoting may touch them
    (MRPC's files start with a byte-order mark)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise GlueFormatError(
            f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} on line {line}), as the "
            "original GLUE files are: save it as UTF-8"
        ) from None
    lines = enumerate(text.split("\n"), start=1)
    return [(number, line.rstrip("\r")) for number, line in lines if line.strip()]


def read_tsv(task: GlueTask, path: Path) -> tuple[list[Example], list[int]]:
    """(examples, line numbers of the rows skipped) of one original GLUE train/dev file
    of ``task``.

    Columns are found by header name (by index for CoLA's header-less files), so MNLI's
    train (label1, gold_label) and dev (label1..label5, gold_label) layouts both read.
    """
    lines = _lines(path)
    if task.header:
        if not lines:
            raise GlueFormatError(f"{path} is empty: expected a header row")
        header = lines[0][1].split("\t")
        wanted = [*task.columns, task.label_column]
        missing = [c for c in wanted if c not in header]
        if missing:
            raise GlueFormatError(
                f"{path} has no column(s) {missing} (its header: {header}); the original "
                f"GLUE {task.folder} files have {wanted}: {GLUE_SOURCE}"
            )
        text_idx = [header.index(str(c)) for c in task.columns]
        label_idx = header.index(str(task.label_column))
        rows = lines[1:]
    else:
        text_idx = [int(c) for c in task.columns]
        label_idx = int(task.label_column)
        rows = lines
    if not rows:
        raise GlueFormatError(f"{path} has no examples{' under its header' * task.header}")
    need = max([*text_idx, label_idx]) + 1
    examples: list[Example] = []
    skipped: list[int] = []
    for number, row in rows:
        cells = row.split("\t")
        label = task.label_values.get(cells[label_idx].strip()) if len(cells) >= need else None
        if label is None:
            skipped.append(number)  # a short row or an unlabelled one: the hub drops them too
            continue
        texts = [cells[i] for i in text_idx]
        examples.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    if not examples:
        raise GlueFormatError(
            f"{path}: none of its {len(rows)} rows has the columns and labels of GLUE "
            f"{task.folder} (labels {sorted(task.label_values)}): {GLUE_SOURCE}"
        )
    if len(skipped) > len(examples):  # the originals skip a few in 10**5 (QQP's short rows)
        raise GlueFormatError(
            f"{path}: {len(skipped)} of its {len(rows)} rows lack the columns or labels of GLUE "
            f"{task.folder} (labels {sorted(task.label_values)}), so it is not that task's "
            f"file (another task's, or damaged): {GLUE_SOURCE}"
        )
    return examples, skipped


def read_task_tsv(task: GlueTask, data_dir: str | Path) -> TaskData:
    """The train and dev files of ``task`` from the original GLUE layout under ``data_dir``."""
    folder = task_folder(task, Path(data_dir))
    files = {"train": _expect_file(task, folder / "train.tsv", "train")}
    for split in task.dev_splits():
        files[split.name] = _expect_file(task, folder / split.file, split.name)
    read = {name: read_tsv(task, path) for name, path in files.items()}
    skipped = {str(files[name]): lines for name, (_, lines) in read.items() if lines}
    return TaskData(
        task=task,
        train=read["train"][0],
        dev={s.name: read[s.name][0] for s in task.dev_splits()},
        source=f"tsv:{folder.resolve()}",  # as cofr.ckpt: where it is, from any folder
        skipped=skipped,
    )


# ----------------------------------------------------------------------------- hub


def _from_rows(task: GlueTask, rows: Any) -> list[Example]:
    """Examples from a ``datasets.Dataset`` (or any list of dicts) with the hub's fields."""
    columns = [list(rows[f]) for f in task.hub_fields] if hasattr(rows, "column_names") else None
    if columns is not None:
        labels = list(rows["label"])
        texts = list(zip(*columns, strict=True))
    else:
        labels = [r["label"] for r in rows]
        texts = [tuple(r[f] for f in task.hub_fields) for r in rows]
    return [
        Example(t[0], t[1] if len(t) > 1 else None, int(y))
        for t, y in zip(texts, labels, strict=True)
        if 0 <= int(y) < task.num_labels  # the hub's test rows carry label -1
    ]


def load_task_hub(task: GlueTask, cache_dir: str | None = None) -> TaskData:
    """``task`` from the hub's ``nyu-mll/glue`` (or the legacy ``glue``) via ``datasets``;
    a copy in the ``datasets`` cache serves when the hub is unreachable."""
    offline_unless_reachable()  # before datasets is imported: no retries of a dead hub
    try:
        import datasets
    except ImportError:
        raise GlueDataNotFound(
            "loading GLUE from the hub needs `datasets` (pip install -e '.[hf]' in the cofrgenet checkout); or pass "
            f"--data-dir with the original GLUE files: {GLUE_SOURCE}"
        ) from None
    errors = []
    for name in HUB_NAMES:
        try:
            loaded = datasets.load_dataset(name, task.name, cache_dir=cache_dir)
        except Exception as error:  # offline, not cached, renamed: try the next name
            errors.append(f"{type(error).__name__}: {first_line(error)[:200]}")
            continue
        return TaskData(
            task=task,
            train=_from_rows(task, loaded["train"]),
            dev={s.name: _from_rows(task, loaded[s.hub_split]) for s in task.dev_splits()},
            source=f"hub:{name}",
        )
    # The current name's error only: the legacy name's ("BuilderConfig 'sst2' not found.
    # Available: ['default']" offline) says nothing about why the data is not here.
    offline = f"; {why}" if (why := offline_reason()) else ""
    files = " and ".join(f"{task.folder}/{s.file}" for s in task.dev_splits())
    raise GlueDataNotFound(
        f"could not load GLUE {task.name} from the hub's {HUB_NAMES[0]} ({errors[0]}{offline}): "
        f"pass --data-dir DIR with {task.folder}/train.tsv and {files}, or put them in "
        f"{DEFAULT_DATA_DIR}; {ORIGINAL_SOURCE}"
    )


def default_data_dir(name: str) -> str | None:
    """:data:`DEFAULT_DATA_DIR` where it holds task ``name``'s folder (``data/glue/SST-2``),
    else None (the hub)."""
    task = TASKS[name]
    return DEFAULT_DATA_DIR if (Path(DEFAULT_DATA_DIR) / task.folder).is_dir() else None


def load_task(name: str, data_dir: str | Path | None = None) -> TaskData:
    """Task ``name``'s examples: from ``data_dir`` (original TSVs) or else from the hub."""
    if name not in TASKS:
        raise UserError(f"unknown GLUE task {name!r}; choose from {', '.join(TASKS)}")
    task = TASKS[name]
    if data_dir is not None:
        return read_task_tsv(task, data_dir)
    return load_task_hub(task)


# ---------------------------------------------------------------------- tokenising


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut the longer of ``a``, ``b`` first until ``len(a) + len(b) <= budget`` (BERT's
    "longest first"; on a tie ``b`` loses the token, so ``a`` keeps the odd one)."""
    if len(a) + len(b) <= budget:
        return a, b
    short = min(len(a), len(b))
    if 2 * short <= budget:  # the shorter fits whole; the longer takes the rest
        return (a, b[: budget - len(a)]) if len(a) == short else (a[: budget - len(b)], b)
    return a[: (budget + 1) // 2], b[: budget // 2]


def encode_examples(
    examples: Sequence[Example], tokenizer: Any, max_length: int
) -> tuple[list[list[int]], list[int]]:
    """Token ids and labels of ``examples`` for a decoder classifier.

    A single sentence becomes ``a <eos>``; a pair ``a <eos> b <eos>``. The classifier
    reads the hidden state at the last token, the final ``<eos>``, which is kept through
    truncation: the texts are cut (longest first) to fit ``max_length`` with it.
    """
    if max_length < 4:
        raise UserError(f"max_length must be at least 4, got {max_length}")
    eos = tokenizer.eos_id
    encode = getattr(tokenizer, "encode_batch", None) or (
        lambda ts: [tokenizer.encode(t) for t in ts]
    )
    ids_a = encode([e.text_a for e in examples])
    pairs = [e.text_b for e in examples]
    ids_b = encode([t for t in pairs if t is not None])
    out: list[list[int]] = []
    next_b = iter(ids_b)
    for a, text_b in zip(ids_a, pairs, strict=True):
        if text_b is None:
            out.append([*a[: max_length - 1], eos])
        else:
            a, b = truncate_pair(list(a), list(next(next_b)), max_length - 2)
            out.append([*a, eos, *b, eos])
    return out, [e.label for e in examples]

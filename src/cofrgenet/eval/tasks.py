"""The paper's evaluation sets: where their text comes from and how it is prepared.

Each task reads a local copy in the original distribution's layout under ``--data-dir``
first; without one, the Hugging Face dataset (from the local ``datasets`` cache, or the
hub when reachable; ``HF_HUB_OFFLINE=1`` skips the hub). The local layouts:

===============  ============================================  =========================
task             files under --data-dir                        from
===============  ============================================  =========================
wikitext-2-v1    ``wikitext-2/wiki.{valid,test}.tokens``       wikitext-2-v1.zip
wikitext-103-v1  ``wikitext-103/wiki.{valid,test}.tokens``     wikitext-103-v1.zip
wikitext-2       ``wikitext-2-raw/wiki.{valid,test}.raw``      wikitext-2-raw-v1.zip
wikitext-103     ``wikitext-103-raw/wiki.{valid,test}.raw``    wikitext-103-raw-v1.zip
ptb              ``ptb.{valid,test}.txt``                      Mikolov's simple-examples
lambada          ``lambada_test.jsonl`` (``{"text": ...}``)   OpenAI's GPT-2 release
===============  ============================================  =========================

The raw WikiText-2 and WikiText-103 test sets are the same text; the ``-v1`` releases
differ, as each replaces the words rare in its own training set by ``<unk>``. GPT-2's
paper reports different numbers for the two (18.34, 17.48), which only the ``-v1``
files give: they are the paper's columns (``cofr compare``), the raw ones are what
lm-evaluation-harness's ``wikitext`` task scores.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cofrgenet.errors import UserError, first_line
from cofrgenet.eval.detokenize import DETOKENIZERS
from cofrgenet.hub import offline_reason, offline_unless_reachable

Split = Literal["valid", "test"]
#: Where ``cofr eval`` looks for local copies unless ``--data-dir`` says otherwise.
DEFAULT_DATA_DIR = "data/eval"


class EvalDataNotFound(UserError, FileNotFoundError):
    """An evaluation set is neither on disk nor in reach of ``datasets``."""


class EvalDataError(UserError, ValueError):
    """An evaluation set's file is there but not in its expected layout (or empty)."""


@dataclass(frozen=True)
class Task:
    """An evaluation set.

    kind: ``perplexity`` (one long text, sliding windows) or ``lambada`` (last words).
    files: local file per split, relative to the data folder.
    hub: (dataset path, config name, text field) in the Hugging Face hub.
    hub_splits: our split name -> the hub's.
    join: how the hub's rows are joined into one text.
    blank_row: what an empty hub row stands for (WikiText's builder yields "" for the
        file's blank lines, which are " \n").
    line_format: the file's line for a hub row's stripped text, where the hub's rows are
        not the file's lines (PTB's files read " w1 ... wn \n"): the byte count and the
        tokens then match the file's. None: rows are joined with ``join``.
    source: where the original files come from (for the error message).
    """

    name: str
    kind: Literal["perplexity", "lambada"]
    files: dict[str, str]
    hub: tuple[str, str | None, str]
    hub_splits: dict[str, str]
    join: str
    detokenizer: str
    source: str
    blank_row: str = ""
    line_format: str | None = None

    @property
    def detokenize(self) -> Callable[[str], str]:
        return DETOKENIZERS[self.detokenizer]

    def local_path(self, data_dir: str | Path, split: str) -> Path:
        return Path(data_dir) / self.files[split]

    @property
    def hub_name(self) -> str:
        """``path/config`` of the hub's dataset, as reports record its source."""
        return "/".join(part for part in self.hub[:2] if part)

    @property
    def hub_described(self) -> str:
        """The hub's dataset as messages name it: its id, then its config (``path/config``
        read as one id named no dataset: ``ptb-text-only/ptb_text_only/penn_treebank``)."""
        path, config = self.hub[:2]
        return f"{path} (config {config})" if config else path


def _wikitext(size: str, raw: bool) -> Task:
    """WikiText-``size``: the raw release, or the ``<unk>`` one (``-v1``)."""
    release = f"wikitext-{size}-raw-v1" if raw else f"wikitext-{size}-v1"
    files = (
        {s: f"wikitext-{size}-raw/wiki.{s}.raw" for s in ("valid", "test")}
        if raw
        else {s: f"wikitext-{size}/wiki.{s}.tokens" for s in ("valid", "test")}
    )
    return Task(
        name=f"wikitext-{size}" if raw else release,
        kind="perplexity",
        files=files,
        hub=("Salesforce/wikitext", release, "text"),
        hub_splits={"valid": "validation", "test": "test"},
        join="",  # the hub's rows are the file's lines, newline included
        detokenizer="wikitext",
        source=f"{release}.zip (Salesforce's WikiText release, unzipped)",
        blank_row=" \n",
    )


TASKS: dict[str, Task] = {
    "wikitext-2-v1": _wikitext("2", raw=False),
    "wikitext-103-v1": _wikitext("103", raw=False),
    "wikitext-2": _wikitext("2", raw=True),
    "wikitext-103": _wikitext("103", raw=True),
    "ptb": Task(
        name="ptb",
        kind="perplexity",
        files={s: f"ptb.{s}.txt" for s in ("valid", "test")},
        hub=("ptb-text-only/ptb_text_only", "penn_treebank", "sentence"),
        hub_splits={"valid": "validation", "test": "test"},
        join="",
        detokenizer="ptb",
        line_format=" {} \n",
        source="simple-examples.tgz from Mikolov's RNNLM page (its data/ptb.*.txt)",
    ),
    "lambada": Task(
        name="lambada",
        kind="lambada",
        files={"test": "lambada_test.jsonl"},
        hub=("EleutherAI/lambada_openai", "default", "text"),
        hub_splits={"test": "test"},
        join="\n",
        detokenizer="none",  # OpenAI's version is already detokenised
        source="OpenAI's lambada_test.jsonl (gpt-2 release, data/lambada_test.jsonl)",
    ),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        from cofrgenet.errors import did_you_mean

        raise UserError(
            f"unknown task {name!r}{did_you_mean(name, list(TASKS))}; tasks: {', '.join(TASKS)}"
        )
    return TASKS[name]


def _from_hub(task: Task, split: str) -> list[str]:
    """The rows' text from ``datasets`` (cache or hub); raises on any failure."""
    offline_unless_reachable()  # before datasets is imported: no retries of a dead hub
    import datasets

    path, config, field = task.hub
    rows = datasets.load_dataset(path, config, split=task.hub_splits[split])
    return [row[field] for row in rows]


def read_rows(task: Task, split: str, data_dir: str | Path = DEFAULT_DATA_DIR) -> list[str]:
    """The raw (not yet detokenised) text of ``task``'s ``split``: one string for the
    perplexity tasks, one per example for LAMBADA."""
    if split not in task.files:
        raise UserError(f"{task.name} has no {split!r} split; it has: {', '.join(task.files)}")
    path = task.local_path(data_dir, split)
    if path.is_dir():  # "no file X ... so that X is there" would say nothing
        raise EvalDataError(f"{path} is a folder: {task.name} reads a file there ({_layout(task)})")
    if path.is_file():
        # Checked here, before the model is loaded: a bad file fails at once, named.
        text = _read_text(task, path)
        if task.kind == "lambada":
            return _lambada_passages(task, path, text)
        if not text.strip():
            raise EvalDataError(f"{path} is empty: expected {_layout(task)}")
        return [text]
    try:
        rows = _from_hub(task, split)
    except Exception as error:  # no datasets, no cache, no network: all mean "not here"
        offline = f" ({why})" if (why := offline_reason()) else ""
        # Another folder is a way out only where none was given.
        other = ", or pass --data-dir DIR" if Path(data_dir) == Path(DEFAULT_DATA_DIR) else ""
        raise EvalDataNotFound(
            f"{task.name}: no file {path}, and the Hugging Face dataset {task.hub_described} could not be "
            f"loaded{offline} ({_why(error)}); get {task.source} so that {path} is there{other}"
        ) from None
    if not any(isinstance(row, str) and row.strip() for row in rows):  # nothing to score
        raise EvalDataError(f"{task.name}: the Hugging Face dataset's {split} split has no text")
    if task.kind == "lambada":
        return rows
    if task.line_format is not None:
        return ["".join(task.line_format.format(row.strip()) for row in rows)]
    return [task.join.join(row or task.blank_row for row in rows)]


def _why(error: Exception, limit: int = 160) -> str:
    """The exception's type and the first line of its message, cut to ``limit`` chars:
    "not reachable" and "the hub's loading script is no longer supported" need
    different fixes."""
    first = first_line(error)
    if len(first) > limit:
        first = first[: limit - 3] + "..."
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _layout(task: Task) -> str:
    """What a local file of ``task`` holds, for the error messages."""
    if task.kind == "lambada":
        return 'one JSON object {"text": "<passage>"} per line'
    return f"the set's UTF-8 text, from {task.source}"


def _read_text(task: Task, path: Path) -> str:
    """The file's text; an unreadable or non-UTF-8 file is an :class:`EvalDataError`."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise EvalDataError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise EvalDataError(
            f"{path}, line {line}: not UTF-8 text ({error.reason}); expected {_layout(task)}"
        ) from None


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _lambada_passages(task: Task, path: Path, text: str) -> list[str]:
    """The ``text`` of each line of a LAMBADA ``.jsonl`` file (blank lines skipped)."""
    passages: list[str] = []
    # "\n" only: str.splitlines would also split at U+2028 and the like, which JSON
    # strings may hold raw, and the line numbers would then be wrong.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise EvalDataError(
                f"{where}: not JSON ({error.msg}); expected {_layout(task)}"
            ) from None
        if not isinstance(row, dict):
            kind = _JSON_KINDS.get(type(row), "null")
            raise EvalDataError(f"{where}: a JSON {kind}, not an object; expected {_layout(task)}")
        if "text" not in row:
            fields = ", ".join(map(repr, row)) or "none"
            raise EvalDataError(
                f'{where}: no "text" field (it has: {fields}); expected {_layout(task)}'
            )
        passage = row["text"]
        if not isinstance(passage, str):
            kind = _JSON_KINDS.get(type(passage), "null" if passage is None else "object")
            raise EvalDataError(
                f'{where}: "text" is a JSON {kind}, not a string; expected {_layout(task)}'
            )
        if not passage.strip():
            raise EvalDataError(f'{where}: "text" is empty; expected {_layout(task)}')
        if " " not in passage.strip():
            raise EvalDataError(
                f'{where}: "text" is one word, with no context to predict it from; '
                f"expected {_layout(task)}"
            )
        passages.append(passage)
    if not passages:
        raise EvalDataError(f"{path} is empty: expected {_layout(task)}")
    return passages


def split_last_word(text: str) -> tuple[str, str]:
    """LAMBADA's (context, target): the target is the last word, with its leading space
    (the word is predicted after the context, as the model saw words in training)."""
    context, _, word = text.rstrip().rpartition(" ")
    return context, f" {word}"

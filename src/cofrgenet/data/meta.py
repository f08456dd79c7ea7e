"""The data folder's ``meta.json``: what a prepared folder holds, and the checks on it.

A prepared folder (``cofr data prepare ... --out DIR``) looks like::

    DIR/
      train/            litdata chunks + index.json (TokensLoader)
      val/              litdata chunks + index.json
      tokenizer/        tokenizer.json (bpe, gpt2); absent for byte
      meta.json         written last, atomically: its presence marks a complete folder

This module needs only the standard library, so reading metadata and failing fast on a
bad folder costs no litdata/torch import.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from cofrgenet.atomic import is_temporary, write_text_atomic
from cofrgenet.errors import UserError
from cofrgenet.folder_lock import LOCK_COMMAND_CHARS, FolderLock, held_now

META_FILE = "meta.json"
SPLITS = ("train", "val")
TOKENIZER_DIR = "tokenizer"
#: The tokenizer a bpe or gpt2 folder holds, under TOKENIZER_DIR.
TOKENIZER_FILE = "tokenizer.json"
#: Files a prepare writes in a split folder: litdata's chunks and (partial) indexes.
_SPLIT_FILE = re.compile(r"(chunk-[\w.-]*\.bin|(\w+[.-])?index\.json)(\.tmp[\w.]*)?")
#: Where a prepare writes the new folder's entries before it moves them in: an existing
#: folder it replaces (--overwrite) stays whole until the new one is.
STAGING_DIR = ".next"
#: The lock a prepare holds on its --out (a killed one's stays, harmless: flock is freed).
PREPARE_LOCK = ".prepare.lock"
#: The lock training runs share on their data folder (cofrgenet.folder_lock.ReadersLock).
READERS_LOCK = ".readers.lock"
#: The lock files of a data folder: prepare's own, they stay through a prepare.
LOCK_FILES = (PREPARE_LOCK, READERS_LOCK)
#: The entries of a data folder a prepare writes besides meta.json (.cache: litdata's).
PREPARED_ENTRIES = (*SPLITS, TOKENIZER_DIR, ".cache", STAGING_DIR)
#: meta.json's ``split_args.method`` of a carved validation split: the first documents of
#: a seeded permutation. A folder made so is "prepared with other settings" to a prepare
#: now when it says :data:`FORMER_SPLIT_METHOD`.
SPLIT_METHOD = "seeded permutation"
#: The method before 2026-12-06: rng.choice, whose picks for the default seed were a
#: corpus's last documents.
FORMER_SPLIT_METHOD = "random documents"


def written_by_prepare(path: Path) -> bool:
    """Whether ``path``, an entry of a data folder, is one `cofr data prepare` writes:
    meta.json, litdata's cache, or a split or tokenizer folder holding only its files. A
    folder the user made (their corpus in ``train/``), or a link to one, is not."""
    name = path.name
    if name in (META_FILE, ".cache", STAGING_DIR, *LOCK_FILES) or is_temporary(name):
        return True
    if path.is_symlink() or not path.is_dir() or name not in PREPARED_ENTRIES:
        return False
    if name == TOKENIZER_DIR:
        return all(f.name == TOKENIZER_FILE or is_temporary(f.name) for f in path.iterdir())
    return all(
        f.is_file() and (_SPLIT_FILE.fullmatch(f.name) or is_temporary(f.name))
        for f in path.iterdir()
    )


def foreign_entries(data_dir: Path) -> list[str]:
    """The sorted names of ``data_dir``'s entries that `cofr data prepare` did not write:
    an --overwrite never deletes them, and a folder holding them is no half-written one."""
    return sorted(p.name for p in data_dir.iterdir() if not written_by_prepare(p))


#: Bumped when the folder layout or meta.json fields change incompatibly.
FORMAT_VERSION = 1


class DataFolderError(UserError, FileNotFoundError):
    """A data folder that is missing, half-written or unreadable (the message says how to fix it)."""


class VocabMismatchError(UserError, ValueError):
    """The model's vocabulary cannot hold the data's token ids."""


#: Arguments each source needs besides --source (placeholders shown in error messages).
_SOURCE_HINTS = {
    "pydoc": "",
    "text": "--glob 'PATH/*.txt'",
    "jsonl": "--path 'PATH/*.jsonl' --text-field text",
    "parquet": "--path 'PATH/*.parquet' --text-field text",
    "hf": "--dataset NAME",
}
_TOKENIZERS = ("byte", "bpe", "gpt2")
#: The folders the bundled recipes train on (conf/, sweeps/), and the options that make
#: them exactly: a folder name alone does not say a BPE vocabulary or a split
#: (tests/test_recipes.py holds these to the recipes' headers).
BUNDLED_FOLDERS = {
    "pydoc-byte": "--source pydoc --tokenizer byte",
    "pydoc-bpe": "--source pydoc --tokenizer bpe --vocab-size 2048",
    "pydoc-bpe-quality": "--source pydoc --tokenizer bpe --vocab-size 2048 --val-fraction 0.15",
    "openwebtext-gpt2": "--source hf --dataset openwebtext --tokenizer gpt2 --val-fraction 0.01",
}


#: The files of a corpus by suffix, and the ``cofr data prepare`` source that reads them.
_CORPUS_SOURCES = {".txt": "text", ".md": "text", ".jsonl": "jsonl", ".parquet": "parquet"}


def _corpus_options(folder: Path, names: list[str]) -> str | None:
    """The source options that read the corpus files ``names`` of ``folder`` hold (a
    folder of text files given as a data folder), or None when none is one."""
    suffixes = {Path(name).suffix.lower() for name in names}
    for suffix, kind in _CORPUS_SOURCES.items():
        if suffix in suffixes:
            flag = _SOURCE_HINTS[kind].split()[0]  # --glob or --path, as for a new folder
            pattern = f"**/*{suffix}" if kind == "text" else f"*{suffix}"
            return f"--source {kind} {flag} {shlex.quote(str(folder / pattern))}"
    return None


def prepare_command(
    out: str | os.PathLike[str], extra: str = "", unknown: str = "--source pydoc"
) -> str:
    """The ``cofr data prepare`` command line that makes the folder ``out``.

    A bundled recipe's folder (:data:`BUNDLED_FOLDERS`) gets its exact options. Default
    folder names are ``<source>-<tokenizer>`` (``<dataset>-<tokenizer>`` for hf), also
    with a suffix (``pydoc-bpe-mine``); when ``out`` follows them the command uses that
    source and tokenizer, else ``unknown`` (the bundled default: ``--source pydoc``,
    byte tokenizer).
    """
    from cofrgenet.data.sources import HF_PRESETS

    bundled = BUNDLED_FOLDERS.get(Path(out).name)
    if bundled is not None:
        words = ["cofr data prepare", bundled, f"--out {shlex.quote(str(out))}", extra]
        return " ".join(w for w in words if w)
    words = ["cofr data prepare", unknown]
    parts = Path(out).name.split("-")
    # The tokenizer is the first part that names one: hf datasets may hold dashes.
    at = next((i for i, part in enumerate(parts) if i and part in _TOKENIZERS), None)
    if at is not None:
        name, tokenizer = "-".join(parts[:at]), parts[at]
        if name in _SOURCE_HINTS:
            words = ["cofr data prepare", f"--source {name}", _SOURCE_HINTS[name]]
        elif name in HF_PRESETS:
            words = ["cofr data prepare", f"--source hf --dataset {name}"]
        words.append(f"--tokenizer {tokenizer}")  # the name's, whatever the source
    words += [f"--out {shlex.quote(str(out))}", extra]
    return " ".join(w for w in words if w)


@dataclass
class SplitInfo:
    """Counts of one split: documents assigned to it and tokens written (EOS included)."""

    documents: int
    tokens: int
    chunks: int = 0


@dataclass
class DataMeta:
    """Contents of ``meta.json``."""

    source: str
    source_args: dict[str, Any]
    tokenizer: str
    vocab_size: int
    eos_id: int
    dtype: str
    splits: dict[str, SplitInfo]
    tokenizer_args: dict[str, Any] = field(default_factory=dict)
    split_args: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    cofrgenet_version: str = "unknown"
    command_line: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def train_tokens(self) -> int:
        return self.splits["train"].tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataMeta:
        """The metadata ``data`` holds; TypeError naming a field of the wrong type (a
        hand-edited ``"vocab_size": "257"`` failed later, deep in training)."""
        if not isinstance(data, dict) or not isinstance(data.get("splits"), dict):
            raise TypeError("expected an object with a splits object")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["splits"] = {k: SplitInfo(**v) for k, v in data["splits"].items()}
        meta = cls(**kwargs)
        kinds = {
            "int": (int, "a whole number"),
            "str": (str, "a string"),
            "dict": (dict, "an object"),
        }
        for f in fields(cls):  # annotations are strings here: "int", "dict[str, Any]"
            kind, said = kinds.get(str(f.type).split("[")[0], (object, ""))
            value = getattr(meta, f.name)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"{f.name} must be {said}, got {value!r}")
        for name, split in meta.splits.items():
            for key, value in asdict(split).items():
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise TypeError(f"splits.{name}.{key} must be a whole number, got {value!r}")
        return meta

    def write(self, data_dir: str | os.PathLike[str]) -> Path:
        """Write ``meta.json`` atomically (temporary file, then rename)."""
        path = Path(data_dir) / META_FILE
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path


#: What a model trained on a data folder depends on: which tokenizer wrote its ids. The digest tells apart two BPE
#: tokenizers of one size (trained again on other text, or with another seed).
TOKENIZER_KEYS = ("tokenizer", "vocab_size", "tokenizer_sha256")


def tokenizer_digest(data_dir: str | os.PathLike[str]) -> str | None:
    """The first 16 hex digits of the sha256 of the folder's tokenizer file; None for a
    folder without one (byte)."""
    path = Path(data_dir) / TOKENIZER_DIR / TOKENIZER_FILE
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def prepared_corpus(folder: Path) -> bool:
    """Whether ``folder`` is what ``cofr data prepare`` writes: meta.json, with its splits
    or tokenizer beside it."""
    return (folder / META_FILE).is_file() and any(
        (folder / name).is_dir() for name in (*SPLITS, TOKENIZER_DIR)
    )


def tokenizer_only(folder: Path) -> bool:
    """Whether ``folder`` holds a tokenizer and no tokens: ``meta.json`` and neither split
    (what :func:`copy_tokenizer` writes into a run folder). A prepare writes its
    ``meta.json`` last, after both splits, so this is no half-written prepare."""
    return (folder / META_FILE).is_file() and not any((folder / s).exists() for s in SPLITS)


def copy_tokenizer(data_dir: str | os.PathLike[str], dest: str | os.PathLike[str]) -> bool:
    """Copy a prepared folder's tokenizer (``meta.json`` and ``tokenizer/``) to the new
    folder ``dest``, which then serves wherever a data folder's tokenizer is read
    (``--tokenizer``, ``--tokenizer-from``): a run keeps the tokenizer it trained with
    after its data folder is prepared again or moved. The bytes are copied, so the
    digest checkpoints record holds. Written whole or not at all (a temporary folder
    renamed); False, writing nothing, when ``dest`` exists or ``data_dir`` has no
    ``meta.json``."""
    source, dest = Path(data_dir), Path(dest)
    if dest.exists() or not (source / META_FILE).is_file():
        return False
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        (tmp / TOKENIZER_DIR).mkdir(parents=True, exist_ok=True)
        (tmp / META_FILE).write_bytes((source / META_FILE).read_bytes())
        tokenizer = source / TOKENIZER_DIR / TOKENIZER_FILE
        if tokenizer.is_file():
            (tmp / TOKENIZER_DIR / TOKENIZER_FILE).write_bytes(tokenizer.read_bytes())
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def tokenizer_changes(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (saved, now)} of the :data:`TOKENIZER_KEYS` whose values differ; a key one
    side lacks (an older checkpoint) is not compared."""
    return {
        key: (saved[key], now[key])
        for key in TOKENIZER_KEYS
        if key in saved and key in now and saved[key] != now[key]
    }


def check_vocab(meta: DataMeta, model_vocab_size: int) -> None:
    """Fail fast when token ids of the data (``0 .. meta.vocab_size - 1``) overflow the model.

    A model vocabulary larger than the data's (e.g. padded to a multiple of 64) is fine.
    """
    if model_vocab_size < meta.vocab_size:
        raise VocabMismatchError(
            f"tokenizer/vocab mismatch: the data was tokenized with {meta.tokenizer!r} "
            f"(vocab_size {meta.vocab_size}, ids up to {meta.vocab_size - 1}) but the model has "
            f"vocab_size {model_vocab_size}. Set the model's vocab_size to at least "
            f"{meta.vocab_size}, or prepare the data with a tokenizer that matches the model."
        )


#: What :func:`remake_command` writes for a folder whose name suggests no options.
UNKNOWN_OPTIONS = "<the options that made it>"


def guessed_remake(data_dir: Path) -> str:
    """The command that remakes a half-written folder, on the next line: the interrupted
    prepare's own (its lock file records it), else ``e.g. (the options its name
    suggests):`` and a guess, or that guess alone where its name suggests nothing."""
    interrupted = _interrupted_prepare(data_dir)
    if interrupted is not None:
        return f" (the interrupted prepare's, from {PREPARE_LOCK}):\n  {interrupted}"
    command = remake_command(data_dir)
    guessed = "" if UNKNOWN_OPTIONS in command else ", e.g. (the options its name suggests)"
    return f"{guessed}:\n  {command}"


def _interrupted_prepare(data_dir: Path) -> str | None:
    """The ``cofr data prepare`` command that its lock file says was writing
    ``data_dir``, made to remake it there; None where none is recorded."""
    try:
        holder = json.loads((data_dir / PREPARE_LOCK).read_text())
        command = holder["command"]
        words = shlex.split(command)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if words[:3] != ["cofr", "data", "prepare"] or len(command) >= LOCK_COMMAND_CHARS:
        return None  # python -m ...prepare's, another tool's, or cut short
    return _remade_here(words, data_dir)


def remake_command(data_dir: Path, meta: DataMeta | None = None) -> str:
    """The command that made ``data_dir`` (its ``meta.json`` records it), with
    ``--overwrite`` and ``--out data_dir``: a copied or moved folder's record names the
    folder it was made as, which that command would replace. Unrecorded, the name-based
    guess; for a name that tells nothing, a placeholder: never the bundled corpus, which
    would replace the folder's data."""
    if meta is None or not meta.command_line:
        return prepare_command(data_dir, "--overwrite", unknown=UNKNOWN_OPTIONS)
    try:
        words = shlex.split(meta.command_line)
    except ValueError:  # unbalanced quotes: not a command to give again
        return prepare_command(data_dir, "--overwrite", unknown=UNKNOWN_OPTIONS)
    return _remade_here(words, data_dir)


def _remade_here(words: list[str], data_dir: Path) -> str:
    """Prepare command ``words`` made to write ``data_dir`` again: ``--out data_dir
    --overwrite`` in place of its own ``--out``."""
    kept: list[str] = []
    skip = False
    for word in words:
        if skip or word.startswith("--out="):
            skip = False
            continue
        if word == "--out":
            skip = True  # and its value
            continue
        kept.append(word)
    if "--overwrite" not in kept:
        kept.append("--overwrite")
    return shlex.join([*kept, "--out", str(data_dir)])


def holds_data_meta(folder: Path) -> bool:
    """Whether ``folder`` has a data folder's ``meta.json`` (not any file of that name:
    a project's own one is common)."""
    try:
        meta = json.loads((folder / META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "format_version" in meta and "splits" in meta


def read_meta(data_dir: str | os.PathLike[str], splits: bool = True) -> DataMeta:
    """Read and check ``data_dir/meta.json``; a clear :class:`DataFolderError` otherwise.
    ``splits`` False: the splits are not read (what needs the tokenizer alone: a folder of
    ``meta.json`` and ``tokenizer/`` copied from the training machine serves).

    * missing folder: names the ``cofr data prepare`` command that makes it;
    * folder without ``meta.json`` (an interrupted prepare): "half-written", rerun with
      ``--overwrite``;
    * a split folder without its ``index.json``, or a chunk that is missing or not the
      size its index says (a copy cut short, a full disk): the same.
    """
    data_dir = Path(data_dir)
    if data_dir.is_file():
        folder = data_dir.parent if data_dir.name == META_FILE else None
        hint = f": did you mean {str(folder)!r}?" if folder is not None else ""
        raise DataFolderError(
            f"data folder {str(data_dir)!r} is a file, not a folder made by `cofr data "
            f"prepare`{hint}"
        )
    if not data_dir.is_dir():
        raise DataFolderError(
            f"data folder {str(data_dir)!r} does not exist. Make it with:\n"
            f"  {prepare_command(data_dir)}\n"
            "(or another --source/--tokenizer; see `cofr data prepare --help`)."
        )
    meta_path = data_dir / META_FILE
    if not meta_path.is_file() and holds_data_meta(data_dir.parent):
        raise DataFolderError(
            f"{str(data_dir)!r} is the {data_dir.name!r} part of data folder "
            f"{str(data_dir.parent)!r}: pass that folder"
        )
    if not meta_path.is_file() and held_now(data_dir / PREPARE_LOCK):
        raise DataFolderError(
            f"data folder {str(data_dir)!r} is being prepared now, by "
            f"{FolderLock(data_dir / PREPARE_LOCK).describe_holder()}: wait for it to finish"
        )
    foreign = foreign_entries(data_dir) if not meta_path.is_file() else []
    written = any((data_dir / name).exists() for name in PREPARED_ENTRIES)
    if not meta_path.is_file() and (foreign or not written):
        # Not half-written: an --overwrite would refuse it (it deletes only its own files).
        out = data_dir if not foreign and not written else Path("NEW_FOLDER")
        held = f"; it holds {', '.join(foreign[:5])}" if foreign else ""
        corpus = _corpus_options(data_dir, foreign)
        make = "make one" if corpus is None else "make one of its files"
        raise DataFolderError(
            f"{str(data_dir)!r} is not a data folder (no {META_FILE}, nor only what `cofr "
            f"data prepare` writes{held}): pass the folder it made (its --out), or {make} "
            f"with:\n  {prepare_command(out, unknown=corpus or '--source pydoc')}"
        )
    if not meta_path.is_file():
        raise DataFolderError(
            f"data folder {str(data_dir)!r} is half-written: it has no {META_FILE} (which "
            "`cofr data prepare` writes last), so an earlier prepare was interrupted or failed. "
            f"Rerun the prepare command with --overwrite{guessed_remake(data_dir)}"
        )
    try:
        meta = DataMeta.from_dict(json.loads(meta_path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DataFolderError(
            f"{str(meta_path)!r} is unreadable ({err}), and with it the options that made "
            f"the folder: rerun its prepare command with --overwrite{guessed_remake(data_dir)}"
        ) from err
    if meta.format_version != FORMAT_VERSION:
        raise DataFolderError(
            f"{str(data_dir)!r} has data format {meta.format_version}, this cofrgenet reads "
            f"format {FORMAT_VERSION}. Remake it with `{remake_command(data_dir, meta)}`."
        )
    if splits and tokenizer_only(data_dir):
        raise DataFolderError(
            f"{str(data_dir)!r} holds a tokenizer alone (meta.json and tokenizer/, as a run "
            "folder's tokenizer/ copy), no tokens: pass the data folder to read (a run's "
            "config.yaml names the one it trained on as data.data_dir), or prepare one with "
            f"this tokenizer:\n  cofr data prepare --source ... --tokenizer-from {data_dir} "
            "--out NEW_FOLDER"
        )
    for split in SPLITS if splits else ():
        if not (data_dir / split / "index.json").is_file():
            raise DataFolderError(
                f"data folder {str(data_dir)!r} is half-written: {split}/index.json is missing. "
                f"Rerun the prepare command with --overwrite:\n"
                f"  {remake_command(data_dir, meta)}"
            )
        damaged = _damaged_chunk(data_dir / split)
        if damaged is not None:
            raise DataFolderError(
                f"data folder {str(data_dir)!r} is damaged: {split}/{damaged}. Copy it again, "
                f"or remake it with:\n  {remake_command(data_dir, meta)}"
            )
    return meta


def chunk_layout(split_dir: Path) -> str:
    """A digest of how a prepared split is cut into chunks (each chunk's name and token
    count, in order). The same tokens prepared by another number of workers are cut
    elsewhere, often into as many chunks: the blocks, and a saved stream position in
    them, are then others."""
    index = json.loads((split_dir / "index.json").read_text())
    cuts = [[chunk["filename"], int(chunk["dim"] or 0)] for chunk in index["chunks"]]
    return hashlib.sha256(json.dumps(cuts).encode()).hexdigest()[:16]


def split_blocks(split_dir: Path, block_tokens: int) -> int:
    """How many items of ``block_tokens`` tokens a prepared split holds, all processes
    together: litdata's ``TokensLoader`` cuts each chunk into whole blocks, the chunk's
    tail is left over."""
    index = json.loads((split_dir / "index.json").read_text())
    return sum(int(chunk["dim"] or 0) // block_tokens for chunk in index["chunks"])


def chunks_cut_by_size(split_dir: Path) -> int | None:
    """The tokens of the largest chunk of a prepared split when its chunks were cut by
    ``--chunk-bytes`` (the largest fills half of it or more), else None: then the data,
    or each prepare worker's share of it, ended them (a block never spans two)."""
    index = json.loads((split_dir / "index.json").read_text())
    limit = int((index.get("config") or {}).get("chunk_bytes") or 0)
    largest = max(index["chunks"], key=lambda c: int(c["chunk_bytes"]), default=None)
    if not limit or largest is None or 2 * int(largest["chunk_bytes"]) < limit:
        return None
    return int(largest["dim"] or 0)


def _damaged_chunk(split_dir: Path) -> str | None:
    """What is wrong with the first chunk of ``split_dir`` that is missing or whose size
    is not the one its ``index.json`` records (uncompressed chunks only), or None."""
    try:
        index = json.loads((split_dir / "index.json").read_text())
        if (index.get("config") or {}).get("compression"):
            return None  # the index records uncompressed sizes
        chunks = [(c["filename"], int(c["chunk_bytes"])) for c in index["chunks"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"index.json is unreadable ({err})"
    for name, size in chunks:
        path = split_dir / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size:,} bytes, its index says {size:,}"
    return None

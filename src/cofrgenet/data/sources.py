"""Text sources for ``cofr data prepare``: sequences of documents with random access.

A :class:`Source` has ``len(source)`` documents and ``source.read(indices)`` returns the
texts of some of them (indices ascending). Sources are pickled to litdata's worker
processes, which read their own documents: no text travels through the main process
except for BPE training.

* :class:`PydocSource`: Python's bundled documentation (``pydoc_data.topics``), one
  document per topic; on every Python install, so the demo needs no download.
* :class:`TextFilesSource`: local text files by glob, one document per file.
* :class:`JsonlSource`: JSON Lines files, one document per line (a text field).
* :class:`ParquetSource`: Parquet files, one document per row (a text column).
* :class:`HFSource`: a Hugging Face ``datasets`` dataset by name (needs the network, or
  the dataset already in the local HF cache); presets in :data:`HF_PRESETS`.
"""

from __future__ import annotations

import bisect
import codecs
import contextlib
import glob as _glob
import hashlib
import json
import os
import platform
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cofrgenet.errors import UserError, did_you_mean, first_line
from cofrgenet.hub import offline_unless_reachable

SOURCE_KINDS = ("pydoc", "text", "jsonl", "parquet", "hf")

#: The offline alternatives named by errors of the ``hf`` source.
OFFLINE_ALTERNATIVES = (
    "--source text --glob 'path/*.txt' (one document per file), "
    "--source jsonl --path 'path/*.jsonl' --text-field text, "
    "--source parquet --path 'path/*.parquet' --text-field text, "
    "or the bundled --source pydoc"
)


class SourceError(UserError, ValueError):
    """A source that cannot be read as asked (the message says why and what to do)."""


class HFUnavailableError(SourceError):
    """A Hugging Face dataset that cannot be loaded here (no ``datasets``, no network...)."""


class Source:
    """Documents with random access; subclasses implement ``__len__``, ``read``, ``describe``."""

    kind: str = ""

    def __len__(self) -> int:
        raise NotImplementedError

    def read(self, indices: Sequence[int]) -> list[str]:
        """Texts of the documents at ``indices`` (ascending), in that order."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-able arguments that identify the source (stored in meta.json)."""
        raise NotImplementedError


def files_signature(files: Sequence[str]) -> str:
    """A short hash of the files' paths, sizes and modification times: changes when a
    file is edited, added or removed (stored in meta.json, so that preparing an edited
    corpus again does not reuse the old tokens)."""
    digest = hashlib.sha256()
    for path in files:
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


#: A JSON escape ``\ud800``..``\udfff`` that is not half of a pair: no UTF-8 encodes it,
#: so it becomes U+FFFD, as bad bytes of text files do.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _checked_text(value: Any, where: str, field: str) -> str:
    """``value`` if it is a string, ``""`` for None (an empty document), else a SourceError."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SourceError(
            f"{where}: field {field!r} is {type(value).__name__}, not a string; "
            "fix that record, or name the text field with --text-field"
        )
    return value


def _line_at(path: str, offset: int) -> str:
    """``<path> line <n>``: the 1-based line of ``path`` that starts at byte ``offset``
    (for error messages; counted only when one is raised)."""
    lines, left = 1, offset
    with open(path, "rb") as fh:
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            lines += block.count(b"\n")
            left -= len(block)
    return f"{path} line {lines}"


def _expand(patterns: str | Sequence[str], what: str) -> list[str]:
    """Sorted unique files matching glob patterns (``**`` recursive); an error if none."""
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    files: set[str] = set()
    dangling: list[str] = []
    unmatched: list[str] = []
    for given in patterns:
        pattern = os.path.expanduser(str(given))
        matches = _glob.glob(pattern, recursive=True) if _glob.has_magic(pattern) else [pattern]
        found = {str(Path(m).resolve()) for m in matches if os.path.isfile(m)}
        files |= found
        dangling += [m for m in matches if os.path.islink(m) and not os.path.exists(m)]
        if not found:
            unmatched.append(str(given))
    if dangling:  # their text would be missing from the corpus, unsaid
        more = f" (and {len(dangling) - 1} more)" if len(dangling) > 1 else ""
        raise SourceError(
            f"{sorted(dangling)[0]}{more}: a link to no file (git-annex or LFS content not "
            "fetched, a moved target): fetch or fix it, or give a glob that leaves it out"
        )
    if not files:
        raise SourceError(
            f"no {what} files match {list(patterns)!r}{_no_match_hint(patterns, what)}"
        )
    if unmatched:  # a typo beside paths that match: its files would be missing, unsaid
        hint = _no_match_hint(unmatched, what) or ": fix it, or leave it out"
        raise SourceError(
            f"{unmatched[0]!r} matches no {what} file (the others match {len(files)}){hint}"
        )
    packed = sorted(f for f in files if Path(f).suffix.lower() in _COMPRESSED)
    if packed and what != "Parquet":  # Parquet compresses inside the file
        more = f" (and {len(packed) - 1} more)" if len(packed) > 1 else ""
        raise SourceError(
            f"{packed[0]}{more} is compressed, and {what} files are read as they are: "
            "decompress them first (gunzip, xz -d, zstd -d)"
        )
    return sorted(files)


#: The suffixes of compressed files: read as text, they were "not a JSON record" or noise.
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip")


#: The files of a folder to suggest, by source (``_expand``'s ``what``).
_SUFFIXES = {"text": "txt", "JSONL": "jsonl", "Parquet": "parquet"}


def _no_match_hint(patterns: Sequence[str], what: str) -> str:
    """Why a pattern that names something on disk matched no file, if it does."""
    for pattern in map(str, patterns):
        path = os.path.expanduser(pattern)
        if os.path.isdir(path):
            files = f"{pattern.rstrip('/')}/**/*.{_SUFFIXES.get(what, '*')}"
            return f": {pattern!r} is a folder; give the files in it, e.g. '{files}'"
        if "[" in pattern and _glob.glob(path.replace("[", "[[]"), recursive=True):
            return (
                f": in {pattern!r}, [...] is a set of characters to glob; write a literal [ as [[]"
            )
    return ""


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """An OSError while reading ``path`` (no permission, an I/O error) as a one-line
    SourceError naming it, in the main process or a worker."""
    try:
        yield
    except OSError as error:
        raise SourceError(f"{path}: cannot read it ({error.strerror or error})") from None


#: Undecodable bytes (each becomes U+FFFD) and NULs a text file may hold before it is
#: refused as not UTF-8: one, and one more per this many characters. A stray byte of a
#: crawl passes; a Latin-1 file (every accented letter) or UTF-16 without its BOM (a NUL
#: beside every ASCII letter) does not.
STRAY_EVERY = 10_000

#: Byte-order marks and the codec that reads (and drops) each; UTF-32's before UTF-16's,
#: whose little-endian mark begins UTF-32's.
_BOMS = (
    ((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE), "utf-32"),
    ((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE), "utf-16"),
)


def _decoded(data: bytes, encoding: str) -> tuple[str, int]:
    """``data`` decoded, undecodable bytes as U+FFFD, and how many there were."""
    try:
        return data.decode(encoding), 0
    except UnicodeDecodeError:
        text = data.decode(encoding, errors="replace")
        return text, text.count("\ufffd") - data.decode(encoding, errors="ignore").count("\ufffd")


def _check_utf8(path: str, bad: int, length: int, option: str) -> None:
    """A SourceError when more than a few of a file's ``length`` characters (``bad``)
    were undecodable bytes or NULs: the file is in another encoding (see
    :data:`STRAY_EVERY`)."""
    if bad > 1 + length // STRAY_EVERY:
        raise SourceError(
            f"{path} is not UTF-8 text ({bad:,} of its {length:,} characters are "
            "undecodable bytes or NULs): convert it to UTF-8 first (iconv -f <its encoding> "
            f"-t UTF-8: LATIN1, UTF-16LE...), or leave it out of {option}"
        )


def _read_text(path: str) -> str:
    """A text file's contents as written: line ends kept (``\r\n`` stays, as in JSONL
    and Parquet text), a byte-order mark dropped (UTF-16 and UTF-32 with one decoded as
    such), a few stray undecodable bytes replaced; a SourceError for a file that is not
    UTF-8 (see :data:`STRAY_EVERY`)."""
    with _reading(path), open(path, "rb") as fh:
        data = fh.read()
    # utf-8-sig drops a UTF-8 BOM, as the JSONL source does.
    encoding = next((codec for marks, codec in _BOMS if data.startswith(marks)), "utf-8-sig")
    text, bad = _decoded(data, encoding)
    _check_utf8(path, bad + text.count("\x00"), len(text), "--glob")
    return text


class PydocSource(Source):
    """Python's own documentation text: one document per ``pydoc_data.topics`` topic,
    less the topics that others contain (:func:`distinct_topics`)."""

    kind = "pydoc"

    def __init__(self) -> None:
        from pydoc_data.topics import topics

        self.topics = distinct_topics({k: v for k, v in topics.items() if v.strip()})
        self._docs = [topics[k] for k in self.topics]

    def __len__(self) -> int:
        return len(self._docs)

    def read(self, indices: Sequence[int]) -> list[str]:
        return [self._docs[i] for i in indices]

    def describe(self) -> dict[str, Any]:
        return {
            "module": "pydoc_data.topics",
            "python": platform.python_version(),
            "topics": f"{len(self.topics)}, those contained in others left out",
        }


def nested_pydoc_topics(source: str, source_args: dict[str, Any]) -> bool:
    """Whether a prepared folder (its meta's ``source`` and ``source_args``) holds pydoc's
    topics from before 2026-12-05, the nested ones too: its held-out topics were then
    partly training text. Such a folder is made again with ``--overwrite``."""
    return source == "pydoc" and "topics" not in source_args


#: Lines this long or longer are compared between topics; shorter ones (headings, "Note:")
#: recur in unrelated topics.
_LONG_LINE = 40


def distinct_topics(topics: dict[str, str]) -> list[str]:
    """The names of ``topics`` (name -> text) that no other topic contains, sorted.

    pydoc's topics nest: ``compound`` holds ``if``, ``for``, ``try``, ``with``...,
    ``typesseq`` holds ``typesseq-mutable``, and ``if`` and ``else`` are one text. Split by
    topic, a held-out topic was then mostly training text too (80% of the validation
    characters at --val-fraction 0.05). From the longest down, a topic is kept unless
    half or more of its long lines are in the topics kept before it (or, with no long
    line, its text is one of theirs): every nested topic goes, its container stays.
    """
    kept: list[str] = []
    seen: set[str] = set()
    for name in sorted(topics, key=lambda k: (-len(topics[k]), k)):
        text = topics[name]
        lines = {line for line in text.split("\n") if len(line.strip()) >= _LONG_LINE}
        if lines and 2 * len(lines & seen) >= len(lines):
            continue
        if not lines and any(text.strip() == topics[k].strip() for k in kept):
            continue
        kept.append(name)
        seen |= lines
    return sorted(kept)


class _FileRowSource(Source):
    """Documents spread over files: global index -> (file, row) through cumulative counts."""

    files: list[str]
    _starts: list[int]  # first global index of each file, plus the total at the end

    def __len__(self) -> int:
        return self._starts[-1]

    def _by_file(self, indices: Sequence[int]) -> list[tuple[int, list[int]]]:
        groups: dict[int, list[int]] = {}
        for i in indices:
            if not 0 <= i < len(self):
                raise IndexError(f"document {i} out of range (0..{len(self) - 1})")
            f = bisect.bisect_right(self._starts, i) - 1
            groups.setdefault(f, []).append(i - self._starts[f])
        return sorted(groups.items())

    def _text(self, value: Any, where: str) -> str:
        return _checked_text(value, where, self.text_field)

    text_field: str


#: What one document of ``--source text`` is: a whole file, a paragraph (text between
#: blank lines: a play's speeches, a book's paragraphs) or a non-blank line.
TEXT_DOCUMENTS = ("files", "paragraphs", "lines")
_BLANK_LINES = re.compile(r"\r?\n(?:[ \t]*\r?\n)+")
#: A line's end: not str.splitlines(), which also ends one at a form feed, \x1c-\x1e,
#: \x85 or \u2028, all of which a line of text may hold.
_LINE_END = re.compile(r"\r\n|\r|\n")


def text_pieces(text: str, documents: str) -> list[str]:
    """The documents of one file's ``text``: its paragraphs or its lines, blank ones
    dropped (a paragraph keeps its line ends; a line loses its own)."""
    parts = (_BLANK_LINES if documents == "paragraphs" else _LINE_END).split(text)
    return [part for part in parts if part.strip()]


def pattern_list(patterns: str | Sequence[str] | None) -> list[str]:
    """``--glob`` / ``--path`` patterns as a list: one given as text, several, or none."""
    if patterns is None:
        return []
    return [patterns] if isinstance(patterns, str) else list(patterns)


class TextFilesSource(_FileRowSource):
    """Local text files (UTF-8; undecodable bytes replaced): one document per non-empty
    file, or per paragraph or line of them (``documents``, :data:`TEXT_DOCUMENTS`)."""

    kind = "text"

    def __init__(self, patterns: str | Sequence[str], documents: str = "files") -> None:
        if documents not in TEXT_DOCUMENTS:
            raise SourceError(
                f"documents must be one of {', '.join(TEXT_DOCUMENTS)}, got {documents!r}"
            )
        self.patterns = pattern_list(patterns)
        self.documents = documents
        self.files = [f for f in _expand(self.patterns, "text") if os.path.getsize(f) > 0]
        if not self.files:
            raise SourceError(f"every file matching {self.patterns!r} is empty")
        counts = (
            [1] * len(self.files)
            if documents == "files"
            else [len(text_pieces(_read_text(f), documents)) for f in self.files]
        )  # a pass over the text, then each read splits the files it needs again
        self._starts = [0, *np.cumsum(counts).tolist()]
        if len(self) == 0:
            raise SourceError(f"the files matching {self.patterns!r} hold only blank lines")

    def read(self, indices: Sequence[int]) -> list[str]:
        if self.documents == "files":
            return [_read_text(self.files[i]) for i in indices]
        out: list[str] = []
        for f, rows in self._by_file(indices):
            pieces = text_pieces(_read_text(self.files[f]), self.documents)
            out += [pieces[r] for r in rows]
        return out

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "glob": self.patterns,
            "files": len(self.files),
            "contents": files_signature(self.files),
        }
        if self.documents != "files":  # a folder made before the option reads the same
            described["documents"] = self.documents
        return described


class JsonlSource(_FileRowSource):
    """JSON Lines files: one document per non-blank line, its text in ``text_field``."""

    kind = "jsonl"

    def __init__(self, patterns: str | Sequence[str], text_field: str = "text") -> None:
        self.patterns = pattern_list(patterns)
        self.text_field = text_field
        self.files = _expand(self.patterns, "JSONL")
        # Byte offsets of non-blank lines: one pass, then random access by seek.
        self._offsets: list[np.ndarray] = []
        for path in self.files:
            offsets, pos, bad, length = [], 0, 0, 0
            with _reading(path), open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        offsets.append(pos)
                    pos += len(line)
                    if line.isascii():  # most lines: nothing to decode
                        length += len(line)
                        continue
                    text, stray = _decoded(line, "utf-8")
                    bad, length = bad + stray, length + len(text)
            _check_utf8(path, bad, length, "--path")  # a Latin-1 file read as garble
            self._offsets.append(np.asarray(offsets, dtype=np.int64))
        self._starts = [0, *np.cumsum([len(o) for o in self._offsets]).tolist()]
        if len(self) == 0:
            raise SourceError(f"the JSONL files {self.patterns!r} have no records")
        self.read([0])  # fail fast on a wrong --text-field

    def read(self, indices: Sequence[int]) -> list[str]:
        out = []
        for f, rows in self._by_file(indices):
            path = self.files[f]
            with _reading(path), open(path, "rb") as fh:
                for r in rows:
                    offset = int(self._offsets[f][r])
                    fh.seek(offset)
                    # Bad bytes become U+FFFD, as in text files: one stray byte of a
                    # crawl must not end a prepare hours in. (A file's BOM is dropped.)
                    line = fh.readline().decode("utf-8", errors="replace")
                    try:
                        record = json.loads(line.removeprefix("\ufeff") if offset == 0 else line)
                    except ValueError as err:
                        where = _line_at(path, offset)
                        raise SourceError(f"{where}: not a JSON record ({err})") from err
                    if not isinstance(record, dict) or self.text_field not in record:
                        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                        raise SourceError(
                            f"{_line_at(path, offset)} has no field {self.text_field!r} "
                            f"(has {keys}); fix that record, or name the text field with "
                            "--text-field"
                        )
                    value = record[self.text_field]
                    if not isinstance(value, str):
                        value = self._text(value, _line_at(path, offset))
                    out.append(_LONE_SURROGATE.sub("\ufffd", value))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.patterns,
            "text_field": self.text_field,
            "files": len(self.files),
            "contents": files_signature(self.files),
        }


class ParquetSource(_FileRowSource):
    """Parquet files: one document per row, its text in the column ``text_field``."""

    kind = "parquet"

    def __init__(self, patterns: str | Sequence[str], text_field: str = "text") -> None:
        import pyarrow.parquet as pq

        self.patterns = pattern_list(patterns)
        self.text_field = text_field
        self.files = _expand(self.patterns, "Parquet")
        self._group_starts: list[list[int]] = []  # per file: first row of each row group + total
        for path in self.files:
            try:
                meta = pq.ParquetFile(path).metadata
            except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
                raise SourceError(
                    f"{path}: not a readable Parquet file ({first_line(error)})"
                ) from None
            names = meta.schema.to_arrow_schema().names
            if text_field not in names:
                raise SourceError(
                    f"{path} has no column {text_field!r} (has {names}); pass it with --text-field"
                )
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            self._group_starts.append([0, *np.cumsum(sizes).tolist()])
        self._starts = [0, *np.cumsum([g[-1] for g in self._group_starts]).tolist()]
        if len(self) == 0:
            raise SourceError(f"the Parquet files {self.patterns!r} have no rows")

    def read(self, indices: Sequence[int]) -> list[str]:
        import pyarrow.parquet as pq

        out = []
        for f, rows in self._by_file(indices):
            starts = self._group_starts[f]
            group, column = -1, None
            with _reading(self.files[f]):
                pf = pq.ParquetFile(self.files[f])
                for r in rows:
                    g = bisect.bisect_right(starts, r) - 1
                    if g != group:
                        group = g
                        column = pf.read_row_group(g, columns=[self.text_field]).column(0)
                    value = column[r - starts[g]].as_py()
                    out.append(self._text(value, f"{self.files[f]} row {r}"))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "path": self.patterns,
            "text_field": self.text_field,
            "files": len(self.files),
            "contents": files_signature(self.files),
        }


@dataclass(frozen=True)
class HFPreset:
    """A named Hugging Face dataset: hub path, subset, text field, splits."""

    path: str
    subset: str | None
    text_field: str
    split: str = "train"
    #: Its own validation split, used instead of carving one out of ``split``.
    val_split: str | None = None


#: ``--dataset`` short names. Any other name is passed to ``datasets.load_dataset`` as is.
HF_PRESETS: dict[str, HFPreset] = {
    "openwebtext": HFPreset("Skylion007/openwebtext", None, "text"),
    # Document-level WikiText: one article per row (Salesforce/wikitext has one line per row).
    "wikitext-103": HFPreset(
        "EleutherAI/wikitext_document_level", "wikitext-103-raw-v1", "page", val_split="validation"
    ),
    "wikitext-2": HFPreset(
        "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1", "page", val_split="validation"
    ),
    "ptb": HFPreset(
        "ptb-text-only/ptb_text_only", "penn_treebank", "sentence", val_split="validation"
    ),
    "lambada": HFPreset("cimec/lambada", None, "text", val_split="validation"),
}

#: What ``datasets`` >= 4 raises for a hub dataset that is a loading script.
SCRIPTS_UNSUPPORTED = "Dataset scripts are no longer supported"

#: ``loader(path, subset, split=...) -> dataset``: ``datasets.load_dataset`` by default.
Loader = Callable[..., Any]


def _default_loader(path: str, subset: str | None, *, split: str) -> Any:
    local = Path(path).expanduser()
    if not local.exists():  # a local dataset folder needs no hub
        offline_unless_reachable()  # before datasets is imported: no retries of a dead hub
    try:
        import datasets
    except ImportError as err:
        raise HFUnavailableError(
            "--source hf needs the Hugging Face `datasets` package, which is not installed "
            f"(`pip install datasets`). Offline alternatives: {OFFLINE_ALTERNATIVES}."
        ) from err
    if not local.exists():  # a download: its progress bars say how far it is
        return datasets.load_dataset(path, subset, split=split)
    # A local folder loads in seconds: datasets' bars ("Generating train split") would
    # only come between the prepare's own lines.
    bars_were_off = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        if (local / "state.json").is_file():
            # One Dataset's save_to_disk, which load_dataset refuses ("use load_from_disk");
            # a DatasetDict's loads through load_dataset, with its splits' info.
            return _saved_dataset(datasets.load_from_disk(str(local)), split, subset)
        return datasets.load_dataset(path, subset, split=split)
    finally:
        if not bars_were_off:
            datasets.enable_progress_bars()


def split_parts(spec: str) -> list[tuple[str, str]]:
    """(part as given, its split's name) of each ``+``-joined part of a hub split spec:
    ``train[:90%]+validation`` -> ``[("train[:90%]", "train"), ("validation",
    "validation")]``."""
    return [(part.strip(), part.split("[", 1)[0].strip()) for part in spec.split("+")]


def _saved_dataset(saved: Any, split: str, subset: str | None) -> Any:
    """``split`` (``train``, a slice such as ``train[:90%]``, parts joined by ``+``) of
    one Dataset written by ``save_to_disk``: its rows are its one split, ``train``."""
    import datasets

    if subset is not None:
        raise SourceError(
            f"--subset {subset}: a Dataset written by save_to_disk has no subsets; drop --subset"
        )
    if any(name != "train" for _, name in split_parts(split)):
        raise SourceError(
            f"--split {split}: a Dataset written by save_to_disk (not a DatasetDict) "
            "has one split, its rows: use --split train, or a slice such as "
            "'train[:90%]' (and --val-split 'train[90%:]')"
        )
    pieces = [
        saved.select(range(piece.from_, piece.to))
        for piece in datasets.ReadInstruction.from_spec(split).to_absolute({"train": len(saved)})
    ]
    return pieces[0] if len(pieces) == 1 else datasets.concatenate_datasets(pieces)


def shared_rows(train: str, val: str, rows_of: Callable[[str], int | None]) -> dict[str, int]:
    """How many rows of each split the hub split specs ``train`` and ``val`` (names or
    slices such as ``train[:80%]``, parts joined by ``+``) both take, for the splits named
    in both whose row count ``rows_of(name)`` knows; splits they share no row of are left
    out. Rows are counted as ``datasets`` slices them (``ReadInstruction``)."""
    import datasets

    def parts(spec: str) -> dict[str, list[str]]:  # split name -> its parts
        found: dict[str, list[str]] = {}
        for part, name in split_parts(spec):
            found.setdefault(name, []).append(part)
        return found

    def covered(specs: list[str], name: str, rows: int) -> list[tuple[int, int]]:
        spans = sorted(
            (piece.from_, piece.to)
            for spec in specs
            for piece in datasets.ReadInstruction.from_spec(spec).to_absolute({name: rows})
        )
        merged: list[tuple[int, int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        return merged

    taken, held = parts(train), parts(val)
    shared: dict[str, int] = {}
    for name in taken.keys() & held.keys():
        rows = rows_of(name)
        if rows is None:
            continue
        both = sum(
            max(0, min(a_end, b_end) - max(a_start, b_start))
            for a_start, a_end in covered(taken[name], name, rows)
            for b_start, b_end in covered(held[name], name, rows)
        )
        if both:
            shared[name] = both
    return shared


class HFSource(Source):
    """One split of a Hugging Face dataset (map-style, random access), one document per row."""

    kind = "hf"

    def __init__(
        self,
        dataset: str,
        subset: str | None = None,
        split: str | None = None,
        text_field: str | None = None,
        loader: Loader | None = None,
    ) -> None:
        preset = HF_PRESETS.get(dataset)
        self.name = dataset
        self.path = preset.path if preset else dataset
        self.subset = subset if subset is not None else (preset.subset if preset else None)
        self.split = split or (preset.split if preset else "train")
        self.text_field = text_field or (preset.text_field if preset else "text")
        loader = loader or _default_loader
        self._loader = loader
        what = f"Hugging Face dataset {self.path!r}" + (f" ({self.subset})" if self.subset else "")
        try:
            self._ds = loader(self.path, self.subset, split=self.split)
        except (HFUnavailableError, SourceError):
            raise
        except Exception as err:
            # A preset's name mistyped reads as another hub name: say which one was meant.
            hint = "" if preset else did_you_mean(dataset, list(HF_PRESETS))
            if SCRIPTS_UNSUPPORTED in str(err):
                fix = (
                    f"{what} is a loading script, which `datasets` >= 4 no longer runs. Run "
                    "this prepare with `pip install 'datasets<4'` (3.6 runs it), or prepare "
                    "a Parquet copy with --source parquet --path 'DIR/*.parquet' --text-field "
                    f"{self.text_field} (the hub's own conversion, "
                    f"https://huggingface.co/datasets/{self.path}/tree/refs%2Fconvert%2Fparquet, "
                    "may hold only part of a large dataset: compare its row count)."
                )
            elif Path(self.path).expanduser().exists():  # local: no hub to advise about
                fix = "Check --split, --subset and the folder's files."
            else:
                fix = (
                    "Without network access to the hub (or a copy in the local HF cache, read "
                    "with HF_HUB_OFFLINE=1), prepare a local copy instead: "
                    f"{OFFLINE_ALTERNATIVES}."
                )
            raise HFUnavailableError(
                f"could not load {what}{hint}, split {self.split!r}: {type(err).__name__}: "
                f"{err}\n{fix}"
            ) from err
        columns = getattr(self._ds, "column_names", None)
        if columns is None and len(self._ds):
            columns = list(self._ds[0])
        if columns is not None and self.text_field not in columns:
            raise SourceError(
                f"{what} has no field {self.text_field!r} (has {columns}); use --text-field"
            )

    def __len__(self) -> int:
        return len(self._ds)

    @property
    def _saved_alone(self) -> bool:
        """Whether the dataset is one Dataset written by ``save_to_disk``: its rows are its
        one split, ``train``, whatever splits its info still lists (those of the dataset
        it was saved from: a hub split saved alone keeps its ``validation`` there)."""
        return (Path(self.path).expanduser() / "state.json").is_file()

    @property
    def split_names(self) -> list[str]:
        """The dataset's splits, as its loaded split's info lists them ([] if it does not)."""
        if self._saved_alone:
            return ["train"]
        info = getattr(self._ds, "info", None)
        return list(getattr(info, "splits", None) or {})

    def __getstate__(self) -> dict[str, Any]:
        # Spawned tokenizing workers read rows, never load: a loader need not pickle.
        return {**self.__dict__, "_loader": None}

    def read(self, indices: Sequence[int]) -> list[str]:
        indices = [int(i) for i in indices]
        if hasattr(self._ds, "select"):  # datasets.Dataset: one Arrow take for the batch
            texts = self._ds.select(indices)[self.text_field]
        else:
            texts = [self._ds[i][self.text_field] for i in indices]
        return [
            _checked_text(t, f"{self.name} ({self.split}) row {i}", self.text_field)
            for i, t in zip(indices, texts, strict=True)
        ]

    def rows_of(self, split: str) -> int | None:
        """The row count of the dataset's whole split ``split`` (a name: no slice), from
        the loaded split's info, else by loading it; None if it cannot be loaded."""
        info = getattr(getattr(self._ds, "info", None), "splits", None) or {}
        if self._saved_alone:  # its info's counts are the original dataset's
            info = {}
        if split in info and info[split].num_examples:
            return int(info[split].num_examples)
        try:
            return len(self._loader(self.path, self.subset, split=split))
        except Exception:  # the spec's own load says what is wrong with it
            return None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "dataset": self.name,
            "path": self.path,
            "subset": self.subset,
            "split": self.split,
            "text_field": self.text_field,
        }
        local = Path(self.path).expanduser()
        if local.exists():  # a local folder's files can change under the same name
            # Not .git/ nor .cache/ (`hf download --local-dir` keeps its metadata there):
            # they change without the data changing.
            files = (
                sorted(
                    str(f)
                    for f in local.rglob("*")
                    if f.is_file()
                    and not any(part.startswith(".") for part in f.relative_to(local).parts)
                )
                if local.is_dir()
                else [str(local)]
            )
            described["contents"] = files_signature(files)
        return described


#: The names a dataset's own validation split goes by, in the order they are looked for.
VAL_SPLIT_NAMES = ("validation", "valid", "val", "dev")


def hf_val_split(dataset: str) -> str | None:
    """The preset's own validation split (None: carve one out of the training split)."""
    preset = HF_PRESETS.get(dataset)
    return preset.val_split if preset else None


def own_val_split(source: HFSource) -> str | None:
    """The validation split the dataset of ``source`` (its training split) has besides,
    by one of :data:`VAL_SPLIT_NAMES`; None when it lists none."""
    names = source.split_names
    return next((n for n in VAL_SPLIT_NAMES if n in names and n != source.split), None)


def make_source(
    kind: str,
    *,
    glob: str | Sequence[str] | None = None,
    path: str | Sequence[str] | None = None,
    text_field: str | None = None,
    dataset: str | None = None,
    subset: str | None = None,
    split: str | None = None,
    loader: Loader | None = None,
    documents: str | None = None,
) -> Source:
    """Build a source from ``cofr data prepare`` arguments (clear errors for missing ones)."""
    if kind == "pydoc":
        return PydocSource()
    # One option under two names (--glob for text files, --path for records): both read.
    patterns = [*pattern_list(glob), *pattern_list(path)]
    if kind == "text":
        if not patterns:
            raise SourceError("--source text needs --glob 'path/*.txt'")
        return TextFilesSource(patterns, documents or "files")
    if kind in ("jsonl", "parquet"):
        if not patterns:
            raise SourceError(f"--source {kind} needs --path 'path/*.{kind}'")
        cls = JsonlSource if kind == "jsonl" else ParquetSource
        return cls(patterns, text_field or "text")
    if kind == "hf":
        if not dataset:
            names = ", ".join(HF_PRESETS)
            raise SourceError(f"--source hf needs --dataset NAME ({names}, or any hub name)")
        return HFSource(dataset, subset, split, text_field, loader)
    raise SourceError(f"unknown source {kind!r}; choose from {', '.join(SOURCE_KINDS)}")

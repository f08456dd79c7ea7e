"""``cofr generate`` and the checks every checkpoint reader shares (generate, eval, export,
GLUE): a missing checkpoint, a folder, bad sampling options, the tokenizer's data folder.
Errors in what the user gave are one line, before any work."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from cofrgenet.cli import main
from cofrgenet.data import ByteTokenizer
from cofrgenet.errors import ConfigError
from cofrgenet.models import build_model
from cofrgenet.models.config import resolve_model_config
from cofrgenet.training import pretrained
from eval_helpers import tiny_byte_data
from test_cli_errors import one_line_error

MODEL = {"vocab_size": 257, "block_size": 16}


def write_checkpoint(
    path: Path,
    data_dir: str | None,
    trained_with: dict | None = None,
    vocab_size: int = 257,
    trained_length: int | None = None,
    preset: str = "gpt2-tiny",
) -> Path:
    """A checkpoint as ``cofr fit`` writes it (what the readers use of it), without
    training: the weights of a fresh gpt2-tiny, its hyperparameters, the data folder
    (and the tokenizer its data state names, ``trained_with``; the sequence length it
    trained at, ``trained_length``)."""
    model_config = {**MODEL, "vocab_size": vocab_size}
    model = build_model(resolve_model_config(preset, model_config))
    state = {f"model.{key}": value for key, value in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": state,
            "global_step": 3,
            "hyper_parameters": {"preset": preset, "config": model_config},
            "datamodule_hyper_parameters": {
                "data_dir": data_dir,
                **({"block_size": trained_length} if trained_length else {}),
            },
            **({"TokenDataModule": {"fingerprint": trained_with}} if trained_with else {}),
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tiny_byte_data(tmp_path_factory.mktemp("generate") / "data")


@pytest.fixture
def run_folder(tmp_path, data) -> Path:
    """``tmp/proj/runs/exp/run`` with its config.yaml and a checkpoint trained (as the
    checkpoint says) on ``data`` given as ``pyd``, relative to ``tmp/proj``."""
    project = tmp_path / "proj"
    run = project / "runs" / "exp" / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("run:\n  runs_dir: runs\n")
    shutil.copytree(data, project / "pyd")
    write_checkpoint(run / "checkpoints" / "last.ckpt", "pyd")
    return run


def test_a_missing_checkpoint_or_a_folder_is_one_line(capsys, tmp_path, run_folder):
    line = one_line_error(capsys, ["generate", "--ckpt", str(tmp_path / "nope.ckpt")])
    assert line == (
        f"cofr generate: error: no checkpoint file at {tmp_path / 'nope.ckpt'}; runs keep "
        "theirs in runs/<experiment>/<run>/checkpoints/"
    )
    # Something there that is no file (a device, a pipe) was "no checkpoint file at".
    line = one_line_error(capsys, ["generate", "--ckpt", os.devnull])
    assert line == (
        f"cofr generate: error: {os.devnull} is not a regular file: give a checkpoint file, "
        "e.g. runs/<experiment>/<run>/checkpoints/last.ckpt"
    )
    # A mistyped name beside the run's checkpoints: the closest one, as cofr validate says.
    typo = run_folder / "checkpoints" / "lats.ckpt"
    line = one_line_error(capsys, ["generate", "--ckpt", str(typo)])
    assert line == f"cofr generate: error: no checkpoint file at {typo} (did you mean 'last.ckpt'?)"
    # The run folder: its last.ckpt is suggested.
    line = one_line_error(capsys, ["generate", "--ckpt", str(run_folder)])
    assert f"{run_folder} is a folder, not a checkpoint file" in line
    assert f"did you mean {run_folder / 'checkpoints' / 'last.ckpt'}?" in line
    line = one_line_error(capsys, ["generate", "--ckpt", str(tmp_path)])
    assert "is a folder, not a checkpoint file" in line and "did you mean" not in line


def test_a_checkpoint_of_an_unregistered_mixer_is_one_line(capsys, tmp_path):
    """Trained by a script that registered its own mixer, read by plain `cofr`."""
    path = write_checkpoint(tmp_path / "mine.ckpt", None)
    saved = torch.load(path, weights_only=False)
    saved["hyper_parameters"]["config"]["attention"] = "shift"
    if "model_config" in saved:  # the record names it too
        saved["model_config"]["attention"] = "shift"
    torch.save(saved, path)
    line = one_line_error(capsys, ["generate", "--ckpt", str(path), "--prompt", "a"])
    assert line.startswith("cofr generate: error: unknown attention mixer 'shift'")
    assert "importing its module first: docs/architecture.md" in line


def test_the_shared_check_names_a_missing_checkpoint_for_every_reader(tmp_path):
    with pytest.raises(pretrained.CheckpointNotFound, match="no checkpoint file at"):
        pretrained.load_checkpoint(tmp_path / "nope.ckpt")
    with pytest.raises(pretrained.CheckpointNotFound, match="is a folder"):
        pretrained.load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--temperature", "-1", "argument --temperature: must be >= 0, got -1"),
        ("--temperature", "nan", "argument --temperature: must be >= 0, got nan"),
        ("--temperature", "inf", "argument --temperature: must be a finite number >= 0, got inf"),
        ("--num-samples", "0", "argument --num-samples: must be >= 1, got 0"),
        ("--num-samples", "-2", "argument --num-samples: must be >= 1, got -2"),
        ("--max-new-tokens", "-5", "argument --max-new-tokens: must be >= 1, got -5"),
        ("--top-k", "-3", "argument --top-k: must be >= 0, got -3"),
        ("--top-p", "0", "argument --top-p: must be in (0, 1], got 0"),
        ("--top-p", "1.5", "argument --top-p: must be in (0, 1], got 1.5"),
        ("--top-p", "x", "argument --top-p: expected a number, got 'x'"),
        ("--seed", "x", "argument --seed: expected an int, got 'x'"),  # was "invalid int value"
        ("--device", "foo", "argument --device: unknown device 'foo'"),
    ],
)
def test_bad_sampling_options_are_refused_at_parse_time(capsys, option, value, message):
    # The checkpoint does not exist: the option is refused before it is looked at.
    line = one_line_error(capsys, ["generate", "--ckpt", "nope.ckpt", option, value])
    assert line.startswith(f"cofr generate: error: {message}")


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", str(2**32)])
def test_a_seed_out_of_range_is_one_line_before_the_checkpoint_is_read(capsys, seed):
    """A seed past 64 bits was an OverflowError traceback from torch; every other --seed
    is checked against the range numpy takes."""
    line = one_line_error(capsys, ["generate", "--ckpt", "nope.ckpt", "--seed", seed])
    assert line == f"cofr generate: error: --seed must be in [0, {2**32 - 1}], got {seed}"


@pytest.mark.parametrize(
    "given",
    [["--top-k", "5"], ["--top-p", "0.5"], ["--top-k", "5", "--top-p", "0.5"],
     ["--num-samples", "2"]],
)  # fmt: skip
def test_greedy_decoding_refuses_sampling_options(capsys, given):
    """`--temperature 0 --top-k 5`: one of the two was not meant; neither applies. N
    greedy samples are N copies of one continuation."""
    line = one_line_error(capsys, ["generate", "--ckpt", "nope.ckpt", "--temperature", "0", *given])
    flags = [word for word in given if word.startswith("--")]
    if flags == ["--num-samples"]:
        flags = ["--num-samples 2"]
    drop = "drop them" if len(flags) > 1 else "drop it"
    assert line.startswith(
        f"cofr generate: error: --temperature 0 decodes greedily, so {' and '.join(flags)} "
        f"would not apply: {drop}, "
    )


def test_generate_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for option, default in (
        ("--max-new-tokens", 200),
        ("--temperature", 0.8),
        ("--top-k", 50),
        ("--top-p", 1.0),
        ("--num-samples", 1),
        ("--seed", 1337),
        ("--device", "auto"),
    ):
        help_text = out.split(f" {option} ", 1)[1].split(" --", 1)[0]
        assert f"(default: {default})" in help_text, option


@pytest.mark.parametrize("gpu", [False, True])
def test_device_auto_is_cuda_where_torch_sees_a_gpu(monkeypatch, gpu):
    """The default of generate, eval and bench train: a GPU machine ran them on its CPU
    unless told (bench train timed the CPU)."""
    from cofrgenet import cli
    from cofrgenet.bench import train

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    expected = "cuda" if gpu else "cpu"
    for words in (["generate", "--ckpt", "x.ckpt"], ["eval", "--ckpt", "x.ckpt"]):
        assert cli.build_parser(words).parse_args(words).device == expected, words
    args = cli.build_parser(["bench", "train"]).parse_args(["bench", "train"])
    assert train.config_from_args(args).device == expected  # what its run() reads
    assert train.TrainBenchConfig().device == expected  # as a script builds it
    assert train.TrainBenchConfig(device="cuda:1").device == "cuda:1"


def test_a_device_this_machine_lacks_is_refused_at_parse_time(capsys):
    if torch.cuda.is_available():
        device = f"cuda:{torch.cuda.device_count()}"
        expected = f"this machine has {torch.cuda.device_count()} cuda device(s)"
    else:
        device, expected = "cuda", "torch sees no cuda device on this machine"
    line = one_line_error(capsys, ["generate", "--ckpt", "nope.ckpt", "--device", device])
    assert "argument --device:" in line and expected in line


@pytest.mark.parametrize("flag", ["--tokenizer", "--data"])  # --data: its first name
def test_a_tokenizer_flag_that_is_no_data_folder_names_the_flag(capsys, tmp_path, run_folder, flag):
    ckpt = str(run_folder / "checkpoints" / "last.ckpt")
    missing = tmp_path / "nonexist"
    line = one_line_error(capsys, ["generate", "--ckpt", ckpt, flag, str(missing)])
    assert line.startswith(f"cofr generate: error: --tokenizer {missing}: no such folder")
    assert "training data folder" not in line
    line = one_line_error(capsys, ["generate", "--ckpt", ckpt, flag, str(tmp_path)])
    assert f"--tokenizer {tmp_path} is not a prepared data folder (no meta.json)" in line
    meta = run_folder.parents[2] / "pyd" / "meta.json"  # the folder's file, not the folder
    line = one_line_error(capsys, ["generate", "--ckpt", ckpt, flag, str(meta)])
    assert line.endswith(f"is a file, not a prepared data folder (one with meta.json, as `cofr "
                         f"data prepare` writes): did you mean {meta.parent}?")  # fmt: skip


def test_a_folder_with_another_tokenizer_than_the_models_is_refused(capsys, tmp_path, data):
    """The training data folder prepared again with another tokenizer (or a wrong
    --tokenizer): its ids would be sampled, scored and exported as the model's."""
    ckpt = write_checkpoint(
        tmp_path / "bpe.ckpt", str(data), trained_with={"tokenizer": "bpe", "vocab_size": 300}
    )
    line = one_line_error(capsys, ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2"])
    assert line == (
        f"cofr generate: error: {data} holds a byte tokenizer of 257 ids, and {ckpt} was "
        "trained with a bpe tokenizer of 300 ids: the folder was prepared again since; pass one with the "
        "model's tokenizer (--tokenizer DIR)"
    )
    line = one_line_error(capsys, ["export", "hf", "--ckpt", str(ckpt), str(tmp_path / "hf")])
    assert line.endswith("(--tokenizer DIR), or --no-tokenizer to write the model alone")
    assert not (tmp_path / "hf").exists()
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "lambada_test.jsonl").write_text('{"text": "a passage ending in a word"}\n')
    evaluate = [
        "eval",
        "--ckpt",
        str(ckpt),
        "--tasks",
        "lambada",
        "--data-dir",
        str(sets),
        "--no-mlflow",
    ]
    line = one_line_error(capsys, [*evaluate, "--tokenizer", str(data)])
    assert "give the data folder the model trained on (--tokenizer DIR)" in line
    same = write_checkpoint(
        tmp_path / "byte.ckpt", str(data), trained_with={"tokenizer": "byte", "vocab_size": 257}
    )
    assert main(["generate", "--ckpt", str(same), "--max-new-tokens", "2"]) == 0


def test_a_tokenizer_with_more_ids_than_the_model_is_refused_by_every_reader(
    capsys, tmp_path, data
):
    """A checkpoint that names no tokenizer (written before they were recorded) with a
    folder whose tokenizer has more ids than the model embeds: eval, generate and GLUE
    would index past the embedding (a device-side assert on CUDA)."""
    ckpt = write_checkpoint(tmp_path / "small.ckpt", str(data), vocab_size=200)
    expected = (
        f"{data} holds a byte tokenizer of 257 ids, more ids than {ckpt}'s model has (200): "
        "give the data folder the model trained on (--tokenizer DIR)"
    )
    line = one_line_error(capsys, ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2"])
    assert line == f"cofr generate: error: {expected}"
    with pytest.raises(pretrained.TokenizerMismatch, match="more ids than"):
        assert pretrained.load_checkpoint(ckpt, "cpu", str(data)).tokenizer is None


def test_a_bpe_tokenizer_trained_again_with_the_same_size_is_refused(capsys, tmp_path):
    """Same kind, same size, other merges (a folder prepared again on another split):
    its ids mean other text. The tokenizer file's digest tells them apart."""
    from cofrgenet.data import PydocSource, prepare_data
    from cofrgenet.data.meta import tokenizer_digest

    folders = []
    for seed in (1, 2):
        out = tmp_path / f"bpe-{seed}"
        prepare_data(PydocSource(), out, tokenizer="bpe", vocab_size=280, max_docs=20,
                     seed=seed, num_workers=1)  # fmt: skip
        folders.append(out)
    first, second = folders
    assert tokenizer_digest(first) != tokenizer_digest(second)
    trained_with = {
        "tokenizer": "bpe",
        "vocab_size": 280,
        "tokenizer_sha256": tokenizer_digest(first),
    }
    ckpt = write_checkpoint(
        tmp_path / "bpe.ckpt", str(first), trained_with=trained_with, vocab_size=280
    )
    argv = ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2", "--tokenizer"]
    line = one_line_error(capsys, [*argv, str(second)])
    assert (
        f"{second} holds a bpe tokenizer of 280 ids, and {ckpt} was trained with another one "
        in line
    )
    assert "(their tokenizer.json files differ)" in line
    assert main([*argv, str(first)]) == 0


def test_a_run_keeps_its_tokenizer_when_the_data_folder_is_prepared_again(capsys, tmp_path):
    """The run folder's copy of the tokenizer (made at the run's start) serves when the
    data folder was prepared again with other merges, or is gone: the checkpoints were
    useless without the original folder. A checkpoint copied into a run folder whose copy
    is another tokenizer's falls back to its data folder (and its checks)."""
    from cofrgenet.data import PydocSource, prepare_data
    from cofrgenet.data.meta import copy_tokenizer, tokenizer_digest

    data = tmp_path / "bpe"
    prepare_data(PydocSource(), data, tokenizer="bpe", vocab_size=280, max_docs=20, seed=1,
                 num_workers=1)  # fmt: skip
    trained_with = {
        "tokenizer": "bpe",
        "vocab_size": 280,
        "tokenizer_sha256": tokenizer_digest(data),
    }
    run = tmp_path / "runs" / "exp" / "run"
    ckpt = write_checkpoint(
        run / "checkpoints" / "last.ckpt", str(data), trained_with=trained_with, vocab_size=280
    )
    (run / "config.yaml").write_text("run:\n  runs_dir: runs\n")  # a run folder
    assert copy_tokenizer(data, run / "tokenizer")
    assert not copy_tokenizer(data, run / "tokenizer")  # an existing copy stays
    assert tokenizer_digest(run / "tokenizer") == trained_with["tokenizer_sha256"]
    prepare_data(PydocSource(), data, tokenizer="bpe", vocab_size=280, max_docs=20, seed=2,
                 num_workers=1, overwrite=True)  # fmt: skip
    assert tokenizer_digest(data) != trained_with["tokenizer_sha256"]
    argv = ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2", "--prompt", "def"]
    assert main(argv) == 0
    assert main([*argv, "--tokenizer", str(run / "tokenizer")]) == 0
    again = tmp_path / "again"  # the copy serves as --tokenizer-from
    prepare_data(PydocSource(), again, tokenizer_from=run / "tokenizer", max_docs=20,
                 num_workers=1)  # fmt: skip
    assert tokenizer_digest(again) == trained_with["tokenizer_sha256"]
    shutil.rmtree(data)
    assert main(argv) == 0
    capsys.readouterr()
    # Another tokenizer's copy beside a foreign checkpoint: not taken.
    other = tmp_path / "other"
    prepare_data(PydocSource(), other, tokenizer="bpe", vocab_size=280, max_docs=20, seed=3,
                 num_workers=1)  # fmt: skip
    shutil.rmtree(run / "tokenizer")
    copy_tokenizer(other, run / "tokenizer")
    line = one_line_error(capsys, argv)
    assert f"its training data folder {data}, which is not on this machine" in line


def test_a_relative_data_folder_is_found_from_another_folder(
    capsys, tmp_path, run_folder, monkeypatch
):
    """A run trained in proj/ with --data.data_dir pyd: read from anywhere else."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ckpt = run_folder / "checkpoints" / "last.ckpt"
    argv = ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "3", "--prompt", "def"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("def")
    # Tried relative to the current folder first, then above the run folder.
    tried = pretrained.data_dir_candidates("pyd", ckpt, run_folder)
    assert tried[:4] == [
        elsewhere / "pyd",
        run_folder.parent / "pyd",
        tmp_path / "proj" / "runs" / "pyd",
        tmp_path / "proj" / "pyd",
    ]
    assert pretrained.data_dir_candidates("/abs/pyd", ckpt, run_folder) == [Path("/abs/pyd")]
    # A run folder given relative to the current folder: each place once.
    monkeypatch.chdir(tmp_path / "proj")
    relative = run_folder.relative_to(tmp_path / "proj")
    tried = pretrained.data_dir_candidates("pyd", ckpt, relative)
    assert (
        len({p.absolute() for p in tried}) == len(tried) and tried[0] == tmp_path / "proj" / "pyd"
    )


def test_a_byte_checkpoint_needs_no_data_folder(capsys, tmp_path):
    """Bytes need no files: a checkpoint trained on them generates (and exports its
    tokenizer) with its data folder gone."""
    trained_with = {"tokenizer": "byte", "vocab_size": 257}
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", str(tmp_path / "gone"), trained_with)
    argv = ["generate", "--ckpt", str(ckpt), "--max-new-tokens", "3", "--prompt", "def"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("def")


def test_a_relative_data_folder_not_found_lists_the_paths_tried(
    capsys, tmp_path, run_folder, monkeypatch
):
    shutil.rmtree(tmp_path / "proj" / "pyd")
    monkeypatch.chdir(tmp_path)
    ckpt = run_folder / "checkpoints" / "last.ckpt"
    line = one_line_error(capsys, ["generate", "--ckpt", str(ckpt)])
    assert "training data folder 'pyd' (relative to where it was trained)" in line
    for tried in (tmp_path / "pyd", tmp_path / "proj" / "pyd", run_folder.parent / "pyd"):
        assert str(tried) in line
    assert line.endswith("or pass --tokenizer DIR")


# ------------------------------------------------------------- cofr models list


def test_models_list_into_a_pipe_prints_whole_names(capsys, monkeypatch):
    from cofrgenet.models import list_presets

    monkeypatch.setenv("COLUMNS", "80")  # what a pipe gets
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    shown = {line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")}
    assert shown == set(list_presets())


def test_models_list_with_a_filter_matching_nothing_is_an_error(capsys):
    assert main(["models", "list", "--filter", "gpt2-tinyy"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no empty table
    assert captured.err.strip() == (
        "cofr models list: error: no preset matches --filter 'gpt2-tinyy' (did you mean "
        "'gpt2-tiny'?); `cofr models list` lists them all"
    )
    # A part of names, as a filter is (it suggested gpt2-xl for gtp2), or nothing.
    line = one_line_error(capsys, ["models", "list", "--filter", "gtp2"])
    assert "(did you mean 'gpt2'?)" in line
    line = one_line_error(capsys, ["models", "list", "--filter", "nomatch"])
    assert line.endswith("no preset matches --filter 'nomatch'; `cofr models list` lists them all")
    assert main(["models", "list", "--filter", "GPT2-TINY-F"]) == 0  # any case
    assert "gpt2-tiny-f" in capsys.readouterr().out


def sampling_ids(ids: list[int], interrupt: bool = False, terminate: bool = False):
    """A stand-in for ``generate.sample`` that draws ``ids`` (then, with ``interrupt``, is
    stopped by a Ctrl-C; with ``terminate``, the process gets a SIGTERM), handing each to
    ``on_token`` as the real one does."""

    def sample(model, idx, max_new_tokens, *args, on_token=None, **kwargs):
        new = torch.tensor([ids[:max_new_tokens]] * idx.shape[0])
        for i in range(new.shape[1]):
            if on_token is not None:
                on_token(new[:, i : i + 1])
        if interrupt:
            raise KeyboardInterrupt
        if terminate:
            os.kill(os.getpid(), signal.SIGTERM)
        return torch.cat([idx, new], dim=1)

    return sample


def test_a_sample_cut_at_the_end_of_text_says_so(capsys, tmp_path, data, monkeypatch):
    """Fewer tokens than --max-new-tokens: a line says why, on stderr (it was written into
    the sample's text on stdout, so into a file it was sent to)."""
    from cofrgenet.training import generate

    monkeypatch.setattr(generate, "sample", sampling_ids([65, 66, 256, 67]))  # AB, EOS, C
    ckpt = write_checkpoint(
        tmp_path / "byte.ckpt", str(data), trained_with={"tokenizer": "byte", "vocab_size": 257}
    )
    args = ["generate", "--ckpt", str(ckpt), "--prompt", "x", "--max-new-tokens", "4"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert captured.out == "xAB\n"
    assert captured.err == "[end of text after 2 tokens; --past-eos samples on]\n"
    assert main([*args, "--past-eos"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("xAB") and captured.out.endswith("C\n")
    assert "end of text" not in captured.err
    # Without a prompt the sample starts a document: the EOS it starts from is not shown.
    assert main(["generate", "--ckpt", str(ckpt), "--max-new-tokens", "2"]) == 0
    assert capsys.readouterr().out == "AB\n"
    # Several samples: each whole, under one another.
    assert main([*args, "--num-samples", "2"]) == 0
    assert capsys.readouterr().out == "xAB\n" + "-" * 40 + "\n" + "xAB\n" + "-" * 40 + "\n"


def test_a_sample_is_written_as_it_is_drawn_and_kept_on_ctrl_c(capsys, tmp_path, data, monkeypatch):
    """`cofr generate --max-new-tokens 100000 > out`, then Ctrl-C: out was empty (the text
    was written once all of it was drawn). A character's bytes are written together."""
    from cofrgenet.training import generate

    e_acute = list("é".encode())  # two byte ids, one character
    monkeypatch.setattr(generate, "sample", sampling_ids([65, *e_acute, 66], interrupt=True))
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", str(data))
    written: list[str] = []
    out = SimpleNamespace(write=written.append, flush=lambda: None)
    stream = generate.StreamedText(ByteTokenizer(), out, past_eos=False)
    for token in [65, *e_acute, 66]:
        stream.add(torch.tensor([[token]]))
    assert written == ["A", "é", "B"]  # never half of é
    args = ["generate", "--ckpt", str(ckpt), "--prompt", "x", "--max-new-tokens", "9"]
    assert main(args) == 130
    captured = capsys.readouterr()
    assert captured.out == "xAéB\n" and captured.err == "cofr: interrupted\n"


def test_a_stop_keeps_what_was_drawn_of_several_samples_and_sigterm_is_said(
    capsys, tmp_path, data, monkeypatch
):
    """`--num-samples 2` stopped by Ctrl-C wrote nothing of what was drawn; a SIGTERM
    (`kill PID`, a job's time limit) ended any generate with no word and lost a single
    sample's held-back ids."""
    from cofrgenet.training import generate

    ckpt = write_checkpoint(tmp_path / "byte.ckpt", str(data))
    args = ["generate", "--ckpt", str(ckpt), "--prompt", "x", "--max-new-tokens", "9"]
    monkeypatch.setattr(generate, "sample", sampling_ids([65, 66], interrupt=True))
    assert main([*args, "--num-samples", "2"]) == 130
    captured = capsys.readouterr()
    assert captured.out == ("xAB\n" + "-" * 40 + "\n") * 2
    assert captured.err == "[stopped after 2 tokens]\ncofr: interrupted\n"
    e_acute = list("é".encode())
    monkeypatch.setattr(generate, "sample", sampling_ids([65, e_acute[0]], terminate=True))
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 143
    captured = capsys.readouterr()  # the half character held back is written at the end
    assert captured.out == "xA\ufffd\n" and captured.err == "cofr: terminated\n"


def test_a_tokenizer_folder_needs_only_meta_json_and_its_tokenizer(
    capsys, tmp_path, data, monkeypatch
):
    """The error for a run whose data folder is elsewhere says "copy that folder's meta.json
    and tokenizer/ here, or pass --tokenizer DIR": doing so was refused as half-written
    (train/index.json missing), then as damaged (its chunks)."""
    from cofrgenet.training import generate

    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(data / "meta.json", only / "meta.json")
    monkeypatch.setattr(generate, "sample", sampling_ids([65]))
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", None)
    assert main(["generate", "--ckpt", str(ckpt), "--tokenizer", str(only)]) == 0
    assert capsys.readouterr().out == "A\n"


def test_a_prompt_that_is_no_utf8_is_one_line(capsys, tmp_path, data):
    """Bytes that are no UTF-8 reach argv as lone surrogates: the byte tokenizer raised
    UnicodeEncodeError, the BPE ones `TypeError: TextInputSequence must be str`."""
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", str(data))
    line = one_line_error(capsys, ["generate", "--ckpt", str(ckpt), "--prompt", "caf\udcc3"])
    assert line.startswith(
        "cofr generate: error: --prompt is not UTF-8 text (a byte that is none at character 4)"
    )


def test_a_checkpoint_of_nan_weights_is_one_line_not_nul_bytes(capsys, tmp_path, data):
    """A diverged run's weights: sampling raised torch's "probability tensor contains
    either inf, nan or element < 0"; greedy decoding printed NUL bytes (id 0), exit 0."""
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", str(data))
    saved = torch.load(ckpt, weights_only=True)
    saved["state_dict"]["model.transformer.wte.weight"][3] = float("nan")
    torch.save(saved, ckpt)
    for extra in ([], ["--temperature", "0"]):
        args = ["generate", "--ckpt", str(ckpt), "--prompt", "\x03", *extra]
        line = one_line_error(capsys, args)
        assert line == (
            f"cofr generate: error: {ckpt}: the model's logits hold NaN (after 1 token): 1 of "
            "its weight tensors hold NaN or Inf (transformer.wte.weight, ...), as a run that "
            "diverged saves them; sample from an earlier checkpoint of the run"
        )
    assert capsys.readouterr().out == ""


def test_generate_reads_at_most_the_length_the_model_trained_at(capsys, tmp_path, monkeypatch):
    """A run trained on 8-token sequences with a 16-token block: later positions never
    trained, so the context is cropped at 8 (as cofr eval's windows), and it is said."""
    from cofrgenet.training import generate

    seen = []
    real_sample = generate.sample

    def spy(model, idx, max_new_tokens, block_size, **kwargs):
        seen.append(block_size)
        return real_sample(model, idx, max_new_tokens, block_size, **kwargs)

    monkeypatch.setattr(generate, "sample", spy)
    byte = {"tokenizer": "byte", "vocab_size": 257}
    ckpt = write_checkpoint(tmp_path / "short.ckpt", None, byte, trained_length=8)
    argv = ["generate", "--ckpt", str(ckpt), "--prompt", "abc", "--max-new-tokens"]
    assert main([*argv, "10"]) == 0
    assert seen == [8]
    assert "note: reading at most the last 8 tokens" in capsys.readouterr().err
    assert main([*argv, "5"]) == 0  # 3 + 5 tokens fit: nothing to say
    assert seen == [8, 8] and "note" not in capsys.readouterr().err
    # A recurrent model reads the whole sequence through its state: no window to note.
    lstm = write_checkpoint(
        tmp_path / "lstm.ckpt", None, byte, trained_length=8, preset="lstm-tiny"
    )
    assert main(["generate", "--ckpt", str(lstm), "--prompt", "abc", "--max-new-tokens", "10"]) == 0
    assert "note" not in capsys.readouterr().err


def test_generate_runs_auto_ladders_eagerly_on_cpu(tmp_path, monkeypatch):
    """`auto` ladders compiled on CPU past a size: a CAttnU model's first full window
    took 5.5 s of a 10.7 s generation (6.6 s eager), outputs the same."""
    from cofrgenet.nn import LadderLayer
    from cofrgenet.training import generate

    seen = []
    real_sample = generate.sample

    def spy(model, *args, **kwargs):
        seen.append({m.impl for m in model.modules() if isinstance(m, LadderLayer)})
        return real_sample(model, *args, **kwargs)

    monkeypatch.setattr(generate, "sample", spy)
    byte = {"tokenizer": "byte", "vocab_size": 257}
    ckpt = write_checkpoint(tmp_path / "f.ckpt", None, byte, preset="gpt2-tiny-fa")
    argv = ["generate", "--ckpt", str(ckpt), "--prompt", "abc", "--max-new-tokens", "3"]
    assert main(argv) == 0
    assert seen == [{"continuant"}]


def test_ladders_running_sets_the_chosen_ladders_and_restores_them():
    from cofrgenet.nn import LadderLayer
    from cofrgenet.nn.ladder import ladders_running

    model = build_model(resolve_model_config("gpt2-tiny-fa", MODEL))
    ladders = [m for m in model.modules() if isinstance(m, LadderLayer)]
    ladders[0].impl = "literal"  # chosen by hand: kept under only="auto"
    with pytest.raises(KeyError), ladders_running(model, "continuant", only="auto"):
        assert [m.impl for m in ladders] == ["literal", *["continuant"] * (len(ladders) - 1)]
        raise KeyError  # restored however the block ends
    assert [m.impl for m in ladders] == ["literal", *["auto"] * (len(ladders) - 1)]


def test_a_prompt_longer_than_the_context_is_noted(capsys, tmp_path):
    """A prompt past the model's block was cropped to its last tokens, unsaid."""
    byte = {"tokenizer": "byte", "vocab_size": 257}
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", None, byte)
    block = MODEL["block_size"]
    prompt = "x" * (block + 5)
    argv = ["generate", "--ckpt", str(ckpt), "--prompt", prompt, "--max-new-tokens", "2"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"note: the prompt is {block + 5} tokens; the model reads its last {block}" in err


@pytest.mark.parametrize("command", ["generate", "eval", "export"])
def test_a_second_checkpoint_is_refused_not_dropped(capsys, command):
    """`--ckpt a --ckpt b` read b, a dropped without a word (a second --prompt is refused)."""
    words = ["export", "hf"] if command == "export" else [command]
    line = one_line_error(capsys, [*words, "--ckpt", "a.ckpt", "--ckpt", "b.ckpt"])
    assert "error: --ckpt given twice (a.ckpt and b.ckpt): give one" in line


def test_a_second_prompt_is_refused_not_dropped(capsys, tmp_path):
    """`--prompt A --prompt B` continued B alone, A dropped without a word."""
    ckpt = write_checkpoint(tmp_path / "byte.ckpt", None, {"tokenizer": "byte", "vocab_size": 257})
    line = one_line_error(
        capsys, ["generate", "--ckpt", str(ckpt), "--prompt", "A", "--prompt", "B"]
    )
    assert line == (
        "cofr generate: error: --prompt given 2 times: give one prompt per command "
        "(--num-samples N draws N continuations of it)"
    )


def test_a_checkpoint_recorded_with_settings_its_arch_never_read_still_loads(capsys, tmp_path):
    """An LSTM run given transformer-only settings (ignored then, refused in new configs
    now) keeps loading: they changed nothing of its network, so they are dropped."""
    from cofrgenet.training.model_options import fit_model_config, model_config_of

    byte = {"tokenizer": "byte", "vocab_size": 257}
    ckpt = write_checkpoint(tmp_path / "lstm.ckpt", None, byte, preset="lstm-tiny")
    saved = torch.load(ckpt, weights_only=True)
    saved["hyper_parameters"]["config"] |= {"n_kv_head": 4, "attention": "cattn_m"}
    torch.save(saved, ckpt)
    argv = ["generate", "--ckpt", str(ckpt), "--prompt", "ab", "--max-new-tokens", "2"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("ab")
    recorded = model_config_of({"preset": "lstm-tiny", "config": MODEL}).to_dict()
    saved["model_config"] = {**recorded, "norm": "rmsnorm"}  # as to_dict() recorded it
    torch.save(saved, ckpt)
    assert main(argv) == 0
    # A new run's config is refused: there the setting is a mistake.
    with pytest.raises(ConfigError, match=r"model.config: arch 'lstm' has no attention"):
        fit_model_config({"preset": "lstm-tiny", "config": {"attention": "cattn_m"}})

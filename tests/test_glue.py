"""``cofr finetune glue``: the GLUE readers on the original files' layouts, the metrics,
the tokenisation, and one end-to-end fine-tune of a tiny checkpoint tracked in MLflow."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import warnings
from pathlib import Path

import pytest

from cofrgenet.cli import main as cofr
from cofrgenet.errors import UserError
from cofrgenet.eval.glue import (
    FinetuneConfig,
    accuracy,
    collate,
    f1_score,
    matthews_corrcoef,
    pool_last,
    strip_lm_head,
    task_metrics,
)
from cofrgenet.eval.glue_data import (
    TASKS,
    Example,
    GlueDataNotFound,
    GlueFormatError,
    encode_examples,
    read_task_tsv,
    truncate_pair,
)
from cofrgenet.training.optim import warmup_linear
from eval_helpers import tiny_byte_data, trained_checkpoint, unloadable_checkpoint

# ------------------------------------------------ tiny files in the original GLUE layouts

MNLI_TRAIN_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label"
)
MNLI_DEV_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
    "label5\tgold_label"
)


def _mnli_row(i: int, premise: str, hypothesis: str, labels: list[str]) -> str:
    parse = f"( ( {premise} ) )"
    return "\t".join(
        [str(i), "31193", f"{i}n", "government", parse, parse, parse, parse, premise,
         hypothesis, *labels]
    )  # fmt: skip


#: task -> {file name: text}, each with the real header (or none) and column order.
GLUE_FILES: dict[str, dict[str, str]] = {
    "sst2": {
        "train.tsv": "sentence\tlabel\nhide new secretions from the parental units \t0\n"
        "that loves its characters and communicates something rather beautiful \t1\n",
        "dev.tsv": "sentence\tlabel\nit 's a charming and often affecting journey . \t1\n",
    },
    "cola": {  # no header: source, label, original annotation, sentence
        "train.tsv": "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one.\n"
        "gj04\t0\t*\tThey drank the pub.\n",
        "dev.tsv": "gj04\t1\t\tThe sailors rode the breeze clear of the rocks.\n"
        'cj99\t0\t*\tThe more "we study, the.\n',
    },
    "mnli": {
        "train.tsv": "\n".join(
            [
                MNLI_TRAIN_HEADER,
                _mnli_row(
                    0,
                    "Conceptually cream skimming has two dimensions.",
                    "Product and geography are what make cream skimming work.",
                    ["neutral", "neutral"],
                ),
                _mnli_row(
                    1,
                    "you know during the season",
                    "You lose the things.",
                    ["entailment", "entailment"],
                ),
            ]
        )
        + "\n",
        "dev_matched.tsv": "\n".join(
            [
                MNLI_DEV_HEADER,
                _mnli_row(
                    2,
                    "The new rights are nice enough",
                    "Everyone really likes them.",
                    ["neutral", "entailment", "neutral", "neutral", "neutral", "neutral"],
                ),
            ]
        )
        + "\n",
        "dev_mismatched.tsv": "\n".join(
            [
                MNLI_DEV_HEADER,
                _mnli_row(
                    3,
                    "Your contribution helped.",
                    "Your contribution did not help.",
                    ["contradiction"] * 6,
                ),
                _mnli_row(4, "He went home.", "He left.", ["entailment"] * 6),
            ]
        )
        + "\n",
    },
    "qqp": {
        "train.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "133273\t213221\t213222\tHow is the life of a math student?\tWhich level of "
        "prepration is enough?\t0\n"
        "402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control "
        "your horniness?\t1\n"
        "201841\t303951\t174703\tWhat can one do after MBBS?\n",  # a cut row, as in QQP's file
        "dev.tsv": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        "40\t81\t82\tWhy are they so tall?\tWhy are they tall?\t1\n",
    },
    "qnli": {
        "train.tsv": "index\tquestion\tsentence\tlabel\n"
        "0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it.\t"
        "not_entailment\n"
        "1\tWhich missile batteries often have individual launchers?\tThe missiles are "
        "launched from individual launchers.\tentailment\n",
        "dev.tsv": "index\tquestion\tsentence\tlabel\n"
        "0\tWhat came into force after the new constitution?\tThe Senate came into force.\t"
        "entailment\n",
    },
    "mrpc": {  # MRPC's files start with a byte-order mark
        "train.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother.\tReferring to him, Amrozi accused "
        "his brother.\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's .\n",
        "dev.tsv": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t1355540\t1355592\tHe said the foodservice pie business doesn 't fit.\tThe "
        "foodservice pie business does not fit.\n",
    },
    "rte": {
        "train.tsv": "index\tsentence1\tsentence2\tlabel\n"
        "0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction "
        "Found in Iraq.\tnot_entailment\n"
        "1\tA place of sorrow.\tPope Benedict XVI is the new leader.\tentailment\n",
        "dev.tsv": "index\tsentence1\tsentence2\tlabel\n"
        "0\tDana Reeve died.\tChristopher Reeve had an accident.\tnot_entailment\n",
    },
}


def write_glue(root: Path, tasks: list[str] | None = None) -> Path:
    """The GLUE files of ``tasks`` under ``root/<Folder>/`` as the original distribution."""
    for name in tasks or list(GLUE_FILES):
        folder = root / TASKS[name].folder
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in GLUE_FILES[name].items():
            (folder / file).write_text(text, encoding="utf-8")
    return root


# ------------------------------------------------------------------------------ readers


def test_every_task_reads_its_original_layout(tmp_path):
    data_dir = write_glue(tmp_path)
    expected = {
        "sst2": (
            [Example("hide new secretions from the parental units ", None, 0),
             Example("that loves its characters and communicates something rather beautiful ",
                     None, 1)],
            {"dev": [Example("it 's a charming and often affecting journey . ", None, 1)]},
        ),
        "cola": (
            [Example("Our friends won't buy this analysis, let alone the next one.", None, 1),
             Example("They drank the pub.", None, 0)],
            {"dev": [Example("The sailors rode the breeze clear of the rocks.", None, 1),
                     Example('The more "we study, the.', None, 0)]},
        ),
        "mnli": (
            [Example("Conceptually cream skimming has two dimensions.",
                     "Product and geography are what make cream skimming work.", 1),
             Example("you know during the season", "You lose the things.", 0)],
            {"dev_matched": [Example("The new rights are nice enough",
                                     "Everyone really likes them.", 1)],
             "dev_mismatched": [Example("Your contribution helped.",
                                        "Your contribution did not help.", 2),
                                Example("He went home.", "He left.", 0)]},
        ),
        "qqp": (
            [Example("How is the life of a math student?", "Which level of prepration is enough?",
                     0),
             Example("How do I control my horny emotions?", "How do you control your horniness?",
                     1)],
            {"dev": [Example("Why are they so tall?", "Why are they tall?", 1)]},
        ),
        "qnli": (
            [Example("When did the third Digimon series begin?",
                     "Unlike the two seasons before it.", 1),
             Example("Which missile batteries often have individual launchers?",
                     "The missiles are launched from individual launchers.", 0)],
            {"dev": [Example("What came into force after the new constitution?",
                             "The Senate came into force.", 0)]},
        ),
        "mrpc": (
            [Example("Amrozi accused his brother.", "Referring to him, Amrozi accused his brother.",
                     1),
             Example("Yucaipa owned Dominick 's .", "Yucaipa bought Dominick 's .", 0)],
            {"dev": [Example("He said the foodservice pie business doesn 't fit.",
                             "The foodservice pie business does not fit.", 1)]},
        ),
        "rte": (
            [Example("No Weapons of Mass Destruction Found in Iraq Yet.",
                     "Weapons of Mass Destruction Found in Iraq.", 1),
             Example("A place of sorrow.", "Pope Benedict XVI is the new leader.", 0)],
            {"dev": [Example("Dana Reeve died.", "Christopher Reeve had an accident.", 1)]},
        ),
    }  # fmt: skip
    for name, (train, dev) in expected.items():
        data = read_task_tsv(TASKS[name], data_dir)
        assert data.train == train, name
        assert data.dev == dev, name
        assert data.source == f"tsv:{data_dir / TASKS[name].folder}"
    qqp = read_task_tsv(TASKS["qqp"], data_dir)
    assert list(qqp.skipped) == [str(data_dir / "QQP" / "train.tsv")]  # the cut row
    assert len(qqp.skipped[str(data_dir / "QQP" / "train.tsv")]) == 1


def test_a_task_folder_itself_is_accepted(tmp_path):
    write_glue(tmp_path, ["sst2"])
    assert len(read_task_tsv(TASKS["sst2"], tmp_path / "SST-2").train) == 2


@pytest.mark.parametrize(("task", "missing"), [("sst2", "dev.tsv"), ("mnli", "dev_mismatched.tsv")])
def test_a_missing_file_names_its_path_and_source(tmp_path, task, missing):
    write_glue(tmp_path, [task])
    path = tmp_path / TASKS[task].folder / missing
    path.unlink()
    with pytest.raises(GlueDataNotFound) as error:
        read_task_tsv(TASKS[task], tmp_path)
    message = str(error.value)
    assert str(path) in message and "gluebenchmark.com" in message and "datasets" in message
    assert "\n" not in message


def test_the_cli_reports_a_missing_file_in_one_line(tmp_path, capsys):
    unloadable_checkpoint(tmp_path / "x.ckpt")  # the checkpoint is checked first (before any data)
    status = cofr(
        ["finetune", "glue", "--task", "rte", "--ckpt", str(tmp_path / "x.ckpt"),
         "--data-dir", str(tmp_path)]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert err.startswith("cofr finetune glue: error: no GLUE RTE train file at ")
    assert str(tmp_path / "RTE" / "train.tsv") in err and len(err.splitlines()) == 1


def test_a_missing_checkpoint_is_said_before_the_hub_is_probed(tmp_path, capsys, monkeypatch):
    """`--ckpt nosuch.ckpt` without the hub: its "note: the Hugging Face hub does not
    answer" came first, then the error about the checkpoint (checked before any data)."""
    import cofrgenet.eval.glue as glue

    probed = []

    def offline_hub() -> str:
        probed.append(True)
        print("note: the Hugging Face hub does not answer", file=sys.stderr)
        return "huggingface.co: no network"

    monkeypatch.setattr(glue, "offline_unless_reachable", offline_hub)
    missing = tmp_path / "nosuch.ckpt"
    assert cofr(["finetune", "glue", "--task", "sst2", "--ckpt", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cofr finetune glue: error: no checkpoint file at {missing}")
    assert len(err.splitlines()) == 1 and not probed


@pytest.mark.parametrize("option", ["--experiment", "--name"])
def test_a_name_its_folder_would_not_keep_is_refused_first(tmp_path, capsys, option):
    """runs/<experiment>/<name>: "my exp" would share runs/my-exp with "my-exp"."""
    status = cofr(
        ["finetune", "glue", "--task", "rte", "--ckpt", str(tmp_path / "none.ckpt"), option,
         "my exp"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert f"{option} 'my exp' is not a folder name as given" in err and "'my-exp'" in err


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(
    "option, value, problem",
    [
        ("--precision", "foo", "Precision 'foo' is invalid. Allowed precision values: "),
        ("--accelerator", "nope", "You selected an invalid accelerator name"),
        pytest.param(
            "--accelerator",
            "gpu",
            "No supported gpu backend found; leave it out (auto) or give one this machine has",
            marks=pytest.mark.skipif(_cuda(), reason="this machine has a GPU"),
        ),
    ],
)
def test_trainer_options_lightning_refuses_are_one_line_errors_before_the_data(
    tmp_path, capsys, monkeypatch, option, value, problem
):
    import cofrgenet.eval.glue as glue

    def no_data(*args, **kwargs):
        raise AssertionError("read the GLUE data before checking the trainer options")

    monkeypatch.setattr(glue, "load_task", no_data)
    unloadable_checkpoint(tmp_path / "x.ckpt")
    argv = ["finetune", "glue", "--task", "sst2", "--ckpt", str(tmp_path / "x.ckpt")]
    status = cofr([*argv, "--no-mlflow", option, value])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"cofr finetune glue: error: {option} {value}: {problem}")
    settings = {"accelerator": "auto", "precision": "32-true", option[2:]: value}
    with pytest.raises(UserError, match=f"^{option} {value}: "):  # finetune() checks them too
        glue.check_trainer_options(**settings)


def test_a_tracking_uri_with_no_mlflow_is_refused(tmp_path, capsys):
    """Contradictory: the user meant one of them (cofr eval refuses options that do not
    apply, for this reason)."""
    argv = ["finetune", "glue", "--task", "sst2", "--ckpt", str(tmp_path / "x.ckpt")]
    assert cofr([*argv, "--no-mlflow", "--tracking-uri", "sqlite:///x.db"]) == 2
    assert "--tracking-uri names the MLflow store, and --no-mlflow logs nothing" in (
        capsys.readouterr().err
    )


def test_a_file_without_the_expected_columns_says_which(tmp_path):
    folder = tmp_path / "RTE"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n")
    (folder / "dev.tsv").write_text(GLUE_FILES["rte"]["dev.tsv"])
    with pytest.raises(GlueFormatError, match=r"no column\(s\) \['sentence1', 'sentence2'\]"):
        read_task_tsv(TASKS["rte"], tmp_path)


def test_a_file_whose_rows_are_mostly_malformed_is_refused(tmp_path):
    """Another task's file, or a damaged one: it read with a warning, as a handful of
    examples."""
    folder = tmp_path / "SST-2"
    folder.mkdir()
    rows = "".join(f"a film {i}\tmaybe\n" for i in range(5))
    (folder / "train.tsv").write_text(f"sentence\tlabel\na fine film\t1\n{rows}")
    (folder / "dev.tsv").write_text(GLUE_FILES["sst2"]["dev.tsv"])
    with pytest.raises(GlueFormatError, match=r"train\.tsv: 5 of its 6 rows lack the columns"):
        read_task_tsv(TASKS["sst2"], tmp_path)


def test_cola_without_labels_is_not_read_as_empty(tmp_path):
    folder = tmp_path / "CoLA"
    folder.mkdir()
    (folder / "train.tsv").write_text("index\tsentence\n0\tBill whistled past the house.\n")
    (folder / "dev.tsv").write_text(GLUE_FILES["cola"]["dev.tsv"])
    with pytest.raises(GlueFormatError, match="none of its"):
        read_task_tsv(TASKS["cola"], tmp_path)  # CoLA's test.tsv layout given as train


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ("sentence\tlabel\n", "train.tsv has no examples under its header"),
        ("", "train.tsv is empty: expected a header row"),
        ("sentence\tlabel\nun caf\xe9 sans sucre\t1\n", r"not UTF-8 text \(byte 0xe9 on line 2\)"),
    ],
)
def test_an_empty_or_latin1_file_is_named(tmp_path, train, message):
    """A header-only file gave no examples and a fine-tune of nothing; Latin-1 gave a
    UnicodeDecodeError traceback."""
    folder = tmp_path / "SST-2"
    folder.mkdir()
    (folder / "train.tsv").write_bytes(train.encode("latin-1"))
    (folder / "dev.tsv").write_text("sentence\tlabel\na fine film\t1\n")
    with pytest.raises(GlueFormatError, match=message):
        read_task_tsv(TASKS["sst2"], tmp_path)


def test_a_headerless_cola_file_without_rows_is_named(tmp_path):
    folder = tmp_path / "CoLA"
    folder.mkdir()
    (folder / "train.tsv").write_text(GLUE_FILES["cola"]["train.tsv"])
    (folder / "dev.tsv").write_text("\n")
    with pytest.raises(GlueFormatError, match=r"dev.tsv has no examples$"):
        read_task_tsv(TASKS["cola"], tmp_path)


def test_skipped_rows_are_said_before_the_fine_tuning(pretrained, tmp_path, monkeypatch, capsys):
    import cofrgenet.eval.glue as glue_module

    glue = _tiny_sst2(tmp_path / "glue")
    lines = len((glue / "SST-2" / "dev.tsv").read_text().splitlines())
    with open(glue / "SST-2" / "dev.tsv", "a") as fh:
        fh.write("a film with no label\n\na film\tmaybe\n")  # a blank line between
    said = []

    def finetune(*args, **kwargs):
        said.append(capsys.readouterr().err)
        raise UserError("stopped here")

    monkeypatch.setattr(glue_module, "finetune", finetune)
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir", str(glue),
         "--accelerator", "cpu", "--no-progress"]
    )  # fmt: skip
    assert status == 2
    assert f"warning: {glue / 'SST-2' / 'dev.tsv'}: skipped 2 malformed rows" in said[0]
    assert (
        f"(lines {lines + 1}, {lines + 3}: too few columns, or a label not in ['0', '1'])"
        in (said[0])
    )


# ------------------------------------------------------------------------------ metrics


def test_metrics_on_known_predictions():
    labels = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    preds = [1, 1, 1, 0, 1, 1, 0, 0, 0, 0]  # TP 3, FN 1, FP 2, TN 4
    assert accuracy(preds, labels) == pytest.approx(0.7)
    assert f1_score(preds, labels) == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))
    expected_mcc = (3 * 4 - 2 * 1) / ((3 + 2) * (3 + 1) * (4 + 2) * (4 + 1)) ** 0.5
    assert matthews_corrcoef(preds, labels) == pytest.approx(expected_mcc)
    assert matthews_corrcoef(labels, labels) == pytest.approx(1.0)
    assert matthews_corrcoef([1 - y for y in labels], labels) == pytest.approx(-1.0)
    assert matthews_corrcoef([1] * 10, labels) == 0.0  # a constant prediction: undefined
    assert f1_score([0, 0], [0, 0]) == 0.0
    assert task_metrics(TASKS["cola"], preds, labels) == pytest.approx(
        {"accuracy": 0.7, "mcc": expected_mcc}
    )
    assert set(task_metrics(TASKS["mrpc"], preds, labels)) == {"accuracy", "f1"}
    assert set(task_metrics(TASKS["qqp"], preds, labels)) == {"accuracy", "f1"}
    assert set(task_metrics(TASKS["rte"], preds, labels)) == {"accuracy"}


def test_metrics_match_scikit_learn():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    for classes in (2, 3):
        labels = [rng.randrange(classes) for _ in range(200)]
        preds = [y if rng.random() < 0.6 else rng.randrange(classes) for y in labels]
        assert matthews_corrcoef(preds, labels) == pytest.approx(
            sklearn.matthews_corrcoef(labels, preds)
        )
        assert accuracy(preds, labels) == pytest.approx(sklearn.accuracy_score(labels, preds))
    labels = [rng.randrange(2) for _ in range(200)]
    preds = [rng.randrange(2) for _ in range(200)]
    assert f1_score(preds, labels) == pytest.approx(sklearn.f1_score(labels, preds))


# --------------------------------------------------------------------------- tokenising


class Letters:
    """A stand-in tokenizer: one id per character, EOS 0."""

    eos_id = 0
    vocab_size = 128

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]


def test_truncate_pair_cuts_the_longer_first():
    a, b = list(range(10)), list(range(100, 103))
    assert truncate_pair(a, b, 20) == (a, b)
    assert truncate_pair(a, b, 8) == (a[:5], b)
    assert truncate_pair(b, a, 8) == (b, a[:5])
    assert truncate_pair(a, list(range(100, 110)), 7) == (a[:4], list(range(100, 103)))


def test_encode_keeps_the_final_eos_within_max_length():
    examples = [Example("abcdef", None, 1), Example("abcdef", "xyz", 0), Example("ab", "c", 1)]
    ids, labels = encode_examples(examples, Letters(), max_length=6)
    assert labels == [1, 0, 1]
    assert ids[0] == [*map(ord, "abcde"), 0]
    assert ids[1] == [ord("a"), ord("b"), 0, ord("x"), ord("y"), 0]
    assert ids[2] == [ord("a"), ord("b"), 0, ord("c"), 0]
    assert all(len(seq) <= 6 and seq[-1] == 0 for seq in ids)


def test_collate_and_pool_read_the_last_real_token():
    import torch

    ids, lengths, labels = collate([([5, 6, 7], 1), ([8], 0)], pad_id=9)
    assert ids.tolist() == [[5, 6, 7], [8, 9, 9]]
    assert lengths.tolist() == [3, 1] and labels.tolist() == [1, 0]
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float).reshape(2, 3, 2)
    assert pool_last(hidden, lengths).tolist() == [hidden[0, 2].tolist(), hidden[1, 0].tolist()]


@pytest.mark.parametrize("preset", ["gpt2-tiny-f", "lstm-tiny"])
def test_the_decoder_gives_hidden_states_and_padding_does_not_change_them(preset):
    import torch

    from cofrgenet.models import ModelConfig, build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_preset(preset, vocab_size=64, block_size=16)).eval()
    tied = getattr(model, "transformer", model).wte.weight if preset == "gpt2-tiny-f" else None
    size = strip_lm_head(model)
    if tied is not None:
        assert any(p is tied for p in model.parameters())  # the embedding kept its weight
    ids = torch.randint(0, 64, (1, 5))
    padded = torch.cat([ids, torch.full((1, 3), 7)], dim=1)
    with torch.no_grad():
        hidden = model(padded)
        alone = model(ids)
    assert hidden.shape == (1, 8, size)
    torch.testing.assert_close(pool_last(hidden, torch.tensor([5])), alone[:, -1])


def test_schedule_and_config_checks():
    assert warmup_linear(0, 100, 10) == pytest.approx(0.1)
    assert warmup_linear(9, 100, 10) == pytest.approx(1.0)
    assert warmup_linear(55, 100, 10) == pytest.approx(0.5)
    assert warmup_linear(100, 100, 10) == 0.0
    assert warmup_linear(0, 10, 0) == 1.0
    with pytest.raises(UserError, match="--lr"):
        FinetuneConfig(lr=0)
    with pytest.raises(UserError, match="--max-steps"):
        FinetuneConfig(max_steps=0)
    with pytest.raises(UserError, match=r"--seed must be in \[0, 4294967295\], got -1"):
        FinetuneConfig(seed=-1)  # numpy's refusal came after the model had loaded
    with pytest.raises(UserError, match=r"--betas takes two values in \[0, 1\).*\(0\.9, 2\.0\)"):
        FinetuneConfig(betas=(0.9, 2.0))  # Adam's refusal came once Lightning had started


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny `cofr fit` checkpoint (bytes, block 32) with its run folder and MLflow run."""
    root = tmp_path_factory.mktemp("glue")
    data = tiny_byte_data(root / "data")
    return trained_checkpoint(root, data, preset="gpt2-tiny-f", steps=2)


def _tiny_sst2(root: Path) -> Path:
    rng = random.Random(0)
    words = {1: ["good", "great", "fun", "lovely"], 0: ["bad", "dull", "awful", "boring"]}
    lines = {}
    for split, count in (("train", 24), ("dev", 10)):
        rows = []
        for i in range(count):
            label = i % 2
            rows.append(f"a {rng.choice(words[label])} film \t{label}")
        lines[split] = "sentence\tlabel\n" + "\n".join(rows) + "\n"
    folder = root / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text(lines["train"])
    (folder / "dev.tsv").write_text(lines["dev"])
    return root


def test_finetune_sst2_end_to_end(pretrained, tmp_path, capsys):
    import mlflow

    glue = _tiny_sst2(tmp_path / "glue")
    out = tmp_path / "results.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = cofr(
            ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir", str(glue),
             "--batch-size", "8", "--epochs", "2", "--lr", "1e-3",
             "--accelerator", "cpu", "--no-progress", "--json", str(out), "--name", "e2e"]
        )  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0
    # the decoder trains in train mode (it was loaded in eval mode, which Lightning keeps)
    assert not [w for w in caught if "eval mode" in str(w.message)]
    assert "accuracy" in printed and "93.56 / 94.16" in printed  # the table, paper beside
    result = json.loads(out.read_text())
    assert result["steps"] == 6 and result["train_examples"] == 24 and result["epochs"] == 2
    assert set(result["metrics"]) == {"glue/sst2/accuracy"}
    accuracy_ = result["metrics"]["glue/sst2/accuracy"]
    assert 0.0 <= accuracy_ <= 1.0 and result["splits"]["dev"]["examples"] == 10

    run_dir = pretrained.parent.parent  # runs/test/run
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent.parent / 'mlflow.db'}")
    finetune_run = client.get_run(result["run_id"])
    pretrain_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert finetune_run.data.tags["cofr.pretrain_run_id"] == pretrain_id
    # The code's tags as on a pretraining run, the command under the same key.
    tags = finetune_run.data.tags
    assert tags["cofrgenet.command"].startswith("cofr finetune glue --task sst2")
    assert "cofrgenet.version" in tags and "cofr.command" not in tags
    import torch

    saved = torch.load(pretrained, map_location="cpu", weights_only=True)
    assert finetune_run.data.params["pretrain_step"] == str(saved["global_step"])
    assert client.get_experiment(finetune_run.info.experiment_id).name == "glue-sst2"
    assert finetune_run.data.params["task"] == "sst2"
    assert finetune_run.data.params["lr"] == "0.001"
    # The precision it trained in (neither said it): as given, and as Lightning took it.
    assert finetune_run.data.params["precision"] == "32-true" == result["precision"]
    history = client.get_metric_history(result["run_id"], "glue/sst2/accuracy")
    assert [m.step for m in history] == [3, 6]  # after each epoch of 3 steps
    assert history[-1].value == pytest.approx(accuracy_)
    assert "glue/sst2/loss" in finetune_run.data.metrics
    pretrain_run = client.get_run(pretrain_id)
    assert pretrain_run.data.metrics["glue/sst2/accuracy"] == pytest.approx(accuracy_)
    (logged,) = client.get_metric_history(pretrain_id, "glue/sst2/accuracy")
    assert logged.step == 2  # the checkpoint's step
    assert pretrain_run.data.tags["glue.sst2.run_id"] == result["run_id"]
    assert (
        json.loads((Path(result["run_dir"]) / "results.json").read_text())["metrics"]
        == (result["metrics"])
    )


def _fake_hub(monkeypatch, tables: dict[str, dict[str, dict[str, list]]]) -> list[tuple]:
    """``datasets.load_dataset`` answering from ``tables`` ({config: {split: columns}})
    for nyu-mll/glue and failing for any other name, as offline; returns the calls."""
    datasets = pytest.importorskip("datasets")
    calls: list[tuple] = []

    def load_dataset(name, config, cache_dir=None):
        calls.append((name, config))
        if name != "nyu-mll/glue" or config not in tables:
            raise ConnectionError(f"no route to the hub for {name}/{config}")
        return {split: datasets.Dataset.from_dict(cols) for split, cols in tables[config].items()}

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


MNLI_HUB = {
    "train": {
        "premise": ["a man sleeps", "a dog runs", "it rains"],
        "hypothesis": ["a man is awake", "an animal moves", "it is wet"],
        "label": [2, 0, 0],
        "idx": [0, 1, 2],
    },
    "validation_matched": {
        "premise": ["a cat eats"], "hypothesis": ["a cat is fed"], "label": [0], "idx": [0]
    },
    "validation_mismatched": {
        "premise": ["he waits", "she left"], "hypothesis": ["he is here", "she stayed"],
        "label": [1, 2], "idx": [0, 1],
    },
    "test_matched": {"premise": ["x"], "hypothesis": ["y"], "label": [-1], "idx": [0]},
}  # fmt: skip


def test_the_hub_gives_the_same_examples_and_a_clear_error_offline(monkeypatch):
    from cofrgenet.eval.glue_data import load_task

    calls = _fake_hub(monkeypatch, {"mnli": MNLI_HUB})
    data = load_task("mnli")
    assert data.source == "hub:nyu-mll/glue"
    assert data.train[0] == Example("a man sleeps", "a man is awake", 2)
    assert data.dev["dev_mismatched"] == [
        Example("he waits", "he is here", 1),
        Example("she left", "she stayed", 2),
    ]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(GlueDataNotFound) as error:
        load_task("cola")
    assert calls[-2:] == [("nyu-mll/glue", "cola"), ("glue", "cola")]
    message = str(error.value)
    assert "--data-dir" in message and "gluebenchmark.com" in message and "\n" not in message
    # The legacy name's failure is noise ("BuilderConfig 'cola' not found" offline).
    assert "for glue/cola" not in message and "for nyu-mll/glue/cola" in message
    assert "; HF_HUB_OFFLINE is set)" in message
    assert "CoLA/train.tsv and CoLA/dev.tsv, or put them in data/glue" in message


def test_without_data_dir_the_task_is_read_from_data_glue_where_it_is(
    pretrained, tmp_path, monkeypatch
):
    """cofr eval reads data/eval by default; finetune glue went to the hub whatever
    data/glue held. It reads data/glue/<task> where that is, the hub otherwise."""
    calls = _fake_hub(monkeypatch, {"mnli": MNLI_HUB})
    monkeypatch.chdir(tmp_path)
    _tiny_sst2(tmp_path / "data" / "glue")
    out = tmp_path / "sst2.json"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--batch-size", "8",
         "--max-steps", "1", "--accelerator", "cpu", "--no-progress", "--no-mlflow",
         "--json", str(out)]
    )  # fmt: skip
    assert status == 0 and calls == []
    result = json.loads(out.read_text())
    assert result["source"].endswith("data/glue/SST-2") and result["train_examples"] == 24
    # data/glue without MNLI/: the hub.
    status = cofr(
        ["finetune", "glue", "--task", "mnli", "--ckpt", str(pretrained), "--batch-size", "2",
         "--max-steps", "1", "--accelerator", "cpu", "--no-progress", "--no-mlflow",
         "--json", str(out)]
    )  # fmt: skip
    assert status == 0 and calls == [("nyu-mll/glue", "mnli")]
    assert json.loads(out.read_text())["source"] == "hub:nyu-mll/glue"


def test_a_finetune_on_part_of_the_task_is_not_logged_onto_the_pretraining_run(
    pretrained, tmp_path, capsys
):
    import mlflow

    glue = _tiny_sst2(tmp_path / "glue")
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{pretrained.parents[3] / 'mlflow.db'}")
    pretrain_id = (pretrained.parents[1] / "mlflow_run_id").read_text().strip()
    before = client.get_metric_history(pretrain_id, "glue/sst2/accuracy")
    out = tmp_path / "part.json"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir", str(glue),
         "--batch-size", "8", "--max-steps", "1", "--max-eval-samples", "4",
         "--accelerator", "cpu", "--no-progress", "--name", "part", "--json", str(out)]
    )  # fmt: skip
    assert status == 0
    # Stopped by --max-steps between evaluations: scored at that step all the same.
    run_id = json.loads(out.read_text())["run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "glue/sst2/accuracy")] == [1]
    # 1 step of an epoch's 3 (24 examples, batches of 8): Lightning's current_epoch read 0.
    assert json.loads(out.read_text())["epochs"] == round(1 / 3, 3)
    err = capsys.readouterr().err
    # 1 step of 3 epochs x 3 batches: cut short, as a subset of the task is
    assert (
        "not logged onto the pretraining run: the scores are of part of the task "
        "(--max-eval-samples 4 and --max-steps 1)" in err
    )
    after = client.get_metric_history(pretrain_id, "glue/sst2/accuracy")
    assert [(m.value, m.timestamp) for m in after] == [(m.value, m.timestamp) for m in before]
    # The same name again, or the pretraining run's own folder: refused, nothing replaced.
    results = pretrained.parents[3] / "glue-sst2" / "part" / "results.json"
    before_text = results.read_text()
    again = ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir",
             str(glue), "--max-steps", "1", "--accelerator", "cpu", "--no-progress"]  # fmt: skip
    for where in (
        ["--name", "part"],
        ["--experiment", "test", "--name", pretrained.parents[1].name],
    ):
        assert cofr([*again, *where]) == 2
        assert "holds another run already" in capsys.readouterr().err
    assert results.read_text() == before_text


def test_caps_above_the_sets_sizes_cut_nothing_and_the_scores_are_logged(tmp_path, capsys):
    """--max-train-samples 100000 on a 24-example train set used all 24, yet the run
    counted as partial and its scores stayed off the pretraining run. Its 3 steps log
    train/loss and opt/lr each."""
    import mlflow

    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"))
    glue = _tiny_sst2(tmp_path / "glue")
    out = tmp_path / "full.json"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(ckpt), "--data-dir", str(glue),
         "--batch-size", "8", "--epochs", "1", "--max-train-samples", "100000",
         "--max-eval-samples", "1000", "--max-steps", "50", "--accelerator", "cpu",
         "--no-progress", "--name", "capped", "--json", str(out)]
    )  # fmt: skip
    assert status == 0
    assert "not logged onto the pretraining run" not in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["train_examples"] == 24 and result["warnings"] == []
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ckpt.parents[3] / 'mlflow.db'}")
    pretrain_id = (ckpt.parents[1] / "mlflow_run_id").read_text().strip()
    logged = client.get_run(pretrain_id).data.metrics["glue/sst2/accuracy"]
    assert logged == pytest.approx(result["metrics"]["glue/sst2/accuracy"])
    # A curve of each of its 3 steps: logged every 50 (at most an epoch's), there was one.
    for key in ("train/loss", "opt/lr"):
        assert [m.step for m in client.get_metric_history(result["run_id"], key)] == [0, 1, 2]


def test_a_run_in_another_store_is_named_with_it_and_its_data_folder_is_absolute(
    tmp_path, capsys, monkeypatch
):
    """With --tracking-uri another than the pretraining run's store, the final line and
    the pretraining run's tag gave the run id alone (not found in the UI of that store);
    cofr.data and "source" were the folder as given (tsv:glue/SST-2) beside an absolute
    cofr.ckpt; the table's title read "1 steps"."""
    import mlflow

    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"))
    _tiny_sst2(tmp_path / "glue")
    monkeypatch.chdir(tmp_path)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    out = tmp_path / "other.json"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(ckpt), "--data-dir", "glue",
         "--batch-size", "24", "--epochs", "1", "--accelerator", "cpu", "--no-progress",
         "--tracking-uri", other, "--json", str(out)]
    )  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    folder = (tmp_path / "glue" / "SST-2").resolve()
    assert result["steps"] == 1 and result["source"] == f"tsv:{folder}"
    assert "(1 step," in printed and "1 steps" not in printed
    assert printed.rstrip().splitlines()[-1] == (
        f"MLflow run {result['run_id']} in experiment 'glue-sst2' of {other}"
    )
    run = mlflow.MlflowClient(tracking_uri=other).get_run(result["run_id"])
    assert run.data.tags["cofr.data"] == f"tsv:{folder}" == run.data.params["data"]
    pretraining = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ckpt.parents[3] / 'mlflow.db'}")
    pretrain_id = (ckpt.parents[1] / "mlflow_run_id").read_text().strip()
    tags = pretraining.get_run(pretrain_id).data.tags
    assert tags["glue.sst2.run_id"] == result["run_id"]
    assert tags["glue.sst2.tracking_uri"] == other


def test_finetune_inputs_default_to_the_length_the_model_trained_at(tmp_path, capsys):
    """A run trained on 16-token sequences of a 32-token block: fine-tuning read inputs up
    to 32 tokens, positions that never trained, where cofr eval scores 16-token windows."""
    ckpt = trained_checkpoint(tmp_path, tiny_byte_data(tmp_path / "data"), trained_length=16)
    glue = _tiny_sst2(tmp_path / "glue")
    out = tmp_path / "results.json"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(ckpt), "--data-dir", str(glue),
         "--batch-size", "8", "--max-steps", "1", "--accelerator", "cpu", "--no-progress",
         "--no-mlflow", "--json", str(out)]
    )  # fmt: skip
    assert status == 0
    err = capsys.readouterr().err
    assert f"inputs are cut at 16 tokens, the length {ckpt} trained at" in err
    assert json.loads(out.read_text())["max_length"] == 16


def test_finetune_mnli_from_the_hub_without_mlflow(pretrained, tmp_path, monkeypatch, capsys):
    import mlflow

    _fake_hub(monkeypatch, {"mnli": MNLI_HUB})
    monkeypatch.chdir(tmp_path)  # no data/glue/MNLI, read by default where it is
    out = tmp_path / "mnli.json"
    status = cofr(
        ["finetune", "glue", "--task", "mnli", "--ckpt", str(pretrained), "--batch-size", "2",
         "--max-steps", "1", "--accelerator", "cpu", "--no-progress", "--no-mlflow",
         "--json", str(out), "--precision", "bf16-mixed",  # clips with the fused AdamW
         "--max-length", "5000"]
    )  # fmt: skip
    assert status == 0
    printed, err = capsys.readouterr()
    assert "mnli-mm" in printed
    # Said once, when the model is loaded, not only after the fine-tuning.
    assert err.count("--max-length 5000 is more than the model's block size: inputs are cut") == 1
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == {"glue/mnli/accuracy", "glue/mnli-mm/accuracy"}
    assert result["splits"]["dev_mismatched"]["examples"] == 2
    assert result["run_id"] is None and result["source"] == "hub:nyu-mll/glue"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{pretrained.parents[3] / 'mlflow.db'}")
    assert client.get_experiment_by_name("glue-mnli") is None
    pretrain_id = (pretrained.parents[1] / "mlflow_run_id").read_text().strip()
    assert "glue/mnli/accuracy" not in client.get_run(pretrain_id).data.metrics


def test_importing_the_command_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import argparse, sys; import cofrgenet.eval.glue as g; "
        "g.add_arguments(argparse.ArgumentParser()); "
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_finetuning_learns_a_separable_toy_task(pretrained, tmp_path):
    """Gradients reach the head and the decoder through the pooled state: a toy SST-2
    ("a good film" vs "a bad film") is learnt from a 2-step checkpoint (~15 s)."""
    from cofrgenet.eval.glue import finetune
    from cofrgenet.eval.glue_data import load_task

    data = load_task("sst2", _tiny_sst2(tmp_path / "glue"))
    config = FinetuneConfig(lr=1e-3, epochs=12, batch_size=8, warmup_ratio=0.1)
    result = finetune(pretrained, data, config, accelerator="cpu", mlflow=False)
    assert result["steps"] == 36
    assert result["metrics"]["glue/sst2/accuracy"] >= 0.9
    assert result["splits"]["dev"]["loss"] < 0.5


def test_a_store_that_cannot_be_used_leaves_no_run_folder(pretrained, tmp_path, capsys):
    glue = _tiny_sst2(tmp_path / "glue")
    runs = tmp_path / "runs"
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir", str(glue),
         "--accelerator", "cpu", "--no-progress", "--runs-dir", str(runs),
         "--tracking-uri", "foo://bar"]
    )  # fmt: skip
    assert status == 2
    assert "MLflow cannot use 'foo://bar'" in capsys.readouterr().err
    assert not runs.exists()


@pytest.mark.parametrize("where", ["runs-dir", "under-it", "experiment"])
def test_a_runs_dir_that_is_a_file_is_one_line(pretrained, tmp_path, capsys, where):
    """--runs-dir naming a file ended in NotADirectoryError's traceback from the run
    folder's mkdir, after the model had loaded."""
    glue = _tiny_sst2(tmp_path / "glue")
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder\n")
    runs = {"runs-dir": blocker, "under-it": blocker / "runs", "experiment": tmp_path}[where]
    if where == "experiment":  # the runs folder is fine, its glue-sst2 is a file
        blocker = tmp_path / "glue-sst2"
        blocker.write_text("not a folder\n")
    status = cofr(
        ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir", str(glue),
         "--accelerator", "cpu", "--no-progress", "--no-mlflow", "--runs-dir", str(runs)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("cofr finetune glue: error: ")
    assert f"{str(blocker)!r} is a file" in line and "choose another --runs-dir" in line


def _stopped_finetune(pretrained: Path, tmp_path: Path, extra: list[str]) -> int:
    """The status of `cofr finetune glue` on a tiny SST-2 (runs in tmp_path/runs) that a
    signal stops. A SIGTERM that reaches no handler of cofr's fails the test (its process
    would die there); SIGINT's and SIGTERM's handlers are put back after (Lightning leaves
    Ctrl-C ignored)."""
    glue = _tiny_sst2(tmp_path / "glue")
    args = ["finetune", "glue", "--task", "sst2", "--ckpt", str(pretrained), "--data-dir",
            str(glue), "--accelerator", "cpu", "--no-progress", "--runs-dir",
            str(tmp_path / "runs"), *extra]  # fmt: skip
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def unhandled(signum, frame):
        pytest.fail("SIGTERM reached a point where cofr finetune glue does not handle it")

    signal.signal(signal.SIGTERM, unhandled)
    try:
        return cofr(args)
    except KeyboardInterrupt:  # not pytest's to stop on
        pytest.fail("the KeyboardInterrupt left cofr's main")
    except SystemExit as exit:
        return int(exit.code)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm", "sigterm-before-fit", "ctrl-c-before-fit"])
def test_a_stop_during_the_fine_tuning_ends_its_run_killed(
    pretrained, tmp_path, capsys, monkeypatch, stop
):
    """Ctrl-C: Lightning ended it with status 1, the MLflow run FAILED with the scores of
    part of the training, and an empty run folder that let the same --name start a second
    run. SIGTERM (SLURM's time limit): Lightning's SIGTERMException ended it with status 0.
    Before the fit (its run made, its Trainer not yet), SIGTERM's default action ended the
    process with the run RUNNING, and a Ctrl-C left it RUNNING too. All end the run
    KILLED, leave no folder, and exit 130 or 143."""
    import signal

    import mlflow

    from cofrgenet.eval import glue as glue_module

    classifier = glue_module._classifier_class()
    step = classifier.training_step

    def interrupted(self, batch, batch_idx):
        if stop == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # cofr's handler, which Lightning's calls, raises
        return step(self, batch, batch_idx)

    build_trainer = glue_module._trainer

    def terminated_first(*args, **kwargs):
        if stop == "ctrl-c-before-fit":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)  # the MLflow run exists, no Lightning handler
        return build_trainer(*args, **kwargs)

    if stop.endswith("-before-fit"):
        monkeypatch.setattr(glue_module, "_trainer", terminated_first)
    else:
        monkeypatch.setattr(classifier, "training_step", interrupted)
    runs = tmp_path / "runs"
    status = _stopped_finetune(pretrained, tmp_path, ["--name", f"stopped-{stop}"])
    said = capsys.readouterr().err
    how = "Ctrl-C" if stop.startswith("ctrl-c") else "SIGTERM"
    assert status == (130 if how == "Ctrl-C" else 143)
    assert not (runs / "glue-sst2" / f"stopped-{stop}").exists()
    store = pretrained.parents[3] / "mlflow.db"  # the pretraining run's store
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("glue-sst2").experiment_id
    (run,) = client.search_runs([experiment], f"attributes.run_name = 'stopped-{stop}'")
    assert run.info.status == "KILLED"
    # One line, the same for both signals, its last: no "cofr: interrupted" after it.
    assert said.rstrip().splitlines()[-1] == (
        f"cofr finetune glue: stopped by {how} at step 0: nothing scored; MLflow run "
        f"{run.info.run_id} ended KILLED; its empty folder {runs / 'glue-sst2' / f'stopped-{stop}'} "
        "was removed"
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_after_evaluations_says_where_their_scores_are(
    pretrained, tmp_path, capsys, monkeypatch, stop
):
    """Stopped at step 2 of a run scored every step: SIGTERM said "nothing scored" though
    its KILLED MLflow run held the scores of steps 1 and 2; Ctrl-C said only "cofr:
    interrupted". Both say where the scores are, and what became of the run folder."""
    import mlflow

    from cofrgenet.eval import glue as glue_module

    classifier = glue_module._classifier_class()
    step = classifier.training_step

    def interrupted(self, batch, batch_idx):
        if self.trainer.global_step == 2:
            if stop == signal.SIGINT:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, batch, batch_idx)

    monkeypatch.setattr(classifier, "training_step", interrupted)
    name = f"evaluated-{stop.name}"  # two runs in the module's pretraining store
    extra = ["--batch-size", "8", "--eval-every", "1", "--name", name]
    status = _stopped_finetune(pretrained, tmp_path, extra)
    said = capsys.readouterr().err
    assert status == 128 + stop
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{pretrained.parents[3] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("glue-sst2").experiment_id
    (run,) = client.search_runs([experiment], f"attributes.run_name = '{name}'")
    assert run.info.status == "KILLED"
    history = client.get_metric_history(run.info.run_id, "glue/sst2/accuracy")
    assert [m.step for m in history] == [1, 2]
    how = "Ctrl-C" if stop == signal.SIGINT else "SIGTERM"
    folder = tmp_path / "runs" / "glue-sst2" / name
    assert said.rstrip().splitlines()[-1] == (
        f"cofr finetune glue: stopped by {how} at step 2: dev scores up to step 2 are in "
        f"MLflow run {run.info.run_id} (KILLED); its empty folder {folder} was removed"
    )
    assert not folder.exists() and "run_dir" not in run.data.tags  # it named that folder


def test_a_stop_after_evaluations_keeps_their_scores_without_mlflow(
    pretrained, tmp_path, capsys, monkeypatch
):
    """With --no-mlflow, a SIGTERM at step 2 of a run scored every step said "dev scores
    up to step 2 are not kept": nothing held them. They go to the run folder's
    results.json, and to --json's file (beside an earlier run's complete results, not
    over them), marked partial as cofr eval's are."""
    from cofrgenet.eval import glue as glue_module

    classifier = glue_module._classifier_class()
    step = classifier.training_step

    def interrupted(self, batch, batch_idx):
        if self.trainer.global_step == 3:  # one step past the last scores (step 2)
            os.kill(os.getpid(), signal.SIGTERM)
        return step(self, batch, batch_idx)

    monkeypatch.setattr(classifier, "training_step", interrupted)
    out = tmp_path / "out.json"
    out.write_text(json.dumps({"task": "sst2", "ckpt": "x.ckpt", "metrics": {}}))  # complete
    extra = ["--batch-size", "8", "--eval-every", "2", "--name", "scored", "--no-mlflow",
             "--json", str(out)]  # fmt: skip
    assert _stopped_finetune(pretrained, tmp_path, extra) == 143
    folder = tmp_path / "runs" / "glue-sst2" / "scored"
    beside = tmp_path / "out.partial.json"
    assert capsys.readouterr().err.rstrip().splitlines()[-1] == (
        "cofr finetune glue: stopped by SIGTERM at step 3: dev scores up to step 2 are in "
        f"{folder / 'results.json'} (partial) and {beside} (partial)"
    )
    result = json.loads((folder / "results.json").read_text())
    # eval's names, and where training stopped (after the step the scores are at)
    assert result["partial"] == {"stopped_by": "SIGTERM", "scored_at": 2, "stopped_at": 3}
    assert set(result["metrics"]) == {"glue/sst2/accuracy"} and result["steps"] == 2
    # How it ran, as the whole fine-tuning's results say it: those lacked it.
    assert result["epochs"] == round(2 / 3, 3) and result["train_examples"] == 24
    assert result["precision"] == "32-true" and result["source"].startswith("tsv:")
    assert {"max_length", "pretrain_run_id", "pretrain_step"} <= set(result)
    assert json.loads(beside.read_text()) == result
    assert "partial" not in json.loads(out.read_text())
    # The same command again (a SLURM requeue) runs in that folder: it was refused as
    # "holds another run already".
    monkeypatch.setattr(classifier, "training_step", step)
    shutil.rmtree(tmp_path / "glue")  # made again by the helper
    capsys.readouterr()
    assert _stopped_finetune(pretrained, tmp_path, extra) == 0
    assert "partial" not in json.loads((folder / "results.json").read_text())
    # Where the results went is said, and the older partial ones beside --json's file.
    said = capsys.readouterr().out.splitlines()
    assert f"results: {folder / 'results.json'}" in said
    assert (
        f"results: {out} ({beside} holds a stopped run's partial results, older than these)" in said
    )
    # Something else at OUT.partial.json (the first stop's was taken over): kept.
    beside.write_text("my notes")
    monkeypatch.setattr(classifier, "training_step", interrupted)
    shutil.rmtree(tmp_path / "glue")
    again = [word if word != "scored" else "again" for word in extra]
    capsys.readouterr()
    assert _stopped_finetune(pretrained, tmp_path, again) == 143
    assert beside.read_text() == "my notes"
    assert f"warning: --json {beside} exists and is not a results file" in capsys.readouterr().err


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_once_scored_waits_until_the_results_are_written(
    pretrained, tmp_path, capsys, monkeypatch, stop
):
    """After the final validation the MLflow run is FINISHED: a SIGTERM there ended the
    process with no results.json, a Ctrl-C with a traceback's worth of nothing written.
    Both now wait until the results are written, then stop (143, 130)."""
    import mlflow

    from cofrgenet.eval import glue as glue_module

    scores = glue_module.dev_metrics

    def signalled_first(*args, **kwargs):
        os.kill(os.getpid(), stop)
        return scores(*args, **kwargs)

    monkeypatch.setattr(glue_module, "dev_metrics", signalled_first)
    runs = tmp_path / "runs"
    extra = ["--max-steps", "1", "--name", "scored", "--json", str(tmp_path / "out.json")]
    status = _stopped_finetune(pretrained, tmp_path, extra)
    said = capsys.readouterr().err
    assert status == (143 if stop == signal.SIGTERM else 130)
    assert "once its results were written to" in said
    result = json.loads((runs / "glue-sst2" / "scored" / "results.json").read_text())
    assert set(result["metrics"]) == {"glue/sst2/accuracy"}
    assert json.loads((tmp_path / "out.json").read_text()) == result  # --json too
    store = pretrained.parents[3] / "mlflow.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{store}")
    run = client.get_run(result["run_id"])
    assert run.info.status == "FINISHED"
    assert "glue_results.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_mlflow_is_switched_off_by_no_mlflow_as_in_every_command(capsys):
    """finetune glue alone showed --mlflow/--no-mlflow; eval and the sweeps --no-mlflow."""
    import argparse

    from cofrgenet.eval import glue as g

    parser = argparse.ArgumentParser()
    g.add_arguments(parser)
    base = ["--task", "sst2", "--ckpt", "x.ckpt"]
    assert parser.parse_args(base).mlflow is True
    assert parser.parse_args([*base, "--no-mlflow"]).mlflow is False
    assert parser.parse_args([*base, "--mlflow"]).mlflow is True  # older scripts still parse
    parser.print_help()
    helped = capsys.readouterr().out
    assert "--no-mlflow" in helped and "--mlflow," not in helped


@pytest.mark.parametrize(
    "words, said",
    [
        (["--task", "stsb"], "argument --task: STS-B is a regression (a similarity score)"),
        (["--task", "STS-B"], "argument --task: STS-B is a regression"),
        (["--task", "wnli"], "argument --task: WNLI is not in the paper's table"),
        (
            ["--task", "sst2", "--max-length", "2"],
            "--max-length must be >= 4 (what a sentence-pair task needs at least",
        ),
        # It meant no clipping, as 0 does, unsaid.
        (["--task", "rte", "--grad-clip", "-1"], "--grad-clip must be >= 0 (0: none), got -1.0"),
    ],
)
def test_the_tasks_left_out_and_a_too_short_max_length_say_why(tmp_path, capsys, words, said):
    """`--task stsb` was an "invalid choice" (read as a typo; wnli's "did you mean
    'qnli'?"), and `--max-length 2` named the option max_length."""
    status = cofr(["finetune", "glue", *words, "--ckpt", str(tmp_path / "none.ckpt")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1
    assert said in err
    assert ("offers mnli, qqp, qnli, sst2, cola, mrpc, rte" in err) == ("--task" in said)

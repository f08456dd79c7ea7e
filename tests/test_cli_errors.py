"""`cofr` prints one line for errors in what the user gave, and the traceback with --debug."""

from __future__ import annotations

from pathlib import Path

import pytest

from cofrgenet import cli
from cofrgenet.errors import did_you_mean

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "conf" / "experiment" / "demo-gpt2.yaml")


def one_line_error(capsys, argv: list[str]) -> str:
    """The error line; no traceback of it. (Lightning's log handlers may still hold a
    stream an earlier test's capture closed: logging reports that on its own, as
    "--- Logging error ---" blocks, which are left out here.)"""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().split("--- Logging error ---")
    own = [block.split("Arguments: ", 1)[-1] for block in err]
    assert not any("Traceback" in block for block in own[1:]) and "Traceback" not in own[0]
    return "\n".join(own).strip().splitlines()[-1]


def test_a_typo_in_a_yaml_file_names_the_file_and_the_key(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_stepz: 3\n")
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--config", str(bad)])
    assert line.startswith("cofr fit: error: unknown key 'trainer.max_stepz' in ")
    assert str(bad) in line and "did you mean 'trainer.max_steps'?" in line


def test_a_typo_on_the_command_line_and_in_model_config(capsys):
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--trainer.max_stepz", "3"])
    assert "unknown key 'trainer.max_stepz' (did you mean 'trainer.max_steps'?)" in line
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--model.config", '{"depht": 3}'])
    assert "unknown key 'model.config.depht' (did you mean 'model.config.depth'?)" in line
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--model.optimizer.lrr", "1"])
    assert "unknown key 'model.optimizer.lrr' (did you mean 'model.optimizer.lr'?)" in line


def test_a_mistyped_option_of_a_strategy_class_is_named_with_the_one_meant(capsys, tmp_path):
    """jsonargparse's report of an init_args key the class does not take lists every
    Union subtype's error; the line kept was "expected text, got NestedArg(...)"."""
    fsdp = str(ROOT / "conf" / "trainer" / "fsdp.yaml")
    want = (
        "cofr fit: error: trainer.strategy: LadderFSDPStrategy takes no option 'wrap_block' "
        "(did you mean 'wrap_blocks'?)"
    )
    line = one_line_error(capsys, ["fit", "--config", fsdp, "--trainer.strategy.wrap_block", "0"])
    assert line.startswith(want)
    typo = tmp_path / "typo.yaml"  # the same in a file; a base class's option too
    strategy = "cofrgenet.training.strategies.LadderFSDPStrategy"
    typo.write_text(f"trainer:\n  strategy:\n    class_path: {strategy}\n"
                    "    init_args: {sharding_strateg: FULL_SHARD}\n")  # fmt: skip
    line = one_line_error(capsys, ["fit", "--config", str(typo)])
    assert "no option 'sharding_strateg' (did you mean 'sharding_strategy'?)" in line


def test_a_dashed_option_is_named_as_typed_with_what_it_was_meant_as(capsys):
    """The full parser's view (no key cache): `--run-name` was "unknown key 'run' in
    demo-gpt2.yaml", blaming a valid file for a section the user never typed."""
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--run-name", "x"])
    assert line.startswith("cofr fit: error: unknown option --run-name: did you mean --run.name?")


def test_a_whole_config_file_given_to_a_section_option_says_to_use_config(capsys):
    """`--trainer FILE` reads FILE's keys as trainer's: a file `trainer: {...}` made
    'unknown key trainer.accelerator (did you mean trainer.accelerator?)'."""
    trainer_file = str(ROOT / "conf" / "trainer" / "cpu-debug.yaml")
    line = one_line_error(capsys, ["fit", "--config", DEMO, "--trainer", trainer_file])
    assert line.endswith(
        "--trainer FILE takes a file of trainer keys alone, but its file holds a top-level "
        "`trainer:`: give that file with --config"
    )


def test_missing_data_and_bad_arguments_of_other_commands(capsys, tmp_path):
    err = one_line_error(capsys, ["fit", "--config", DEMO, "--data.data_dir", str(tmp_path)])
    assert "cofr data prepare" in err or "meta.json" in err
    line = one_line_error(capsys, ["data", "prepare", "--vocab-size", "x"])
    assert line.startswith(
        "cofr data prepare: error: argument --vocab-size: expected an int, got 'x'"
    )
    assert "`cofr data prepare --help` lists the options" in line
    line = one_line_error(capsys, ["data", "prepare", "--seed", "x"])  # "invalid int value"
    assert line.startswith("cofr data prepare: error: argument --seed: expected an int, got 'x'")


def test_debug_shows_the_traceback_and_keeps_the_status(capsys, tmp_path, monkeypatch):
    """The traceback above the one-line error; the exit status stays the error's (2), as
    without --debug (it was 1, Python's for an uncaught exception)."""
    assert cli.main(["--debug", "data", "prepare", "--vocab-size", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "ParserError" in err  # a UserError: argparse's
    assert err.splitlines()[-1].startswith("cofr data prepare: error: argument --vocab-size")
    monkeypatch.setenv("COFR_DEBUG", "1")
    assert cli.main(["fit", "--config", DEMO, "--trainer.max_stepz", "3"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConfigError" in err and "max_stepz" in err.splitlines()[-1]


def test_cofr_debug_set_to_a_no_leaves_debugging_off(capsys, monkeypatch):
    """COFR_DEBUG=false turned debugging on: only an unset, empty or 0 value was off."""
    for off in ("0", "false", "False", "no", "OFF", " ", ""):
        monkeypatch.setenv("COFR_DEBUG", off)
        line = one_line_error(capsys, ["data", "prepare", "--vocab-size", "x"])
        assert "argument --vocab-size: expected an int" in line, off
    for on in ("1", "true", "yes", "on"):
        monkeypatch.setenv("COFR_DEBUG", on)
        assert cli.main(["data", "prepare", "--vocab-size", "x"]) == 2
        assert "Traceback" in capsys.readouterr().err, on


def test_cofr_debug_neither_yes_nor_no_is_a_one_line_error(capsys, monkeypatch):
    """COFR_DEBUG=maybe turned debugging on (anything but a no did): it names the variable."""
    monkeypatch.setenv("COFR_DEBUG", "maybe")
    line = one_line_error(capsys, ["data", "prepare", "--vocab-size", "x"])
    assert line.startswith("cofr data prepare: error: environment variable COFR_DEBUG='maybe'")
    assert "1, true, yes or on" in line
    assert cli.main(["--debug", "data", "prepare", "--vocab-size", "x"]) == 2
    err = capsys.readouterr().err  # --debug: its traceback too
    assert "Traceback" in err and "COFR_DEBUG='maybe'" in err.splitlines()[-1]


def test_programming_errors_keep_their_traceback(monkeypatch):
    def broken(args):
        raise KeyError("a bug")

    import cofrgenet.models.cli as models_cli

    monkeypatch.setattr(models_cli, "run", broken)
    with pytest.raises(KeyError, match="a bug"):
        cli.main(["models", "list"])


def test_running_out_of_memory_is_one_line_with_what_to_lower(capsys, monkeypatch):
    """A batch too large for the machine was a 40-line traceback out of the embedding."""
    import torch

    import cofrgenet.models.cli as models_cli

    def too_large(args):
        torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator's own error

    def cuda_too_large(args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 GiB")

    monkeypatch.setattr(models_cli, "run", too_large)
    assert cli.main(["models", "list"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("cofr models list: error: out of memory (") and "\n" not in line
    assert "can't allocate memory" in line and "lower the batch size" in line
    monkeypatch.setattr(models_cli, "run", cuda_too_large)
    assert cli.main(["models", "list"]) == 1
    assert "error: out of memory (CUDA out of memory. Tried" in capsys.readouterr().err
    with pytest.raises(torch.OutOfMemoryError):
        cli.main(["--debug", "models", "list"])
    # A benchmark's sizes are its own options, not a batch size.
    import cofrgenet.bench.ops as bench_ops

    monkeypatch.setattr(bench_ops, "run", too_large)
    assert cli.main(["bench", "ops", "--quick"]) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("cofr bench ops: error: out of memory (")
    assert "lower --sizes, --ladder-sizes" in line and "batch size" not in line


def test_our_own_warnings_are_one_line(monkeypatch):
    """`--ckpt_path last` of a missing run printed `.../training/cli.py:625: UserWarning:
    ...` and the `rank_zero_warn(` source line under it."""
    import warnings

    import cofrgenet.models.cli as models_cli

    shown: list[str] = []

    def formats(args):
        ours, theirs = cli.__file__, warnings.__file__
        shown.extend(warnings.formatwarning("a note", UserWarning, f, 1) for f in (ours, theirs))
        return 0

    monkeypatch.setattr(models_cli, "run", formats)
    cli.main(["models", "list"])
    assert shown[0] == "warning: a note\n"
    assert shown[1].startswith(f"{warnings.__file__}:1: UserWarning: a note")
    shown.clear()
    cli.main(["--debug", "models", "list"])  # --debug: where it came from
    assert "cli.py:1: UserWarning: a note" in shown[0]
    assert warnings.formatwarning("x", UserWarning, cli.__file__, 1) != "warning: x\n"


def test_an_unreadable_value_and_a_missing_config_file_are_one_line(capsys, tmp_path):
    """A JSON value cut short was jsonargparse's six-line dump; a missing --config file
    read `Parser key "config": File does not exist`."""
    assert cli.main(["fit", "--model.config", '{"depth": 3']) == 2
    line = capsys.readouterr().err.strip()
    assert line == (
        "cofr fit: error: model.config '{\"depth\": 3': not valid YAML or JSON (while parsing "
        "a flow mapping; did not find expected ',' or '}')"
    )
    assert cli.main(["fit", "--config", str(tmp_path / "nonexist.yaml")]) == 2
    line = capsys.readouterr().err.strip()
    assert line == f"cofr fit: error: --config {tmp_path / 'nonexist.yaml'}: no such file"


def test_did_you_mean():
    assert did_you_mean("depht", ["depth", "ladders"]) == " (did you mean 'depth'?)"
    assert did_you_mean("zzz", ["depth"]) == ""
    presets = ["gpt2-mini", "gpt2-mini-a", "gpt2-mini-f", "gpt2-mini-fa"]
    assert did_you_mean("gpt2-mini-af", presets) == " (did you mean 'gpt2-mini-fa'?)"
    assert did_you_mean("gpt2-mnii", presets) == " (did you mean 'gpt2-mini'?)"
    # Case alone: "PTB" was no match for "ptb" (difflib compares the letters as typed).
    assert did_you_mean("PTB", ["ptb", "lambada"]) == " (did you mean 'ptb'?)"
    assert did_you_mean("--Max-Steps", ["--max-steps"], prefix="--") == (
        " (did you mean '--max-steps'?)"
    )


def test_ctrl_c_before_a_command_handles_it_is_one_line(capsys, monkeypatch):
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli.main(["fit", "--config", DEMO]) == 130
    assert capsys.readouterr().err.strip() == "cofr: interrupted"


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_output_piped_into_a_reader_that_leaves_ends_quietly(unbuffered, monkeypatch):
    """`cofr generate ... | head -1` ended in a BrokenPipeError traceback, status 1; with
    buffered output, the exit's flush said "Exception ignored", status 120."""
    import subprocess
    import sys

    code = (
        "import sys, time; from cofrgenet import cli\n"
        "def talk(argv):\n"
        "    print('x' * 9000)\n"
        "    time.sleep(1)  # the reader leaves meanwhile\n"
        "    print('the last words')\n"
        "cli._run = talk\n"
        "sys.exit(cli.main(['generate']))\n"
    )
    monkeypatch.setenv("PYTHONUNBUFFERED", unbuffered)
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout.read(10) == b"x" * 10
    process.stdout.close()  # the reader leaves, as `head` does
    err = process.stderr.read().decode()
    assert (process.wait(timeout=120), err) == (141, "")


def test_a_broken_pipe_elsewhere_than_stdout_is_an_error(monkeypatch):
    """Only a reader of stdout gone ends quietly: a worker's pipe keeps its traceback."""

    def broken(argv):
        raise BrokenPipeError("a worker's pipe")

    monkeypatch.setattr(cli, "_run", broken)
    with pytest.raises(BrokenPipeError, match="a worker's pipe"):
        cli.main(["generate"])


def test_predict_is_not_a_command(capsys):
    line = one_line_error(capsys, ["predict", "--config", DEMO])
    assert "invalid choice: 'predict'" in line


def test_an_extra_word_points_to_its_commands_help(capsys):
    line = one_line_error(capsys, ["models", "list", "foo"])
    assert line == (
        "cofr models list: error: unrecognized arguments: foo "
        "(`cofr models list --help` lists the options)"
    )


def test_a_mistyped_option_of_an_argparse_command_gets_a_did_you_mean(capsys):
    line = one_line_error(capsys, ["models", "list", "--filtr", "tiny"])
    assert "unrecognized arguments: --filtr tiny (did you mean '--filter'?)" in line
    line = one_line_error(capsys, ["models", "list", "--max_new_tokens=3"])  # nothing close
    assert "did you mean" not in line
    line = one_line_error(capsys, ["models", "list", "-filter", "tiny"])  # one dash short
    assert "unrecognized arguments: -filter tiny (did you mean '--filter'?)" in line


def test_a_value_that_starts_with_a_dash_is_shown_how_to_give(capsys):
    """`cofr generate --prompt "-x"`: argparse takes -x for an option, and the error
    named it unrecognized, with no word of `--prompt=-x`, which works."""
    line = one_line_error(capsys, ["generate", "--ckpt", "a.ckpt", "--prompt", "-top"])
    assert line == (
        "cofr generate: error: unrecognized arguments: -top (a value that starts with '-' "
        "goes after '=': --prompt=-top) (`cofr generate --help` lists the options)"
    )  # not "did you mean '--top-k'"
    line = one_line_error(capsys, ["generate", "--ckpt", "a.ckpt", "--prom", "-top"])
    assert "(a value that starts with '-' goes after '=': --prom=-top)" in line  # a prefix
    line = one_line_error(capsys, ["generate", "--ckpt", "a.ckpt", "--past-eos", "-x"])
    assert "unrecognized arguments: -x (`cofr generate --help`" in line  # takes no value


@pytest.mark.parametrize(
    "words, where, typed, meant",
    [
        (["comapre"], "cofr", "comapre", "compare"),
        (["models", "lst"], "cofr models", "lst", "list"),
        (["finetune", "gleu"], "cofr finetune", "gleu", "glue"),
        (["bench", "opps"], "cofr bench", "opps", "ops"),
    ],
)
def test_a_mistyped_command_gets_a_did_you_mean(capsys, words, where, typed, meant):
    """argparse's bare "invalid choice" listed every command, the one meant among them."""
    line = one_line_error(capsys, words)
    assert line.startswith(
        f"{where}: error: argument COMMAND: invalid choice: {typed!r} (did you mean "
        f"{meant!r}?); choose from "
    )
    assert line.endswith(f"(`{where} --help` lists the options)")


@pytest.mark.parametrize("words", [["--verison"], ["--verison", "models", "list"]])
def test_a_mistyped_option_of_cofr_itself_gets_a_did_you_mean(capsys, words):
    """A word before any command is cofr's own option: it got no suggestion."""
    assert one_line_error(capsys, words) == (
        "cofr: error: unrecognized arguments: --verison (did you mean '--version'?) "
        "(`cofr --help` lists the options)"
    )


def test_a_group_without_its_command_says_the_groups_words(capsys):
    """`cofr models` read "cofr: error: the following arguments are required: COMMAND"."""
    assert one_line_error(capsys, ["models"]) == (
        "cofr models: error: the following arguments are required: COMMAND "
        "(`cofr models --help` lists the options)"
    )


@pytest.mark.parametrize(
    "words, flag, meant",
    [
        (["finetune", "glue", "--taks", "sst2"], "--taks", "--task"),
        (["generate", "--ckpts", "X"], "--ckpts", "--ckpt"),
    ],
)
def test_a_mistyped_required_option_is_said_mistyped_not_missing(capsys, words, flag, meant):
    """argparse checks required options before it returns the words it did not know:
    `--taks sst2` was "the following arguments are required: --task"."""
    where = " ".join(["cofr", *(w for w in words if not w.startswith("-"))][:-1])
    assert one_line_error(capsys, words) == (
        f"{where}: error: unrecognized arguments: {flag} (did you mean {meant!r}?) "
        f"(`{where} --help` lists the options)"
    )


def test_a_missing_required_option_is_still_said_missing(capsys):
    line = one_line_error(capsys, ["finetune", "glue", "--lr", "-1"])  # a value, not an option
    assert "the following arguments are required: --task" in line


def test_a_word_before_the_command_points_to_cofrs_own_help(capsys):
    line = one_line_error(capsys, ["--verbose", "models", "list"])
    assert (
        line == "cofr: error: unrecognized arguments: --verbose (`cofr --help` lists the options)"
    )


@pytest.mark.parametrize(
    "words,options",
    [
        (["eval"], ["--tasks", "ptb"]),
        (["export", "hf"], []),
        (["generate"], []),
        (["finetune", "glue"], ["--task", "sst2"]),
    ],
    ids=lambda value: "-".join(value) if value and value[0][0] != "-" else "",
)
def test_every_command_reads_its_checkpoint_from_ckpt(capsys, tmp_path, words, options):
    """One name for a checkpoint (`--ckpt`; fit's `--ckpt_path` takes it too): `eval` and
    `export hf` took a positional word, which they still take."""
    missing = str(tmp_path / "missing.ckpt")
    if words[0] == "export":
        options = [*options, str(tmp_path / "out")]
    line = one_line_error(capsys, [*words, "--ckpt", missing, *options])
    assert f"no checkpoint file at {missing}" in line
    if words[0] in ("eval", "export"):
        line = one_line_error(capsys, [*words, missing, *options])
        assert f"no checkpoint file at {missing}" in line
        line = one_line_error(capsys, [*words, missing, *options, "--ckpt", "b"])
        assert line.endswith(f"two checkpoints given ({missing} and --ckpt b): give --ckpt only")
        line = one_line_error(capsys, [*words, "--ckpt", missing, "other", *options])
        assert line.endswith(f"one word too many, 'other', beside --ckpt {missing}")
    line = one_line_error(capsys, [*words, *options])
    assert "--ckpt" in line and "required" in line
    with pytest.raises(SystemExit):
        cli.main([*words, "--help"])
    synopsis = capsys.readouterr().out.split("\n\n")[0]  # [--ckpt PATH] read as optional
    assert " --ckpt PATH " in synopsis and "[--ckpt" not in synopsis, synopsis
    if words[0] == "export":  # the one word was read as OUT_DIR
        assert line.endswith(
            f"usage: cofr export hf --ckpt CKPT OUT_DIR (the one word given, {options[-1]}, is OUT_DIR)"
        )


def test_fit_takes_ckpt_for_its_ckpt_path(capsys):
    """jsonargparse takes an option's unique prefix: `--ckpt` is fit's `--ckpt_path`."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["validate", "--config", DEMO, "--ckpt", "x.ckpt", "--print_config"])
    assert stop.value.code == 0
    assert "ckpt_path: x.ckpt" in capsys.readouterr().out


def test_python_dash_m_cofrgenet_runs_cofr():
    """``python -m cofrgenet`` said the package cannot be executed directly."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "cofrgenet", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: cofr ")


def test_compare_and_sweep_report_take_out_dir_as_the_bench_commands_do():
    """A report's folder is --out-dir everywhere (bench ops, train, quality); compare and
    sweep report named it --out, which they still take."""
    import argparse

    from cofrgenet.eval.compare import add_arguments as compare_arguments
    from cofrgenet.sweeps.cli import add_report_arguments

    for add, first in ((compare_arguments, []), (add_report_arguments, ["s.yaml"])):
        parser = argparse.ArgumentParser()
        add(parser)
        for flag in ("--out-dir", "--out"):
            assert parser.parse_args([*first, flag, "r"]).out == "r"

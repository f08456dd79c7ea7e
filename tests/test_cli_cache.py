"""Help and unknown keys of the Lightning commands, answered without importing Lightning."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from cofrgenet import cli, cli_cache

ROOT = Path(__file__).resolve().parents[1]
DEMO = str(ROOT / "conf" / "experiment" / "demo-gpt2.yaml")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COFR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def forbid_lightning(monkeypatch):
    """From here on, importing the Lightning CLI module fails the test."""
    real = importlib.import_module

    def guarded(name, *args, **kwargs):
        assert name != "cofrgenet.training.cli", "the Lightning CLI was imported"
        return real(name, *args, **kwargs)

    monkeypatch.setattr(cli.importlib, "import_module", guarded)


def test_help_is_answered_from_the_cache_the_second_time(cache, capsys, monkeypatch):
    assert cli.main(["fit", "--help"]) == 0
    first = capsys.readouterr().out
    assert "--trainer.max_steps" in first and "--model.config" in first
    forbid_lightning(monkeypatch)
    assert cli.main(["fit", "--help"]) == 0
    assert capsys.readouterr().out == first


def test_unknown_keys_are_caught_before_lightning_once_the_keys_are_known(
    cache, capsys, monkeypatch, tmp_path
):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_stepz: 3\ndata:\n  batch_size: 4\n")
    assert cli.main(["fit", "--config", DEMO, "--config", str(bad)]) == 2  # teaches the keys
    slow = capsys.readouterr().err.strip().splitlines()[-1]
    forbid_lightning(monkeypatch)
    assert cli.main(["fit", "--config", DEMO, "--config", str(bad)]) == 2
    fast = capsys.readouterr().err.strip().splitlines()[-1]
    assert fast == slow and "unknown key 'trainer.max_stepz' in " in fast
    assert cli.main(["fit", "--config", DEMO, "--data.batch_sise", "3"]) == 2
    assert "did you mean 'data.batch_size'?" in capsys.readouterr().err
    # A dashed option names what it was meant as, not a config file's section; the same
    # from the full parser (first) and from the quick check.
    assert cli.main(["fit", "--config", DEMO, "--run-name", "x"]) == 2
    dashed = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown option --run-name: did you mean --run.name?" in dashed and " in " not in dashed
    for flag, meant in (
        ("--ckpt-path", "--ckpt_path"),
        ("--trainer-max-steps", "--trainer.max_steps"),
    ):
        assert cli.main(["fit", "--config", DEMO, flag, "3"]) == 2
        assert f"unknown option {flag}: did you mean {meant}?" in capsys.readouterr().err
    # A dashed key in a file is the file's key, named with its file, not an option.
    dashed_file = tmp_path / "dashed.yaml"
    dashed_file.write_text("trainer:\n  max-steps: 3\n")
    assert cli.main(["fit", "--config", DEMO, "--config", str(dashed_file)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"cofr fit: error: unknown key 'trainer.max-steps' in {dashed_file}: did you mean "
        "'trainer.max_steps'? (keys are words joined by underscores); `cofr fit --help` "
        "lists every option"
    )
    # What the parser accepts passes the quick check (nothing is flagged).
    words = ["--config", DEMO, "--trainer.callbacks+=helpers.StopAtStep",
             "--trainer.callbacks.step=5", "--model.config", "{}", "--model.optimizer.lr", "1"]  # fmt: skip
    cli_cache.check_keys("fit", words)


def test_an_unknown_preset_is_caught_before_lightning_with_the_parsers_message(
    cache, capsys, monkeypatch, tmp_path
):
    assert cli.main(["fit", "--config", DEMO, "--model.preset", "gpt2-tiniest"]) == 2
    slow = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown preset 'gpt2-tiniest' (did you mean 'gpt2-tiny'?)" in slow
    forbid_lightning(monkeypatch)
    assert cli.main(["fit", "--config", DEMO, "--model.preset=gpt2-tiniest"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == slow
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  preset: gpt2-tiniest\n")
    assert cli.main(["fit", "--config", DEMO, "--config", str(recipe)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == slow
    # Read in order, as the parser does: a later file's preset wins, a known one passes;
    # no preset (a whole model.config) passes too.
    known = tmp_path / "known.yaml"
    known.write_text("model:\n  preset: gpt2-tiny\n")
    for words in (
        ["--model.preset", "gpt2-tiniest", "--config", str(known)],
        ["--config", str(recipe), "--model.preset", "gpt2-mini"],
        ["--model.preset", "null"],
    ):
        cli_cache.check_keys("fit", words)


def test_the_quick_checks_read_base_files_and_short_config_flags(cache, capsys, tmp_path):
    """The quick key check and the help cache read only `--config F` words themselves: a
    typo in a base: file or a -c file went to the full parser, and a cached help stayed
    the same after its recipe's base file changed."""
    cli_cache.store_keys("fit", ["trainer.max_steps", "data.batch_size"])
    base = tmp_path / "base.yaml"
    base.write_text("trainer:\n  max_stepz: 3\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("base: [base.yaml]\ndata:\n  batch_size: 4\n")
    assert cli_cache.config_files(["-c", str(recipe)]) == [str(base), str(recipe)]
    for flag in ("--config", "-c"):
        with pytest.raises(cli_cache.ConfigError, match=r"unknown key 'trainer.max_stepz' in "):
            cli_cache.check_keys("fit", [flag, str(recipe)])
    before = cli_cache._help_key(["--config", str(recipe), "--help"])
    base.write_text("trainer:\n  max_steps: 3\n")
    assert cli_cache._help_key(["--config", str(recipe), "--help"]) != before


def test_any_source_change_invalidates_the_cache(cache, monkeypatch):
    cli_cache.store_keys("fit", ["trainer.max_steps"])
    assert cli_cache.cached_keys("fit") == ["trainer.max_steps"]
    cli_cache.fingerprint.cache_clear()
    monkeypatch.setattr(cli_cache.metadata, "version", lambda dist: "another version")
    assert cli_cache.cached_keys("fit") is None
    cli_cache.fingerprint.cache_clear()


def test_a_script_of_ones_own_has_its_own_cache(cache, monkeypatch, tmp_path):
    """A script that registers mixers before cofrgenet.cli.main has other choices in its
    help than `cofr`: its entries are not plain cofr's."""
    import sys
    import types

    cli_cache.store_keys("fit", ["trainer.max_steps"])
    script = tmp_path / "train_mine.py"
    script.write_text("import my_mixers\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    cli_cache.fingerprint.cache_clear()
    try:
        assert cli_cache.cached_keys("fit") is None
    finally:
        cli_cache.fingerprint.cache_clear()


def test_one_help_call_teaches_the_keys_too(cache, capsys, monkeypatch):
    """`make install` runs `cofr <command> --help` once: after it, a typo is caught
    without Lightning, on the very first real call."""
    assert cli.main(["validate", "--help"]) == 0
    capsys.readouterr()
    assert cli_cache.cached_keys("validate")
    forbid_lightning(monkeypatch)
    assert cli.main(["validate", "--config", DEMO, "--trainer.max_stepz", "3"]) == 2
    assert "did you mean 'trainer.max_steps'" in capsys.readouterr().err


def test_a_damaged_cache_file_is_removed_and_counts_as_missing(cache, capsys, monkeypatch):
    """A keys file cut short made every `cofr fit` end in a JSONDecodeError traceback;
    one of the wrong shape is no better. The cache is optional: the full parser answers."""
    cli_cache.store_keys("fit", ["trainer.max_steps"])
    cli_cache.store_presets(["gpt2-tiny"])
    keys = cli_cache._path("keys", "fit")
    presets = cli_cache._path("choices", cli_cache.PRESET_KEY)
    for damaged in ('["trainer.max_st', "{}", "null", "\xff"):
        keys.write_text(damaged, encoding="latin-1")
        presets.write_text(damaged, encoding="latin-1")
        assert cli_cache.cached_keys("fit") is None and not keys.exists()
        assert cli_cache.cached_presets() is None and not presets.exists()
    keys.write_text('["trainer.max_st')
    cli_cache.check_keys("fit", ["--config", DEMO, "--trainer.max_stepz", "3"])
    assert not keys.exists()


def test_writes_remove_the_files_of_old_fingerprints(cache, monkeypatch):
    """Every edit or upgrade made a new set of files and none went away. A write keeps its
    own fingerprint's files and those of the few most recently written others (two
    checkouts sharing the cache), and leaves files that are not the cache's alone."""
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")
    fingerprints = [f"{n:016x}" for n in range(cli_cache.KEEP_FINGERPRINTS + 2)]
    for age, fp in enumerate(fingerprints):  # the first is the newest
        for name in (f"keys-fit-{fp}", f"help-0123456789abcdef-{fp}", f".keys-fit-{fp}.123.tmp"):
            (cache / name).write_text("[]")  # the last: a write killed midway
            os.utime(cache / name, (1000 - age, 1000 - age))
    current = fingerprints[-1]  # the oldest: its own write keeps it
    monkeypatch.setattr(cli_cache, "fingerprint", lambda: current)
    cli_cache.store_keys("validate", ["trainer.max_steps"])
    kept = {m[1] for p in cache.iterdir() if (m := cli_cache._ENTRY.fullmatch(p.name))}
    assert kept == {current, *fingerprints[: cli_cache.KEEP_FINGERPRINTS - 1]}
    assert (cache / "notes.txt").read_text() == "mine"
    assert not (cache / f".keys-fit-{fingerprints[-2]}.123.tmp").exists()
    assert cli_cache.cached_keys("validate") == ["trainer.max_steps"]
    # Removal errors (a file another process removed, a read-only folder) are ignored.
    monkeypatch.setattr(cli_cache, "fingerprint", lambda: "f" * 16)
    monkeypatch.setattr(Path, "unlink", lambda *a, **k: (_ for _ in ()).throw(PermissionError))
    cli_cache.store_keys("fit", ["data.batch_size"])
    assert cli_cache.cached_keys("fit") == ["data.batch_size"]


def test_a_config_file_that_is_not_utf8_is_left_to_the_full_parser(cache, monkeypatch, tmp_path):
    """The quick checks read the config files as text: one that is not UTF-8 ended `cofr
    fit` in a UnicodeDecodeError traceback instead of the full parser's message."""
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"trainer:\n  max_stepz: 3 # \xff\xfe\n")
    monkeypatch.setattr(cli_cache, "config_files", lambda words: [str(bad)])
    cli_cache.store_keys("fit", ["trainer.max_steps"])
    cli_cache.store_presets(["gpt2-tiny"])
    words = ["--config", str(bad)]
    cli_cache.check_keys("fit", words)  # nothing raised: the full parser reports it
    assert cli_cache._yaml_value(str(bad), "trainer") is cli_cache._MISSING
    assert cli_cache.cached_help([*words, "--help"]) is None

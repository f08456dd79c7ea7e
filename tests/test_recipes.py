"""Config recipes: ``base:`` names the group files a config builds on."""

from __future__ import annotations

from pathlib import Path

import pytest

from cofrgenet.errors import ConfigError
from cofrgenet.recipes import expand

ROOT = Path(__file__).resolve().parents[1]


def test_bases_come_first_in_order_and_recursively(tmp_path):
    (tmp_path / "a.yaml").write_text("trainer: {max_steps: 1}\n")
    (tmp_path / "b.yaml").write_text("base: [a.yaml]\ndata: {batch_size: 2}\n")
    (tmp_path / "c.yaml").write_text("run: {name: x}\n")
    (tmp_path / "exp.yaml").write_text("base: [b.yaml, c.yaml]\nmodel: {preset: gpt2-tiny}\n")
    words = ["fit", "--config", str(tmp_path / "exp.yaml"), "--trainer.max_steps", "3"]
    files = [w for w in expand(words) if w.endswith(".yaml")]
    assert [Path(f).name for f in files] == ["a.yaml", "b.yaml", "c.yaml", "exp.yaml"]
    assert expand(words)[-2:] == ["--trainer.max_steps", "3"]  # overrides stay last


def test_a_base_an_earlier_config_read_is_not_read_again(tmp_path):
    """`--config exp.yaml --config delta.yaml`, both on group.yaml: read again, the group
    would undo exp.yaml's changes to it (max_steps back to 1000)."""
    from cofrgenet.training.cli import ParseOnlyCLI

    (tmp_path / "group.yaml").write_text("trainer: {max_steps: 1000, accelerator: cpu}\n")
    (tmp_path / "exp.yaml").write_text("base: [group.yaml]\ntrainer: {max_steps: 300}\n")
    (tmp_path / "delta.yaml").write_text("base: [group.yaml]\nseed_everything: 3\n")
    words = [
        "fit",
        "--config",
        str(tmp_path / "exp.yaml"),
        "--config",
        str(tmp_path / "delta.yaml"),
    ]
    files = [Path(w).name for w in expand(words) if w.endswith(".yaml")]
    assert files == ["group.yaml", "exp.yaml", "delta.yaml"]
    assert ParseOnlyCLI(args=words).config.fit.trainer.max_steps == 300


def test_a_later_files_base_that_sets_values_back_is_said(tmp_path, monkeypatch):
    from cofrgenet.training.config_words import bases_undoing_earlier_files

    monkeypatch.chdir(tmp_path)  # bases found from the naming file's folder: whole paths

    debug, exp = ROOT / "conf/trainer/cpu-debug.yaml", ROOT / "conf/experiment/demo-gpt2.yaml"
    cpu = ROOT / "conf/trainer/cpu.yaml"
    assert bases_undoing_earlier_files(["--config", str(debug), "--config", str(exp)]) == [
        f"{cpu}, a base of {exp}, sets trainer.limit_val_batches, trainer.log_every_n_steps, "
        f"trainer.val_check_interval back after {debug}: give {debug} after {exp} to keep its "
        "values"
    ]
    assert bases_undoing_earlier_files(["--config", str(exp), "--config", str(debug)]) == []


def test_the_bundled_recipes_are_found_from_any_folder(tmp_path, monkeypatch):
    """As `cofr demo` and `cofr bench quality` find them: the README's commands work
    from a project folder of one's own; a file of that name there comes first."""
    monkeypatch.chdir(tmp_path)
    words = ["--config", "conf/experiment/demo-gpt2.yaml"]
    assert expand(words)[-1] == str(ROOT / "conf/experiment/demo-gpt2.yaml")
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf/experiment/demo-gpt2.yaml").write_text("seed_everything: 3\n")
    assert expand(words) == words
    assert expand(["--config", "conf/nowhere.yaml"]) == ["--config", "conf/nowhere.yaml"]


def test_a_missing_base_and_a_loop_are_config_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("base: [nowhere.yaml]\n")
    with pytest.raises(ConfigError, match=r"names nowhere\.yaml"):
        expand(["--config", str(tmp_path / "x.yaml")])
    (tmp_path / "p.yaml").write_text("base: [q.yaml]\n")
    (tmp_path / "q.yaml").write_text("base: [p.yaml]\n")
    with pytest.raises(ConfigError, match="loop"):
        expand(["--config", str(tmp_path / "p.yaml")])


def test_every_experiment_is_a_delta_over_existing_groups():
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        files = [w for w in expand(["--config", str(path.relative_to(ROOT))]) if w != "--config"]
        assert len(files) >= 3 and files[-1].endswith(path.name), path
        assert all((ROOT / f).is_file() for f in files), path
    assert not (ROOT / "conf" / "model").exists()  # presets are one flag: --model.preset


def test_one_base_may_be_named_without_a_list(tmp_path):
    """``base: file.yaml``, as recipes.bases_of reads it, is also what the parser takes."""
    from cofrgenet.training.cli import ParseOnlyCLI

    (tmp_path / "exp.yaml").write_text(f"base: {ROOT / 'conf/trainer/cpu-debug.yaml'}\n")
    cli = ParseOnlyCLI(args=["fit", "--config", str(tmp_path / "exp.yaml")])
    assert cli.config.fit.trainer.max_steps == 20  # cpu-debug's


def test_every_recipes_prepare_command_is_the_one_a_missing_folder_names():
    """A recipe's header says how its data folder is made; a missing folder's error must
    name that same command (it named a byte folder for the BPE quality recipe)."""
    import re
    import shlex

    from cofrgenet.data.meta import BUNDLED_FOLDERS, prepare_command

    checked, made = 0, set()
    for path in sorted([*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "sweeps").glob("*.yaml")]):
        header = "\n".join(
            line.lstrip("#").strip()
            for line in path.read_text().splitlines()
            if line.startswith("#")
        )
        header = header.replace("\\\n", " ")  # continued lines
        for command in re.findall(r"cofr data prepare [^\n]*", header):
            words = shlex.split(command)
            out = words[words.index("--out") + 1]
            assert " ".join(command.split()) == prepare_command(out), path
            checked, made = checked + 1, made | {Path(out).name}
    assert checked >= 4
    assert set(BUNDLED_FOLDERS) <= made  # every bundled folder's command is a recipe's

"""cofrgenet.atomic: a file is rewritten whole or left as it was."""

from __future__ import annotations

import pytest

from cofrgenet.atomic import replacing, write_text_atomic


def test_a_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    write_text_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_write_cut_short_keeps_the_old_file(tmp_path):
    path = tmp_path / "plot.png"
    path.write_text("old")
    with pytest.raises(RuntimeError), replacing(path) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path  # a writer may read the format
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]

"""Dotted keys into nested mappings (cofrgenet.dotted), as config files, sweep settings
and the command line's key checks read them."""

from __future__ import annotations

import pytest

from cofrgenet.dotted import dotted_leaves, get_dotted, set_dotted
from cofrgenet.errors import ConfigError
from cofrgenet.sweeps.spec import SweepError, load_sweep


def test_get_dotted_walks_mappings_only():
    config = {"trainer": {"max_steps": 5, "callbacks": [{"a": 1}]}, "seed": 0}
    assert get_dotted(config, "trainer.max_steps") == 5
    assert get_dotted(config, "trainer.min_steps", "none") == "none"
    assert get_dotted(config, "seed.value", "none") == "none"  # a leaf, not a mapping
    assert get_dotted(config, "trainer.callbacks.0", "none") == "none"  # lists are leaves


def test_set_dotted_makes_the_path_and_copies_the_value():
    config: dict = {"model": None}
    value = {"lr": [1, 2]}
    set_dotted(config, "model.optimizer", value)
    value["lr"].append(3)
    assert config == {"model": {"optimizer": {"lr": [1, 2]}}}


def test_set_dotted_through_a_leaf_is_the_callers_error():
    with pytest.raises(ConfigError, match=r"cannot set seed\.value: seed is not a mapping"):
        set_dotted({"seed": 0}, "seed.value", 1)
    with pytest.raises(SweepError, match="study is not a mapping"):
        set_dotted({"study": "s"}, "study.name", "t", SweepError)


def test_dotted_leaves():
    node = {"a": {"b": 1, "c": [1, {"d": 2}], "e": {}}, "f": None}
    assert dotted_leaves(node) == {"a.b": 1, "a.c": [1, {"d": 2}], "a.e": {}, "f": None}
    assert dotted_leaves({"x": 1}, "model") == {"model.x": 1}
    assert dotted_leaves(3) == {}
    assert dotted_leaves(3, "k") == {"k": 3}


def test_a_sweep_override_through_a_leaf_is_a_sweep_error(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text("study: s\n")
    with pytest.raises(SweepError, match=r"cannot set study\.name: study is not a mapping"):
        load_sweep(path, {"study.name": "t"})

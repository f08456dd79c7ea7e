"""Boolean environment variables read one way (cofrgenet.environment.env_flag)."""

from __future__ import annotations

import pytest

from cofrgenet.environment import env_flag
from cofrgenet.errors import UserError


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", "on", " y ", "t"])
def test_a_yes_is_true_whatever_the_default(monkeypatch, value):
    monkeypatch.setenv("COFR_TEST_FLAG", value)
    assert env_flag("COFR_TEST_FLAG", False) is True
    assert env_flag("COFR_TEST_FLAG", True) is True


@pytest.mark.parametrize("value", ["0", "false", "False", "NO", "off", " n ", "f"])
def test_a_no_is_false_whatever_the_default(monkeypatch, value):
    monkeypatch.setenv("COFR_TEST_FLAG", value)
    assert env_flag("COFR_TEST_FLAG", False) is False
    assert env_flag("COFR_TEST_FLAG", True) is False


@pytest.mark.parametrize("value", [None, "", "  "])
def test_unset_or_empty_is_the_default(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("COFR_TEST_FLAG", raising=False)
    else:
        monkeypatch.setenv("COFR_TEST_FLAG", value)
    assert env_flag("COFR_TEST_FLAG", False) is False
    assert env_flag("COFR_TEST_FLAG", True) is True


@pytest.mark.parametrize("value", ["maybe", "2", "flase"])
def test_another_value_is_an_error_naming_the_variable_and_the_values(monkeypatch, value):
    monkeypatch.setenv("COFR_TEST_FLAG", value)
    with pytest.raises(UserError) as raised:
        env_flag("COFR_TEST_FLAG", True)
    message = str(raised.value)
    assert f"COFR_TEST_FLAG={value!r}" in message
    assert "1, true, yes or on" in message and "0, false, no or off" in message


def test_debug_requested_refuses_a_bad_value_unless_asked_not_to(monkeypatch):
    """cofr's start refuses COFR_DEBUG=maybe; a check deep in a run (a sweep trial's set-up
    error) reads it as no rather than fail the trial a second time for it."""
    from cofrgenet.environment import debug_requested

    monkeypatch.setenv("COFR_DEBUG", "maybe")
    with pytest.raises(UserError, match="COFR_DEBUG='maybe' is not a yes or no"):
        debug_requested()
    assert debug_requested(strict=False) is False
    monkeypatch.setenv("COFR_DEBUG", "yes")
    assert debug_requested() is True and debug_requested(strict=False) is True

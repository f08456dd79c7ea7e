"""``${VAR}`` references in config values: one syntax for fit configs and sweep files.

Only the braced form is a reference; a bare ``$`` stays literal (a password may hold one).
"""

from __future__ import annotations

import difflib
import os
import re

from cofrgenet.errors import ConfigError

VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def close_variable_hint(name: str) -> str:
    """`` (did you mean ${X}, which is?)`` for a set variable with a close name, or ``""``."""
    close = difflib.get_close_matches(name, [k for k in os.environ if os.environ[k]], 1, 0.9)
    return f" (did you mean ${{{close[0]}}}, which is?)" if close else ""


def unset_variables(text: str) -> list[str]:
    """The variables ``text`` refers to that are unset or empty, in order."""
    return [name for name in VARIABLE.findall(text) if not os.environ.get(name)]


def expand_variables(text: str, where: str) -> str:
    """``text`` with every ``${VAR}`` replaced from the environment; a ConfigError naming
    ``where`` (the option) for a variable that is not set."""
    for name in unset_variables(text):
        raise ConfigError(
            f"{where}: ${{{name}}} is not set in the environment{close_variable_hint(name)}"
        )
    return VARIABLE.sub(lambda m: os.environ[m.group(1)], text)

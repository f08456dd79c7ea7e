"""Boolean environment variables (``COFR_DEBUG``, ``COFRGENET_COMPILE``): one reading.

``1``, ``true``, ``yes``, ``on`` (``y``, ``t``) are yes; ``0``, ``false``, ``no``, ``off``
(``n``, ``f``) are no, in any case and with spaces around ignored; unset or empty is the
variable's default. Any other value is an error that names the variable: a typo such as
``COFRGENET_COMPILE=flase`` would otherwise silently mean one or the other.
"""

from __future__ import annotations

import os

from cofrgenet.errors import UserError

#: Values (lowercased, stripped) that say yes, and no.
TRUE = ("1", "true", "yes", "on", "y", "t")
FALSE = ("0", "false", "no", "off", "n", "f")


def env_flag(name: str, default: bool) -> bool:
    """The boolean environment variable ``name``: ``default`` when unset or empty.

    Raises :class:`~cofrgenet.errors.UserError` for a value that is neither yes nor no.
    """
    text = os.environ.get(name, "")
    value = text.strip().lower()
    if not value:
        return default
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise UserError(
        f"environment variable {name}={text!r} is not a yes or no: set it to 1, true, yes "
        f"or on, or to 0, false, no or off (unset or empty: {'on' if default else 'off'})"
    )


def debug_requested(strict: bool = True) -> bool:
    """Whether ``COFR_DEBUG`` asks for tracebacks (:func:`env_flag`: COFR_DEBUG=false
    leaves them off). A value that is neither yes nor no is an error, unless ``strict``
    is False (a check deep in a run, after ``cofr`` refused it at its start): then no."""
    try:
        return env_flag("COFR_DEBUG", False)
    except UserError:
        if strict:
            raise
        return False

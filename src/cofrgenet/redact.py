"""Passwords out of text that others read: logs, MLflow tags, lock files, printed scripts."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

#: ``scheme://user:password@`` (the password up to the last ``@`` of the word), and a
#: ``password=`` query parameter (``postgresql://u@h/db?password=x``).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][\w+.-]*://[^\s:/@]*:)\S*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)


def hide_passwords(text: str) -> str:
    """``text`` with every URL's password as ``***``: a database or tracking URL in a
    command line, on its way into a log, an MLflow tag or a file that others read."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def shown_command_line() -> str:
    """This process's command line as it is typed, quoted to paste back, passwords
    hidden: ``cofr ...`` for the ``cofr`` entry point, ``python -m cofrgenet`` and
    ``python -m cofrgenet.cli`` (as ``cofr demo`` starts its fits: argv[0] is the path of
    cofrgenet's ``__main__.py`` or ``cli.py``), another program's own name otherwise."""
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    ours = program.name == "cofr" or (
        program.name in ("__main__.py", "cli.py") and program.parent.name == "cofrgenet"
    )
    return hide_passwords(shlex.join(["cofr" if ours else str(program), *sys.argv[1:]]))

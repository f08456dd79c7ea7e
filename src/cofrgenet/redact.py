"""Passwords out of text that others read: logs, MLflow tags, lock files, printed scripts."""

from __future__ import annotations

import re

#: ``scheme://user:password@`` (the password up to the last ``@`` of the word), and a
#: ``password=`` query parameter (``postgresql://u@h/db?password=x``).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][\w+.-]*://[^\s:/@]*:)\S*@")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)


def hide_passwords(text: str) -> str:
    """``text`` with every URL's password as ``***``: a database or tracking URL in a
    command line, on its way into a log, an MLflow tag or a file that others read."""
    return _QUERY_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))

"""Database servers behind a SQLAlchemy URL (a sweep's storage, an MLflow store): whether
one answers, asked once at the start rather than through a client's minutes of retries."""

from __future__ import annotations

import random
import re
import time
from typing import Any

from cofrgenet.redact import hide_passwords

#: A libpq connection string's ``password=VALUE`` (quoted, or up to a space).
_LIBPQ_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE)

#: Seconds a connection attempt waits for a server (a host that drops packets: not minutes).
CONNECT_TIMEOUT = 10


#: The database servers MLflow stores runs in (its SQLAlchemy store's engines).
SERVER_BACKENDS = frozenset({"postgresql", "mysql", "mssql"})


def is_server_url(url: str) -> bool:
    """Whether ``url`` names a database server MLflow can keep runs in (postgresql://,
    mysql+pymysql://...): not a sqlite file, an HTTP server, a path, nor another scheme
    that SQLAlchemy parses too (``databricks://PROFILE``, a plugin's)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in url:
        return False
    try:
        return make_url(url).get_backend_name() in SERVER_BACKENDS
    except (ArgumentError, ValueError):
        return False


def connection_error(url: str, tries: int = 1) -> Exception | None:
    """None once the server at ``url`` accepts a connection; else the last error of
    ``tries`` attempts: the driver's (down, wrong host, port, user or password), or an
    ImportError for a driver that is not installed."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    parsed = make_url(url)
    connect_args: dict[str, Any] = {}
    if parsed.get_backend_name() in ("postgresql", "mysql") and "connect_timeout" not in (
        parsed.query
    ):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT
    try:
        engine = create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except ImportError as missing:
        return missing
    try:
        for attempt in range(tries):
            try:
                with engine.connect():
                    return None
            except DBAPIError as error:
                if attempt == tries - 1:
                    return error
                time.sleep(0.5 + random.random())
    except ImportError as missing:  # a driver imported at the first connection
        return missing
    finally:
        engine.dispose()
    return None


def reason(error: BaseException) -> str:
    """The first line of a driver's error, its passwords hidden where they stand as
    passwords (a URL's, a ``password=`` setting), not in every word that holds them (a
    password "p" made "port" "***ort")."""
    text = str(getattr(error, "orig", None) or error).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    return _LIBPQ_PASSWORD.sub(r"\1***", hide_passwords(text))

"""Connecting to the pipeline database: parsing DATABASE_URL and configuring the engine.

``DATABASE_URL`` is a SQLAlchemy URL; ``postgresql://`` is driven by psycopg 3,
``mysql://`` and ``mariadb://`` (MariaDB 10.6 or newer) by PyMySQL. Unset, the
embedded default is a SQLite file in the project-local state folder (WAL mode, a busy
timeout, every transaction ``BEGIN IMMEDIATE`` so writers queue instead of failing).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from pipeline.backends import backend_named, with_driver
from pipeline.core import errors, redact
from pipeline.core.errors import ConfigError, DatabaseUnavailable


def parse_url(raw: str) -> sa.URL:
    """Parse DATABASE_URL, choosing psycopg 3 for PostgreSQL; ConfigError when malformed."""
    try:
        url = sa.make_url(raw)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        why = "its port is not a number" if isinstance(exc, ValueError) else "not a URL such as postgresql://host/name"
        shown = redact.database_url(raw) if "@" in raw else repr(raw)  # a password is never shown
        raise ConfigError(f"DATABASE_URL {shown} is not a database URL: {why}") from None
    if "@" in (url.host or "") or "@" in (url.database or ""):
        # SQLAlchemy read an "@" as part of the host or the database: one in the password
        # (it ends the password at the first), or a ":" or "/" in the user name (no
        # credentials read at all: the password became the database's name, which a
        # server's "database ... does not exist" printed).
        raise ConfigError(f"DATABASE_URL {redact.database_url(raw)} has an '@' that ends no user and password:"
                          " write '@', ':' and '/' in them as %40, %3A and %2F")
    try:
        (url.host or "").encode("idna")
    except UnicodeError:
        raise ConfigError(f"DATABASE_URL {redact.database_url(raw)}: its host is no host name") from None
    return with_driver(url, f"DATABASE_URL {redact.database_url(raw)}")


def display_url(url: sa.URL | str) -> str:
    """The URL with its password and query values hidden, for messages and logs."""
    return redact.database_url(url)


def create_engine(raw_url: str, **kwargs: Any) -> Engine:
    """An engine for DATABASE_URL; raises ConfigError for a URL it cannot use."""
    url = parse_url(raw_url)
    backend = backend_named(url.get_backend_name())
    backend.engine_options(url, kwargs)  # what the database needs (pipeline/backends/)
    # Parameters carry webhook secrets, API keys (in sources.config) and feed content:
    # never format them into an error's text, which reaches logs, Dagster's event log and
    # worker_state. The statement itself is still shown.
    kwargs.setdefault("hide_parameters", True)
    try:
        engine = sa.create_engine(url, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ConfigError(f"DATABASE_URL {display_url(url)}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"DATABASE_URL {display_url(url)} needs a driver: {exc}") from None
    backend.configure(engine)
    return engine


def check_connection(engine: Engine) -> None:
    """Raise DatabaseUnavailable, in one line, when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except OperationalError as exc:
        reason = errors.reason(exc)
        raise DatabaseUnavailable(f"cannot connect to {display_url(engine.url)}: {reason}") from None

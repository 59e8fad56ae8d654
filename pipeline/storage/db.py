"""Connecting to the pipeline database: parsing DATABASE_URL and configuring the engine.

``DATABASE_URL`` is a SQLAlchemy URL; ``postgresql://`` is driven by psycopg 3,
``mysql://`` and ``mariadb://`` (MariaDB 10.6 or newer) by PyMySQL. Unset, the
embedded default is a SQLite file in the project-local state folder (WAL mode, a busy
timeout, every transaction ``BEGIN IMMEDIATE`` so writers queue instead of failing).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from pipeline.core import redact
from pipeline.core.errors import ConfigError, DatabaseUnavailable

SQLITE_BUSY_TIMEOUT_MS = 30_000
# PostgreSQL ends a session left idle inside a transaction this long (unless the server,
# the role or DATABASE_URL's ``options`` set a timeout of their own): a worker cut off
# from the database in the middle of a transaction would otherwise hold its row locks
# for as long as its silent connection stays open, hours, and no other worker could
# take its rows over when their leases ran out. No transaction of the pipeline waits
# on anything but the database (fetches and deliveries run outside them).
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE ... RETURNING
MIN_MARIADB_VERSION = (10, 6)  # FOR UPDATE SKIP LOCKED


def parse_url(raw: str) -> sa.URL:
    """Parse DATABASE_URL, choosing psycopg 3 for PostgreSQL; ConfigError when malformed."""
    try:
        url = sa.make_url(raw)
    except ArgumentError:
        raise ConfigError(f"DATABASE_URL {raw!r} is not a database URL") from None
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
    if url.drivername in ("mysql", "mariadb"):
        url = url.set(drivername=f"{url.drivername}+pymysql")
    return url


def display_url(url: sa.URL | str) -> str:
    """The URL with its password and query values hidden, for messages and logs."""
    return redact.database_url(url)


def _configure_sqlite(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module (it would BEGIN lazily
        # and DEFERRED); the "begin" hook below emits BEGIN IMMEDIATE instead.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA journal_mode = WAL")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            return  # each statement is its own transaction
        # IMMEDIATE takes the write lock up front: a transaction that reads and then
        # writes cannot deadlock with another doing the same (SQLITE_BUSY on upgrade).
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _configure_postgres(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Every timestamp is UTC (schema.UTCDateTime): timestamptz values then come
        # back from the driver already in UTC, whatever the server's default zone.
        # No JIT: the pipeline's statements are short, and compiling one took longer
        # than running it (37 ms against 18 for a batch's story lookup, bench/RESULTS.md).
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        dbapi_conn.execute(
            "SELECT set_config('TimeZone', 'UTC', false), set_config('jit', 'off', false),"
            " CASE WHEN current_setting('idle_in_transaction_session_timeout') = '0'"
            " THEN set_config('idle_in_transaction_session_timeout', %s, false) END",
            [str(IDLE_IN_TRANSACTION_TIMEOUT_MS)],
        )
        dbapi_conn.autocommit = autocommit


def _configure_mariadb(engine: Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("SELECT VERSION()")
        version = str(cur.fetchone()[0])
        found = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
        if "mariadb" not in version.lower() or found < MIN_MARIADB_VERSION:
            cur.close()
            need = ".".join(map(str, MIN_MARIADB_VERSION))
            raise ConfigError(
                f"the database is {version}: the pipeline needs MariaDB {need} or newer (SKIP LOCKED;"
                " MySQL lacks unique keys on long text)"
            )
        cur.execute("SELECT @@collation_database, DATABASE()")
        collation, database = cur.fetchone()
        if database is not None and not (str(collation).startswith("utf8mb4_") and str(collation).endswith("_bin")):
            cur.close()
            raise ConfigError(
                f"database {database} compares text by {collation}: the pipeline's keys (URLs, item ids) are"
                f" case-sensitive; create it with CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        # Every timestamp is UTC (CURRENT_TIMESTAMP defaults too); strict, standard SQL;
        # a transaction left idle ends as on PostgreSQL (IDLE_IN_TRANSACTION_TIMEOUT_MS).
        cur.execute(
            "SET time_zone = '+00:00',"
            " sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ENGINE_SUBSTITUTION',"
            f" idle_transaction_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS // 1000}"
        )
        cur.close()


def create_engine(raw_url: str, **kwargs: Any) -> Engine:
    """An engine for DATABASE_URL; raises ConfigError for a URL it cannot use."""
    url = parse_url(raw_url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise ConfigError(
                f"SQLite {sqlite3.sqlite_version} is too old: the pipeline needs"
                f" {'.'.join(map(str, MIN_SQLITE_VERSION))} or newer (UPDATE ... RETURNING)"
            )
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    if backend in ("mysql", "mariadb"):
        # READ COMMITTED: a claim's SKIP LOCKED scan locks the rows it takes, not every
        # row it reads past (InnoDB's REPEATABLE READ locks gaps and read rows too).
        kwargs.setdefault("isolation_level", "READ COMMITTED")
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", 10)
        kwargs["connect_args"].setdefault("charset", "utf8mb4")
    if backend == "postgresql":
        # No pool_pre_ping: it costs a round trip per checkout, a fifth of a small claim.
        # A connection lost to a server restart fails one statement; SQLAlchemy then
        # invalidates the pool, and the step's RetryPolicy runs it again.
        connect_args = kwargs.setdefault("connect_args", {})
        connect_args.setdefault("connect_timeout", 10)
        connect_args.setdefault("application_name", "listings-pipeline")
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
    if backend == "sqlite":
        _configure_sqlite(engine)
    if backend == "postgresql":
        _configure_postgres(engine)
    if backend in ("mysql", "mariadb"):
        _configure_mariadb(engine)
    return engine


def check_connection(engine: Engine) -> None:
    """Raise DatabaseUnavailable, in one line, when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise DatabaseUnavailable(f"cannot connect to {display_url(engine.url)}: {reason}") from None

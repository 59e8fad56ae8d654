"""SQLite, the embedded default: one writer at a time (the file is locked for the
transaction), ON CONFLICT for skipping and adding (on_conflict.py), executemany run
in-process; "now" is this host's clock, the one the file's writers share."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from filelock import FileLock, Timeout
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection, Engine

from pipeline.backends.clock import seconds_text
from pipeline.backends.on_conflict import OnConflict
from pipeline.core.errors import ConfigError, DatabaseUnavailable

SQLITE_BUSY_TIMEOUT_MS = 30_000
MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE ... RETURNING


class SQLite(OnConflict):
    name = "sqlite"
    database_clock = False

    def engine_options(self, url: sa.URL, options: dict[str, Any]) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE_VERSION:
            raise ConfigError(
                f"SQLite {sqlite3.sqlite_version} is too old: the pipeline needs"
                f" {'.'.join(map(str, MIN_SQLITE_VERSION))} or newer (UPDATE ... RETURNING)"
            )
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)

    def configure(self, engine: Engine) -> None:
        """WAL, a busy timeout, foreign keys on, and every transaction ``BEGIN
        IMMEDIATE``, so writers queue instead of failing."""

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

    def session_lock(self, engine: Engine, name: str, wait_seconds: int) -> AbstractContextManager[Connection | None]:
        """A lock file beside the database file (``FILE.NAME-lock``); none for a
        database of this process alone (in memory, or a URI)."""
        return _file_lock(engine.url.database, name, wait_seconds)

    def on_conflict_insert(self, table: sa.Table) -> sqlite.Insert:
        return sqlite.insert(table)

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        """Times are UTC text: the days between them (``julianday``) in seconds; the age
        is never negative, so the cast floors."""
        age = (sa.func.julianday(now) - sa.func.julianday(since)) * sa.literal_column("86400.0")
        return sa.cast(age / seconds_text(step), sa.Integer())


@contextmanager
def _file_lock(path: str | None, name: str, wait_seconds: int) -> Iterator[None]:
    if not path or path == ":memory:" or path.startswith("file:"):
        yield None
        return
    try:
        lock = FileLock(f"{path}.{name}-lock", timeout=wait_seconds)
        lock.acquire()
    except Timeout:
        raise DatabaseUnavailable(f"another process held lock {name!r} for {wait_seconds} s; try again") from None
    try:
        yield None
    finally:
        lock.release()

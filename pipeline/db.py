"""Connecting to the pipeline database and migrating it.

``DATABASE_URL`` is a SQLAlchemy URL; ``postgresql://`` is driven by psycopg 3. Unset, the
embedded default is a SQLite file in the project-local state folder (WAL mode, a busy
timeout, every transaction ``BEGIN IMMEDIATE`` so writers queue instead of failing).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from pipeline import redact
from pipeline.errors import ConfigError, DatabaseUnavailable, SchemaMismatch
from pipeline.recordset import json_rows, recordset

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
MIN_SQLITE_VERSION = (3, 35, 0)  # UPDATE ... RETURNING


def parse_url(raw: str) -> sa.URL:
    """Parse DATABASE_URL, choosing psycopg 3 for PostgreSQL; ConfigError when malformed."""
    try:
        url = sa.make_url(raw)
    except ArgumentError:
        raise ConfigError(f"DATABASE_URL {raw!r} is not a database URL") from None
    if url.drivername in ("postgres", "postgresql"):
        url = url.set(drivername="postgresql+psycopg")
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
        # Every timestamp is UTC (DESIGN.md "Databases"): timestamptz values then come
        # back from the driver already in UTC, whatever the server's default zone.
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        dbapi_conn.execute("SET TIME ZONE 'UTC'")
        dbapi_conn.autocommit = autocommit


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
    return engine


def check_connection(engine: Engine) -> None:
    """Raise DatabaseUnavailable, in one line, when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise DatabaseUnavailable(f"cannot connect to {display_url(engine.url)}: {reason}") from None


def on_conflict_insert(
    conn: sa.Connection, table: sa.Table
) -> postgresql.Insert | sqlite.Insert | None:
    """The dialect's INSERT that takes ON CONFLICT clauses, or None where there is none."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    return None


# ``keys`` of ``insert_ignoring_conflicts`` for "any unique key of the table".
ANY_UNIQUE_KEY: list[str] = []


def insert_ignoring_conflicts(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], keys: list[str]
) -> int:
    """Insert ``rows`` (all with the same keys), skipping those whose ``keys`` already
    exist (``ANY_UNIQUE_KEY``: that clash with a row on any unique key); return how many
    went in. One statement on PostgreSQL (``insert_rows``)."""
    if not rows:
        return 0
    if conn.dialect.name == "postgresql":
        return insert_rows(conn, table, rows, ignore_conflicts_on=keys or ("*",))
    insert = on_conflict_insert(conn, table)
    if insert is not None:
        # executemany: SQLite runs it in-process, and its rowcount is the total inserted.
        stmt = insert.on_conflict_do_nothing(index_elements=keys or None)
        return int(conn.execute(stmt.execution_options(preserve_rowcount=True), list(rows)).rowcount)
    # Any other dialect: look first (correct within one transaction of one writer).
    key_sets = [keys] if keys else _unique_keys(table)
    present = [
        {tuple(r) for r in conn.execute(sa.select(*(table.c[k] for k in ks)))} for ks in key_sets
    ]
    fresh = []
    for r in rows:
        values = [tuple(r[k] for k in ks) for ks in key_sets]
        if any(v in seen for v, seen in zip(values, present, strict=True)):
            continue
        fresh.append(r)
        for v, seen in zip(values, present, strict=True):
            seen.add(v)
    if fresh:
        conn.execute(sa.insert(table), fresh)
    return len(fresh)


def _unique_keys(table: sa.Table) -> list[list[str]]:
    """The column lists of ``table``'s unique constraints and unique indexes."""
    keys = [[c.name for c in u.columns] for u in table.constraints if isinstance(u, sa.UniqueConstraint)]
    keys += [[c.name for c in i.columns] for i in table.indexes if i.unique]
    return keys


_INSERTS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], sa.Insert] = {}


def insert_rows(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]],
    *, ignore_conflicts_on: Sequence[str] = (),
) -> int:
    """Insert ``rows`` (all with the same keys) in one statement; return how many went in.

    PostgreSQL: ``INSERT INTO t (cols) SELECT cols FROM jsonb_to_recordset(:rows)``, built
    once per column set, with ``ON CONFLICT (ignore_conflicts_on) DO NOTHING`` when given.
    One bound JSON text whatever the number of rows: an executemany (insertmanyvalues)
    costs a round of Python work per row, and psycopg re-parsed each generated statement
    (bench/RESULTS.md, matching). Elsewhere: an executemany, which SQLite runs in-process.
    """
    if not rows:
        return 0
    if conn.dialect.name != "postgresql":
        if ignore_conflicts_on:
            keys = [] if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
            return insert_ignoring_conflicts(conn, table, rows, keys)
        conn.execute(sa.insert(table), list(rows))
        return len(rows)
    columns = tuple(rows[0])
    key = (table.name, columns, tuple(ignore_conflicts_on))
    stmt = _INSERTS.get(key)
    if stmt is None:
        v = recordset(sa.column(name, table.c[name].type) for name in columns)
        select = sa.select(*(v.c[name] for name in columns))
        if ignore_conflicts_on:
            # ("*",): a clash on any unique key of the table.
            targets = None if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
            stmt = postgresql.insert(table).from_select(list(columns), select).on_conflict_do_nothing(
                index_elements=targets
            )
        else:
            stmt = sa.insert(table).from_select(list(columns), select)
        # SQLAlchemy keeps an INSERT's rowcount only when asked to.
        stmt = stmt.execution_options(preserve_rowcount=True)
        _INSERTS[key] = stmt
    return int(conn.execute(stmt, {"rows": json_rows(rows)}).rowcount)


# -- migrations ---------------------------------------------------------------------------


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    check_connection(engine)
    _refuse_newer_schema(engine)
    _check_target(revision)
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    check_connection(engine)
    _check_target(revision)
    command.downgrade(alembic_config(engine), revision)


def _check_target(revision: str) -> None:
    """SchemaMismatch, in one line, for a revision no migration has (alembic would
    print its traceback)."""
    relative = re.fullmatch(r"(head|base)?[+-]\d+", revision) is not None  # alembic's "-1"
    if revision not in ("head", "base") and not relative and not _known_revision(revision):
        raise SchemaMismatch(
            f"no schema revision {revision!r}: the revisions are 0001 to {head_revision()},"
            ", head, base, or a step such as -1"
        )


def _refuse_newer_schema(engine: Engine) -> None:
    current = current_revision(engine)
    if current is not None and not _known_revision(current):
        raise SchemaMismatch(
            f"the database at {display_url(engine.url)} has schema revision {current},"
            f" which is newer than this code knows (its newest is {head_revision()});"
            " upgrade the pipeline package before using this database"
        )


def _known_revision(revision: str) -> bool:
    try:
        return ScriptDirectory(str(MIGRATIONS_DIR)).get_revision(revision) is not None
    except CommandError:  # "Can't locate revision identified by ..."
        return False


def check_schema(engine: Engine) -> None:
    """Stop unless the database is reachable and at exactly this code's schema revision."""
    check_connection(engine)
    _refuse_newer_schema(engine)
    current, head = current_revision(engine), head_revision()
    if current != head:
        state = "has no pipeline schema" if current is None else f"is at revision {current}"
        raise SchemaMismatch(
            f"the database at {display_url(engine.url)} {state}, this code needs {head}:"
            " run `pipeline db upgrade`"
        )

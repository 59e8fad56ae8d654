"""Rows for tests: small builders over pipeline.storage.schema, shared by tests and worker processes."""

from __future__ import annotations

import ast
import gc
import multiprocessing
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pipeline.core import politeness
from pipeline.storage import politeness_groups, schema


def now() -> datetime:
    return datetime.now(UTC)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (for a server a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def served(app: Any) -> Iterator[str]:
    """A WSGI application (`pipeline serve`'s) on a real server on a free port, in a
    thread; yields its base URL."""
    from pipeline.web.server import serve

    server = serve("127.0.0.1", 0, app)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def worker_processes() -> multiprocessing.context.BaseContext:
    """The context for worker processes (tests/claim_workers.py): forked from a server
    process that imported that module once (forkserver, preloaded), so each worker is a
    process of a clean interpreter, as spawn gives, without importing SQLAlchemy and the
    pipeline again (about 1 s of CPU a worker)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["tests.claim_workers"])
    return context


def wait_until(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0, *,
               fail: bool = True) -> Any:
    """Poll ``check`` until it returns something true, and return that; after
    ``timeout`` seconds, AssertionError naming ``what`` (or, ``fail=False``, the last
    value: for a server route that must answer in the end)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            if not fail:
                return value
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return value


@contextmanager
def wire_messages(engine: sa.Engine) -> Iterator[list[str]]:
    """The PostgreSQL protocol messages (libpq's own trace, ``F`` sent, ``B`` received)
    of every connection ``engine``'s pool lends inside the block, whether SQLAlchemy or
    the driver alone sends them; the list is filled when the block ends. Each
    ``ReadyForQuery`` is one round trip that waited for the server."""
    from psycopg.pq import Trace

    lines: list[str] = []
    traced: list[tuple[Any, Any]] = []

    def trace(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        out = tempfile.TemporaryFile()  # noqa: SIM115 -- closed when the block ends
        dbapi_conn.pgconn.trace(out.fileno())
        dbapi_conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        traced.append((dbapi_conn, out))

    sa.event.listen(engine, "checkout", trace)
    try:
        yield lines
    finally:
        sa.event.remove(engine, "checkout", trace)
        for dbapi_conn, out in traced:
            if not dbapi_conn.closed:
                dbapi_conn.pgconn.untrace()
            out.seek(0)
            # One message per entry: a statement's text may span lines of the trace.
            lines.extend(m for m in re.split(r"\n(?=[FB]\t)", out.read().decode().strip()) if m)
            out.close()


def round_trips(lines: Sequence[str]) -> int:
    return sum(1 for line in lines if "\tReadyForQuery" in line)


@contextmanager
def locked_against(engine: sa.Engine, db_url: str, table: sa.Table) -> Iterator[sa.Engine]:
    """An engine on ``db_url`` (PostgreSQL) whose statements give up after 200 ms waiting
    for a lock, while a session of ``engine`` holds ``table`` locked: a database that
    cannot take a write now, as a restart, a cut connection or a full disk look to the
    pipeline (an operational error, the connection intact). The holder's idle timeout is
    off: it is held while the work runs."""
    from pipeline.storage import db

    impatient = db.create_engine(db_url, connect_args={"options": "-c lock_timeout=200"})
    try:
        with engine.connect() as holder:
            holder.exec_driver_sql("SET idle_in_transaction_session_timeout = 0")
            holder.exec_driver_sql(f"LOCK TABLE {table.name} IN ACCESS EXCLUSIVE MODE")
            yield impatient
            holder.rollback()
    finally:
        impatient.dispose()


def expire_leases(engine: sa.Engine, table: sa.Table, ids: Sequence[int] | None = None) -> None:
    """End the leases on ``table``'s rows (those of ``ids``, else every leased row) as
    if their time had run out: ``locked_until`` an hour in the past. Tests move the
    lease instead of sleeping until it ends."""
    update = sa.update(table).where(table.c.locked_until.is_not(None))
    if ids is not None:
        update = update.where(table.c.id.in_(list(ids)))
    with engine.begin() as conn:
        conn.execute(update.values(locked_until=now() - timedelta(hours=1)))


def add_source(conn: sa.Connection, url: str = "http://127.0.0.1/feed", **values: Any) -> int:
    row = {"name": url, "url": url, "source_type": "rss", **values}
    row.setdefault("politeness_group", politeness.group_for(url, row["source_type"]))
    politeness_groups.ensure_groups(conn, [row["politeness_group"]])
    return int(
        conn.execute(
            sa.insert(schema.sources).values(row).returning(schema.sources.c.id)
        ).scalar_one()
    )


def add_raw_rows(
    conn: sa.Connection,
    source_id: int,
    count: int,
    *,
    start: datetime | None = None,
    step: timedelta = timedelta(milliseconds=1),
) -> list[int]:
    """``count`` unprocessed raw rows, fetched_at ascending from ``start``."""
    start = start or now() - timedelta(days=1)
    rows = [
        {
            "source_id": source_id,
            "source_item_id": f"item-{i}",
            "url": f"http://127.0.0.1/item/{i}",
            "raw_json": {"title": f"item {i}"},
            "content_hash": f"hash-{i}",
            "fetched_at": start + i * step,
        }
        for i in range(count)
    ]
    inserted: list[int] = []
    for chunk in range(0, len(rows), 5000):
        result = conn.execute(
            sa.insert(schema.listings_raw).returning(schema.listings_raw.c.id),
            rows[chunk : chunk + 5000],
        )
        inserted.extend(result.scalars())
    return inserted


def raw_states(conn: sa.Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    t = schema.listings_raw
    result = conn.execute(sa.select(t).where(t.c.id.in_(list(ids))))
    return {row["id"]: dict(row) for row in result.mappings()}


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse`` with the garbage collector held off. On CPython 3.11.7 a collection
    inside the AST constructor runs finalizers (in a loaded CI, an earlier test's pooled
    connection rolling back and failing), Python code that lets another thread in, and the
    constructor's count of its own depth (one per interpreter) came out unbalanced: the
    parse failed with "SystemError: AST constructor recursion depth mismatch (before=138,
    after=193)" (python/cpython#106905, fixed in later releases)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename)
    finally:
        if was:
            gc.enable()


def holding_session(conn: sa.Connection) -> int:
    """The database's id of ``conn``'s session, whose transaction (begun here) the test
    holds idle while processes start: the pipeline's idle-transaction timeout (60 s,
    pipeline/backends/) is turned off for it. On a loaded CI the processes took longer
    than that; the server ended both holders' sessions, the processors then waited for
    nothing, and the test failed "the second processor waiting: not within 120 s"."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("SET idle_in_transaction_session_timeout = 0")
        query = "SELECT pg_backend_pid()"
    else:
        conn.exec_driver_sql("SET SESSION idle_transaction_timeout = 0")
        query = "SELECT CONNECTION_ID()"
    return int(conn.execute(sa.text(query)).scalar_one())


def lock_waiters(engine: sa.Engine, *, on: int | None = None) -> int:
    """How many sessions wait for a lock; ``on``: for one the session ``on`` holds.
    Poll it no more often than every 0.1 s: MariaDB refreshes its INNODB_TRX and
    INNODB_LOCK_WAITS only when they were last read 0.1 s ago or more, so a faster poll
    reads the first answer for ever."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                     " AND wait_event_type = 'Lock'")
            if on is not None:
                query += " AND CAST(:on AS integer) = ANY(pg_blocking_pids(pid))"
        elif on is None:
            query = "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
        else:
            query = ("SELECT count(*) FROM information_schema.INNODB_LOCK_WAITS w JOIN information_schema.INNODB_TRX t"
                     " ON t.trx_id = w.blocking_trx_id WHERE t.trx_mysql_thread_id = :on")
        return int(conn.execute(sa.text(query), {"on": on}).scalar_one())

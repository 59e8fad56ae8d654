"""MariaDB (10.6 or later): INSERT IGNORE, ON DUPLICATE KEY UPDATE, and InnoDB's
deadlocks avoided where they were met; "now" is this host's clock, bound per statement
by the claim (pipeline/queue/)."""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Connection, Engine

from pipeline.backends.changed import StoreChanged
from pipeline.backends.clock import seconds_text
from pipeline.backends.portable import (
    CHUNK,
    IDLE_IN_TRANSACTION_TIMEOUT_MS,
    Portable,
    Rows,
    held_by_session,
)
from pipeline.backends.upsert import ForwardUpsert
from pipeline.core.errors import ConfigError, DatabaseUnavailable

log = logging.getLogger(__name__)
# SQLAlchemy's names of the MySQL family: MariaDB through a ``mysql+`` URL is "mysql".
MARIADB = ("mysql", "mariadb")
# InnoDB's "deadlock found" and "lock wait timeout": it rolled the transaction back.
_INNODB_ROLLED_BACK = (1213, 1205)
# The server refused the data itself, though the driver (PyMySQL, which calls every
# server error it has not listed an OperationalError) says "operational": a CHECK
# constraint (MariaDB 4025, MySQL 3819), a string the column's charset cannot hold
# (1366), JSON that does not parse (3140, MariaDB 4038).
_DATA_REFUSED = frozenset({4025, 3819, 1366, 3140, 4038})


def refuses_the_data(orig: BaseException | None) -> bool:
    """``orig`` (a driver's error) is the MariaDB server refusing the values it was sent,
    whatever class the driver gave it: not the database being away."""
    if orig is None or type(orig).__module__.split(".")[0] not in ("pymysql", "MySQLdb"):
        return False
    return bool(orig.args) and orig.args[0] in _DATA_REFUSED
_TRIES = 8
MIN_MARIADB_VERSION = (10, 6)  # FOR UPDATE SKIP LOCKED
T = TypeVar("T")


class MariaDB(Portable):
    name = "mariadb"
    database_clock = False

    def engine_options(self, url: sa.URL, options: dict[str, Any]) -> None:
        """READ COMMITTED: a claim's SKIP LOCKED scan locks the rows it takes, not every
        row it reads past (InnoDB's REPEATABLE READ locks gaps and read rows too)."""
        options.setdefault("isolation_level", "READ COMMITTED")
        connect_args = options.setdefault("connect_args", {})
        connect_args.setdefault("connect_timeout", 10)
        connect_args.setdefault("charset", "utf8mb4")

    def configure(self, engine: Engine) -> None:
        """Each connection checks the server (MariaDB, new enough) and the database's
        collation (keys compared case-sensitively), then sets UTC, strict SQL and the
        idle-transaction timeout."""

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

    def in_transaction(self, engine: Engine, work: Callable[[Connection], T]) -> T:
        """Run again when InnoDB rolled ``work`` back to break a deadlock (up to 8 times,
        a few ms apart, doubling), as its manual asks of every application. Seen between
        claims and completions of due notifications: that queue's pending predicate is
        two ranges of its index, so a claim's locking read sorts what it found and holds
        every row it locked, not only those it returns, to its commit
        (tests/test_claim_concurrency.py)."""
        for attempt in range(_TRIES):
            try:
                with engine.begin() as conn:
                    return work(conn)
            except sa.exc.OperationalError as exc:
                code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
                if code not in _INNODB_ROLLED_BACK or attempt == _TRIES - 1:
                    raise
                log.debug("transaction rolled back by InnoDB (%s): run again", exc.orig)
                time.sleep(random.uniform(0.001, 0.005) * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def session_lock(self, engine: Engine, name: str, wait_seconds: int) -> AbstractContextManager[Connection | None]:
        """A named lock (``GET_LOCK``). Its name is the server's, so it names the database."""

        def acquire(conn: Connection) -> sa.Executable:
            named = f"{name}.{conn.exec_driver_sql('SELECT DATABASE()').scalar()}"[:64]
            got = conn.execute(sa.text("SELECT GET_LOCK(:name, :wait)"), {"name": named, "wait": wait_seconds})
            if got.scalar() != 1:
                raise DatabaseUnavailable(f"another session held lock {name!r} for {wait_seconds} s; try again")
            return sa.text("SELECT RELEASE_LOCK(:name)").bindparams(name=named)

        return held_by_session(engine, acquire)

    def insert_ignoring_conflicts(self, conn: Connection, table: sa.Table, rows: Rows, keys: list[str]) -> int:
        """INSERT IGNORE skips a row that clashes on any unique key (every caller's keys
        are all of its table's); it would also turn a value too long into a warning, but
        every value here is checked before (pipeline/core/inputs.py) or made here."""
        if not rows:
            return 0
        ignore = sa.insert(table).prefix_with("IGNORE").execution_options(preserve_rowcount=True)
        return int(conn.execute(ignore, list(rows)).rowcount)

    def add_to(self, conn: Connection, table: sa.Table, keys: Sequence[str], value: str, rows: Rows) -> None:
        """The rows missing are created (as 0) in a transaction of their own first, so
        that the add in ``conn``'s transaction only updates rows: an add that inserted
        its row deadlocked two others waiting on that row when its transaction rolled
        back (tests/test_counters.py). A read without locks finds the missing rows; a
        deadlock of the inserts is run again."""
        if not rows:
            return
        wanted = sorted({tuple(r[k] for k in keys) for r in rows})
        present = {tuple(r) for r in conn.execute(
            sa.select(*(table.c[k] for k in keys)).where(sa.tuple_(*(table.c[k] for k in keys)).in_(wanted)))}
        missing = [dict(zip(keys, key, strict=True)) | {value: 0} for key in wanted if key not in present]
        if missing:
            self.in_transaction(conn.engine, lambda own: own.execute(mysql.insert(table).prefix_with("IGNORE"), missing))
        duplicate = mysql.insert(table)
        conn.execute(duplicate.on_duplicate_key_update({value: table.c[value] + duplicate.inserted[value]}),
                     sorted(rows, key=lambda r: tuple(r[k] for k in keys)))

    def upsert(self, conn: Connection, table: sa.Table, rows: Rows, keys: Sequence[str]) -> None:
        if not rows:
            return
        insert = mysql.insert(table)
        conn.execute(insert.on_duplicate_key_update({k: insert.inserted[k] for k in rows[0] if k not in keys}), list(rows))

    def upsert_forward(self, conn: Connection, spec: ForwardUpsert, rows: Rows) -> Sequence[sa.Row[Any]] | None:
        """``ON DUPLICATE KEY UPDATE`` has no WHERE, so each assignment carries the
        condition ("not older"), and they run in order, each seeing the ones before: those
        that compare the old hash first, the content after, ``order`` (which the condition
        reads) last."""

        def build() -> Any:
            t = spec.table
            insert = mysql.insert(t)
            new = insert.inserted
            forward = spec.forward(new)
            changed = sa.and_(forward, t.c[spec.hash] != new[spec.hash])
            assignments: list[tuple[str, Any]] = [
                *((name, sa.case((changed, value), else_=t.c[name])) for name, value in spec.on_change.items()),
                *((name, sa.case((forward, new[name]), else_=t.c[name])) for name in spec.content),
                (spec.order, sa.case((forward, new[spec.order]), else_=t.c[spec.order])),
            ]
            return insert.on_duplicate_key_update(assignments)

        conn.execute(self._built(("forward", spec), build), list(rows))
        return None

    def record_hashes(self, conn: Connection, spec: StoreChanged, rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        """ON DUPLICATE KEY UPDATE has no RETURNING: the hashes kept are read first, then
        the rows new or changed written in one upsert per thousand. Only one writer
        stores a key's rows at a time (the collector's claim hands a source to one
        worker), so nothing changes them in between."""
        t = spec.hashes
        _, fresh = self.fresh(conn, spec, rows)
        values = [spec.kept(row) for row in fresh]
        for start in range(0, len(values), CHUNK):
            upsert = mysql.insert(t).values(values[start:start + CHUNK])
            conn.execute(upsert.on_duplicate_key_update(
                {spec.hash: upsert.inserted[spec.hash], spec.touched: sa.func.current_timestamp()}))
        return {spec.key_of(row) for row in fresh}

    def order_by(self, column: sa.ColumnElement[Any], *, descending: bool,
                 nulls_first: bool | None) -> sa.ColumnElement[Any]:
        """No NULLS FIRST/LAST here; MariaDB's own order puts NULLs first when ascending."""
        if nulls_first is not None and nulls_first == descending:
            raise NotImplementedError(f"{column} with NULLs {'first' if nulls_first else 'last'} on MariaDB")
        return column.desc() if descending else column.asc()

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        return sa.func.floor(sa.func.timestampdiff(sa.literal_column("SECOND"), since, now) / seconds_text(step))

"""The reference backend: plain SQLAlchemy statements that any database runs, correct
within one transaction of one writer. The other backends override what their database
does in fewer round trips or more safely under concurrency; what they do not override is
this."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine

from pipeline.backends.changed import StoreChanged
from pipeline.backends.clock import sql_now
from pipeline.backends.recent import Asking, RecentPerKey
from pipeline.backends.upsert import ForwardUpsert
from pipeline.core.errors import ConfigError

Rows = Sequence[Mapping[str, Any]]
Bind = Connection | Engine | Dialect
_ZERO = timedelta(0)
T = TypeVar("T")
# ``keys`` of ``insert_ignoring_conflicts`` for "any unique key of the table".
ANY_UNIQUE_KEY: list[str] = []
# A session left idle inside a transaction this long is ended by the database (unless
# the server, the role or DATABASE_URL's options set a timeout of their own): a worker
# cut off from the database in the middle of a transaction would otherwise hold its row
# locks for as long as its silent connection stays open, hours, and no other worker
# could take its rows over when their leases ran out. No transaction of the pipeline
# waits on anything but the database (fetches and deliveries run outside them).
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
# Rows per statement where each row's values are bound apart (SQLite allows 32,766 variables).
CHUNK = 1000


class Backend(Protocol):
    """What the pipeline asks of a database beyond portable SQL."""

    name: str
    # "Now" is the database's clock (hosts with skewed clocks share it), not this host's.
    database_clock: bool
    # A queue ordered by an aged priority is read one priority level at a time, each
    # level in its index's order (the levels found by a recursive CTE, each read by a
    # LATERAL subquery): a claim reads a few rows however many are ready, where sorting
    # every ready row by the aged priority grew with them (pipeline/queue/claim.py).
    reads_levels: bool

    def engine_options(self, url: sa.URL, options: dict[str, Any]) -> None:
        """Add to ``options`` (``sa.create_engine``'s keywords; those given stay) what
        this database needs; ConfigError where it cannot serve the pipeline."""
        ...

    def configure(self, engine: Engine) -> None:
        """Set up each new connection of ``engine`` (its session: time zone, timeouts,
        transaction control) as the pipeline relies on."""
        ...

    def now(self, type_: sa.types.TypeEngine[datetime], minus: timedelta = _ZERO) -> sa.ColumnElement[datetime]:
        """"Now" (less ``minus``) for SQL that compares with stored times."""
        ...

    def in_transaction(self, engine: Engine, work: Callable[[Connection], T]) -> T:
        """``work`` in a transaction of its own, run again where the database rolled it
        back to break a deadlock and asks the application to retry; ``work`` must be safe
        to run again."""
        ...

    def insert_rows(self, conn: Connection, table: sa.Table, rows: Rows, *,
                    ignore_conflicts_on: Sequence[str] = ()) -> int:
        """Insert ``rows`` (all with the same keys); how many went in. With
        ``ignore_conflicts_on`` (a key's columns, or ("*",) for any unique key) a row whose
        key exists is skipped."""
        ...

    def insert_ignoring_conflicts(self, conn: Connection, table: sa.Table, rows: Rows, keys: list[str]) -> int:
        """Insert ``rows``, skipping those whose ``keys`` exist (``ANY_UNIQUE_KEY``: that
        clash on any unique key); how many went in."""
        ...

    def upsert(self, conn: Connection, table: sa.Table, rows: Rows, keys: Sequence[str]) -> None:
        """Store ``rows`` (all with the same columns, in the order their rows are to be
        locked): insert each, or replace the other columns of the row with its ``keys``
        (the table's unique key)."""
        ...

    def upsert_forward(self, conn: Connection, spec: ForwardUpsert, rows: Rows) -> Sequence[sa.Row[Any]] | None:
        """Write ``rows`` (in ``spec.keys`` order) as ``spec`` says; the rows written
        (``spec.returning``) where the database hands them back in the same statement,
        else None (then the caller reads what it needs)."""
        ...

    def where_pairs(self, query: sa.Select[Any], first: sa.Column[Any], second: sa.Column[Any]) -> sa.Select[Any]:
        """``query`` limited to rows whose (``first``, ``second``) is one of the pairs
        ``pairs_params`` binds; the same SQL text for any number of pairs where the
        database allows (built once by the caller)."""
        ...

    def pairs_params(self, pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
        """The parameters of a ``where_pairs`` query for ``pairs``."""
        ...

    def recent_per_key(self, conn: Connection, spec: RecentPerKey, asking: Asking) -> Sequence[sa.Row[Any]]:
        """Per key column, the ``spec.per_key`` most recent rows under each value asked
        (``key_number``, ``key_value`` and ``spec.columns``), less ``asking.exclude``; a
        backend may leave out rows not near a fingerprint asking (``RecentPerKey``)."""
        ...

    def serialising_lock(self, table: sa.Table) -> sa.Select[Any]:
        """A statement that locks ``table``'s rows until the transaction ends (the
        transaction's later statements are planned for their own parameters where the
        database would otherwise plan a prepared statement once for any)."""
        ...

    def late_seconds(
        self, conn: Connection, happened: sa.Column[datetime], due: sa.Column[datetime],
        where: Sequence[sa.ColumnElement[bool]], quantiles: Sequence[float], *,
        since: sa.ColumnElement[datetime], by_hour: bool,
    ) -> list[tuple[datetime, int, tuple[float, ...]]]:
        """How late the rows ``where`` selects were (``happened`` after ``due``, never
        below zero): over the whole span since ``since``, or per hour of ``happened``
        (newest first), its start, how many and the ``quantiles`` of their lateness in
        seconds (interpolated between the closest ranks, as ``percentile_cont``). A span
        without rows is left out."""
        ...

    def estimated_rows(self, conn: Connection, table: sa.Table) -> int | None:
        """The database's own cheap estimate of ``table``'s rows, or None where it keeps
        none (then only a count tells)."""
        ...

    def store_changed(self, conn: Connection, spec: StoreChanged, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Store the ``rows`` (one per key: the last given) whose hash is new or changed,
        as ``spec`` says; each stored row's ``spec.returning``."""
        ...

    def unstored(self, conn: Connection, spec: StoreChanged, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The ``rows`` (one per key: the last given) that ``store_changed`` would store
        now, found without writing."""
        ...

    def order_by(self, column: sa.ColumnElement[Any], *, descending: bool,
                 nulls_first: bool | None) -> sa.ColumnElement[Any]:
        """``column`` as an ORDER BY term; ``nulls_first`` None leaves the database's
        default."""
        ...

    def adding_from(self, table: sa.Table, keys: Sequence[str], value: str, columns: Sequence[str],
                    select: sa.Selectable) -> sa.Insert:
        """``INSERT INTO table (columns) SELECT ...`` that adds each row's ``value`` to the
        stored row with its ``keys`` (the table's unique key): a statement to run inside
        another, as a CTE of the statement whose rows it counts."""
        ...

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        """How many whole ``step``s passed from ``since`` to ``now`` (never before it),
        its constants as SQL text (a claim is compiled once, sent as text)."""
        ...

    def add_to(self, conn: Connection, table: sa.Table, keys: Sequence[str], value: str, rows: Rows) -> None:
        """Add each row's ``value`` to the stored row with its ``keys`` (the table's
        unique key), creating it when missing; in ``keys`` order, so that two adders lock
        rows in one order."""
        ...

    def session_lock(self, engine: Engine, name: str, wait_seconds: int) -> AbstractContextManager[Connection | None]:
        """Hold the database-wide lock ``name``, waiting up to ``wait_seconds`` for it
        (DatabaseUnavailable after): one holder at a time however many processes on
        however many machines ask, released if the holder dies. Yields the connection
        that holds it, for the work to run on, or None where the lock is not a
        connection's (then the work takes its own)."""
        ...


class Portable:
    """The reference: what every database runs."""

    name = "portable"
    database_clock = False
    reads_levels = False  # no LATERAL on SQLite or MariaDB

    def __init__(self) -> None:
        self._statements: dict[Any, Any] = {}

    def now(self, type_: sa.types.TypeEngine[datetime], minus: timedelta = _ZERO) -> sa.ColumnElement[datetime]:
        return sql_now(type_, database_clock=self.database_clock, minus=minus)

    def engine_options(self, url: sa.URL, options: dict[str, Any]) -> None:
        return None

    def configure(self, engine: Engine) -> None:
        return None

    def in_transaction(self, engine: Engine, work: Callable[[Connection], T]) -> T:
        with engine.begin() as conn:
            return work(conn)

    def session_lock(self, engine: Engine, name: str, wait_seconds: int) -> AbstractContextManager[Connection | None]:
        raise ConfigError(f"no lock {name!r} on a {engine.dialect.name} database: the pipeline runs on "
                          "PostgreSQL, SQLite and MariaDB")

    def insert_rows(self, conn: Connection, table: sa.Table, rows: Rows, *,
                    ignore_conflicts_on: Sequence[str] = ()) -> int:
        if not rows:
            return 0
        if ignore_conflicts_on:
            keys = [] if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
            return self.insert_ignoring_conflicts(conn, table, rows, keys)
        conn.execute(sa.insert(table), list(rows))  # an executemany
        return len(rows)

    def insert_ignoring_conflicts(self, conn: Connection, table: sa.Table, rows: Rows, keys: list[str]) -> int:
        # Look first (a NULL clashes with nothing, as in SQL).
        if not rows:
            return 0
        key_sets = [keys] if keys else unique_keys(table)
        present = [
            {tuple(r) for r in conn.execute(sa.select(*(table.c[k] for k in ks)))} for ks in key_sets
        ]
        fresh = []
        for r in rows:
            values = [tuple(r[k] for k in ks) for ks in key_sets]
            if any(None not in v and v in seen for v, seen in zip(values, present, strict=True)):
                continue
            fresh.append(r)
            for v, seen in zip(values, present, strict=True):
                seen.add(v)
        if fresh:
            conn.execute(sa.insert(table), fresh)
        return len(fresh)

    def upsert(self, conn: Connection, table: sa.Table, rows: Rows, keys: Sequence[str]) -> None:
        for row in rows:
            where = sa.and_(*(table.c[k] == row[k] for k in keys))
            conn.execute(sa.delete(table).where(where))
            conn.execute(sa.insert(table).values(dict(row)))

    def upsert_forward(self, conn: Connection, spec: ForwardUpsert, rows: Rows) -> Sequence[sa.Row[Any]] | None:
        # Per row: read the stored one, then insert, or update when not older.
        t = spec.table
        for row in rows:
            where = sa.and_(*(t.c[k] == row[k] for k in spec.keys))
            stored = conn.execute(sa.select(t.c[spec.order], t.c[spec.hash]).where(where)).first()
            if stored is None:
                conn.execute(sa.insert(t).values(dict(row)))
                continue
            if stored[0] is not None and row[spec.order] < stored[0]:
                continue  # older than what is stored
            values: dict[str, Any] = {c: row[c] for c in (*spec.content, spec.order)}
            if stored[1] != row[spec.hash]:
                values.update(spec.on_change)
            conn.execute(sa.update(t).where(where).values(values))
        return None

    def where_pairs(self, query: sa.Select[Any], first: sa.Column[Any], second: sa.Column[Any]) -> sa.Select[Any]:
        return query.where(sa.tuple_(first, second).in_(sa.bindparam("pairs", expanding=True)))

    def pairs_params(self, pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
        return {"pairs": list(pairs)}

    def recent_per_key(self, conn: Connection, spec: RecentPerKey, asking: Asking) -> Sequence[sa.Row[Any]]:
        # A window per key column; the fingerprints are not looked at (callers check).
        stmt = self._built(("recent", spec), lambda: self._recent_ranked(spec))
        params: dict[str, Any] = {"exclude": list(asking.exclude)}
        params.update({f"values_{n}": sorted(values) for n, values in enumerate(asking.values)})
        return conn.execute(stmt, params).all()

    @staticmethod
    def _recent_ranked(spec: RecentPerKey) -> sa.CompoundSelect[Any]:
        t = spec.table

        def part(number: int, column: str, key_number: Any, stored: list[sa.Column[Any]]) -> sa.Select[Any]:
            rank = sa.func.row_number().over(partition_by=t.c[column], order_by=t.c.id.desc()).label("rank")
            ranked = (sa.select(t.c[column].label("key_value"), *stored, rank)
                      .where(t.c[column].in_(sa.bindparam(f"values_{number}", expanding=True)),
                             t.c.id.not_in(sa.bindparam("exclude", expanding=True)))
                      .subquery(f"r{number}"))
            return (sa.select(key_number, ranked.c.key_value, *(ranked.c[c.name] for c in stored))
                    .where(ranked.c.rank <= spec.per_key))

        return spec.union(part)

    def serialising_lock(self, table: sa.Table) -> sa.Select[Any]:
        return sa.select(*table.primary_key.columns).with_for_update()

    def _built(self, key: Any, build: Callable[[], T]) -> T:
        """The statement ``key`` names, built once per backend (SQLAlchemy then caches its
        SQL). A spec in a key is compared by identity, and kept alive by the key."""
        if key not in self._statements:
            self._statements[key] = build()
        return self._statements[key]  # type: ignore[no-any-return]

    def late_seconds(
        self, conn: Connection, happened: sa.Column[datetime], due: sa.Column[datetime],
        where: Sequence[sa.ColumnElement[bool]], quantiles: Sequence[float], *,
        since: sa.ColumnElement[datetime], by_hour: bool,
    ) -> list[tuple[datetime, int, tuple[float, ...]]]:
        # The rows' values in Python (a small deployment's).
        origin = conn.execute(sa.select(since)).scalar_one()
        spans: dict[datetime, list[float]] = {}
        for at, was_due in conn.execute(sa.select(happened, due).where(*where)):
            key = at.replace(minute=0, second=0, microsecond=0) if by_hour else origin
            spans.setdefault(key, []).append(max(0.0, (at - was_due).total_seconds()))
        return [(key, len(values), tuple(_quantile(values, q) for q in quantiles))
                for key, values in sorted(spans.items(), reverse=True)]

    def estimated_rows(self, conn: Connection, table: sa.Table) -> int | None:
        return None

    def store_changed(self, conn: Connection, spec: StoreChanged, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        unique = spec.unique(list(rows))
        if not unique:
            return []
        fresh = self.record_hashes(conn, spec, unique)
        stored = [row for row in unique if spec.key_of(row) in fresh]
        if stored:
            conn.execute(sa.insert(spec.rows), [spec.bound(row) for row in stored])  # an executemany
        at = spec.position(spec.returning)
        return [row[at] for row in stored]

    def unstored(self, conn: Connection, spec: StoreChanged, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return self.fresh(conn, spec, spec.unique(list(rows)))[1]

    def fresh(self, conn: Connection, spec: StoreChanged, rows: list[tuple[Any, ...]]
              ) -> tuple[dict[tuple[Any, ...], Any], list[tuple[Any, ...]]]:
        """The hashes kept for the ``rows``' keys (``known_hashes``), and the rows whose
        hash is not the one kept (new, or changed)."""
        known, h = self.known_hashes(conn, spec, rows), spec.position(spec.hash)
        return known, [row for row in rows if known.get(spec.key_of(row)) != row[h]]

    def record_hashes(self, conn: Connection, spec: StoreChanged, rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        """Keep each row's hash in ``spec.hashes``; the keys that were new or changed.
        Here: read the hashes kept, then write each that differs (an update, or an
        insert). Only one writer stores a key's rows at a time (the collector's claim
        hands a source to one worker), so nothing changes them in between."""
        t, h = spec.hashes, spec.position(spec.hash)
        known, fresh = self.fresh(conn, spec, rows)
        for row in fresh:
            key = spec.key_of(row)
            if key in known:
                where = [t.c[k] == v for k, v in zip(spec.keys, key, strict=True)]
                conn.execute(sa.update(t).where(*where).values(
                    {spec.hash: row[h], spec.touched: sa.func.current_timestamp()}))
            else:
                conn.execute(sa.insert(t).values(spec.kept(row)))
        return {spec.key_of(row) for row in fresh}

    @staticmethod
    def known_hashes(conn: Connection, spec: StoreChanged, rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
        """The hash kept for each of the ``rows``' keys that ``spec.hashes`` has: per
        value of the keys but the last (a prefix of its primary key), the last's values
        a thousand at a time (well under SQLite's bound-variable limit)."""
        t = spec.hashes
        *prefix, last = spec.keys
        by_prefix: dict[tuple[Any, ...], list[Any]] = {}
        for row in rows:
            key = spec.key_of(row)
            by_prefix.setdefault(key[:-1], []).append(key[-1])
        known: dict[tuple[Any, ...], Any] = {}
        for head, lasts in by_prefix.items():
            for start in range(0, len(lasts), CHUNK):
                query = sa.select(*(t.c[k] for k in spec.keys), t.c[spec.hash]).where(
                    *(t.c[k] == v for k, v in zip(prefix, head, strict=True)),
                    t.c[last].in_(lasts[start:start + CHUNK]))
                known.update({tuple(found[:-1]): found[-1] for found in conn.execute(query)})
        return known

    def order_by(self, column: sa.ColumnElement[Any], *, descending: bool,
                 nulls_first: bool | None) -> sa.ColumnElement[Any]:
        term = column.desc() if descending else column.asc()
        if nulls_first is True:
            return term.nulls_first()
        if nulls_first is False:
            return term.nulls_last()
        return term

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        raise NotImplementedError(f"{self.name}: no portable SQL for the time between two timestamps")

    def adding_from(self, table: sa.Table, keys: Sequence[str], value: str, columns: Sequence[str],
                    select: sa.Selectable) -> sa.Insert:
        raise NotImplementedError(f"{self.name}: no portable INSERT that adds to the rows it meets")

    def add_to(self, conn: Connection, table: sa.Table, keys: Sequence[str], value: str, rows: Rows) -> None:
        # An UPDATE per row; the rows it found no stored row for are inserted.
        where = sa.and_(*(table.c[k] == sa.bindparam(f"key_{k}") for k in keys))
        adding = sa.update(table).where(where).values({value: table.c[value] + sa.bindparam("add")})
        missing = []
        for row in sorted(rows, key=lambda r: tuple(r[k] for k in keys)):
            params = {**{f"key_{k}": row[k] for k in keys}, "add": row[value]}
            if conn.execute(adding, params).rowcount == 0:
                missing.append(row)
        if missing:
            conn.execute(sa.insert(table), missing)


def unique_keys(table: sa.Table) -> list[list[str]]:
    """The column lists of ``table``'s primary key, unique constraints and unique indexes."""
    keys = [[c.name for c in table.primary_key.columns]] if table.primary_key.columns else []
    keys += [[c.name for c in u.columns] for u in table.constraints if isinstance(u, sa.UniqueConstraint)]
    keys += [[c.name for c in i.columns] for i in table.indexes if i.unique]
    return keys


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0.01 steps) with linear interpolation between the closest
    ranks, as PostgreSQL's ``percentile_cont`` computes it."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


@contextmanager
def held_by_session(engine: Engine, acquire: Callable[[Connection], sa.Executable]) -> Iterator[Connection]:
    """A lock that is its session's (it outlives the transaction that took it, and dies
    with the connection): ``acquire`` takes it on a connection and returns the statement
    that releases it; the connection is yielded while it holds it."""
    with engine.connect() as conn:
        release = acquire(conn)
        conn.commit()
        try:
            yield conn
        finally:
            conn.rollback()
            conn.execute(release)
            conn.commit()

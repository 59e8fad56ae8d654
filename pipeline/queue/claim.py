"""The claim primitive: every stage takes its work from a table through ``WorkQueue``.

A claim marks up to ``limit`` ready rows with a lease (``locked_until``), the claiming
worker (``claimed_by``) and a fresh fencing token (``claim_token``), and returns them in
their post-claim state. Completion, release and lease extension are fenced by token and
worker: a worker whose lease expired and whose rows were claimed again changes nothing.
The SQL each database runs is in pipeline/queue/sql/, rendered (tests/test_golden_sql.py).

Indexes: every queue has two partial indexes built from the same predicates the claim
uses (``QueueSpec.indexes``): a *free* index over ready rows with no lease, and a *leased*
index over ``locked_until`` of rows that hold one, so that both branches of a claim
("unclaimed" and "lease expired") are index range scans, never a scan of the table.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine

from pipeline.queue.recordset import json_rows, recordset

log = logging.getLogger(__name__)

Predicate = sa.ColumnElement[bool]
# SQLAlchemy's names of the MySQL family: MariaDB through a ``mysql+`` URL is "mysql".
MARIADB = ("mysql", "mariadb")
# InnoDB's "deadlock found" and "lock wait timeout": it rolled the transaction back.
_INNODB_ROLLED_BACK = (1213, 1205)
_TRIES = 8

T = TypeVar("T")


def in_transaction(engine: Engine, work: Callable[[Connection], T]) -> T:
    """``work`` in a transaction of its own; on MariaDB, run again when InnoDB rolled it
    back to break a deadlock (up to 8 times, a few ms apart, doubling), as its manual
    asks of every application. Seen between claims and completions of due
    notifications: that queue's pending predicate is two ranges of its index, so a
    claim's locking read sorts what it found and holds every row it locked, not only
    those it returns, to its commit (tests/test_claim_concurrency.py). ``work`` must be
    safe to run again: everything it did was rolled back."""
    for attempt in range(_TRIES):
        try:
            with engine.begin() as conn:
                return work(conn)
        except sa.exc.OperationalError as exc:
            code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
            if engine.dialect.name not in MARIADB or code not in _INNODB_ROLLED_BACK or attempt == _TRIES - 1:
                raise
            log.debug("transaction rolled back by InnoDB (%s): run again", exc.orig)
            time.sleep(random.uniform(0.001, 0.005) * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover
# A claimed row: its columns by name (a dict from the driver on PostgreSQL's fast path).
Row = Mapping[Any, Any]


@dataclass(frozen=True)
class OrderTerm:
    """One ``ORDER BY`` term; ``nulls_first=None`` leaves the database default."""

    column: sa.Column[Any]
    descending: bool = False
    nulls_first: bool | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The columns the term reads (a claim returns them, to sort its rows)."""
        return (self.column.name,)

    def sql(self, over: Any = None, *, now: sa.ColumnElement[datetime] | None = None,
            dialect: str = "postgresql") -> sa.ColumnElement[Any]:
        """The term over the table's column, or over the same-named column of the
        derived table ``over`` (a CTE or subquery of the queue's rows). ``now`` and
        ``dialect`` are for terms that depend on the time (``AgedTerm``)."""
        column = self.column if over is None else over.c[self.column.name]
        term = column.desc() if self.descending else column.asc()
        if dialect in MARIADB:
            # No NULLS FIRST/LAST there; its own order puts NULLs first when ascending.
            if self.nulls_first is not None and self.nulls_first == self.descending:
                raise NotImplementedError(f"{self.column} with NULLs {'first' if self.nulls_first else 'last'}"
                                          " on MariaDB")
            return term
        if self.nulls_first is True:
            return term.nulls_first()
        if self.nulls_first is False:
            return term.nulls_last()
        return term

    def sort(self, rows: list[Row]) -> None:
        """Stable in-place sort of ``rows`` by this term alone, as the database orders it."""
        # Databases put NULLs last in ascending order unless told otherwise (PostgreSQL
        # and the SQL standard); sorting with reverse=True flips where they land.
        nulls_first = self.descending if self.nulls_first is None else self.nulls_first
        none_key = (0,) if nulls_first != self.descending else (2,)
        name = self.column.name
        rows.sort(
            key=lambda row: none_key if row[name] is None else (1, row[name]),
            reverse=self.descending,
        )


@dataclass(frozen=True)
class AgedTerm(OrderTerm):
    """A priority (``column``, NOT NULL, highest first) that rises by one for every
    ``step`` that has passed since the row's ``since`` (its due time; NULL: none): work
    that has waited long enough is taken before newer work of a higher priority, so no
    priority starves the rest. A row waits behind rows that came due after it for at
    most (their priority - its priority) x ``step``."""

    since: sa.Column[datetime] | None = None
    step: timedelta = timedelta(minutes=10)

    @property
    def names(self) -> tuple[str, ...]:
        assert self.since is not None
        return (self.column.name, self.since.name)

    def sql(self, over: Any = None, *, now: sa.ColumnElement[datetime] | None = None,
            dialect: str = "postgresql") -> sa.ColumnElement[Any]:
        assert self.since is not None and now is not None, "an aged term needs the claim's now"
        column = self.column if over is None else over.c[self.column.name]
        since = self.since if over is None else over.c[self.since.name]
        # Constants as SQL text, not parameters: the claim is compiled once, sent as text.
        seconds: sa.ColumnElement[Any] = sa.literal_column(f"{self.step.total_seconds():.1f}")
        if dialect == "postgresql":
            steps: sa.ColumnElement[Any] = sa.func.floor(sa.extract("epoch", now - since) / seconds)
        elif dialect in MARIADB:
            steps = sa.func.floor(sa.func.timestampdiff(sa.literal_column("SECOND"), since, now) / seconds)
        else:  # SQLite: times are UTC text; a due row's age is never negative, so the cast floors
            age = (sa.func.julianday(now) - sa.func.julianday(since)) * sa.literal_column("86400.0")
            steps = sa.cast(age / seconds, sa.Integer())
        return (column + sa.func.coalesce(steps, sa.literal_column("0"))).desc()

    def sort(self, rows: list[Row]) -> None:
        assert self.since is not None
        now, name, since = datetime.now(UTC), self.column.name, self.since.name
        step = self.step.total_seconds()

        def aged(row: Row) -> float:
            due = row[since]
            return float(row[name]) + (0 if due is None else max(0.0, (now - due).total_seconds()) // step)

        rows.sort(key=aged, reverse=True)


@dataclass(frozen=True)
class QueueSpec:
    """What one stage claims.

    ``pending`` is the static part of the stage's criteria; it is also the predicate of
    the queue's partial indexes, so keep it free of time and parameters. ``ready`` adds
    the time-dependent part (for example "next_fetch_at is due"), given the SQL
    expression for "now". ``index_on`` are the columns of the free index: the ``order``
    columns when the queue is read in order, or the column ``ready`` ranges over.
    """

    name: str
    table: sa.Table
    pending: Predicate
    order: tuple[OrderTerm, ...]
    index_on: tuple[sa.Column[Any], ...]
    ready: Callable[[sa.ColumnElement[datetime]], Predicate] | None = None
    # The column counting claims of a row's current piece of work. The claim statement
    # itself adds one (as River does), so work whose handling kills its worker still
    # uses up its attempts and ends (see ``exhausted``) instead of coming back forever.
    attempts: sa.Column[int] | None = None
    # Rows whose earlier holder may have died while working on them (``attempts`` > 1
    # with no outcome recorded): ``WorkQueue.isolate`` has them worked on one at a time,
    # so work that kills its worker uses up its own attempts, not its neighbours'.
    suspect: Callable[[Row], bool] | None = None
    # The columns ``pending`` tests, which lead the queue's index where there are no
    # partial indexes (MariaDB: see ``indexes``).
    pending_on: tuple[sa.Column[Any], ...] = ()

    def exhausted(self, row: Row, max_attempts: int) -> bool:
        """True when ``row`` was claimed more than ``max_attempts`` times without being
        finished: every earlier holder stopped (killed, cut off, lease lost) before it
        completed. Its stage must end it now (given up, dead) rather than try again."""
        return self.attempts is not None and int(row[self.attempts.name]) > max_attempts

    # The queue's states: the one home of their predicates, used by the claim, its
    # indexes, `pipeline status` and the health checks.

    def free(self) -> Predicate:
        """Rows of the queue that no worker holds (the free index's predicate)."""
        return self.pending & self.table.c.locked_until.is_(None)

    def leased(self) -> Predicate:
        """Rows of the queue a worker holds or held; the lease may have run out (the
        leased index's predicate)."""
        return self.pending & self.table.c.locked_until.is_not(None)

    def expired(self, now: sa.ColumnElement[datetime]) -> Predicate:
        """Leased rows whose lease ran out by ``now``: claimable again."""
        return self.leased() & (self.table.c.locked_until <= now)

    def held(self, now: sa.ColumnElement[datetime]) -> Predicate:
        """Leased rows whose lease still runs at ``now``: work in flight."""
        return self.leased() & (self.table.c.locked_until > now)

    def ready_at(self, now: sa.ColumnElement[datetime]) -> list[Predicate]:
        """The time-dependent criteria at ``now`` (none for a queue without ``ready``)."""
        return [self.ready(now)] if self.ready is not None else []

    def indexes(self) -> list[sa.Index]:
        """The queue's indexes; call once, when the schema is defined.

        PostgreSQL and SQLite: two partial indexes, of the free rows (in the queue's
        order) and of the leased ones (by lease). MariaDB has no partial index: one
        index leads with the ``pending`` columns and the lease, then the order, so both
        branches of the claim read a range of it (the free rows: ``pending`` and
        ``locked_until IS NULL`` in the queue's order; the expired leases: a range of
        ``locked_until``)."""
        t = self.table
        free, leased = self.free(), self.leased()
        return [
            sa.Index(
                f"ix_{t.name}_{self.name}_free",
                *self.index_on,
                postgresql_where=free,
                sqlite_where=free,
            ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # a tuple is documented
            sa.Index(
                f"ix_{t.name}_{self.name}_leased",
                t.c.locked_until,
                postgresql_where=leased,
                sqlite_where=leased,
            ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # a tuple is documented
            sa.Index(
                f"ix_{t.name}_{self.name}_free", *self.pending_on, t.c.locked_until, *self.index_on,
            ).ddl_if(dialect=("mysql", "mariadb")),  # type: ignore[arg-type]
        ]

    def sort(self, rows: Iterable[Row]) -> list[Row]:
        ordered = list(rows)
        for term in reversed(self.order):
            term.sort(ordered)
        return ordered


# What a write that changes the meaning of a claimed row (new content, a refresh, a
# requeue) sets besides its own values: the holder's completion is then fenced out
# (``Fenced.lost``) and the row is claimable afresh, so the new meaning is worked on.
UNCLAIMED: Mapping[str, None] = {"locked_until": None, "claimed_by": None, "claim_token": None}


@dataclass(frozen=True)
class Claim:
    """Rows one worker holds under one token, in the queue's order."""

    queue: str
    worker: str
    token: str
    rows: list[Row]

    @property
    def ids(self) -> list[int]:
        return [row["id"] for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)


@dataclass(frozen=True)
class RowCompletion:
    """One claimed row to finish with values of its own (see ``WorkQueue.complete_each``)."""

    claim: Claim
    row_id: int
    values: Mapping[str, Any]


@dataclass(frozen=True)
class Fenced:
    """Outcome of a fenced write: the rows it changed, and the rows it no longer owned."""

    done: list[int]
    lost: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _DriverStatement:
    """A statement as psycopg runs it (PostgreSQL's hot path): its SQL with PostgreSQL's
    own ``$n`` placeholders, the parameter each one takes (``order``), the values of its
    fixed parameters, and for a fenced write each set column's conversion (None when the
    driver takes the value as it is).

    ``$n`` placeholders make it a raw query (``psycopg.RawCursor``): psycopg parses a
    ``%(name)s`` statement's placeholders at every execution when the statement is over
    4 KB (its cache's limit), as the polite claim is: 3.8% of the collector's samples
    in a profile of its passes (bench/RESULTS.md, "The claim as a raw query")."""

    sql: str
    order: tuple[str, ...]
    fixed: dict[str, Any]
    convert: Mapping[str, Callable[[Any], Any] | None] = field(default_factory=dict)

    def arguments(self, params: Mapping[str, Any]) -> list[Any]:
        """The values of ``$1``, ``$2`` ...: from ``params``, else the fixed ones."""
        fixed = self.fixed
        return [params[name] if name in params else fixed[name] for name in self.order]

    def execute(self, pg: Any, params: Mapping[str, Any]) -> Any:
        """Run on the psycopg connection ``pg`` (prepared on the server); its cursor."""
        return psycopg.RawCursor(pg).execute(self.sql, self.arguments(params), prepare=True)


# The placeholders of SQL compiled for psycopg (``%(name)s``) and its escaped percent sign.
_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")


def _dollar_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with PostgreSQL's ``$n`` placeholders instead of psycopg's ``%(name)s``
    (a name used twice is one placeholder), and the name each ``$n`` stands for."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PYFORMAT.sub(number, sql), tuple(order)


def sql_now(
    type_: sa.types.TypeEngine[datetime], *, database_clock: bool, minus: timedelta = timedelta(0),
    bind: str | None = None,
) -> sa.ColumnElement[datetime]:
    """"Now" (less ``minus``) for SQL that compares with stored times (leases, due times,
    ages): the one rule. With ``database_clock`` (PostgreSQL) the database's own clock,
    the truth that hosts with skewed clocks share; otherwise (SQLite, whose file is on
    this host) this host's clock: the bound parameter ``bind``, whose value the caller
    gives at each execution of a statement built once, or else a literal of now."""
    if database_clock:
        now = sa.func.now(type_=type_)
        return now if not minus else now - sa.literal(minus, sa.Interval())
    if bind is not None:
        return sa.bindparam(bind, type_=type_)
    return sa.literal(datetime.now(UTC) - minus, type_)


class Strategy(Enum):
    POSTGRES = "postgres"  # one CTE round trip with FOR UPDATE SKIP LOCKED
    SQLITE = "sqlite"  # one UPDATE ... RETURNING under BEGIN IMMEDIATE
    PORTABLE = "portable"  # read candidates, then one guarded UPDATE per row
    # A short transaction: SELECT ... FOR UPDATE SKIP LOCKED, an UPDATE of exactly the
    # ids it locked, a read-back (MariaDB has SKIP LOCKED but no UPDATE ... RETURNING).
    MARIADB = "mariadb"


def strategy_for(dialect_name: str) -> Strategy:
    if dialect_name == "postgresql":
        return Strategy.POSTGRES
    if dialect_name == "sqlite":
        return Strategy.SQLITE
    if dialect_name in MARIADB:
        return Strategy.MARIADB
    return Strategy.PORTABLE


class WorkQueue:
    """Claim, complete, release and extend rows of one queue on one engine.

    Each statement is built once per queue, with bound parameters, and reused: a claim
    costs one execution, not a rebuild of the SQL (see bench/claim_throughput.py).

    On PostgreSQL the hot statements (the claim, and a completion whose values need no
    conversion by SQLAlchemy) are sent by psycopg itself, compiled once and prepared on
    the server, on a connection from the engine's pool: SQLAlchemy's per-statement work
    was most of a claim's client CPU (bench/RESULTS.md). ``complete_and_claim`` sends a
    batch's completion and the next claim in one round trip and one commit.
    """

    def __init__(
        self,
        engine: Engine,
        spec: QueueSpec,
        *,
        lease_seconds: int = 300,
        strategy: Strategy | None = None,
        columns: Iterable[str] | None = None,
    ) -> None:
        """``columns``: what a claim returns besides what the queue itself reads (``id``,
        the columns of its order, its attempts); every column when None."""
        if lease_seconds < 1:
            raise ValueError(f"lease_seconds must be at least 1, got {lease_seconds}")
        self.engine = engine
        self.spec = spec
        self.lease = timedelta(seconds=lease_seconds)
        self.strategy = strategy or strategy_for(engine.dialect.name)
        self.columns = self._returned(columns)
        # A claim, and a fenced write the caller does not put in its own transaction,
        # is one statement: atomic by itself, so on PostgreSQL it runs in autocommit
        # (one round trip, no BEGIN/COMMIT). SQLite keeps BEGIN IMMEDIATE: there, a
        # write that starts as a read can fail on a busy snapshot without waiting.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._one_statement = engine if self.strategy is Strategy.SQLITE else self._autocommit
        self._time_type = spec.table.c.locked_until.type
        self._claim_stmt = self._build_claim()
        # PostgreSQL runs the claim as SQL compiled once, by the driver: it skips
        # SQLAlchemy's per-call work and per-row type processing. That is safe because
        # pipeline/storage/db.py pins every PostgreSQL session to UTC and psycopg decodes
        # JSON itself.
        # Its constants (bound parameters of the compiled text) go with every execution.
        self._claim_sql: _DriverStatement | None = None
        if self.strategy is Strategy.POSTGRES:
            self._claim_sql = self._driver_sql(self._claim_stmt)
        self._claim_names = [c.name for c in self.columns]  # what a claim returns, in order
        self._fenced: dict[tuple[str, ...], sa.Update] = {}
        self._fenced_sql: dict[tuple[str, ...], _DriverStatement] = {}
        # MariaDB's claim locks each branch's rows with a query of its own.
        self._locking = self._mariadb_locking() if self.strategy is Strategy.MARIADB else None
        # The unlocked candidate query (portable claims) and the sensor's capped count.
        self._chosen = self._chosen_ids()
        self._count_stmt = sa.select(sa.func.count()).select_from(self._chosen.subquery())

    def _returned(self, columns: Iterable[str] | None) -> tuple[sa.Column[Any], ...]:
        t, spec = self.spec.table, self.spec
        if columns is None:
            return tuple(t.c)
        names = ["id", *(name for term in spec.order for name in term.names)]
        if spec.attempts is not None:
            names.append(spec.attempts.name)
        for name in columns:
            if name not in t.c:
                raise ValueError(f"{t.name} has no column {name!r} for a claim to return")
            names.append(name)
        return tuple(t.c[name] for name in dict.fromkeys(names))

    # -- the driver's own path (PostgreSQL) ---------------------------------------------

    def _driver_sql(
        self, stmt: sa.Update | sa.Select[Any], convert: Mapping[str, Callable[[Any], Any] | None] | None = None,
    ) -> _DriverStatement:
        """``stmt`` as psycopg runs it: compiled by the engine's dialect, its placeholders
        then PostgreSQL's own."""
        compiled = stmt.compile(dialect=self.engine.dialect)
        sql, order = _dollar_placeholders(str(compiled))
        return _DriverStatement(sql, order, dict(compiled.params), convert or {})

    @contextmanager
    def _driver(self) -> Iterator[Any]:
        """A psycopg connection from the engine's pool, in autocommit while it is lent.

        Its errors reach the caller as SQLAlchemy's (``sa.exc.DBAPIError``), as every
        other statement's do, and a connection the error broke leaves the pool.
        """
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            raw = self.engine.raw_connection()  # unlike Engine.connect, it does not wrap errors
        except dbapi_error as exc:
            raise sa.exc.DBAPIError.instance(None, None, exc, dbapi_error, hide_parameters=True) from exc
        pg = raw.driver_connection
        assert pg is not None
        try:
            pg.autocommit = True
            yield pg
        except dbapi_error as exc:
            broken = bool(pg.closed or pg.broken or self.engine.dialect.is_disconnect(exc, pg, None))
            if broken:
                # As SQLAlchemy does on a disconnect: this connection leaves the pool, and
                # every other the pool holds is stale too (a server restart): the engine
                # starts a new pool (the old one's idle connections are closed now, those
                # lent out when they come back).
                raw.invalidate(exc)
                self.engine.dispose()
            raise sa.exc.DBAPIError.instance(
                None, None, exc, dbapi_error, hide_parameters=True, connection_invalidated=broken
            ) from exc
        finally:
            if not pg.closed:
                if pg.info.transaction_status == pg.info.transaction_status.IDLE:
                    pg.autocommit = False  # as the pool lends it to everyone else
                else:
                    raw.invalidate()
            raw.close()

    def _rows(self, cursor: Any) -> list[Row]:
        """A claim's rows (``self.columns``, in order: psycopg's ``description`` builds a
        column object per column at each call)."""
        names = self._claim_names
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

    # -- time ---------------------------------------------------------------------------

    def now(self) -> sa.ColumnElement[datetime]:
        """"Now" in this queue's statements (``sql_now``); off PostgreSQL, the bound
        parameter ``claim_now``, set per execution (see ``_time_params``)."""
        return sql_now(self._time_type, database_clock=self.strategy is Strategy.POSTGRES, bind="claim_now")

    def _lease_until(self) -> sa.ColumnElement[datetime]:
        if self.strategy is Strategy.POSTGRES:
            return self.now() + sa.bindparam("claim_lease", type_=sa.Interval())
        return sa.bindparam("claim_until", type_=self._time_type)

    def _time_params(self, lease: timedelta) -> dict[str, Any]:
        if self.strategy is Strategy.POSTGRES:
            return {"claim_lease": lease}
        now = datetime.now(UTC)
        return {"claim_now": now, "claim_until": now + lease}

    # -- claim --------------------------------------------------------------------------

    def statements(self, completes: tuple[str, ...]) -> dict[str, sa.Executable]:
        """The queue's SQL as named artefacts: the claim, the completion that sets
        ``completes`` (and, on PostgreSQL, its one-statement form for rows with values of
        their own) and the lease extension. tests/test_golden_sql.py renders them into
        pipeline/queue/sql/, so a change to a hot query is reviewed as a diff."""
        named: dict[str, sa.Executable] = {}
        if self._locking is not None:  # MariaDB: the claim's locking reads, then its UPDATE
            named["claim_expired"], named["claim_free"] = self._locking
        named["claim"] = self._claim_stmt
        named["complete"] = self._fenced_statement(completes)
        if self.strategy is Strategy.POSTGRES:
            named["complete_each"] = self._fenced_each_statement(completes)
        named["extend"] = self._fenced_statement((), extend=True)
        return named

    def claim(self, worker: str, limit: int) -> Claim:
        """Lease up to ``limit`` ready rows to ``worker``; never more than ``limit``."""
        token, params = self._claim_params(worker, limit)
        if self.strategy is Strategy.PORTABLE:
            rows: Sequence[Row] = self._claim_portable(params)
        elif self.strategy is Strategy.MARIADB:
            rows = self._claim_mariadb(params, limit)
        elif self._claim_sql is not None:
            with self._driver() as pg:
                rows = self._rows(self._claim_sql.execute(pg, params))
        else:
            with self._one_statement.begin() as conn:
                rows = conn.execute(self._claim_stmt, params).mappings().all()
        return Claim(self.spec.name, worker, token, self.spec.sort(rows))

    def _claim_params(self, worker: str, limit: int) -> tuple[str, dict[str, Any]]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        token = uuid.uuid4().hex
        return token, {
            "claim_limit": limit,
            "claim_worker": worker,
            "claim_token": token,
            **self._time_params(self.lease),
        }

    def complete_and_claim(
        self, claim: Claim, values: Mapping[str, Any], limit: int, *, ids: Sequence[int] | None = None
    ) -> tuple[Fenced, Claim]:
        """``complete`` then ``claim`` for the same worker: on PostgreSQL in one round
        trip and one transaction (psycopg's pipeline mode), so a worker that finishes a
        batch and takes the next waits for the database once and commits once. If the
        completion fails, the next claim is not taken either."""
        _refuse_claim_columns(values, "the completion clears")
        driver = self._complete_sql(values)
        wanted = list(claim.ids if ids is None else ids)
        if self._claim_sql is None or driver is None or not wanted:
            return self.complete(claim, values, ids=ids), self.claim(claim.worker, limit)
        token, params = self._claim_params(claim.worker, limit)
        with self._driver() as pg:
            with pg.pipeline():
                completed = driver.execute(pg, self._complete_params(driver, claim, wanted, values))
                claimed = self._claim_sql.execute(pg, params)
            done = [row[0] for row in completed.fetchall()]
            rows = self._rows(claimed)
        fenced = self._fenced_outcome(claim, wanted, done, "completion", quiet=False)
        return fenced, Claim(self.spec.name, claim.worker, token, self.spec.sort(rows))

    def count_ready(self, cap: int = 1000) -> int:
        """How many rows a claim could take now, counted up to ``cap``.

        The claim's own two branches (expired leases, free rows) without locks, so the
        count reads the same partial indexes and never more than ``cap`` rows: cheap
        enough for a sensor tick whatever the size of the table.
        """
        if cap < 1:
            raise ValueError(f"cap must be at least 1, got {cap}")
        params = {"claim_limit": cap, **self._time_params(self.lease)}
        # One SELECT, so autocommit: on SQLite a transaction would take the write lock.
        with self._autocommit.connect() as conn:
            return int(conn.execute(self._count_stmt, params).scalar_one())

    def _candidates(
        self, *, lock: bool, now: sa.ColumnElement[datetime] | None = None
    ) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The two branches of a claim: leases that expired, and rows never leased.

        Two selects joined by UNION ALL rather than one ``OR`` across both states, so
        each is a range scan of its own partial index. Expired leases go first: that
        work has waited longest (its worker most likely crashed). ``now``: this
        queue's ``now()`` unless given.
        """
        t, spec = self.spec.table, self.spec
        now = self.now() if now is None else now
        limit = sa.bindparam("claim_limit", type_=sa.Integer())
        ready = spec.ready_at(now)
        expired = (
            sa.select(t.c.id)
            .where(spec.expired(now), *ready)
            .order_by(t.c.locked_until)
            .limit(limit)
        )
        free = (
            sa.select(t.c.id)
            .where(spec.free(), *ready)
            .order_by(*(term.sql(now=now, dialect=self.engine.dialect.name) for term in spec.order))
            .limit(limit)
        )
        if lock:
            # FOR NO KEY UPDATE: the claim never changes a key, so rows that reference
            # a claimed row (their foreign-key checks take KEY SHARE) are not blocked.
            expired = expired.with_for_update(skip_locked=True, key_share=True)
            free = free.with_for_update(skip_locked=True, key_share=True)
        return expired, free

    def _chosen_ids(self) -> sa.CompoundSelect[Any]:
        """``<expired> UNION ALL <free> LIMIT n`` for the dialects without row locks."""
        expired, free = self._candidates(lock=False)
        expired_sq, free_sq = expired.subquery(), free.subquery()
        return sa.union_all(sa.select(expired_sq.c.id), sa.select(free_sq.c.id)).limit(
            sa.bindparam("claim_limit", type_=sa.Integer())
        )

    def _lease_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "locked_until": self._lease_until(),
            "claimed_by": sa.bindparam("claim_worker", type_=sa.Text()),
            "claim_token": sa.bindparam("claim_token", type_=sa.String()),
        }
        if self.spec.attempts is not None:
            values[self.spec.attempts.name] = self.spec.attempts + sa.literal_column("1")
        return values

    def _build_claim(self) -> sa.Update | sa.Select[Any]:
        t = self.spec.table
        if self.strategy is Strategy.POSTGRES:
            # WITH expired AS MATERIALIZED (... FOR NO KEY UPDATE SKIP LOCKED),
            #      free AS MATERIALIZED (... FOR NO KEY UPDATE SKIP LOCKED),
            #      c AS MATERIALIZED (SELECT id FROM expired UNION ALL SELECT id FROM free LIMIT n)
            # UPDATE t SET <lease> FROM c WHERE t.id = c.id RETURNING t.*
            # MATERIALIZED keeps each CTE evaluated exactly once; the design forbids the
            # "WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED)" form, which the planner
            # may evaluate more than once and so claim more than n rows. The outer LIMIT
            # stops pulling (and locking) rows once n are found.
            expired, free = self._candidates(lock=True)
            expired_cte = expired.cte("expired").prefix_with("MATERIALIZED")
            free_cte = free.cte("free").prefix_with("MATERIALIZED")
            chosen = (
                sa.union_all(sa.select(expired_cte.c.id), sa.select(free_cte.c.id))
                .limit(sa.bindparam("claim_limit", type_=sa.Integer()))
                .cte("c")
                .prefix_with("MATERIALIZED")
            )
            return (
                sa.update(t)
                .where(t.c.id == chosen.c.id)
                .values(self._lease_values())
                .returning(*self.columns)
            )
        if self.strategy is Strategy.MARIADB:
            # UPDATE t SET <lease> WHERE id IN (:ids): the ids the claim's SELECT ... FOR
            # UPDATE SKIP LOCKED locked in the same transaction (``_claim_mariadb``).
            return (
                sa.update(t)
                .where(t.c.id.in_(sa.bindparam("claim_ids", expanding=True)))
                .values(self._lease_values())
            )
        if self.strategy is Strategy.SQLITE:
            # UPDATE t SET <lease> WHERE id IN (<expired> UNION ALL <free> LIMIT n)
            # RETURNING *, inside BEGIN IMMEDIATE (pipeline/storage/db.py begins every SQLite
            # transaction so): SQLite serialises writers, so no row is claimed twice.
            return (
                sa.update(t)
                .where(t.c.id.in_(self._chosen_ids()))
                .values(self._lease_values())
                .returning(*self.columns)
            )
        # Portable: take one candidate with an UPDATE that re-checks the criteria and
        # the lease, so a row another worker took in between is skipped (rowcount 0).
        ready = self.spec.ready_at(self.now())
        return (
            sa.update(t)
            .where(
                t.c.id == sa.bindparam("claim_id"),
                self.spec.pending,
                sa.or_(t.c.locked_until.is_(None), t.c.locked_until <= self.now()),
                *ready,
            )
            .values(self._lease_values())
        )

    def _claim_portable(self, params: dict[str, Any]) -> Sequence[Row]:
        # Correct on any SQL database, in 1 + N + 1 round trips: read candidates, take
        # each with the guarded UPDATE of _build_claim, read back the rows taken.
        # Workers that read at the same moment read the same candidates, and all but one
        # may lose every one of them: an empty claim means "no work", so such a claim
        # reads again (the rows taken meanwhile are leased, so each read sees fewer)
        # and returns empty only when no candidate is left.
        t = self.spec.table
        taken: list[int] = []
        with self._autocommit.connect() as conn:
            while not taken:
                candidates = list(conn.execute(self._chosen, params).scalars())
                if not candidates:
                    return []
                for row_id in candidates:
                    if conn.execute(self._claim_stmt, {**params, "claim_id": row_id}).rowcount == 1:
                        taken.append(row_id)
            return conn.execute(sa.select(*self.columns).where(t.c.id.in_(taken))).mappings().all()

    def _mariadb_locking(self) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """MariaDB's locking reads: each branch's rows (the columns a claim returns) and
        the database's clock, which their own conditions read too."""
        clock = sa.func.utc_timestamp(sa.literal_column("6"), type_=self._time_type)
        expired, free = self._candidates(lock=True, now=clock)
        return (expired.with_only_columns(*self.columns, clock.label("claim_clock")),
                free.with_only_columns(*self.columns, clock.label("claim_clock")))

    def _claim_mariadb(self, params: dict[str, Any], limit: int) -> Sequence[Row]:
        """One short transaction (READ COMMITTED, pipeline/storage/db.py): lock up to
        ``limit`` expired leases, then free rows, with ``FOR UPDATE SKIP LOCKED`` (each a
        range of the queue's index), reading their columns and the database's clock;
        lease exactly the ids locked until that clock + the lease. The locks hold to the
        commit, so no other claim can take or change those rows in between: the same
        rows, once, as PostgreSQL's one statement. The rows come back as the lease left
        them (its columns set here as the UPDATE sets them)."""
        assert self._locking is not None
        expired, free = self._locking

        def lease(conn: Connection) -> tuple[list[dict[str, Any]], datetime | None]:
            rows = [dict(row) for row in conn.execute(expired, params).mappings()]
            if len(rows) < limit:
                rows += [dict(row) for row in conn.execute(free, {**params, "claim_limit": limit - len(rows)}).mappings()]
            if not rows:
                return [], None
            until = rows[0]["claim_clock"] + self.lease
            conn.execute(self._claim_stmt, {**params, "claim_until": until, "claim_ids": [r["id"] for r in rows]})
            return rows, until

        rows, until = in_transaction(self.engine, lease)
        if not rows:
            return []
        leased = {"locked_until": until, "claimed_by": params["claim_worker"], "claim_token": params["claim_token"]}
        attempts = self.spec.attempts.name if self.spec.attempts is not None else None
        taken = []
        for row in rows:
            found = {name: value for name, value in row.items() if name != "claim_clock"}
            found.update({name: value for name, value in leased.items() if name in found})
            if attempts is not None:
                found[attempts] += 1
            taken.append(found)
        return taken

    def _database_time(self, conn: Connection, lease: timedelta) -> dict[str, Any]:
        """MariaDB: ``claim_now`` and ``claim_until`` by the database's clock, read in
        the transaction that uses them, so workers on hosts with skewed clocks agree
        (PostgreSQL's statements read ``now()`` themselves)."""
        now = conn.execute(sa.select(sa.func.utc_timestamp(sa.literal_column("6")))).scalar_one()
        now = now.replace(tzinfo=UTC)
        return {"claim_now": now, "claim_until": now + lease}

    def isolate(self, claim: Claim) -> Claim:
        """``claim`` itself, or, when it holds suspects (``QueueSpec.suspect``), a claim
        of the first suspect alone: the other rows are released, their attempt given
        back, and are claimed again at once. A batch whose worker died comes back as
        suspects, one per claim, so the row that kills its worker is the only one that
        keeps using up attempts, and ends (``exhausted``) after its own."""
        check = self.spec.suspect
        if check is None or not claim:
            return claim
        first = next((row for row in claim.rows if check(row)), None)
        if first is None:
            return claim
        others = [row["id"] for row in claim.rows if row["id"] != first["id"]]
        if others:
            assert self.spec.attempts is not None
            self.release(claim, {self.spec.attempts.name: self.spec.attempts - 1}, ids=others)
        log.info("%s row %s may have stopped its last worker: worked on alone",
                 self.spec.name, first["id"])
        return Claim(claim.queue, claim.worker, claim.token, [first])

    # -- fenced writes ------------------------------------------------------------------

    def _fenced_statement(self, columns: tuple[str, ...], *, extend: bool = False) -> sa.Update:
        """``UPDATE t SET ... WHERE id IN <ids> AND token AND worker RETURNING id``.

        One statement for the whole batch: ``= ANY(:ids)`` with one bound array on
        PostgreSQL (the same text, and plan, for every batch size), an expanding ``IN``
        elsewhere. Completion and release set ``columns`` and clear the lease; extension
        moves ``locked_until`` only. Built once per kind.
        """
        key = (*columns, "+extend") if extend else columns
        stmt = self._fenced.get(key)
        if stmt is None:
            t = self.spec.table
            if self.strategy is Strategy.POSTGRES:
                array = postgresql.ARRAY(sa.BigInteger())
                ids = t.c.id == sa.any_(sa.bindparam("ids", type_=array))
            else:
                ids = t.c.id.in_(sa.bindparam("ids", expanding=True))
            values: dict[str, Any]
            fence = [
                ids,
                t.c.claim_token == sa.bindparam("fence_token"),
                t.c.claimed_by == sa.bindparam("fence_worker"),
            ]
            if extend:
                # A lease that ran out is gone, even if nobody has claimed the row yet:
                # it may be counted as free work (or a free politeness slot) already.
                values = {"locked_until": self._lease_until()}
                fence.append(t.c.locked_until > self.now())
            else:
                values = {name: sa.bindparam(f"set_{name}", type_=t.c[name].type) for name in columns}
                values.update(locked_until=None, claimed_by=None, claim_token=None)
            stmt = sa.update(t).where(*fence).values(values)
            if self.engine.dialect.update_returning:
                stmt = stmt.returning(t.c.id)
            self._fenced[key] = stmt
        return stmt

    def _finish(
        self,
        conn: Connection | None,
        claim: Claim,
        ids: Sequence[int] | None,
        values: Mapping[str, Any],
        action: str,
        *,
        quiet: bool = False,
    ) -> Fenced:
        _refuse_claim_columns(values, f"the {action} clears")
        if all(not isinstance(v, sa.ClauseElement) for v in values.values()):
            stmt = self._fenced_statement(tuple(sorted(values)))
            params = {f"set_{name}": value for name, value in values.items()}
        else:  # a SQL expression among the values: this statement is built as given
            stmt, params = self._fenced_statement(()).values(dict(values)), {}
        return self._run_fenced(conn, claim, ids, stmt, params, action, quiet=quiet)

    def _run_fenced(
        self,
        conn: Connection | None,
        claim: Claim,
        ids: Sequence[int] | None,
        stmt: sa.Update,
        params: dict[str, Any],
        action: str,
        *,
        quiet: bool = False,
    ) -> Fenced:
        wanted = list(claim.ids if ids is None else ids)
        if not wanted:
            return Fenced(done=[])
        params = {**params, "ids": wanted, "fence_token": claim.token, "fence_worker": claim.worker}
        done: Sequence[int]
        if not self.engine.dialect.update_returning:
            if conn is not None:
                done = self._fenced_locked(conn, stmt, params)
            else:
                done = in_transaction(self.engine, lambda own: self._fenced_locked(own, stmt, params))
        elif conn is not None:
            done = conn.execute(stmt, params).scalars().all()
        else:
            with self._one_statement.begin() as own:
                done = own.execute(stmt, params).scalars().all()
        return self._fenced_outcome(claim, wanted, done, action, quiet=quiet)

    def _fenced_locked(self, conn: Connection, stmt: sa.Update, params: dict[str, Any]) -> list[int]:
        """A fenced write where there is no ``UPDATE ... RETURNING`` (MariaDB): lock the
        rows the fence admits (``SELECT id ... FOR UPDATE``, the fence's own predicate),
        then run the write on exactly those ids. Held by this transaction, they cannot
        leave the fence in between; "now" (an extension's fence) is one value for both
        statements (on MariaDB, the database's)."""
        if self.strategy is Strategy.MARIADB and "claim_now" in params:
            params = {**params, **self._database_time(conn, params["claim_until"] - params["claim_now"])}
        t = self.spec.table
        assert stmt.whereclause is not None
        done = list(conn.execute(sa.select(t.c.id).where(stmt.whereclause).with_for_update(), params).scalars())
        if done:
            conn.execute(stmt, {**params, "ids": done})
        return done

    def _fenced_outcome(
        self, claim: Claim, wanted: Sequence[int], done: Sequence[int], action: str, *, quiet: bool
    ) -> Fenced:
        lost = sorted(set(wanted) - set(done))
        if lost and not quiet:
            log.warning(
                "%s of %d %s row(s) by %s changed nothing: they are no longer held under"
                " this claim (lease expired and claimed again, or already finished;"
                " token %s, ids %s)",
                action,
                len(lost),
                self.spec.name,
                claim.worker,
                claim.token,
                lost[:20],
            )
        return Fenced(done=sorted(done), lost=lost)

    def _complete_sql(self, values: Mapping[str, Any]) -> _DriverStatement | None:
        """The completion setting ``values`` as driver SQL (PostgreSQL), or None where
        SQLAlchemy must send it (a SQL expression among the values)."""
        if self.strategy is not Strategy.POSTGRES or any(
            isinstance(v, sa.ClauseElement) or name not in self.spec.table.c for name, v in values.items()
        ):
            return None
        key = tuple(sorted(values))
        statement = self._fenced_sql.get(key)
        if statement is None:
            t, dialect = self.spec.table, self.engine.dialect
            # The columns' own conversions (UTC times, JSON), as SQLAlchemy applies them.
            convert = {name: t.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in key}
            statement = self._fenced_sql[key] = self._driver_sql(self._fenced_statement(key), convert)
        return statement

    def _complete_params(
        self, statement: _DriverStatement, claim: Claim, ids: Sequence[int], values: Mapping[str, Any]
    ) -> dict[str, Any]:
        params = {"ids": list(ids), "fence_token": claim.token, "fence_worker": claim.worker}
        for name, value in values.items():
            convert = statement.convert[name]
            params[f"set_{name}"] = value if convert is None else convert(value)
        return params

    def complete(
        self,
        claim: Claim,
        values: Mapping[str, Any],
        *,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
    ) -> Fenced:
        """Finish claimed rows in one statement: clear the lease and write ``values``.

        ``values`` must take the rows out of the queue (e.g. set ``processed_at``).
        Pass ``conn`` to complete inside the transaction that writes the stage's
        results, and write results only for ``Fenced.done``: rows in ``Fenced.lost``
        belong to another worker now.
        """
        _refuse_claim_columns(values, "the completion clears")  # before any statement is built
        driver = self._complete_sql(values) if conn is None else None
        if driver is None:
            return self._finish(conn, claim, ids, values, "completion")
        wanted = list(claim.ids if ids is None else ids)
        if not wanted:
            return Fenced(done=[])
        with self._driver() as pg:
            cursor = driver.execute(pg, self._complete_params(driver, claim, wanted, values))
            done = [row[0] for row in cursor.fetchall()]
        return self._fenced_outcome(claim, wanted, done, "completion", quiet=False)

    def complete_each(
        self, completions: Sequence[RowCompletion], *, conn: Connection
    ) -> Fenced:
        """Finish claimed rows that each take values of their own, fenced row by row.

        Rows may come from different claims. On PostgreSQL the rows that set the same
        columns go in one statement: ``UPDATE t SET c = v.c ... FROM
        jsonb_to_recordset(:rows) AS v(id, fence_token, fence_worker, c ...) WHERE t.id =
        v.id AND t.claim_token = v.fence_token AND t.claimed_by = v.fence_worker``, one
        bound JSON parameter whatever the batch size. Elsewhere, the fenced UPDATE of
        ``complete`` per row, in ``conn``'s transaction.
        """
        groups: dict[tuple[str, ...], list[RowCompletion]] = {}
        for completion in completions:
            if any(isinstance(v, sa.ClauseElement) for v in completion.values.values()):
                raise ValueError("complete_each takes plain values, not SQL expressions")
            _refuse_claim_columns(completion.values, "the completion clears")
            groups.setdefault(tuple(sorted(completion.values)), []).append(completion)
        done: list[int] = []
        lost: list[int] = []
        for columns, group in groups.items():
            if self.strategy is Strategy.POSTGRES:
                rows = [
                    {"id": c.row_id, "fence_token": c.claim.token, "fence_worker": c.claim.worker,
                     **c.values}
                    for c in group
                ]
                stmt = self._fenced_each_statement(columns)
                changed = set(conn.execute(stmt, {"rows": json_rows(rows)}).scalars())
            else:
                changed = set()
                for c in group:
                    fenced = self._finish(conn, c.claim, [c.row_id], c.values, "completion",
                                          quiet=True)
                    changed.update(fenced.done)
            for c in group:
                (done if c.row_id in changed else lost).append(c.row_id)
        if lost:
            log.warning(
                "completion of %d %s row(s) changed nothing: they are no longer held under"
                " the claims that took them (lease expired and claimed again, or already"
                " finished; ids %s)", len(lost), self.spec.name, sorted(lost)[:20],
            )
        return Fenced(done=sorted(done), lost=sorted(lost))

    def defer_each(
        self, completions: Sequence[RowCompletion], *, seconds: int, conn: Connection
    ) -> Fenced:
        """Write each row's values and keep it out of every claim for ``seconds``: its lease
        is pushed to now + ``seconds`` under the same claim, so it is claimable again, by
        anyone, once that runs out (a retry later, e.g. a row that failed to process).
        One fenced UPDATE per row: deferrals are the exception, not the hot path."""
        done: list[int] = []
        lost: list[int] = []
        params = self._time_params(timedelta(seconds=seconds))
        for c in completions:
            _refuse_claim_columns(c.values, "defer_each sets")
            columns = tuple(sorted(c.values))
            key = (*columns, "+defer")
            stmt = self._fenced.get(key)
            if stmt is None:
                t = self.spec.table
                values: dict[str, Any] = {
                    name: sa.bindparam(f"set_{name}", type_=t.c[name].type) for name in columns
                }
                # The extension's statement (it moves locked_until only), plus the values.
                stmt = self._fenced_statement((), extend=True).values(values)
                self._fenced[key] = stmt
            fenced = self._run_fenced(
                conn, c.claim, [c.row_id], stmt,
                {**params, **{f"set_{k}": v for k, v in c.values.items()}}, "deferral", quiet=True,
            )
            done.extend(fenced.done)
            lost.extend(fenced.lost)
        if lost:
            log.warning("deferral of %d %s row(s) changed nothing: no longer held (ids %s)",
                        len(lost), self.spec.name, sorted(lost)[:20])
        return Fenced(done=sorted(done), lost=sorted(lost))

    def _fenced_each_statement(self, columns: tuple[str, ...]) -> sa.Update:
        """The PostgreSQL statement of ``complete_each`` for one set of columns; built once."""
        key = (*columns, "+each")
        stmt = self._fenced.get(key)
        if stmt is None:
            t = self.spec.table
            v = recordset([
                sa.column("id", sa.BigInteger()),
                sa.column("fence_token", sa.Text()),
                sa.column("fence_worker", sa.Text()),
                *(sa.column(name, t.c[name].type) for name in columns),
            ])
            values: dict[str, Any] = {name: v.c[name] for name in columns}
            values.update(locked_until=None, claimed_by=None, claim_token=None)
            stmt = (
                sa.update(t)
                .where(
                    t.c.id == v.c.id,
                    t.c.claim_token == v.c.fence_token,
                    t.c.claimed_by == v.c.fence_worker,
                )
                .values(values)
                .returning(t.c.id)
            )
            self._fenced[key] = stmt
        return stmt

    def release(
        self,
        claim: Claim,
        values: Mapping[str, Any] | None = None,
        *,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
    ) -> Fenced:
        """Give claimed rows back unfinished; they are claimable again at once."""
        return self._finish(conn, claim, ids, values or {}, "release")

    def extend(
        self,
        claim: Claim,
        *,
        seconds: int | None = None,
        ids: Sequence[int] | None = None,
        conn: Connection | None = None,
        quiet: bool = False,
    ) -> Fenced:
        """Push the lease of still-owned rows to now + ``seconds`` (default: the lease).
        A row whose lease has already run out is not extended: it is lost."""
        lease = self.lease if seconds is None else timedelta(seconds=seconds)
        stmt = self._fenced_statement((), extend=True)
        return self._run_fenced(
            conn, claim, ids, stmt, self._time_params(lease), "lease extension", quiet=quiet
        )


class Heartbeat:
    """Keeps the leases of claimed rows alive while they are worked on.

    A thread of its own extends, every ``every`` seconds (a third of the lease by
    default, so two beats can fail before a lease runs out), the rows held with
    ``hold`` and not yet ``drop``ped: fenced, one statement per claim. A row is no longer
    extended once it is dropped, once it has been worked on for ``max_work_seconds``
    (work that hangs must not keep its lease for ever), or once an extension finds it
    lost; and nothing is extended after the ``with`` block ends. A worker that dies
    takes its heartbeat with it, so its claims run out after one lease.
    """

    def __init__(
        self, queue: WorkQueue, *, every: float | None = None, max_work_seconds: float | None = None
    ) -> None:
        lease = queue.lease.total_seconds()
        self.queue = queue
        self.every = every if every is not None else lease / 3
        self.max_work_seconds = max_work_seconds
        self._held: dict[str, tuple[Claim, dict[int, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0  # extension statements sent (for tests and telemetry)

    def hold(self, claim: Claim, ids: Iterable[int] | None = None) -> None:
        started = time.monotonic()
        with self._lock:
            rows = self._held.setdefault(claim.token, (claim, {}))[1]
            rows.update(dict.fromkeys(claim.ids if ids is None else ids, started))

    def drop(self, claim: Claim, ids: Iterable[int] | None = None) -> None:
        with self._lock:
            entry = self._held.get(claim.token)
            if entry is None:
                return
            for row_id in claim.ids if ids is None else ids:
                entry[1].pop(row_id, None)
            if not entry[1]:
                del self._held[claim.token]

    def __enter__(self) -> Heartbeat:  # noqa: PYI034
        self._thread = threading.Thread(
            target=self._run, name=f"{self.queue.spec.name}-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.beat()
            except Exception:  # the database is away: the leases may run out, work goes on
                log.warning("lease extension of %s rows failed", self.queue.spec.name, exc_info=True)

    def beat(self) -> None:
        """Extend every row still held; forget rows an extension finds lost."""
        now = time.monotonic()
        with self._lock:
            work = []
            for claim, rows in self._held.values():
                if self.max_work_seconds is not None:
                    for row_id in [i for i, t in rows.items() if now - t > self.max_work_seconds]:
                        log.warning("%s row %s has been worked on for over %g s: its lease is"
                                    " no longer extended", self.queue.spec.name, row_id,
                                    self.max_work_seconds)
                        del rows[row_id]
                if rows:
                    work.append((claim, list(rows)))
        for claim, ids in work:
            if self._stop.is_set():
                return
            fenced = self.queue.extend(claim, ids=ids, quiet=True)
            self.beats += 1
            if fenced.lost:
                with self._lock:  # rows finished meanwhile were dropped: not news
                    still = set(self._held.get(claim.token, (claim, {}))[1])
                lost = [i for i in fenced.lost if i in still]
                if lost:
                    log.warning("%s row(s) %s of %s were lost before their work finished"
                                " (lease ran out, or the row changed): their results will"
                                " be discarded", len(lost), lost[:20], self.queue.spec.name)
                    self.drop(claim, lost)


def _refuse_claim_columns(values: Mapping[str, Any], who: str) -> None:
    """ValueError when ``values`` would set the lease columns that ``who`` (e.g. "the
    completion clears") manages itself."""
    if "locked_until" in values or "claim_token" in values:
        raise ValueError(f"{who} the lease itself; do not set claim columns")

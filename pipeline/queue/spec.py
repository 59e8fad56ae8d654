"""What a claim queue is: its spec (``QueueSpec``: the table, the states' predicates,
the order, the partial indexes built from the same predicates), and what a claim hands
out and a fenced write answers (``Claim``, ``RowCompletion``, ``Fenced``). The claim
itself is pipeline/queue/claim.py; the contract, docs/architecture.md ("The claim").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic

import sqlalchemy as sa
from typing_extensions import TypeVar

from pipeline.backends import Backend

Predicate = sa.ColumnElement[bool]
# A claimed row: its columns by name (a dict from the driver on PostgreSQL's fast path).
Row = Mapping[Any, Any]
# What a queue's claim hands out: a TypedDict of the columns it returns, where the queue
# was made with one (pipeline/storage/rows.py), so that mypy checks each name a stage
# reads; else ``Row``. ``R_co`` is a claim's (a claim of typed rows is a claim of rows),
# ``R`` a queue's.
R_co = TypeVar("R_co", bound=Mapping[str, Any], default=Row, covariant=True)
R = TypeVar("R", bound=Mapping[str, Any], default=Row)


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
            backend: Backend) -> sa.ColumnElement[Any]:
        """The term over the table's column, or over the same-named column of the
        derived table ``over`` (a CTE or subquery of the queue's rows), as ``backend``'s
        database writes it. ``now`` is for terms that depend on the time (``AgedTerm``)."""
        column = self.column if over is None else over.c[self.column.name]
        return backend.order_by(column, descending=self.descending, nulls_first=self.nulls_first)

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
    most (their priority - its priority) x ``step``. The queue's rows are ready once
    their ``since`` has passed, or at once without one: PostgreSQL reads the free rows a
    level at a time on that understanding (pipeline/queue/claim.py ``_free_by_level``,
    over the level index ``QueueSpec.indexes`` makes)."""

    since: sa.Column[datetime] | None = None
    step: timedelta = timedelta(minutes=10)

    @property
    def names(self) -> tuple[str, ...]:
        assert self.since is not None
        return (self.column.name, self.since.name)

    def sql(self, over: Any = None, *, now: sa.ColumnElement[datetime] | None = None,
            backend: Backend) -> sa.ColumnElement[Any]:
        assert self.since is not None and now is not None, "an aged term needs the claim's now"
        column = self.column if over is None else over.c[self.column.name]
        since = self.since if over is None else over.c[self.since.name]
        steps = backend.whole_steps(since, now, self.step)
        return (column + sa.func.coalesce(steps, sa.literal_column("0"))).desc()

    @property
    def never(self) -> sa.ColumnElement[Any]:
        """What ``due_key`` makes of no ``since``: -infinity, before every time."""
        return sa.literal_column("'-infinity'")

    def due_key(self) -> sa.ColumnElement[Any]:
        """``since`` as the level index holds it (PostgreSQL only), NULL (never due) as
        ``never``. Reads bounded by this expression can be served by the level index
        alone, not by another index on ``since`` that a planner's estimates might prefer
        (reading a whole other level's due rows to find a few)."""
        assert self.since is not None
        return sa.func.coalesce(self.since, self.never, type_=self.since.type)

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

    @property
    def aged(self) -> AgedTerm | None:
        """The aged priority the queue's order leads with, if it does: its claim reads
        the free rows a level at a time where the database can (``indexes``)."""
        first = self.order[0] if self.order else None
        return first if isinstance(first, AgedTerm) and first.since is not None else None

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
        ``locked_until``). A queue ordered by an aged priority has a third on PostgreSQL,
        the *level* index: its free rows by priority, then due time, then id, which its
        claim reads a priority level at a time (pipeline/queue/claim.py)."""
        t = self.table
        free, leased = self.free(), self.leased()
        aged = self.aged
        levels = [] if aged is None else [
            sa.Index(
                f"ix_{t.name}_{self.name}_levels", aged.column, aged.due_key(), t.c.id, postgresql_where=free,
            ).ddl_if(dialect="postgresql"),
        ]
        return [
            *levels,
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
class Claim(Generic[R_co]):
    """Rows one worker holds under one token, in the queue's order."""

    queue: str
    worker: str
    token: str
    rows: Sequence[R_co]

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

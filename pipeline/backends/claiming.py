"""The claim, as each database takes it: the driver boundary's half that leases rows.

A claim queue (pipeline/queue/) says *what* to claim: its table, the two branches of a
claim (expired leases, rows never leased) as selects, the values a lease sets, what a
claim returns (``ClaimQueue``). A database's claim (a ``PortableClaim`` of its own) says
*how* its database takes those rows so that no two workers get the same one, and how its
fenced writes find theirs; one per queue, made by the queue from ``claiming_for(engine)``.
This module holds the protocol and its reference, ``PortableClaim``: correct on any SQL
database, in more round trips. The others, one module per database:

* claim_postgresql.py -- one statement (``FOR NO KEY UPDATE SKIP LOCKED`` in
  materialised CTEs), sent by psycopg itself and prepared on the server; a batch's
  completion pipelined with the next claim; "now" is the database's clock;
* claim_sqlite.py -- one ``UPDATE ... RETURNING`` under ``BEGIN IMMEDIATE`` (SQLite
  serialises writers);
* claim_mariadb.py -- a short transaction: ``SELECT ... FOR UPDATE SKIP LOCKED`` per
  branch, an ``UPDATE`` of exactly the ids locked (no ``UPDATE ... RETURNING`` there),
  "now" read from the database in the transaction.

The SQL each sends is rendered into pipeline/queue/sql/ (tests/test_golden_sql.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from pipeline.backends.clock import sql_now

# A claimed row: its columns by name (a dict from the driver on PostgreSQL's fast path).
Row = Mapping[Any, Any]


class Built:
    """The statements of one kind of queue on one kind of database, each built when
    first needed and then shared by every queue of that kind in the process (the queue
    keeps them: pipeline/queue/base.py ``built_for``). Queues are made per pass, and a
    lingering run makes a pass of each stage a second: building and compiling a claim
    queue's statements again cost 2-4 ms of CPU a queue (bench/RESULTS.md, "Statements
    built once a process"). Nothing here names an engine. Two threads that miss at
    once each build the statement and one is kept: the same SQL either way."""

    def __init__(self) -> None:
        self.claim: sa.Update | sa.Select[Any] | None = None  # the claim (``WorkQueue._build_statements``)
        self.count: sa.Select[Any] | None = None  # the sensor's capped count of the claim's candidates
        self.chosen: sa.CompoundSelect[Any] | None = None  # ``chosen_ids``
        self.fenced: dict[tuple[str, ...], sa.Update] = {}  # the fenced writes, by what they set
        self.driver: dict[Any, Any] = {}  # what the database's claim makes of them (compiled)
        self.own: dict[str, Any] = {}  # a kind of queue's own (PoliteQueue: when a source may start)


class ClaimQueue(Protocol):
    """What a database's claim reads of the queue it claims for."""

    engine: Engine
    lease: timedelta
    columns: tuple[sa.Column[Any], ...]  # what a claim returns, in order
    built: Built  # its kind's statements, where the database's claim keeps its own

    @property
    def table(self) -> sa.Table: ...

    @property
    def attempts(self) -> str | None:
        """The column a claim adds one to, if the queue counts attempts."""
        ...

    def now(self) -> sa.ColumnElement[datetime]: ...

    def candidates(
        self, *, lock: bool, now: sa.ColumnElement[datetime] | None = None
    ) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The claim's two branches, ids of expired leases and of free rows, each
        ``claim_limit`` at most, in the queue's order; locking (``FOR NO KEY UPDATE SKIP
        LOCKED``) when ``lock``."""
        ...

    def chosen_ids(self) -> sa.CompoundSelect[Any]:
        """``<expired> UNION ALL <free> LIMIT claim_limit``, without locks."""
        ...

    def lease_values(self) -> dict[str, Any]:
        """What a claim sets: the lease's end, the worker, the token, the attempt."""
        ...

    def claimable(self, now: sa.ColumnElement[datetime]) -> list[sa.ColumnElement[bool]]:
        """A row a claim may take at ``now``: pending, ready, and free or expired."""
        ...

    def fenced_statement(self, columns: tuple[str, ...]) -> sa.Update:
        """The fenced completion that sets ``columns`` (bound as ``set_<name>``) of the
        rows ``ids`` held under ``fence_token`` by ``fence_worker``, returning their ids."""
        ...


class PoliteQueueParts(ClaimQueue, Protocol):
    """What the polite claim (pipeline/fetching/politeness.py ``PoliteQueue``) reads of
    its queue, where the database takes it in one statement."""

    groups: sa.Table  # the politeness groups' rows
    default_group: str  # the group whose limits a group without its own takes

    def recorded(self, taken: Any) -> dict[str, sa.Insert]:
        """The inserts, by name, that record what a claim handed out (``taken``: the
        rows it leased, as a CTE), run in the claim's own statement; none when the
        queue records nothing."""
        ...

    def in_flight(self, group: sa.ColumnElement[str]) -> sa.ScalarSelect[int]:
        """The fetches in flight of ``group``: its sources whose lease is running."""
        ...

    def polite_candidates(self, *, lock: bool) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The claim's two branches, less sources whose group has no room."""
        ...

    def order_keys(self, rows: Any) -> list[sa.ColumnElement[Any]]:
        """The queue's order over the derived table ``rows``; expired leases first."""
        ...


class PortableClaim:
    """The reference: read the candidates, take each with an UPDATE that checks again
    that it is claimable (a row another worker took in between changes nothing), read
    back the rows taken; "now" is this host's clock, bound per statement."""

    # "Now" is the database's clock (PostgreSQL), not this host's.
    database_clock = False
    # The claim is one statement that locks the rows it takes and skips those other
    # claims hold; elsewhere a claim that must read what it decides on (the polite
    # claim) is a few statements in one transaction.
    one_statement = False

    def __init__(self, queue: ClaimQueue) -> None:
        self.queue = queue
        # A claim, and a fenced write the caller does not put in its own transaction, is
        # one statement: atomic by itself, so it runs in autocommit where the database
        # allows (one round trip, no BEGIN/COMMIT).
        self.autocommit = queue.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.time_type = queue.table.c.locked_until.type
        self.claim_stmt: Any = None  # the queue's claim (``prepare``)

    @property
    def one_statement_engine(self) -> Engine:
        """Where a statement that is a transaction by itself runs."""
        return self.autocommit

    # -- time ---------------------------------------------------------------------------

    def now(self) -> sa.ColumnElement[datetime]:
        """"Now" in the queue's statements (``sql_now``): the database's clock, or the
        bound parameter ``claim_now``, set per execution (``time_params``)."""
        return sql_now(self.time_type, database_clock=self.database_clock, bind="claim_now")

    def lease_until(self) -> sa.ColumnElement[datetime]:
        """When a lease taken or extended now ends."""
        return sa.bindparam("claim_until", type_=self.time_type)

    def time_params(self, lease: timedelta) -> dict[str, Any]:
        """The time parameters of a statement, for a lease of ``lease``."""
        now = datetime.now(UTC)
        return {"claim_now": now, "claim_until": now + lease}

    def time_params_in(self, conn: Connection, lease: timedelta) -> dict[str, Any]:
        """The same, for statements sent in ``conn``'s transaction (MariaDB reads its
        clock there)."""
        return self.time_params(lease)

    # -- the claim ----------------------------------------------------------------------

    def build_claim(self) -> sa.Update | sa.Select[Any]:
        """The claim's statement, built once per queue."""
        q = self.queue
        t = q.table
        return (
            sa.update(t)
            .where(t.c.id == sa.bindparam("claim_id"), *q.claimable(q.now()))
            .values(q.lease_values())
        )

    def prepare(self, claim_stmt: sa.Update | sa.Select[Any]) -> None:
        """Ready the queue's claim (``build_claim``'s, or the queue's own)."""
        self.claim_stmt = claim_stmt

    def named(self) -> dict[str, sa.Executable]:
        """The claim's statements by name, in the order they run (golden files)."""
        assert self.claim_stmt is not None
        return {"claim": self.claim_stmt}

    def claim(self, params: dict[str, Any], limit: int) -> Sequence[Row]:
        """Lease up to ``limit`` rows with ``params`` (worker, token, time); the rows.

        Here in 1 + N + 1 round trips: read candidates, take each with the guarded
        UPDATE, read back the rows taken. Workers that read at the same moment read the
        same candidates, and all but one may lose every one of them: an empty claim
        means "no work", so such a claim reads again (the rows taken meanwhile are
        leased, so each read sees fewer) and returns empty only when no candidate is
        left."""
        q, t = self.queue, self.queue.table
        taken: list[int] = []
        with self.autocommit.connect() as conn:
            while not taken:
                candidates = list(conn.execute(q.chosen_ids(), params).scalars())
                if not candidates:
                    return []
                for row_id in candidates:
                    if conn.execute(self.claim_stmt, {**params, "claim_id": row_id}).rowcount == 1:
                        taken.append(row_id)
            return conn.execute(sa.select(*q.columns).where(t.c.id.in_(taken))).mappings().all()

    # -- the fenced writes --------------------------------------------------------------

    def ids_in(self, column: sa.Column[Any]) -> sa.ColumnElement[bool]:
        """``column`` is one of the bound ``ids``."""
        return column.in_(sa.bindparam("ids", expanding=True))

    def complete_now(self, token: str, worker: str, ids: Sequence[int], values: Mapping[str, Any]) -> list[int] | None:
        """A completion (fenced by ``token`` and ``worker``) in a round trip of its own:
        the ids it finished, or None where the queue sends it as any other statement."""
        return None

    def complete_rows(self, conn: Connection, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> set[int] | None:
        """Completions that each set ``columns`` to values of their own (``rows``: id,
        fence_token, fence_worker and the columns) in one statement: the ids finished,
        or None where the queue completes them one by one."""
        return None

    def complete_and_claim(
        self, token: str, worker: str, ids: Sequence[int], values: Mapping[str, Any], params: dict[str, Any],
    ) -> tuple[list[int], Sequence[Row]] | None:
        """A completion and the next claim (``params``) in one round trip and one
        transaction: the ids finished and the rows claimed, or None where they are two."""
        return None

    def none_of(self, column: sa.ColumnElement[str], names: sa.Select[Any], name: str) -> sa.ColumnElement[bool]:
        """``column`` is none of ``names`` (an uncorrelated one-column select of values
        that are never NULL, called ``name`` where the statement needs a name for it):
        ``NOT IN``, which every database here evaluates once per statement and looks up
        by value."""
        return column.not_in(names)

    def polite_claim(self, queue: PoliteQueueParts) -> sa.Update | sa.Select[Any]:
        """The polite claim as one statement, where ``one_statement``."""
        raise NotImplementedError(f"{type(self).__name__} claims politely in steps (PoliteQueue)")

    def each_statement(self, columns: tuple[str, ...]) -> sa.Update | None:
        """``complete_rows``'s statement, where there is one."""
        return None

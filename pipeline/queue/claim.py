"""The claim primitive: every stage takes its work from a table through ``WorkQueue``.

A claim marks up to ``limit`` ready rows with a lease (``locked_until``), the claiming
worker (``claimed_by``) and a fresh fencing token (``claim_token``), and returns them in
their post-claim state. Completion, release and lease extension are fenced by token and
worker: a worker whose lease expired and whose rows were claimed again changes nothing.
The SQL each database runs is in pipeline/queue/sql/, rendered (tests/test_golden_sql.py).

The package, by idea: spec.py (what a queue is, what a claim hands out), dialects.py
(where the databases differ: the claim's ``Strategy``, whose clock, MariaDB's retries,
PostgreSQL's driver statements), base.py (a queue's engine, driver path and time),
fenced.py (the fenced writes), this module (the claim: each strategy's statement, the
portable and MariaDB paths, ``complete_and_claim``), heartbeat.py (leases kept alive
while rows are worked on), workpool.py (a claim worked on by threads).

Indexes: every queue has two partial indexes built from the same predicates the claim
uses (``QueueSpec.indexes``): a *free* index over ready rows with no lease, and a *leased*
index over ``locked_until`` of rows that hold one, so that both branches of a claim
("unclaimed" and "lease expired") are index range scans, never a scan of the table.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline.backends import in_transaction
from pipeline.queue.dialects import DriverStatement, Strategy
from pipeline.queue.fenced import FencedWrites, refuse_claim_columns
from pipeline.queue.spec import Claim, Fenced, Row

log = logging.getLogger(__name__)


class WorkQueue(FencedWrites):
    """Claim, complete, release and extend rows of one queue on one engine.

    Each statement is built once per queue, with bound parameters, and reused: a claim
    costs one execution, not a rebuild of the SQL (see bench/claim_throughput.py).

    On PostgreSQL the hot statements (the claim, and a completion whose values need no
    conversion by SQLAlchemy) are sent by psycopg itself, compiled once and prepared on
    the server, on a connection from the engine's pool: SQLAlchemy's per-statement work
    was most of a claim's client CPU (bench/RESULTS.md). ``complete_and_claim`` sends a
    batch's completion and the next claim in one round trip and one commit.
    """

    def _build_statements(self) -> None:
        """The claim's statements, built once, when the queue is made."""
        self._claim_stmt = self._build_claim()
        # PostgreSQL runs the claim as SQL compiled once, by the driver: it skips
        # SQLAlchemy's per-call work and per-row type processing. That is safe because
        # pipeline/storage/db.py pins every PostgreSQL session to UTC and psycopg decodes
        # JSON itself.
        # Its constants (bound parameters of the compiled text) go with every execution.
        self._claim_sql: DriverStatement | None = None
        if self.strategy is Strategy.POSTGRES:
            self._claim_sql = self._driver_sql(self._claim_stmt)
        # MariaDB's claim locks each branch's rows with a query of its own.
        self._locking = self._mariadb_locking() if self.strategy is Strategy.MARIADB else None
        # The unlocked candidate query (portable claims) and the sensor's capped count.
        self._chosen = self._chosen_ids()
        self._count_stmt = sa.select(sa.func.count()).select_from(self._chosen.subquery())

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
        refuse_claim_columns(values, "the completion clears")
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
            .order_by(*self.ordered(now=now))
            .limit(limit)
        )
        if lock:
            # FOR NO KEY UPDATE: the claim never changes a key, so rows that reference
            # a claimed row (their foreign-key checks take KEY SHARE) are not blocked.
            expired = expired.with_for_update(skip_locked=True, key_share=True)
            free = free.with_for_update(skip_locked=True, key_share=True)
        return expired, free

    def ordered(self, over: Any = None, *, now: sa.ColumnElement[datetime] | None = None) -> list[sa.ColumnElement[Any]]:
        """The queue's order (``ORDER BY`` terms) over its table, or over the same-named
        columns of ``over`` (a derived table of its rows), as this database renders it."""
        now = self.now() if now is None else now
        return [term.sql(over=over, now=now, dialect=self.engine.dialect.name) for term in self.spec.order]

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

"""The claim primitive: every stage takes its work from a table through ``WorkQueue``.

A claim marks up to ``limit`` ready rows with a lease (``locked_until``), the claiming
worker (``claimed_by``) and a fresh fencing token (``claim_token``), and returns them in
their post-claim state. Completion, release and lease extension are fenced by token and
worker: a worker whose lease expired and whose rows were claimed again changes nothing.
The SQL each database runs is in pipeline/queue/sql/, rendered (tests/test_golden_sql.py).

The package, by idea: spec.py (what a queue is, what a claim hands out), base.py (a
queue's engine, columns, its database's claim and time), fenced.py (the fenced writes),
this module (what a claim takes: its branches, the lease's values; ``complete_and_claim``),
heartbeat.py (leases kept alive while rows are worked on), workpool.py (a claim worked
on by threads). How each database takes the rows is its backend's:
pipeline/backends/claiming.py (the protocol and the portable reference), then
claim_postgresql.py, claim_sqlite.py and claim_mariadb.py there.

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
from typing import Any, cast

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.queue.fenced import FencedWrites, refuse_claim_columns
from pipeline.queue.spec import AgedTerm, Claim, Fenced, R, Row

log = logging.getLogger(__name__)


class WorkQueue(FencedWrites[R]):
    """Claim, complete, release and extend rows of one queue on one engine.

    The queue says what a claim takes (its two branches, the lease's values, what it
    returns); its database's ``claiming`` (pipeline/backends/) takes them. Each statement
    is built once per kind of queue in a process (``built_for``: stages make a queue
    per pass), with bound parameters, and reused: a claim costs one execution, not a
    rebuild of the SQL (see bench/claim_throughput.py, bench/queue_build.py).
    ``complete_and_claim`` sends a batch's completion and the next claim in one round
    trip and one commit where the database allows (PostgreSQL).
    """

    def _build_statements(self) -> None:
        """The claim's statements: built when the first queue of its kind is made, then
        its kind's (``built``)."""
        built = self.built
        if built.claim is None:
            built.claim = self._build_claim()
        self._claim_stmt = built.claim
        self.claiming.prepare(self._claim_stmt)
        if built.count is None:  # the sensor's capped count: the claim's candidates, unlocked
            built.count = sa.select(sa.func.count()).select_from(self.chosen_ids().subquery())
        self._count_stmt = built.count

    def _build_claim(self) -> sa.Update | sa.Select[Any]:
        """The claim's statement: the database's (a kind of queue may have its own)."""
        return self.claiming.build_claim()

    # -- claim --------------------------------------------------------------------------

    def statements(self, completes: tuple[str, ...]) -> dict[str, sa.Executable]:
        """The queue's SQL as named artefacts: the claim, the completion that sets
        ``completes`` (and, on PostgreSQL, its one-statement form for rows with values of
        their own) and the lease extension. tests/test_golden_sql.py renders them into
        pipeline/queue/sql/, so a change to a hot query is reviewed as a diff."""
        named: dict[str, sa.Executable] = dict(self.claiming.named())
        named["complete"] = self.fenced_statement(completes)
        each = self.claiming.each_statement(completes)
        if each is not None:
            named["complete_each"] = each
        named["extend"] = self.fenced_statement((), extend=True)
        return named

    def claim(self, worker: str, limit: int) -> Claim[R]:
        """Lease up to ``limit`` ready rows to ``worker``; never more than ``limit``."""
        token, params = self._claim_params(worker, limit)
        return self._claimed(worker, token, self.claiming.claim(params, limit))

    def _claimed(self, worker: str, token: str, rows: Sequence[Row]) -> Claim[R]:
        """The claim of ``rows``, in the queue's order, as rows of the queue's type."""
        return Claim(self.spec.name, worker, token, cast(list[R], self.spec.sort(rows)))

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
    ) -> tuple[Fenced, Claim[R]]:
        """``complete`` then ``claim`` for the same worker: on PostgreSQL in one round
        trip and one transaction (psycopg's pipeline mode), so a worker that finishes a
        batch and takes the next waits for the database once and commits once. If the
        completion fails, the next claim is not taken either."""
        refuse_claim_columns(values, "the completion clears")
        wanted = list(claim.ids if ids is None else ids)
        if wanted:
            token, params = self._claim_params(claim.worker, limit)
            both = self.claiming.complete_and_claim(claim.token, claim.worker, wanted, values, params)
            if both is not None:
                done, rows = both
                fenced = self._fenced_outcome(claim, wanted, done, "completion", quiet=False)
                return fenced, self._claimed(claim.worker, token, rows)
        return self.complete(claim, values, ids=ids), self.claim(claim.worker, limit)

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

    def candidates(
        self, *, lock: bool, now: sa.ColumnElement[datetime] | None = None,
        where: Sequence[sa.ColumnElement[bool]] = (), limit: sa.BindParameter[int] | None = None,
    ) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The two branches of a claim: leases that expired, and rows never leased.

        Two selects joined by UNION ALL rather than one ``OR`` across both states, so
        each is a range scan of its own partial index. Expired leases go first: that
        work has waited longest (its worker most likely crashed). ``now``: this
        queue's ``now()`` unless given. ``where``: what else a row must meet (the polite
        claim's open groups), tested as each branch reads its rows, before its limit;
        ``limit``: each branch's (``claim_limit`` unless given). Locked rows are the
        table's only (``FOR NO KEY UPDATE OF``: ``where`` may read other tables).
        """
        t, spec = self.spec.table, self.spec
        now = self.now() if now is None else now
        limit = sa.bindparam("claim_limit", type_=sa.Integer()) if limit is None else limit
        ready = spec.ready_at(now)
        expired = (
            sa.select(t.c.id)
            .where(spec.expired(now), *ready, *where)
            .order_by(t.c.locked_until)
            .limit(limit)
        )
        aged = spec.aged
        if aged is not None and backend_for(self.engine).reads_levels:
            return (self._locked(expired, lock, only_table=bool(where)),
                    self._free_by_level(aged, now, [*ready, *where], limit, lock))
        free = (
            sa.select(t.c.id)
            .where(spec.free(), *ready, *where)
            .order_by(*self.ordered(now=now))
            .limit(limit)
        )
        return self._locked(expired, lock, only_table=bool(where)), self._locked(free, lock, only_table=bool(where))

    def _locked(self, select: sa.Select[Any], lock: bool, *, only_table: bool) -> sa.Select[Any]:
        """``select`` locking the rows it reads, skipping those other claims hold, when
        ``lock``. FOR NO KEY UPDATE: the claim never changes a key, so rows that reference
        a claimed row (their foreign-key checks take KEY SHARE) are not blocked.
        ``only_table``: ``OF`` the queue's table, for a select that reads others too."""
        if not lock:
            return select
        return select.with_for_update(skip_locked=True, key_share=True, of=self.spec.table if only_table else None)

    def _free_by_level(
        self, aged: AgedTerm, now: sa.ColumnElement[datetime], conditions: list[sa.ColumnElement[bool]],
        limit: sa.BindParameter[int], lock: bool,
    ) -> sa.Select[Any]:
        """The free branch of a queue ordered by an aged priority, read a level at a
        time (``Backend.reads_levels``), in the same order as sorting every free ready
        row (``ordered``) would give, and the same rows.

        Sorting every ready row by its aged priority (no index can hold a key that
        changes with the time) made a claim's cost grow with the rows ready: a polite
        claim of 8 took 4 ms with 1,000 sources due, 21 with 10,000 and 92 with 100,000
        (bench/polite_claim.py), so a backlog (a restart, an outage) drained ever more
        slowly the longer it was. Within one priority level the aged order is the order
        of ``since``, oldest first, except that rows with no ``since`` (never due, so not
        aged) come after the aged rows of their level and before those due for less than
        a step. So each level's first ``limit`` rows of each kind (``since`` passed,
        ``since`` NULL) are two range reads of the queue's level index
        (``QueueSpec.indexes``), and the branch's first ``limit`` rows are among them:
        they are merged and sorted, at most 2 x levels x ``limit`` rows. The levels in use
        are found by a recursive CTE (one index probe each: a loose index scan). Each
        read locks what it returns (``SKIP LOCKED`` past rows other claims hold), so up
        to that many rows are locked for the statement where the sort locked ``limit``.
        Valid for a queue whose rows are ready once their ``since`` has passed (or at
        once without one), as ``AgedTerm`` says."""
        t, spec = self.spec.table, self.spec
        level, since = aged.column, aged.since
        assert since is not None
        free = spec.free()
        highest = sa.select(level).where(free).order_by(level.desc()).limit(1)
        levels = sa.select(highest.scalar_subquery().label("level")).cte("levels", recursive=True)
        below = sa.select(level).where(free, level < levels.c.level).order_by(level.desc()).limit(1)
        levels = levels.union_all(sa.select(below.scalar_subquery()).where(levels.c.level.is_not(None)))

        due, never = aged.due_key(), aged.never

        def read(bound: sa.ColumnElement[bool], name: str) -> sa.Select[Any]:
            rows = self._locked(
                sa.select(t.c.id, level, since)
                .where(free, level == levels.c.level, bound, *conditions)
                .order_by(level, due, t.c.id)  # the level index's order: no sort
                .limit(limit),
                lock, only_table=True,  # beside the levels CTE
            )
            each = rows.lateral(name)
            return sa.select(each.c.id, each.c[level.name], each.c[since.name]).select_from(
                levels.join(each, sa.true()))

        merged = sa.union_all(
            read(sa.and_(due > never, due <= now), "aged_rows"), read(due == never, "undated_rows"),
        ).subquery("levelled")
        return sa.select(merged.c.id).order_by(*self.ordered(over=merged, now=now)).limit(limit)

    def ordered(self, over: Any = None, *, now: sa.ColumnElement[datetime] | None = None) -> list[sa.ColumnElement[Any]]:
        """The queue's order (``ORDER BY`` terms) over its table, or over the same-named
        columns of ``over`` (a derived table of its rows), as this database renders it."""
        now = self.now() if now is None else now
        backend = backend_for(self.engine)
        return [term.sql(over=over, now=now, backend=backend) for term in self.spec.order]

    def chosen_ids(self) -> sa.CompoundSelect[Any]:
        """``<expired> UNION ALL <free> LIMIT n``, without locks; built once per kind of
        queue (the count, SQLite's claim and the portable claim's read share it)."""
        if self.built.chosen is None:
            expired, free = self.candidates(lock=False)
            expired_sq, free_sq = expired.subquery(), free.subquery()
            self.built.chosen = sa.union_all(sa.select(expired_sq.c.id), sa.select(free_sq.c.id)).limit(
                sa.bindparam("claim_limit", type_=sa.Integer())
            )
        return self.built.chosen

    def claimable(self, now: sa.ColumnElement[datetime]) -> list[sa.ColumnElement[bool]]:
        """A row a claim may take at ``now``: pending, ready, and free or expired."""
        t = self.spec.table
        return [self.spec.pending, sa.or_(t.c.locked_until.is_(None), t.c.locked_until <= now),
                *self.spec.ready_at(now)]

    def lease_values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "locked_until": self._lease_until(),
            "claimed_by": sa.bindparam("claim_worker", type_=sa.Text()),
            "claim_token": sa.bindparam("claim_token", type_=sa.String()),
        }
        if self.spec.attempts is not None:
            values[self.spec.attempts.name] = self.spec.attempts + sa.literal_column("1")
        return values

    def isolate(self, claim: Claim[R]) -> Claim[R]:
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

"""PostgreSQL's claim, production's: one statement, sent by psycopg itself.

``WITH expired AS MATERIALIZED (... FOR NO KEY UPDATE SKIP LOCKED), free AS MATERIALIZED
(... FOR NO KEY UPDATE SKIP LOCKED), c AS MATERIALIZED (SELECT id FROM expired UNION ALL
SELECT id FROM free LIMIT n) UPDATE t SET <lease> FROM c WHERE t.id = c.id RETURNING
...``. MATERIALIZED keeps each CTE evaluated exactly once: the "WHERE id IN (SELECT ...
FOR UPDATE SKIP LOCKED)" form may be evaluated more than once by the planner and so
claim more than n rows. The outer LIMIT stops pulling (and locking) rows once n are
found. FOR NO KEY UPDATE: the claim never changes a key, so rows that reference a
claimed row (their foreign-key checks take KEY SHARE) are not blocked.

The hot statements (the claim, and a completion whose values need no conversion by
SQLAlchemy) are compiled once and sent by psycopg on a connection from the engine's pool,
prepared on the server: SQLAlchemy's per-statement work was most of a claim's client CPU
(bench/RESULTS.md). That is safe because postgresql.py ``configure`` pins every PostgreSQL
session to UTC and psycopg decodes JSON itself. A batch's completion and the next claim
go in one round trip and one commit (``complete_and_claim``). "Now" is the database's
clock, so hosts with skewed clocks agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from pipeline.backends.claiming import ClaimQueue, PoliteQueueParts, PortableClaim, Row
from pipeline.backends.recordset import json_rows, recordset


@dataclass(frozen=True)
class DriverStatement:
    """A statement as psycopg runs it: its SQL with PostgreSQL's own ``$n``
    placeholders, the parameter each one takes (``order``), the values of its fixed
    parameters, and for a fenced write each set column's conversion (None when the
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
        import psycopg  # here: a process on SQLite or MariaDB never loads PostgreSQL's driver

        return psycopg.RawCursor(pg).execute(self.sql, self.arguments(params), prepare=True)


# The placeholders of SQL compiled for psycopg (``%(name)s``) and its escaped percent sign.
_PYFORMAT = re.compile(r"%\((\w+)\)s|%%")


def dollar_placeholders(sql: str) -> tuple[str, tuple[str, ...]]:
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


class PostgreSQLClaim(PortableClaim):
    database_clock = True
    one_statement = True

    def __init__(self, queue: ClaimQueue) -> None:
        super().__init__(queue)
        self.claim_sql: DriverStatement | None = None
        # Compiled once per kind of queue (``Built``): the completions, by what they set;
        # complete_rows' statements, by their columns.
        self._complete_sql: dict[tuple[str, ...], DriverStatement] = queue.built.driver.setdefault("complete", {})
        self._each: dict[tuple[str, ...], sa.Update] = queue.built.driver.setdefault("each", {})
        self._names = [c.name for c in queue.columns]  # what a claim returns, in order

    # -- time ---------------------------------------------------------------------------

    def lease_until(self) -> sa.ColumnElement[datetime]:
        return self.now() + sa.bindparam("claim_lease", type_=sa.Interval())

    def time_params(self, lease: timedelta) -> dict[str, Any]:
        return {"claim_lease": lease}

    # -- the claim ----------------------------------------------------------------------

    def build_claim(self) -> sa.Update | sa.Select[Any]:
        q = self.queue
        t = q.table
        expired, free = q.candidates(lock=True)
        expired_cte = expired.cte("expired").prefix_with("MATERIALIZED")
        free_cte = free.cte("free").prefix_with("MATERIALIZED")
        chosen = (
            sa.union_all(sa.select(expired_cte.c.id), sa.select(free_cte.c.id))
            .limit(sa.bindparam("claim_limit", type_=sa.Integer()))
            .cte("c")
            .prefix_with("MATERIALIZED")
        )
        return sa.update(t).where(t.c.id == chosen.c.id).values(q.lease_values()).returning(*q.columns)

    def prepare(self, claim_stmt: sa.Update | sa.Select[Any]) -> None:
        super().prepare(claim_stmt)
        compiled = self.queue.built.driver.get("claim")
        if compiled is None or compiled[0] is not claim_stmt:
            compiled = self.queue.built.driver["claim"] = (claim_stmt, self.driver_sql(claim_stmt))
        self.claim_sql = compiled[1]

    def claim(self, params: dict[str, Any], limit: int) -> Sequence[Row]:
        assert self.claim_sql is not None
        with self.driver() as pg:
            return self.rows(self.claim_sql.execute(pg, params))

    def none_of(self, column: sa.ColumnElement[str], names: sa.Select[Any], name: str) -> sa.ColumnElement[bool]:
        """``column`` is not a key of a JSON object of ``names`` built once per statement
        (``jsonb_object_agg`` in a materialised CTE, ``{}`` when there are none; ``?``
        finds a key by binary search). ``IN (SELECT ... FROM cte)`` made the planner
        choose between a hash and reading the CTE's rows again for every row it tests,
        by its estimate of those rows: with statistics taken while few sources were due
        (or none yet, on a new table), the polite claim read every open group for every
        due source, 1,612 due x 242 open groups: claims of 33 ms on the simulated
        internet, against 3.5 with fresh statistics (bench/RESULTS.md, "the polite
        claim's plan"). A key lookup costs the same whatever the estimates say."""
        each = names.subquery(f"{name}_each")
        keys = sa.select(sa.func.coalesce(
            sa.func.jsonb_object_agg(each.c[0], sa.true(), type_=postgresql.JSONB),
            sa.cast(sa.literal("{}"), postgresql.JSONB),
        ).label("names"))
        once = keys.cte(name).prefix_with("MATERIALIZED")
        has_key: sa.ColumnElement[bool] = sa.type_coerce(sa.select(once.c.names).scalar_subquery(),
                                                          postgresql.JSONB).has_key(column)
        return sa.not_(has_key)

    def polite_claim(self, q: PoliteQueueParts) -> sa.Update | sa.Select[Any]:
        """The polite claim (pipeline/fetching/politeness.py) as one statement: the due
        sources whose group has room, their groups' rows locked (``FOR NO KEY UPDATE SKIP
        LOCKED``: a group another claim is drawing from is passed over), each group's room
        over its fetches in flight and the claims committed since this statement's
        snapshot, its spacing from ``clock_timestamp()``, and the groups' ``claims`` and
        next request written in the same statement (docs/runbook.md "Politeness")."""
        s, g = q.table, q.groups
        d = g.alias("d")
        expired, free = q.polite_candidates(lock=True)
        expired_cte = expired.cte("expired").prefix_with("MATERIALIZED")
        free_cte = free.cte("free").prefix_with("MATERIALIZED")
        branches = sa.union_all(
            sa.select(expired_cte.c.id, sa.literal(0).label("branch")),
            sa.select(free_cte.c.id, sa.literal(1).label("branch")),
        ).subquery("branches")
        cand = (
            sa.select(
                s.c.id, s.c.politeness_group.label("grp"), s.c.priority, s.c.next_fetch_at,
                branches.c.branch,
            )
            .join(branches, branches.c.id == s.c.id)
            .cte("cand")
            .prefix_with("MATERIALIZED")
        )
        # The candidates' groups that are open, locked; their newest row (re-read and
        # re-checked under the lock when a claim committed since this statement began).
        # Open by the clock at the lock, not the statement's start (now()): a claim that
        # committed since then set the group's next request from its own, later clock.
        locked = (
            sa.select(
                g.c.name, g.c.claims,
                sa.func.coalesce(g.c.max_in_flight, d.c.max_in_flight).label("max_in_flight"),
                sa.func.coalesce(g.c.min_interval_ms, d.c.min_interval_ms).label("interval_ms"),
            )
            .select_from(g)
            .join(d, d.c.name == q.default_group)
            .where(
                g.c.name.in_(sa.select(cand.c.grp)),
                sa.or_(
                    g.c.next_request_at.is_(None),
                    g.c.next_request_at <= sa.func.clock_timestamp(type_=self.time_type),
                ),
            )
            .with_for_update(skip_locked=True, key_share=True, of=g)
            .cte("locked")
            .prefix_with("MATERIALIZED")
        )
        # The same rows as this statement's snapshot sees them. The snapshot's count of
        # fetches in flight misses only the sources handed out since it was taken, and
        # every one of those bumped ``claims`` (under the lock this statement now holds):
        # the difference between the newest row and the snapshot's is exactly them.
        seen = g.alias("seen")
        room = (
            sa.select(
                locked.c.name, locked.c.interval_ms,
                (
                    locked.c.max_in_flight - q.in_flight(locked.c.name)
                    - (locked.c.claims - seen.c.claims)
                ).label("room"),
            )
            .join(seen, seen.c.name == locked.c.name)
            .cte("room")
            .prefix_with("MATERIALIZED")
        )
        order = q.order_keys(cand)
        ranked = (
            sa.select(
                cand.c.id, cand.c.grp, cand.c.branch, cand.c.priority, cand.c.next_fetch_at,
                room.c.interval_ms, room.c.room,
                sa.func.row_number().over(partition_by=cand.c.grp, order_by=order).label("rn"),
            )
            .join(room, room.c.name == cand.c.grp)
            .subquery("ranked")
        )
        picked = (
            sa.select(ranked.c.id, ranked.c.grp, ranked.c.interval_ms)
            .where(
                ranked.c.rn <= ranked.c.room,
                sa.or_(ranked.c.interval_ms == 0, ranked.c.rn == 1),  # spaced: one per claim
            )
            .order_by(*q.order_keys(ranked))
            .limit(sa.bindparam("claim_limit", type_=sa.Integer()))
            .cte("picked")
            .prefix_with("MATERIALIZED")
        )
        picked_groups = (
            sa.select(picked.c.grp, picked.c.interval_ms, sa.func.count().label("n"))
            .group_by(picked.c.grp, picked.c.interval_ms)
            .subquery("pg")
        )
        bump = (
            sa.update(g)
            .where(g.c.name == picked_groups.c.grp)
            .values(
                claims=g.c.claims + picked_groups.c.n,
                # From the moment of this update (clock_timestamp(), not the statement's
                # start, now()): the spacing runs from as close to the send as SQL gets.
                next_request_at=sa.func.clock_timestamp(type_=self.time_type) + sa.func.make_interval(
                    0, 0, 0, 0, 0, 0, sa.cast(picked_groups.c.interval_ms, sa.Float) / 1000.0
                ),
                deferred_reason=None,
            )
            .cte("bump")
        )
        claim = (
            sa.update(s)
            .where(s.c.id == picked.c.id)
            .values(q.lease_values())
            .returning(*q.columns)
            .add_cte(bump)
        )
        # WITH ..., taken AS (UPDATE sources ... RETURNING sources.*),
        #      started AS (INSERT INTO ingestion_events ... SELECT ... FROM taken), ...
        # SELECT * FROM taken
        taken = claim.cte("taken")
        recorded = q.recorded(taken)
        if not recorded:
            return claim
        return sa.select(*taken.c).add_cte(*(insert.cte(name) for name, insert in recorded.items()))

    # -- the fenced writes --------------------------------------------------------------

    def ids_in(self, column: sa.Column[Any]) -> sa.ColumnElement[bool]:
        """``= ANY(:ids)`` with one bound array: the same text, and plan, for every
        batch size."""
        return column == sa.any_(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger())))

    def complete_now(self, token: str, worker: str, ids: Sequence[int], values: Mapping[str, Any]) -> list[int] | None:
        driver = self.completion(values)
        if driver is None:
            return None
        with self.driver() as pg:
            cursor = driver.execute(pg, self._completion_params(driver, token, worker, ids, values))
            return [row[0] for row in cursor.fetchall()]

    def complete_and_claim(
        self, token: str, worker: str, ids: Sequence[int], values: Mapping[str, Any], params: dict[str, Any],
    ) -> tuple[list[int], Sequence[Row]] | None:
        """In psycopg's pipeline mode: the worker waits for the database once and commits
        once. If the completion fails, the next claim is not taken either."""
        driver = self.completion(values)
        if driver is None or self.claim_sql is None:
            return None
        with self.driver() as pg:
            with pg.pipeline():
                completed = driver.execute(pg, self._completion_params(driver, token, worker, ids, values))
                claimed = self.claim_sql.execute(pg, params)
            done = [row[0] for row in completed.fetchall()]
            return done, self.rows(claimed)

    def completion(self, values: Mapping[str, Any]) -> DriverStatement | None:
        """The completion setting ``values`` as driver SQL, or None where SQLAlchemy must
        send it (a SQL expression among the values, or a column the table lacks)."""
        t = self.queue.table
        if any(isinstance(v, sa.ClauseElement) or name not in t.c for name, v in values.items()):
            return None
        key = tuple(sorted(values))
        statement = self._complete_sql.get(key)
        if statement is None:
            dialect = self.queue.engine.dialect
            # The columns' own conversions (UTC times, JSON), as SQLAlchemy applies them.
            convert = {name: t.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in key}
            statement = self._complete_sql[key] = self.driver_sql(self.queue.fenced_statement(key), convert)
        return statement

    @staticmethod
    def _completion_params(
        statement: DriverStatement, token: str, worker: str, ids: Sequence[int], values: Mapping[str, Any]
    ) -> dict[str, Any]:
        params = {"ids": list(ids), "fence_token": token, "fence_worker": worker}
        for name, value in values.items():
            convert = statement.convert[name]
            params[f"set_{name}"] = value if convert is None else convert(value)
        return params

    def complete_rows(self, conn: Connection, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> set[int] | None:
        """``UPDATE t SET c = v.c ... FROM jsonb_to_recordset(:rows) AS v(id, fence_token,
        fence_worker, c ...) WHERE t.id = v.id AND t.claim_token = v.fence_token AND
        t.claimed_by = v.fence_worker``: one bound JSON parameter whatever the batch size."""
        return set(conn.execute(self.each_statement(columns), {"rows": json_rows(rows)}).scalars())

    def each_statement(self, columns: tuple[str, ...]) -> sa.Update:
        stmt = self._each.get(columns)
        if stmt is None:
            t = self.queue.table
            v = recordset([
                sa.column("id", sa.BigInteger()),
                sa.column("fence_token", sa.Text()),
                sa.column("fence_worker", sa.Text()),
                *(sa.column(name, t.c[name].type) for name in columns),
            ])
            values: dict[str, Any] = {name: v.c[name] for name in columns}
            values.update(locked_until=None, claimed_by=None, claim_token=None)
            stmt = self._each[columns] = (
                sa.update(t)
                .where(t.c.id == v.c.id, t.c.claim_token == v.c.fence_token, t.c.claimed_by == v.c.fence_worker)
                .values(values)
                .returning(t.c.id)
            )
        return stmt

    # -- the driver's own path ----------------------------------------------------------

    def driver_sql(
        self, stmt: sa.Update | sa.Select[Any], convert: Mapping[str, Callable[[Any], Any] | None] | None = None,
    ) -> DriverStatement:
        """``stmt`` as psycopg runs it: compiled by the engine's dialect, its placeholders
        then PostgreSQL's own."""
        compiled = stmt.compile(dialect=self.queue.engine.dialect)
        sql, order = dollar_placeholders(str(compiled))
        return DriverStatement(sql, order, dict(compiled.params), convert or {})

    @contextmanager
    def driver(self) -> Iterator[Any]:
        """A psycopg connection from the engine's pool, in autocommit while it is lent.

        Its errors reach the caller as SQLAlchemy's (``sa.exc.DBAPIError``), as every
        other statement's do, and a connection the error broke leaves the pool.
        """
        engine = self.queue.engine
        dbapi_error = engine.dialect.loaded_dbapi.Error
        try:
            raw = engine.raw_connection()  # unlike Engine.connect, it does not wrap errors
        except dbapi_error as exc:
            raise sa.exc.DBAPIError.instance(None, None, exc, dbapi_error, hide_parameters=True) from exc
        pg = raw.driver_connection
        assert pg is not None
        try:
            pg.autocommit = True
            yield pg
        except dbapi_error as exc:
            broken = bool(pg.closed or pg.broken or engine.dialect.is_disconnect(exc, pg, None))
            if broken:
                # As SQLAlchemy does on a disconnect: this connection leaves the pool, and
                # every other the pool holds is stale too (a server restart): the engine
                # starts a new pool (the old one's idle connections are closed now, those
                # lent out when they come back).
                raw.invalidate(exc)
                engine.dispose()
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

    def rows(self, cursor: Any) -> list[Row]:
        """A claim's rows (the queue's columns, in order: psycopg's ``description``
        builds a column object per column at each call)."""
        names = self._names
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

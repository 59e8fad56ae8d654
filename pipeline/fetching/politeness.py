"""Politeness as part of the claim: a source is handed out only when its group has room.

The policy (which group a source is in, what a group allows, which due sources a claim
may take) is pipeline/core/politeness.py; the groups' rows and their deferral (a 429 or
503 with Retry-After defers the whole group) are pipeline/storage/politeness_groups.py.
``PoliteQueue`` is the sources queue whose claim enforces the limits in the database, so
a worker never holds a source it cannot start, and the request deadline starts only when
the request is sent.

How the PostgreSQL claim stays safe with many workers, in one statement
(``PostgreSQLClaim.polite_claim`` in pipeline/backends/claim_postgresql.py, from the
pieces this module gives it, ``PoliteQueueParts``; docs/runbook.md "Politeness" has the
SQL):

* fetches in flight are the group's sources whose lease is running: a dead worker's
  slot frees itself when its lease runs out;
* the claim locks the row of each group it draws from (``FOR NO KEY UPDATE SKIP
  LOCKED``: a group another worker is claiming from is passed over), and adds the
  number of sources it hands out of a group to the group's ``claims``. The count of
  fetches in flight is read from the statement's snapshot; the sources handed out by
  claims that committed since then are the locked (newest) row's ``claims`` less the
  snapshot's, and are added to it. Completions and expiries since then only free slots,
  and a lease that ran out is never extended (claim.py), so the count can only be high,
  never low: a group never has more than ``max_in_flight`` fetches at once, and a claim
  that raced another in the same group still takes what room is left;
* spacing: the claim sets ``next_request_at = clock_timestamp() + min_interval``, and a
  group is only drawn from when ``next_request_at <= now()``, re-checked on the locked
  row by the clock at the lock; with a spacing, one source per group per claim.

Elsewhere (SQLite, which serialises writers, MariaDB and the portable path) the same
rules run as a few statements in one transaction, the group rows locked before the count
(``PoliteQueue._claim_in_steps``, here: the reference).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Hashable, Mapping
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from pipeline.backends.claiming import PortableClaim
from pipeline.core.politeness import DEFAULT, pick
from pipeline.core.settings import DEFAULT_LEASE_SECONDS
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import Claim
from pipeline.storage import counters, schema
from pipeline.storage.bulk import insert_rows
from pipeline.storage.politeness_groups import fetching
from pipeline.storage.rows import SourceRow

log = logging.getLogger(__name__)

_groups, _sources = schema.politeness_groups, schema.sources
# How many due sources a claim looks at per source it may hand out: enough that groups
# with no room (their sources are filtered out in SQL first) never starve the others.
SCAN_FACTOR = 4
# How soon to look again when every due source's group is full: its slots are held by
# fetches in flight (another worker's: our own wake the loop when they finish).
SLOT_POLL_SECONDS = 0.1


class PoliteQueue(WorkQueue[SourceRow]):
    """The due-sources queue whose claim only hands out sources whose group has room."""

    def __init__(
        self, engine: sa.Engine, *, lease_seconds: int = DEFAULT_LEASE_SECONDS, claiming: type[PortableClaim] | None = None,
        record_started: bool = False, run_id: str | None = None,
    ) -> None:
        """``record_started``: each claim also writes an ``ingestion.started`` event
        (``started_event``, run ``run_id``) for every source it hands out, in the claim's
        own statement or transaction: no extra round trip, and a source is never leased
        without its event nor the event written for a claim that did not commit. It
        counts them too (``counters.SOURCES_CLAIMED``), in the same way."""
        self.record_started, self.run_id = record_started, run_id
        self.groups, self.default_group = _groups, DEFAULT
        super().__init__(engine, schema.SOURCES_DUE, lease_seconds=lease_seconds, claiming=claiming, row=SourceRow)
        if "next_start" not in self.built.own:
            self.built.own["next_start"] = self._build_next_start()
        self._next_start = self.built.own["next_start"]

    def _statement_key(self) -> Hashable:
        """Its claim writes the started events or not (``recorded``)."""
        return self.record_started

    # -- shared SQL ---------------------------------------------------------------------

    def in_flight(self, group: sa.ColumnElement[str]) -> sa.ScalarSelect[int]:
        """The group's fetches in flight: its claimed sources whose lease is running
        (served by ix_sources_politeness_leased, whose predicate is the holder's)."""
        leased = _sources.alias("leased")
        return (
            sa.select(sa.func.count())
            .where(leased.c.politeness_group == group, fetching(leased, self.now()))
            .scalar_subquery()
        )

    def _has_room(self) -> sa.ColumnElement[bool]:
        """The source's group may start a fetch now: spacing passed, not deferred, and
        fewer fetches in flight than it allows. Found as the groups that may *not*, once
        per statement, from what stays small however many groups there are: the groups
        whose next request is ahead (spaced or deferred: claimed in the last moments, or
        told to wait) and the groups whose fetches in flight reach their limit (read from
        the leased sources' index: what is in flight). Looking through every group for
        the open ones counted each group's fetches in flight at every claim, a cost that
        grew with the groups: 11 ms a claim at 2,000 groups, 50 at 20,000, 250 at 100,000
        (bench/polite_claim.py, bench/RESULTS.md "The polite claim without a count per
        group"). Asked per due source instead, PostgreSQL once counted every group's
        fetches for each due source (952 counts a claim). How a source's group is looked
        up among them is the database's (``none_of``: on PostgreSQL a key lookup, whatever
        the planner's estimates). A source whose group has no row (there is always one:
        ``ensure_groups``) passes here and is passed over where its group's room is read."""
        g, d = _groups.alias("g"), _groups.alias("d")
        now = self.now()
        leased = _sources.alias("leased")
        spaced = sa.select(g.c.name.label("name")).where(g.c.next_request_at > now)
        counted = (
            sa.select(leased.c.politeness_group.label("name"), sa.func.count().label("n"))
            .where(fetching(leased, now))
            .group_by(leased.c.politeness_group)
            .subquery("in_flight")
        )
        full = (
            sa.select(counted.c.name)
            .select_from(counted.join(g, g.c.name == counted.c.name).join(d, d.c.name == DEFAULT))
            .where(counted.c.n >= sa.func.coalesce(g.c.max_in_flight, d.c.max_in_flight))
        )
        closed = sa.union_all(spaced, full).subquery("closed")
        return self.claiming.none_of(_sources.c.politeness_group, sa.select(closed.c.name), "closed_groups")

    def polite_candidates(self, *, lock: bool) -> tuple[sa.Select[Any], sa.Select[Any]]:
        """The claim's two branches (expired leases, free rows), less sources whose group
        has no room, each looking at up to ``claim_scan`` rows."""
        scan = sa.bindparam("claim_scan", type_=sa.Integer())
        return self.candidates(lock=lock, where=[self._has_room()], limit=scan)

    def order_keys(self, rows: Any) -> list[sa.ColumnElement[Any]]:
        """The queue's order over a derived table of candidates; expired leases first."""
        return [rows.c.branch, *self.ordered(over=rows)]

    # -- PostgreSQL: one statement ----------------------------------------------------------

    def _build_claim(self) -> sa.Update | sa.Select[Any]:
        if not self.claiming.one_statement:
            return super()._build_claim()
        return self.claiming.polite_claim(self)  # PostgreSQL's one statement (pipeline/backends/)

    def recorded(self, taken: Any) -> dict[str, sa.Insert]:
        """With ``record_started``: the sources' started events and their count, from the
        claim's own rows (``taken``), in the claim's statement (PostgreSQL)."""
        if not self.record_started:
            return {}
        e = schema.ingestion_events
        started = e.insert().from_select(
            [e.c.event, e.c.source_id, e.c.source_type, e.c.run_id, e.c.scheduled_at],
            sa.select(
                sa.literal(schema.EVENT_STARTED), taken.c.id, taken.c.source_type,
                sa.bindparam("started_run_id", type_=sa.Text()), taken.c.next_fetch_at,
            ),
        )
        counted = counters.count_rows_of(self.engine, sa.select(taken.c.id), counters.SOURCES_CLAIMED)
        return {"started": started, "counted": counted}

    # -- claim --------------------------------------------------------------------------

    def claim(self, worker: str, limit: int) -> Claim[SourceRow]:
        if not self.claiming.one_statement:
            return self._claim_in_steps(worker, limit)
        return super().claim(worker, limit)  # one statement, sent by psycopg itself

    def _claim_params(self, worker: str, limit: int) -> tuple[str, dict[str, Any]]:
        """The PostgreSQL claim's parameters: the queue's, the started events' run and how
        many due sources to look at."""
        token, params = super()._claim_params(worker, limit)
        return token, {**params, "started_run_id": self.run_id, "claim_scan": limit * SCAN_FACTOR}

    def _claim_in_steps(self, worker: str, limit: int) -> Claim[SourceRow]:
        """SQLite and the portable path: the same rules, as statements in one transaction.
        The group rows are locked (SQLite: the whole database is) before fetches in
        flight are counted, so the count is current."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        s, g, d = _sources, _groups, _groups.alias("d")
        token = uuid.uuid4().hex
        expired, free = self.polite_candidates(lock=False)
        with self.engine.begin() as conn:
            params = {"claim_scan": limit * SCAN_FACTOR, **self._time_params_in(conn)}
            candidates: list[dict[str, Any]] = []
            for branch, query in enumerate((expired, free)):
                ids = list(conn.execute(query, params).scalars())
                found = conn.execute(
                    sa.select(s.c.id, s.c.politeness_group, s.c.priority, s.c.next_fetch_at)
                    .where(s.c.id.in_(ids))
                ).mappings().all()
                candidates.extend({**row, "branch": branch} for row in found)
            if not candidates:
                return Claim(self.spec.name, worker, token, [])
            groups = [dict(group) for group in conn.execute(
                sa.select(
                    g.c.name,
                    sa.func.coalesce(g.c.max_in_flight, d.c.max_in_flight).label("max_in_flight"),
                    sa.func.coalesce(g.c.min_interval_ms, d.c.min_interval_ms).label("interval_ms"),
                )
                .select_from(g).join(d, d.c.name == DEFAULT)
                .where(
                    g.c.name.in_({row["politeness_group"] for row in candidates}),
                    sa.or_(g.c.next_request_at.is_(None), g.c.next_request_at <= self.now()),
                )
                .with_for_update(of=g),
                params,
            ).mappings()]
            in_flight: dict[str, int] = dict(conn.execute(
                sa.select(s.c.politeness_group, sa.func.count())
                .where(s.c.politeness_group.in_([grp["name"] for grp in groups]),
                       fetching(s, self.now()))
                .group_by(s.c.politeness_group),
                params,
            ).all())
            picked = pick(candidates, groups, in_flight, self.spec.sort, limit)
            if not picked:
                return Claim(self.spec.name, worker, token, [])
            taken = self._take(conn, [row["id"] for row in picked], worker, token, params)
            if not taken:  # every picked source was leased by another worker meanwhile
                return Claim(self.spec.name, worker, token, [])
            if self.record_started:
                insert_rows(conn, schema.ingestion_events, [started_event(row, self.run_id) for row in taken])
            spacing = {grp["name"]: grp["interval_ms"] for grp in groups}
            now = params["claim_now"]  # this host's clock, or MariaDB's
            # What was handed out, not what was picked: a source leased by another worker
            # between the pick and the lease spends none of its group's room or spacing.
            for name, n in Counter(row["politeness_group"] for row in taken).items():
                conn.execute(
                    sa.update(g).where(g.c.name == name).values(
                        claims=g.c.claims + n, deferred_reason=None,
                        next_request_at=now + timedelta(milliseconds=spacing[name]),
                    )
                )
            if self.record_started:  # last in the transaction: see pipeline/storage/counters.py
                counters.add(conn, {(counters.SOURCES_CLAIMED.name, ""): len(taken)})
        return self._claimed(worker, token, taken)

    def _take(
        self, conn: Connection, ids: list[int], worker: str, token: str, params: dict[str, Any]
    ) -> list[RowMapping]:
        """Lease the picked sources (re-checking that they are still due and free)."""
        s = _sources
        now = self.now()
        still = [
            s.c.id.in_(ids), self.spec.pending,
            sa.or_(s.c.locked_until.is_(None), s.c.locked_until <= now),
        ]
        if self.spec.ready is not None:
            still.append(self.spec.ready(now))
        values = {**self.lease_values()}
        lease = {**params, "claim_worker": worker, "claim_token": token}
        if conn.dialect.update_returning:  # SQLAlchemy's word: it hands back the rows
            return list(conn.execute(
                sa.update(s).where(*still).values(values).returning(*s.c), lease
            ).mappings().all())
        conn.execute(sa.update(s).where(*still).values(values), lease)
        return list(conn.execute(
            sa.select(s).where(s.c.id.in_(ids), s.c.claim_token == token)
        ).mappings().all())

    # -- waiting for room ----------------------------------------------------------------

    def _build_next_start(self) -> sa.Select[Any]:
        """When the earliest group of a due, claimable source opens again (its spacing
        or deferral), among the groups with a free slot now and among all of them; both
        NULL when no source is due."""
        s, g, d, spec = _sources, _groups, _groups.alias("d"), self.spec
        now = self.now()
        # The claim's two branches (free, expired), each its own partial index's range:
        # "free or expired" as one OR read every source, however few were due.
        due = sa.union_all(
            sa.select(s.c.politeness_group).where(spec.free(), *spec.ready_at(now)),
            sa.select(s.c.politeness_group).where(spec.expired(now), *spec.ready_at(now)),
        )
        opens = sa.func.coalesce(g.c.next_request_at, now)
        has_slot = self.in_flight(g.c.name) < sa.func.coalesce(g.c.max_in_flight, d.c.max_in_flight)
        return (
            sa.select(
                sa.func.min(sa.case((has_slot, opens))).label("with_slot"),
                sa.func.min(opens).label("any"),
                now.label("now"),
            )
            .select_from(g)
            .join(d, d.c.name == DEFAULT)
            .where(g.c.name.in_(due))
        )

    def next_start_in(self) -> float | None:
        """Seconds until a due source may be claimed; None when no source is due.

        0 means now: a group with a due source is open and has a free slot, so a claim
        that came back short lost a race for the group's row to another worker's claim
        (the caller looks again in a moment). When every such group's slots are held by
        fetches in flight, which free themselves when those end, ``SLOT_POLL_SECONDS``."""
        params = {"claim_limit": 1, **self._time_params(self.lease)}
        with self._autocommit.connect() as conn:
            with_slot, any_group, now = conn.execute(self._next_start, params).one()
        if any_group is None:
            return None
        if with_slot is not None:
            return max(0.0, float((with_slot - now).total_seconds()))
        return max(SLOT_POLL_SECONDS, float((any_group - now).total_seconds()))


def started_event(source: Mapping[Any, Any], run_id: str | None) -> dict[str, Any]:
    """The ``ingestion.started`` event of a claimed source, as ingestion_events stores it
    (the PostgreSQL claim writes the same columns in SQL: ``PoliteQueue._build_claim``,
    around ``PostgreSQLClaim.polite_claim``)."""
    return {
        "event": schema.EVENT_STARTED,
        "source_id": source["id"],
        "source_type": source["source_type"],
        "run_id": run_id,
        "scheduled_at": source["next_fetch_at"],
    }


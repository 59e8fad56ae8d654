"""One collector pass: claim due sources, fetch them, store what is new, reschedule them.

Fetches run on a thread pool with no transaction and no row lock open; the pool is kept
full (pipeline/queue/workpool.py: sources are claimed as threads come free), so one slow
source delays no other.
Each source gets an ``ingestion.started`` event when it is claimed. Fetches that finish
together are written in ONE transaction holding, for each of them, the fenced completion
(next_fetch_at, validators, failure streak), the raw rows of new or changed items and the
``ingestion.completed`` event: after a crash, all of a source's writes exist or none.
If the database refuses that transaction, each source is written alone, so one source's
bad data fails only that source. A failing source is rescheduled by pipeline/core/backoff.py
and never fails the pass.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import backend_for, unreachable
from pipeline.backends.changed import JSONValue, StoreChanged
from pipeline.core import errors, heap
from pipeline.core.backoff import (
    BackoffPolicy,
    clamp_retry_after,
)
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.kinds import SourceType
from pipeline.core.settings import Settings
from pipeline.fetching import websub
from pipeline.fetching.base import Item, Outcome
from pipeline.fetching.decide import (
    Cadence,
    SourceDecision,
    after_failure,
    after_success,
    owner_alert,
)
from pipeline.fetching.politeness import PoliteQueue, started_event
from pipeline.fetching.registry import adapter_for, fetch_source, push_reader
from pipeline.net.http import Fetcher
from pipeline.queue.spec import Claim, RowCompletion
from pipeline.queue.workpool import work_claimed
from pipeline.storage import counters, owners, schema, watches
from pipeline.storage.bulk import insert_rows
from pipeline.storage.politeness_groups import cadence_floor_minutes, defer, ensure_groups
from pipeline.storage.rows import SourceRow
from pipeline.storage.status import records

log = logging.getLogger("pipeline.ingestion")



@dataclass
class CollectStats:
    claimed: int = 0
    succeeded: int = 0
    not_modified: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    fenced_out: int = 0  # finished after another worker took the source over
    items_seen: int = 0
    items_new: int = 0
    hub_requests: int = 0  # WebSub subscriptions, renewals and endings asked of hubs
    latencies_ms: list[int] = field(default_factory=list)

    def percentile(self, q: float) -> int | None:
        if not self.latencies_ms:
            return None
        if len(self.latencies_ms) == 1:
            return self.latencies_ms[0]
        return int(statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(q) - 1])

    def as_dict(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "fetched": self.succeeded,
            "not_modified": self.not_modified,
            "failed": sum(self.failed.values()),
            "failed_by_reason": dict(self.failed),
            "fenced_out": self.fenced_out,
            "items_seen": self.items_seen,
            "items_new": self.items_new,
            "hub_requests": self.hub_requests,
            "fetch_latency_p50_ms": self.percentile(50),
            "fetch_latency_p95_ms": self.percentile(95),
        }

    def tally(self, event: Mapping[str, Any]) -> None:
        self.latencies_ms.append(event["duration_ms"])
        if event["success"]:
            self.succeeded += 1
            self.not_modified += event["http_status"] == 304
            self.items_seen += event["items_seen"]
            self.items_new += event["items_new"]
        else:
            self.failed[event["failure_reason"]] += 1


@dataclass
class Fetched:
    """One source after its fetch: an outcome or an error, and how long it took."""

    claim: Claim[SourceRow]
    source: SourceRow
    outcome: Outcome | None
    error: FetchError | None
    finished: datetime
    duration_ms: int
    items_seen: int | None = None  # set when the items were capped: how many the fetch had
    items_left: int = 0  # new or changed items left for the next fetch by the cap


@dataclass
class Collector:
    engine: Engine
    settings: Settings
    worker: str
    run_id: str | None = None
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    batch_size: int = 32
    # Results that finish within this many seconds of each other are written in one
    # transaction: per-transaction work is then shared (bench/RESULTS.md).
    write_window: float = 0.1
    random_unit: Callable[[], float] = random.random
    _storing: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _group_floors: dict[str, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Whether any listing is watched for change alerts (read once per run): if none, a
    # fetch's items are not compared with the watched ones (pipeline/storage/watches.py).
    _watching: bool = field(default=False, init=False, repr=False, compare=False)
    # Whether any source has an owner (read once per run): if none, no owner is looked up.
    _owned: bool = field(default=False, init=False, repr=False, compare=False)
    # Whether any source has a WebSub subscription (read once per run).
    _pushed: bool = field(default=False, init=False, repr=False, compare=False)

    @records("collector")
    def run(self, *, max_sources: int | None = None, concurrency: int | None = None,
            claim_until: float | None = None) -> CollectStats:
        """Claim due sources until none is due, ``max_sources`` were claimed or
        ``claim_until`` (``time.monotonic()``) has passed, and fetch them."""
        heap.settle()  # once per process: what it imported, out of the collector's sight
        stats = CollectStats()
        with self.engine.connect() as conn:
            self._watching = conn.execute(sa.select(schema.watches.c.user_id).limit(1)).first() is not None
            self._owned = owners.any_owned(conn)
            self._pushed = websub.any_subscribed(conn)
        # Politeness is in the claim: a source is handed out only when its group has room.
        # Each claim writes its sources' started events itself (before any request
        # leaves: a fetch that reached its host always has its event), in its own
        # statement: no transaction of their own per batch.
        queue = PoliteQueue(
            self.engine, lease_seconds=self.settings.lease_seconds, record_started=True, run_id=self.run_id
        )
        # Load the adapters (and the parsers they import) before the first claim: a
        # claimed source's request must leave at once, or the group's spacing, kept
        # between claims, is not what its host sees.
        adapter_for(SourceType.RSS)
        threads = concurrency or self.settings.concurrency
        with Fetcher.from_settings(self.settings, threads=threads) as fetcher:
            stats.claimed = work_claimed(
                queue, self.worker, threads=threads, max_rows=max_sources,
                batch_size=self.batch_size, write_window=self.write_window,
                start=lambda claim: self._start(queue, claim, stats),
                held=lambda job: (job[0], job[1]["id"]),
                work=lambda job: self._fetch(*job, fetcher),
                write=lambda batch: self._store(queue, batch, stats),
                # A fetch is bounded by its deadline; an adapter may make a few requests.
                max_work_seconds=4 * self.settings.http_timeout_seconds + 60,
                next_start_in=queue.next_start_in,
                claim_until=claim_until,
            )
            if self.settings.websub_callback_url:  # subscriptions, renewals, endings due
                stats.hub_requests = websub.ask_due(self.engine, self.settings, fetcher, self.worker)
        return stats

    def _start(self, queue: PoliteQueue, claim: Claim[SourceRow], stats: CollectStats
               ) -> list[tuple[Claim[SourceRow], SourceRow]]:
        """Log the claimed sources' started events (the claim wrote them); the ones whose
        earlier holders all died before finishing (claimed too often) end here as a
        failure, unfetched."""
        for row in claim.rows:
            _log(started_event(row, self.run_id))
        limit = self.settings.source_max_attempts
        abandoned = [row for row in claim.rows if queue.spec.exhausted(row, limit)]
        if abandoned:
            now = datetime.now(UTC)
            error = FetchError(
                FailureReason.TIMEOUT,
                f"claimed {limit + 1} times without a fetch finishing: every worker that took"
                " it stopped (killed, cut off, or out of lease) while fetching",
            )
            self._store(queue, [Fetched(claim, cast(SourceRow, dict(row)), None, error, now, 0) for row in abandoned],
                        stats)
        gone = {row["id"] for row in abandoned}
        return [(claim, row) for row in claim.rows if row["id"] not in gone]

    # -- fetching (on the pool's threads) ------------------------------------------------

    def _fetch(self, claim: Claim[SourceRow], row: SourceRow, fetcher: Fetcher) -> Fetched:
        source = cast(SourceRow, dict(row))  # a row of its own (SQLite's is the result's)
        started = time.monotonic()
        outcome: Outcome | None = None
        error: FetchError | None = None
        try:
            outcome = fetch_source(source, fetcher)
        except FetchError as exc:
            error = exc
        except Exception as exc:  # an adapter bug must not stop the other sources
            log.exception("adapter crashed on source %s", source["id"])
            error = FetchError(FailureReason.PARSE_ERROR, f"unexpected {type(exc).__name__}: {exc}")
        duration_ms = int((time.monotonic() - started) * 1000)
        if (self.settings.websub_callback_url and outcome is not None and outcome.hub and outcome.topic
                and push_reader(source["source_type"]) is not None and websub.trusted(outcome.hub, self.settings)):
            self._subscribe(source["id"], outcome.hub, outcome.topic)
        return Fetched(claim, source, outcome, error, datetime.now(UTC), duration_ms)

    def _subscribe(self, source_id: int, hub: str, topic: str) -> None:
        """Make asking the hub the source advertises due (pipeline/fetching/websub.py),
        under this fetch's claim; the request is sent by ``ask_due`` at the end of the
        run. A failure to is logged, never the fetch's."""
        try:
            self._pushed |= websub.ensure(self.engine, source_id, hub, topic)
        except Exception:  # a hub's trouble is no failed fetch
            log.exception("source %s: subscribing at %s failed", source_id, hub)

    # -- storing (on the collector's own thread) ----------------------------------------

    def _store(self, queue: PoliteQueue, batch: list[Fetched], stats: CollectStats) -> None:
        """Write a batch in one transaction; if the database refuses it, source by source.
        Batches are written on the pool's writer thread, sources that end unfetched on the
        claiming thread (``_start``): one at a time, so ``stats`` is counted right."""
        with self._storing:
            self._store_now(queue, batch, stats)

    def _store_now(self, queue: PoliteQueue, batch: list[Fetched], stats: CollectStats) -> None:
        try:
            events = self._write(queue, batch)
        except sa.exc.StatementError as exc:
            if unreachable(exc):
                # The database is gone or cannot do it now (a restart, a lost connection,
                # a full disk, a lock), not this batch's data: fail the step, blame no source.
                raise
            if len(batch) > 1:
                for one in batch:
                    self._store_now(queue, [one], stats)
                return
            # This source's own data was refused (a value the database cannot store):
            # it fails like a broken document, so it backs off instead of failing again.
            [fetched] = batch
            reason = errors.reason(exc)
            log.warning("the database refused the items of source %s: %s", fetched.source["id"], reason)
            fetched.outcome = None
            fetched.error = FetchError(
                FailureReason.PARSE_ERROR, f"the database refused this source's items: {reason}"
            )
            events = self._write(queue, batch)
        stats.fenced_out += len(batch) - len(events)
        for event in events:
            stats.tally(event)
            _log(event)  # after the commit: the log never shows an event the database lacks

    def _write(self, queue: PoliteQueue, batch: list[Fetched]) -> list[dict[str, Any]]:
        """Complete, store items and record events for ``batch``; the events written."""
        with self.engine.begin() as conn:
            decisions = {}
            for fetched in batch:
                self._cap_items(conn, fetched)
                decisions[fetched.source["id"]] = self._decide(conn, fetched)
            if self._pushed:  # a pushed source is polled as a safety net only, unless pushes went missing
                self._after_polls(conn, batch, decisions)
            completions = {source_id: decision.values() for source_id, decision in decisions.items()}
            fenced = queue.complete_each(
                [RowCompletion(f.claim, f.source["id"], completions[f.source["id"]]) for f in batch],
                conn=conn,
            )
            done = set(fenced.done)
            kept = [f for f in batch if f.source["id"] in done]
            if self._pushed:  # a source its failures disabled is pushed to no more
                websub.end(conn, [f.source["id"] for f in kept if decisions[f.source["id"]].disabled_reason])
            for f in kept:
                self._defer_group(conn, f)
            if self._owned:
                self._tell_owners(conn, kept, decisions)
            new = store_items(
                conn,
                [(f.source["id"], f.outcome.items) for f in kept if f.outcome and f.outcome.items],
            )
            if self._watching:  # every item a fetch listed, when it was not capped
                watches.mark_gone(conn, [
                    (f.source["id"], f.source["source_type"], [item.source_item_id for item in f.outcome.items])
                    for f in kept if f.outcome and f.outcome.items and f.items_seen is None
                ], datetime.now(UTC))
            events = [self._completed_event(f, completions[f.source["id"]], new) for f in kept]
            insert_rows(conn, schema.ingestion_events, events)
            counters.add(conn, counters.fetch_counts(events))  # last: see pipeline/storage/counters.py
        return events

    def _after_polls(self, conn: sa.Connection, batch: list[Fetched], decisions: dict[int, SourceDecision]) -> None:
        """What this batch's good polls say of their sources' subscriptions
        (``websub.after_poll``: items no push brought are missed by push); a source
        still pushed to is polled again at its safety cadence, not its own."""
        good = {f.source["id"]: f for f in batch if decisions[f.source["id"]].failure is None}
        cadences = {i: decisions[i].next_fetch_at - decisions[i].fetched_at for i in good}

        def unpushed(source_id: int) -> int:  # asked of the sources pushed to only
            outcome = good[source_id].outcome
            rows = _store_rows([(source_id, outcome.items if outcome is not None else [])])
            return len(backend_for(conn).unstored(conn, STORE_ITEMS, rows))

        for source_id in websub.after_poll(conn, cadences, unpushed, datetime.now(UTC)):
            d = decisions[source_id]
            safety = websub.safety_poll(d.next_fetch_at - d.fetched_at, self.settings.websub_safety_hours)
            decisions[source_id] = dataclasses.replace(d, next_fetch_at=max(d.next_fetch_at, d.fetched_at + safety))

    def _cap_items(self, conn: sa.Connection, fetched: Fetched) -> None:
        """Keep at most ``max_items_per_fetch`` new or changed items; the rest are left for
        the next fetch, which the validators dropped here make a full one."""
        cap, outcome = self.settings.max_items_per_fetch, fetched.outcome
        if outcome is None or len(outcome.items) <= cap:
            return
        by_id = {item.source_item_id: item for item in outcome.items}
        unstored = backend_for(conn).unstored(conn, STORE_ITEMS, _store_rows([(fetched.source["id"], outcome.items)]))
        fresh = [by_id[row[1]] for row in unstored]
        if len(fresh) <= cap:
            return
        fetched.items_seen, fetched.items_left = len(outcome.items), len(fresh) - cap
        fetched.outcome = dataclasses.replace(outcome, items=fresh[:cap], etag=None, last_modified=None)

    def _defer_group(self, conn: sa.Connection, fetched: Fetched) -> None:
        """A 429, or a 503 with Retry-After, speaks for the whole host: no fetch of the
        source's politeness group starts before the time it asked for (clamped to the
        backoff's cap for that failure)."""
        error = fetched.error
        if error is None or error.retry_after is None:
            return
        if not (error.reason is FailureReason.RATE_LIMITED or error.http_status == 503):
            return
        until = clamp_retry_after(error.reason, error.retry_after, fetched.finished, self.policy)
        if until > fetched.finished:
            group = fetched.source["politeness_group"]
            defer(conn, group, until, f"HTTP {error.http_status} from source {fetched.source['id']}")

    def _decide(self, conn: sa.Connection, fetched: Fetched) -> SourceDecision:
        """The source's new state (pipeline/fetching/decide.py)."""
        source, outcome = fetched.source, fetched.outcome
        if outcome is None:
            assert fetched.error is not None
            return after_failure(
                source, fetched.error, finished=fetched.finished, u=self.random_unit(), policy=self.policy
            )
        moved = outcome.moved_to
        adaptive = None
        if source["adaptive_cadence"]:
            group = source["politeness_group"]
            if group not in self._group_floors:  # once per run: a group's size changes slowly
                self._group_floors[group] = cadence_floor_minutes(conn, group)
            adaptive = Cadence(self.settings.adaptive_min_minutes, self.settings.adaptive_max_minutes,
                               group_floor_minutes=self._group_floors[group], u=self.random_unit())
        decision = after_success(
            source, outcome, finished=fetched.finished, group_by=self.settings.politeness_group_by,
            moved_url_taken=bool(moved and moved != source["url"] and _url_taken(conn, moved)),
            adaptive=adaptive,
        )
        if decision.new_group is not None:
            ensure_groups(conn, [decision.new_group])
        return decision

    def _tell_owners(
        self, conn: sa.Connection, kept: Sequence[Fetched], decisions: Mapping[int, SourceDecision]
    ) -> None:
        """Queue the alerts these fetches give their sources' owners (decide.py
        ``owner_alert``), in the completion's transaction: once per change of health."""
        found = owners.owners_of(conn, [f.source["id"] for f in kept])
        told = []
        for f in kept:
            owner = found.get(f.source["id"])
            if owner is None:
                continue
            alert = owner_alert(f.source, f.error, decisions[f.source["id"]], alerted=owner.alerted,
                                after_failures=self.settings.owner_alert_failures)
            if alert is not None:
                told.append(owners.OwnerAlert(f.source["id"], owner.user_id, alert.event, alert.reason, alert.detail))
        owners.record(conn, told, datetime.now(UTC))

    # -- telemetry ----------------------------------------------------------------------

    def _completed_event(
        self, fetched: Fetched, values: Mapping[str, Any], new: Mapping[int, int]
    ) -> dict[str, Any]:
        source, outcome, error = fetched.source, fetched.outcome, fetched.error
        details: dict[str, Any] = {}
        if error is not None:
            details["error"] = error.message
            if values.get("enabled") is False:
                details["disabled"] = True
        elif outcome is not None and outcome.not_modified:
            details["not_modified"] = True
        if fetched.items_left:
            details["items_left"] = fetched.items_left  # for the next fetch (the item cap)
        return {
            "event": schema.EVENT_COMPLETED,
            "source_id": source["id"],
            "source_type": source["source_type"],
            "run_id": self.run_id,
            "scheduled_at": source["next_fetch_at"],
            "duration_ms": fetched.duration_ms,
            "success": error is None,
            "failure_reason": error.reason.value if error else None,
            "retry_in_minutes": (
                round((values["next_fetch_at"] - fetched.finished).total_seconds() / 60, 3)
                if error else None
            ),
            "http_status": error.http_status if error else outcome.http_status if outcome else None,
            "items_seen": fetched.items_seen or (len(outcome.items) if outcome else 0),
            "items_new": new.get(source["id"], 0),
            "details": details or None,
        }


def _log(event_row: Mapping[str, Any]) -> None:
    """The event as one structured (JSON) log line, beside its ``ingestion_events`` row (not
    even formatted when nothing logs INFO)."""
    if log.isEnabledFor(logging.INFO):
        log.info(json.dumps(dict(event_row), default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))


def _url_taken(conn: sa.Connection, url: str) -> bool:
    t = schema.sources
    return conn.execute(sa.select(t.c.id).where(t.c.url == url)).first() is not None


# -- items ----------------------------------------------------------------------------------

# Each item's newest content hash is kept per (source, item id) in source_items; an item
# new there or whose hash changed gets a raw row, an unchanged one writes nothing. How
# each database does it in a round trip or few is its backend's (pipeline/backends/,
# ``store_changed``): on PostgreSQL one statement for the whole batch.
STORE_ITEMS = StoreChanged(
    hashes=schema.source_items,
    keys=("source_id", "source_item_id"),
    hash="content_hash",
    touched="changed_at",
    rows=schema.listings_raw,
    columns=("source_id", "source_item_id", "content_hash", "url", "raw_json"),
    json="raw_json",
    returning="source_id",
)


def store_items(conn: sa.Connection, batch: Sequence[tuple[int, Sequence[Item]]]) -> dict[int, int]:
    """Insert raw rows for the items that are new or changed; how many, per source id
    (an item listed twice by one source counts once: the last)."""
    stored = backend_for(conn).store_changed(conn, STORE_ITEMS, _store_rows(batch))
    return dict(Counter(stored))


def _store_rows(batch: Sequence[tuple[int, Sequence[Item]]]) -> list[tuple[Any, ...]]:
    """The items as ``STORE_ITEMS``' rows."""
    return [
        (source_id, item.source_item_id, item.content_hash, item.url, JSONValue(item.raw, item.raw_text))
        for source_id, items in batch
        for item in items
    ]

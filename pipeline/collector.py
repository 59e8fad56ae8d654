"""One collector pass: claim due sources, fetch them, store what is new, reschedule them.

Per source: an ``ingestion.started`` event when it is claimed; the fetch with no
transaction and no row lock open; then ONE transaction holding the fenced completion
(next_fetch_at, validators, failure streak), the raw rows of new or changed items and
the ``ingestion.completed`` event, so after a crash all of them exist or none does.
A failing source is rescheduled by pipeline/backoff.py and never fails the pass.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline import schema
from pipeline.adapters import Item, Outcome, adapter_for
from pipeline.backoff import BackoffPolicy, next_fetch_after_success, retry_after_failure
from pipeline.claim import Claim, WorkQueue
from pipeline.db import on_conflict_insert
from pipeline.failures import FailureReason, FetchError
from pipeline.http import Fetcher
from pipeline.settings import Settings

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
            "fetch_latency_p50_ms": self.percentile(50),
            "fetch_latency_p95_ms": self.percentile(95),
        }


@dataclass
class Collector:
    engine: Engine
    settings: Settings
    worker: str
    run_id: str | None = None
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)
    batch_size: int = 32
    per_host: int = 2
    random_unit: Callable[[], float] = random.random

    def run(self, *, max_sources: int | None = None, concurrency: int | None = None) -> CollectStats:
        """Claim due sources until none is due or ``max_sources`` were claimed."""
        stats = CollectStats()
        queue = WorkQueue(self.engine, schema.SOURCES_DUE, lease_seconds=self.settings.lease_seconds)
        threads = concurrency or self.settings.concurrency
        with Fetcher(
            timeout=self.settings.http_timeout_seconds,
            max_bytes=self.settings.max_response_bytes,
            allow_networks=self.settings.allow_networks,
            per_host=self.per_host,
            max_connections=max(threads * 2, 8),
        ) as fetcher, ThreadPoolExecutor(threads, thread_name_prefix="collect") as pool:
            while max_sources is None or stats.claimed < max_sources:
                remaining = None if max_sources is None else max_sources - stats.claimed
                limit = min(self.batch_size, threads * 2, remaining or self.batch_size)
                claim = queue.claim(self.worker, limit)
                if not claim:
                    break
                stats.claimed += len(claim)
                self._record_started(claim)
                one = functools.partial(self._collect_one, queue, claim, fetcher=fetcher)
                for event in pool.map(one, claim.rows):
                    self._tally(stats, event)
        return stats

    # -- one source ---------------------------------------------------------------------

    def _collect_one(
        self, queue: WorkQueue, claim: Claim, source: Mapping[str, Any], *, fetcher: Fetcher
    ) -> dict[str, Any]:
        started = time.monotonic()
        outcome: Outcome | None = None
        error: FetchError | None = None
        try:
            outcome = adapter_for(source["source_type"]).fetch(source, fetcher)
        except FetchError as exc:
            error = exc
        except Exception as exc:  # an adapter bug must not stop the other sources
            log.exception("adapter crashed on source %s", source["id"])
            error = FetchError(FailureReason.PARSE_ERROR, f"unexpected {type(exc).__name__}: {exc}")
        finished = datetime.now(UTC)
        duration_ms = int((time.monotonic() - started) * 1000)
        with self.engine.begin() as conn:
            if outcome is not None:
                event = self._finish_success(conn, queue, claim, source, outcome, finished)
            else:
                assert error is not None
                event = self._finish_failure(conn, queue, claim, source, error, finished)
            event.update(duration_ms=duration_ms)
            if event.pop("lost"):
                return {**event, "lost": True}
            row = self._event_row(source, event)
            conn.execute(sa.insert(schema.ingestion_events).values(row))
        _log(row)  # after the commit: the log never shows an event the database lacks
        return event

    def _finish_success(
        self, conn: sa.Connection, queue: WorkQueue, claim: Claim, source: Mapping[str, Any],
        outcome: Outcome, finished: datetime,
    ) -> dict[str, Any]:
        values: dict[str, Any] = {
            "next_fetch_at": next_fetch_after_success(finished, source["fetch_interval_minutes"]),
            "last_fetched_at": finished,
            "last_success_at": finished,
            "consecutive_failures": 0,
            "last_failure_reason": None,
            "etag": outcome.etag,
            "last_modified": outcome.last_modified,
        }
        if outcome.moved_to and outcome.moved_to != source["url"] and not self._url_taken(conn, outcome.moved_to):
            values["url"] = outcome.moved_to  # a permanent redirect updates the stored URL
        fenced = queue.complete(claim, values, ids=[source["id"]], conn=conn)
        items_new = 0 if fenced.lost else self._store_items(conn, source["id"], outcome.items)
        return {
            "lost": bool(fenced.lost), "success": True, "failure_reason": None,
            "retry_in_minutes": None, "http_status": outcome.http_status,
            "items_seen": len(outcome.items), "items_new": items_new,
            "not_modified": outcome.not_modified,
        }

    def _finish_failure(
        self, conn: sa.Connection, queue: WorkQueue, claim: Claim, source: Mapping[str, Any],
        error: FetchError, finished: datetime,
    ) -> dict[str, Any]:
        failures = source["consecutive_failures"] + 1
        retry = retry_after_failure(
            error.reason, failures, now=finished, u=self.random_unit(),
            retry_after=error.retry_after, policy=self.policy,
        )
        values: dict[str, Any] = {
            "next_fetch_at": retry.at,
            "last_fetched_at": finished,
            "consecutive_failures": failures,
            "last_failure_reason": error.reason.value,
        }
        if retry.disable:
            values.update(
                enabled=False,
                disabled_reason=f"{error.reason.value} {failures} times in a row; last: {error.message}",
            )
        fenced = queue.complete(claim, values, ids=[source["id"]], conn=conn)
        return {
            "lost": bool(fenced.lost), "success": False, "failure_reason": error.reason.value,
            "retry_in_minutes": round(retry.minutes_after(finished), 3),
            "http_status": error.http_status, "items_seen": 0, "items_new": 0,
            "error": error.message, "disabled": retry.disable,
        }

    @staticmethod
    def _url_taken(conn: sa.Connection, url: str) -> bool:
        t = schema.sources
        return conn.execute(sa.select(t.c.id).where(t.c.url == url)).first() is not None

    # -- items --------------------------------------------------------------------------

    def _store_items(self, conn: sa.Connection, source_id: int, items: Sequence[Item]) -> int:
        """Insert raw rows for the items that are new or changed; return how many."""
        unique = list({item.source_item_id: item for item in items}.values())
        if not unique:
            return 0
        changed = _changed_item_ids(conn, source_id, unique)
        rows = [
            {
                "source_id": source_id,
                "source_item_id": item.source_item_id,
                "url": item.url,
                "raw_json": item.raw,
                "content_hash": item.content_hash,
            }
            for item in unique
            if item.source_item_id in changed
        ]
        if rows:
            conn.execute(sa.insert(schema.listings_raw), rows)
        return len(rows)

    # -- telemetry ----------------------------------------------------------------------

    def _record_started(self, claim: Claim) -> None:
        rows = [
            {
                "event": "ingestion.started",
                "source_id": source["id"],
                "source_type": source["source_type"],
                "run_id": self.run_id,
                "scheduled_at": source["next_fetch_at"],
            }
            for source in claim.rows
        ]
        with self.engine.begin() as conn:
            conn.execute(sa.insert(schema.ingestion_events), rows)
        for row in rows:
            _log(row)

    def _event_row(self, source: Mapping[str, Any], event: Mapping[str, Any]) -> dict[str, Any]:
        details = {k: event[k] for k in ("error", "disabled", "not_modified") if event.get(k) is not None}
        return {
            "event": "ingestion.completed",
            "source_id": source["id"],
            "source_type": source["source_type"],
            "run_id": self.run_id,
            "scheduled_at": source["next_fetch_at"],
            "duration_ms": event["duration_ms"],
            "success": event["success"],
            "failure_reason": event["failure_reason"],
            "retry_in_minutes": event["retry_in_minutes"],
            "http_status": event["http_status"],
            "items_seen": event["items_seen"],
            "items_new": event["items_new"],
            "details": details or None,
        }

    @staticmethod
    def _tally(stats: CollectStats, event: Mapping[str, Any]) -> None:
        if event.get("lost"):
            stats.fenced_out += 1
            return
        stats.latencies_ms.append(event["duration_ms"])
        if event["success"]:
            stats.succeeded += 1
            stats.not_modified += bool(event.get("not_modified"))
            stats.items_seen += event["items_seen"]
            stats.items_new += event["items_new"]
        else:
            stats.failed[event["failure_reason"]] += 1


def _log(event_row: Mapping[str, Any]) -> None:
    """The event as one structured (JSON) log line, as DESIGN.md "Telemetry" asks."""
    log.info(json.dumps(dict(event_row), default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v)))


def _changed_item_ids(conn: sa.Connection, source_id: int, items: Sequence[Item]) -> set[str]:
    """Record each item's newest hash in source_items; return the ids that are new or changed.

    One upsert: a row whose hash is unchanged is neither updated nor returned.
    """
    t = schema.source_items
    rows: list[dict[str, Any]] = [
        {"source_id": source_id, "source_item_id": i.source_item_id, "content_hash": i.content_hash}
        for i in items
    ]
    base = on_conflict_insert(conn, t)
    if base is not None:
        changed: set[str] = set()
        for start in range(0, len(rows), 1000):  # well under SQLite's bound-variable limit
            insert = base.values(rows[start : start + 1000])  # a new statement each chunk
            stmt = insert.on_conflict_do_update(
                index_elements=[t.c.source_id, t.c.source_item_id],
                set_={
                    "content_hash": insert.excluded.content_hash,
                    "changed_at": sa.func.current_timestamp(),
                },
                where=t.c.content_hash != insert.excluded.content_hash,
            ).returning(t.c.source_item_id)
            changed.update(conn.execute(stmt).scalars())
        return changed
    known = dict(
        conn.execute(
            sa.select(t.c.source_item_id, t.c.content_hash).where(t.c.source_id == source_id)
        ).tuples()
    )
    # Any other dialect: compare, then write one row at a time (correct, slower).
    fresh = {r["source_item_id"] for r in rows if known.get(r["source_item_id"]) != r["content_hash"]}
    for r in rows:
        if r["source_item_id"] in fresh:
            if r["source_item_id"] in known:
                conn.execute(
                    sa.update(t)
                    .where(t.c.source_id == source_id, t.c.source_item_id == r["source_item_id"])
                    .values(content_hash=r["content_hash"])
                )
            else:
                conn.execute(sa.insert(t).values(r))
    return fresh

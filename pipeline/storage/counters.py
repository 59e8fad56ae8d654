"""Counters of the work done, kept in the database (``metric_counts``), so the work of
every worker on every machine is counted in one place, exactly once, and every replica
of ``pipeline metrics serve`` reads the same totals (pipeline/storage/metrics.py).

A stage adds its counts in the transaction that does the work, as that transaction's
last statement and only once (``add``): a batch that rolls back counts nothing, a row fenced out by
another worker is not counted, and a retention purge, which deletes old telemetry, takes
nothing away, so a counter never falls. Each add goes to one of ``SHARDS`` rows per
series, picked at random, so two workers committing at once seldom wait on one row;
the rows of one add are written by one statement in key order, and no transaction
takes another lock after it, so two adds never wait on each other in a circle. On
MariaDB an add also never inserts a row: InnoDB deadlocks two transactions waiting on a
third's new row when the third rolls back, so the rows an add finds missing are created
(as 0) in a transaction of their own first (pipeline/backends/mariadb.py ``add_to``).
A scrape sums the shards: at most (series x SHARDS) rows, however much work was counted.

A histogram is counters too: one per bucket (not cumulative: the scrape cumulates), its
sum and its count.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.backends.portable import Bind
from pipeline.core.failures import FailureReason
from pipeline.storage import schema

SHARDS = 16

# (series name, label value) -> amount; a series without a label has the label "".
Counts = defaultdict[tuple[str, str], float]


def tally() -> Counts:
    """Empty counts, to add to."""
    return defaultdict(float)


def _le(bound: float) -> str:
    """A bucket's ``le`` label as the exposition shows it."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


@dataclass(frozen=True)
class Counter:
    name: str  # as exposed, ending in _total
    help: str
    label: str | None = None  # the one label's name, if it has one
    known: tuple[str, ...] = ()  # label values exposed (as 0) before any is counted

    def count(self, counts: Counts, amount: float = 1, value: str = "") -> None:
        counts[(self.name, value)] += amount


@dataclass(frozen=True)
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]  # upper bounds, ascending; +Inf is implied

    def observe(self, counts: Counts, value: float) -> None:
        bound = next((b for b in self.buckets if value <= b), float("inf"))
        counts[(self.bucket_series, _le(bound))] += 1
        counts[(self.sum_series, "")] += value

    @property
    def bucket_series(self) -> str:
        return f"{self.name}_bucket"

    @property
    def sum_series(self) -> str:
        return f"{self.name}_sum"

    def cumulative(self, totals: Mapping[tuple[str, str], float]) -> tuple[list[tuple[str, float]], float]:
        """The exposition's buckets (cumulative, ending with +Inf) and sum."""
        running, buckets = 0.0, []
        for bound in (*self.buckets, float("inf")):
            le = _le(bound)
            running += totals.get((self.bucket_series, le), 0.0)
            buckets.append((le, running))
        return buckets, totals.get((self.sum_series, ""), 0.0)


# -- what is counted ------------------------------------------------------------------------
# The collector (pipeline/fetching/collector.py, and the claim in politeness.py)

SOURCES_CLAIMED = Counter("pipeline_sources_claimed_total", "Sources handed out for a fetch.")
FETCH_RESULTS = ("new_items", "no_new_items", "not_modified", "failed")
SOURCES_FETCHED = Counter(
    "pipeline_sources_fetched_total",
    "Fetches recorded, by result: new or changed items stored, none, an HTTP 304, or a failure.",
    label="result", known=FETCH_RESULTS,
)
SOURCES_FETCH_ERRORS = Counter(
    "pipeline_sources_fetch_errors_total", "Failed fetches, by failure code.",
    label="reason", known=tuple(FailureReason),
)
FETCH_DURATION = Histogram(
    "pipeline_sources_fetch_duration_seconds", "How long fetches took, request to parsed result.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
ITEMS_STORED = Counter("pipeline_items_stored_total", "Items new or changed, stored as raw rows.")

# The processor (pipeline/listings/processor.py)
ROW_OUTCOMES = ("inserted", "updated", "unchanged", "retrying", "gave_up")
RAW_ROWS_PROCESSED = Counter(
    "pipeline_raw_rows_processed_total",
    "Raw rows the processor finished with, by outcome: a new listing, a changed one, no change,"
    " failed (to be retried), or given up.",
    label="outcome", known=ROW_OUTCOMES,
)

# The notifier (pipeline/notify/notifier.py)
LISTINGS_MATCHED = Counter("pipeline_listings_matched_total", "Listings matched against the filters.")
NOTIFICATIONS_CREATED = Counter("pipeline_notifications_created_total", "Notifications created by matches.")
NOTIFICATIONS_BATCHED = Counter(
    "pipeline_notifications_batched_total",
    "Alerts past their user's limit in a window (PIPELINE_ALERT_LIMIT per PIPELINE_ALERT_WINDOW_MINUTES),"
    " held to go out as one summary delivery at the window's end; and change alerts held a window.",
)
FILTER_FAILURES = Counter(
    "pipeline_filter_failures_total",
    "Filters left out of a matching pass because they failed: their query did not compile"
    " (at load) or matching them raised (at match); the other filters were matched.",
    label="stage", known=("load", "match"),
)
DELIVERY_OUTCOMES = ("sent", "retrying", "dead")
DELIVERIES = Counter(
    "pipeline_notification_deliveries_total",
    "Delivery attempts recorded, by outcome: sent, failed (to be retried), or dead.",
    label="outcome", known=DELIVERY_OUTCOMES,
)
DELIVERY_LATENCY = Histogram(
    "pipeline_notification_delivery_latency_seconds",
    "From a notification's creation (its listing matched) to its delivery, retries included.",
    buckets=(1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0),
)

# WebSub pushes (pipeline/fetching/push.py, pipeline/web/app.py, pipeline/web/after_push.py)
PUSH_TO_DELIVERY = Histogram(
    "pipeline_websub_push_to_delivery_seconds",
    "From a WebSub push being taken to the delivery of each alert it caused (the alerts sent by the"
    " round `pipeline serve` runs after the push).",
    buckets=(0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
PUSH_OUTCOMES = ("taken", "repeated", "bad_signature", "no_subscription", "too_large", "not_a_feed", "rate_limited")
WEBSUB_PUSHES = Counter(
    "pipeline_websub_pushes_total",
    "Pushes from WebSub hubs, by outcome: taken, or refused (a repeat of one taken, or a bad or missing"
    " signature, acknowledged and dropped; no such subscription, or its source disabled; over PIPELINE_MAX_RESPONSE_BYTES;"
    " not a feed; over PIPELINE_WEBSUB_PUSHES_PER_MINUTE).",
    label="outcome", known=PUSH_OUTCOMES,
)
VERIFICATION_OUTCOMES = ("subscribed", "unsubscribed", "denied", "refused")
WEBSUB_VERIFICATIONS = Counter(
    "pipeline_websub_verifications_total",
    "Hubs' verifications of intent at the callback, by outcome: a subscription or an ending we asked"
    " for, confirmed; a hub's denial, recorded; or refused (404: no such callback, another topic, a"
    " mode we did not ask for).",
    label="outcome", known=VERIFICATION_OUTCOMES,
)
HUB_REQUEST_OUTCOMES = ("subscribe", "unsubscribe", "failed")
WEBSUB_HUB_REQUESTS = Counter(
    "pipeline_websub_hub_requests_total",
    "Requests sent to WebSub hubs, by outcome: a subscription (or renewal) or an unsubscription the"
    " hub took, or failed (the hub answered an error, redirected, or could not be reached; asked"
    " again later).",
    label="outcome", known=HUB_REQUEST_OUTCOMES,
)

WEBSUB_MISSED_ITEMS = Counter(
    "pipeline_websub_missed_items_total",
    "Items a poll of a pushed source found that its hub never pushed (the hub forgot the subscription,"
    " or stopped pushing): each time, the hub is asked again and the source polled at its own cadence"
    " until a push comes back.",
)

COUNTERS = (SOURCES_CLAIMED, SOURCES_FETCHED, SOURCES_FETCH_ERRORS, ITEMS_STORED, RAW_ROWS_PROCESSED,
            LISTINGS_MATCHED, NOTIFICATIONS_CREATED, NOTIFICATIONS_BATCHED, FILTER_FAILURES, DELIVERIES,
            WEBSUB_PUSHES, WEBSUB_VERIFICATIONS, WEBSUB_HUB_REQUESTS, WEBSUB_MISSED_ITEMS)
HISTOGRAMS = (FETCH_DURATION, DELIVERY_LATENCY, PUSH_TO_DELIVERY)


def fetch_counts(events: Iterable[Mapping[str, object]]) -> Counts:
    """The counts of the ``ingestion.completed`` events of a batch, as the collector
    writes them (pipeline/fetching/collector.py ``_completed_event``)."""
    counts = tally()
    for event in events:
        details = event.get("details") or {}
        if not event["success"]:
            result = "failed"
            SOURCES_FETCH_ERRORS.count(counts, value=str(event["failure_reason"]))
        elif isinstance(details, dict) and details.get("not_modified"):
            result = "not_modified"
        else:
            result = "new_items" if event["items_new"] else "no_new_items"
        SOURCES_FETCHED.count(counts, value=result)
        ITEMS_STORED.count(counts, float(event["items_new"] or 0))  # type: ignore[arg-type]
        FETCH_DURATION.observe(counts, float(event["duration_ms"] or 0) / 1000)  # type: ignore[arg-type]
    return counts


# -- writing and reading --------------------------------------------------------------------


def add(conn: sa.Connection, counts: Mapping[tuple[str, str], float]) -> None:
    """Add ``counts`` to the totals, in ``conn``'s transaction: call it last in the
    transaction that did the work (see the module's docstring)."""
    shard = random.randrange(SHARDS)
    rows = [{"name": name, "label": label, "shard": shard, "value": float(value)}
            for (name, label), value in sorted(counts.items()) if value]
    if not rows:
        return
    # In key order, as the module's docstring requires; one statement on PostgreSQL.
    backend_for(conn).add_to(conn, schema.metric_counts, ("name", "label", "shard"), "value", rows)


def count_rows_of(bind: Bind, select: sa.Select[Any], counter: Counter) -> sa.Insert:
    """An INSERT adding the count of ``select``'s rows to ``counter``, to run as a CTE of
    the statement that does the work (PostgreSQL's polite claim: its ``taken``); a random
    shard."""
    counted = sa.select(
        sa.literal(counter.name), sa.literal(""),
        sa.cast(sa.func.floor(sa.func.random() * SHARDS), sa.SmallInteger()),
        sa.cast(sa.func.count(), sa.Float()),
    ).select_from(select.subquery()).having(sa.func.count() > 0)
    return backend_for(bind).adding_from(
        schema.metric_counts, ("name", "label", "shard"), "value", ("name", "label", "shard", "value"), counted)


def totals(conn: sa.Connection, names: Iterable[str] | None = None) -> dict[tuple[str, str], float]:
    """Every series' total (its shards summed)."""
    t = schema.metric_counts
    query = sa.select(t.c.name, t.c.label, sa.func.sum(t.c.value)).group_by(t.c.name, t.c.label)
    if names is not None:
        query = query.where(t.c.name.in_(list(names)))
    return {(name, label): float(value) for name, label, value in conn.execute(query)}

"""The pipeline's state as Prometheus metrics, computed from the database at each scrape,
so every worker on every machine is seen alike and any replica of the endpoint agrees
(`pipeline metrics` prints them once; `pipeline metrics serve` answers scrapes).

Gauges, each from one cheap query (the queues' partial indexes, the telemetry's
``occurred_at`` index):

* ``pipeline_queue_backlog{queue}``: rows claimable now (ready, never leased or lease
  run out); ``pipeline_queue_oldest_age_seconds{queue}``: how long the oldest of them
  has waited since it became due; ``pipeline_queue_in_flight{queue}``: claims whose
  lease runs; ``pipeline_queue_expired_leases{queue}``: claims whose lease ran out.
* ``pipeline_fetch_lateness_seconds{quantile}``: p50 and p95 of how late fetches
  started after their due time over the last hour, ``pipeline_fetch_lateness_fetches``
  the fetches counted.
* ``pipeline_sources{state}``, ``pipeline_sources_failing{reason}``,
  ``pipeline_notifications{status}`` (unsent ones), ``pipeline_websub_subscriptions{health}``.
* ``pipeline_worker_last_run_timestamp_seconds{worker}``: when each stage last ran a pass,
  and each stage's sensor last looked (``sensor:STAGE``): the Dagster daemon's sign of life.

Counters and histograms of the work done (fetches, raw rows, matches, deliveries), as
the transactions that did it added them (pipeline/storage/counters.py, which names and
describes each).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy.engine import Engine

from pipeline.storage import counters, health, schema
from pipeline.storage.status import UNSENT, queue_status, waited_since

LATENESS_SPAN = timedelta(hours=1)


class DatabaseCollector(Collector):
    """Reads the database at each ``collect`` (each scrape)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "backlog": GaugeMetricFamily("pipeline_queue_backlog", "Rows of the queue claimable now.",
                                         labels=["queue"]),
            "oldest": GaugeMetricFamily("pipeline_queue_oldest_age_seconds",
                                        "How long the queue's oldest claimable row has waited since it became due.",
                                        labels=["queue"]),
            "in_flight": GaugeMetricFamily("pipeline_queue_in_flight", "Claims whose lease still runs.",
                                           labels=["queue"]),
            "expired": GaugeMetricFamily("pipeline_queue_expired_leases",
                                         "Claims whose lease ran out (claimable again).", labels=["queue"]),
        }
        s, n = schema.sources, schema.notifications
        with self.engine.connect() as conn:
            at = conn.execute(sa.select(schema.now_sql(conn))).scalar_one()  # ages by the database's clock
            for spec in schema.QUEUES:
                queue = f"{spec.table.name}.{spec.name}"
                found = queue_status(conn, spec)
                gauges["backlog"].add_metric([queue], found.waiting)
                gauges["oldest"].add_metric([queue], waited_since(found.oldest_waiting, at))
                gauges["in_flight"].add_metric([queue], found.in_flight)
                gauges["expired"].add_metric([queue], found.expired_leases)
            late = health.lateness(conn, LATENESS_SPAN)
            failing = health.failing_sources(conn)
            failing_filters = health.failing_filters(conn)
            by_state = {bool(state): int(count) for state, count in conn.execute(
                sa.select(s.c.enabled, sa.func.count()).group_by(s.c.enabled))}
            unsent = {str(status): int(count) for status, count in conn.execute(
                sa.select(n.c.status, sa.func.count()).where(n.c.status.in_(UNSENT)).group_by(n.c.status))}
            pushes = health.push_health_counts(conn, datetime.now(UTC))
            totals = counters.totals(conn)
            workers = conn.execute(sa.select(schema.worker_state.c.worker_name, schema.worker_state.c.last_run_at)
                                   .where(schema.worker_state.c.last_run_at.is_not(None))).all()
        yield from gauges.values()
        lateness = GaugeMetricFamily("pipeline_fetch_lateness_seconds",
                                     "How late fetches started after their due time, over the last hour.",
                                     labels=["quantile"])
        for quantile, value in (("0.5", late.p50_seconds), ("0.95", late.p95_seconds)):
            lateness.add_metric([quantile], 0.0 if value is None else value)
        yield lateness
        yield GaugeMetricFamily("pipeline_fetch_lateness_fetches", "Fetches counted in the lateness quantiles.",
                                value=late.fetches)
        sources = GaugeMetricFamily("pipeline_sources", "Sources by state.", labels=["state"])
        for state, enabled in (("enabled", True), ("disabled", False)):
            sources.add_metric([state], by_state.get(enabled, 0))
        yield sources
        failing_family = GaugeMetricFamily("pipeline_sources_failing",
                                           "Enabled sources whose last fetch failed, by failure code.",
                                           labels=["reason"])
        for reason, count in sorted(failing.failing.items()):
            failing_family.add_metric([reason], count)
        yield failing_family
        yield GaugeMetricFamily("pipeline_filters_failing",
                                "Enabled filters left out of matching within the last day: their query did"
                                " not compile or matching them raised (`pipeline filters list` shows why).",
                                value=failing_filters)
        notifications = GaugeMetricFamily("pipeline_notifications", "Notifications not sent, by status.",
                                          labels=["status"])
        for status in UNSENT:
            notifications.add_metric([str(status)], unsent.get(status, 0))
        yield notifications
        subscriptions = GaugeMetricFamily(
            "pipeline_websub_subscriptions",
            "WebSub subscriptions by health: pushed, requested, ending; in trouble: missed (a poll found items"
            " its hub never pushed, no push since), expired, unverified (not verified within the hour), denied.",
            labels=["health"])
        for name, count in pushes.items():
            subscriptions.add_metric([name], count)
        yield subscriptions
        last_run = GaugeMetricFamily(
            "pipeline_worker_last_run_timestamp_seconds",
            "When each stage last ran a pass, and each stage's sensor last looked for work (sensor:STAGE, at most"
            " a minute apart while the Dagster daemon runs).", labels=["worker"])
        for name, when in workers:
            last_run.add_metric([name], when.timestamp())
        yield last_run
        yield from _counters(totals)


def _counters(totals: dict[tuple[str, str], float]) -> Iterator[Metric]:
    for counter in counters.COUNTERS:
        if counter.label is None:
            yield CounterMetricFamily(counter.name, counter.help, value=totals.get((counter.name, ""), 0.0))
            continue
        family = CounterMetricFamily(counter.name, counter.help, labels=[counter.label])
        seen = {label for name, label in totals if name == counter.name}
        for value in sorted(seen | set(counter.known)):
            family.add_metric([value], totals.get((counter.name, value), 0.0))
        yield family
    for histogram in counters.HISTOGRAMS:
        buckets, total = histogram.cumulative(totals)
        spread = HistogramMetricFamily(histogram.name, histogram.help)
        spread.add_metric([], buckets, sum_value=total)
        yield spread


def registry(engine: Engine) -> CollectorRegistry:
    """A registry holding only the database's metrics (no process metrics of the
    endpoint itself: they would differ between replicas)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(DatabaseCollector(engine))
    return found

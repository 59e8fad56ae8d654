"""Asset checks: is work being taken, is the raw backlog fresh, are sources failing, are
notifications dying. Each reads pipeline/storage/health.py, one cheap query per question.

Thresholds are environment variables (minutes): PIPELINE_STALE_LEASE_MINUTES (10),
PIPELINE_FRESHNESS_MAX_MINUTES (60), PIPELINE_LATENESS_MAX_MINUTES (15).
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import html
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from assets.policies import by_code
from pipeline.core.failures import FailureReason
from pipeline.core.kinds import PUSH_TROUBLE
from pipeline.queue.spec import QueueSpec
from pipeline.storage import health, politeness_groups, schema
from pipeline.storage.status import waited_seconds
from resources import PipelineDatabase


def _stale_lease_check(asset: str, queues: tuple[QueueSpec, ...], stage: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=asset, name="expired_leases_reclaimed", blocking=False,
        description=f"No {stage} work sits with a lease that ran out long ago "
        "(PIPELINE_STALE_LEASE_MINUTES): such work means no worker of the stage is running.",
    )
    def check(database: PipelineDatabase) -> dg.AssetCheckResult:
        minutes = database.settings().stale_lease_minutes
        with database.engine.connect() as conn:
            counts = health.stale_leases(conn, queues, timedelta(minutes=minutes))
        stale = sum(counts.values())
        return dg.AssetCheckResult(
            passed=stale == 0,
            severity=dg.AssetCheckSeverity.ERROR,
            description=f"{stale} rows whose lease expired over {minutes} minutes ago" if stale else None,
            metadata={**counts, "older_than_minutes": minutes},
        )

    return check


def _freshness(asset: str, stage: str) -> dg.AssetChecksDefinition:
    queues = FRESHNESS_QUEUES[asset]

    @dg.asset_check(
        asset=asset, name="freshness", blocking=False,
        description=f"The {stage}'s oldest waiting work ({', '.join(queues)}) has waited at most "
        "PIPELINE_FRESHNESS_MAX_MINUTES since it became due: the asset reflects its inputs. "
        "An idle stage with nothing waiting is fresh, whenever it last materialised. The stage's "
        "sensor records this check too, when its verdict changes (and every 10 minutes): a stage "
        "whose runs stopped taking work is told though it materialises nothing.",
    )
    def freshness(database: PipelineDatabase) -> dg.AssetCheckResult:
        with database.engine.connect() as conn:
            waited = {name: waited_seconds(conn, spec) for name, spec in queues.items()}
        return dg.AssetCheckResult(**freshness_verdict(waited, database.settings().freshness_max_minutes))

    return freshness


# Each asset's waiting work that its freshness check judges: the queues its stage takes.
FRESHNESS_QUEUES: dict[str, dict[str, QueueSpec]] = {
    "listings_raw": {"due_sources": schema.SOURCES_DUE},
    "listings": {"unprocessed_rows": schema.RAW_UNPROCESSED},
    "notifications": {"unmatched_listings": schema.LISTINGS_UNMATCHED, "due_notifications": schema.NOTIFICATIONS_DUE,
                      "due_source_alerts": schema.SOURCE_ALERTS_DUE},
}


def freshness_verdict(waited: Mapping[str, float], limit: int) -> dict[str, Any]:
    """The freshness check's result (passed, severity, description, metadata) from how
    long each queue's oldest waiting row has waited, in seconds: the check's own, and
    what a stage sensor records as the check's evaluation between materialisations."""
    minutes = {name: round(seconds / 60, 1) for name, seconds in waited.items()}
    oldest = max(minutes.values())
    return {"passed": oldest <= limit, "severity": dg.AssetCheckSeverity.WARN,
            "description": f"oldest waiting work: {oldest:.0f} min (limit {limit})",
            "metadata": {**{f"{name}_oldest_minutes": m for name, m in minutes.items()}, "limit_minutes": limit}}


def _none_counted(
    asset: str, name: str, what: str, count: Callable[[sa.Connection], int], description: str
) -> dg.AssetChecksDefinition:
    """A check that warns while ``count`` finds any ``what`` (given-up raw rows, dead
    notifications): work the pipeline ended without doing, which needs a person."""
    @dg.asset_check(asset=asset, name=name, blocking=False, description=description)
    def check(database: PipelineDatabase) -> dg.AssetCheckResult:
        with database.engine.connect() as conn:
            found = count(conn)
        return dg.AssetCheckResult(
            passed=found == 0, severity=dg.AssetCheckSeverity.WARN,
            description=f"{found} {what}" if found else None, metadata={what.replace(" ", "_"): found},
        )

    return check


def _failing_sources() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="listings_raw", name="failing_sources", blocking=False,
        description="No enabled source's last fetch failed, and none was disabled by its "
        "failures: what `pipeline status` counts (`pipeline sources list` shows which, "
        "docs/runbook.md what to do). A source disabled by an operator is not counted.",
    )
    def failing_sources(database: PipelineDatabase) -> dg.AssetCheckResult:
        with database.engine.connect() as conn:
            found = health.failing_sources(conn)
            which = health.which_sources_fail(conn, SHOWN_FAILING)
        total = sum(found.failing.values())
        return dg.AssetCheckResult(
            passed=total == 0 and found.disabled_by_failures == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{total} sources failing, {found.disabled_by_failures} disabled by failures",
            metadata={**by_code("failing_", found.failing, (reason.value for reason in FailureReason)),
                      "failing": total, "disabled_by_failures": found.disabled_by_failures,
                      "which": dg.MetadataValue.md(failing_table(which))},
        )

    return failing_sources


SHOWN_FAILING = 20  # the failing sources the check's table lists, the longest failing first


_MARKDOWN = re.compile(r"([\\`*_\[\]|])")


def _cell(text: object) -> str:
    """``text`` as one cell of a Markdown table, shown as it is: one line, 200 characters
    of it, Markdown's own characters escaped (``|`` broke the column) and ``<``, ``>``,
    ``&`` written as entities (the UI took ``<unknown>`` in an error for an HTML tag and
    showed nothing of it)."""
    return _MARKDOWN.sub(r"\\\1", html.escape(" ".join(str(text).split())[:200], quote=False))


def _table(columns: list[str], rows: Iterable[list[object]]) -> str:
    """A Markdown table of ``columns`` and ``rows`` (their cells written as they are)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def failing_table(which: list[health.FailingSource]) -> str:
    """The failing sources as a Markdown table: which, since when, why."""
    if not which:
        return "No source is failing."

    return _table(["id", "source", "failing since", "failures", "code", "last error"], [
        [s.id, _cell(s.name), f"{s.since:%Y-%m-%d %H:%M} UTC" if s.since else "never fetched well",
         f"{s.failures} (disabled)" if s.disabled else s.failures, s.reason or "", _cell(s.error or "")]
        for s in which])


def _schedule_adherence() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="listings_raw", name="schedule_adherence", blocking=False,
        description="Fetches start on time: over the last hour, the 95th percentile of how late a "
        "fetch started after its source's next_fetch_at is at most PIPELINE_LATENESS_MAX_MINUTES "
        "(`pipeline status` shows p50 and p95 per hour). An hour without fetches passes. When late, it "
        "names the politeness groups whose sources ask for more fetches than their spacing allows "
        "(`pipeline politeness list`), or says there are none: then the collectors are behind.",
    )
    def schedule_adherence(database: PipelineDatabase) -> dg.AssetCheckResult:
        limit = database.settings().lateness_max_minutes
        with database.engine.connect() as conn:
            found = health.lateness(conn, timedelta(hours=1))
            p50, p95 = (None if s is None else round(s / 60, 2) for s in (found.p50_seconds, found.p95_seconds))
            passed = p95 is None or p95 <= limit
            # Late: is it the collectors, or groups that cannot start their sources' fetches
            # in time however many collectors run? (Read only then: it reads every source.)
            crowded = [] if passed else [g for g in politeness_groups.list_groups(conn) if g["over_capacity"]]
        metadata: dict[str, Any] = {
            "fetches": found.fetches, "lateness_p50_minutes": p50 if p50 is not None else 0.0,
            "lateness_p95_minutes": p95 if p95 is not None else 0.0, "limit_minutes": limit,
        }
        said = [f"fetches started late by {p50} min (p50), {p95} min (p95); limit {limit}"]
        if not passed:
            metadata["groups_over_capacity"] = len(crowded)
            if crowded:
                said.append(f"politeness groups asking for more fetches than their spacing allows: {len(crowded)}"
                            " (over_capacity)")
                metadata["over_capacity"] = dg.MetadataValue.md(crowded_table(crowded))
            else:
                said.append("no politeness group asks for more fetches than its spacing allows: the collectors"
                            " are behind, or a group's fetches in flight hold it")
        description = None if p95 is None else "; ".join(said)
        return dg.AssetCheckResult(passed=passed, severity=dg.AssetCheckSeverity.WARN, description=description,
                                   metadata=metadata)

    return schedule_adherence


def _failing_channels() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="notifications", name="failing_channels", blocking=False,
        description="No user's channel keeps failing: none is gone (its receiver answered 410 Gone: its"
        " notifications are held until the channel is set again), and none of their notifications waits to"
        " be tried again after failing twice or more in a row (a receiver down or refusing; dead ones are"
        " dead_notifications). Their notifications are retried with backoff meanwhile"
        " (`pipeline notifications list --user U --status failed` says why).",
    )
    def failing_channels(database: PipelineDatabase) -> dg.AssetCheckResult:
        with database.engine.connect() as conn:
            which = health.failing_channels(conn)
        retrying = sum(c.retrying for c in which)
        gone = sum(c.gone_since is not None for c in which)
        return dg.AssetCheckResult(
            passed=not which, severity=dg.AssetCheckSeverity.WARN,
            description=(f"{len(which)} users' channels failing: {retrying} notifications retrying after"
                         f" {health.CHANNEL_FAILED_ATTEMPTS} or more failed attempts"
                         + (f"; {gone} channels gone (410), their notifications held until the channel is set"
                            " again (`pipeline users channel`)" if gone else "")) if which else None,
            metadata={"channels_failing": len(which), "notifications_retrying": retrying, "channels_gone": gone,
                      **({"which": dg.MetadataValue.md(channels_table(which))} if which else {})},
        )

    return failing_channels


def channels_table(which: list[health.FailingChannel]) -> str:
    """The users whose channel keeps failing, as a Markdown table."""
    return _table(["user", "notifications retrying", "gone since", "last error"],
                  [[_cell(c.user), c.retrying, f"{c.gone_since:%Y-%m-%d %H:%M} UTC" if c.gone_since else "",
                    _cell(c.error or "")] for c in which])


def _push_health() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="listings_raw", name="push_health", blocking=False,
        description="Every WebSub subscription can be trusted: none whose safety poll found items its hub"
        " never pushed with no push since (polled at its cadence and asked again meanwhile), expired,"
        " not verified within the hour, or denied (`pipeline sources show ID` says which; docs/runbook.md,"
        " Push). Sources without a hub pass.",
    )
    def push_health(database: PipelineDatabase) -> dg.AssetCheckResult:
        now = datetime.now(UTC)
        with database.engine.connect() as conn:
            counts = health.push_health_counts(conn, now)
            trouble = sum(counts[str(h)] for h in PUSH_TROUBLE)
            which = health.push_trouble(conn, now) if trouble else []
        return dg.AssetCheckResult(
            passed=trouble == 0, severity=dg.AssetCheckSeverity.WARN,
            description=(f"{trouble} subscriptions in trouble: " + ", ".join(
                f"{counts[str(h)]} {h}" for h in PUSH_TROUBLE if counts[str(h)])) if trouble else None,
            metadata={**{f"push_{name}": n for name, n in counts.items()},
                      **({"which": dg.MetadataValue.md(push_table(which))} if which else {})},
        )

    return push_health


def push_table(which: list[health.PushTrouble]) -> str:
    """The subscriptions in trouble as a Markdown table."""
    return _table(["source", "health", "items no push brought", "last push", "hub", "last error"], [
        [f"{p.source_id} {_cell(p.name or '')}" if p.source_id is not None else "(removed)", p.health, p.missed,
         f"{p.last_push_at:%Y-%m-%d %H:%M} UTC" if p.last_push_at else "never", _cell(p.hub), _cell(p.last_error or "")]
        for p in which])


SHOWN_CROWDED = 20  # the groups over capacity the check's table lists, the most crowded first


def crowded_table(groups: list[dict[str, Any]]) -> str:
    """The politeness groups over capacity (each has spacing: ``allows_per_minute``) as a
    Markdown table, most crowded first."""
    crowded = sorted(groups, key=lambda g: g["asks_per_minute"] / g["allows_per_minute"], reverse=True)
    return _table(["group", "sources", "fetches a minute asked", "its spacing allows"],
                  [[g["name"], g["sources"], f"{g['asks_per_minute']:.3g}", f"{g['allows_per_minute']:.3g}"]
                   for g in crowded[:SHOWN_CROWDED]])


ASSET_CHECKS = [
    _stale_lease_check("listings_raw", (schema.SOURCES_DUE,), "collector"),
    _stale_lease_check("listings", (schema.RAW_UNPROCESSED,), "processor"),
    _stale_lease_check("notifications", (schema.LISTINGS_UNMATCHED, schema.NOTIFICATIONS_DUE,
                                         schema.SOURCE_ALERTS_DUE), "notifier"),
    _freshness("listings_raw", "collector"),
    _freshness("listings", "processor"),
    _freshness("notifications", "notifier"),
    _none_counted("listings", "given_up_raw_rows", "raw rows given up", health.raw_given_up,
                  "No raw row was given up by the processor after PIPELINE_RAW_MAX_ATTEMPTS "
                  "(`pipeline status` counts them; docs/runbook.md, Processing, says what to do)."),
    _failing_sources(),
    _schedule_adherence(),
    _push_health(),
    _none_counted("notifications", "failing_filters", "filters failing", health.failing_filters,
                  "No enabled filter was left out of matching within the last day because its query"
                  " did not compile or matching it raised; the other filters were matched all along"
                  " (`pipeline filters list` shows each one's error)."),
    _failing_channels(),
    _none_counted("notifications", "dead_notifications", "dead notifications", health.dead_notifications,
                  "No notification gave up after PIPELINE_DELIVERY_MAX_ATTEMPTS "
                  "(`pipeline notifications requeue --dead` retries them once fixed)."),
]

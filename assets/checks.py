"""Asset checks: is work being taken, is the raw backlog fresh, are sources failing, are
notifications dying. Each reads pipeline/storage/health.py, one cheap query per question.

Thresholds are environment variables (minutes): PIPELINE_STALE_LEASE_MINUTES (10),
PIPELINE_RAW_BACKLOG_MAX_MINUTES (60).
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.policies import by_code
from pipeline.core.failures import FailureReason
from pipeline.queue.claim import QueueSpec
from pipeline.storage import health, schema
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


def _raw_backlog() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="listings", name="raw_backlog_age", blocking=False,
        description="The oldest raw row not processed yet is younger than "
        "PIPELINE_RAW_BACKLOG_MAX_MINUTES; raw rows the processor gave up on are counted.",
    )
    def raw_backlog_age(database: PipelineDatabase) -> dg.AssetCheckResult:
        limit = database.settings().raw_backlog_max_minutes
        with database.engine.connect() as conn:
            backlog = health.raw_backlog(conn)
        age = backlog.age_minutes(datetime.now(UTC))
        return dg.AssetCheckResult(
            passed=age <= limit and backlog.given_up == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=(f"oldest unprocessed raw row: {age:.0f} min (limit {limit});"
                         f" {backlog.given_up} raw rows given up"),
            metadata={"oldest_unprocessed_minutes": round(age, 1), "limit_minutes": limit,
                      "given_up_raw_rows": backlog.given_up},
        )

    return raw_backlog_age


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
        total = sum(found.failing.values())
        return dg.AssetCheckResult(
            passed=total == 0 and found.disabled_by_failures == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{total} sources failing, {found.disabled_by_failures} disabled by failures",
            metadata={**by_code("failing_", found.failing, (reason.value for reason in FailureReason)),
                      "failing": total, "disabled_by_failures": found.disabled_by_failures},
        )

    return failing_sources


def _dead_notifications() -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset="notifications", name="dead_notifications", blocking=False,
        description="No notification gave up after PIPELINE_DELIVERY_MAX_ATTEMPTS "
        "(`pipeline notifications requeue --dead` retries them once fixed).",
    )
    def dead_notifications(database: PipelineDatabase) -> dg.AssetCheckResult:
        with database.engine.connect() as conn:
            dead = health.dead_notifications(conn)
        return dg.AssetCheckResult(
            passed=dead == 0, severity=dg.AssetCheckSeverity.WARN,
            description=f"{dead} dead notifications" if dead else None, metadata={"dead": dead},
        )

    return dead_notifications


ASSET_CHECKS = [
    _stale_lease_check("listings_raw", (schema.SOURCES_DUE,), "collector"),
    _stale_lease_check("listings", (schema.RAW_UNPROCESSED,), "processor"),
    _stale_lease_check("notifications", (schema.LISTINGS_UNMATCHED, schema.NOTIFICATIONS_DUE), "notifier"),
    _raw_backlog(),
    _failing_sources(),
    _dead_notifications(),
]

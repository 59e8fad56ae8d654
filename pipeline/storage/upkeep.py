"""Retention: processed raw rows, old telemetry and old sources' owners' alerts that
ended (sent or dead) are deleted; nothing else is.

Listings, sources, source_items (which remember every item's hash, so an old item is
never stored again) and notifications (whose unique (user, listing) is what keeps a user
from hearing twice) are kept. Deletes walk the primary key in ranges, so each statement
is a short transaction over an index range, whatever the size of the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.core.kinds import NotificationStatus
from pipeline.core.settings import Settings
from pipeline.storage import schema

STEP = 50_000  # ids per DELETE


@dataclass(frozen=True)
class Purged:
    raw_rows: int
    events: int
    source_alerts: int = 0


def purge(engine: Engine, settings: Settings, *, now: datetime | None = None) -> Purged:
    now = now or datetime.now(UTC)
    raw = schema.listings_raw
    events = schema.ingestion_events
    alerts = schema.source_alerts
    telemetry_since = now - timedelta(days=settings.event_retention_days)
    return Purged(
        raw_rows=_delete_in_ranges(
            engine, raw, raw.c.processed_at < now - timedelta(days=settings.raw_retention_days)
        ),
        events=_delete_in_ranges(engine, events, events.c.occurred_at < telemetry_since),
        source_alerts=_delete_in_ranges(engine, alerts, sa.and_(
            alerts.c.created_at < telemetry_since,
            alerts.c.status.in_([NotificationStatus.SENT, NotificationStatus.DEAD]))),
    )


def _delete_in_ranges(engine: Engine, table: sa.Table, old: sa.ColumnElement[bool]) -> int:
    with engine.connect() as conn:
        low, high = conn.execute(sa.select(sa.func.min(table.c.id), sa.func.max(table.c.id))).one()
    if low is None:
        return 0
    deleted = 0
    for start in range(low, high + 1, STEP):
        with engine.begin() as conn:
            result = conn.execute(
                sa.delete(table).where(table.c.id >= start, table.c.id < start + STEP, old)
            )
            deleted += result.rowcount
    return deleted

"""Source health for owners: a source may have an owner (``source_owners``), a user told
once when it starts failing and once when it recovers (docs/runbook.md, "Source owners").

When is decided by pipeline/fetching/decide.py (``owner_alert``, a pure rule); this
module reads the owners of a batch of fetched sources and writes their alerts, in the
fetch's fenced completion (pipeline/fetching/collector.py): a fetch whose completion is
fenced out writes none, and one that commits writes its alert with it, so each change of
a source's health is told once. ``source_alerts`` is a claim queue
(``schema.SOURCE_ALERTS_DUE``), delivered by pipeline/notify/source_alerts.py.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import NamedTuple

import sqlalchemy as sa

from pipeline.core.kinds import SourceHealth
from pipeline.storage import schema
from pipeline.storage.bulk import insert_rows


class Owner(NamedTuple):
    user_id: int
    alerted: bool  # told the source fails, and not yet that it recovered


class OwnerAlert(NamedTuple):
    """One alert to write: ``event`` of ``source_id`` for ``user_id``."""

    source_id: int
    user_id: int
    event: SourceHealth
    reason: str | None
    detail: str


def any_owned(conn: sa.Connection) -> bool:
    """Does any source have an owner? (Read once per collector run: if none, a fetch's
    owner is not looked up.)"""
    return conn.execute(sa.select(schema.source_owners.c.source_id).limit(1)).first() is not None


def owners_of(conn: sa.Connection, source_ids: Collection[int]) -> dict[int, Owner]:
    t = schema.source_owners
    if not source_ids:
        return {}
    rows = conn.execute(sa.select(t.c.source_id, t.c.user_id, t.c.alerted_at).where(t.c.source_id.in_(source_ids)))
    return {r.source_id: Owner(r.user_id, r.alerted_at is not None) for r in rows}


def record(conn: sa.Connection, told: Sequence[OwnerAlert], now: datetime) -> None:
    """Queue the alerts and mark their owners told (or, for a recovery, no longer told)."""
    if not told:
        return
    insert_rows(conn, schema.source_alerts, [
        {"source_id": t.source_id, "user_id": t.user_id, "event": t.event.value, "reason": t.reason,
         "detail": t.detail, "created_at": now, "next_attempt_at": now} for t in told
    ])
    o = schema.source_owners
    for event in SourceHealth:
        ids = [t.source_id for t in told if t.event is event]
        if ids:
            conn.execute(sa.update(o).where(o.c.source_id.in_(ids))
                         .values(alerted_at=now if event is SourceHealth.FAILING else None))


def set_owner(conn: sa.Connection, source_id: int, user_id: int | None) -> None:
    """``user_id`` owns ``source_id`` from now on (None: nobody does). A new owner starts
    untold: if the source fails now, they hear of it at its next failed fetch that
    meets the rule."""
    o = schema.source_owners
    now = conn.execute(sa.select(o.c.user_id).where(o.c.source_id == source_id)).scalar()
    if now == user_id:
        return  # the same owner keeps what they were told
    conn.execute(sa.delete(o).where(o.c.source_id == source_id))
    if user_id is not None:
        conn.execute(sa.insert(o).values(source_id=source_id, user_id=user_id, alerted_at=None))

"""How the pipeline is doing, for the asset checks and `pipeline status`.

Each question is one cheap query: over a queue's partial indexes where it can (stale
leases), or over small partial indexes (failed raw rows, dead
notifications). Failing sources are counted over the sources table itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa

from pipeline.core.backoff import BackoffPolicy
from pipeline.core.failures import PERMANENT
from pipeline.core.kinds import NotificationStatus
from pipeline.queue.claim import QueueSpec
from pipeline.storage import schema

DEFAULT_POLICY = BackoffPolicy()


def stale_leases(conn: sa.Connection, queues: tuple[QueueSpec, ...], older_than: timedelta) -> dict[str, int]:
    """Per queue, rows whose lease ran out more than ``older_than`` ago and that nobody
    has claimed since: work no worker is taking (is every worker of that stage down?).
    Leases are compared with the database clock, as the claim compares them."""
    cutoff = schema.now_sql(conn.dialect.name, minus=older_than)
    counts = {}
    for spec in queues:
        t = spec.table
        query = sa.select(sa.func.count()).select_from(t).where(spec.expired(cutoff))
        counts[f"{t.name}.{spec.name}"] = int(conn.execute(query).scalar_one())
    return counts


def raw_given_up(conn: sa.Connection) -> int:
    """Raw rows the processor gave up on: processed, with their error kept."""
    t = schema.listings_raw
    return int(conn.execute(
        sa.select(sa.func.count()).select_from(t).where(t.c.last_error.is_not(None), t.c.processed_at.is_not(None))
    ).scalar_one())


@dataclass(frozen=True)
class FailingSources:
    failing: dict[str, int]  # enabled sources failing in a row, by failure code
    disabled_by_failures: int  # sources the backoff disabled


def failing_sources(conn: sa.Connection) -> FailingSources:
    """Enabled sources whose last fetch failed, by failure code (what `pipeline status`
    shows, and the asset check warns of); and the sources their failures disabled. A
    source an operator disabled is in neither count, whatever its failures."""
    t = schema.sources
    failing = conn.execute(
        sa.select(t.c.last_failure_reason, sa.func.count())
        .where(t.c.enabled, t.c.consecutive_failures > 0)
        .group_by(t.c.last_failure_reason)
    ).all()
    disabled = conn.execute(
        sa.select(sa.func.count()).select_from(t).where(disabled_by_failures(t))
    ).scalar_one()
    return FailingSources({str(reason): int(n) for reason, n in failing}, int(disabled))


def disabled_by_failures(t: sa.Table, policy: BackoffPolicy = DEFAULT_POLICY) -> sa.ColumnElement[bool]:
    """Sources the backoff disabled: off, with as many failures in a row of a permanent
    code as the policy disables at (pipeline/core/backoff.py). An operator's disable
    (``sources disable``) leaves fewer, or the fetch would have disabled it first."""
    return sa.and_(
        sa.not_(t.c.enabled),
        t.c.consecutive_failures >= policy.disable_after,
        t.c.last_failure_reason.in_(sorted(reason.value for reason in PERMANENT)),
    )


def dead_notifications(conn: sa.Connection) -> int:
    t = schema.notifications
    return int(conn.execute(sa.select(sa.func.count()).select_from(t).where(t.c.status == NotificationStatus.DEAD)).scalar_one())


def holds_live_lease(conn: sa.Connection, worker: str) -> bool:
    """Does ``worker`` hold work whose lease still runs, in any claim queue? A worker
    renews its leases while it works (pipeline/queue/workpool.py's heartbeat), so a
    worker that holds one is alive; one whose process died holds none within a lease."""
    now = schema.now_sql(conn.dialect.name)
    for spec in schema.QUEUES:
        held = sa.select(spec.table.c.id).where(spec.held(now), spec.table.c.claimed_by == worker).limit(1)
        if conn.execute(held).first() is not None:
            return True
    return False

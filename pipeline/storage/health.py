"""How the pipeline is doing, for the asset checks and `pipeline status`.

Each question is one cheap query: over a queue's partial indexes where it can (stale
leases), or over small partial indexes (failed raw rows, dead
notifications). Failing sources are counted over the sources table itself; fetches'
lateness over the telemetry of the span asked (its ``occurred_at`` index).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.core.backoff import BackoffPolicy
from pipeline.core.failures import PERMANENT
from pipeline.core.kinds import PUSH_TROUBLE, NotificationStatus, PushHealth, WebSubState
from pipeline.core.redact import userinfo
from pipeline.queue.spec import QueueSpec
from pipeline.storage import schema

DEFAULT_POLICY = BackoffPolicy()
# A subscription asked of its hub and not verified by then is asked again (doubling; the
# WebSub client, pipeline/fetching/websub.py) and, meanwhile, ``unverified``.
VERIFY_WITHIN = timedelta(hours=1)


def stale_leases(conn: sa.Connection, queues: tuple[QueueSpec, ...], older_than: timedelta) -> dict[str, int]:
    """Per queue, rows whose lease ran out more than ``older_than`` ago and that nobody
    has claimed since: work no worker is taking (is every worker of that stage down?).
    Leases are compared with the database clock, as the claim compares them."""
    cutoff = schema.now_sql(conn, minus=older_than)
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


def _failing(t: sa.Table) -> sa.ColumnElement[bool]:
    """Enabled sources whose last fetch failed (an operator's disable hides the rest)."""
    return sa.and_(t.c.enabled, t.c.consecutive_failures > 0)


def fetch_error(details: object) -> str | None:
    """A completed fetch's error, as its event's details hold it, never with a password."""
    error = details.get("error") if isinstance(details, dict) else None
    return userinfo(str(error)) if error else None


def failing_sources(conn: sa.Connection) -> FailingSources:
    """Enabled sources whose last fetch failed, by failure code (what `pipeline status`
    shows, and the asset check warns of); and the sources their failures disabled. A
    source an operator disabled is in neither count, whatever its failures."""
    t = schema.sources
    failing = conn.execute(
        sa.select(t.c.last_failure_reason, sa.func.count())
        .where(_failing(t))
        .group_by(t.c.last_failure_reason)
    ).all()
    disabled = conn.execute(
        sa.select(sa.func.count()).select_from(t).where(disabled_by_failures(t))
    ).scalar_one()
    return FailingSources({str(reason): int(n) for reason, n in failing}, int(disabled))


@dataclass(frozen=True)
class FailingSource:
    id: int
    name: str
    reason: str | None  # the failure code of its last fetch
    failures: int  # in a row
    since: datetime | None  # its last good fetch (None: never one)
    disabled: bool  # by its failures
    error: str | None  # its last failed fetch's error


def which_sources_fail(conn: sa.Connection, limit: int = 20) -> list[FailingSource]:
    """The sources ``failing_sources`` counts, the longest failing first (at most
    ``limit``), with since when and why: for the UI, where a count alone does not say
    which source to look at."""
    t, events = schema.sources, schema.ingestion_events
    rows = conn.execute(
        sa.select(t.c.id, t.c.name, t.c.last_failure_reason, t.c.consecutive_failures, t.c.last_success_at,
                  t.c.enabled)
        .where(sa.or_(_failing(t), disabled_by_failures(t)))
        .order_by(t.c.consecutive_failures.desc(), t.c.id).limit(limit)
    ).all()
    found = []
    for row in rows:  # its last failed fetch, by the events' (source_id, occurred_at) index
        details = conn.execute(
            sa.select(events.c.details).where(events.c.source_id == row.id, events.c.event == schema.EVENT_COMPLETED,
                                              sa.not_(events.c.success))
            .order_by(events.c.occurred_at.desc()).limit(1)
        ).scalar()
        found.append(FailingSource(row.id, userinfo(row.name), row.last_failure_reason, row.consecutive_failures,
                                   row.last_success_at, not row.enabled, fetch_error(details)))
    return found


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
    now = schema.now_sql(conn)
    for spec in schema.QUEUES:
        held = sa.select(spec.table.c.id).where(spec.held(now), spec.table.c.claimed_by == worker).limit(1)
        if conn.execute(held).first() is not None:
            return True
    return False


@dataclass(frozen=True)
class Lateness:
    """How late fetches started against their due time (``next_fetch_at``), over a span:
    an ``ingestion.started`` event's ``occurred_at`` (the claim) less its ``scheduled_at``.
    A never-fetched or refreshed source (no due time) is not counted."""

    start: datetime  # the span's start (the hour's, in ``lateness_by_hour``)
    fetches: int
    p50_seconds: float | None  # None: no fetch in the span
    p95_seconds: float | None


def lateness_by_hour(conn: sa.Connection, hours: int) -> list[Lateness]:
    """Lateness per clock hour (UTC) over the last ``hours`` hours, newest first; hours
    with no fetch are left out. Percentiles interpolate linearly (PostgreSQL's
    ``percentile_cont``; the same rule in Python elsewhere)."""
    return _lateness(conn, timedelta(hours=hours), by_hour=True)


def lateness(conn: sa.Connection, span: timedelta) -> Lateness:
    """Lateness of the fetches that started within the last ``span``."""
    found = _lateness(conn, span, by_hour=False)
    return found[0] if found else Lateness(datetime.now(UTC) - span, 0, None, None)


def _lateness(conn: sa.Connection, span: timedelta, *, by_hour: bool) -> list[Lateness]:
    e = schema.ingestion_events
    since = schema.now_sql(conn, minus=span)
    where = (e.c.event == schema.EVENT_STARTED, e.c.occurred_at >= since, e.c.scheduled_at.is_not(None))
    # A fetch that started before its due time (a refresh, another worker's clock a
    # little ahead) was not late: lateness is never below zero.
    spans = backend_for(conn).late_seconds(conn, e.c.occurred_at, e.c.scheduled_at, where, (0.5, 0.95),
                                           since=since, by_hour=by_hour)
    return [Lateness(start, count, p50, p95) for start, count, (p50, p95) in spans]


FILTER_FAILURE_SPAN = timedelta(days=1)


# A notification that failed this many attempts in a row, and waits to be tried again,
# says its channel is failing (a receiver down, gone, or refusing): the failing_channels check.
CHANNEL_FAILED_ATTEMPTS = 2


@dataclass(frozen=True)
class FailingChannel:
    """A user whose notifications keep failing: how many are waiting to be tried again
    after CHANNEL_FAILED_ATTEMPTS or more failed attempts, and the last error of one."""

    user: str
    retrying: int
    error: str | None
    gone_since: datetime | None = None  # its receiver answered 410 Gone then: its notifications are held


def failing_channels(conn: sa.Connection, limit: int = 20) -> list[FailingChannel]:
    """The users whose channel is gone (a receiver answered 410 Gone: ``gone_channels``),
    latest first, then those whose channel failed a notification
    CHANNEL_FAILED_ATTEMPTS times in a row or more, that notification waiting to be
    tried again (dead ones are the dead_notifications check's), the most such first. Failed notifications are few: the
    read is of them alone."""
    n, u = schema.notifications, schema.users
    rows = conn.execute(
        sa.select(u.c.name, sa.func.count(), sa.func.max(n.c.last_error))
        .join(u, u.c.id == n.c.user_id)
        .where(n.c.status == NotificationStatus.FAILED, n.c.attempts >= CHANNEL_FAILED_ATTEMPTS)
        .group_by(u.c.name).order_by(sa.func.count().desc(), u.c.name).limit(limit))
    failing = [FailingChannel(str(name), int(count), userinfo(error) if error else None) for name, count, error in rows]
    g = schema.gone_channels
    gone = [FailingChannel(str(name), 0, userinfo(error), gone_at) for name, gone_at, error in conn.execute(
        sa.select(u.c.name, g.c.gone_at, g.c.error).join(u, u.c.id == g.c.user_id)
        .order_by(g.c.gone_at.desc(), u.c.name).limit(limit))]
    return gone + failing


def failing_filters(conn: sa.Connection, span: timedelta = FILTER_FAILURE_SPAN) -> int:
    """Enabled filters the notifier left out within ``span`` because they failed (their
    query no longer compiles, or matching them raised: ``filters.error``); every other
    filter was matched. `pipeline filters list` shows why."""
    f = schema.filters
    since = schema.now_sql(conn, minus=span)
    return int(conn.execute(
        sa.select(sa.func.count()).select_from(f).where(f.c.enabled, f.c.failed_at >= since)
    ).scalar_one())


def push_health(t: sa.Table, now: datetime) -> sa.ColumnElement[str]:
    """A WebSub subscription's ``PushHealth`` at ``now``, as SQL over ``t``
    (``websub_subscriptions``): the one home of the rule, read by the collector's polls
    (pipeline/fetching/websub.py), ``sources show``, ``status``, the ``push_health``
    check and the metric."""
    h, state = PushHealth, WebSubState
    lapsed = sa.and_(t.c.missed_at.is_not(None), sa.or_(t.c.last_push_at.is_(None), t.c.last_push_at < t.c.missed_at))
    return sa.case(
        (t.c.state == state.UNSUBSCRIBING.value, h.ENDING.value),
        (t.c.state == state.DENIED.value, h.DENIED.value),
        (sa.and_(t.c.state == state.REQUESTED.value, t.c.requested_at < now - VERIFY_WITHIN), h.UNVERIFIED.value),
        (t.c.state == state.REQUESTED.value, h.REQUESTED.value),
        (sa.or_(t.c.lease_until.is_(None), t.c.lease_until <= now), h.EXPIRED.value),
        (lapsed, h.MISSED.value),
        else_=h.PUSHED.value,
    )


def push_health_counts(conn: sa.Connection, now: datetime) -> dict[str, int]:
    """WebSub subscriptions by ``push_health``, every one named (0 when none)."""
    t = schema.websub_subscriptions
    health = push_health(t, now)
    counts: dict[str, int] = dict(conn.execute(sa.select(health, sa.func.count()).group_by(health)).all())
    return {str(h): int(counts.get(h, 0)) for h in PushHealth}


@dataclass(frozen=True)
class PushTrouble:
    """A source whose pushes cannot be trusted now (``PUSH_TROUBLE``)."""

    source_id: int | None
    name: str | None
    health: str
    hub: str
    missed: int  # items polls found that no push brought, all told
    last_push_at: datetime | None
    last_error: str | None


def push_trouble(conn: sa.Connection, now: datetime, limit: int = 20) -> list[PushTrouble]:
    """The subscriptions in trouble (``PUSH_TROUBLE``), the most missed items first."""
    t, s = schema.websub_subscriptions, schema.sources
    health = push_health(t, now)
    rows = conn.execute(
        sa.select(t.c.source_id, s.c.name, health.label("health"), t.c.hub, t.c.missed, t.c.last_push_at, t.c.last_error)
        .select_from(t.outerjoin(s, s.c.id == t.c.source_id))
        .where(health.in_([h.value for h in PUSH_TROUBLE]))
        .order_by(t.c.missed.desc(), t.c.id).limit(limit))
    return [PushTrouble(*row) for row in rows]

"""What the pipeline is doing right now, for `pipeline status`, and each stage's last run.

Queue figures are counted over the claim queues' own partial indexes (pipeline/storage/schema.py),
so they cost the same whatever the size of the tables; whole-table totals are the
planner's estimates on PostgreSQL for the tables that grow without bound.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import backend_for
from pipeline.backends.types import UTCDateTime
from pipeline.core.kinds import PUSH_TROUBLE, NotificationStatus, WebSubState
from pipeline.queue.spec import QueueSpec
from pipeline.storage import counters, db, health, schema

UNSENT = (NotificationStatus.PENDING, NotificationStatus.FAILED, NotificationStatus.DEAD, NotificationStatus.HELD)

QUEUE_LABELS = {
    "sources": "sources due",
    "listings_raw": "raw rows to process",
    "listings": "listings to match",
    "notifications": "notifications due",
    "source_alerts": "owners' alerts due",
}
_ESTIMATED_TABLES = ("listings_raw", "listings", "notifications", "ingestion_events")


@dataclass(frozen=True)
class QueueStatus:
    """One claim queue: what could be claimed now, what is claimed, what was abandoned."""

    table: str
    label: str
    waiting: int  # claimable now: ready and never leased, or lease expired
    in_flight: int  # leased, lease still running
    expired_leases: int  # leased, lease ran out: claimable again (is a worker down?)
    oldest_waiting: datetime | None  # the earliest of the waiting rows, by the queue's time


LATENESS_HOURS = 6  # `pipeline status` shows fetches' lateness for the last hours
SHOWN_FAILING = 10  # the failing sources `pipeline status` lists, the longest failing first


@dataclass(frozen=True)
class PipelineStatus:
    database: str
    at: datetime
    sources_enabled: int
    sources_disabled: int
    sources_by_priority: dict[str, int]  # enabled sources per priority, highest first
    next_due_at: datetime | None  # the next enabled source to come due (None: none)
    failing: dict[str, int]  # enabled sources whose last fetch failed, by failure code
    disabled_by_failures: int
    last_hour: dict[str, int]  # fetches, failed, items_new (ingestion.completed events)
    raw_given_up: int
    failing_filters: int  # enabled filters left out of matching within a day (their error kept)
    batched: int  # alerts held past their user's limit, for a window's summary (ever)
    stories: dict[str, int]  # stories: carried by more than one source; copies: their later listings
    notifications: dict[str, int]  # pending, failed (retrying), dead, held (for a digest); sent where exact
    totals: dict[str, int]  # rows per table (estimates on PostgreSQL for the big ones)
    totals_estimated: bool
    queues: list[QueueStatus]
    stages: list[dict[str, Any]]  # worker_state: each stage's last run
    # how late fetches started against their due time, per hour, newest first
    lateness: list[health.Lateness]
    # the longest failing sources (at most SHOWN_FAILING), each with since when and why
    failing_sources: list[health.FailingSource]
    # WebSub subscriptions by state, and when the first active lease ends
    pushed: dict[str, int] = field(default_factory=dict)
    first_lease_end: datetime | None = None


def _count(conn: sa.Connection, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def oldest_waiting(conn: sa.Connection, spec: QueueSpec, now: sa.ColumnElement[datetime]) -> datetime | None:
    """When the queue's oldest waiting row became due (its ``index_on`` column): two
    mins, over the free rows and over the expired leases, each on one partial index."""
    when = spec.index_on[0]
    oldest_free = conn.execute(sa.select(sa.func.min(when)).where(spec.free(), *spec.ready_at(now))).scalar()
    oldest_expired = conn.execute(sa.select(sa.func.min(when)).where(spec.expired(now))).scalar()
    return min((v for v in (oldest_free, oldest_expired) if v is not None), default=None)


def next_due_in(conn: sa.Connection) -> float | None:
    """Seconds until the next source comes due, by the database clock: 0.0 when one is
    due now (or its lease ran out), None when no enabled source waits (all held)."""
    spec = schema.SOURCES_DUE
    when = spec.table.c.next_fetch_at
    now_sql = schema.now_sql(conn)
    # One round trip of three index probes: a lease run out (its source is due again
    # now), a source never fetched (NULL: due now), else the earliest time. Not the min
    # of an expression over the free index (coalesce), which read every free source:
    # 40 ms at 200,000 (bench/RESULTS.md), each time a lingering run waits.
    lapsed = sa.exists().where(spec.expired(now_sql))
    never = sa.exists().where(spec.free(), when.is_(None))
    soonest = sa.select(sa.func.min(when)).where(spec.free()).scalar_subquery()
    now, expired, unfetched, due = conn.execute(sa.select(now_sql, lapsed, never, soonest)).one()
    if expired or unfetched:
        return 0.0
    return None if due is None else max(0.0, (due - now).total_seconds())


def waited_seconds(conn: sa.Connection, spec: QueueSpec) -> float:
    """How long the queue's oldest waiting row has waited since it became due, by the
    database clock (0.0 when none waits): what the sensors observe on every tick and
    the freshness checks judge."""
    now_sql = schema.now_sql(conn)
    now = conn.execute(sa.select(now_sql)).scalar_one()
    return waited_since(oldest_waiting(conn, spec, now_sql), now)


def waited_since(oldest: datetime | None, now: datetime) -> float:
    """Seconds from ``oldest`` (a queue's oldest waiting row's due time) to ``now``, to
    0.1 s; 0.0 when none waits."""
    return round(max(0.0, (now - oldest).total_seconds()), 1) if oldest else 0.0


def queue_status(conn: sa.Connection, spec: QueueSpec, now: sa.ColumnElement[datetime] | None = None) -> QueueStatus:
    """Three counts and a min, each over one of the queue's two partial indexes; ``now``
    the database's clock unless given."""
    if now is None:
        now = schema.now_sql(conn)
    t = spec.table
    free = [spec.free(), *spec.ready_at(now)]
    expired = _count(conn, t, spec.expired(now))
    oldest = oldest_waiting(conn, spec, now)
    return QueueStatus(
        table=t.name,
        label=QUEUE_LABELS.get(t.name, t.name),
        waiting=_count(conn, t, *free) + expired,
        in_flight=_count(conn, t, spec.held(now)),
        expired_leases=expired,
        oldest_waiting=oldest,
    )


COUNTED_BELOW = 100_000  # rows a count reads in milliseconds: estimated past it


def _totals(conn: sa.Connection) -> tuple[dict[str, int], bool]:
    """Rows per table, and whether some are estimates: the database's estimate for the
    tables that grow without bound where it keeps one cheaply (PostgreSQL's planner: a
    count(*) would read all of them) and it is past ``COUNTED_BELOW``, exact for the rest
    (a table never analysed has no estimate, and a small one is counted: "listings ~0"
    was shown with 108 stored)."""
    backend = backend_for(conn)
    totals, estimated = {}, False
    for table in schema.metadata.sorted_tables:
        estimate = backend.estimated_rows(conn, table) if table.name in _ESTIMATED_TABLES else None
        if estimate is None or estimate < COUNTED_BELOW:
            totals[table.name] = _count(conn, table)
        else:
            totals[table.name], estimated = estimate, True
    return totals, estimated


def _stories(conn: sa.Connection) -> dict[str, int]:
    """Stories that more than one source brought, and their later copies: the listings
    that record a cluster (pipeline/listings/stories.py), read by its index."""
    t = schema.listings
    copies, stories = conn.execute(
        sa.select(sa.func.count(), sa.func.count(sa.distinct(t.c.cluster_id))).where(t.c.cluster_id.is_not(None))
    ).one()
    return {"stories": int(stories), "copies": int(copies)}


def collect_status(engine: Engine) -> PipelineStatus:
    now = schema.now_sql(engine)
    s, n, events = schema.sources, schema.notifications, schema.ingestion_events
    with engine.connect() as conn:
        at = conn.execute(sa.select(now)).scalar_one()
        failing = health.failing_sources(conn)
        hour = conn.execute(
            sa.select(
                sa.func.count(),
                sa.func.count(sa.case((events.c.success.is_(False), 1))),  # MariaDB has no FILTER
                sa.func.coalesce(sa.func.sum(events.c.items_new), 0),
            ).where(events.c.event == schema.EVENT_COMPLETED,
                    events.c.occurred_at >= sa.literal(datetime.now(UTC) - timedelta(hours=1), UTCDateTime()))
        ).one()
        by_status: dict[str, int] = {status: count for status, count in conn.execute(
            sa.select(n.c.status, sa.func.count()).where(n.c.status.in_(UNSENT))
            .group_by(n.c.status)
        )}
        notifications = {str(k): int(by_status.get(k, 0)) for k in UNSENT}
        totals, estimated = _totals(conn)
        if not estimated:  # a count of the sent ones would read them all
            notifications["sent"] = _count(conn, n, n.c.status == NotificationStatus.SENT)
        return PipelineStatus(
            database=db.display_url(engine.url),
            at=at,
            sources_enabled=_count(conn, s, s.c.enabled),
            sources_disabled=_count(conn, s, sa.not_(s.c.enabled)),
            sources_by_priority={str(p): int(n) for p, n in conn.execute(
                sa.select(s.c.priority, sa.func.count()).where(s.c.enabled)
                .group_by(s.c.priority).order_by(s.c.priority.desc()))},
            next_due_at=conn.execute(  # NULL means due now
                sa.select(sa.func.min(sa.func.coalesce(s.c.next_fetch_at, now))).where(s.c.enabled)
            ).scalar(),
            failing=failing.failing,
            disabled_by_failures=failing.disabled_by_failures,
            last_hour={"fetches": int(hour[0]), "failed": int(hour[1]), "items_new": int(hour[2])},
            raw_given_up=health.raw_given_up(conn),
            failing_filters=health.failing_filters(conn),
            batched=int(counters.totals(conn, [counters.NOTIFICATIONS_BATCHED.name]).get(
                (counters.NOTIFICATIONS_BATCHED.name, ""), 0)),
            stories=_stories(conn),
            notifications=notifications,
            totals=totals,
            totals_estimated=estimated,
            queues=[queue_status(conn, spec, now) for spec in schema.QUEUES],
            stages=[dict(r) for r in conn.execute(
                sa.select(schema.worker_state).order_by(schema.worker_state.c.worker_name)).mappings()],
            lateness=health.lateness_by_hour(conn, LATENESS_HOURS),
            failing_sources=health.which_sources_fail(conn, SHOWN_FAILING) if failing.failing
            or failing.disabled_by_failures else [],
            **_pushed(conn),
        )


def _pushed(conn: sa.Connection) -> dict[str, Any]:
    """WebSub subscriptions by health, and the first active lease's end."""
    t = schema.websub_subscriptions
    first = conn.execute(sa.select(sa.func.min(t.c.lease_until)).where(t.c.state == WebSubState.ACTIVE)).scalar()
    return {"pushed": health.push_health_counts(conn, datetime.now(UTC)), "first_lease_end": first}


def status_as_json(status: PipelineStatus) -> dict[str, Any]:
    def encode(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, dict):
            return {k: encode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [encode(v) for v in value]
        return value

    return {k: encode(v) for k, v in asdict(status).items()}


def _ago(then: datetime | None, now: datetime) -> str:
    if then is None:
        return "-"
    seconds = (now - then).total_seconds()
    span = _span(abs(seconds))
    return f"in {span}" if seconds < 0 else f"{span} ago"


def _span(seconds: float | None) -> str:
    """A length of time for people: seconds, minutes, hours or days."""
    if seconds is None:
        return "-"
    if seconds < 90:
        span = f"{seconds:.0f} s"
    elif seconds < 90 * 60:
        span = f"{seconds / 60:.0f} min"
    elif seconds < 48 * 3600:
        span = f"{seconds / 3600:.1f} h"
    else:
        span = f"{seconds / 86400:.1f} days"
    return span


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    return [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True)))
        .rstrip()
        for line in [header, *rows]
    ]


def status_as_text(status: PipelineStatus) -> str:
    now = status.at
    failing = ", ".join(f"{reason} {n}" for reason, n in sorted(status.failing.items())) or "none"
    hour = status.last_hour
    notes = status.notifications
    sent = f"{notes['sent']:,} sent, " if "sent" in notes else ""
    about = "~" if status.totals_estimated else ""
    due = status.next_due_at
    next_due = "-" if due is None else "now" if due <= now else _ago(due, now)
    lines = [
        f"{status.database} at {now:%Y-%m-%d %H:%M:%S} UTC",
        "",
        (f"sources        {status.sources_enabled:,} enabled, {status.sources_disabled:,} disabled"
         f" ({status.disabled_by_failures:,} by their failures); next due {next_due}"),
        *(["priorities     " + ", ".join(f"{p}: {n:,}" for p, n in status.sources_by_priority.items())]
          if set(status.sources_by_priority) - {"0"} else []),
        f"failing now    {failing}",
        f"last hour      {hour['fetches']:,} fetches, {hour['failed']:,} failed, {hour['items_new']:,} new items",
        f"listings       {about}{status.totals['listings']:,}; raw rows given up: {status.raw_given_up:,}",
        (f"stories        {status.stories['stories']:,} carried by more than one source;"
         f" {status.stories['copies']:,} later copies (a user hears of a story once)"),
        (f"notifications  {sent}{notes['pending']:,} pending, {notes['failed']:,} retrying,"
         f" {notes['dead']:,} dead, {notes['held']:,} held for digests, quiet hours or alert limits"
         f" ({status.batched:,} held past users' alert limits so far)"),
        *([(f"pushed         {status.pushed['pushed']:,} by their hubs (WebSub; the first lease ends"
            f" {_ago(status.first_lease_end, now)}), {status.pushed['requested']:,} awaiting verification,"
            f" {status.pushed['ending']:,} being ended")]
          if any(status.pushed.values()) else []),
        *([(f"push trouble   {status.pushed['missed']:,} missing pushes (a poll found items no push brought:"
            f" polled at their cadence, hubs asked again), {status.pushed['expired']:,} expired,"
            f" {status.pushed['unverified']:,} not verified within the hour, {status.pushed['denied']:,} denied")]
          if any(status.pushed[str(h)] for h in PUSH_TROUBLE) else []),
        *([(f"filters        {status.failing_filters:,} left out of matching in the last day: they failed"
            " (`pipeline filters list` shows why); every other filter was matched")]
          if status.failing_filters else []),
        "",
    ]
    lines += _table(
        ("queue", "waiting", "oldest waiting", "in flight", "expired leases"),
        [(q.label, f"{q.waiting:,}", _ago(q.oldest_waiting, now), f"{q.in_flight:,}", f"{q.expired_leases:,}")
         for q in status.queues],
    )
    if status.failing_sources:
        shown = len(status.failing_sources)
        total = sum(status.failing.values()) + status.disabled_by_failures
        lines.append("")
        lines += _table(
            (f"failing sources ({shown} of {total:,}, longest first)" if total > shown else "failing sources",
             "since", "failures", "code", "last error"),
            [(f"{f.id} {f.name}"[:40], "never fetched well" if f.since is None else _ago(f.since, now),
              f"{f.failures}{' (disabled)' if f.disabled else ''}", f.reason or "-",
              " ".join((f.error or "-").split())[:60])
             for f in status.failing_sources],
        )
    if status.lateness:
        lines.append("")
        lines += _table(
            ("hour (UTC)", "fetches", "started late p50", "p95"),
            [(f"{h.start:%Y-%m-%d %H}:00", f"{h.fetches:,}", _span(h.p50_seconds), _span(h.p95_seconds))
             for h in status.lateness],
        )
    if status.stages:
        lines.append("")
        lines += _table(
            ("stage", "last run", "status"),
            [(r["worker_name"], _ago(r["last_run_at"], now),
              r["last_status"] + (f": {r['last_error'][:80]}" if r["last_error"] else ""))
             for r in status.stages],
        )
    return "\n".join(lines)


@contextmanager
def recorded(engine: Engine, stage: str) -> Iterator[None]:
    """Record in ``worker_state`` when ``stage`` last ran and how it ended."""
    try:
        yield
    except Exception as exc:
        _record(engine, stage, "failed", f"{type(exc).__name__}: {exc}"[:1000])
        raise
    _record(engine, stage, "ok", None)


class _Stage(Protocol):
    engine: Engine


S = TypeVar("S", bound=_Stage)
P = ParamSpec("P")
R = TypeVar("R")


def records(stage: str) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """A stage's ``run`` records in ``worker_state`` (``recorded``) when it last ran and
    how it ended, whoever runs it: a Dagster run, `pipeline collect`, a benchmark."""
    def wrap(run: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(run)
        def recording(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with recorded(self.engine, stage):
                return run(self, *args, **kwargs)
        return recording
    return wrap


def looked(engine: Engine, stage: str) -> None:
    """Record in ``worker_state`` that ``stage``'s sensor looked for work now (as
    ``sensor:STAGE``): the daemon's sign of life where the pipeline's own readers see it
    (`pipeline status`, ``pipeline_worker_last_run_timestamp_seconds``)."""
    _record(engine, f"{SENSOR_PREFIX}{stage}", "ok", None)


SENSOR_PREFIX = "sensor:"  # worker_state's rows of the sensors' looks


def _record(engine: Engine, stage: str, status: str, error: str | None) -> None:
    t = schema.worker_state
    values = {"worker_name": stage, "last_run_at": datetime.now(UTC), "last_status": status, "last_error": error}
    try:
        with engine.begin() as conn:
            backend_for(conn).upsert(conn, t, [values], ["worker_name"])
    except sa.exc.SQLAlchemyError:
        pass  # the run's own outcome matters more than this record of it

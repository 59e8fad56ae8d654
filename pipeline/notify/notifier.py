"""One notifier pass: match new listings against filters, then deliver notifications.

Matching claims listings not matched yet (``LISTINGS_UNMATCHED``, not a time cursor: a
listing whose transaction committed late is still claimed), runs the filter index
(pipeline/notify/matching.py) and, in one transaction per batch, marks them matched (fenced) and
inserts a pending notification per (user, listing). The unique (user_id, listing_id)
makes a second match of the same pair a no-op, so a user never hears twice about one
listing, whatever re-matching or backfills happen.

Delivery claims due notifications (``NOTIFICATIONS_DUE``) through the shared work pool
(pipeline/queue/workpool.py), sends them with no transaction open, and records each outcome:
sent; failed, to be tried again at ``delivery_retry_at``; or dead after
``delivery_max_attempts``, with its error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.core.errors import DeliveryError
from pipeline.core.failures import CHANNEL_BUG, WORKER_STOPPED, FailureReason
from pipeline.core.kinds import ChannelKind, NotificationStatus
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher
from pipeline.notify.delivery import (
    AppriseChannel,
    Channel,
    Message,
    WebhookChannel,
    delivery_retry_at,
)
from pipeline.notify.matching import Filter, FilterIndex, ListingText, Match
from pipeline.queue.claim import Claim, Row, RowCompletion, WorkQueue
from pipeline.queue.workpool import work_claimed
from pipeline.storage import counters, schema
from pipeline.storage.bulk import ANY_UNIQUE_KEY, insert_ignoring_conflicts

log = logging.getLogger("pipeline.notify.notifier")


@dataclass
class NotifyStats:
    listings_matched: int = 0
    notifications_created: int = 0
    claimed: int = 0  # notifications claimed for delivery
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    fenced_out: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        totals = asdict(self)
        totals["errors"] = dict(self.errors)
        return totals


@dataclass
class Attempt:
    """One delivery attempt's outcome."""

    claim: Claim
    notification_id: int
    attempts: int  # counting this one (the claim counts it)
    error: DeliveryError | None
    finished: datetime
    exhausted: bool = False  # claimed too often: dead whatever ``attempts`` says
    created_at: datetime | None = None  # the notification's, for the delivery latency


@dataclass
class Notifier:
    engine: Engine
    settings: Settings
    worker: str
    run_id: str | None = None
    match_batch: int = 1000
    delivery_batch: int = 32
    random_unit: Callable[[], float] = random.random
    _recording: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    channels: dict[str, Channel] | None = None  # default: webhook and apprise
    _catalogue: FilterCatalogue = field(init=False)

    def __post_init__(self) -> None:
        self._catalogue = FilterCatalogue(self.engine)

    def run(self, *, max_listings: int | None = None, max_notifications: int | None = None) -> NotifyStats:
        stats = NotifyStats()
        self.match(stats, max_listings=max_listings)
        self.deliver(stats, max_notifications=max_notifications)
        return stats

    # -- matching -----------------------------------------------------------------------

    def match(self, stats: NotifyStats, *, max_listings: int | None = None) -> None:
        queue = WorkQueue(self.engine, schema.LISTINGS_UNMATCHED, lease_seconds=self.settings.lease_seconds)
        claimed = 0  # the cap counts rows claimed: rows lost to another worker count too
        while max_listings is None or claimed < max_listings:
            limit = min(self.match_batch, max_listings - claimed) if max_listings else self.match_batch
            claim = queue.claim(self.worker, limit)
            if not claim:
                return
            claimed += len(claim)
            # Filters are brought up to date after the claim: every filter committed
            # before these listings were claimed takes part.
            index, channels = self._catalogue.current()
            matches = index.matches(_texts(claim.rows))
            keys = {row["id"]: row["item_key"] for row in claim.rows}
            with self.engine.begin() as conn:
                fenced = queue.complete(claim, {"matched_at": datetime.now(UTC)}, conn=conn)
                done = set(fenced.done)
                stats.fenced_out += len(fenced.lost)
                stats.listings_matched += len(done)
                created = _insert_notifications(conn, [m for m in matches if m.listing_id in done], channels, keys)
                stats.notifications_created += created
                counts = counters.tally()
                counters.LISTINGS_MATCHED.count(counts, len(done))
                counters.NOTIFICATIONS_CREATED.count(counts, created)
                counters.add(conn, counts)  # last: see pipeline/storage/counters.py

    def rematch(
        self, start: datetime, end: datetime, *, any_age: bool = False, chunk: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Match again the listings that arrived in [start, end): a backfill, after a
        matcher fix or with ``any_age`` for filters newer than the listings. Existing
        notifications are never repeated (unique per user and listing); returns how many
        new ones were created. No claim is needed: every write is idempotent.
        ``progress`` is told how many listings each chunk held (``count_window`` gives
        the total)."""
        t = schema.listings
        created, after = 0, 0
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(t.c.id, t.c.source_id, t.c.title, t.c.summary, t.c.categories, t.c.ingested_at,
                              t.c.item_key)
                    .where(t.c.ingested_at >= start, t.c.ingested_at < end, t.c.id > after)
                    .order_by(t.c.id).limit(chunk)
                ).mappings().all()
            if not rows:
                return created
            after = rows[-1]["id"]
            index, channels = self._catalogue.current()
            matches = index.matches(_texts(rows), any_age=any_age)
            keys = {row["id"]: row["item_key"] for row in rows}
            with self.engine.begin() as conn:
                made = _insert_notifications(conn, matches, channels, keys)
                counters.add(conn, {(counters.NOTIFICATIONS_CREATED.name, ""): made})
            created += made
            if progress is not None:
                progress(len(rows))

    def count_window(self, start: datetime, end: datetime) -> int:
        """How many listings arrived in [start, end) (what ``rematch`` goes through)."""
        t = schema.listings
        with self.engine.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(t).where(t.c.ingested_at >= start, t.c.ingested_at < end)
            ).scalar_one())

    # -- delivery -----------------------------------------------------------------------

    def deliver(self, stats: NotifyStats, *, max_notifications: int | None = None) -> None:
        queue = WorkQueue(self.engine, schema.NOTIFICATIONS_DUE, lease_seconds=self.settings.lease_seconds)
        threads = self.settings.concurrency
        with Fetcher.from_settings(self.settings, threads=threads) as fetcher:
            channels = self.channels or {ChannelKind.WEBHOOK: WebhookChannel(fetcher), ChannelKind.APPRISE: AppriseChannel(fetcher.guard)}
            stats.claimed += work_claimed(
                queue, self.worker, threads=threads, max_rows=max_notifications,
                batch_size=self.delivery_batch,
                start=lambda claim: self._messages(queue, claim, stats),
                held=lambda job: (job[0], job[1]["id"]),
                work=lambda job: self._send(job, channels),
                write=lambda attempts: self._record(queue, attempts, stats),
                # A webhook is bounded by its deadline; Apprise's own HTTP has no overall one.
                max_work_seconds=4 * self.settings.http_timeout_seconds + 60,
            )

    def _messages(
        self, queue: WorkQueue, claim: Claim, stats: NotifyStats
    ) -> list[tuple[Claim, Row, Message | None]]:
        """The claimed notifications' messages; those claimed more often than
        ``delivery_max_attempts`` (every earlier sender died before recording an outcome)
        are dead at once, unsent."""
        limit = self.settings.delivery_max_attempts
        abandoned = [row for row in claim.rows if queue.spec.exhausted(row, limit)]
        if abandoned:
            now = datetime.now(UTC)
            self._record(queue, [
                Attempt(claim, row["id"], row["attempts"], DeliveryError(
                    f"claimed {row['attempts']} times, no send finished (the worker stopped"
                    f" while sending); last error: {row['last_error'] or 'none recorded'}",
                    code=WORKER_STOPPED,
                ), now, exhausted=True)
                for row in abandoned
            ], stats)
        gone = {row["id"] for row in abandoned}
        rows = [row for row in claim.rows if row["id"] not in gone]
        by_id = {m.notification_id: m for m in _load_messages(self.engine, [r["id"] for r in rows])}
        return [(claim, row, by_id.get(row["id"])) for row in rows]

    def _send(
        self, job: tuple[Claim, Row, Message | None], channels: Mapping[str, Channel]
    ) -> Attempt:
        claim, row, message = job
        error: DeliveryError | None = None
        started = time.monotonic()
        try:
            if message is None:
                raise DeliveryError("the user is disabled", code=FailureReason.INVALID_CONFIG)
            channels[message.channel].send(message)
        except DeliveryError as exc:
            error = exc
        except Exception as exc:  # a channel's bug must not stop the other deliveries
            log.exception("delivery of notification %s crashed", row["id"])
            error = DeliveryError(f"unexpected {type(exc).__name__}: {exc}", code=CHANNEL_BUG)
        log.debug("notification %s: %s in %d ms", row["id"], "sent" if error is None else error.message,
                  int((time.monotonic() - started) * 1000))
        return Attempt(claim, row["id"], row["attempts"], error, datetime.now(UTC), created_at=row["created_at"])

    def _record(self, queue: WorkQueue, attempts: Sequence[Attempt], stats: NotifyStats) -> None:
        """Record the attempts' outcomes (fenced). Deliveries are recorded on the pool's
        writer thread, notifications that end unsent on the claiming thread
        (``_messages``): one at a time, so ``stats`` is counted right."""
        with self._recording:
            self._record_now(queue, attempts, stats)

    def _record_now(self, queue: WorkQueue, attempts: Sequence[Attempt], stats: NotifyStats) -> None:
        completions = []
        for a in attempts:
            values: dict[str, Any] = {}
            if a.error is None:
                values.update(status=NotificationStatus.SENT, sent_at=a.finished, last_error=None)
            elif a.exhausted or a.attempts >= self.settings.delivery_max_attempts:
                values.update(status=NotificationStatus.DEAD, last_error=a.error.message)
            else:
                values.update(
                    status=NotificationStatus.FAILED, last_error=a.error.message,
                    next_attempt_at=delivery_retry_at(a.attempts, a.finished, self.random_unit(), a.error.retry_after),
                )
            completions.append(RowCompletion(a.claim, a.notification_id, values))
        with self.engine.begin() as conn:
            fenced = queue.complete_each(completions, conn=conn)
            counters.add(conn, _delivery_counts(attempts, completions, set(fenced.done)))
        done = set(fenced.done)
        stats.fenced_out += len(fenced.lost)
        for a, c in zip(attempts, completions, strict=True):
            if a.notification_id not in done:
                continue
            status = c.values["status"]
            stats.sent += status == NotificationStatus.SENT
            stats.retrying += status == NotificationStatus.FAILED
            stats.dead += status == NotificationStatus.DEAD
            if a.error is not None:
                stats.errors[a.error.code] += 1
                log.warning("notification %s failed (attempt %d, now %s): %s",
                            a.notification_id, a.attempts, status, a.error.message)


_OUTCOME = {NotificationStatus.SENT: "sent", NotificationStatus.FAILED: "retrying", NotificationStatus.DEAD: "dead"}


def _delivery_counts(
    attempts: Sequence[Attempt], completions: Sequence[RowCompletion], done: set[int]
) -> counters.Counts:
    """The counts of the attempts recorded (``done``): outcomes, and the latency of those sent."""
    counts = counters.tally()
    for a, c in zip(attempts, completions, strict=True):
        if a.notification_id not in done:
            continue
        status = c.values["status"]
        counters.DELIVERIES.count(counts, value=_OUTCOME[status])
        if status == NotificationStatus.SENT and a.created_at is not None:
            counters.DELIVERY_LATENCY.observe(counts, max(0.0, (a.finished - a.created_at).total_seconds()))
    return counts


# A filter whose transaction commits this long after it began (its created_at) is still
# picked up by the next incremental read; no CLI or API transaction comes near it.
_RECENT_MARGIN = timedelta(minutes=10)


@dataclass
class FilterCatalogue:
    """The enabled filters of enabled users, kept between the batches of a pass.

    Reading every filter again for every batch of listings cost a fifth of the matching
    pass at 10,000 filters (bench/RESULTS.md, matching). So before each batch only the
    filters created recently are read (from the newest ``created_at`` seen, less
    ``_RECENT_MARGIN``, so a filter whose transaction committed out of order is found
    too): a new filter applies from the next batch on, as before. Everything is read
    again every ``full_reload_seconds``: that is how long a disabled filter or user can
    still match (delivery checks the user again when it sends).
    """

    engine: Engine
    full_reload_seconds: float = 60.0
    _channels: dict[int, str] = field(default_factory=dict)
    _newest: datetime | None = None
    _loaded_at: float | None = None
    # Kept between batches: a new filter is filed into it, not every filter again. The
    # word rarity it learned outlives each full reload, which files every filter anew.
    _index: FilterIndex = field(default_factory=FilterIndex)

    def current(self) -> tuple[FilterIndex, dict[int, str]]:
        """The filters as an index, and each user's channel."""
        now = time.monotonic()
        if self._loaded_at is None or now - self._loaded_at >= self.full_reload_seconds:
            self._channels, self._newest = {}, None
            self._index = FilterIndex(rarity=self._index.rarity)
            self._add(load_filters(self.engine))
            self._loaded_at = now
        elif self._newest is not None:
            self._add(load_filters(self.engine, created_since=self._newest - _RECENT_MARGIN))
        else:  # there were no filters at all: any is new
            self._add(load_filters(self.engine))
        return self._index, self._channels

    def _add(self, loaded: list[tuple[Filter, str]]) -> None:
        for f, channel in loaded:
            self._channels[f.user_id] = channel
            if f.created_at is not None and (self._newest is None or f.created_at > self._newest):
                self._newest = f.created_at
        self._index.add(f for f, _ in loaded)


def load_filters(engine: Engine, *, created_since: datetime | None = None) -> list[tuple[Filter, str]]:
    """The enabled filters of enabled users (created at or after ``created_since``), each
    with its user's channel."""
    f, u = schema.filters, schema.users
    query = (
        sa.select(f.c.id, f.c.user_id, f.c.keywords, f.c.source_id, f.c.category, f.c.created_at, u.c.channel)
        .join(u, u.c.id == f.c.user_id)
        .where(f.c.enabled, u.c.enabled)
    )
    if created_since is not None:
        query = query.where(f.c.created_at >= created_since)
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    return [
        (Filter(id=r.id, user_id=r.user_id, keywords=tuple(r.keywords), source_id=r.source_id,
                category=r.category.casefold() if r.category else None, created_at=r.created_at),
         r.channel)
        for r in rows
    ]


def _insert_notifications(
    conn: sa.Connection, matches: Sequence[Match], channels: Mapping[int, str],
    item_keys: Mapping[int, str | None],
) -> int:
    """A pending notification per match, by its user's channel. A user who already has
    one for the listing, or for the same item carried by another source (its item key,
    pipeline/core/urls.py), gets none. Returns how many were created."""
    rows = [
        {"user_id": m.user_id, "listing_id": m.listing_id, "filter_id": m.filter_id,
         "channel": channels[m.user_id], "item_key": item_keys.get(m.listing_id)}
        for m in matches
    ]
    return insert_ignoring_conflicts(conn, schema.notifications, rows, ANY_UNIQUE_KEY)


def _texts(rows: Sequence[Row]) -> Iterator[ListingText]:
    for row in rows:
        yield ListingText(
            id=row["id"], source_id=row["source_id"], title=row["title"], summary=row["summary"],
            categories=row["categories"] or (), ingested_at=row["ingested_at"],
        )


def _load_messages(engine: Engine, ids: Sequence[int]) -> list[Message]:
    """The messages of notifications ``ids`` whose user is enabled (one query)."""
    n, u, f, listings = schema.notifications, schema.users, schema.filters, schema.listings
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                n.c.id, u.c.id.label("user_id"), u.c.name, u.c.channel, u.c.channel_url, u.c.secret,
                f.c.id.label("filter_id"), f.c.keywords,
                listings.c.id.label("listing_id"), listings.c.url, listings.c.title,
                listings.c.summary, listings.c.published_at, listings.c.source_id,
            )
            .select_from(n.join(u, u.c.id == n.c.user_id).join(listings, listings.c.id == n.c.listing_id)
                         .outerjoin(f, f.c.id == n.c.filter_id))
            .where(n.c.id.in_(list(ids)), u.c.enabled)
        ).all()
    return [
        Message(
            notification_id=r.id, user_id=r.user_id, user_name=r.name, channel=r.channel,
            channel_url=r.channel_url, secret=r.secret, filter_id=r.filter_id,
            keywords=list(r.keywords or []),
            listing={
                "id": r.listing_id, "url": r.url, "title": r.title, "summary": r.summary,
                "published_at": r.published_at.isoformat() if r.published_at else None,
                "source_id": r.source_id,
            },
        )
        for r in rows
    ]

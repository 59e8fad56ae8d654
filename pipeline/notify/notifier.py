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
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import backend_for, in_transaction
from pipeline.core import heap
from pipeline.core.errors import DeliveryError, UserError
from pipeline.core.failures import WORKER_STOPPED, FailureReason
from pipeline.core.kinds import NotificationStatus
from pipeline.core.redact import channel_digest
from pipeline.core.settings import Settings
from pipeline.core.words import folded
from pipeline.net.http import Fetcher
from pipeline.notify import delivery
from pipeline.notify.delivery import Channel, Item, Message, attempt_outcome
from pipeline.notify.matching import Filter, FilterIndex, ListingText, Match
from pipeline.notify.query import Query, QueryError, as_written, compile_query
from pipeline.notify.schedule import DeliveryPlan, filter_digest
from pipeline.notify.source_alerts import SourceAlerts
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import Claim, Fenced, Row, RowCompletion
from pipeline.queue.workpool import work_claimed
from pipeline.storage import counters, schema, watches
from pipeline.storage.bulk import ANY_UNIQUE_KEY, insert_ignoring_conflicts
from pipeline.storage.rows import NotificationRow, UnmatchedRow
from pipeline.storage.status import records

log = logging.getLogger("pipeline.notify.notifier")

# The most notifications one digest lists; the rest go into the next, made at once.
DIGEST_MAX_ITEMS = 500


class Recipient(NamedTuple):
    """How a filter's matches are told: the channel, and when (pipeline/notify/schedule.py);
    its user's own way where the filter has none of its own (``filters route``).
    ``user``: the user's own way, where this is the filter's."""

    channel: str
    plan: DeliveryPlan
    user: Recipient | None = None


@dataclass
class Recipients:
    """How each loaded filter's matches are told, and each of their users' own way (for
    a change alert whose filter is gone)."""

    by_filter: dict[int, Recipient] = field(default_factory=dict)
    by_user: dict[int, Recipient] = field(default_factory=dict)

    def add(self, f: Filter, recipient: Recipient) -> None:
        self.by_filter[f.id] = recipient
        self.by_user[f.user_id] = recipient.user or recipient

    def of(self, user_id: int, filter_id: int | None) -> Recipient:
        """A match's way: its filter's, else (a filter not loaded, or gone) its user's."""
        found = self.by_filter.get(filter_id) if filter_id is not None else None
        return found or self.by_user[user_id]

    def __contains__(self, user_id: object) -> bool:
        return user_id in self.by_user


def recipient(
    user_id: int, channel: str, digest: str | None, quiet: str | None, timezone: str | None, *,
    own_channel: str | None = None, mode: str | None = None,
) -> Recipient:
    """How a filter's matches are told: through its own channel (``own_channel``) or its
    user's, by its mode (pipeline/notify/schedule.py ``filter_digest``) or its user's plan."""
    user = Recipient(channel, delivery_plan(user_id, digest, quiet, timezone))
    if own_channel is None and mode is None:
        return user
    return Recipient(own_channel or channel, delivery_plan(user_id, filter_digest(mode, digest), quiet, timezone), user)


def delivery_plan(user_id: int, digest: str | None, quiet: str | None, timezone: str | None) -> DeliveryPlan:
    """The user's plan; one stored malformed (by hand) is logged and read as immediate."""
    try:
        return DeliveryPlan.parse(digest, quiet, timezone)
    except UserError as exc:
        log.error("user %s: delivery settings ignored (%s): notified at once", user_id, exc)
        return DeliveryPlan()


@dataclass
class NotifyStats:
    listings_matched: int = 0
    notifications_created: int = 0
    claimed: int = 0  # notifications claimed for delivery
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    fenced_out: int = 0
    digests_made: int = 0
    digests_sent: int = 0  # (their notifications count in ``sent``)
    deferred: int = 0  # due in their user's quiet hours, or for a channel gone: held until they end
    channels_gone: int = 0  # sends answered 410 Gone: their channel is held (delivery.GONE_RETRY)
    filters_failed: int = 0  # left out of matching: their query or its matching failed
    batched: int = 0  # alerts past their user's limit, held for the window's summary
    # what sources' owners were told (pipeline/notify/source_alerts.py): sent, to be
    # retried, given up
    source_alerts_sent: int = 0
    source_alerts_retrying: int = 0
    source_alerts_dead: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        totals = asdict(self)
        totals["errors"] = dict(self.errors)
        return totals


@dataclass
class Attempt:
    """One delivery attempt's outcome."""

    claim: Claim[NotificationRow]
    notification_id: int
    attempts: int  # counting this one (the claim counts it)
    error: DeliveryError | None
    finished: datetime
    exhausted: bool = False  # claimed too often: dead whatever ``attempts`` says
    created_at: datetime | None = None  # the notification's, for the delivery latency
    members: tuple[int, ...] = ()  # the other notifications of the digest it carries
    deferred_until: datetime | None = None  # quiet hours, a channel gone: not sent, not an attempt
    digest: bool = False
    user_id: int | None = None  # whose channel it went to, and its digest (redact.channel_digest)
    channel: str | None = None


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
    # The filters, kept between passes when given: a run making a pass every second (a
    # lingering ingest run's follow-ups) would otherwise read and compile every filter
    # for each. One pass at a time uses it.
    catalogue: FilterCatalogue | None = None
    _catalogue: FilterCatalogue = field(init=False)
    # Channels gone a day ago whose notifications are sent again to see: one that takes
    # it is no longer gone (``_write_gone``).
    _trying_gone: set[str] = field(default_factory=set, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._catalogue = self.catalogue if self.catalogue is not None else FilterCatalogue(self.engine)
        self.limits = AlertLimits(self.settings.alert_limit, timedelta(minutes=self.settings.alert_window_minutes))

    @records("notifier")
    def run(self, *, max_listings: int | None = None, max_notifications: int | None = None,
            matching: bool = True, delivering: bool = True) -> NotifyStats:
        """Match the listings not matched yet, then deliver what is due (one of the two
        only when the other is turned off: a lingering run does each on its own thread)."""
        heap.settle()  # once per process: what it imported, out of the collector's sight
        stats = NotifyStats()
        if matching:
            self.match(stats, max_listings=max_listings)
        if delivering:
            self.deliver(stats, max_notifications=max_notifications)
        return stats

    # -- matching -----------------------------------------------------------------------

    def match(self, stats: NotifyStats, *, max_listings: int | None = None) -> None:
        queue = WorkQueue(self.engine, schema.LISTINGS_UNMATCHED, lease_seconds=self.settings.lease_seconds,
                          columns=(*MATCHED_COLUMNS, *watches.ALERT_COLUMNS), row=UnmatchedRow)
        claimed = 0  # the cap counts rows claimed: rows lost to another worker count too
        while max_listings is None or claimed < max_listings:
            limit = min(self.match_batch, max_listings - claimed) if max_listings else self.match_batch
            claim = queue.claim(self.worker, limit)
            if not claim:
                return
            claimed += len(claim)
            # Filters are brought up to date after the claim: every filter committed
            # before these listings were claimed takes part.
            index, recipients = self._catalogue.current()
            matches = index.matches(_texts(claim.rows))
            failures = self._catalogue.take_failures()
            stats.filters_failed += sum(map(len, failures.values()))
            fenced, created = in_transaction(
                self.engine, partial(_write_matches, queue=queue, claim=claim, matches=matches,
                                     recipients=recipients, watching=self._catalogue.watching,
                                     failures=failures, limits=self.limits))
            stats.fenced_out += len(fenced.lost)
            stats.listings_matched += len(fenced.done)
            stats.notifications_created += created.total
            stats.batched += created.batched

    def rematch(
        self, start: datetime, end: datetime, *, any_age: bool = False, chunk: int = 1000,
        progress: Callable[[int], None] | None = None, filter_ids: Collection[int] | None = None,
        where: sa.ColumnElement[bool] | None = None,
    ) -> int:
        """Match again the listings that arrived in [start, end): a backfill, after a
        matcher fix or with ``any_age`` for filters newer than the listings. Existing
        notifications are never repeated (unique per user and listing); returns how many
        new ones were created. No claim is needed: every write is idempotent.
        ``progress`` is told how many listings each chunk held (``count_window`` gives
        the total). ``filter_ids``: only these filters (a new filter's history: ``filters
        add --backfill``), and ``where`` narrows the listings read to a condition every
        listing they match meets (pipeline/catalogue/workbench.py ``candidates``)."""
        t = schema.listings
        created, after = 0, 0
        only = None
        if filter_ids is not None:
            loaded = load_filters(self.engine, ids=filter_ids)
            chosen = Recipients()
            for f, r in loaded:
                chosen.add(f, r)
            only = FilterIndex(f for f, _ in loaded), chosen
        while True:
            with self.engine.connect() as conn:
                rows = conn.execute(
                    sa.select(t.c.id, t.c.price, *(t.c[name] for name in MATCHED_COLUMNS))
                    .where(t.c.ingested_at >= start, t.c.ingested_at < end, t.c.id > after,
                           *(() if where is None else (where,)))
                    .order_by(t.c.id).limit(chunk)
                ).mappings().all()
            if not rows:
                return created
            after = rows[-1]["id"]
            index, recipients = only or self._catalogue.current()
            matches = index.matches(_texts(rows), any_age=any_age)
            with self.engine.begin() as conn:
                made = _insert_notifications(conn, matches, recipients, _stories(rows), limits=self.limits)
                counts = _record_failures(conn, self._catalogue.take_failures())
                counters.NOTIFICATIONS_CREATED.count(counts, made.total)
                if made.batched:
                    counters.NOTIFICATIONS_BATCHED.count(counts, made.batched)
                counters.add(conn, counts)
            created += made.total
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

    def make_digests(self, stats: NotifyStats, *, now: datetime | None = None) -> None:
        """Gather each user's held notifications whose time has come (``next_attempt_at``,
        set from the user's plan when they were made) into one digest per place they go
        (the user's channel, or a routed filter's own: ``filters route``): the first of them
        carries it and goes into the delivery queue; the rest stay held, marked with its
        id, until it is sent. A notification joins one digest only: it is assigned while
        unassigned, by one transaction per user that holds the user's row (other
        notifiers skip that user meanwhile). One that arrives later joins the next."""
        n, u, f = schema.notifications, schema.users, schema.filters
        now = now or datetime.now(UTC)
        due = sa.and_(n.c.status == NotificationStatus.HELD, n.c.digest_id.is_(None), n.c.next_attempt_at <= now)
        # Where each goes: its filter's own channel (one digest per such filter), else its
        # user's (one digest for all the rest).
        route = sa.case((f.c.channel_url.is_not(None), n.c.filter_id), else_=sa.null())
        held = n.outerjoin(f, f.c.id == n.c.filter_id)
        with self.engine.connect() as conn:
            destinations = conn.execute(sa.select(n.c.user_id, route).select_from(held).where(due).distinct()).all()
        for user_id, routed in destinations:
            with self.engine.begin() as conn:
                if conn.execute(sa.select(u.c.id).where(u.c.id == user_id)
                                .with_for_update(skip_locked=True)).first() is None:
                    continue  # another notifier is making this user's digest
                ids = conn.execute(sa.select(n.c.id).select_from(held).where(
                    due, n.c.user_id == user_id, route.is_(None) if routed is None else route == routed)
                    .order_by(n.c.id).limit(DIGEST_MAX_ITEMS)).scalars().all()
                if not ids:
                    continue
                head = ids[0]
                conn.execute(sa.update(n).where(n.c.id.in_(ids), n.c.digest_id.is_(None)).values(digest_id=head))
                conn.execute(sa.update(n).where(n.c.id == head, n.c.digest_id == head)
                             .values(status=NotificationStatus.PENDING, next_attempt_at=sa.func.current_timestamp()))
            stats.digests_made += 1

    def deliver(self, stats: NotifyStats, *, max_notifications: int | None = None) -> None:
        self.make_digests(stats)
        queue = WorkQueue(self.engine, schema.NOTIFICATIONS_DUE, lease_seconds=self.settings.lease_seconds,
                          row=NotificationRow)
        threads = self.settings.concurrency
        with Fetcher.from_settings(self.settings, threads=threads) as fetcher:
            channels = self.channels or delivery.channels(fetcher)
            stats.claimed += work_claimed(
                queue, self.worker, threads=threads, max_rows=max_notifications,
                batch_size=self.delivery_batch,
                start=lambda claim: self._messages(queue, claim, stats),
                held=lambda job: (job[0], job[1]["id"]),
                work=lambda job: self._send(job, channels),
                write=lambda attempts: self._record(queue, attempts, stats),
                # A webhook is bounded by its deadline; Apprise's own HTTP has no overall one.
                max_work_seconds=4 * self.settings.http_timeout_seconds + 60,
                record_at_once=True,  # a message sent is recorded before many others go
            )
            told = SourceAlerts(self.engine, self.settings, self.worker, self.random_unit).deliver(
                channels, threads=threads)
        stats.source_alerts_sent += told.sent
        stats.source_alerts_retrying += told.retrying
        stats.source_alerts_dead += told.dead
        stats.fenced_out += told.fenced_out

    def _messages(
        self, queue: WorkQueue[NotificationRow], claim: Claim[NotificationRow], stats: NotifyStats
    ) -> list[tuple[Claim[NotificationRow], NotificationRow, Message | None]]:
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
        by_id = {m.notification_id: m for m in load_messages(self.engine, [r["id"] for r in rows])}
        # Quiet hours began after these were made (or this is a retry): they wait for
        # the end, a notification to join that digest, a digest to go out then.
        now = datetime.now(UTC)
        quiet = {
            row["id"]: until for row in rows
            if (m := by_id.get(row["id"])) is not None and (until := m.plan.quiet_end(now)) is not None
        }
        quiet.update(self._gone(by_id, now, exclude=quiet))
        if quiet:
            self._record(queue, [
                Attempt(claim, row["id"], row["attempts"], None, now, deferred_until=quiet[row["id"]],
                        digest=by_id[row["id"]].is_digest)
                for row in rows if row["id"] in quiet
            ], stats)
        return [(claim, row, by_id.get(row["id"])) for row in rows if row["id"] not in quiet]

    def _gone(self, by_id: Mapping[int, Message], now: datetime, exclude: Collection[int]) -> dict[int, datetime]:
        """The messages whose channel is gone, each held until a day after it was found
        gone (``delivery.GONE_RETRY``), unsent; those whose day is over go, to see, and
        their channel is remembered in ``_trying_gone``."""
        digests = {channel_digest(m.channel_url) for i, m in by_id.items() if i not in exclude}
        if not digests:
            return {}
        g = schema.gone_channels
        with self.engine.connect() as conn:
            until = {digest: gone_at + delivery.GONE_RETRY for digest, gone_at in conn.execute(
                sa.select(g.c.digest, g.c.gone_at).where(g.c.digest.in_(sorted(digests))))}
        self._trying_gone.update(digest for digest, at in until.items() if at <= now)
        return {i: at for i, m in by_id.items() if i not in exclude
                and (at := until.get(channel_digest(m.channel_url))) is not None and at > now}

    def _send(
        self, job: tuple[Claim[NotificationRow], NotificationRow, Message | None], channels: Mapping[str, Channel]
    ) -> Attempt:
        claim, row, message = job
        started = time.monotonic()
        error = (DeliveryError("the user is disabled", code=FailureReason.INVALID_CONFIG) if message is None
                 else delivery.send(channels, message, f"notification {row['id']}"))
        log.debug("notification %s: %s in %d ms", row["id"], "sent" if error is None else error.message,
                  int((time.monotonic() - started) * 1000))
        members = tuple(i.notification_id for i in message.items[1:]) if message is not None else ()
        finished = datetime.now(UTC)
        return Attempt(claim, row["id"], row["attempts"], error, finished, created_at=row["created_at"],
                       members=members, digest=message is not None and message.is_digest,
                       deferred_until=finished + delivery.GONE_RETRY if delivery.gone(error) else None,
                       user_id=message.user_id if message is not None else None,
                       channel=channel_digest(message.channel_url) if message is not None else None)

    def _record(self, queue: WorkQueue[NotificationRow], attempts: Sequence[Attempt], stats: NotifyStats) -> None:
        """Record the attempts' outcomes (fenced). Deliveries are recorded on the pool's
        writer thread, notifications that end unsent on the claiming thread
        (``_messages``): one at a time, so ``stats`` is counted right."""
        with self._recording:
            self._record_now(queue, attempts, stats)

    def _record_now(self, queue: WorkQueue[NotificationRow], attempts: Sequence[Attempt], stats: NotifyStats) -> None:
        completions = []
        for a in attempts:
            values: dict[str, Any] = {}
            if a.deferred_until is not None:  # not an attempt: its claim's count is undone
                values.update(next_attempt_at=a.deferred_until, attempts=max(0, a.attempts - 1))
                if a.error is not None:  # its channel is gone
                    values["last_error"] = a.error.message
                if not a.digest:
                    values.update(status=NotificationStatus.HELD, digest_id=None)
            else:
                values.update(attempt_outcome(a.error, a.attempts, a.finished, final=a.exhausted,
                                              max_attempts=self.settings.delivery_max_attempts, u=self.random_unit()))
            completions.append(RowCompletion(a.claim, a.notification_id, values))
        def write(conn: sa.Connection) -> Fenced:
            fenced = queue.complete_each(completions, conn=conn)
            done = set(fenced.done)
            self._write_gone(conn, [a for a in attempts if a.notification_id in done])
            _settle_digests(conn, attempts, completions, done)
            counters.add(conn, _delivery_counts(attempts, completions, done))
            return fenced

        # Sent messages whose outcomes the database could not take (restarting) are
        # written when it is back, within their lease, not sent again when it runs out.
        fenced = in_transaction(self.engine, write, outlast=queue.lease.total_seconds())
        done = set(fenced.done)
        stats.fenced_out += len(fenced.lost)
        for a, c in zip(attempts, completions, strict=True):
            if a.notification_id not in done:
                continue
            if a.deferred_until is not None:
                stats.deferred += 1
                if delivery.gone(a.error):
                    stats.channels_gone += 1
                    log.warning("notification %s held: its channel is gone (%s); held until %s or the channel"
                                " is set again", a.notification_id, a.error.message if a.error else "",
                                f"{a.deferred_until:%Y-%m-%d %H:%M} UTC")
                continue
            status = c.values["status"]
            stats.sent += (status == NotificationStatus.SENT) * (1 + len(a.members))
            stats.digests_sent += status == NotificationStatus.SENT and a.digest
            stats.retrying += status == NotificationStatus.FAILED
            stats.dead += status == NotificationStatus.DEAD
            if a.error is not None:
                stats.errors[a.error.code] += 1
                log.warning("notification %s failed (attempt %d, now %s): %s",
                            a.notification_id, a.attempts, status, a.error.message)

    def _write_gone(self, conn: sa.Connection, attempts: Sequence[Attempt]) -> None:
        """Remember the channels that answered 410 Gone (each with when and whose), and
        forget those tried again after their day that took the notification."""
        g = schema.gone_channels
        found = {a.channel: a for a in attempts if delivery.gone(a.error) and a.channel and a.user_id is not None}
        if found:
            backend_for(conn).upsert(conn, g, [
                {"digest": digest, "user_id": a.user_id, "gone_at": a.finished,
                 "error": a.error.message if a.error else ""} for digest, a in sorted(found.items())], ["digest"])
        back = {a.channel for a in attempts if a.error is None and a.deferred_until is None
                and a.channel in self._trying_gone}
        if back:
            conn.execute(sa.delete(g).where(g.c.digest.in_(sorted(back))))
            self._trying_gone.difference_update(back)


GONE_BATCH_SPAN = timedelta(hours=1)


def release_gone(conn: sa.Connection, url: str) -> int:
    """The channel ``url`` was set again (the receiver brought back, or a new one):
    it is no longer gone, and the notifications held for it go at the next pass.
    Returns how many were held."""
    g, n = schema.gone_channels, schema.notifications
    digest = channel_digest(url)
    row = conn.execute(sa.select(g.c.user_id, g.c.gone_at).where(g.c.digest == digest)).first()
    if row is None:
        return 0
    conn.execute(sa.delete(g).where(g.c.digest == digest))
    # Held for it (a digest carrying them, pending): until a day after it was found gone
    # (``Notifier._gone``), or after the send that found it (``_send``: a batch's sends
    # end within seconds of each other).
    until = row.gone_at + delivery.GONE_RETRY
    return int(conn.execute(sa.update(n).where(
        n.c.user_id == row.user_id, n.c.status.in_([NotificationStatus.HELD, NotificationStatus.PENDING]),
        n.c.next_attempt_at.between(until - GONE_BATCH_SPAN, until + GONE_BATCH_SPAN),
    ).values(next_attempt_at=schema.now_sql(conn))).rowcount)


_OUTCOME = {NotificationStatus.SENT: "sent", NotificationStatus.FAILED: "retrying", NotificationStatus.DEAD: "dead"}


def _write_matches(
    conn: sa.Connection, *, queue: WorkQueue[UnmatchedRow], claim: Claim[UnmatchedRow], matches: Sequence[Match],
    recipients: Recipients, watching: Collection[int],
    failures: Mapping[str, Mapping[int, str]], limits: AlertLimits,
) -> tuple[Fenced, Created]:
    """Mark the claimed listings matched (fenced), notify the matches of those still
    held, and, where filters watch for changes, their change alerts and new watches
    (pipeline/storage/watches.py); record the filters that failed (``_record_failures``).
    Returns the fence's outcome and how many notifications were created."""
    fenced = queue.complete(claim, {"matched_at": datetime.now(UTC)}, conn=conn)
    done = set(fenced.done)
    rows = [row for row in claim.rows if row["id"] in done]
    kept = [m for m in matches if m.listing_id in done]
    changes = [a for a in watches.alerts(conn, rows) if a.user_id in recipients] if watching else []
    watches.heard(conn, changes)
    created = _insert_notifications(conn, kept, recipients, _stories(rows), changes, limits=limits)
    if watching:
        by_id = {row["id"]: row for row in rows}
        watches.watch(conn, [
            watches.Watch(m.user_id, m.listing_id, by_id[m.listing_id]["source_id"], m.filter_id,
                          watches.version(by_id[m.listing_id]), by_id[m.listing_id]["price"])
            for m in kept if m.filter_id in watching
        ])
    counts = _record_failures(conn, failures)
    counters.LISTINGS_MATCHED.count(counts, len(done))
    counters.NOTIFICATIONS_CREATED.count(counts, created.total)
    if created.batched:
        counters.NOTIFICATIONS_BATCHED.count(counts, created.batched)
    counters.add(conn, counts)  # last: see pipeline/storage/counters.py
    return fenced, created


def _record_failures(conn: sa.Connection, failures: Mapping[str, Mapping[int, str]]) -> counters.Counts:
    """Keep on each filter left out why and when (``filters.error``, ``failed_at``: what
    `pipeline status`, `filters list`, the metrics and the asset check show); returns
    the counts of them, by stage."""
    counts = counters.tally()
    f, now = schema.filters, datetime.now(UTC)
    for stage, found in failures.items():
        if not found:
            continue
        for filter_id, why in sorted(found.items()):
            conn.execute(sa.update(f).where(f.c.id == filter_id).values(error=why[:500], failed_at=now))
        counters.FILTER_FAILURES.count(counts, len(found), stage)
    return counts


def _settle_digests(
    conn: sa.Connection, attempts: Sequence[Attempt], completions: Sequence[RowCompletion], done: set[int]
) -> None:
    """A digest's other notifications share its outcome once it is sent or dead (in the
    transaction that records it); while it is retried they stay held."""
    n = schema.notifications
    for a, c in zip(attempts, completions, strict=True):
        status = c.values.get("status")
        if a.notification_id not in done:
            continue
        values = {k: v for k, v in c.values.items() if k in ("status", "sent_at", "last_error")}
        if status == NotificationStatus.SENT and a.members:
            conn.execute(sa.update(n).where(n.c.id.in_(a.members), n.c.digest_id == a.notification_id)
                         .values(values))
        elif status == NotificationStatus.DEAD:  # its message may not have been read: by its id
            conn.execute(sa.update(n).where(n.c.digest_id == a.notification_id, n.c.id != a.notification_id)
                         .values(values))


def _delivery_counts(
    attempts: Sequence[Attempt], completions: Sequence[RowCompletion], done: set[int]
) -> counters.Counts:
    """The counts of the attempts recorded (``done``): outcomes, and the latency of those sent."""
    counts = counters.tally()
    for a, c in zip(attempts, completions, strict=True):
        if a.notification_id not in done or a.deferred_until is not None:
            continue
        status = c.values["status"]
        counters.DELIVERIES.count(counts, value=_OUTCOME[status])
        if status == NotificationStatus.SENT and a.created_at is not None:
            counters.DELIVERY_LATENCY.observe(counts, max(0.0, (a.finished - a.created_at).total_seconds()))
    return counts


# A filter whose transaction commits this long after it began (its created_at) is still
# picked up by the next incremental read; no CLI or API transaction comes near it.
_RECENT_MARGIN = timedelta(minutes=10)
# More new filters than this at one look (a bulk import): everything is read again, one
# statement instead of an IN list of every new id.
_NEW_AT_ONCE = 500


@dataclass
class FilterCatalogue:
    """The enabled filters of enabled users, kept between the batches of a pass.

    Reading every filter again for every batch of listings cost a fifth of the matching
    pass at 10,000 filters (bench/RESULTS.md, matching). So before each batch only the
    ids of the filters created since the previous look (by the database's clock, less
    ``_RECENT_MARGIN``, so a filter whose transaction committed out of order is found
    too) are read, and the rows of those not seen yet: a new filter applies from the
    next batch on, and a burst of filters (a bulk import) is read once, not at every
    batch for as long as it is the newest. Everything is read again every
    ``full_reload_seconds``: that is how long a disabled filter or user can still match
    (delivery checks the user again when it sends).
    """

    engine: Engine
    full_reload_seconds: float = 60.0
    _recipients: Recipients = field(default_factory=Recipients)
    # Compiled queries by their text, kept across reloads: at 1,000,000 filters compiling
    # every one again (30-60 us each) would take most of a core.
    _compiled: dict[str, Query] = field(default_factory=dict)
    # The database's clock at the previous look, and the filters read since the last
    # full reload (those left out too: a query that does not compile is not tried and
    # logged at every batch, but at the next full reload).
    _looked_at: datetime | None = None
    _seen: set[int] = field(default_factory=set)
    _loaded_at: float | None = None
    # Kept between batches: a new filter is filed into it, not every filter again. The
    # word rarity it learned outlives each full reload, which files every filter anew.
    _index: FilterIndex = field(default_factory=FilterIndex)
    # The filters whose users hear of changes (`filters add --changes`).
    watching: set[int] = field(default_factory=set)
    # Filters left out since the last ``take_failures``: their query did not compile.
    failed: dict[int, str] = field(default_factory=dict)

    def current(self) -> tuple[FilterIndex, Recipients]:
        """The filters as an index, and how each one's matches are told."""
        now = time.monotonic()
        if (self._loaded_at is not None and self._looked_at is not None
                and now - self._loaded_at < self.full_reload_seconds):
            looked_at, ids = _look(self.engine, self._looked_at - _RECENT_MARGIN)
            new = [i for i in ids if i not in self._seen]
            if len(new) <= _NEW_AT_ONCE:
                if new:
                    self._add(load_filters(self.engine, ids=new, compiled=self._compiled, keep=self._compiled,
                                           failed=self.failed))
                    self._seen.update(new)  # those disabled meanwhile too: the full reload decides
                self._looked_at = looked_at
                return self._index, self._recipients
        self._recipients, self._seen, self.watching = Recipients(), set(), set()
        self._index = FilterIndex(rarity=self._index.rarity)
        kept, self._compiled = self._compiled, {}  # those of deleted filters go
        self._looked_at, _ = _look(self.engine, None)  # before the read: a filter it misses is new next time
        self._add(load_filters(self.engine, compiled=kept, keep=self._compiled, failed=self.failed))
        self._seen.update(self.failed)
        self._loaded_at = now
        return self._index, self._recipients

    def take_failures(self) -> dict[str, dict[int, str]]:
        """The filters left out since the last call, by stage (``load``: the query did not
        compile; ``match``: matching it raised), each with why."""
        loaded, self.failed = self.failed, {}
        return {"load": loaded, "match": self._index.take_failures()}

    def _add(self, loaded: list[tuple[Filter, Recipient]]) -> None:
        for f, recipient in loaded:
            self._recipients.add(f, recipient)
            self._seen.add(f.id)
            if f.changes:
                self.watching.add(f.id)
        self._index.add(f for f, _ in loaded)


def _enabled_filters(*columns: sa.ColumnElement[Any], enabled_only: bool = True) -> sa.Select[Any]:
    """``columns`` of the filters joined to their users; of enabled filters of enabled
    users only, unless not ``enabled_only``."""
    f, u = schema.filters, schema.users
    query = sa.select(*columns).select_from(f.join(u, u.c.id == f.c.user_id))
    return query.where(f.c.enabled, u.c.enabled) if enabled_only else query


def _look(engine: Engine, created_since: datetime | None) -> tuple[datetime, list[int]]:
    """The database's clock now, and the ids of the enabled filters of enabled users
    created at or after ``created_since`` (none asked for when it is None)."""
    with engine.connect() as conn:
        looked_at = conn.execute(sa.select(schema.now_sql(conn))).scalar_one()
        if created_since is None:
            return looked_at, []
        query = _enabled_filters(schema.filters.c.id)
        query = query.where(schema.filters.c.created_at >= created_since)
        return looked_at, list(conn.execute(query).scalars())


def load_filters(
    engine: Engine, *, compiled: Mapping[str, Query] | None = None,
    keep: dict[str, Query] | None = None, failed: dict[int, str] | None = None,
    ids: Collection[int] | None = None, enabled_only: bool = True,
) -> list[tuple[Filter, Recipient]]:
    """The enabled filters of enabled users (disabled ones too unless ``enabled_only``;
    those of ``ids`` only, when given), each with how its user is notified. A query
    found in ``compiled`` is not compiled again; each compiled query without
    ``source:`` (which depends on the sources' names) goes into ``keep``. A stored query that does not compile (written by a newer version, or
    before today's bounds) is left out, logged and put in ``failed`` with why: one
    filter never stops the others, whatever its compiling raises."""
    f, u = schema.filters, schema.users
    query = _enabled_filters(
        f.c.id, f.c.user_id, f.c.keywords, f.c.query, f.c.source_id, f.c.category, f.c.created_at,
        f.c.changes, f.c.channel_url.is_not(None).label("routed"), f.c.channel.label("own_channel"),
        f.c.mode, u.c.channel, u.c.digest, u.c.quiet_hours, u.c.timezone, enabled_only=enabled_only,
    )
    if ids is not None:
        query = query.where(f.c.id.in_(list(ids)))
    with engine.connect() as conn:
        rows = conn.execute(query).all()
        names = source_ids_by_name(conn) if any(r.query and "source:" in r.query.lower() for r in rows) else {}
    loaded = []
    for r in rows:
        try:
            expression = _compiled(r.query, names, compiled or {}, keep) if r.query else None
        except Exception as exc:  # RecursionError, a bug: this filter's, not the pass's
            why = str(exc) if isinstance(exc, QueryError) else f"{type(exc).__name__}: {exc}"
            log.error("filter %s is left out: its query %.200r does not compile: %s", r.id, r.query, why)
            if failed is not None:
                failed[r.id] = f"its query does not compile: {why}"
            continue
        loaded.append((
            Filter(id=r.id, user_id=r.user_id, keywords=tuple(r.keywords), source_id=r.source_id,
                   category=folded(r.category) if r.category else None, created_at=r.created_at,
                   query=expression, changes=r.changes),
            recipient(r.user_id, r.channel, r.digest, r.quiet_hours, r.timezone,
                      own_channel=r.own_channel if r.routed else None, mode=r.mode),
        ))
    return loaded


def _compiled(
    text: str, names: Mapping[str, frozenset[int]], compiled: Mapping[str, Query], keep: dict[str, Query] | None,
) -> Query:
    if "source:" in text.lower():
        return compile_query(text, names)
    query = compiled.get(text) or compile_query(text)
    if keep is not None:
        keep[text] = query
    return query


def source_ids_by_name(conn: sa.Connection) -> dict[str, frozenset[int]]:
    """Each source's name, case-folded and with its spaces collapsed (as ``source:``
    writes it), to the ids of the sources of that name."""
    s = schema.sources
    found: dict[str, set[int]] = {}
    for source_id, name in conn.execute(sa.select(s.c.id, s.c.name)):
        found.setdefault(folded(name), set()).add(source_id)
    return {name: frozenset(ids) for name, ids in found.items()}


@dataclass(frozen=True)
class AlertLimits:
    """How much one user hears one by one (PIPELINE_ALERT_LIMIT, PIPELINE_ALERT_WINDOW_MINUTES):
    at most ``per_window`` alerts in any ``window``, the rest held to go out together as
    one summary delivery (a digest) at the window's end, never dropped; and a listing's
    change alerts at most once a window, the message read when it is sent (its latest
    title, summary and price)."""

    per_window: int
    window: timedelta


class Created(NamedTuple):
    total: int  # notifications created
    batched: int  # of them, held past the user's limit (``AlertLimits``)


def _room(conn: sa.Connection, users: Collection[int], now: datetime, limits: AlertLimits) -> dict[int, int]:
    """How many more alerts each of ``users`` may hear one by one in the window ending
    now: the limit less those created in it that go (or went) out on their own.

    The users' rows are locked first, until the transaction that creates the alerts
    ends, in id order (no two notifiers wait on each other in a cycle): notifiers
    creating alerts for one user count one after the other, each seeing what the one
    before committed. Counted each on its own, three notifiers told one user 60 alerts
    where the limit was 20. (``FOR NO KEY UPDATE`` on PostgreSQL, so inserts naming
    the users go on; SQLite begins every transaction IMMEDIATE, one writer at a time.)"""
    if not users:
        return {}
    u, n = schema.users, schema.notifications
    conn.execute(sa.select(u.c.id).where(u.c.id.in_(sorted(users))).order_by(u.c.id)
                 .with_for_update(key_share=True)).all()
    heard: dict[int, int] = dict(conn.execute(
        sa.select(n.c.user_id, sa.func.count())
        .where(n.c.user_id.in_(sorted(users)), n.c.created_at >= now - limits.window, n.c.digest_id.is_(None),
               n.c.status != NotificationStatus.HELD)
        .group_by(n.c.user_id)
    ).all())
    return {user: max(0, limits.per_window - int(heard.get(user, 0))) for user in users}


def _spaced_changes(
    conn: sa.Connection, changes: Sequence[watches.Alert], now: datetime, limits: AlertLimits,
) -> list[tuple[watches.Alert, datetime | None]]:
    """The change alerts to create, each with when it may go out at the earliest (None:
    at once): a ``changed`` alert for a (user, listing) that has one not yet sent is left
    out (that one, read when it is sent, carries the latest content); one whose last was
    created within the window waits for the window's end. ``gone`` alerts, and changes
    under a price condition (not ``spaced``), go as they are."""
    changed = {a for a in changes if watches.event_kind(a.event) == watches.CHANGED and a.spaced}
    if not changed:
        return [(a, None) for a in changes]
    n = schema.notifications
    waiting_statuses = (NotificationStatus.PENDING, NotificationStatus.FAILED, NotificationStatus.HELD)
    recent: dict[tuple[int, int], tuple[datetime, bool]] = {}
    for user_id, listing_id, created_at, status in conn.execute(
        sa.select(n.c.user_id, n.c.listing_id, n.c.created_at, n.c.status)
        .where(n.c.listing_id.in_(sorted({a.listing_id for a in changed})),
               n.c.user_id.in_(sorted({a.user_id for a in changed})),
               n.c.event.like(f"{watches.CHANGED}:%"),
               # one still waiting, however old (held for a digest), or one of the window
               sa.or_(n.c.status.in_(waiting_statuses), n.c.created_at >= now - limits.window))
    ):
        last, waiting = recent.get((user_id, listing_id), (created_at, False))
        recent[(user_id, listing_id)] = (max(last, created_at), waiting or status in waiting_statuses)
    kept: list[tuple[watches.Alert, datetime | None]] = []
    for alert in changes:
        found = recent.get((alert.user_id, alert.listing_id)) if alert in changed else None
        if found is None:
            kept.append((alert, None))
        elif not found[1]:  # told within the window: once more at its end, with what it then is
            kept.append((alert, max(now, found[0] + limits.window)))
    return kept


def _insert_notifications(
    conn: sa.Connection, matches: Sequence[Match], recipients: Recipients,
    stories: Mapping[int, Story], changes: Sequence[watches.Alert] = (), *, limits: AlertLimits,
) -> Created:
    """A notification per match, and per change alert, by its filter's way (its own
    channel and mode, else its user's: ``Recipients``): pending,
    to go out at once, or held until the user's digest or the end of their quiet hours
    (its ``next_attempt_at``). A user who already has one for the listing, for the same
    item carried by another source (its item key, pipeline/core/urls.py), or for the
    same story (its cluster, pipeline/listings/stories.py), gets none; a change alert is
    told once per (user, listing, event). Past the user's ``limits`` an alert is held for
    the summary at the window's end (``AlertLimits``)."""
    now = datetime.now(UTC)
    spaced = _spaced_changes(conn, changes, now, limits)
    changes = [a for a, _ in spaced]
    not_before = {(a.user_id, a.listing_id): at for a, at in spaced if at is not None}
    told_by = {(m.user_id, m.filter_id) for m in matches} | {(a.user_id, a.filter_id) for a in changes}
    ways = {(user, filter_id): recipients.of(user, filter_id) for user, filter_id in told_by}
    release = {key: way.plan.release_at(now) for key, way in ways.items()}
    room = _room(conn, sorted({user for (user, _), until in release.items() if until is None}), now, limits)
    at_once, held, limited = [], [], []
    told: list[tuple[int, dict[str, Any]]] = [
        (m.user_id, {"listing_id": m.listing_id, "filter_id": m.filter_id, "event": watches.NEW,
                     "item_key": stories[m.listing_id].item_key, "cluster_id": stories[m.listing_id].cluster_id})
        for m in matches
    ] + [
        (a.user_id, {"listing_id": a.listing_id, "filter_id": a.filter_id, "event": a.event,
                     "item_key": None, "cluster_id": None})
        for a in changes
    ]
    for user_id, row in told:
        row |= {"user_id": user_id, "channel": ways[(user_id, row["filter_id"])].channel}
        until = release[(user_id, row["filter_id"])]
        if (later := not_before.get((user_id, row["listing_id"]))) is not None and row["event"] != watches.NEW:
            until = max(until or later, later)
        if until is not None:
            held.append(row | {"status": NotificationStatus.HELD, "next_attempt_at": until})
        elif room[user_id] > 0:
            room[user_id] -= 1
            at_once.append(row)
        else:  # past the limit: the window's summary carries it
            limited.append(row | {"status": NotificationStatus.HELD, "next_attempt_at": now + limits.window})
    made = [insert_ignoring_conflicts(conn, schema.notifications, part, ANY_UNIQUE_KEY) if part else 0
            for part in (at_once, held, limited)]
    return Created(sum(made), made[2] + sum(1 for a, at in spaced if at is not None))


class Story(NamedTuple):
    """What makes two listings one item, or one story, for a user (``_insert_notifications``)."""

    item_key: str | None
    cluster_id: int  # the listing's cluster, or its own id when it is a story's first


def _stories(rows: Iterable[Row]) -> dict[int, Story]:
    return {row["id"]: Story(row["item_key"], row["cluster_id"] or row["id"]) for row in rows}


# The listing columns matching reads, besides ``id``: ``_texts``' and ``_stories``'.
MATCHED_COLUMNS = ("source_id", "title", "summary", "categories", "ingested_at", "author", "published_at",
                   "fields", "item_key", "cluster_id")


def _texts(rows: Sequence[Row]) -> Iterator[ListingText]:
    return map(ListingText.of, rows)


def load_messages(engine: Engine, ids: Sequence[int]) -> list[Message]:
    """The messages of notifications ``ids`` whose user is enabled: each its own item,
    or, for one that carries a digest, every notification of the digest (two queries)."""
    n, u, f, listings, s = schema.notifications, schema.users, schema.filters, schema.listings, schema.sources
    item_columns = (
        n.c.event, f.c.id.label("filter_id"), f.c.keywords, f.c.query, f.c.channel.label("own_channel"),
        f.c.channel_url.label("own_channel_url"), f.c.secret.label("own_secret"), f.c.mode,
        listings.c.id.label("listing_id"),
        listings.c.item_key, listings.c.url,
        listings.c.title, listings.c.summary, listings.c.published_at, listings.c.source_id, listings.c.price,
        listings.c.fields, s.c.site_url,
    )
    joined = (n.join(listings, listings.c.id == n.c.listing_id).outerjoin(f, f.c.id == n.c.filter_id)
              .outerjoin(s, s.c.id == listings.c.source_id))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(n.c.id, n.c.digest_id, u.c.id.label("user_id"), u.c.name, u.c.channel, u.c.channel_url,
                      u.c.secret, u.c.previous_secret, u.c.previous_secret_until, u.c.digest, u.c.quiet_hours,
                      u.c.timezone, *item_columns)
            .select_from(joined.join(u, u.c.id == n.c.user_id))
            .where(n.c.id.in_(list(ids)), u.c.enabled)
        ).all()
        heads = [r.id for r in rows if r.digest_id == r.id]
        members: dict[int, list[Item]] = {}
        if heads:
            for r in conn.execute(
                sa.select(n.c.id, n.c.digest_id, *item_columns).select_from(joined)
                .where(n.c.digest_id.in_(heads), n.c.id != n.c.digest_id).order_by(n.c.id)
            ):
                members.setdefault(r.digest_id, []).append(_item(r))
    now = datetime.now(UTC)
    return [
        Message(
            notification_id=r.id, user_id=r.user_id, user_name=r.name, items=(_item(r), *members.get(r.id, ())),
            is_digest=r.digest_id == r.id,
            plan=delivery_plan(r.user_id, filter_digest(r.mode, r.digest), r.quiet_hours, r.timezone),
            # A routed filter's own channel (``filters route``), else the user's, rotation and all.
            **({"channel": r.own_channel, "channel_url": r.own_channel_url, "secret": r.own_secret}
               if r.own_channel_url else
               {"channel": r.channel, "channel_url": r.channel_url, "secret": r.secret,
                "previous_secret": delivery.overlapping_secret(r.previous_secret, r.previous_secret_until, now)}),
        )
        for r in rows
    ]


def _item(r: Any) -> Item:  # a row with the item columns
    return Item(
        notification_id=r.id, filter_id=r.filter_id, keywords=list(r.keywords or []),
        query=as_written(r.query, r.keywords),
        listing={
            # No link of its own: null, and the source's site where it names one.
            "id": r.listing_id, "url": r.url or None, "title": r.title, "summary": r.summary,
            "published_at": r.published_at.isoformat() if r.published_at else None,
            "source_id": r.source_id,
            **({} if r.price is None else {"price": r.price}),  # a page item's
            **({} if not r.fields else {"fields": dict(r.fields)}),  # pipeline/core/fields.py, amounts as text
            **({} if r.url else {"site_url": r.site_url}),
        },
        event=watches.event_kind(r.event),
        identity=f"{r.item_key or f'listing:{r.listing_id}'} {r.event}",
    )

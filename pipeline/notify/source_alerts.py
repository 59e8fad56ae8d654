"""Delivering what a source's owner is told (``source_alerts``; when, is decided by
pipeline/fetching/decide.py ``owner_alert`` and written by the collector): claimed from
``schema.SOURCE_ALERTS_DUE`` through the shared work pool, sent through the owner's own
channel (their webhook, signed, or their Apprise URL; never a filter's route), retried
and ended as a notification is (``delivery_retry_at``, dead after
``PIPELINE_DELIVERY_MAX_ATTEMPTS``). An owner who is disabled hears nothing: the alert
is dead at once, saying so.

A message tells ``event`` ``source_failing`` or ``source_recovered``; its ``listing``
is the source (no id; its site or URL as the link; the alert's text as the summary;
``source_id`` and the failure's ``reason``), and its idempotency key is made from the
source, the event and when it happened, the same on every attempt.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import in_transaction
from pipeline.core.errors import DeliveryError
from pipeline.core.failures import WORKER_STOPPED, FailureReason
from pipeline.core.kinds import NotificationStatus, SourceHealth
from pipeline.core.settings import Settings
from pipeline.notify.delivery import Channel, Item, Message, attempt_outcome, send
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import Claim, RowCompletion
from pipeline.queue.workpool import work_claimed
from pipeline.storage import schema
from pipeline.storage.rows import SourceAlertRow

log = logging.getLogger(__name__)

TITLES = {SourceHealth.FAILING: "Source failing", SourceHealth.RECOVERED: "Source recovered"}


@dataclass
class AlertStats:
    claimed: int = 0
    sent: int = 0
    retrying: int = 0
    dead: int = 0
    fenced_out: int = 0


class Sent(NamedTuple):
    claim: Claim[SourceAlertRow]
    row: SourceAlertRow
    error: DeliveryError | None
    finished: datetime
    final: bool = False  # dead whatever the attempts say (a disabled owner, claimed too often)


def message(alert: Mapping[str, Any], owner: Mapping[str, Any], source: Mapping[str, Any], now: datetime) -> Message:
    """The message that tells ``owner`` of ``alert`` about ``source`` (rows by name)."""
    event = SourceHealth(alert["event"])
    when = alert["created_at"]
    told = f"{alert['source_id']}\n{event.value}\n{when.isoformat()}"
    item = Item(notification_id=0, filter_id=None, keywords=[], query="", event=f"source_{event.value}", listing={
        "id": None, "url": source["site_url"] or source["url"], "title": f"{TITLES[event]}: {source['name']}",
        "summary": alert["detail"], "published_at": when.isoformat(), "source_id": alert["source_id"],
        "reason": alert["reason"]})
    return Message.to_user(owner, (item,), f"source-{event.value}-{hashlib.sha256(told.encode()).hexdigest()[:32]}",
                           now)


@dataclass
class SourceAlerts:
    engine: Engine
    settings: Settings
    worker: str
    random_unit: Callable[[], float]
    stats: AlertStats = field(default_factory=AlertStats)
    _recording: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def deliver(self, channels: Mapping[str, Channel], *, threads: int = 1, max_rows: int | None = None) -> AlertStats:
        queue = WorkQueue(self.engine, schema.SOURCE_ALERTS_DUE, lease_seconds=self.settings.lease_seconds,
                          row=SourceAlertRow)
        self.stats.claimed += work_claimed(
            queue, self.worker, threads=threads, max_rows=max_rows, batch_size=8,
            start=lambda claim: self._start(queue, claim),
            held=lambda job: (job[0], job[1]["id"]),
            work=lambda job: self._send(job, channels),
            write=lambda sent: self._record(queue, sent),
            max_work_seconds=4 * self.settings.http_timeout_seconds + 60,
            record_at_once=True,  # a message sent is recorded before many others go
        )
        return self.stats

    def _start(self, queue: WorkQueue[SourceAlertRow], claim: Claim[SourceAlertRow]
               ) -> list[tuple[Claim[SourceAlertRow], SourceAlertRow, Message | None]]:
        """The claimed alerts' messages; those claimed too often (each sender died before
        recording an outcome) and those of a disabled owner end here, unsent."""
        limit, now = self.settings.delivery_max_attempts, datetime.now(UTC)
        messages = self._messages(claim.rows, now)
        ended, jobs = [], []
        for row in claim.rows:
            if queue.spec.exhausted(row, limit):
                ended.append(Sent(claim, row, DeliveryError(
                    f"claimed {row['attempts']} times, no send finished (the worker stopped while sending)",
                    code=WORKER_STOPPED), now, final=True))
            elif messages.get(row["id"]) is None:
                ended.append(Sent(claim, row, DeliveryError(
                    "the owner is disabled", code=FailureReason.INVALID_CONFIG), now, final=True))
            else:
                jobs.append((claim, row, messages[row["id"]]))
        if ended:
            self._record(queue, ended)
        return jobs

    def _messages(self, rows: Sequence[SourceAlertRow], now: datetime) -> dict[int, Message | None]:
        a, u, s = schema.source_alerts, schema.users, schema.sources
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(a.c.id, a.c.source_id, a.c.event, a.c.reason, a.c.detail, a.c.created_at,
                          u.c.id.label("user_id"), u.c.name.label("user_name"), u.c.enabled, u.c.channel,
                          u.c.channel_url, u.c.secret, u.c.previous_secret, u.c.previous_secret_until,
                          s.c.name.label("source_name"), s.c.url, s.c.site_url)
                .join(u, u.c.id == a.c.user_id).join(s, s.c.id == a.c.source_id)
                .where(a.c.id.in_([row["id"] for row in rows]))
            ).all()
        return {
            r.id: message(
                dict(r._mapping),
                {"id": r.user_id, "name": r.user_name, "channel": r.channel, "channel_url": r.channel_url,
                 "secret": r.secret, "previous_secret": r.previous_secret,
                 "previous_secret_until": r.previous_secret_until},
                {"name": r.source_name, "url": r.url, "site_url": r.site_url}, now,
            ) if r.enabled else None
            for r in found
        }

    def _send(self, job: tuple[Claim[SourceAlertRow], SourceAlertRow, Message | None], channels: Mapping[str, Channel]) -> Sent:
        claim, row, told = job
        assert told is not None
        return Sent(claim, row, send(channels, told, f"source alert {row['id']}"), datetime.now(UTC))

    def _record(self, queue: WorkQueue[SourceAlertRow], sent: Sequence[Sent]) -> None:
        """Record the outcomes (fenced), one batch at a time: ``stats`` is counted right."""
        with self._recording:
            completions = []
            for s in sent:
                values = attempt_outcome(s.error, s.row["attempts"], s.finished, final=s.final,
                                         max_attempts=self.settings.delivery_max_attempts, u=self.random_unit())
                completions.append(RowCompletion(s.claim, s.row["id"], values))
            # As the notifier's: outcomes the database could not take are written when it is back.
            fenced = in_transaction(self.engine, lambda conn: queue.complete_each(completions, conn=conn),
                                    outlast=queue.lease.total_seconds())
            done = set(fenced.done)
            self.stats.fenced_out += len(fenced.lost)
            for s, c in zip(sent, completions, strict=True):
                if s.row["id"] not in done:
                    continue
                status = c.values["status"]
                self.stats.sent += status == NotificationStatus.SENT
                self.stats.retrying += status == NotificationStatus.FAILED
                self.stats.dead += status == NotificationStatus.DEAD
                if s.error is not None:
                    log.warning("source alert %s failed (attempt %d, now %s): %s",
                                s.row["id"], s.row["attempts"], status, s.error.message)

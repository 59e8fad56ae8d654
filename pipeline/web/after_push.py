"""What a push stored, processed and notified at once (pipeline/fetching/push.py): a
thread of `pipeline serve`'s own runs the processor and then the notifier as soon as a
push stored something, instead of the items waiting for those stages' sensors. They
take their work through the claim as every worker does, so this thread and the stages'
runs never do the same work twice; pushes that come while it works are taken in its
next round. Each round is bounded (``ROUND``): a backlog is the stages' runs' to drain.
How long a push took to reach its users is counted (``counters.PUSH_TO_DELIVERY``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import log_failure
from pipeline.core.kinds import NotificationStatus
from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier
from pipeline.storage import counters, schema

log = logging.getLogger(__name__)

ROUND = 1000  # raw rows, listings and notifications taken in one round at most


class AfterPush:
    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine, self.settings = engine, settings
        self.worker = f"serve-{socket.gethostname()}-{os.getpid()}"
        self.rounds = 0  # finished, for the tests and the log
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pushed: dict[int, datetime] = {}  # source: its earliest push not yet followed

    def wake(self, source_id: int, received_at: datetime) -> None:
        """A push of ``source_id``'s, taken at ``received_at``, stored something: process
        and notify it now (or right after this round)."""
        with self._lock:
            self._pushed.setdefault(source_id, received_at)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="after-push", daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                pushed, self._pushed = self._pushed, {}
            try:
                processed = Processor(self.engine, self.settings, self.worker).run(max_rows=ROUND)
                notified = Notifier(self.engine, self.settings, self.worker).run(
                    max_listings=ROUND, max_notifications=ROUND)
                log.info("after a push: %d listings new or changed, %d notifications sent",
                         processed.inserted + processed.updated, notified.sent)
                if notified.sent:
                    self._observe(pushed)
            except Exception as exc:  # noqa: BLE001 (the stages' runs take what this round could not)
                log_failure(log, exc, "processing a push failed; the stages' next runs take it")
            self.rounds += 1

    def _observe(self, pushed: dict[int, datetime]) -> None:
        """Count, for each alert of a pushed source created since its push and sent by
        now, the seconds from the push to its delivery (``PUSH_TO_DELIVERY``). Its alerts
        a stage's run sent are counted too; those still due are not (retried later)."""
        n, li = schema.notifications, schema.listings
        counts = counters.tally()
        with self.engine.begin() as conn:
            for source_id, received_at in pushed.items():
                for sent_at in conn.execute(
                        sa.select(n.c.sent_at).join(li, li.c.id == n.c.listing_id)
                        .where(li.c.source_id == source_id, n.c.created_at >= received_at,
                               n.c.status == NotificationStatus.SENT).limit(ROUND)).scalars():
                    counters.PUSH_TO_DELIVERY.observe(counts, max(0.0, (sent_at - received_at).total_seconds()))
            counters.add(conn, counts)

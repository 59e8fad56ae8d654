"""What a push stored, processed and notified at once (pipeline/fetching/push.py): a
thread of `pipeline serve`'s own runs the processor and then the notifier as soon as a
push stored something, instead of the items waiting for those stages' sensors. They
take their work through the claim as every worker does, so this thread and the stages'
runs never do the same work twice; pushes that come while it works are taken in its
next round. Each round is bounded (``ROUND``): a backlog is the stages' runs' to drain.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from sqlalchemy.engine import Engine

from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier

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

    def wake(self) -> None:
        """Something was stored: process and notify it now (or right after this round)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="after-push", daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                processed = Processor(self.engine, self.settings, self.worker).run(max_rows=ROUND)
                notified = Notifier(self.engine, self.settings, self.worker).run(
                    max_listings=ROUND, max_notifications=ROUND)
                log.info("after a push: %d listings new or changed, %d notifications sent",
                         processed.inserted + processed.updated, notified.sent)
            except Exception:  # the stages' runs take what this round could not
                log.exception("processing a push failed; the stages' next runs take it")
            self.rounds += 1

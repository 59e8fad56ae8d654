"""``Heartbeat``: keeps the leases of claimed rows alive while they are worked on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pipeline.backends import REACH_AGAIN_FIRST, log_failure
from pipeline.queue.spec import Claim

if TYPE_CHECKING:
    from pipeline.queue.claim import WorkQueue

log = logging.getLogger(__name__)


class Heartbeat:
    """Keeps the leases of claimed rows alive while they are worked on.

    A thread of its own extends, every ``every`` seconds (a third of the lease by
    default, so two beats can fail before a lease runs out; a failed one is tried again
    after half a second, doubling up to ``every``), the rows held with
    ``hold`` and not yet ``drop``ped: fenced, one statement per claim. A row is no longer
    extended once it is dropped, once it has been worked on for ``max_work_seconds``
    (work that hangs must not keep its lease for ever), or once an extension finds it
    lost; and nothing is extended after the ``with`` block ends. A worker that dies
    takes its heartbeat with it, so its claims run out after one lease.
    """

    def __init__(
        self, queue: WorkQueue[Any], *, every: float | None = None, max_work_seconds: float | None = None
    ) -> None:
        lease = queue.lease.total_seconds()
        self.queue = queue
        self.every = every if every is not None else lease / 3
        self.max_work_seconds = max_work_seconds
        self._held: dict[str, tuple[Claim, dict[int, float]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0  # extension statements sent (for tests and telemetry)
        self.failures = 0  # beats that could not reach the database

    def hold(self, claim: Claim, ids: Iterable[int] | None = None) -> None:
        started = time.monotonic()
        with self._lock:
            rows = self._held.setdefault(claim.token, (claim, {}))[1]
            rows.update(dict.fromkeys(claim.ids if ids is None else ids, started))

    def drop(self, claim: Claim, ids: Iterable[int] | None = None) -> None:
        with self._lock:
            entry = self._held.get(claim.token)
            if entry is None:
                return
            for row_id in claim.ids if ids is None else ids:
                entry[1].pop(row_id, None)
            if not entry[1]:
                del self._held[claim.token]

    def __enter__(self) -> Heartbeat:  # noqa: PYI034
        self._thread = threading.Thread(
            target=self._run, name=f"{self.queue.spec.name}-heartbeat", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        pause, retry = self.every, None
        while not self._stop.wait(pause):
            try:
                self.beat()
                pause, retry = self.every, None
            except Exception as exc:  # noqa: BLE001 (the database is away: the leases may run out, work goes on)
                self.failures += 1
                log_failure(log, exc, "lease extension of %s rows failed", self.queue.spec.table.name)
                # Tried again soon, not a third of a lease later, as every write that
                # waits for the database does: one back after a short outage (a
                # restart, a cut) finds the leases still running.
                retry = REACH_AGAIN_FIRST if retry is None else retry * 2
                pause = min(self.every, retry)

    def beat(self) -> None:
        """Extend every row still held; forget rows an extension finds lost."""
        now = time.monotonic()
        with self._lock:
            work = []
            for claim, rows in self._held.values():
                if self.max_work_seconds is not None:
                    for row_id in [i for i, t in rows.items() if now - t > self.max_work_seconds]:
                        log.warning("%s row %s has been worked on for over %g s: its lease is"
                                    " no longer extended", self.queue.spec.name, row_id,
                                    self.max_work_seconds)
                        del rows[row_id]
                if rows:
                    work.append((claim, list(rows)))
        for claim, ids in work:
            if self._stop.is_set():
                return
            fenced = self.queue.extend(claim, ids=ids, quiet=True)
            self.beats += 1
            if fenced.lost:
                with self._lock:  # rows finished meanwhile were dropped: not news
                    still = set(self._held.get(claim.token, (claim, {}))[1])
                lost = [i for i in fenced.lost if i in still]
                if lost:
                    log.warning("%s row(s) %s of %s were lost before their work finished"
                                " (lease ran out, or the row changed): their results will"
                                " be discarded", len(lost), lost[:20], self.queue.spec.name)
                    self.drop(claim, lost)

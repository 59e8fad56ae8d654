"""Worker processes for the concurrency tests: each has its own engine and connections."""

from __future__ import annotations

import random
from typing import Any

from pipeline.backends.claiming import PortableClaim
from pipeline.queue.claim import WorkQueue
from pipeline.storage import counters, db, schema
from tests.helpers import now


def drain(
    url: str, strategy: str | None, worker: str, max_batch: int, gate: Any, seed: int,
    notifications: bool = False, held: Any = None,
) -> list[tuple[int, list[int], list[int]]]:
    """Claim and complete raw rows (or due notifications) until none is left; return
    (limit, claimed, lost) per claim. Claiming starts once every worker is connected
    and at ``gate`` (a barrier of a ``multiprocessing.Manager``), so that they contend.
    With ``held`` (another such barrier), each worker keeps its first claim, done or
    empty, until every worker has made one: however the machine schedules them, every
    worker's first claim then ran while all the others held theirs."""
    engine = db.create_engine(url)
    queue = WorkQueue(
        engine,
        schema.NOTIFICATIONS_DUE if notifications else schema.RAW_UNPROCESSED,
        claiming=PortableClaim if strategy == "portable" else None,
    )

    rng = random.Random(seed)
    log: list[tuple[int, list[int], list[int]]] = []
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    gate.wait(600)
    try:
        while True:
            limit = rng.randint(1, max_batch)
            claim = queue.claim(worker, limit)
            if held is not None:
                held.wait(600)
                held = None
            if not claim:
                return log
            fenced = queue.complete(claim, {"status": "sent"} if notifications else {"processed_at": now()})
            log.append((limit, claim.ids, fenced.lost))
    finally:
        engine.dispose()


class _RolledBack(Exception):
    pass


def count(url: str, transactions: int) -> int:
    """Add 1 to a counter and observe 0.3 s in the fetch-duration histogram, once per
    transaction; every fifth transaction rolls back after its add. Returns how many
    transactions committed."""
    engine = db.create_engine(url)
    committed = 0
    try:
        for i in range(transactions):
            counts = counters.tally()
            counters.SOURCES_CLAIMED.count(counts)
            counters.FETCH_DURATION.observe(counts, 0.3)
            try:
                with engine.begin() as conn:
                    counters.add(conn, counts)
                    if i % 5 == 4:
                        raise _RolledBack
                committed += 1
            except _RolledBack:
                pass
        return committed
    finally:
        engine.dispose()


def process(url: str, worker: str, batch_size: int, gate: Any, max_rows: int | None = None) -> dict[str, int]:
    """Run a processor pass (batches of ``batch_size``) until no raw row is left (or it
    has claimed ``max_rows``); its stats. It starts once every worker is connected and
    at ``gate`` (a barrier of a ``multiprocessing.Manager``), so that they contend
    however slowly each started."""
    from pipeline.core.settings import Settings
    from pipeline.listings.processor import Processor

    engine = db.create_engine(url)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    gate.wait(600)
    try:
        return Processor(engine, Settings(database_url=url), worker, batch_size=batch_size).run(
            max_rows=max_rows).as_dict()
    finally:
        engine.dispose()


def process_one_batch(url: str, worker: str, batch_size: int) -> tuple[dict[str, int], list[str]]:
    """Process one batch of ``batch_size`` raw rows; its stats and the warnings logged."""
    import logging

    from pipeline.core.settings import Settings
    from pipeline.listings.processor import Processor

    warnings: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("pipeline").addHandler(keep := Keep(logging.WARNING))
    engine = db.create_engine(url)
    try:
        stats = Processor(engine, Settings(database_url=url), worker, batch_size=batch_size).run(max_rows=batch_size)
        return stats.as_dict(), warnings
    finally:
        logging.getLogger("pipeline").removeHandler(keep)
        engine.dispose()


def match_alerts(url: str, worker: str, batch: int, alert_limit: int, gate: Any) -> int:
    """Match unmatched listings in batches of ``batch`` until none is left, with a
    per-user limit of ``alert_limit`` (delivering nothing); how many notifications this
    worker created. Starts at ``gate``, as ``process`` does."""
    from pipeline.core.settings import Settings
    from pipeline.notify.notifier import Notifier

    engine = db.create_engine(url)
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    gate.wait(600)
    try:
        settings = Settings(database_url=url, alert_limit=alert_limit)
        return Notifier(engine, settings, worker, match_batch=batch).run(delivering=False).notifications_created
    finally:
        engine.dispose()

"""Worker processes for the concurrency tests: each has its own engine and connections."""

from __future__ import annotations

import random
import time

from pipeline.queue.claim import Strategy, WorkQueue
from pipeline.storage import counters, db, schema
from tests.helpers import now


def drain(
    url: str, strategy: str | None, worker: str, max_batch: int, start_at: float, seed: int
) -> list[tuple[int, list[int], list[int]]]:
    """Claim and complete raw rows until none is left; return (limit, claimed, lost) per claim."""
    engine = db.create_engine(url)
    queue = WorkQueue(
        engine,
        schema.RAW_UNPROCESSED,
        strategy=Strategy(strategy) if strategy else None,
    )
    rng = random.Random(seed)
    log: list[tuple[int, list[int], list[int]]] = []
    time.sleep(max(0.0, start_at - time.time()))  # start together, to contend
    try:
        while True:
            limit = rng.randint(1, max_batch)
            claim = queue.claim(worker, limit)
            if not claim:
                return log
            fenced = queue.complete(claim, {"processed_at": now()})
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

"""Worker processes for the concurrency tests: each has its own engine and connections."""

from __future__ import annotations

import random
import time

from pipeline.queue.claim import Strategy, WorkQueue
from pipeline.storage import db, schema
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

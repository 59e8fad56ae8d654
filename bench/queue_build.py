"""What making a claim queue costs: the first of its kind in a process, and every later one.

Stages make their claim queue per pass, and a lingering run makes a pass of each stage
after the collector's every second (assets/stages.py ``FollowUps``). A queue's
statements (the claim, its count, its completions) are built and, on PostgreSQL,
compiled to the driver's SQL when the first queue of a kind is made, and shared by the
later ones (pipeline/queue/base.py ``built_for``). This compares, in one run and
interleaved, a queue made with the process's statements cleared (``built_for``'s cache
emptied first: what every queue cost before they were shared) against one made after
another of its kind, by CPU per queue (``time.process_time``: it holds on a busy
machine). Each queue also builds the completion its stage sends. No database is
touched: the engine is made, not connected, as a stage's pass makes its queue before it
claims.

    .venv/bin/python bench/queue_build.py [--repeats 7] [--queues 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit, load
from pipeline.backends.claim_postgresql import PostgreSQLClaim
from pipeline.fetching.politeness import PoliteQueue
from pipeline.queue.base import built_for
from pipeline.queue.claim import WorkQueue
from pipeline.storage import db, schema
from pipeline.storage.rows import RawRow

NOW = datetime.now(UTC)


def completing(queue: WorkQueue[Any], values: dict[str, Any]) -> None:
    """The completion ``queue``'s stage sends, compiled as PostgreSQL's claim sends it."""
    assert isinstance(queue.claiming, PostgreSQLClaim), "a PostgreSQL URL, please"
    queue.claiming.completion(values)


def kinds(engine: sa.Engine) -> dict[str, Callable[[], object]]:
    """Each stage's queue as its pass makes it, with the completion it sends."""

    def processor() -> object:
        queue = WorkQueue(engine, schema.RAW_UNPROCESSED, columns=("source_id", "source_item_id", "url", "raw_json"),
                          row=RawRow)
        completing(queue, {"processed_at": NOW, "last_error": None})
        return queue

    def matcher() -> object:
        queue: WorkQueue[Any] = WorkQueue(engine, schema.LISTINGS_UNMATCHED)
        completing(queue, {"matched_at": NOW})
        return queue

    def deliverer() -> object:
        queue: WorkQueue[Any] = WorkQueue(engine, schema.NOTIFICATIONS_DUE)
        completing(queue, {"status": "sent", "sent_at": NOW})
        return queue

    def collector() -> object:
        return PoliteQueue(engine, record_started=True, run_id="bench")

    return {"processor": processor, "matcher": matcher, "deliverer": deliverer, "collector (polite)": collector}


def cpu_per_queue(make: Callable[[], object], queues: int, *, first_of_kind: bool) -> float:
    """Milliseconds of CPU per queue made, over ``queues``."""
    spent = 0.0
    for _ in range(queues):
        if first_of_kind:
            built_for.cache_clear()
        began = time.process_time()
        make()
        spent += time.process_time() - began
    return spent / queues * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="only its dialect is used: nothing connects")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--queues", type=int, default=50, help="queues made per measure")
    args = parser.parse_args()
    engine = db.create_engine(args.database_url)
    print(f"commit {commit()}; {load()}")
    print(f"{'queue':<20} {'first of its kind':>18} {'later ones':>11} {'ratio':>7}  (CPU ms per queue, median of {args.repeats})")
    for name, make in kinds(engine).items():
        first, later = [], []
        for _ in range(args.repeats):  # interleaved
            first.append(cpu_per_queue(make, args.queues, first_of_kind=True))
            make()  # one of its kind, so the later ones share its statements
            later.append(cpu_per_queue(make, args.queues, first_of_kind=False))
        f, s = statistics.median(first), statistics.median(later)
        print(f"{name:<20} {f:>18.2f} {s:>11.2f} {f / s:>6.1f}x")
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

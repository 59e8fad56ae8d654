"""Claimed rows worked on by a thread pool: the loop the collector and delivery share.

Rows are claimed as threads come free (once half of them are idle, so claims stay
batched) and each claimed row starts at once: its lease runs from the claim, so it
never waits for a thread. Slow work on one row delays no other. Results that finish
within ``write_window`` seconds of each other are written together, by the calling
thread, in one call of ``write`` (one transaction), so per-transaction costs are shared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from pipeline.claim import Claim, WorkQueue

Job = TypeVar("Job")
Result = TypeVar("Result")


def work_claimed(
    queue: WorkQueue,
    worker: str,
    *,
    threads: int,
    start: Callable[[Claim], Sequence[Job]],
    work: Callable[[Job], Result],
    write: Callable[[list[Result]], None],
    max_rows: int | None = None,
    batch_size: int = 32,
    write_window: float = 0.1,
) -> int:
    """Claim until nothing is ready or ``max_rows`` were claimed; return how many were.

    ``start`` turns a claim into jobs (and may record that they started); ``work`` runs
    one job on the pool (no transaction open); ``write`` stores finished results.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    refill = max(1, threads // 2)
    claimed = 0
    with ThreadPoolExecutor(threads, thread_name_prefix=f"{queue.spec.name}-work") as pool:
        running: set[Future[Result]] = set()
        ready: list[Result] = []
        write_by = 0.0  # when the oldest result in ``ready`` must be written
        more = True
        while True:
            room = threads - len(running)
            remaining = None if max_rows is None else max_rows - claimed
            if more and remaining != 0 and (room >= refill or not running):
                # min(batch, free threads, what the cap still allows): never over the cap.
                limit = min(batch_size, room, remaining if remaining is not None else room)
                claim = queue.claim(worker, limit)
                more = bool(claim)
                claimed += len(claim)
                if claim:
                    running.update(pool.submit(work, job) for job in start(claim))
            if running:
                timeout = max(0.0, write_by - time.monotonic()) if ready else None
                done, running = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
                if done and not ready:
                    write_by = time.monotonic() + write_window
                ready.extend(future.result() for future in done)
            if ready and (not running or len(ready) >= threads or time.monotonic() >= write_by):
                write(ready)
                ready = []
            if not running and not ready and not (more and remaining != 0):
                return claimed

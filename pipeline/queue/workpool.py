"""Claimed rows worked on by a thread pool: the loop the collector and delivery share.

Rows are claimed as threads come free (once half of them are idle, so claims stay
batched, or once one has been free ``IDLE_CLAIM_SECONDS``; after a claim that came back
short, again every ``LOOK_AGAIN_SECONDS`` while work runs) and each claimed row starts
at once: its lease runs from the claim, so it never waits for a thread. Slow work on one row delays no other. A heartbeat
(``claim.Heartbeat``) extends the lease of every row whose work is still running. Results that finish
within ``write_window`` seconds of each other (up to ``WRITE_BATCH_THREADS`` x threads of
them) are written together in one call of ``write`` (one transaction), so
per-transaction costs are shared, on a writer thread of their own: the loop goes on
claiming while a batch is written (``_Writer``). Work whose effect cannot be taken back
(a message sent) is recorded at once instead (``record_at_once``): what finished is
written as soon as the writer is free, so few outcomes are ever unrecorded.
"""

from __future__ import annotations

import queue as queues
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from pipeline.backends import unreachable
from pipeline.queue.claim import WorkQueue
from pipeline.queue.heartbeat import Heartbeat
from pipeline.queue.spec import Claim, R

# A claim that came back short while work was claimable now (``next_start_in`` said 0)
# lost a race to another worker's claim: look again after a pause that starts short and
# doubles, with jitter so that racing workers fall out of step, while the races go on.
_RACE_PAUSE = (0.002, 0.1)  # first, longest (seconds)
# A claim waits until half the threads are free, so that it takes a batch; but a thread
# free for this long claims with fewer: behind a few long jobs (a slow host, a
# long-tailed latency) the free threads otherwise idled until one of those ended. On the
# simulated internet (bench/internet_collect.py) 16 threads were busy 0.38 of the time.
IDLE_CLAIM_SECONDS = 0.05
# A pass whose claim came back short (nothing more ready) looks again this often while
# its work still runs: rows that come due meanwhile start then, not when a job in flight
# ends (on the simulated internet one held answer, 20 s to its deadline, kept every
# source that came due meanwhile waiting: schedule lateness p99 16 s, bench/RESULTS.md).
LOOK_AGAIN_SECONDS = 1.0
# Results are written when ``write_window`` has passed since the first of them, when no
# work runs any more, or when this many times ``threads`` are waiting: a transaction's
# own cost is most of a batch's for cheap work (an unchanged feed's 304), and batches
# capped at ``threads`` spent 0.1-0.2 ms more client CPU per feed (bench/RESULTS.md).
WRITE_BATCH_THREADS = 4
# A pass begun after its ``claim_until`` takes at most the rows ready as it began,
# counted up to this many (one capped, indexed count): more than a late run's share.
LATE_COUNT_CAP = 10_000
Job = TypeVar("Job")
Result = TypeVar("Result")


def work_claimed(
    queue: WorkQueue[R],
    worker: str,
    *,
    threads: int,
    start: Callable[[Claim[R]], Sequence[Job]],
    held: Callable[[Job], tuple[Claim, int]],
    work: Callable[[Job], Result],
    write: Callable[[list[Result]], None],
    max_rows: int | None = None,
    batch_size: int = 32,
    write_window: float = 0.1,
    max_work_seconds: float | None = None,
    next_start_in: Callable[[], float | None] | None = None,
    max_wait: float = 10.0,
    idle_claim: float = IDLE_CLAIM_SECONDS,
    look_again: float = LOOK_AGAIN_SECONDS,
    claim_until: float | None = None,
    record_at_once: bool = False,
) -> int:
    """Claim until nothing is ready, ``max_rows`` were claimed or ``claim_until``
    (``time.monotonic()``) has passed; return how many were. The work claimed is
    finished and written before it returns. Under a steady stream of work coming due,
    only ``max_rows`` or ``claim_until`` ends a pass.

    A pass whose ``claim_until`` had passed before it began (a lingering run that
    started after its linger's end: a slow container start, a full run queue) takes
    what is ready all the same: as many rows as were ready when it began (counted up to
    ``LATE_COUNT_CAP``), in full claims, and ends at the first that comes back short,
    waiting for nothing. It once made one claim and ended: on a loaded machine, whose
    run containers took longer to start than the linger they were asked for, each run
    took one batch (4 sources) of 300 due. Then it claimed on while claims came back
    full, which under work coming due as fast as it is taken does not end before
    ``max_rows`` (tests/test_claim.py: 19 rows taken where 7 were ready).

    ``start`` turns a claim into jobs (and may record that they started); ``held`` names
    the claimed row a job works on; ``work`` runs one job on the pool (no transaction
    open); ``write`` stores finished results. A row's lease is extended while its job
    runs, for at most ``max_work_seconds``.

    A claim waits for half the threads to be free (a batch per round trip), or for a
    thread to have been free ``idle_claim`` seconds, whichever comes first. When a claim
    comes back short while work still runs, the pass looks again every ``look_again``
    seconds until that work ends (and once more then): rows that come due meanwhile
    start without waiting for a job to end.

    ``record_at_once``: the work does what cannot be undone (it sends a message), so a
    process killed between a job's end and its write repeats that job after its lease:
    results are then written as soon as the writer is free (no ``write_window``), with
    no batch waiting behind the one being written, so at most the results of one write
    and of the jobs that ended during it are ever unwritten. Batched for 0.1 s, behind a
    batch at the writer, a killed deliverer's window held 71 messages sent again
    (bench/RESULTS.md); the cost is more, smaller writes when sends come fast (about
    0.4 ms of CPU a message, client and server, with 2,000 sent back to back).

    A claim, or a ``start``, that cannot reach the database (``unreachable``:
    restarting, cut off) ends the claiming, not the work claimed before it: that work
    finishes and is written (a write that outlasts the outage, as the deliverer's does,
    lands when the database is back, and a message sent is not sent again), then the
    error is raised; the rows of a claim whose ``start`` failed wait out their lease,
    unstarted. It once ended the pass at once, and the messages in flight, sent, were
    sent again when their leases ran out (after a claim at the hour's restart, 42; after
    the deliverer's ``start`` reading its messages, 72: bench/RESULTS.md).

    When a claim finds less than it asked for although work is waiting for room
    (``next_start_in``: seconds until it may be claimable, None when there is none), the
    pass waits for it, up to ``max_wait`` seconds at a time, instead of ending:
    politeness makes work wait, it never makes it fail. When it is claimable now (0), the
    claim lost a race to another worker's and is tried again after a short pause.
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    refill = max(1, threads // 2)
    if record_at_once:
        write_window = 0.0
    claimed = 0
    with (
        Heartbeat(queue, max_work_seconds=max_work_seconds) as heartbeat,
        _pool(threads, f"{queue.spec.name}-work") as pool,
        _Writer(write, f"{queue.spec.name}-write", depth=1 if record_at_once else 2) as writer,
    ):
        running: dict[Future[Result], tuple[Claim, int]] = {}
        # Each future, when done, puts itself here: the loop waits on one queue, not on
        # every running future (``concurrent.futures.wait`` installs a waiter on each of
        # them per call). The writer's failure is put here too: a write that failed ends
        # the pass at once, not when the slowest work in flight finishes.
        finished: queues.SimpleQueue[Future[Any]] = queues.SimpleQueue()
        writer.failed.add_done_callback(finished.put)
        ready: list[Result] = []
        write_by = 0.0  # when the oldest result in ``ready`` must be written
        more = True
        claim_after = 0.0  # waiting for room: no claim before this (monotonic)
        free_since: float | None = None  # when a thread became free with no claim since
        races = 0  # claims in a row that came back short while work was claimable
        looking = False  # a claim came back short while work runs: looking again now and then
        claims = 0  # made by this pass
        # Begun after ``claim_until``: it takes what is ready now, then ends (the docstring).
        late = claim_until is not None and time.monotonic() >= claim_until
        if late:
            ready_now = queue.count_ready(cap=LATE_COUNT_CAP)
            max_rows = ready_now if max_rows is None else min(max_rows, ready_now)
        lost: sa.exc.DBAPIError | None = None  # a claim could not reach the database: raised at the end
        while True:
            room = threads - len(running)
            remaining = None if max_rows is None else max_rows - claimed
            now = time.monotonic()
            if claim_until is not None and now >= claim_until and claims and not late:
                more = False  # time is up: finish what runs, claim nothing more
            if room < 1:
                free_since = None
            elif free_since is None:
                free_since = now
            idle = free_since is not None and now - free_since >= idle_claim
            if (more and remaining != 0 and (room >= refill or not running or idle)
                    and now >= claim_after):
                free_since = None
                # min(batch, free threads, what the cap still allows): never over the cap.
                limit = min(batch_size, room, remaining if remaining is not None else room)
                try:
                    claim = queue.claim(worker, limit)
                except sa.exc.DBAPIError as exc:
                    if not unreachable(exc):
                        raise
                    lost, more = exc, False  # finish and write what runs, then raise it
                    continue
                claims += 1
                if late and len(claim) < limit:
                    more = False  # what was ready is taken; a late pass waits for nothing
                elif len(claim) < limit and next_start_in is not None:
                    # Less than asked for: the rest may be waiting for room. When can
                    # it start? (None: nothing else is waiting.)
                    wait_s = next_start_in()
                    more = bool(claim) or (wait_s is not None and wait_s <= max_wait)
                    if wait_s == 0:
                        races += 1
                        wait_s = _race_pause(races)
                    else:
                        races = 0
                    if wait_s is not None and wait_s <= max_wait:
                        claim_after = time.monotonic() + wait_s
                else:
                    more = bool(claim)
                    races = 0
                isolated = queue.isolate(claim)
                claimed += len(isolated)
                try:
                    jobs = start(isolated) if isolated else []
                except sa.exc.DBAPIError as exc:  # as the claim's: its rows wait out their lease, unstarted
                    if not unreachable(exc):
                        raise
                    lost, more = exc, False
                    continue
                if isolated is not claim:  # a suspect: worked on with nothing else running
                    ready = _drain_then_run_alone(running, jobs, held, work, writer, heartbeat, pool, ready)
                elif claim:
                    for job in jobs:
                        claim_of, row_id = held(job)
                        heartbeat.hold(claim_of, [row_id])
                        future = pool.submit(work, job)
                        running[future] = (claim_of, row_id)
                        future.add_done_callback(finished.put)
                # Less than asked for: nothing else is ready now. While work runs, more
                # may come due: look again soon, not only when a job ends.
                looking = (len(claim) < limit and bool(running) and look_again > 0
                           and (claim_until is None or time.monotonic() < claim_until))
                if looking:
                    now = time.monotonic()
                    soon = now + look_again
                    more, claim_after = True, min(claim_after, soon) if claim_after > now else soon
            waiting = more and remaining != 0 and claim_after > time.monotonic()
            if running:
                deadlines = [write_by] if ready else []
                if waiting:
                    deadlines.append(claim_after)
                elif more and remaining != 0 and len(running) < threads:
                    # A claim smaller than the room (a batch below the free threads) left
                    # room: a claim at once when half the threads are free, else once a
                    # thread has been free ``idle_claim``. It once waited for a job to end.
                    if threads - len(running) >= refill:
                        deadlines.append(time.monotonic())
                    else:
                        free_since = time.monotonic() if free_since is None else free_since
                        deadlines.append(free_since + idle_claim)
                if more and claim_until is not None:
                    deadlines.append(claim_until)  # then it stops claiming
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                # (A future already taken by _drain_then_run_alone is not running any more.)
                done = [f for f in _finished(finished, timeout) if f in running]
                writer.check()
                if done and not ready:
                    write_by = time.monotonic() + write_window
                for future in done:
                    claim_of, row_id = running.pop(future)
                    heartbeat.drop(claim_of, [row_id])
                    ready.append(future.result())
                if looking and done and not running:
                    claim_after = time.monotonic()  # the last job ended: one look at once, then the end
            elif waiting and not ready:
                wake = claim_after if claim_until is None else min(claim_after, claim_until)
                time.sleep(max(0.0, wake - time.monotonic()))
            if ready and (not running or len(ready) >= WRITE_BATCH_THREADS * threads or time.monotonic() >= write_by):
                writer.submit(ready)
                ready = []
            if not running and not ready and not (more and remaining != 0):
                writer.close()  # every result written (or the write's error raised)
                if lost is not None:
                    raise lost
                return claimed


def _finished(finished: queues.SimpleQueue[Future[Any]], timeout: float | None) -> list[Future[Any]]:
    """The futures done so far: waits up to ``timeout`` seconds (None: for ever) for the
    first, then takes every other that is there."""
    try:
        done = [finished.get(timeout=timeout)]
    except queues.Empty:
        return []
    while True:
        try:
            done.append(finished.get_nowait())
        except queues.Empty:
            return done


def _race_pause(races: int) -> float:
    """The pause before claiming again after ``races`` short claims in a row that lost a
    race: doubling from the first pause to the longest, each drawn between half and all
    of it."""
    first, longest = _RACE_PAUSE
    return min(longest, first * 2.0 ** (races - 1)) * random.uniform(0.5, 1.0)


class _Writer(Generic[Result]):
    """Calls ``write`` with each submitted batch, in order, on a thread of its own.

    At most ``depth`` batches wait to be written (``submit`` blocks beyond that, so a
    slow database slows the claiming instead of piling up results). A batch whose write
    raises ends the pass: the error is raised by the next ``submit``, ``flush`` or
    ``close`` (or ``check``; ``failed`` is a future for waiting on it), and no later
    batch is written. A pass that ends by an exception abandons
    the batches still waiting: their leases run out for another claim to take them, as
    the work in flight's do (``_pool``)."""

    def __init__(self, write: Callable[[list[Result]], None], name: str, depth: int = 2) -> None:
        self._write = write
        self._batches: queues.SimpleQueue[list[Result] | None] = queues.SimpleQueue()
        self._room = threading.Semaphore(depth)
        self._idle = threading.Condition()
        self._waiting = 0  # batches submitted and not yet written
        self.failed: Future[None] = Future()  # done when a write raised: its error
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> _Writer[Result]:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self._abandoned = True
        self._batches.put(None)
        if exc_type is None:
            self._thread.join()

    def _run(self) -> None:
        while (batch := self._batches.get()) is not None:
            try:
                if not self.failed.done() and not self._abandoned:
                    self._write(batch)
            except BaseException as exc:  # noqa: BLE001 -- raised again on the loop's thread
                self.failed.set_exception(exc)
            finally:
                self._room.release()
                with self._idle:
                    self._waiting -= 1
                    self._idle.notify_all()

    def submit(self, batch: list[Result]) -> None:
        self.check()
        self._room.acquire()
        with self._idle:
            self._waiting += 1
        self._batches.put(batch)

    def flush(self) -> None:
        """Wait until every submitted batch is written."""
        with self._idle:
            self._idle.wait_for(lambda: self._waiting == 0)
        self.check()

    def close(self) -> None:
        self.flush()

    def check(self) -> None:
        """Raise the error of a write that failed, if one did."""
        if self.failed.done():
            self.failed.result()


@contextmanager
def _pool(threads: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool that a pass which ends by an exception (an interrupt: the run was
    terminated; the database went away) does not wait for: the work in flight is
    abandoned, its results unwritten, and its leases, no longer extended, run out for
    another claim to take it. A pass that ends normally has waited for all its work."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _drain_then_run_alone(
    running: dict[Future[Result], tuple[Claim, int]],
    jobs: Sequence[Job],
    held: Callable[[Job], tuple[Claim, int]],
    work: Callable[[Job], Result],
    writer: _Writer[Result],
    heartbeat: Heartbeat,
    pool: ThreadPoolExecutor,
    ready: list[Result],
) -> list[Result]:
    """Let the running jobs finish and write their results, then run ``jobs`` (a
    suspect's) with nothing beside them: if it kills the worker, no other row loses an
    attempt, or its finished work, to it. Returns the suspect's results, to write."""
    for future in list(running):
        claim_of, row_id = running.pop(future)
        ready.append(future.result())
        heartbeat.drop(claim_of, [row_id])
    if ready:
        writer.submit(ready)
    writer.flush()
    ready = []
    for job in jobs:
        claim_of, row_id = held(job)
        heartbeat.hold(claim_of, [row_id])
        try:
            ready.append(pool.submit(work, job).result())
        finally:
            heartbeat.drop(claim_of, [row_id])
    return ready

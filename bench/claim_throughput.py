"""Claim-and-complete throughput and CPU per row on PostgreSQL: the project beside the
minimal loop (the ceiling) and pgqueuer.

For each number of worker processes and batch size, each system drains the same
number of queued rows (claim a batch, complete it, claim the next); reported per system:
rows per second of wall time and CPU per row, client (the worker processes' own
accounting) and server (every process of the PostgreSQL cluster, from /proc), each the
median of --repeat runs, the systems taking turns.

* minimal  -- the ceiling: the project's claim (the same CTE, leases, fencing token and
              attempt count) prepared by a bare psycopg loop, returning only ``id``; the
              completion of batch k (fenced, returning the ids it finished) pipelined
              with the claim of batch k+1: one round trip and one commit per batch.
* project  -- what a stage runs: ``WorkQueue.claim`` once, then
              ``WorkQueue.complete_and_claim`` per batch, returning the columns of the
              queue's order and attempts (the stage's own columns otherwise).
* separate -- the project's ``claim`` then ``complete`` (two round trips, two commits
              per batch): what the pipelining is worth.
* pgqueuer -- its own worker loop (``QueueManager.run(mode=drain)``) on the same
              database, with a no-op entrypoint and the same batch size.

pgqueuer is not a project dependency: install it in a separate environment, e.g.

    python3 -m venv .bench-venv && .bench-venv/bin/pip install -e . -r bench/requirements.txt
    .bench-venv/bin/python bench/claim_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

The benchmark creates (and drops, however it ends) its own database
``bench_claim_<pid>_<random>`` on that server.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import (
    ServerCpu,
    commit,
    load,
    scratch_database,
    unique_name,
    wait_for_backends_gone,
)
from pipeline.queue.claim import WorkQueue
from pipeline.storage import db, migrate, schema

DB_NAME = unique_name("bench_claim")
ROWS_FOR_BATCH = {1: 4_000, 10: 20_000, 100: 100_000}
SYSTEMS = ("minimal", "project", "separate", "pgqueuer")

# The ceiling's SQL: the project's claim (pipeline/queue/sql/listings_raw.unprocessed.postgresql.sql)
# written by hand, returning only the ids, and its fenced completion.
MIN_CLAIM = """
WITH expired AS MATERIALIZED (
    SELECT id FROM listings_raw
    WHERE processed_at IS NULL AND locked_until IS NOT NULL AND locked_until <= now()
    ORDER BY locked_until LIMIT %(n)s FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED (
    SELECT id FROM listings_raw
    WHERE processed_at IS NULL AND locked_until IS NULL
    ORDER BY fetched_at, id LIMIT %(n)s FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED (
    SELECT id FROM expired UNION ALL SELECT id FROM free LIMIT %(n)s)
UPDATE listings_raw t
SET attempts = t.attempts + 1, locked_until = now() + interval '300 seconds',
    claimed_by = %(worker)s, claim_token = %(token)s
FROM c WHERE t.id = c.id
RETURNING t.id
"""
MIN_COMPLETE = """
UPDATE listings_raw
SET processed_at = now(), locked_until = NULL, claimed_by = NULL, claim_token = NULL
WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND claimed_by = %(worker)s
RETURNING id
"""

Result = tuple[int, float, float]  # rows completed, wall-clock end, client CPU seconds


def wait_until(start_at: float) -> float:
    time.sleep(max(0.0, start_at - time.time()))
    return time.process_time()


def pipelined_drain(conn: psycopg.Connection, worker: str, batch: int, write: str) -> int:
    """The minimal loop on ``conn`` (autocommit): claim with MIN_CLAIM, then send each
    batch's ``write`` (parameters ``ids``, ``token``, ``worker``) and the next claim in one
    pipeline: one round trip, one implicit transaction. Returns the rows ``write`` changed."""
    done = 0
    token = uuid.uuid4().hex
    ids = [r[0] for r in conn.execute(MIN_CLAIM, {"n": batch, "worker": worker, "token": token})]
    while ids:
        following = uuid.uuid4().hex
        with conn.pipeline():
            written = conn.execute(write, {"ids": ids, "token": token, "worker": worker})
            claimed = conn.execute(MIN_CLAIM, {"n": batch, "worker": worker, "token": following})
        done += written.rowcount
        ids, token = [r[0] for r in claimed.fetchall()], following
    return done


def minimal_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        cpu = wait_until(start_at)
        done = pipelined_drain(conn, worker, batch, MIN_COMPLETE)
        return done, time.time(), time.process_time() - cpu


def _queue(url: str) -> WorkQueue:
    engine = db.create_engine(url, pool_size=1)
    queue = WorkQueue(engine, schema.RAW_UNPROCESSED, columns=())
    queue.release(queue.claim("warm-up", 1))  # connect before the clock starts
    return queue


def project_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    queue = _queue(url)
    done = 0
    cpu = wait_until(start_at)
    claim = queue.claim(worker, batch)
    while claim:
        fenced, claim = queue.complete_and_claim(claim, {"processed_at": datetime.now(UTC)}, batch)
        done += len(fenced.done)
    result = done, time.time(), time.process_time() - cpu
    queue.engine.dispose()
    return result


def separate_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    queue = _queue(url)
    done = 0
    cpu = wait_until(start_at)
    while claim := queue.claim(worker, batch):
        done += len(queue.complete(claim, {"processed_at": datetime.now(UTC)}).done)
    result = done, time.time(), time.process_time() - cpu
    queue.engine.dispose()
    return result


def pgqueuer_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    done = 0

    async def main() -> tuple[float, float]:
        nonlocal done
        conn = await asyncpg.connect(url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("bench")
        async def handle(job) -> None:
            nonlocal done
            done += 1

        await asyncio.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
        finished, spent = time.time(), time.process_time() - cpu
        await conn.close()
        return finished, spent

    finished, spent = asyncio.run(main())
    return done, finished, spent


WORKERS: dict[str, Callable[[str, str, int, float], Result]] = {
    "minimal": minimal_worker, "project": project_worker, "separate": separate_worker,
    "pgqueuer": pgqueuer_worker,
}


def run_workers(system: str, url: str, workers: int, batch: int) -> tuple[int, float, float]:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 4.0  # every process started and connected by then
    with spawn.Pool(workers) as pool:
        results = pool.starmap(WORKERS[system], [(url, f"w{i}", batch, start_at) for i in range(workers)])
    total = sum(done for done, _, _ in results)
    elapsed = max(finished for _, finished, _ in results) - start_at
    return total, elapsed, sum(cpu for _, _, cpu in results)


def fill_raw(engine: sa.Engine, source_id: int, rows: int) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("TRUNCATE listings_raw")
        conn.exec_driver_sql(
            "INSERT INTO listings_raw (source_id, source_item_id, url, raw_json, content_hash, fetched_at)"
            " SELECT %(s)s, g::text, 'http://127.0.0.1/' || g, '{}'::jsonb, md5(g::text),"
            " now() - (%(n)s - g) * interval '1 millisecond' FROM generate_series(1, %(n)s) g",
            {"s": source_id, "n": rows},
        )
    vacuum(engine, "listings_raw")


def vacuum(engine: sa.Engine, table: str) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        conn.exec_driver_sql("CHECKPOINT")  # every run starts with the same dirty pages: none


def fill_pgqueuer(url: str, rows: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(conn))
        await queries.clear_queue()
        await queries.clear_queue_log()
        for start in range(0, rows, 10_000):
            n = min(10_000, rows - start)
            await queries.enqueue(["bench"] * n, [None] * n, [0] * n)
        await conn.execute("VACUUM ANALYZE pgqueuer")
        await conn.execute("CHECKPOINT")
        await conn.close()

    asyncio.run(main())


def install_pgqueuer(url: str) -> bool:
    try:
        import asyncpg
        from pgqueuer import AsyncpgDriver
        from pgqueuer.queries import Queries
    except ImportError:
        return False

    async def main() -> None:
        conn = await asyncpg.connect(url)
        await Queries(AsyncpgDriver(conn)).install()
        await conn.close()

    asyncio.run(main())
    return True


def measure(args: argparse.Namespace, url: str, systems: list[str]) -> None:
    sa_url = url
    driver_url = db.parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    engine = db.create_engine(sa_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        source_id = conn.execute(
            sa.insert(schema.sources)
            .values(name="bench", url="http://127.0.0.1/bench", source_type="rss")
            .returning(schema.sources.c.id)
        ).scalar_one()
    if "pgqueuer" in systems and not install_pgqueuer(driver_url):
        print("pgqueuer: not measured (not installed here)")
        systems.remove("pgqueuer")
    server = ServerCpu(engine)
    if not server.available:
        print("server CPU: not measured (the PostgreSQL server is not on this host)")
    with engine.connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar_one()
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar_one()
    print(f"PostgreSQL {version} (synchronous_commit {sync}), {os.cpu_count()} CPUs,"
          f" {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, load before {load()}")
    print("rows/s of wall time; CPU us per row: client + server = total; median of"
          f" {args.repeat} interleaved runs; ratios to minimal")
    for workers in [int(w) for w in args.workers.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            rows = ROWS_FOR_BATCH.get(batch, 20_000)
            rate: dict[str, list[float]] = {s: [] for s in systems}
            client: dict[str, list[float]] = {s: [] for s in systems}
            total: dict[str, list[float]] = {s: [] for s in systems}
            for _ in range(args.repeat):
                for system in systems:
                    if system == "pgqueuer":
                        fill_pgqueuer(driver_url, rows)
                    else:
                        fill_raw(engine, source_id, rows)
                    before = server.seconds()
                    done, elapsed, client_cpu = run_workers(
                        system, driver_url if system in ("minimal", "pgqueuer") else sa_url, workers, batch)
                    wait_for_backends_gone(engine, DB_NAME)
                    after = server.seconds()
                    assert done == rows, f"{system}: {done} of {rows} rows completed"
                    rate[system].append(done / elapsed)
                    client[system].append(client_cpu / done * 1e6)
                    if before is not None and after is not None:
                        total[system].append((client_cpu + after - before) / done * 1e6)
            print(f"\n{workers} worker(s) x batch {batch}, {rows:,} rows, load {load()}")
            print(f"  {'system':<9} {'rows/s':>8} {'ratio':>6} {'client':>7} {'server':>7} {'total':>7} {'ratio':>6}")
            base_rate = statistics.median(rate["minimal"]) if "minimal" in systems else None
            base_cpu = statistics.median(total["minimal"]) if "minimal" in systems and total["minimal"] else None
            for system in systems:
                r, c = statistics.median(rate[system]), statistics.median(client[system])
                t = statistics.median(total[system]) if total[system] else None
                line = f"  {system:<9} {r:>8,.0f} {r / base_rate if base_rate else float('nan'):>6.2f} {c:>7.1f}"
                if t is not None:
                    line += f" {t - c:>7.1f} {t:>7.1f} {t / base_cpu if base_cpu else float('nan'):>6.2f}"
                print(line, flush=True)
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL server where the benchmark may create a database (bench_claim_...)",
    )
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument("--batches", default="1,10,100")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"a subset of {','.join(SYSTEMS)}")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the median is shown")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(sorted(unknown))}: choose from {', '.join(SYSTEMS)}")

    server = db.parse_url(args.database_url)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with scratch_database(admin, DB_NAME):
            measure(args, server.set(database=DB_NAME).render_as_string(hide_password=False), systems)
    finally:
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Claim-and-complete throughput of pipeline/queue/claim.py on PostgreSQL, beside two baselines.

For 1, 4 and 8 worker processes and batch sizes 1, 10 and 100, each system drains the
same number of queued rows; the figure is rows (or jobs) per second of wall time, the
median of --repeat runs (3 by default), the systems taking turns.

* project  -- ``WorkQueue.claim`` + ``WorkQueue.complete`` (SQLAlchemy Core, psycopg 3).
* raw      -- the ceiling: the same CTE claim and batch completion, hand-written SQL sent
              by a bare psycopg loop with prepared statements.
* pgqueuer -- its own worker loop (``QueueManager.run(mode=drain)``) on the same
              database, with a no-op entrypoint and the same batch size.

pgqueuer is not a project dependency: install it in a separate environment, e.g.

    python3 -m venv .bench-venv && .bench-venv/bin/pip install -e . -r bench/requirements.txt
    .bench-venv/bin/python bench/claim_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

The benchmark creates (and drops) its own database ``bench_claim_<pid>_<random>`` on that server.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import unique_name
from pipeline.queue.claim import WorkQueue
from pipeline.storage import db, migrate, schema

DB_NAME = unique_name("bench_claim")
ROWS_FOR_BATCH = {1: 4_000, 10: 20_000, 100: 100_000}
LEASE = "300 seconds"

# The ceiling: what pipeline/queue/claim.py sends, written by hand.
RAW_CLAIM = """
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
SET locked_until = now() + interval '300 seconds', claimed_by = %(worker)s, claim_token = %(token)s
FROM c WHERE t.id = c.id
RETURNING t.*
"""
RAW_COMPLETE = """
UPDATE listings_raw
SET processed_at = now(), locked_until = NULL, claimed_by = NULL, claim_token = NULL
WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND claimed_by = %(worker)s
RETURNING id
"""


def wait_until(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def project_worker(url: str, worker: str, batch: int, start_at: float) -> tuple[int, float]:
    engine = db.create_engine(url, pool_size=1)
    queue = WorkQueue(engine, schema.RAW_UNPROCESSED)
    queue.release(queue.claim("warm-up", 1))  # connect and compile before the clock starts
    done = 0
    wait_until(start_at)
    while claim := queue.claim(worker, batch):
        done += len(queue.complete(claim, {"processed_at": datetime.now(UTC)}).done)
    finished = time.time()
    engine.dispose()
    return done, finished


def raw_worker(url: str, worker: str, batch: int, start_at: float) -> tuple[int, float]:
    import uuid

    done = 0
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        wait_until(start_at)
        while True:
            token = uuid.uuid4().hex
            params = {"n": batch, "worker": worker, "token": token}
            ids = [row[0] for row in conn.execute(RAW_CLAIM, params)]
            if not ids:
                break
            completed = conn.execute(RAW_COMPLETE, {"ids": ids, "token": token, "worker": worker})
            done += len(completed.fetchall())
    return done, time.time()


def pgqueuer_worker(url: str, worker: str, batch: int, start_at: float) -> tuple[int, float]:
    import asyncpg
    from pgqueuer import AsyncpgDriver, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    done = 0

    async def main() -> float:
        nonlocal done
        conn = await asyncpg.connect(url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("bench")
        async def handle(job) -> None:
            nonlocal done
            done += 1

        await asyncio.sleep(max(0.0, start_at - time.time()))
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain)
        return time.time()

    finished = asyncio.run(main())
    return done, finished


def run_workers(
    target: Callable[[str, str, int, float], tuple[int, float]], url: str, workers: int, batch: int
) -> tuple[int, float]:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 4.0
    with spawn.Pool(workers) as pool:
        results = pool.starmap(target, [(url, f"w{i}", batch, start_at) for i in range(workers)])
    total = sum(done for done, _ in results)
    elapsed = max(finished for _, finished in results) - start_at
    return total, elapsed


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL server where the benchmark may create a database (bench_claim_...)",
    )
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument("--batches", default="1,10,100")
    parser.add_argument("--skip-pgqueuer", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    args = parser.parse_args()

    server = db.parse_url(args.database_url)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {DB_NAME}")
    url = server.set(database=DB_NAME)
    sa_url = url.render_as_string(hide_password=False)
    driver_url = url.set(drivername="postgresql").render_as_string(hide_password=False)
    engine = db.create_engine(sa_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        source_id = conn.execute(
            sa.insert(schema.sources)
            .values(name="bench", url="http://127.0.0.1/bench", source_type="rss")
            .returning(schema.sources.c.id)
        ).scalar_one()
    with_pgqueuer = not args.skip_pgqueuer and install_pgqueuer(driver_url)
    if not with_pgqueuer:
        print("pgqueuer: not measured (not installed here, or --skip-pgqueuer)")
    with engine.connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar_one()
    print(f"PostgreSQL {version}, {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    header = f"{'workers':>7} {'batch':>5} {'rows':>7} {'project':>9} {'raw':>9} {'proj/raw':>8}"
    if with_pgqueuer:
        header += f" {'pgqueuer':>9} {'proj/pgq':>8}"
    print(header + "   (rows/s)")

    systems: list[tuple[str, Callable[..., tuple[int, float]], str]] = [
        ("project", project_worker, sa_url),
        ("raw", raw_worker, driver_url),
    ]
    if with_pgqueuer:
        systems.append(("pgqueuer", pgqueuer_worker, driver_url))
    for workers in [int(w) for w in args.workers.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            rows = ROWS_FOR_BATCH.get(batch, 20_000)
            samples: dict[str, list[float]] = {name: [] for name, _, _ in systems}
            # Interleaved repeats, median kept: this machine's noise is larger than
            # the differences of interest (the same run varies by +-20%).
            for _ in range(args.repeat):
                for name, target, conn_url in systems:
                    if name == "pgqueuer":
                        fill_pgqueuer(driver_url, rows)
                    else:
                        fill_raw(engine, source_id, rows)
                    done, elapsed = run_workers(target, conn_url, workers, batch)
                    assert done == rows, f"{name}: {done} of {rows} rows completed"
                    samples[name].append(done / elapsed)
            rates = {name: statistics.median(values) for name, values in samples.items()}
            line = (
                f"{workers:>7} {batch:>5} {rows:>7} {rates['project']:>9.0f} {rates['raw']:>9.0f}"
                f" {rates['project'] / rates['raw']:>8.2f}"
            )
            if with_pgqueuer:
                line += f" {rates['pgqueuer']:>9.0f} {rates['project'] / rates['pgqueuer']:>8.2f}"
            print(line, flush=True)

    engine.dispose()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

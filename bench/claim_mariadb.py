"""Claim-and-complete throughput and CPU per row on MariaDB, beside PostgreSQL, in one run.

For each number of worker processes and batch size, each system drains the same number
of queued raw rows (claim a batch, complete it, claim the next). Reported per system:
rows per second of wall time and CPU per row, client (the worker processes' own
accounting) and server (the database server's processes, from /proc), each the median
of --repeat runs, the systems taking turns.

* mariadb-minimal -- the ceiling on MariaDB: a bare PyMySQL loop doing the least a
                     leased claim can there: one transaction of ``SELECT id ... FOR
                     UPDATE SKIP LOCKED`` (the free rows, by the queue's index) and an
                     ``UPDATE`` of those ids; then the fenced completion (``UPDATE ...
                     WHERE id IN (...) AND claim_token AND claimed_by``) and its commit.
* mariadb-project -- ``WorkQueue.claim`` and ``WorkQueue.complete`` on MariaDB (the
                     claim also looks for expired leases, reads the database's clock and
                     reads the rows back; the completion locks the rows its fence admits,
                     then writes them: pipeline/queue/claim.py).
* postgres-project -- ``WorkQueue.claim`` then ``complete_and_claim`` on PostgreSQL (what
                     bench/claim_throughput.py measures against its own ceiling).

    .venv/bin/python bench/claim_mariadb.py --mysql-url mysql://root@127.0.0.1:3306/test \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

Each server gets a database of its own (``bench_claim_maria_<pid>_<random>``), dropped
however the run ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pymysql
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import (
    ServerCpu,
    commit,
    load,
    process_seconds,
    scratch_database,
    unique_name,
    wait_for_backends_gone,
)
from pipeline.queue.claim import WorkQueue
from pipeline.backends.mariadb import MARIADB
from pipeline.storage import db, migrate, schema

DB_NAME = unique_name("bench_claim_maria")
SYSTEMS = ("mariadb-minimal", "mariadb-project", "postgres-project")

MIN_LOCK = (
    "SELECT id FROM listings_raw WHERE processed_at IS NULL AND locked_until IS NULL"
    " ORDER BY fetched_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
MIN_LEASE = (
    "UPDATE listings_raw SET attempts = attempts + 1,"
    " locked_until = UTC_TIMESTAMP(6) + INTERVAL 300 SECOND, claimed_by = %s, claim_token = %s"
    " WHERE id IN ({ids})"
)
MIN_COMPLETE = (
    "UPDATE listings_raw SET processed_at = UTC_TIMESTAMP(6), locked_until = NULL, claimed_by = NULL,"
    " claim_token = NULL WHERE id IN ({ids}) AND claim_token = %s AND claimed_by = %s"
)

Result = tuple[int, float, float]  # rows completed, wall-clock end, client CPU seconds


def wait_until(start_at: float) -> float:
    time.sleep(max(0.0, start_at - time.time()))
    return time.process_time()


def minimal_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    u = db.parse_url(url)
    conn = pymysql.connect(host=u.host, port=u.port or 3306, user=u.username, password=u.password or "",
                           database=u.database, autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    done = 0
    cpu = wait_until(start_at)
    with conn.cursor() as cur:
        while True:
            token = uuid.uuid4().hex
            cur.execute(MIN_LOCK, (batch,))
            ids = [row[0] for row in cur.fetchall()]
            if not ids:
                conn.commit()
                break
            marks = ",".join(["%s"] * len(ids))
            cur.execute(MIN_LEASE.format(ids=marks), (worker, token, *ids))
            conn.commit()
            done += cur.execute(MIN_COMPLETE.format(ids=marks), (*ids, token, worker))
            conn.commit()
    conn.close()
    return done, time.time(), time.process_time() - cpu


def project_worker(url: str, worker: str, batch: int, start_at: float) -> Result:
    engine = db.create_engine(url, pool_size=1)
    queue = WorkQueue(engine, schema.RAW_UNPROCESSED, columns=())
    queue.release(queue.claim("warm-up", 1))  # connect before the clock starts
    done = 0
    cpu = wait_until(start_at)
    if engine.dialect.name == "postgresql":
        claim = queue.claim(worker, batch)
        while claim:
            fenced, claim = queue.complete_and_claim(claim, {"processed_at": datetime.now(UTC)}, batch)
            done += len(fenced.done)
    else:
        while claim := queue.claim(worker, batch):
            done += len(queue.complete(claim, {"processed_at": datetime.now(UTC)}).done)
    result = done, time.time(), time.process_time() - cpu
    engine.dispose()
    return result


WORKERS: dict[str, Callable[[str, str, int, float], Result]] = {
    "mariadb-minimal": minimal_worker, "mariadb-project": project_worker, "postgres-project": project_worker,
}


def run_workers(system: str, url: str, workers: int, batch: int) -> tuple[int, float, float]:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 4.0  # every process started and connected by then
    with spawn.Pool(workers) as pool:
        results = pool.starmap(WORKERS[system], [(url, f"w{i}", batch, start_at) for i in range(workers)])
    total = sum(done for done, _, _ in results)
    elapsed = max(finished for _, finished, _ in results) - start_at
    return total, elapsed, sum(cpu for _, _, cpu in results)


class MariaCpu:
    """CPU seconds of the MariaDB server on this host (one process, all its threads)."""

    def __init__(self) -> None:
        self.pid = next((e.name for e in os.scandir("/proc") if e.name.isdigit() and _comm(e.name) in
                         ("mariadbd", "mysqld")), None)

    def seconds(self) -> float | None:
        return process_seconds(self.pid) if self.pid else None


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def fill(engine: sa.Engine, source_id: int, rows: int) -> None:
    t = schema.listings_raw
    with engine.begin() as conn:
        conn.execute(sa.delete(t))
        start = datetime.now(UTC)
        for first in range(0, rows, 10_000):
            conn.execute(sa.insert(t), [
                {"source_id": source_id, "source_item_id": str(i), "url": f"http://127.0.0.1/{i}", "raw_json": {},
                 "content_hash": "h", "fetched_at": start}
                for i in range(first, min(rows, first + 10_000))
            ])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE TABLE listings_raw" if engine.dialect.name in MARIADB
                             else "VACUUM ANALYZE listings_raw")


def prepare(url: str) -> tuple[sa.Engine, int]:
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        source_id = conn.execute(
            sa.insert(schema.sources).values(name="bench", url="http://127.0.0.1/bench", source_type="rss")
            .returning(schema.sources.c.id)
        ).scalar_one()
    return engine, source_id


def measure(args: argparse.Namespace, maria_url: str, pg_url: str) -> None:
    engines = {"mariadb": prepare(maria_url), "postgres": prepare(pg_url)}
    urls = {"mariadb": maria_url, "postgres": pg_url}
    pg_cpu, maria_cpu = ServerCpu(engines["postgres"][0]), MariaCpu()
    with engines["mariadb"][0].connect() as conn:
        maria_version = conn.exec_driver_sql("SELECT VERSION()").scalar_one()
    with engines["postgres"][0].connect() as conn:
        pg_version = conn.exec_driver_sql("SHOW server_version").scalar_one()
    print(f"MariaDB {maria_version}, PostgreSQL {pg_version}, {os.cpu_count()} CPUs,"
          f" {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, load before {load()}")
    print(f"rows/s of wall time; CPU us per row: client + server = total; median of {args.repeat}"
          " interleaved runs; ratios to mariadb-minimal")
    for workers in [int(w) for w in args.workers.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            rows = args.rows
            rate: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            client: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            total: dict[str, list[float]] = {s: [] for s in SYSTEMS}
            for _ in range(args.repeat):
                for system in SYSTEMS:
                    server = system.split("-")[0]
                    engine, source_id = engines[server]
                    fill(engine, source_id, rows)
                    cpu = maria_cpu if server == "mariadb" else pg_cpu
                    before = cpu.seconds()
                    done, elapsed, client_cpu = run_workers(system, urls[server], workers, batch)
                    if server == "postgres":
                        wait_for_backends_gone(engine, DB_NAME)
                    after = cpu.seconds()
                    assert done == rows, f"{system}: {done} of {rows} rows completed"
                    rate[system].append(done / elapsed)
                    client[system].append(client_cpu / done * 1e6)
                    if before is not None and after is not None:
                        total[system].append((client_cpu + after - before) / done * 1e6)
            print(f"\n{workers} worker(s) x batch {batch}, {rows:,} rows, load {load()}")
            print(f"  {'system':<17} {'rows/s':>8} {'ratio':>6} {'client':>7} {'server':>7} {'total':>7} {'ratio':>6}")
            base_rate = statistics.median(rate["mariadb-minimal"])
            base_cpu = statistics.median(total["mariadb-minimal"]) if total["mariadb-minimal"] else None
            for system in SYSTEMS:
                r, c = statistics.median(rate[system]), statistics.median(client[system])
                line = f"  {system:<17} {r:>8,.0f} {r / base_rate:>6.2f} {c:>7.1f}"
                if total[system]:
                    t = statistics.median(total[system])
                    line += f" {t - c:>7.1f} {t:>7.1f} {t / base_cpu if base_cpu else float('nan'):>6.2f}"
                print(line, flush=True)
    for engine, _ in engines.values():
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mysql-url", default=os.environ.get("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
                        help="a MariaDB server where the benchmark may create a database")
    parser.add_argument("--database-url",
                        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
                        help="a PostgreSQL server where the benchmark may create a database")
    parser.add_argument("--workers", default="4")
    parser.add_argument("--batches", default="10,100")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is shown")
    args = parser.parse_args()
    maria_admin = sa.create_engine(db.parse_url(args.mysql_url), isolation_level="AUTOCOMMIT")
    pg_admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
    with maria_admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {DB_NAME} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        with scratch_database(pg_admin, DB_NAME):
            measure(
                args,
                db.parse_url(args.mysql_url).set(database=DB_NAME).render_as_string(hide_password=False),
                db.parse_url(args.database_url).set(database=DB_NAME).render_as_string(hide_password=False),
            )
    finally:
        with maria_admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME}")
        maria_admin.dispose()
        pg_admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

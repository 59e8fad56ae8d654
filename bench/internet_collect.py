"""The collector under real latency (issue 36, item 5): on the simulated internet
(bench/internet.py), how busy do the collector's threads stay? Requests in flight over
requests allowed, where allowed is what the threads and the politeness limits permit.

One pass over every source (all due at once): the simulator serves ``--hosts`` hosts
with ``--feeds-per-host`` feeds each, at its realistic latency (log-normal, median 150
ms, p99 2 s) and faults; every host is its own politeness group with the production
defaults (the migration's: 2 fetches at once, 1 s apart), not the loopback exemption. A
collector (``Collector.run``, what `pipeline collect` runs) with ``--threads`` threads
in each of ``--processes`` processes fetches every source once. From the simulator's
log (each request's start and end), reported:

* requests in flight, averaged over the pass until 90% of its requests had ended (the
  tail, where fewer sources are left than threads, is reported apart), over the
  requests allowed then: those in flight plus one for each group that could have
  started a fetch at that moment as the run stood (sources not yet started, fewer than
  2 in flight, its last start 1 s ago or more, no 429 asking it to wait), at most the
  threads (``in_flight``);
* fetches per second, the collector's CPU per fetch;
* how the answers split (200, 304, 429, 5xx, timeouts).

    .bench-venv/bin/pip install -e . -r bench/requirements.txt
    .bench-venv/bin/python bench/internet_collect.py --database-url postgresql://postgres@127.0.0.1:5432/test

It creates (and drops) its own database, ``bench_internet_<pid>_<random>``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit, load, scratch_database, unique_name  # noqa: E402
from pipeline.catalogue.sources import import_sources, make_spec  # noqa: E402
from pipeline.core.settings import Settings  # noqa: E402
from pipeline.fetching.collector import Collector  # noqa: E402
from pipeline.storage import db, migrate, schema  # noqa: E402
from pipeline.storage.politeness_groups import set_limits  # noqa: E402

HERE = Path(__file__).resolve().parent
RETRY_AFTER_SECONDS = 120.0  # what the simulator's 429s ask (bench/internet.py)


def start_internet(args: argparse.Namespace, log: Path, plan: Path) -> subprocess.Popen[bytes]:
    """The simulator in a process of its own; returns once it serves (it says so)."""
    internet = subprocess.Popen(
        [sys.executable, str(HERE / "internet.py"), "--hosts", str(args.hosts), "--feeds-per-host",
         str(args.feeds_per_host), "--port", str(args.port), "--seed", str(args.seed), "--log", str(log),
         "--plan", str(plan)],
        stderr=subprocess.PIPE,
    )
    assert internet.stderr is not None
    line = internet.stderr.readline().decode()  # its first line: the hosts it serves
    if "hosts on" not in line:
        internet.kill()
        raise SystemExit(f"the simulated internet did not start: {line}{internet.stderr.read().decode()}")
    return internet


def collect(url: str, threads: int, start_at: float) -> tuple[int, float, float, float]:
    """One process's collector: fetched, its start and end, CPU seconds."""
    settings = Settings(database_url=url, allow_networks=("127.0.0.0/8",), concurrency=threads)
    engine = db.create_engine(url)
    time.sleep(max(0.0, start_at - time.time()))
    began, cpu = time.time(), time.process_time()
    stats = Collector(engine, settings, worker=f"bench-{os.getpid()}").run()
    finished, spent = time.time(), time.process_time() - cpu
    engine.dispose()
    return stats.claimed, began, finished, spent


def in_flight(requests: list[tuple[float, float, str, int]], threads: int, per_group: int,
              interval: float, deferred_for: float) -> tuple[float, float, float, float]:
    """Average requests in flight and average requests allowed over the pass until 90%
    of the requests had ended, and the same over the rest (the tail).

    ``requests``: (start, end, host, status), one per source. Allowed, at each moment, is
    what was in flight plus one for each group that could have started a fetch then, as
    the run stood (sources of its own not yet started, fewer than ``per_group`` in
    flight, its last start ``interval`` seconds ago or more, not deferred by a 429 for
    ``deferred_for`` seconds after it), at most ``threads``. A group starts at most one
    fetch per interval: one more, not its whole limit. No model of latency: only the
    run's own states."""
    # (time, kind, host, status); kind: 1 start, -1 end, 0 a group may open
    events: list[tuple[float, int, str, int]] = []
    unstarted: dict[str, int] = {}
    for start, end, host, status in requests:
        events += [(start, 1, host, status), (end, -1, host, status), (start + interval, 0, host, status)]
        if status == 429:
            events.append((end + deferred_for, 0, host, status))
        unstarted[host] = unstarted.get(host, 0) + 1
    events.sort()
    ends = sorted(end for _, end, _, _ in requests)
    cut = ends[int(len(ends) * 0.9) - 1]
    flying: dict[str, int] = {}
    blocked_until: dict[str, float] = {}
    startable = set(unstarted)  # groups that could start a fetch now
    open_now, last = 0, events[0][0]
    busy = {"body": 0.0, "tail": 0.0}
    allowed = {"body": 0.0, "tail": 0.0}
    span = {"body": 0.0, "tail": 0.0}

    def can_start(host: str, at: float) -> bool:
        return unstarted[host] > 0 and flying.get(host, 0) < per_group and blocked_until.get(host, 0.0) <= at

    for at, kind, host, status in events:
        part = "body" if at <= cut else "tail"
        width = at - last
        busy[part] += open_now * width
        allowed[part] += min(threads, open_now + len(startable)) * width
        span[part] += width
        if kind == 1:
            open_now += 1
            unstarted[host] -= 1
            flying[host] = flying.get(host, 0) + 1
            blocked_until[host] = max(blocked_until.get(host, 0.0), at + interval)
        elif kind == -1:
            open_now -= 1
            flying[host] -= 1
            if status == 429:  # the host asked to wait: its group is deferred
                blocked_until[host] = max(blocked_until[host], at + deferred_for)
        if can_start(host, at):
            startable.add(host)
        else:
            startable.discard(host)
        last = at
    return (busy["body"] / span["body"], allowed["body"] / span["body"],
            busy["tail"] / max(span["tail"], 1e-9), allowed["tail"] / max(span["tail"], 1e-9))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL server where a database may be created")
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--feeds-per-host", type=int, default=4)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--port", type=int, default=18090)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    admin = sa.create_engine(args.database_url.replace("postgresql://", "postgresql+psycopg://", 1),
                             isolation_level="AUTOCOMMIT")
    work = Path(tempfile.mkdtemp(prefix="bench-internet-"))
    log, plan = work / "internet.jsonl", work / "plan.json"
    internet = start_internet(args, log, plan)
    try:
        with scratch_database(admin, unique_name("bench_internet")) as name:
            url = admin.url.set(database=name).render_as_string(hide_password=False)
            engine = db.create_engine(url)
            migrate.upgrade(engine)
            sources = json.loads(plan.read_text())["sources"]
            with engine.begin() as conn:
                import_sources(conn, [make_spec(u, source_type="rss", interval=60) for u in sources])
                groups = [name for (name,) in conn.execute(sa.select(schema.politeness_groups.c.name))]
                for name in groups:
                    if name != "*":
                        set_limits(conn, name, reset=True)  # the production defaults, not loopback's
                per_group, interval_ms = conn.execute(
                    sa.select(schema.politeness_groups.c.max_in_flight, schema.politeness_groups.c.min_interval_ms)
                    .where(schema.politeness_groups.c.name == "*")).one()
            engine.dispose()
            start_at = time.time() + 1.0
            with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
                results = pool.starmap(collect, [(url, args.threads, start_at)] * args.processes)
    finally:
        internet.terminate()
        internet.wait(30)
    fetched = sum(r[0] for r in results)
    began, ended = min(r[1] for r in results), max(r[2] for r in results)
    cpu = sum(r[3] for r in results)
    requests, statuses = [], {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "request":
            continue
        end = record["at"]
        requests.append((end - record["latency_ms"] / 1000, end, record["host"], record["status"]))
        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
    threads = args.threads * args.processes
    latency = sum(end - start for start, end, _, _ in requests) / len(requests)
    busy, allowed, tail_busy, tail_allowed = in_flight(requests, threads, per_group, interval_ms / 1000,
                                                       RETRY_AFTER_SECONDS)
    print(f"{args.hosts} hosts x {args.feeds_per_host} feeds, {args.processes} process(es) x {args.threads}"
          f" threads; each host its own group, {per_group} at once, {interval_ms} ms apart; mean latency"
          f" {1000 * latency:.0f} ms; commit {commit()}, load {load()}")
    print(f"  fetched {fetched} sources in {ended - began:.1f} s: {fetched / (ended - began):.1f} fetches/s,"
          f" collector CPU {1000 * cpu / max(fetched, 1):.2f} ms per fetch")
    print(f"  answers: {dict(sorted(statuses.items()))} (0: a held answer, logged when the client gave up)")
    print(f"  in flight / allowed, until 90% done: {busy:.1f} / {allowed:.1f} = {busy / allowed:.2f};"
          f" the tail: {tail_busy:.1f} / {tail_allowed:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

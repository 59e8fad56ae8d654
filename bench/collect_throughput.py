"""Collector throughput and CPU per feed: 500 feeds of 25 items served on 127.0.0.1, first
and unchanged pass, the project beside reader doing the same parsing work.

Measured in the same run, on the same bytes from the same server process, for each
parse setting (--parse):

* off -- the project's own options (``sanitize_html`` and ``resolve_relative_uris``
         off: raw rows keep what the feed sent, the processor turns them into plain
         text later; the project reads a plain RSS 2.0 or Atom document by its fast
         path, pipeline/fetching/quickfeed.py, with feedparser's results); reader made
         to parse the same way (feedparser with those options).
* on  -- both sanitise and resolve relative links at parse time (reader's default);
         the project made to parse that way (feedparser: the fast path does not apply).

Systems:

* project  -- `Collector.run` (what `pipeline collect` runs) in --processes processes,
              each with --concurrency threads, against PostgreSQL.
* reader   -- the `reader` library's `update_feeds(workers=--concurrency)` (its own
              SQLite, in this process): threads are the only concurrency it offers.
* parse only -- feedparser alone with the setting's options, and the project's
              ``parse_feed``, parsing the same documents on every core.

Then every source is made due again and both fetch a second time: the server answers
304 Not Modified to both (ETag), so that pass measures scheduling and bookkeeping.
Reported per pass: feeds per second of wall time, CPU milliseconds per feed (the
project: its worker processes' own accounting plus the PostgreSQL cluster's, from
/proc; reader: this process, whose threads and SQLite do its work; the feed server's
CPU is left out for both, and printed beside them: it shares the cores) and the most
requests the server had in flight at once and on average (the time its requests were
open, over the pass's: how busy the clients kept their threads). The
median of --repeats runs, the systems interleaved; then the peak memory of a collector
process for 100 and 500 sources.

The server waits --latency-ms (20 by default) before each answer, as a remote host's
round trip would, so the clients' concurrency shows (the most requests in flight).
The server sets TCP_NODELAY, as production web servers do: without it, Python's
http.server sends the tail of each body after a delayed ACK (~40 ms per response).

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/collect_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

A database ``bench_collect_<pid>_<random>`` per run, dropped however the run ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

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
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.storage import db, migrate, politeness_groups, schema

DB_NAME = unique_name("bench_collect")
ITEMS = 25


def make_feed(n: int) -> bytes:
    """About 25 KB: 25 items of roughly 1 KB, as a typical blog or job feed."""
    published = format_datetime(datetime(2026, 11, 20, 12, 0, tzinfo=UTC), usegmt=True)
    items = "".join(
        f"<item><guid>feed{n}-item{i}</guid><title>Feed {n} item {i}: a title of some length</title>"
        f"<link>http://127.0.0.1/feed{n}/item{i}</link><pubDate>{published}</pubDate>"
        f"<category>bench</category><description>{'Lorem ipsum dolor sit amet. ' * 30}</description></item>"
        for i in range(ITEMS)
    )
    return (
        f"<?xml version='1.0' encoding='utf-8'?><rss version='2.0'><channel><title>Feed {n}</title>"
        f"<link>http://127.0.0.1/</link><description>bench</description>{items}</channel></rss>"
    ).encode()


PARSE_ON = {"resolve_relative_uris": True, "sanitize_html": True}
PARSE_OFF = {"resolve_relative_uris": False, "sanitize_html": False}


def serve(port_queue: multiprocessing.Queue, feeds: int, latency: float) -> None:
    bodies = {f"/feed/{n}": make_feed(n) for n in range(feeds)}
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most since the last /stats
    busy = [0.0]  # seconds of requests open, summed, since the last /stats

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/stats":  # the most requests in flight at once, their time; reset
                with lock:
                    body, in_flight[1], busy[0] = f"{in_flight[1]} {busy[0]}".encode(), 0, 0.0
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            with lock:
                in_flight[0] += 1
                in_flight[1] = max(in_flight)
            opened = time.monotonic()
            try:
                time.sleep(latency)  # a remote host's round trip
                self.answer()
            finally:
                with lock:
                    in_flight[0] -= 1
                    busy[0] += time.monotonic() - opened

        def answer(self) -> None:
            body = bodies.get(self.path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            etag = f'"{self.path}"'
            if self.headers.get("If-None-Match") == etag:
                self.send_response(304)
                self.send_header("ETag", etag)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/rss+xml")
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        # socketserver's default listen backlog is 5: with 32 clients connecting at once
        # the kernel drops the surplus SYNs, and those connections start a second later
        # (the SYN's retransmission), which stalled some passes by a second.
        request_queue_size = 128

        def get_request(self) -> tuple[socket.socket, object]:
            conn, address = super().get_request()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn, address

    server = Server(("127.0.0.1", 0), Handler)
    port_queue.put(server.server_address[1])
    server.serve_forever()


def in_flight(port: int) -> tuple[int, float]:
    """The most requests the feed server had in flight at once since the last call, and
    the seconds its requests were open, summed."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as answer:
        most, busy = answer.read().split()
    return int(most), float(busy)


Collected = tuple[int, int, float, int, float]  # fetched, new items, end, peak KiB, CPU s
# A pass: seconds, CPU seconds, the most requests in flight, the seconds requests were
# open (summed), the feed server's CPU seconds.
Pass = tuple[float, float, int, float, float]


def collect_worker(url: str, concurrency: int, start_at: float, options: dict[str, bool]) -> Collected:
    from pipeline.fetching import rss

    rss.FEEDPARSER_OPTIONS.update(options)  # the setting measured (the project's own: off)
    settings = Settings(database_url=url, allow_networks=("127.0.0.1/32",), concurrency=concurrency)
    engine = db.create_engine(url)
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    stats = Collector(engine, settings, worker=f"bench-{os.getpid()}").run()
    finished, spent = time.time(), time.process_time() - cpu
    engine.dispose()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return stats.succeeded, stats.items_new, finished, peak_kib, spent


def run_collectors(url: str, processes: int, concurrency: int, options: dict[str, bool]) -> Collected:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0
    with spawn.Pool(processes) as pool:
        results = pool.starmap(collect_worker, [(url, concurrency, start_at, options)] * processes)
    return (sum(r[0] for r in results), sum(r[1] for r in results), max(r[2] for r in results) - start_at,
            max(r[3] for r in results), sum(r[4] for r in results))


def parse_one(job: tuple[bytes, dict[str, bool]]) -> int:
    import feedparser

    body, options = job
    return len(feedparser.parse(body, **options).entries)


def project_parse_one(job: tuple[bytes, dict[str, bool]]) -> int:
    from pipeline.fetching import rss

    body, options = job
    rss.FEEDPARSER_OPTIONS.update(options)
    return len(rss.parse_feed(body, "http://127.0.0.1/feed", "application/rss+xml"))


@contextmanager
def reader_parsing(options: dict[str, bool]) -> Iterator[None]:
    """reader's feedparser call with ``options`` instead of its own (sanitising and
    resolving on): the module it calls through, with ``parse`` forcing them."""
    from reader._parser import feedparser as reader_parser

    real = reader_parser.feedparser

    class Forced:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        @staticmethod
        def parse(resource: object, **kwargs: object) -> object:
            return real.parse(resource, **{**kwargs, **options})

    reader_parser.feedparser = Forced()  # type: ignore[assignment]
    try:
        yield
    finally:
        reader_parser.feedparser = real


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--feeds", type=int, default=500)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parse", default="off,on", help="the parse settings to measure: off, on or both")
    parser.add_argument("--latency-ms", type=float, default=20.0,
                        help="the server waits this long before each answer, as a remote host's round"
                             " trip would: with none, a response is served in well under a millisecond"
                             " and no two requests overlap at the server, whatever the client's threads")
    args = parser.parse_args()
    settings = {"off": PARSE_OFF, "on": PARSE_ON}
    chosen = [p for p in args.parse.split(",") if p]
    if not chosen or set(chosen) - settings.keys():
        parser.error("--parse takes off, on or off,on")

    spawn = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = spawn.Queue()
    server = spawn.Process(target=serve, args=(ports, args.feeds, args.latency_ms / 1000), daemon=True)
    server.start()
    port = ports.get(timeout=30)
    feed_urls = [f"http://127.0.0.1:{port}/feed/{n}" for n in range(args.feeds)]
    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")

    def fill(engine: sa.Engine, urls: list[str]) -> None:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            # Every feed is on 127.0.0.1, the peers do not limit per host: the group's
            # limits are lifted so both sides fetch as fast as they can.
            politeness_groups.set_limits(conn, "127.0.0.1", max_in_flight=10_000, min_interval_seconds=0)
            conn.execute(sa.insert(schema.sources), [
                {"name": u, "url": u, "source_type": "rss", "politeness_group": "127.0.0.1"} for u in urls
            ])

    def feed_server_seconds() -> float:
        spent = process_seconds(server.pid or 0)
        assert spent is not None, "the feed server is gone"
        return spent

    def project_passes(options: dict[str, bool]) -> list[Pass]:
        """The first and the second pass."""
        passes = []
        with scratch_database(admin, DB_NAME):
            url = db.parse_url(args.database_url).set(database=DB_NAME).render_as_string(hide_password=False)
            engine = db.create_engine(url)
            fill(engine, feed_urls)
            server_cpu = ServerCpu(engine)
            for expected_items in (args.feeds * ITEMS, 0):
                in_flight(port)
                before, feed_server = server_cpu.seconds(), feed_server_seconds()
                fetched, items, elapsed, _, cpu = run_collectors(url, args.processes, args.concurrency, options)
                feed_server = feed_server_seconds() - feed_server
                wait_for_backends_gone(engine, DB_NAME)
                after = server_cpu.seconds()
                assert fetched == args.feeds and items == expected_items, (fetched, items)
                cpu += (after - before) if before is not None and after is not None else 0.0
                passes.append((elapsed, cpu, *in_flight(port), feed_server))
                with engine.begin() as conn:  # every source due again
                    conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
            engine.dispose()
        return passes

    def reader_passes(options: dict[str, bool]) -> list[Pass]:
        from reader import make_reader

        passes = []
        with tempfile.TemporaryDirectory() as tmp, reader_parsing(options):
            reader = make_reader(str(Path(tmp) / "reader.sqlite"))
            for u in feed_urls:
                reader.add_feed(u)
            for _ in range(2):
                in_flight(port)
                started, cpu, feed_server = time.monotonic(), time.process_time(), feed_server_seconds()
                reader.update_feeds(workers=args.concurrency, scheduled=False)
                passes.append((time.monotonic() - started, time.process_time() - cpu, *in_flight(port),
                               feed_server_seconds() - feed_server))
            entries = reader.get_entry_counts().total
            reader.close()
        assert entries == args.feeds * ITEMS, entries
        return passes

    print(f"{args.feeds} feeds x {ITEMS} items ({len(make_feed(0)) // 1024} KB each), {os.cpu_count()} CPUs,"
          f" project {args.processes} processes x {args.concurrency} threads, reader {args.concurrency} threads,"
          f" server latency {args.latency_ms:g} ms, median of {args.repeats},"
          f" {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit()}, load {load()}",
          flush=True)
    bodies = [make_feed(n) for n in range(args.feeds)]
    for name in chosen:
        options = settings[name]
        project: list[list[Pass]] = []
        reader: list[list[Pass]] = []
        for _ in range(args.repeats):
            project.append(project_passes(options))
            reader.append(reader_passes(options))
        parse_only = {}
        for label, parse in (("feedparser", parse_one), ("the project's parse_feed", project_parse_one)):
            with spawn.Pool(os.cpu_count()) as pool:  # parsing alone, every core
                pool.map(parse, [(b, options) for b in bodies[:4]])  # warm the imports
                started = time.monotonic()
                parsed = sum(pool.map(parse, [(b, options) for b in bodies], chunksize=8))
                parse_only[label] = time.monotonic() - started
            assert parsed == args.feeds * ITEMS
        print(f"\nparse {name} ({', '.join(f'{k}={v}' for k, v in options.items())}), load {load()}")
        print(f"  {'pass':<16} {'project':>9} {'reader':>9} {'ratio':>6} {'ms CPU/feed':>12} {'reader':>7}"
              f" {'ratio':>6} {'in flight':>10} {'mean in flight':>15} {'feed server ms/feed':>20}")
        for i, label in enumerate(("first (200, new)", "second (304)")):
            p_rate = statistics.median(args.feeds / run[i][0] for run in project)
            r_rate = statistics.median(args.feeds / run[i][0] for run in reader)
            p_cpu = statistics.median(run[i][1] / args.feeds * 1000 for run in project)
            r_cpu = statistics.median(run[i][1] / args.feeds * 1000 for run in reader)
            flight = f"{max(run[i][2] for run in project)}/{max(run[i][2] for run in reader)}"
            mean_flight = "/".join(
                f"{statistics.median(run[i][3] / run[i][0] for run in runs):.1f}" for runs in (project, reader)
            )
            feed_server = "/".join(
                f"{statistics.median(run[i][4] / args.feeds * 1000 for run in runs):.2f}" for runs in (project, reader)
            )
            print(f"  {label:<16} {p_rate:>9.0f} {r_rate:>9.0f} {p_rate / r_rate:>6.2f} {p_cpu:>12.2f}"
                  f" {r_cpu:>7.2f} {r_cpu / p_cpu:>6.2f} {flight:>10} {mean_flight:>15} {feed_server:>20}",
                  flush=True)
        print("  parsing alone, every core: " + ", ".join(
            f"{label} {args.feeds / seconds:.0f} feeds/s" for label, seconds in parse_only.items()))
        print(f"  each run, first pass feeds/s: project {'/'.join(f'{args.feeds / r[0][0]:.0f}' for r in project)},"
              f" reader {'/'.join(f'{args.feeds / r[0][0]:.0f}' for r in reader)}")

    # Peak memory with a fifth of the sources, then all: it should not grow with their number.
    for count in (args.feeds // 5, args.feeds):
        with scratch_database(admin, DB_NAME):
            url = db.parse_url(args.database_url).set(database=DB_NAME).render_as_string(hide_password=False)
            engine = db.create_engine(url)
            fill(engine, feed_urls[:count])
            peak = run_collectors(url, args.processes, args.concurrency, PARSE_OFF)[3]
            engine.dispose()
        print(f"collector peak RSS per process with {count} sources: {peak // 1024} MiB")
    server.terminate()
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

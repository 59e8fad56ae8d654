"""Collector throughput: 500 feeds of 25 items served on 127.0.0.1, first and unchanged pass.

Measured in the same run, on the same bytes from the same server process:

* project  -- `Collector.run` (what `pipeline collect` runs) in --processes processes,
              each with --concurrency threads, against PostgreSQL.
* reader   -- the `reader` library's `update_feeds(workers=16)` (its own SQLite).
* ceiling  -- feedparser alone, with the project's options, parsing the same 500
              documents on every core.

Then every source is made due again and both fetch a second time: the server answers
304 Not Modified to both (ETag), so that pass measures scheduling and bookkeeping.
Each pass is repeated --repeats times, the project and reader interleaved, and the
median is reported (a one-second pass swings +-20% on a 2-core machine).
Finally, the peak memory of a collector process is compared for 100 and 500 sources.

The server sets TCP_NODELAY, as production web servers do: without it, Python's
http.server sends the tail of each body after a delayed ACK (~40 ms per response).

    .bench-venv/bin/pip install -e . -r bench/requirements.txt
    .bench-venv/bin/python bench/collect_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test
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
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import unique_name
from pipeline.core.settings import Settings
from pipeline.fetching import politeness
from pipeline.fetching.collector import Collector
from pipeline.storage import db, migrate, schema

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


def serve(port_queue: multiprocessing.Queue, feeds: int) -> None:
    bodies = {f"/feed/{n}": make_feed(n) for n in range(feeds)}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
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

        def get_request(self) -> tuple[socket.socket, object]:
            conn, address = super().get_request()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return conn, address

    server = Server(("127.0.0.1", 0), Handler)
    port_queue.put(server.server_address[1])
    server.serve_forever()


def collect_worker(url: str, concurrency: int, start_at: float) -> tuple[int, int, float, int]:
    settings = Settings(database_url=url, allow_networks=("127.0.0.1/32",), concurrency=concurrency)
    engine = db.create_engine(url)
    time.sleep(max(0.0, start_at - time.time()))
    stats = Collector(engine, settings, worker=f"bench-{os.getpid()}").run()
    finished = time.time()
    engine.dispose()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return stats.succeeded, stats.items_new, finished, peak_kib


def run_collectors(url: str, processes: int, concurrency: int) -> tuple[int, int, float, int]:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0
    with spawn.Pool(processes) as pool:
        results = pool.starmap(collect_worker, [(url, concurrency, start_at)] * processes)
    fetched = sum(r[0] for r in results)
    items = sum(r[1] for r in results)
    return fetched, items, max(r[2] for r in results) - start_at, max(r[3] for r in results)


def parse_one(body: bytes) -> int:
    import feedparser

    from pipeline.fetching.rss import FEEDPARSER_OPTIONS

    return len(feedparser.parse(body, **FEEDPARSER_OPTIONS).entries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--feeds", type=int, default=500)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    spawn = multiprocessing.get_context("spawn")
    ports: multiprocessing.Queue = spawn.Queue()
    server = spawn.Process(target=serve, args=(ports, args.feeds), daemon=True)
    server.start()
    port = ports.get(timeout=30)
    feed_urls = [f"http://127.0.0.1:{port}/feed/{n}" for n in range(args.feeds)]

    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")

    def fresh_database(urls: list[str]) -> tuple[sa.Engine, str]:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
            conn.exec_driver_sql(f"CREATE DATABASE {DB_NAME}")
        url = db.parse_url(args.database_url).set(database=DB_NAME).render_as_string(hide_password=False)
        engine = db.create_engine(url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            # Every feed is on 127.0.0.1, the peers do not limit per host: the group's
            # limits are lifted so both sides fetch as fast as they can.
            politeness.set_limits(conn, "127.0.0.1", max_in_flight=10_000, min_interval_seconds=0)
            conn.execute(sa.insert(schema.sources), [
                {"name": u, "url": u, "source_type": "rss", "politeness_group": "127.0.0.1"} for u in urls
            ])
        return engine, url

    def make_due(engine: sa.Engine) -> None:
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=None))

    def project_passes() -> tuple[float, float, int]:
        engine, url = fresh_database(feed_urls)
        fetched, items, first, peak = run_collectors(url, args.processes, args.concurrency)
        assert fetched == args.feeds and items == args.feeds * ITEMS, (fetched, items)
        make_due(engine)
        fetched, items, second, _ = run_collectors(url, args.processes, args.concurrency)
        assert fetched == args.feeds and items == 0, (fetched, items)
        engine.dispose()
        return first, second, peak

    def reader_passes() -> tuple[float, float]:
        from reader import make_reader

        with tempfile.TemporaryDirectory() as tmp:
            reader = make_reader(str(Path(tmp) / "reader.sqlite"))
            for u in feed_urls:
                reader.add_feed(u)
            started = time.monotonic()
            reader.update_feeds(workers=16, scheduled=False)
            first = time.monotonic() - started
            entries = reader.get_entry_counts().total
            started = time.monotonic()
            reader.update_feeds(workers=16, scheduled=False)
            second = time.monotonic() - started
            reader.close()
        assert entries == args.feeds * ITEMS, entries
        return first, second

    print(f"{args.feeds} feeds x {ITEMS} items ({len(make_feed(0)) // 1024} KB each), "
          f"{os.cpu_count()} CPUs, {args.processes} processes x {args.concurrency} threads, "
          f"median of {args.repeats}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    project: list[tuple[float, float, int]] = []
    reader: list[tuple[float, float]] = []
    for _ in range(args.repeats):
        project.append(project_passes())
        reader.append(reader_passes())

    # Peak memory with a fifth of the sources: it should not grow with their number.
    engine, url = fresh_database(feed_urls[: args.feeds // 5])
    _, _, _, peak_100 = run_collectors(url, args.processes, args.concurrency)
    engine.dispose()

    # -- parse-only ceiling ------------------------------------------------------------
    bodies = [make_feed(n) for n in range(args.feeds)]
    with spawn.Pool(os.cpu_count()) as pool:
        pool.map(parse_one, bodies[:4])  # warm the workers' imports
        started = time.monotonic()
        parsed = sum(pool.map(parse_one, bodies, chunksize=8))
        ceiling = time.monotonic() - started
    assert parsed == args.feeds * ITEMS

    first, second = (statistics.median(p[i] for p in project) for i in (0, 1))
    reader_first, reader_second = (statistics.median(r[i] for r in reader) for i in (0, 1))
    peak_500 = max(p[2] for p in project)

    def rate(seconds: float) -> float:
        return args.feeds / seconds

    def runs(values: list[float]) -> str:
        return "/".join(f"{rate(v):.0f}" for v in values)

    print(f"{'pass':<22} {'project':>10} {'reader':>10} {'ratio':>6} {'parse ceiling':>14}   (feeds/s)")
    print(f"{'first (200, new)':<22} {rate(first):>10.0f} {rate(reader_first):>10.0f}"
          f" {reader_first / first:>6.2f} {rate(ceiling):>14.0f}")
    print(f"{'second (304)':<22} {rate(second):>10.0f} {rate(reader_second):>10.0f}"
          f" {reader_second / second:>6.2f}")
    print(f"each run: first pass project {runs([p[0] for p in project])}, reader {runs([r[0] for r in reader])};"
          f" second pass project {runs([p[1] for p in project])}, reader {runs([r[1] for r in reader])}")
    print(f"items/s, first pass: project {args.feeds * ITEMS / first:.0f}, reader {args.feeds * ITEMS / reader_first:.0f}")
    print(f"collector peak RSS per process: {peak_100 // 1024} MiB with {args.feeds // 5} sources,"
          f" {peak_500 // 1024} MiB with {args.feeds}")
    server.terminate()
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

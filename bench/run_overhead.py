"""Per-run overhead: one collector pass as a bare command against the same pass as a
Dagster run, on the same feeds, the same database, in the same run of this script.

* bare     -- `pipeline collect` (the pass alone: a Python process, the claim, the fetches)
* job      -- `dagster job execute -j collect`: the stage's named job as the sensors
              launch it (in-process executor, no asset checks)
* asset    -- `dagster asset materialize --select listings_raw`: the asset with the
              default multiprocess executor and its checks, as runs were launched before
              the named jobs (issue 13)

Before each pass every source is made due again and its validators dropped, so each pass
fetches and parses --feeds feeds of 25 items served on 127.0.0.1 (the items are known
after the first pass, so each stores nothing new: the same work every time). The three
are interleaved, --repeats times, and the medians are reported: wall time, CPU time of
the command's processes, and the overhead (wall time less the bare pass's).

    .venv/bin/python bench/run_overhead.py --feeds 100 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.storage import db, migrate, schema

BIN = Path(sys.executable).parent
ITEMS = 25


def feed(n: int) -> bytes:
    items = "".join(
        f"<item><guid>f{n}-{i}</guid><title>Feed {n} item {i}</title><link>http://127.0.0.1/f{n}/{i}</link>"
        f"<description>{'Lorem ipsum dolor sit amet. ' * 30}</description></item>"
        for i in range(ITEMS)
    )
    return f'<?xml version="1.0"?><rss version="2.0"><channel><title>F{n}</title>{items}</channel></rss>'.encode()


class Feeds(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.bodies.get(self.path)
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/rss+xml")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, format: str, *args: object) -> None:
        pass


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{argv[0]} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--feeds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    Feeds.bodies = {f"/f{n}": feed(n) for n in range(args.feeds)}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Feeds)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        state = Path(tmp)
        url = f"sqlite:///{state / 'pipeline.db'}"
        (state / "dagster").mkdir()
        (state / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = {**os.environ, "DATABASE_URL": url, "DAGSTER_HOME": str(state / "dagster"),
               "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32", "PIPELINE_STATE_DIR": str(state)}
        engine = db.create_engine(url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            conn.execute(sa.insert(schema.sources), [
                {"name": f"f{n}", "url": f"http://127.0.0.1:{port}/f{n}", "source_type": "rss",
                 "politeness_group": "*"} for n in range(args.feeds)
            ])
            conn.execute(sa.update(schema.politeness_groups).values(max_in_flight=64, min_interval_ms=0))

        def due_again() -> None:
            with engine.begin() as conn:
                conn.execute(sa.update(schema.sources).values(next_fetch_at=None, etag=None, last_modified=None))

        commands = {
            "bare": [str(BIN / "pipeline"), "collect", "--json"],
            "job": [str(BIN / "dagster"), "job", "execute", "-m", "pipeline.definitions", "-j", "collect"],
            "asset": [str(BIN / "dagster"), "asset", "materialize", "-m", "pipeline.definitions",
                      "--select", "listings_raw"],
        }
        due_again()
        timed(commands["bare"], env)  # the first pass stores the items; the rest store none
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, argv in commands.items():
                due_again()
                results[name].append(timed(argv, env))
        with engine.connect() as conn:
            fetched = conn.execute(sa.select(sa.func.count()).select_from(schema.ingestion_events).where(
                schema.ingestion_events.c.event == "ingestion.completed")).scalar_one()
        engine.dispose()
    server.shutdown()

    bare_wall = statistics.median(w for w, _ in results["bare"])
    print(f"{args.feeds} feeds x {ITEMS} items, {args.repeats} interleaved repeats, medians "
          f"({fetched} fetches recorded in all)")
    print("| command | wall s | CPU s | overhead s (wall - bare) |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall - bare_wall:+.2f} |")


if __name__ == "__main__":
    main()

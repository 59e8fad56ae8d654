"""What the story detector costs the server per new listing: the processor with it and without.

Each run is one processor (`Processor.run`, batches of --batch) over a fresh copy
(CREATE DATABASE ... TEMPLATE) of one database of --rows raw rows (varied text, as
bench/process_throughput.py makes them: every row a new listing), the two systems
alternating --repeats times:

* with     -- the processor as it is: each new listing's story keys stored (five more
              index entries), the story lock, the candidates' lookup, the clusters' update.
* without  -- the same processor with the detector taken out in this process only: no
              keys stored (their partial indexes skip the row), no lock, no lookup. The
              client still takes each listing's marks, so the client's difference is
              the assignment's alone.

Reported: server CPU (the PostgreSQL cluster's processes, from /proc) and client CPU per
new listing, each system's median, and the detector's share: the medians' difference
(issue 36's decided target: at most 60 us of server CPU per new listing).

    .venv/bin/python bench/story_cost.py --database-url postgresql://postgres@127.0.0.1:5432/test

Databases ``bench_story_*_<pid>_<random>``, dropped however the run ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.process_throughput import admin_engine, database_url, fill_template
from bench.scratch import ServerCpu, commit, load, scratch_database, unique_name
from pipeline.core.settings import Settings
from pipeline.listings import stories
from pipeline.listings.processor import Processor
from pipeline.storage import db, schema


@contextlib.contextmanager
def without_detector() -> Iterator[None]:
    """The processor in this process stores no story keys and looks for no stories."""
    columns, assign = stories.Marks.columns, stories.assign
    stories.Marks.columns = lambda self: {"simhash": None, **dict.fromkeys(schema.STORY_KEYS)}  # type: ignore[method-assign]
    stories.assign = lambda conn, new: 0
    try:
        yield
    finally:
        stories.Marks.columns, stories.assign = columns, assign  # type: ignore[method-assign]


def run_once(url: str, batch: int) -> tuple[float, float]:
    """Server and client CPU us per new listing of one processor pass."""
    engine = db.create_engine(url)
    server = ServerCpu(engine)
    processor = Processor(engine, Settings(database_url=url), worker=f"bench-{os.getpid()}", batch_size=batch)
    server_before, client_before = server.seconds(), time.process_time()
    stats = processor.run()
    server_after, client_after = server.seconds(), time.process_time()
    engine.dispose()
    assert stats.inserted == stats.claimed and stats.failed == 0, stats
    assert server_before is not None and server_after is not None, "the server's CPU is not readable here"
    return ((server_after - server_before) / stats.inserted * 1e6,
            (client_after - client_before) / stats.inserted * 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    admin = admin_engine(args.database_url)
    measured: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with scratch_database(admin, unique_name("bench_story_template")) as template:
        fill_template(database_url(args.database_url, template), args.rows, "varied")
        for n in range(args.repeats):
            for system, values in measured.items():
                with scratch_database(admin, unique_name(f"bench_story_{system}{n}"), template=template) as name:
                    url = database_url(args.database_url, name)
                    with without_detector() if system == "without" else contextlib.nullcontext():
                        server, client = run_once(url, args.batch)
                values.append((server, client))
                print(f"  {system:<8} server {server:6.1f}  client {client:6.1f}  (CPU us per new listing)", flush=True)
    print(f"{args.rows:,} new listings, batch {args.batch}, median of {args.repeats} interleaved, {started},"
          f" commit {commit()}, load {load()}")
    medians = {system: tuple(statistics.median(v[i] for v in values) for i in (0, 1))
               for system, values in measured.items()}
    for system, (server, client) in medians.items():
        print(f"  {system:<8} server {server:6.1f}  client {client:6.1f}")
    pairs = [w[0] - o[0] for w, o in zip(measured["with"], measured["without"], strict=True)]
    print(f"the detector: server {medians['with'][0] - medians['without'][0]:.1f} us per new listing"
          f" (pairs {min(pairs):.1f} to {max(pairs):.1f}), client {medians['with'][1] - medians['without'][1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Processor throughput and CPU per row: raw rows become listings, beside a fair ceiling.

Measured in the same run, each on a fresh copy (CREATE DATABASE ... TEMPLATE) of one
database holding the same raw rows, --workers processes each, the systems taking turns:

* project  -- `Processor.run` (what `pipeline process` and the `listings` asset run):
              claim a batch, normalise in Python (HTML to text, dates, categories), mark
              processed and upsert listings in one transaction.
* ceiling  -- the same work with no Python per row: the project's claim returning only
              the ids, then ONE statement that marks the rows processed (fenced) and
              upserts their listings straight from the raw JSON in SQL, pipelined with
              the next claim (one round trip and one commit per batch), by psycopg alone.
              It does not clean HTML: it is a ceiling, not a peer.

Reported: rows per second of wall time and CPU per row, client (the worker processes'
own accounting) and server (the PostgreSQL cluster's processes, from /proc), each the
median of --repeats interleaved runs; the figure of merit is ceiling CPU / project CPU.

    .venv/bin/python bench/process_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

Databases ``bench_process_*_<pid>_<random>``, dropped however the run ends.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claim_throughput import pipelined_drain
from bench.scratch import (
    ServerCpu,
    commit,
    load,
    scratch_database,
    unique_name,
    wait_for_backends_gone,
)
from pipeline.storage import db, migrate, schema

TEMPLATE = unique_name("bench_process_template")
RUN_DB = unique_name("bench_process_run")
SUMMARY = (
    "<p>We are hiring a <b>senior engineer</b> to work on our data platform &amp; APIs."
    " You will design pipelines, review code and mentor others.</p>"
    "<ul><li>Python, SQL</li><li>Remote friendly</li></ul>"
)
# --text varied: each row's summary also has 12 words of its own from these, so rows are
# not near-identical texts (the story detector, pipeline/listings/stories.py, files every
# row under the same keys when they are: its worst case, --text same).
WORDS = [f"{a}{b}{c}" for a in "bcdfghklmnprst" for b in "aeiou" for c in "lmnrstx"]

# The ceiling's work after the claim, in one statement: mark the claimed rows processed
# (fenced by token and worker) and upsert the listings of the rows it marked.
CEILING_WRITE = """
WITH marked AS (
    UPDATE listings_raw SET processed_at = now(), last_error = NULL,
           locked_until = NULL, claimed_by = NULL, claim_token = NULL
    WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND claimed_by = %(worker)s
    RETURNING id, source_id, source_item_id, raw_json, content_hash)
INSERT INTO listings (source_id, source_item_id, url, title, summary, author, published_at,
                      categories, content_hash, raw_id, item_key)
SELECT r.source_id, r.source_item_id, r.raw_json->>'url', r.raw_json->>'title',
       r.raw_json->>'summary', r.raw_json->>'author', (r.raw_json->>'published_at')::timestamptz,
       r.raw_json->'categories', r.content_hash, r.id, md5(r.raw_json->>'url')
FROM marked r
ON CONFLICT (source_id, source_item_id) DO UPDATE SET
    url = excluded.url, title = excluded.title, summary = excluded.summary,
    author = excluded.author, published_at = excluded.published_at,
    categories = excluded.categories, content_hash = excluded.content_hash,
    raw_id = excluded.raw_id, item_key = excluded.item_key,
    updated_at = CASE WHEN listings.content_hash <> excluded.content_hash THEN now() ELSE listings.updated_at END,
    matched_at = CASE WHEN listings.content_hash <> excluded.content_hash THEN NULL ELSE listings.matched_at END
WHERE listings.raw_id IS NULL OR excluded.raw_id >= listings.raw_id
"""


def admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(db.parse_url(url), isolation_level="AUTOCOMMIT")


def database_url(base: str, name: str) -> str:
    return db.parse_url(base).set(database=name).render_as_string(hide_password=False)


def fill_template(url: str, rows: int, text: str) -> None:
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    rng = random.Random(1)
    with engine.begin() as conn:
        sources = [
            conn.execute(sa.insert(schema.sources).values(
                name=f"s{i}", url=f"http://127.0.0.1/feed/{i}", source_type="rss",
                config={"category": "jobs"}).returning(schema.sources.c.id)).scalar_one()
            for i in range(100)
        ]
    batch = []
    for i in range(rows):
        url = f"http://127.0.0.1/item/{i}"
        batch.append({
            "source_id": sources[i % len(sources)], "source_item_id": f"item-{i}", "url": url,
            "raw_json": {"title": f"Engineer #{i}: <i>Python</i> &amp; data", "url": url,
                         "summary": SUMMARY if text == "same" else f"{SUMMARY}<p>{' '.join(rng.sample(WORDS, 12))}</p>",
                         "published_at": (start + timedelta(seconds=i)).isoformat(),
                         "author": "Hiring team", "categories": ["jobs", "python"]},
            "content_hash": uuid.uuid4().hex, "fetched_at": start + timedelta(seconds=i),
        })
        if len(batch) == 10_000:
            with engine.begin() as conn:
                conn.execute(sa.insert(schema.listings_raw), batch)
            batch = []
    if batch:
        with engine.begin() as conn:
            conn.execute(sa.insert(schema.listings_raw), batch)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()


Result = tuple[int, float, float]  # rows, wall-clock end, client CPU seconds


def project_worker(url: str, batch: int, start_at: float) -> Result:
    from pipeline.core.settings import Settings
    from pipeline.listings.processor import Processor

    engine = db.create_engine(url)
    processor = Processor(engine, Settings(database_url=url), worker=f"bench-{os.getpid()}", batch_size=batch)
    time.sleep(max(0.0, start_at - time.time()))
    cpu = time.process_time()
    stats = processor.run()
    result = stats.claimed, time.time(), time.process_time() - cpu
    engine.dispose()
    assert stats.failed == 0 and stats.gave_up == 0, stats
    return result


def ceiling_worker(url: str, batch: int, start_at: float) -> Result:
    import psycopg

    driver_url = db.parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(driver_url, autocommit=True, prepare_threshold=0) as conn:
        time.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        done = pipelined_drain(conn, f"ceiling-{os.getpid()}", batch, CEILING_WRITE)
        return done, time.time(), time.process_time() - cpu


WORKERS = {"project": project_worker, "ceiling": ceiling_worker}


def run_workers(system: str, url: str, workers: int, batch: int) -> Result:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 4.0
    with spawn.Pool(workers) as pool:
        results = pool.starmap(WORKERS[system], [(url, batch, start_at)] * workers)
    total = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results) - start_at
    return total, elapsed, sum(r[2] for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--text", choices=("same", "varied"), default="same",
                        help="every row one summary (as before 2026-11-25), or each its own words too")
    args = parser.parse_args()

    admin = admin_engine(args.database_url)
    with scratch_database(admin, TEMPLATE):
        started = time.monotonic()
        fill_template(database_url(args.database_url, TEMPLATE), args.rows, args.text)
        print(f"{args.rows:,} raw rows ({args.text} text), {args.workers} workers x batch {args.batch}, {os.cpu_count()} CPUs,"
              f" median of {args.repeats} interleaved, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,"
              f" commit {commit()}, load {load()}; template built in {time.monotonic() - started:.0f} s",
              flush=True)
        rate: dict[str, list[float]] = {"project": [], "ceiling": []}
        client: dict[str, list[float]] = {"project": [], "ceiling": []}
        total: dict[str, list[float]] = {"project": [], "ceiling": []}
        for _ in range(args.repeats):
            for system in ("project", "ceiling"):
                with scratch_database(admin, RUN_DB, template=TEMPLATE):
                    url = database_url(args.database_url, RUN_DB)
                    engine = db.create_engine(url)
                    server = ServerCpu(engine)
                    before = server.seconds()
                    done, elapsed, cpu = run_workers(system, url, args.workers, args.batch)
                    wait_for_backends_gone(engine, RUN_DB)
                    after = server.seconds()
                    with engine.connect() as conn:
                        listings = conn.exec_driver_sql("SELECT count(*) FROM listings").scalar_one()
                    engine.dispose()
                assert done == args.rows and listings == args.rows, (system, done, listings)
                rate[system].append(done / elapsed)
                client[system].append(cpu / done * 1e6)
                if before is not None and after is not None:
                    total[system].append((cpu + after - before) / done * 1e6)
                print(f"  {system}: {done / elapsed:,.0f} rows/s, client {client[system][-1]:.1f} us/row"
                      + (f", total {total[system][-1]:.1f} us/row" if total[system] else ""), flush=True)
        print(f"\nload {load()}")
        print(f"  {'system':<8} {'rows/s':>8} {'client':>7} {'server':>7} {'total':>7}  (CPU us per row)")
        for system in ("project", "ceiling"):
            r, c = statistics.median(rate[system]), statistics.median(client[system])
            t = statistics.median(total[system]) if total[system] else float("nan")
            print(f"  {system:<8} {r:>8,.0f} {c:>7.1f} {t - c:>7.1f} {t:>7.1f}")
        if total["project"]:
            ratio = statistics.median(total["ceiling"]) / statistics.median(total["project"])
            print(f"project at {ratio:.2f} of the ceiling by CPU per row;"
                  f" {statistics.median(rate['project']) / statistics.median(rate['ceiling']):.2f} by rows/s")
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

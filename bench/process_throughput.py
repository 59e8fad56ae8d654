"""Processor throughput: 200,000 raw rows, 4 worker processes, beside a raw-SQL ceiling.

Measured in the same run, each on a fresh copy (CREATE DATABASE ... TEMPLATE) of one
database holding the same raw rows:

* project  -- `Processor.run` (what `pipeline process` and the `listings` asset run) in
              --workers processes: claim a batch, normalise in Python (HTML to text,
              dates, categories), mark processed and upsert listings in one transaction.
* ceiling  -- the same claim (the project's own compiled claim SQL), then ONE statement
              that upserts listings straight from the claimed raw rows' JSON in SQL and
              one that marks them processed, by psycopg alone, no normalisation: what the
              database can do with no Python work per row.

Repeated --repeats times, interleaved; the median is reported.

    .bench-venv/bin/python bench/process_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import unique_name
from pipeline.queue.claim import WorkQueue
from pipeline.storage import db, migrate, schema

TEMPLATE = unique_name("bench_process_template")
RUN_DB = unique_name("bench_process_run")
SUMMARY = (
    "<p>We are hiring a <b>senior engineer</b> to work on our data platform &amp; APIs."
    " You will design pipelines, review code and mentor others.</p>"
    "<ul><li>Python, SQL</li><li>Remote friendly</li></ul>"
)

# The ceiling's work after the claim: upsert from the raw rows' JSON, then mark them.
CEILING_UPSERT = """
INSERT INTO listings (source_id, source_item_id, url, title, summary, author, published_at,
                      categories, content_hash, raw_id)
SELECT r.source_id, r.source_item_id, r.raw_json->>'url', r.raw_json->>'title',
       r.raw_json->>'summary', r.raw_json->>'author', (r.raw_json->>'published_at')::timestamptz,
       r.raw_json->'categories', r.content_hash, r.id
FROM listings_raw r WHERE r.id = ANY(%(ids)s)
ON CONFLICT (source_id, source_item_id) DO UPDATE SET
    url = excluded.url, title = excluded.title, summary = excluded.summary,
    author = excluded.author, published_at = excluded.published_at,
    categories = excluded.categories, content_hash = excluded.content_hash,
    raw_id = excluded.raw_id,
    updated_at = CASE WHEN listings.content_hash <> excluded.content_hash THEN now() ELSE listings.updated_at END,
    matched_at = CASE WHEN listings.content_hash <> excluded.content_hash THEN NULL ELSE listings.matched_at END
WHERE listings.raw_id IS NULL OR excluded.raw_id >= listings.raw_id
"""
CEILING_MARK = """
UPDATE listings_raw SET processed_at = now(), last_error = NULL,
       locked_until = NULL, claimed_by = NULL, claim_token = NULL
WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND claimed_by = %(worker)s
"""


def admin_engine(url: str) -> sa.Engine:
    return sa.create_engine(db.parse_url(url), isolation_level="AUTOCOMMIT")


def database_url(base: str, name: str) -> str:
    return db.parse_url(base).set(database=name).render_as_string(hide_password=False)


def build_template(base: str, rows: int) -> None:
    admin = admin_engine(base)
    with admin.connect() as conn:
        for name in (RUN_DB, TEMPLATE):
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {TEMPLATE}")
    engine = db.create_engine(database_url(base, TEMPLATE))
    migrate.upgrade(engine)
    start = datetime(2026, 11, 1, tzinfo=UTC)
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
            "raw_json": {"title": f"Engineer #{i}: <i>Python</i> &amp; data", "url": url, "summary": SUMMARY,
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


def fresh_copy(base: str) -> str:
    with admin_engine(base).connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {RUN_DB} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {RUN_DB} TEMPLATE {TEMPLATE}")
    return database_url(base, RUN_DB)


def project_worker(url: str, batch: int, start_at: float) -> tuple[int, float]:
    from pipeline.core.settings import Settings
    from pipeline.listings.processor import Processor

    engine = db.create_engine(url)
    processor = Processor(engine, Settings(database_url=url), worker=f"bench-{os.getpid()}", batch_size=batch)
    time.sleep(max(0.0, start_at - time.time()))
    stats = processor.run()
    finished = time.time()
    engine.dispose()
    assert stats.failed == 0 and stats.gave_up == 0, stats
    return stats.claimed, finished


def ceiling_worker(url: str, batch: int, start_at: float) -> tuple[int, float]:
    import psycopg

    engine = db.create_engine(url)
    claim_sql = WorkQueue(engine, schema.RAW_UNPROCESSED)._claim_sql  # the project's own claim
    engine.dispose()
    assert claim_sql is not None
    worker, claimed = f"ceiling-{os.getpid()}", 0
    with psycopg.connect(db.parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False),
                         autocommit=True) as conn:
        time.sleep(max(0.0, start_at - time.time()))
        while True:
            token = uuid.uuid4().hex
            rows = conn.execute(claim_sql, {"claim_limit": batch, "claim_worker": worker, "claim_token": token,
                                            "claim_lease": timedelta(seconds=300)}).fetchall()
            if not rows:
                break
            ids = [row[0] for row in rows]
            with conn.transaction():
                conn.execute(CEILING_MARK, {"ids": ids, "token": token, "worker": worker})
                conn.execute(CEILING_UPSERT, {"ids": ids})
            claimed += len(ids)
    return claimed, time.time()


def run_workers(target, url: str, workers: int, batch: int) -> float:
    spawn = multiprocessing.get_context("spawn")
    start_at = time.time() + 3.0
    with spawn.Pool(workers) as pool:
        results = pool.starmap(target, [(url, batch, start_at)] * workers)
    total = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results) - start_at
    return total / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print(f"{args.rows} raw rows, {args.workers} workers x batch {args.batch}, {os.cpu_count()} CPUs,"
          f" median of {args.repeats}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    started = time.monotonic()
    build_template(args.database_url, args.rows)
    print(f"template built in {time.monotonic() - started:.0f} s", flush=True)
    project, ceiling = [], []
    for _ in range(args.repeats):
        project.append(run_workers(project_worker, fresh_copy(args.database_url), args.workers, args.batch))
        ceiling.append(run_workers(ceiling_worker, fresh_copy(args.database_url), args.workers, args.batch))
        print(f"  project {project[-1]:,.0f} rows/s, ceiling {ceiling[-1]:,.0f} rows/s", flush=True)
    p, c = statistics.median(project), statistics.median(ceiling)
    print(f"project {p:,.0f} rows/s, raw-SQL ceiling {c:,.0f} rows/s: project/ceiling {p / c:.2f}")
    with admin_engine(args.database_url).connect() as conn:
        for name in (RUN_DB, TEMPLATE):
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

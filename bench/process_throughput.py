"""Processor throughput and CPU per row: raw rows become listings, beside a fair ceiling.

Measured in the same run, each on a fresh copy (CREATE DATABASE ... TEMPLATE) of one
database holding the same raw rows, --workers processes each, the systems taking turns:

* project  -- `Processor.run` (what `pipeline process` and the `listings` asset run):
              claim a batch, normalise in Python (HTML to text, dates, categories), mark
              processed and upsert listings in one transaction.
* ceiling  -- the least work with no Python per row: the project's claim returning only
              the ids, then ONE statement that marks the rows processed (fenced) and
              upserts their listings straight from the raw JSON in SQL, pipelined with
              the next claim (one round trip and one commit per batch), by psycopg alone.
              It does not clean HTML, and keeps no story keys: it is a ceiling, not a peer.
* same     -- the same work as the project's, by a bare psycopg loop with the normalised
              values precomputed (issue 36's ceiling): the SQL texts the project sends
              for the listing upsert, the story lock and the story lookup, captured from
              a pass of the project's own over a copy of the database, with the rows and
              keys that pass sent (the rows' JSON, each listing's fingerprint, keys and
              title words, computed before the clock starts); per batch the claim, the
              fenced mark and the upsert, then the lock and the lookup, the comparison of
              each new listing with the candidates it found (the rule of
              pipeline/listings/stories.py, on precomputed values), the clusters' update
              and the commit, pipelined with the next claim: three round trips a batch.

Reported: rows per second of wall time and CPU per row, client (the worker processes'
own accounting) and server (the PostgreSQL cluster's processes, from /proc), each the
median of --repeats interleaved runs; the figures of merit are each ceiling's CPU over the
project's (the target: at least 0.7 of ``same``).

    .venv/bin/python bench/process_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

Databases ``bench_process_*_<pid>_<random>``, dropped however the run ends.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claim_throughput import MIN_CLAIM, pipelined_drain
from bench.scratch import (
    ServerCpu,
    commit,
    load,
    scratch_database,
    unique_name,
    wait_for_backends_gone,
)
from pipeline.listings import stories
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
# Both ceilings' fenced mark of the claimed rows as processed.
MARK = """
UPDATE listings_raw SET processed_at = now(), last_error = NULL,
       locked_until = NULL, claimed_by = NULL, claim_token = NULL
WHERE id = ANY(%(ids)s) AND claim_token = %(token)s AND claimed_by = %(worker)s
"""
CEILING_WRITE = f"""
WITH marked AS ({MARK}    RETURNING id, source_id, source_item_id, raw_json, content_hash)
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


# The same-work ceiling's own statement besides MARK: the clusters' update.
SAME_CLUSTERS = """
UPDATE listings SET cluster_id = v.cluster
FROM unnest(string_to_array(%(ids)s, ',')::bigint[], string_to_array(%(clusters)s, ',')::bigint[]) AS v(id, cluster)
WHERE listings.id = v.id
"""
UNSIGNED = (1 << 64) - 1


@dataclass(frozen=True)
class Prepared:
    """One raw row's listing as the project's pass sent it, and its story marks."""

    order: tuple[int, str]  # (source_id, source_item_id): the upsert's order
    json: str  # its row of the upsert's JSON parameter
    source_id: int
    keys: tuple[tuple[int, int], ...]  # (key number, value) of the keys it has
    print_: int | None  # its fingerprint, unsigned
    url_key: int | None
    words: frozenset[str]  # its own title's words


def capture_same_work(url: str, batch: int, path: Path) -> None:
    """Run the project's processor over the database at ``url`` (a scratch copy) and
    write to ``path`` what the same-work ceiling sends: the SQL texts of the upsert, the
    story lock and the lookup, and each raw row's listing as the upsert sent it."""
    from pipeline.core.settings import Settings
    from pipeline.listings.processor import Processor

    engine = db.create_engine(url)
    texts: dict[str, tuple[str, dict[str, Any]]] = {}  # each statement, with what a pass bound
    rows: dict[int, Prepared] = {}
    keys = schema.STORY_KEYS

    @sa.event.listens_for(engine, "before_cursor_execute")
    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.startswith("INSERT INTO listings ") and "rows" in parameters:
            texts["upsert"] = statement, {}
            for row in json.loads(parameters["rows"]):
                simhash, story_key = row["simhash"], row["story_key"]
                title_words = frozenset(stories.text_words(stories.own_title(row["title"], row["url"])))
                rows[row["raw_id"]] = Prepared(
                    (row["source_id"], row["source_item_id"]), json.dumps(row, ensure_ascii=False), row["source_id"],
                    tuple((n, row[k]) for n, k in enumerate(keys) if row[k] is not None),
                    None if simhash is None else simhash & UNSIGNED, story_key, title_words)
        elif "story_lock" in statement and "FOR UPDATE" in statement:
            texts["lock"] = statement, dict(parameters)
        elif "LATERAL" in statement and keys[1] in statement:
            texts["lookup"] = statement, dict(parameters)  # its constants (the limit) kept

    stats = Processor(engine, Settings(database_url=url), worker="capture", batch_size=batch).run()
    engine.dispose()
    assert stats.failed == 0 and stats.inserted == len(rows), (stats, len(rows))
    assert texts.keys() == {"upsert", "lock", "lookup"}, sorted(texts)
    path.write_bytes(pickle.dumps((texts, rows)))


def same_work_worker(url: str, batch: int, start_at: float, captured: str) -> Result:
    import psycopg

    texts, prepared = pickle.loads(Path(captured).read_bytes())
    titles: dict[str, frozenset[str]] = {}  # a candidate's title's words, by its title and link
    driver_url = db.parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    worker = f"same-{os.getpid()}"
    done = 0
    # JIT off, as the project's sessions have it (pipeline/backends/postgresql.py): with
    # it on, PostgreSQL compiled the story lookup for longer than it ran (3.4 s against
    # 1.1 of lookups over 20,000 rows).
    with psycopg.connect(driver_url, autocommit=True, prepare_threshold=0, options="-c jit=off") as conn:
        time.sleep(max(0.0, start_at - time.time()))
        cpu = time.process_time()
        token = uuid.uuid4().hex
        ids = [r[0] for r in conn.execute(MIN_CLAIM, {"n": batch, "worker": worker, "token": token})]
        while ids:
            mine = sorted((prepared[i] for i in ids), key=lambda p: p.order)
            with conn.pipeline():
                conn.execute("BEGIN")
                marked = conn.execute(MARK, {"ids": ids, "token": token, "worker": worker})
                written = conn.execute(texts["upsert"][0], {"rows": "[" + ",".join(p.json for p in mine) + "]"})
                conn.execute(*texts["lock"])
            assert marked.rowcount == len(ids), (marked.rowcount, len(ids))
            listing_ids = {(source_id, item): listing_id for listing_id, source_id, item in written.fetchall()}
            lookup, constants = texts["lookup"]
            cursor = conn.execute(lookup, {**constants, **_asking(mine, listing_ids)})
            columns = [column.name for column in cursor.description or ()]
            found = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
            joined = _join(mine, listing_ids, found, titles)
            following = uuid.uuid4().hex
            with conn.pipeline():
                if joined:
                    conn.execute(SAME_CLUSTERS, {"ids": ",".join(map(str, joined)),
                                                 "clusters": ",".join(map(str, joined.values()))})
                conn.execute("COMMIT")
                claimed = conn.execute(MIN_CLAIM, {"n": batch, "worker": worker, "token": following})
            done += len(ids)
            ids, token = [r[0] for r in claimed.fetchall()], following
        return done, time.time(), time.process_time() - cpu


def _asking(mine: list[Prepared], listing_ids: dict[tuple[int, str], int]) -> dict[str, str]:
    """The story lookup's parameters, as the project binds them (``recent_per_key``)."""
    values: list[set[int]] = [set() for _ in schema.STORY_KEYS]
    asking: list[list[tuple[int, int]]] = [[] for _ in schema.STORY_KEYS]
    for p in mine:
        for number, value in p.keys:
            values[number].add(value)
            if number and p.print_ is not None:
                asking[number].append((value, stories.to_signed(p.print_)))
    params = {"exclude": ",".join(str(listing_ids[p.order]) for p in mine)}
    for number, wanted in enumerate(values):
        params[f"values_{number}"] = ",".join(map(str, sorted(wanted)))
        if number:
            params[f"asking_{number}"] = ",".join(str(value) for value, _ in asking[number])
            params[f"prints_{number}"] = ",".join(str(print_) for _, print_ in asking[number])
    return params


def _join(mine: list[Prepared], listing_ids: dict[tuple[int, str], int], found: list[dict[str, Any]],
          titles: dict[str, frozenset[str]]) -> dict[int, int]:
    """Each new listing that is a story a candidate (or an earlier one of the batch)
    told, with its cluster: the rule of ``stories.same_story`` on precomputed values,
    less its offsite exception (every link of this benchmark is on its source's site)."""
    recent: dict[tuple[int, int], deque[tuple[int, int, int | None, int | None, frozenset[str], int]]] = \
        defaultdict(lambda: deque(maxlen=stories.RECENT_PER_KEY))
    for row in sorted(found, key=lambda r: (r["key_number"], r["key_value"], r["id"])):
        shown = f"{row['title']}\n{row['url']}"
        words = titles.get(shown)
        if words is None:
            words = titles[shown] = frozenset(stories.text_words(stories.own_title(row["title"], row["url"])))
        print_ = None if row["simhash"] is None else row["simhash"] & UNSIGNED
        recent[(row["key_number"], row["key_value"])].append(
            (row["source_id"], row["cluster_id"] or row["id"], print_, row["story_key"], words, row["id"]))
    joined: dict[int, int] = {}
    for p in mine:
        listing = listing_ids[p.order]
        clusters = []
        for key in p.keys:
            for source_id, cluster, print_, url_key, words, _ in recent[key]:
                if source_id == p.source_id:
                    continue
                if (p.url_key is not None and p.url_key == url_key) or (
                        p.print_ is not None and print_ is not None
                        and stories.distance(p.print_, print_) <= stories.MAX_DISTANCE
                        and stories.titles_agree(words, p.words)):
                    clusters.append(cluster)
        if clusters:
            joined[listing] = min(clusters)
        for key in p.keys:
            recent[key].append((p.source_id, joined.get(listing, listing), p.print_, p.url_key, p.words, listing))
    return joined


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


WORKERS: dict[str, Callable[..., Result]] = {"project": project_worker, "ceiling": ceiling_worker, "same": same_work_worker}
SYSTEMS = tuple(WORKERS)


def run_workers(system: str, url: str, workers: int, batch: int, captured: Path) -> Result:
    spawn = multiprocessing.get_context("spawn")
    # Time to start (and, for ``same``, to load the precomputed rows) before the clock.
    start_at = time.time() + (12.0 if system == "same" else 4.0)
    extra = (str(captured),) if system == "same" else ()
    with spawn.Pool(workers) as pool:
        results = pool.starmap(WORKERS[system], [(url, batch, start_at, *extra)] * workers)
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
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                        help="the project and the ceilings to run (the module docstring)")
    args = parser.parse_args()

    admin = admin_engine(args.database_url)
    systems = args.systems
    with scratch_database(admin, TEMPLATE), tempfile.TemporaryDirectory(prefix="bench_process_") as scratch:
        started = time.monotonic()
        fill_template(database_url(args.database_url, TEMPLATE), args.rows, args.text)
        captured = Path(scratch) / "same.pickle"
        if "same" in systems:
            with scratch_database(admin, RUN_DB, template=TEMPLATE):
                capture_same_work(database_url(args.database_url, RUN_DB), args.batch, captured)
        print(f"{args.rows:,} raw rows ({args.text} text), {args.workers} workers x batch {args.batch}, {os.cpu_count()} CPUs,"
              f" median of {args.repeats} interleaved, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,"
              f" commit {commit()}, load {load()}; template built in {time.monotonic() - started:.0f} s",
              flush=True)
        rate: dict[str, list[float]] = {system: [] for system in systems}
        client: dict[str, list[float]] = {system: [] for system in systems}
        total: dict[str, list[float]] = {system: [] for system in systems}
        for _ in range(args.repeats):
            for system in systems:
                with scratch_database(admin, RUN_DB, template=TEMPLATE):
                    url = database_url(args.database_url, RUN_DB)
                    engine = db.create_engine(url)
                    server = ServerCpu(engine)
                    before = server.seconds()
                    done, elapsed, cpu = run_workers(system, url, args.workers, args.batch, captured)
                    wait_for_backends_gone(engine, RUN_DB)
                    after = server.seconds()
                    with engine.connect() as conn:
                        listings, joined = conn.exec_driver_sql(
                            "SELECT count(*), count(cluster_id) FROM listings").one()
                    engine.dispose()
                assert done == args.rows and listings == args.rows, (system, done, listings)
                rate[system].append(done / elapsed)
                client[system].append(cpu / done * 1e6)
                if before is not None and after is not None:
                    total[system].append((cpu + after - before) / done * 1e6)
                print(f"  {system}: {done / elapsed:,.0f} rows/s, client {client[system][-1]:.1f} us/row"
                      + (f", total {total[system][-1]:.1f} us/row" if total[system] else "")
                      + f"; {joined:,} listings joined a story", flush=True)
        print(f"\nload {load()}")
        print(f"  {'system':<8} {'rows/s':>8} {'client':>7} {'server':>7} {'total':>7}  (CPU us per row)")
        for system in systems:
            r, c = statistics.median(rate[system]), statistics.median(client[system])
            t = statistics.median(total[system]) if total[system] else float("nan")
            print(f"  {system:<8} {r:>8,.0f} {c:>7.1f} {t - c:>7.1f} {t:>7.1f}")
        if "project" in systems and total["project"]:
            for ceiling in (system for system in systems if system != "project"):
                ratio = statistics.median(total[ceiling]) / statistics.median(total["project"])
                print(f"project at {ratio:.2f} of {ceiling!r} by CPU per row;"
                      f" {statistics.median(rate['project']) / statistics.median(rate[ceiling]):.2f} by rows/s")
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

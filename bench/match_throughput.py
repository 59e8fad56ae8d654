"""Matching throughput: 10,000 new listings against 10,000 filters, beside a naive loop.

Measured in the same run, on the same generated listings and filters:

* naive    -- the reference semantics as a per-filter Python loop: for every filter,
              every listing, with each listing's words computed once beforehand (so the
              loop is only the pairs: a generous baseline).
* index    -- ``FilterIndex.matches`` (pipeline/notify/matching.py) on the same in-memory data,
              words included.
* pass     -- the notifier's whole matching pass on a real database
              (``Notifier.match``: claim unmatched listings, load filters, match, mark
              matched and insert notifications), on PostgreSQL and on SQLite.

Both in-memory results are compared pair by pair before any figure is printed, so a fast
wrong answer cannot pass. The target (issue 4) is index and pass at least 20x faster
than the naive loop.

    .bench-venv/bin/python bench/match_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

The benchmark creates (and drops) its own database ``bench_match_<pid>_<random>`` on that server, and a
SQLite file in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import unique_name
from pipeline.core.settings import Settings
from pipeline.notify.matching import Filter, FilterIndex, ListingText, words
from pipeline.notify.notifier import Notifier, NotifyStats
from pipeline.storage import db, migrate, schema

DB_NAME = unique_name("bench_match")
SOURCES = 50
USERS = 1_000
CATEGORIES = ("jobs", "news", "video", "events", "sales")
KEYWORD_RANKS = (200, 20_000)  # the words filters are made of, by frequency rank


def vocabulary(rng: random.Random, size: int) -> list[str]:
    """Made-up words of 3 to 10 letters, plus a few compounds the matcher must handle."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    made = {"".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(size)}
    return sorted(made) + ["c++", "node.js", "e-mail", "python", "remote"]


class Corpus:
    """Listings whose words follow a Zipf-like law over a 30,000-word vocabulary, and
    filters of 1 to 3 keywords drawn by the same law from ranks 200 to 20,000: people
    filter on words that occur, but not on the 200 most common (in real text those are
    "the", "and", "with", ...). This gives about 20 matching users per listing out of
    1,000 (2%); the denser the matches, the less an index can skip (bench/RESULTS.md)."""

    def __init__(self, listings: int, filters: int, seed: int) -> None:
        rng = random.Random(seed)
        vocab = vocabulary(rng, 30_000)
        weights = [1 / (rank + 10) for rank in range(len(vocab))]
        keyword_ranks = slice(KEYWORD_RANKS[0], KEYWORD_RANKS[1])

        def text(n: int) -> str:
            return " ".join(rng.choices(vocab, weights, k=n))

        base = datetime(2026, 11, 1, tzinfo=UTC)
        self.listings = [
            ListingText(
                id=i + 1, source_id=rng.randint(1, SOURCES), title=text(8).capitalize(),
                summary=text(50) + ".", categories=rng.sample(CATEGORIES, rng.randint(0, 2)),
                ingested_at=base + timedelta(days=1, seconds=i),
            )
            for i in range(listings)
        ]
        self.filters = [
            Filter(
                id=i + 1, user_id=i % USERS + 1,
                keywords=tuple(dict.fromkeys(
                    w.casefold()
                    for w in rng.choices(vocab[keyword_ranks], weights[keyword_ranks], k=rng.randint(1, 3))
                )),
                source_id=rng.randint(1, SOURCES) if rng.random() < 0.1 else None,
                category=rng.choice(CATEGORIES) if rng.random() < 0.1 else None,
                created_at=base - timedelta(minutes=rng.randint(0, 30 * 24 * 60)),  # the past month
            )
            for i in range(filters)
        ]


def naive_loop(filters: list[Filter], listings: list[ListingText]) -> set[tuple[int, int]]:
    """Every filter against every listing: the reference (tests/test_matching.py)."""
    prepared = [
        (item, words(f"{item.title} {item.summary}"), {c.casefold() for c in item.categories})
        for item in listings
    ]
    best: dict[tuple[int, int], int] = {}  # (user, listing) -> lowest filter id
    for f in filters:
        for item, text, categories in prepared:
            if f.source_id is not None and f.source_id != item.source_id:
                continue
            if f.category is not None and f.category not in categories:
                continue
            if f.created_at and item.ingested_at and item.ingested_at < f.created_at:
                continue
            if all(k in text for k in f.keywords):
                key = (f.user_id, item.id)
                if key not in best or f.id < best[key]:
                    best[key] = f.id
    return {(user, listing) for user, listing in best}


def index_pass(filters: list[Filter], listings: list[ListingText]) -> set[tuple[int, int]]:
    index = FilterIndex(filters)
    return {(m.user_id, m.listing_id) for m in index.matches(listings)}


def load(engine: sa.Engine, corpus: Corpus) -> None:
    """The corpus as rows: sources, users with a webhook, filters, unmatched listings."""
    migrate.upgrade(engine)
    created = min(f.created_at for f in corpus.filters if f.created_at)
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.sources), [
            {"id": i, "name": f"s{i}", "url": f"http://127.0.0.1/feed/{i}", "source_type": "rss"}
            for i in range(1, SOURCES + 1)
        ])
        conn.execute(sa.insert(schema.users), [
            {"id": i, "name": f"user{i}", "channel": "webhook", "channel_url": "http://127.0.0.1:9/hook",
             "secret": "s" * 32, "created_at": created}
            for i in range(1, USERS + 1)
        ])
        conn.execute(sa.insert(schema.filters), [
            {"id": f.id, "user_id": f.user_id, "keywords": list(f.keywords), "source_id": f.source_id,
             "category": f.category, "created_at": f.created_at}
            for f in corpus.filters
        ])
        for start in range(0, len(corpus.listings), 2_000):
            conn.execute(sa.insert(schema.listings), [
                {"id": x.id, "source_id": x.source_id, "source_item_id": f"item-{x.id}",
                 "url": f"http://127.0.0.1/item/{x.id}", "title": x.title, "summary": x.summary,
                 "categories": list(x.categories), "content_hash": f"{x.id:064x}",
                 "ingested_at": x.ingested_at, "updated_at": x.ingested_at}
                for x in corpus.listings[start:start + 2_000]
            ])
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # The ids were given explicitly: move the sequences past them.
            for table in ("sources", "users", "filters", "listings"):
                conn.exec_driver_sql(f"SELECT setval('{table}_id_seq', (SELECT max(id) FROM {table}))")
            conn.exec_driver_sql("VACUUM ANALYZE")


def database_pass(engine: sa.Engine) -> tuple[float, NotifyStats, set[tuple[int, int]]]:
    notifier = Notifier(engine, Settings(database_url=str(engine.url)), worker="bench-match")
    stats = NotifyStats()
    started = time.perf_counter()
    notifier.match(stats)
    elapsed = time.perf_counter() - started
    n = schema.notifications
    with engine.connect() as conn:
        pairs = {(r.user_id, r.listing_id) for r in conn.execute(sa.select(n.c.user_id, n.c.listing_id))}
    return elapsed, stats, pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url",
                        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--listings", type=int, default=10_000)
    parser.add_argument("--filters", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=4)
    args = parser.parse_args()

    print(f"{args.listings:,} listings x {args.filters:,} filters ({USERS:,} users), {os.cpu_count()} CPUs,"
          f" {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    corpus = Corpus(args.listings, args.filters, args.seed)

    started = time.perf_counter()
    expected = naive_loop(corpus.filters, corpus.listings)
    naive_s = time.perf_counter() - started
    print(f"naive per-filter loop: {naive_s:8.3f} s, {len(expected):,} (user, listing) matches", flush=True)

    started = time.perf_counter()
    found = index_pass(corpus.filters, corpus.listings)
    index_s = time.perf_counter() - started
    if found != expected:
        print(f"MISMATCH: index found {len(found)} pairs, naive {len(expected)}", file=sys.stderr)
        return 1
    print(f"FilterIndex in memory: {index_s:8.3f} s  naive/index {naive_s / index_s:6.1f}x", flush=True)

    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.exec_driver_sql(f"CREATE DATABASE {DB_NAME}")
    pg_url = db.parse_url(args.database_url).set(database=DB_NAME).render_as_string(hide_password=False)
    with tempfile.TemporaryDirectory() as folder:
        for label, url in (("PostgreSQL", pg_url), ("SQLite", f"sqlite:///{folder}/match.db")):
            engine = db.create_engine(url)
            load(engine, corpus)
            elapsed, stats, stored = database_pass(engine)
            engine.dispose()
            if stored != expected or stats.listings_matched != args.listings:
                print(f"MISMATCH on {label}: {len(stored)} notifications stored, {len(expected)} expected",
                      file=sys.stderr)
                return 1
            print(f"notifier match pass, {label + ':':<11} {elapsed:8.3f} s  naive/pass {naive_s / elapsed:6.1f}x"
                  f"  ({stats.notifications_created:,} notifications inserted)", flush=True)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Matching at scale: the time to match a batch of new listings as filters grow from
10,000 to 1,000,000, the project's index beside a plain inverted index and PostgreSQL.

The corpus: listings whose words follow a Zipf-like law, 10,000 filters of 1-3 keywords
drawn from the same words (about 20 matching users per listing, out of 1,000), and as
the filter count grows, filters that cannot match these listings: each holds a word no
listing holds, and half of them one of the listings' words as well ("python zorblax").
So the pairs matched stay the same at every scale, and what the figures show is how
much each system pays for filters that cannot match: a matcher that scales pays nothing.

Measured in the same run, on the same batches of --batch listings (the notifier's
``match_batch``), the median over the batches of --repeats interleaved rounds:

* index     -- ``FilterIndex.matches`` (pipeline/notify/matching.py), built once as the
               notifier's catalogue builds it at a full reload, after it has seen one
               batch (the word rarity it files by is learned from the listings it matched).
* first     -- a plain inverted index built once, each filter filed under its first
               keyword, the same checks on the candidates (the audit's baseline).
* postgres  -- matching done by PostgreSQL: the filters' keywords in a table with an
               index on the word, joined to the batch's (listing, word) pairs sent as two
               arrays, grouped by (listing, filter) having every keyword, the source,
               category and age conditions in SQL, one row per (listing, user).
* naive     -- every filter against every listing (at 10,000 filters only): the
               reference semantics, not a baseline to beat.

Every system's pairs are compared with the index's, batch by batch, before any figure is
printed (and with the naive loop's at 10,000), so a fast wrong answer cannot pass. Also
reported: the notifier's whole matching pass on PostgreSQL and SQLite at 10,000 filters.

    .venv/bin/python bench/match_throughput.py --database-url postgresql://postgres@127.0.0.1:5432/test

Databases ``bench_match_<pid>_<random>``, dropped however the run ends; a SQLite file in
a temporary folder.

``--syntax language`` measures the filter language (pipeline/notify/query.py) instead: the
same filters, each also written in the language (a phrase, an exclusion, an alternative,
a field, a published window, a price, rooms, a salary, a location; ``language_filters``; the
listings carry those fields: ``with_fields``), both sets filed in a ``FilterIndex``
and matched in interleaved rounds at each count, the language's ratio to the plain
filters' time printed. Its pairs are compared with every language filter evaluated
against every listing (at the first count), and stay the same at every count.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import ServerCpu, commit, scratch_database, unique_name
from bench.scratch import load as load_average
from pipeline.core.fields import Fields
from pipeline.core.settings import Settings
from pipeline.notify.matching import Filter, FilterIndex, ListingText, _Fields, words
from pipeline.notify.notifier import Notifier, NotifyStats
from pipeline.notify.query import WORD_KEYS, Field, compile_query
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
        self.listings = with_fields(self.listings, seed + 100)
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


CITIES = ("berlin", "hamburg", "munich", "cologne", "frankfurt", "stuttgart", "leipzig", "dresden", "bremen",
          "hanover", "nuremberg", "essen", "bonn", "mannheim", "karlsruhe", "augsburg", "kiel", "potsdam", "mainz",
          "freiburg", "rostock", "erfurt", "kassel", "halle", "magdeburg", "paris", "lyon", "vienna", "zurich",
          "basel", "london", "leeds", "dublin", "madrid", "lisbon", "porto", "rome", "milan", "oslo", "prague")


def with_fields(listings: list[ListingText], seed: int) -> list[ListingText]:
    """The listings with fields from a random stream of their own (their words stay as
    they were): six in ten a price of EUR 100 to 5,000, half 1 to 6 rooms, three in ten
    a year's salary range, seven in ten one of 40 cities as their location."""
    rng = random.Random(seed)
    made = []
    for item in listings:
        found: dict[str, object] = {}
        if rng.random() < 0.6:
            found.update(price=Decimal(rng.randint(100, 5000)), currency="EUR")
        if rng.random() < 0.5:
            found["rooms"] = Decimal(rng.randint(1, 6))
        if rng.random() < 0.3:
            low = rng.randint(30, 120) * 1000
            found.update(salary_min=Decimal(low), salary_max=Decimal(low + rng.randint(0, 30) * 1000))
        if rng.random() < 0.7:
            found["location"] = rng.choice(CITIES).capitalize()
        made.append(dataclasses.replace(item, fields=Fields(**found)))  # type: ignore[arg-type]
    return made


def _in_scope(f: Filter, item: ListingText, categories: set[str]) -> bool:
    """The reference's scope rules, before any word: the filter's source and category
    (``categories``: the listing's, case-folded), and no listing older than the filter."""
    if f.source_id is not None and f.source_id != item.source_id:
        return False
    if f.category is not None and f.category not in categories:
        return False
    return not (f.created_at and item.ingested_at and item.ingested_at < f.created_at)


def naive_loop(filters: list[Filter], listings: list[ListingText]) -> set[tuple[int, int]]:
    """Every filter against every listing: the reference (tests/test_matching.py)."""
    prepared = [
        (item, words(f"{item.title} {item.summary}"), {c.casefold() for c in item.categories})
        for item in listings
    ]
    best: dict[tuple[int, int], int] = {}  # (user, listing) -> lowest filter id
    for f in filters:
        for item, text, categories in prepared:
            if not _in_scope(f, item, categories):
                continue
            if all(k in text for k in f.keywords):
                key = (f.user_id, item.id)
                if key not in best or f.id < best[key]:
                    best[key] = f.id
    return {(user, listing) for user, listing in best}


def far_filters(corpus: Corpus, count: int, seed: int) -> list[Filter]:
    """``count`` filters that cannot match the corpus's listings: each holds one to two
    made-up words no listing holds (they end in a digit and "q"), and half of them one of
    the listings' own keywords too, in a random position."""
    rng = random.Random(seed)
    common = sorted({k for f in corpus.filters for k in f.keywords})
    letters = "abcdefghijklmnopqrstuvwxyz"
    niche = ["".join(rng.choice(letters) for _ in range(rng.randint(4, 9))) + f"{n % 10}q" for n in range(200_000)]
    first_id = len(corpus.filters) + 1
    made = []
    for i in range(count):
        keywords = rng.sample(niche, rng.randint(1, 2))
        if rng.random() < 0.5:
            keywords.insert(rng.randint(0, len(keywords)), rng.choice(common))
        made.append(Filter(id=first_id + i, user_id=rng.randint(1, USERS), keywords=tuple(keywords),
                           created_at=corpus.filters[0].created_at))
    return made


class FirstKeywordIndex:
    """The audit's plain inverted index: each filter under its first keyword, built once;
    the same checks on the candidates as the project's (pipeline/notify/matching.py)."""

    def __init__(self, filters: list[Filter]) -> None:
        self.by_word: dict[str, list[Filter]] = {}
        for f in filters:
            self.by_word.setdefault(f.keywords[0], []).append(f)

    def matches(self, listings: list[ListingText]) -> set[tuple[int, int, int]]:
        best: dict[tuple[int, int], int] = {}
        for item in listings:
            text = words(f"{item.title} {item.summary}")
            categories = {c.casefold() for c in item.categories}
            for word in text:
                for f in self.by_word.get(word, ()):
                    if f.source_id is not None and f.source_id != item.source_id:
                        continue
                    if f.created_at and item.ingested_at and item.ingested_at < f.created_at:
                        continue
                    if f.category is not None and f.category not in categories:
                        continue
                    if all(k in text for k in f.keywords):
                        key = (f.user_id, item.id)
                        if key not in best or f.id < best[key]:
                            best[key] = f.id
        return {(user, listing, filter_id) for (user, listing), filter_id in best.items()}


PG_SCHEMA = """
CREATE TABLE match_filters (id bigint PRIMARY KEY, user_id bigint NOT NULL, n_keywords int NOT NULL,
                            source_id bigint, category text, created_at timestamptz);
CREATE TABLE match_words (word text NOT NULL, filter_id bigint NOT NULL);
"""
PG_INDEXES = "CREATE INDEX ON match_words (word) INCLUDE (filter_id); ANALYZE match_filters; ANALYZE match_words"
PG_MATCH = """
WITH l AS (SELECT * FROM unnest(%(ids)s::bigint[], %(sources)s::bigint[], %(ingested)s::timestamptz[],
                                %(categories)s::text[]) AS l(id, source_id, ingested_at, categories)),
w AS (SELECT * FROM unnest(%(word_listing)s::bigint[], %(word)s::text[]) AS w(listing_id, word)),
hits AS (SELECT w.listing_id, mw.filter_id, count(*) AS n
         FROM w JOIN match_words mw ON mw.word = w.word GROUP BY 1, 2)
SELECT DISTINCT ON (l.id, f.user_id) f.user_id, l.id, f.id
FROM hits h JOIN match_filters f ON f.id = h.filter_id AND f.n_keywords = h.n
JOIN l ON l.id = h.listing_id
WHERE (f.source_id IS NULL OR f.source_id = l.source_id)
  AND (f.category IS NULL OR f.category = ANY(string_to_array(l.categories, '|')))
  AND (f.created_at IS NULL OR l.ingested_at >= f.created_at)
ORDER BY l.id, f.user_id, f.id
"""


def pg_load(conn: psycopg.Connection, filters: list[Filter]) -> None:
    with conn.cursor().copy("COPY match_filters FROM STDIN") as copy:
        for f in filters:
            copy.write_row((f.id, f.user_id, len(f.keywords), f.source_id, f.category, f.created_at))
    with conn.cursor().copy("COPY match_words FROM STDIN") as copy:
        for f in filters:
            for k in f.keywords:
                copy.write_row((k, f.id))


def pg_matches(conn: psycopg.Connection, listings: list[ListingText]) -> set[tuple[int, int, int]]:
    word_listing, word = [], []
    for item in listings:
        text = words(f"{item.title} {item.summary}")
        word_listing.extend([item.id] * len(text))
        word.extend(text)
    params = {
        "ids": [x.id for x in listings], "sources": [x.source_id for x in listings],
        "ingested": [x.ingested_at for x in listings],
        "categories": ["|".join(c.casefold() for c in x.categories) for x in listings],
        "word_listing": word_listing, "word": word,
    }
    return {tuple(row) for row in conn.execute(PG_MATCH, params, prepare=True)}  # type: ignore[misc]


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


def batches(corpus: Corpus, size: int) -> list[list[ListingText]]:
    return [corpus.listings[i:i + size] for i in range(0, len(corpus.listings), size)]


def scale_round(
    label: str, systems: dict[str, object], parts: list[list[ListingText]], conn: psycopg.Connection,
    server: ServerCpu, results: dict[str, dict[str, list[float]]],
) -> None:
    """One round of every batch through each system in turn; checks they agree."""
    found: dict[str, list[set[tuple[int, int, int]]]] = {}
    for name, system in systems.items():
        times, out = results.setdefault(name, {}).setdefault("ms", []), []
        cpu_before, server_before = time.process_time(), server.seconds() if name == "postgres" else None
        for part in parts:
            started = time.perf_counter()
            if name == "postgres":
                out.append(pg_matches(conn, part))
            elif isinstance(system, FilterIndex):
                out.append(set(system.matches(part)))  # Match is a (user, listing, filter) tuple
            else:
                assert isinstance(system, FirstKeywordIndex)
                out.append(system.matches(part))
            times.append((time.perf_counter() - started) * 1000)
        cpu = time.process_time() - cpu_before
        if server_before is not None:
            after = server.seconds()
            cpu += (after - server_before) if after is not None else 0.0
        results[name].setdefault("cpu_ms", []).append(cpu / len(parts) * 1000)
        found[name] = out
    for name, out in found.items():
        if out != found["index"]:
            raise SystemExit(f"MISMATCH at {label}: {name} disagrees with the index")


def language_filters(filters: list[Filter], seed: int, *, keep_every_word: bool = False) -> list[Filter]:
    """``filters`` written in the filter language, the same keywords in each: a third
    plain, the rest a phrase of their words, an exclusion of a made-up word no listing
    holds and of a common one, an alternative (``(a OR b) c``), a title scope, a
    published window, a price, rooms or salary condition (``price:<2500``, ``rooms:>=3``,
    ``salary:>=70000``), or a location (``location:berlin``). ``keep_every_word``: only
    the forms that still need every keyword (for the filters that must not match)."""
    rng = random.Random(seed)
    forms = ["plain", "phrase", "exclude", "title", "published", "price", "rooms", "salary", "location"] + (
        [] if keep_every_word else ["or"])
    made = []
    for f in filters:
        k = list(f.keywords)
        form = rng.choice(["plain", "plain"] + forms)
        if form == "phrase":
            text = f'"{" ".join(k[:2])}" {" ".join(k[2:])}'
        elif form == "exclude":
            text = " ".join(k) + " -zzqx -" + rng.choice(["the", "and", "with", "remote"])
        elif form == "or" and len(k) >= 2:
            text = f"({k[0]} OR {k[1]}) {' '.join(k[2:])}"
        elif form == "title":
            text = f"title:{k[0]} " + " ".join(k[1:])
        elif form == "published":
            text = " ".join(k) + " published:2026-10-01.."
        elif form == "price":
            text = " ".join(k) + f" price:<{rng.choice([1000, 2500, 4000])}"
        elif form == "rooms":
            text = " ".join(k) + f" rooms:>={rng.randint(2, 4)}"
        elif form == "salary":
            text = " ".join(k) + f" salary:>={rng.choice([50000, 70000, 90000])}"
        elif form == "location":
            text = " ".join(k) + f" location:{rng.choice(CITIES)}"
        else:
            text = " ".join(k)
        made.append(Filter(id=f.id, user_id=f.user_id, source_id=f.source_id, category=f.category,
                           created_at=f.created_at, query=compile_query(text)))
    return made


def seen_keys(listings: list[ListingText]) -> list[set[str]]:
    """The keys the notifier's index learns each listing's rarity by: its words, and its
    location's words under their prefix (its author's and company's: none here)."""
    return [words(f"{x.title} {x.summary}") | {WORD_KEYS[Field.LOCATION] + w for w in words(x.fields.location or "")}
            for x in listings]


def naive_language(filters: list[Filter], listings: list[ListingText]) -> set[tuple[int, int]]:
    """Every language filter's alternatives evaluated against every listing, no index."""
    pairs = set()
    now = datetime.now(UTC)
    for item in listings:
        text = words(f"{item.title} {item.summary}")
        fields = _Fields(item, text, now)
        categories = {c.casefold() for c in item.categories}
        for f in filters:
            if not _in_scope(f, item, categories):
                continue
            if any(all(w in text for w in c.words) and not any(w in text for w in c.absent)
                   and all(fields.holds(x) for x in c.checks) for c in f.clauses):
                pairs.add((f.user_id, item.id))
    return pairs


def language_main(args: argparse.Namespace, scales: list[int]) -> int:
    base_count = scales[0]
    corpus = Corpus(args.listings, base_count, args.seed)
    parts = batches(corpus, args.batch)
    extra = far_filters(corpus, scales[-1] - base_count, args.seed + 1)
    started = time.perf_counter()
    written = language_filters(corpus.filters, args.seed + 2)
    written_extra = language_filters(extra, args.seed + 3, keep_every_word=True)
    compile_us = (time.perf_counter() - started) / (len(written) + len(written_extra)) * 1e6
    print(f"compiled {len(written) + len(written_extra):,} filters, {compile_us:.0f} us each", flush=True)
    started = time.perf_counter()
    expected = naive_language(written, corpus.listings)
    print(f"every language filter against every listing at {base_count:,}:"
          f" {(time.perf_counter() - started) / len(parts) * 1000:,.0f} ms a batch, {len(expected):,} pairs",
          flush=True)
    results: dict[int, dict[str, dict[str, list[float]]]] = {}
    for scale in scales:
        systems = {}
        for name, filters in (("plain", corpus.filters + extra[:scale - base_count]),
                              ("language", written + written_extra[:scale - base_count])):
            index = FilterIndex()
            index.rarity.observe(seen_keys(parts[0]))  # one batch seen, as the notifier's index has
            index.add(filters)
            systems[name] = index
        results[scale] = {name: {"ms": [], "cpu_ms": []} for name in systems}
        for _ in range(args.repeats):
            for name, index in systems.items():
                cpu_before = time.process_time()
                for part in parts:
                    begun = time.perf_counter()
                    index.matches(part)
                    results[scale][name]["ms"].append((time.perf_counter() - begun) * 1000)
                results[scale][name]["cpu_ms"].append((time.process_time() - cpu_before) / len(parts) * 1000)
        pairs = {(m.user_id, m.listing_id) for m in systems["language"].matches(corpus.listings)}
        if pairs != expected:
            raise SystemExit(f"MISMATCH at {scale:,} filters: the language index and the naive evaluation disagree")
        line = f"{scale:>9,} filters:"
        for name in systems:
            line += (f"  {name} {statistics.median(results[scale][name]['ms']):,.1f} ms"
                     f" ({statistics.median(results[scale][name]['cpu_ms']):,.1f} ms CPU)")
        ratio = statistics.median(results[scale]["language"]["ms"]) / statistics.median(results[scale]["plain"]["ms"])
        print(line, f"  language / plain x{ratio:.2f}  load {load_average()}", flush=True)
    first, last = scales[0], scales[-1]
    print(f"\nms a batch of {args.batch:,}, median; ratio {last:,} / {first:,} filters:")
    for name in ("plain", "language"):
        a, b = (statistics.median(results[n][name]["ms"]) for n in (first, last))
        print(f"  {name:<9} {a:>9,.1f} -> {b:>9,.1f}   x{b / a:,.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url",
                        default=os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--listings", type=int, default=10_000)
    parser.add_argument("--filters", default="10000,100000,1000000", help="filter counts to measure at")
    parser.add_argument("--batch", type=int, default=1_000, help="listings per batch (the notifier's match_batch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--skip-pass", action="store_true", help="skip the notifier's whole pass")
    parser.add_argument("--syntax", choices=("plain", "language"), default="plain",
                        help="language: the same filters written in the filter language, against plain ones")
    args = parser.parse_args()
    scales = [int(n) for n in args.filters.split(",")]
    base_count = scales[0]

    print(f"{args.listings:,} listings in batches of {args.batch:,}; filters {', '.join(f'{n:,}' for n in scales)}"
          f" ({USERS:,} users); {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC,"
          f" commit {commit()}, load {load_average()}", flush=True)
    if args.syntax == "language":
        return language_main(args, scales)
    corpus = Corpus(args.listings, base_count, args.seed)
    parts = batches(corpus, args.batch)

    started = time.perf_counter()
    expected = naive_loop(corpus.filters, corpus.listings)
    naive_s = time.perf_counter() - started
    print(f"naive loop at {base_count:,} filters: {naive_s / len(parts) * 1000:,.0f} ms a batch,"
          f" {len(expected):,} (user, listing) pairs", flush=True)

    admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
    results: dict[int, dict[str, dict[str, list[float]]]] = {}
    with scratch_database(admin, DB_NAME):
        pg_url = db.parse_url(args.database_url).set(database=DB_NAME)
        driver_url = pg_url.set(drivername="postgresql").render_as_string(hide_password=False)
        engine = sa.create_engine(pg_url)
        server = ServerCpu(engine)
        with psycopg.connect(driver_url, autocommit=True) as conn:
            conn.execute(PG_SCHEMA)
            extra = far_filters(corpus, scales[-1] - base_count, args.seed + 1)
            loaded = 0
            for scale in scales:
                filters = corpus.filters + extra[:scale - base_count]
                conn.execute("DROP INDEX IF EXISTS match_words_word_filter_id_idx")
                pg_load(conn, filters[loaded:])
                loaded = len(filters)
                conn.execute(PG_INDEXES)
                built = time.perf_counter()
                index = FilterIndex()
                index.rarity.observe(words(f"{x.title} {x.summary}") for x in parts[0])  # one batch seen
                index.add(filters)
                build_s = time.perf_counter() - built
                systems = {"index": index, "first": FirstKeywordIndex(filters), "postgres": None}
                results[scale] = {}
                for _ in range(args.repeats):
                    scale_round(f"{scale:,} filters", systems, parts, conn, server, results[scale])
                pairs = {(m.user_id, m.listing_id) for m in index.matches(corpus.listings)}
                if pairs != expected:
                    raise SystemExit(f"MISMATCH at {scale:,} filters: the index and the naive loop disagree")
                line = f"{scale:>9,} filters (index built in {build_s:.2f} s):"
                for name in systems:
                    ms = statistics.median(results[scale][name]["ms"])
                    cpu = statistics.median(results[scale][name]["cpu_ms"])
                    line += f"  {name} {ms:,.1f} ms ({cpu:,.1f} ms CPU)"
                print(line, f" load {load_average()}", flush=True)
        engine.dispose()
        first, last = scales[0], scales[-1]
        print(f"\nms a batch of {args.batch:,}, median; ratio {last:,} / {first:,} filters:")
        for name in ("index", "first", "postgres"):
            a, b = (statistics.median(results[n][name]["ms"]) for n in (first, last))
            print(f"  {name:<9} {a:>9,.1f} -> {b:>9,.1f}   x{b / a:,.2f}")

        if not args.skip_pass:
            with tempfile.TemporaryDirectory() as folder:
                for label, url in (("PostgreSQL", pg_url.render_as_string(hide_password=False)),
                                   ("SQLite", f"sqlite:///{folder}/match.db")):
                    engine = db.create_engine(url)
                    load(engine, corpus)
                    elapsed, stats, stored = database_pass(engine)
                    engine.dispose()
                    if stored != expected or stats.listings_matched != args.listings:
                        raise SystemExit(f"MISMATCH on {label}: {len(stored)} notifications stored,"
                                         f" {len(expected)} expected")
                    print(f"notifier match pass at {base_count:,} filters, {label + ':':<11} {elapsed:8.3f} s"
                          f" ({stats.notifications_created:,} notifications)", flush=True)
    admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

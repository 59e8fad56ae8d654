"""The filter workbench (pipeline/catalogue/workbench.py): ``filters test`` finds exactly
what the matcher finds among the stored listings, says why each matched, and
``filters add --backfill`` notifies a new filter's history once."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlalchemy as sa

from pipeline.catalogue import users, workbench
from pipeline.core.words import word_string
from pipeline.notify.matching import Filter, FilterIndex
from pipeline.notify.notifier import NotifyStats, _texts
from pipeline.notify.query import compile_query
from pipeline.storage import db, migrate, schema
from tests.conftest import conformance
from tests.helpers import add_source, now
from tests.test_cli import run
from tests.test_notifier import SECRET, notifications, notifier
from tests.test_processor import add_raw, processor

# Texts whose words the matcher finds but a plain case-insensitive substring search of
# the stored title would not (or would find where the matcher does not).
TEXTS = [
    ("Senior Python Engineer (Remote)", "Build data pipelines in PostgreSQL and Dagster."),
    ("PYTHON developer", "node.js and c++ welcome; snake_case_name"),
    ("\uff30\uff59\uff54\uff48\uff4f\uff4e \u30a8\u30f3\u30b8\u30cb\u30a2", "full-width letters"),  # Ｐｙｔｈｏｎ
    ("py\u00adthon with a soft hyphen", "and a zero\u200bwidth space in zero\u200bwidth"),
    ("Stra\u00dfe und Caf\u00e9", "Kelvin \u212a and the \ufb01ne ligature, \u2018quoted\u2019"),
    ("Pythonic is not python", "monty"),
    ("Remote work", "rust only, no snakes"),
    ("Junior Rust engineer", "remote friendly, senior mentors"),
]
QUERIES = [
    "python", "python remote", '"data pipelines"', "title:python -senior", "rust OR python",
    "js", "c++", "snake_case_name", "zerowidth", "strasse", "k", "fine", "quoted", "caf\u00e9",
    "author:nobody", "category:jobs python", "NOT senior remote", "category:jobs", 'category:"full time"',
    "author:smith", 'category:"remote work" rust', "author:smith OR kubernetes", "category:remote",
]
# Who wrote some of them, and their categories (item number: author, categories).
BYLINES = {0: ("Ada Smith", ["Jobs", "Full  Time"]), 6: (None, ["Remote Work"]), 3: ("Zoë Smith", [])}


def stored(engine: sa.Engine) -> int:
    """The TEXTS as listings, through the processor (the path that stores their words)."""
    with engine.begin() as conn:
        source_id = add_source(conn)
        for n, (title, summary) in enumerate(TEXTS):
            author, categories = BYLINES.get(n, (None, []))
            add_raw(conn, source_id, f"i{n}", title=title, summary=summary, author=author, categories=categories)
    processor(engine).run()
    return source_id


@conformance
def test_filters_test_finds_exactly_what_the_matcher_finds_on_every_database(engine):
    """SQL narrows what the matcher reads by each needed word as a substring of the
    normalised text: it must never drop a match (full-width letters, a soft hyphen, a
    zero-width space, the Kelvin sign, a ligature, MariaDB comparing without case),
    whatever it lets through."""
    stored(engine)
    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET)
        rows = conn.execute(sa.select(schema.listings)).mappings().all()
    assert {r["title"]: r["words"] for r in rows} == {
        r["title"]: word_string(r["title"], r["summary"], r["author"], r["categories"]) for r in rows}
    first = next(r["words"] for r in rows if r["title"] == TEXTS[0][0])
    assert all(f" {key} " in first for key in ("a:ada", "a:smith", "c:full\x1ftime", "c:jobs", "python"))
    # One listing stored before listings had their words (NULL) is read whole and found too.
    with engine.begin() as conn:
        conn.execute(sa.update(schema.listings).where(schema.listings.c.title == TEXTS[2][0]).values(words=None))
        rows = conn.execute(sa.select(schema.listings)).mappings().all()
    for query in QUERIES:
        index = FilterIndex([Filter(id=1, user_id=1, query=compile_query(query))])
        expected = {m.listing_id for m in index.matches(_texts(rows), any_age=True)}
        trial = workbench.try_filter(engine, "alice", query, shown=100)
        assert {h.id for h in trial.hits} == expected, query
        assert trial.matched == len(expected) and trial.listings == len(TEXTS)
        narrowed = workbench.candidates(compile_query(query))
        if narrowed is not None and query in ("python", "rust OR python", "category:jobs", "author:smith"):
            assert trial.read < len(TEXTS), f"{query}: SQL narrowed what the matcher read"


def test_each_match_says_which_words_and_fields_matched_and_whether_it_was_sent(engine):
    stored(engine)
    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET)
    url = engine.url.render_as_string(hide_password=False)
    out = run("filters", "test", "alice", 'python -senior', env={"DATABASE_URL": url})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("'python -senior': 4 of the 8 listings of the last 30 days match"), lines[0]
    assert "matched: python (title), without senior" in out.stdout
    assert "Senior Python Engineer" not in out.stdout
    shown = json.loads(run("filters", "test", "alice", '"data pipelines" OR category:x', "--json",
                           env={"DATABASE_URL": url}).stdout)
    [hit] = shown["hits"]
    assert hit["matched"] == ['"data pipelines" (summary)'] and hit["notified"] is False
    assert shown["read"] == 1, "SQL kept the listings with both words or the category"
    # Nothing was stored or sent by trying; a listing the user was told of says so.
    assert notifications(engine) == []
    with engine.begin() as conn:
        users.add_filter(conn, "alice", "data pipelines")
        conn.execute(sa.update(schema.listings).values(matched_at=None, ingested_at=now() + timedelta(seconds=1)))
    stats = NotifyStats()
    notifier(engine).match(stats)
    assert stats.notifications_created == 1
    again = json.loads(run("filters", "test", "alice", "pipelines", "--json", env={"DATABASE_URL": url}).stdout)
    assert [h["notified"] for h in again["hits"]] == [True]


def test_a_window_and_a_bad_filter(engine):
    stored(engine)
    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET)
        conn.execute(sa.update(schema.listings).where(schema.listings.c.title.like("PYTHON%"))
                     .values(ingested_at=now() - timedelta(days=40)))
    assert workbench.try_filter(engine, "alice", "python", days=30).matched == 4
    every = workbench.try_filter(engine, "alice", "python", days=60)
    assert every.matched == 5
    # The newest are shown, newest first, however the database returned them.
    with engine.begin() as conn:
        for listing_id in (h.id for h in every.hits):
            conn.execute(sa.update(schema.listings).where(schema.listings.c.id == listing_id)
                         .values(ingested_at=now() - timedelta(minutes=(listing_id * 7) % 5)))
        expected = conn.execute(sa.select(schema.listings.c.id).where(schema.listings.c.id.in_([h.id for h in every.hits]))
                                .order_by(schema.listings.c.ingested_at.desc(), schema.listings.c.id.desc())
                                .limit(2)).scalars().all()
    assert [h.id for h in workbench.try_filter(engine, "alice", "python", days=60, shown=2).hits] == expected
    bad = run("filters", "test", "alice", "python (", env={"DATABASE_URL": engine.url.render_as_string(hide_password=False)})
    assert bad.returncode == 1 and "filter 'python ('" in bad.stderr
    nobody = run("filters", "test", "bob", "python", env={"DATABASE_URL": engine.url.render_as_string(hide_password=False)})
    assert nobody.returncode == 1 and "no user named" in nobody.stderr


def test_filters_add_backfill_notifies_the_new_filters_history_once(engine):
    """``--backfill DAYS``: the new filter's matches among the last DAYS days' listings
    become notifications, once (a second backfill adds none), older listings stay
    untouched, and no other filter's history is delivered."""
    stored(engine)
    with engine.begin() as conn:
        for name in ("alice", "bob"):
            users.add_user(conn, name, webhook="http://127.0.0.1:9/hook", secret=SECRET)
        users.add_filter(conn, "bob", "python")  # bob's filter is not backfilled
        conn.execute(sa.update(schema.listings).where(schema.listings.c.title.like("PYTHON%"))
                     .values(ingested_at=now() - timedelta(days=40)))
    url = engine.url.render_as_string(hide_password=False)
    out = run("filters", "add", "alice", "--query", "python", "--backfill", "30", env={"DATABASE_URL": url})
    assert out.returncode == 0, out.stderr
    assert "4 notifications of the last 30 days' listings made" in out.stderr
    made = notifications(engine)
    assert len(made) == 4 and {n["user_id"] for n in made} == {1}
    filter_id = int(out.stdout.strip())
    assert {n["filter_id"] for n in made} == {filter_id}
    again = run("filters", "add", "alice", "--query", "python engineer OR pythonic", "--backfill", "90",
                env={"DATABASE_URL": url})
    assert "0 notifications" in again.stderr, "every match was already told"


def test_a_source_restriction_survives_a_source_named_in_the_query(engine):
    """Compiling a filter reused the name ``source_id`` for each ``source:`` of the query:
    ``--source 1`` with ``source:"name"`` stored no restriction at all."""
    with engine.begin() as conn:
        first = add_source(conn, "http://127.0.0.1/a", name="Board")
        add_source(conn, "http://127.0.0.1/b", name="Other")
        users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET)
        filter_id = users.add_filter(conn, "alice", 'python source:"other"', source_id=first)
        stored_source = conn.execute(sa.select(schema.filters.c.source_id)
                                     .where(schema.filters.c.id == filter_id)).scalar_one()
    assert stored_source == first


@conformance
def test_the_migration_stores_the_words_of_the_listings_already_stored(empty_db_url):
    """Revision 0021 fills the keys of listings stored before it. It needs a database of
    its own at revision 0020 (created empty, migrated there, then to the head)."""
    engine = db.create_engine(empty_db_url)
    try:
        migrate.upgrade(engine, "0020")
        with engine.begin() as conn:
            source_id = add_source(conn)
            for n, (title, summary) in enumerate(TEXTS):
                conn.execute(sa.insert(sa.table("listings", *(sa.column(c) for c in (
                    "source_id", "source_item_id", "url", "title", "summary", "content_hash")))).values(
                    source_id=source_id, source_item_id=f"i{n}", url="http://127.0.0.1/x", title=title,
                    summary=summary, content_hash=str(n)))
        migrate.upgrade(engine)
        with engine.connect() as conn:
            got = {r.title: r.words for r in conn.execute(sa.select(schema.listings))}
        assert got == {title: word_string(title, summary) for title, summary in TEXTS}
        assert " python " in got[TEXTS[2][0]], "full-width letters are the word they show"
    finally:
        engine.dispose()

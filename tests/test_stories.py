"""One alert per story across sources (pipeline/listings/stories.py): the same story
from different sources, by its link less tracking parameters or by near-identical text,
forms one cluster; a user hears of it once; concurrent processors never split one."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from pipeline.backends import backend_for
from pipeline.backends.mariadb import MARIADB
from pipeline.catalogue import users
from pipeline.core.urls import story_url
from pipeline.listings import boilerplate, stories
from pipeline.listings.normalize import normalise
from pipeline.storage import bulk, schema
from pipeline.storage.status import collect_status, status_as_text
from tests import test_duplicates
from tests.claim_workers import process
from tests.conftest import conformance
from tests.helpers import add_source, worker_processes
from tests.http_server import LocalServer
from tests.test_notifier import add_user, notifier, posts
from tests.test_processor import add_raw, processor

site = test_duplicates.site  # a fixture: a webhook receiver

TEXT = ("PostgreSQL 18 brings asynchronous I/O to sequential scans, bitmap heap scans and vacuum;"
        " the release also adds virtual generated columns and OAuth authentication.")


@pytest.mark.parametrize(("url", "story"), [
    ("https://news.example/a/1?utm_source=rss&utm_medium=feed", "https://news.example/a/1"),
    ("https://news.example/a/1?id=7&UTM_Campaign=x&fbclid=abc&page=2", "https://news.example/a/1?id=7&page=2"),
    ("https://news.example/a/1?gclid=1&mc_cid=2&_hsenc=3", "https://news.example/a/1"),
    ("https://news.example/?p=12&utm_source=x", "https://news.example/?p=12"),  # a story by query
    ("https://news.example/?utm_source=x", None),  # a home page names no story
    ("https://news.example/", None),
])
def test_a_story_url_is_the_link_less_its_tracking_parameters(url, story):
    assert story_url(url) == story


def _reference(words: list[str]) -> int | None:
    """SimHash as written in the papers: a count per bit over the distinct words' hashes."""
    import hashlib
    distinct = list(dict.fromkeys(w.casefold() for w in words))[:stories.MAX_WORDS]
    if len(distinct) < stories.MIN_WORDS:
        return None
    counts = [0] * 64
    for word in distinct:
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        for bit in range(64):
            counts[bit] += (h >> bit) & 1
    return sum(1 << bit for bit, c in enumerate(counts) if 2 * c > len(distinct))


@given(st.lists(st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789", min_size=1, max_size=8),
                max_size=300))
def test_the_fingerprint_is_simhash_by_the_book(words):
    assert stories.fingerprint(" ".join(words), "") == _reference(words)


@given(st.integers(0, 2**64 - 1), st.sets(st.integers(0, 63), max_size=stories.MAX_DISTANCE))
def test_fingerprints_within_the_distance_share_a_band(print_, flips):
    other = print_
    for bit in flips:
        other ^= 1 << bit
    assert stories.distance(print_, other) <= stories.MAX_DISTANCE
    assert any(a == b for a, b in zip(stories.bands(print_), stories.bands(other), strict=True))
    assert stories.from_signed(stories.to_signed(print_)) == print_


def _story(source: int, title: str, summary: str = "", url: str = "https://a.example/x") -> stories.NewListing:
    listing = normalise({"title": title, "summary": summary, "url": url})
    return stories.NewListing(source, source, stories.Marks.of(listing))


BOILERPLATE = ("After stumbling upon a few crazy block creations over the years on their creator's site,"
               " I have decided to share a few of my favourites here, one a week.")


@pytest.mark.parametrize(("a", "b", "same"), [
    # one template under other titles: two stories
    (("BondiBlock", BOILERPLATE), ("SynthaBlock", BOILERPLATE), False),
    (("Release 3.14 is out", BOILERPLATE), ("Release 3.15 is out", BOILERPLATE), False),
    # a prefix, other case and punctuation, another link: one story
    (("PostgreSQL 18 is out", TEXT), ("Release: PostgreSQL 18 Is Out!", TEXT), True),
    # no title of its own (the link stands in): the text decides
    (("", TEXT), ("PostgreSQL 18 is out", TEXT), True),
    # too few words for a fingerprint: only a link could join them
    (("Weekly notes", "Short."), ("Weekly notes", "Short."), False),
])
def test_near_identical_texts_are_one_story_when_their_titles_agree(a, b, same):
    x = _story(1, a[0], a[1], "https://one.example/post/1")
    y = _story(2, b[0], b[1], "https://two.example/p?id=1")
    assert stories.same_story(x, y) is same
    assert not stories.same_story(x, stories.NewListing(1, 1, y.marks)), "never within one source"


def test_the_fingerprint_is_the_same_in_every_process():
    """Processes: one per hash seed, since Python's str hashes differ by process."""
    code = "from pipeline.listings.stories import fingerprint; print(fingerprint('a b c d e f g h i j', 'k'))"
    seen = {
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed},
                       capture_output=True, text=True, check=True).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {str(stories.fingerprint("a b c d e f g h i j", "k"))}




def _listings(engine: sa.Engine) -> dict[tuple[int, str], dict]:
    t = schema.listings
    with engine.connect() as conn:
        return {(r["source_id"], r["source_item_id"]): dict(r) for r in conn.execute(sa.select(t)).mappings()}


def _sources_and_alice(conn: sa.Connection, site: LocalServer, query: str, sources: str = "ab") -> list[int]:
    """Sources http://127.0.0.1/a.rss, b.rss ... (one a letter of ``sources``), and a user
    alice, whose webhook is ``site``'s /hook, with one filter ``query``."""
    ids = [add_source(conn, f"http://127.0.0.1/{letter}.rss") for letter in sources]
    add_user(conn, "alice", site.url("/hook"))
    users.add_filter(conn, "alice", query)
    return ids


@conformance
def test_one_story_from_two_sources_reaches_a_user_once(engine, site):
    with engine.begin() as conn:
        a, b = _sources_and_alice(conn, site, "postgresql")
        add_user(conn, "bob", site.url("/hook"))
        users.add_filter(conn, "bob", "released")  # only the second copy's title says so
        add_raw(conn, a, "a-1", title="PostgreSQL 18 is out",
                url="https://news.example/pg18?utm_source=a&utm_medium=rss", summary=TEXT)
        add_raw(conn, b, "b-1", title="PostgreSQL 18 released",
                url="https://NEWS.example/pg18?utm_source=b&fbclid=x", summary="Read it on B.")
    assert processor(engine).run().clustered == 1
    stats = notifier(engine).run()
    assert (stats.notifications_created, stats.sent) == (2, 2)
    got = sorted((json.loads(p["body"])["user"]["name"], json.loads(p["body"])["listing"]["title"])
                 for p in posts(site))
    assert got == [("alice", "PostgreSQL 18 is out"), ("bob", "PostgreSQL 18 released")]
    rows = _listings(engine)
    first, copy = rows[(a, "a-1")], rows[(b, "b-1")]
    assert (first["cluster_id"], copy["cluster_id"]) == (None, first["id"])


@conformance
def test_near_identical_text_from_two_sources_is_one_story_and_a_later_copy_is_recorded(engine, site):
    with engine.begin() as conn:
        a, b, c = _sources_and_alice(conn, site, "postgresql", sources="abc")
        add_raw(conn, a, "a-1", title="PostgreSQL 18 is out", url="https://a.example/2026/pg18", summary=TEXT)
    processor(engine).run()
    assert notifier(engine).run().sent == 1
    with engine.begin() as conn:  # the same text, other links and markup, later
        add_raw(conn, b, "b-9", title="<b>PostgreSQL 18</b> is out", url="https://b.example/p?id=9",
                summary=f"<p>{TEXT}</p>")
        add_raw(conn, c, "c-3", title="PostgreSQL 18 is out", url="https://c.example/n/3", summary=TEXT.upper())
    assert processor(engine).run().clustered == 2
    assert notifier(engine).run().notifications_created == 0
    rows = _listings(engine)
    first = rows[(a, "a-1")]["id"]
    assert [rows[(b, "b-9")]["cluster_id"], rows[(c, "c-3")]["cluster_id"]] == [first, first]
    status = collect_status(engine)
    assert status.stories == {"stories": 1, "copies": 2}
    assert "1 carried by more than one source; 2 later copies" in status_as_text(status)


def test_a_source_keeps_its_own_items_and_a_home_page_names_no_story(engine, site):
    with engine.begin() as conn:
        a, b = _sources_and_alice(conn, site, "engineer")
        # Two job ads of one board, the same words: two jobs.
        for item in ("a-1", "a-2"):
            add_raw(conn, a, item, title="Data engineer at Acme (remote)", url=f"https://jobs.example/{item}",
                    summary="Acme is hiring a data engineer to build pipelines in Python and SQL, remote.")
        # Two sources linking every item to their home page, with texts of their own.
        add_raw(conn, a, "a-3", title="Site reliability engineer", url="https://jobs.example/")
        add_raw(conn, b, "b-1", title="Platform engineer", url="https://jobs.example/?utm_source=b")
    assert processor(engine).run().clustered == 0
    assert notifier(engine).run().sent == 4
    assert all(r["cluster_id"] is None for r in _listings(engine).values())


# Two sources' templates: each of a source's items wraps its own words in its template.
TEMPLATE_A = ("Acme Corp is hiring. We are a fast growing company building tools for teams;"
              " apply today, benefits include remote work, equity, health cover and learning budget.")
TEMPLATE_B = ("Posted on Jobs Weekly, the board for engineers. Reply with your CV and portfolio;"
              " listings stay open until filled, salaries shown before tax, visa sponsorship possible.")
OWN_WORDS = [f"{a}{b}{c}" for a in "bdfgklmnprstvz" for b in "aeiou" for c in "lmnrstx"]


def _templated(rng: random.Random, template: str) -> tuple[str, str, str]:
    """A title and summary of words of their own inside ``template``, and the own words."""
    own = " ".join(rng.sample(OWN_WORDS, 10))
    return own.split()[0].capitalize() + " " + own.split()[1], f"{template} {own}", own


def _sharing_a_band(prints: list[int]) -> int:
    """How many pairs of ``prints`` share a band key (each a hit of the other's lookup)."""
    return sum(1 for i, a in enumerate(prints) for b in prints[i + 1:]
               if any(x == y for x, y in zip(stories.bands(a), stories.bands(b), strict=True)))


@conformance
def test_a_sources_template_is_left_out_of_its_fingerprints(engine):
    """The items of one template used to share their fingerprints' bands (each new one's
    lookup read its siblings, never its story); the words a source brings in every item
    of a batch are its boilerplate, kept for its later items, and out of their prints."""
    rng = random.Random(7)
    texts = [_templated(rng, TEMPLATE_A)[:2] for _ in range(30)]
    with engine.begin() as conn:
        a = add_source(conn, "http://127.0.0.1/a.rss")
        for i, (title, summary) in enumerate(texts):
            add_raw(conn, a, f"a-{i:02d}", title=title, url=f"https://a.example/{i}", summary=summary)
    assert processor(engine).run().inserted == 30
    with engine.connect() as conn:
        (words,) = conn.execute(sa.select(schema.source_words.c.words)
                                .where(schema.source_words.c.source_id == a)).one()
    assert words == [f" {' '.join(stories.text_words(TEMPLATE_A))} "]  # the template, one run
    stored = [stories.from_signed(row["simhash"]) for key, row in sorted(_listings(engine).items())]
    whole = [stories.fingerprint(title, summary) for title, summary in texts]
    assert None not in whole and stored != whole
    # With the template in, 19 pairs of the 30 share a band; without, none.
    assert _sharing_a_band(stored) * 3 < _sharing_a_band(whole)
    with engine.begin() as conn:  # one at a time later: the template learned before still goes
        title, summary, _ = _templated(rng, TEMPLATE_A)
        add_raw(conn, a, "a-later", title=title, url="https://a.example/later", summary=summary)
    processor(engine).run()
    later = _listings(engine)[(a, "a-later")]
    assert stories.from_signed(later["simhash"]) == stories.fingerprint(title, summary, boilerplate=tuple(words))
    assert stories.from_signed(later["simhash"]) != stories.fingerprint(title, summary)


@conformance
def test_a_source_whose_items_come_one_at_a_time_learns_its_template(engine):
    """A small feed's items come one or two a batch from its first fetch on: no batch
    brought ``SAMPLE`` of its new listings, so its template was never learned and stayed
    in every fingerprint. Its ``SAMPLE``-th listing learns it, from itself and the
    listings stored before, and leaves it out, as do the later ones."""
    rng = random.Random(5)
    with engine.begin() as conn:
        a = add_source(conn, "http://127.0.0.1/a.rss")
    texts, learned = [], []
    for i in range(boilerplate.SAMPLE + 1):
        title, summary, _ = _templated(rng, TEMPLATE_A)
        texts.append((title, summary))
        with engine.begin() as conn:
            add_raw(conn, a, f"a-{i}", title=title, url=f"https://a.example/{i}", summary=summary)
        assert processor(engine).run().inserted == 1
        with engine.connect() as conn:
            learned.append(conn.execute(sa.select(schema.source_words.c.words)
                                        .where(schema.source_words.c.source_id == a)).scalar_one_or_none())
    template = [f" {' '.join(stories.text_words(TEMPLATE_A))} "]
    # Nothing learned, nor "none" stored, before it has SAMPLE listings; then its template.
    assert learned == [None] * (boilerplate.SAMPLE - 1) + [template, template]
    rows = _listings(engine)
    for i, (title, summary) in enumerate(texts):
        kept = stories.from_signed(rows[(a, f"a-{i}")]["simhash"])
        if i < boilerplate.SAMPLE - 1:
            assert kept == stories.fingerprint(title, summary)
        else:
            assert kept == stories.fingerprint(title, summary, boilerplate=tuple(template))
            assert kept != stories.fingerprint(title, summary)


def test_one_story_in_two_sources_templates_is_one_story(engine, site):
    """Two sources wrap one story in templates of their own (which share words with it:
    "the", "and", "for"): with each source's template out of its texts they are the
    same text. With the templates in, 30 words of 50 differed and the user heard twice."""
    rng = random.Random(11)
    with engine.begin() as conn:
        a, b = _sources_and_alice(conn, site, "postgresql")
        for source, template in ((a, TEMPLATE_A), (b, TEMPLATE_B)):
            for i in range(boilerplate.SAMPLE):
                title, summary, _ = _templated(rng, template)
                add_raw(conn, source, f"{source}-{i}", title=title, url=f"https://{source}.example/{i}", summary=summary)
    processor(engine).run()
    with engine.begin() as conn:
        add_raw(conn, a, "a-pg", title="PostgreSQL 18 is out", url="https://a.example/pg18",
                summary=f"{TEMPLATE_A} {TEXT}")
        add_raw(conn, b, "b-pg", title="PostgreSQL 18 is out", url="https://b.example/pg18",
                summary=f"{TEXT} {TEMPLATE_B}")
    assert processor(engine).run().clustered == 1
    assert notifier(engine).run().sent == 1


def test_boilerplate_is_a_shared_phrase_not_a_common_word():
    """Words every item has, each in a phrase of its own, are the language's, not the
    source's: a copy elsewhere has them too, so they stay in the fingerprint; and a
    template's phrase goes where it is, its words staying elsewhere."""
    texts = [stories.text_words(t) for t in (
        "The mayor opened the new bridge and the crowd cheered. Continue reading on Example News",
        "A storm closed the harbour and the ferries stopped. Continue reading on Example News",
        "Prices of the old flats rose again, and the council is worried. Continue reading on Example News",
        "The team won the cup and the city celebrated late. Continue reading on Example News",
    )]
    runs = boilerplate.common(texts)
    assert runs == (" continue reading on example news ",)
    assert boilerplate.common(texts[:3] + [stories.text_words("Nothing in common with the others")]) == ()
    # Left out where the run is, not wherever its words are: "on" in the story's own text stays.
    story = stories.text_words("Rain on the parade. Continue reading on Example News")
    assert boilerplate.without(story, runs) == ["rain", "on", "the", "parade"]
    assert boilerplate.has(story, runs) and not boilerplate.has(story[:-1], runs)
    assert boilerplate.without(stories.text_words("Continue reading on Example News " * 3), runs) == []
    # A run inside a longer one (a byline the template also has alone) goes after it.
    signed = [["by", "luke", "example", *words, "by", "luke", "example"] for words in texts]
    assert boilerplate.common(signed) == (" continue reading on example news by luke example ", " by luke example ")
    assert boilerplate.without(signed[0], boilerplate.common(signed)) == texts[0][:-5]


def test_a_sources_boilerplate_is_its_own(engine):
    """What one source repeats changes no other source's fingerprints: another source's
    items with the same words, one at a time or several at once but with nothing all of
    them share, are fingerprinted whole."""
    rng = random.Random(11)
    with engine.begin() as conn:
        a = add_source(conn, "http://127.0.0.1/a.rss")
        b = add_source(conn, "http://127.0.0.1/b.rss")
        for i in range(boilerplate.SAMPLE):
            title, summary, _ = _templated(rng, TEMPLATE_A)
            add_raw(conn, a, f"a-{i}", title=title, url=f"https://a.example/{i}", summary=summary)
        b_items = [_templated(rng, "") for _ in range(boilerplate.SAMPLE)] + [("Acme news", TEMPLATE_A, "")]
        for i, (title, summary, _) in enumerate(b_items):
            add_raw(conn, b, f"b-{i}", title=title, url=f"https://b.example/{i}", summary=summary)
    processor(engine).run()
    rows = _listings(engine)
    for i, (title, summary, _) in enumerate(b_items):
        assert stories.from_signed(rows[(b, f"b-{i}")]["simhash"]) == stories.fingerprint(title, summary)
    with engine.connect() as conn:  # b's learned as none, which spares learning it again
        t = schema.source_words
        assert dict(conn.execute(sa.select(t.c.source_id, t.c.words)).all()) == {
            a: [f" {' '.join(stories.text_words(TEMPLATE_A))} "], b: []}


@conformance
def test_concurrent_processors_never_split_a_story(backend, engine, db_url):
    """Each story comes from three sources, its copies next to each other in the raw
    queue: three processors claiming one row at a time store them at the same moment.
    Without the story lock, each would find no earlier copy and found a cluster. Each
    takes at most two thirds of the rows: on a busy machine one processor once took all
    of them before the others' first claim (SQLite's write lock favours its holder), so
    nothing ran side by side; a processor ends only when every row left is another's,
    so the three still process them all."""
    n = 60
    vocabulary = [f"word{i}" for i in range(500)]
    with engine.begin() as conn:
        sources = [add_source(conn, f"http://127.0.0.1/{i}.rss") for i in range(3)]
        for s in range(n):
            words = random.Random(s).sample(vocabulary, 20)  # a text of its own
            for i, source in enumerate(sources):
                by_url = s % 2 == 0  # half by link, half by text (links of their own)
                add_raw(conn, source, f"{i}-{s}", title=" ".join(words[:6]), summary=" ".join(words[6:]),
                        url=f"https://news.example/{s}?utm_source={i}" if by_url else f"https://s{i}.example/{s}")
    context = worker_processes()
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=3, mp_context=context) as pool:
        gate = manager.Barrier(3)  # all three connected before any claims: they contend
        results = [f.result(timeout=600) for f in
                   [pool.submit(process, db_url, f"p{i}", 1, gate, 2 * n) for i in range(3)]]
    assert sum(r["inserted"] for r in results) == 3 * n
    assert sum(1 for r in results if r["inserted"]) > 1, "the processors really ran side by side"
    assert sum(r["clustered"] for r in results) == 2 * n
    rows = _listings(engine)
    for s in range(n):
        members = [rows[(source, f"{i}-{s}")] for i, source in enumerate(sources)]
        founders = [m for m in members if m["cluster_id"] is None]
        assert len(founders) == 1, f"story {s} was split: {[(m['id'], m['cluster_id']) for m in members]}"
        assert {m["cluster_id"] for m in members if m is not founders[0]} == {founders[0]["id"]}


@conformance
def test_a_copy_is_looked_for_among_the_most_recent_listings_of_each_key(engine):
    """A key many listings share (here a link one source gives RECENT_PER_KEY + 10
    items) costs a bounded lookup: a copy from another source sees the most recent
    RECENT_PER_KEY and joins the oldest cluster among them."""
    with engine.begin() as conn:
        a = add_source(conn, "http://127.0.0.1/a.rss")
        b = add_source(conn, "http://127.0.0.1/b.rss")
        for i in range(stories.RECENT_PER_KEY + 10):  # ids in the order of their keys, as stored
            add_raw(conn, a, f"a-{i:02d}", title=f"Live item {i}", url="https://news.example/live?utm_source=a")
    assert processor(engine).run().clustered == 0
    with engine.begin() as conn:
        add_raw(conn, b, "b-1", title="Live", url="https://news.example/live")
    assert processor(engine).run().clustered == 1
    rows = _listings(engine)
    assert rows[(b, "b-1")]["cluster_id"] == rows[(a, "a-10")]["id"]  # the oldest of the 20 most recent


def test_within_one_batch_a_copy_also_sees_only_the_most_recent_listings_of_each_key(engine):
    """The same bound when the crowd and the copy come in one batch: the batch's own
    listings are remembered per key, the most recent RECENT_PER_KEY of them."""
    with engine.begin() as conn:
        a = add_source(conn, "http://127.0.0.1/a.rss")
        b = add_source(conn, "http://127.0.0.1/b.rss")
        for i in range(stories.RECENT_PER_KEY + 10):
            add_raw(conn, a, f"a-{i:02d}", title=f"Live item {i}", url="https://news.example/live?utm_source=a")
        add_raw(conn, b, "b-1", title="Live", url="https://news.example/live")
    assert processor(engine).run().clustered == 1
    rows = _listings(engine)
    assert rows[(b, "b-1")]["cluster_id"] == rows[(a, "a-10")]["id"]  # the oldest of the 20 most recent


@conformance
def test_the_lookup_reads_each_key_by_its_index_planned_for_its_own_keys(backend, engine):
    """Candidates are found by the story key indexes, never a scan of ``listings``, and on
    PostgreSQL the lookup is planned for the keys it is given: a prepared statement's
    generic plan, blind to them, took ten times as long (bench/RESULTS.md)."""
    rng = random.Random(7)
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/a.rss")
        rows = []
        for i in range(5000):
            marks = stories.Marks(rng.getrandbits(62), rng.getrandbits(64), frozenset({"t"}))
            rows.append({"source_id": source, "source_item_id": str(i), "url": f"https://a.example/{i}",
                         "content_hash": "h", **marks.columns()})
        bulk.insert_rows(conn, schema.listings, rows)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE TABLE listings" if engine.dialect.name in MARIADB else "ANALYZE")
    asking = [stories.NewListing(10_000 + i, source + 1, stories.Marks(
        rng.getrandbits(62), rng.getrandbits(64), frozenset())) for i in range(200)]
    with engine.begin() as conn:
        conn.execute(backend_for(conn).serialising_lock(schema.story_lock))
        captured = []
        sa.event.listen(conn, "before_cursor_execute",
                        lambda conn, cursor, sql, params, context, many: captured.append((sql, params)))
        stories._candidates(conn, asking)
        sql, params = next((sql, params) for sql, params in reversed(captured) if "story_key" in sql)
        if engine.dialect.name == "postgresql":
            assert conn.exec_driver_sql("SELECT current_setting('plan_cache_mode')").scalar() == "force_custom_plan"
            plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, params))
            assert "Seq Scan on listings" not in plan, plan
            used = set(re.findall(r"using (ix_listings_story_\w+) on listings", plan))
        elif engine.dialect.name == "sqlite":
            plan = "\n".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params))
            assert "SCAN listings" not in plan, plan
            used = set(re.findall(r"USING (?:COVERING )?INDEX (ix_listings_story_\w+)", plan))
        else:
            result = conn.exec_driver_sql("EXPLAIN " + sql, params)
            accesses = [dict(zip(result.keys(), row, strict=True)) for row in result]
            plan = "\n".join(map(str, accesses))
            assert all(a["type"] != "ALL" for a in accesses if a["table"] == "listings"), plan
            used = {a["key"] for a in accesses if a["table"] == "listings"}
    assert used == {f"ix_listings_{column}_id" for column in schema.STORY_KEYS}, plan


def test_a_title_written_with_hidden_or_wide_characters_is_the_same_story():
    """The processor takes words by the filters' rule (pipeline/core/words.py): a copy
    whose title hides a soft hyphen or is written in full-width letters is the story."""
    from pipeline.listings.stories import text_words

    assert text_words("Ｐｙｔｈｏｎ 3.14 re\u00adleased") == text_words("Python 3.14 released")


@pytest.mark.parametrize("one_batch", [False, True])
def test_a_source_linking_another_sites_article_first_cannot_title_its_story(engine, site, one_batch):
    """The reproduction: a hostile source published first, linking the real article's
    URL plus ?utm_source=hostile under its own title; the real item joined its story and
    the user's one delivery carried the hostile title. Now the link's own site's item is
    a story of its own; an aggregator linking it afterwards still joins it."""
    with engine.begin() as conn:
        hostile = add_source(conn, "http://hostile.example/feed")
        real = add_source(conn, "https://news.example/feed.xml")
        aggregator = add_source(conn, "https://aggregator.example/rss")
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "postgresql")
        add_raw(conn, hostile, "h-1", title="PostgreSQL 18: claim your free tokens",
                url="https://news.example/pg18?utm_source=hostile")
        if not one_batch:
            processor(engine).run()
        add_raw(conn, real, "r-1", title="PostgreSQL 18 released", url="https://news.example/pg18")
    processor(engine).run()
    with engine.begin() as conn:
        add_raw(conn, aggregator, "g-1", title="PostgreSQL 18 released (news.example)",
                url="https://news.example/pg18?utm_source=aggregator")
    processor(engine).run()
    notifier(engine).run()
    titles = sorted(json.loads(p["body"])["listing"]["title"] for p in posts(site))
    assert titles == ["PostgreSQL 18 released", "PostgreSQL 18: claim your free tokens"]
    rows = _listings(engine)
    assert rows[(real, "r-1")]["cluster_id"] is None, "the article's own item is no copy of the hostile one"
    assert rows[(aggregator, "g-1")]["cluster_id"] in (rows[(real, "r-1")]["id"], rows[(hostile, "h-1")]["id"])


LINK = "https://acme.example/news/widget-2"


@pytest.mark.parametrize(("items", "told"), [
    # A page on another site lists the article's link first, under its own text (its
    # id the link, as a page's items are): it took the key of the site's own item, which
    # was never told. Now each is told: the site's own item is no copy of the other.
    ([("https://hostile.example/", "Widget 2: claim your free tokens"), ("https://acme.example/feed", "Widget 2 ships")],
     ["Widget 2 ships", "Widget 2: claim your free tokens"]),
    # The other way round: the copy joins the site's own story, told once.
    ([("https://acme.example/feed", "Widget 2 ships"), ("https://aggregator.example/", "Widget 2 ships (acme.example)")],
     ["Widget 2 ships"]),
    # Two aggregators, neither on the link's site: the link is either one's claim, so
    # a first one's own text no longer takes in the second's.
    ([("https://hostile.example/", "Widget giveaway: claim your free tokens"),
      ("https://aggregator.example/", "Acme ships Widget 2")],
     ["Acme ships Widget 2", "Widget giveaway: claim your free tokens"]),
    # ... while two that tell it alike are one story, told once.
    ([("https://aggregator.example/", "Acme ships Widget 2"), ("https://other.example/", "Widget 2 ships, Acme says")],
     ["Acme ships Widget 2"]),
])
def test_a_link_on_another_site_is_no_claim_to_its_item_or_story(engine, site, items, told):
    """Identities another party can claim: an item key and a story's link. Items come
    in the order given, each stored before the next; ``told`` is what the one user
    whose filter matches them all hears."""
    with engine.begin() as conn:
        add_user(conn, "alice", site.url("/hook"))
        users.add_filter(conn, "alice", "widget")
    for source_url, title in items:
        with engine.begin() as conn:
            add_raw(conn, add_source(conn, source_url), LINK, title=title, url=LINK)
        processor(engine).run()
    notifier(engine).run()
    assert sorted(json.loads(p["body"])["listing"]["title"] for p in posts(site)) == sorted(told)


def test_a_source_url_with_tracking_parameters_is_the_same_source(engine, db_url):
    from tests.test_cli import assert_one_line_error, run

    env = {"DATABASE_URL": db_url}
    assert run("sources", "add", "http://127.0.0.1/jobs.rss", env=env).returncode == 0
    assert_one_line_error(run("sources", "add", "http://127.0.0.1/jobs.rss?utm_campaign=x&fbclid=1", env=env),
                          "a source with URL http://127.0.0.1/jobs.rss exists already (id 1)")
    assert run("sources", "add", "http://127.0.0.1/jobs.rss?page=2&utm_source=y", env=env).returncode == 0
    with engine.connect() as conn:
        assert sorted(conn.execute(sa.select(schema.sources.c.url)).scalars()) == [
            "http://127.0.0.1/jobs.rss", "http://127.0.0.1/jobs.rss?page=2"]

"""The collector against feeds served on 127.0.0.1, on PostgreSQL and SQLite."""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector, CollectStats
from pipeline.fetching.rss import parse_feed
from pipeline.listings.normalize import html_to_text, normalise
from pipeline.listings.processor import Processor
from pipeline.storage import schema
from tests.conftest import conformance
from tests.helpers import add_source, expire_leases, locked_against, now, wait_until
from tests.http_server import Handler, InFlight, LocalServer
from tests.test_cli import run


def rss(items: list[tuple[str, str]], extra: str = "") -> bytes:
    entries = "".join(
        f"<item><guid>{guid}</guid><title>{title}</title><link>http://127.0.0.1/{guid}</link>"
        f"<description>&lt;p&gt;About {title}&lt;/p&gt;</description>"
        f"<pubDate>Sat, 21 Nov 2026 10:00:00 GMT</pubDate><category>jobs</category></item>"
        for guid, title in items
    )
    return f"<?xml version='1.0'?><rss version='2.0'><channel><title>t</title>{extra}{entries}</channel></rss>".encode()


@pytest.fixture
def server():
    srv = LocalServer().start()
    yield srv
    srv.stop()


def serve(server: LocalServer, path: str, body: bytes, etag: str | None = None) -> None:
    def route(h: Handler) -> None:
        if etag and h.headers.get("If-None-Match") == etag:
            h.reply(304, headers={"ETag": etag})
        else:
            h.reply(200, body, {"Content-Type": "application/rss+xml", **({"ETag": etag} if etag else {})})

    server.routes[path] = route


def collector(engine: sa.Engine, **kwargs) -> Collector:
    settings = Settings(database_url=str(engine.url), http_timeout_seconds=30.0, allow_networks=("127.0.0.1/32",))
    return Collector(engine, settings, "test-worker", run_id="run-1", random_unit=lambda: 0.5, **kwargs)


def rows(engine: sa.Engine, table: sa.Table) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(table).order_by(table.c.id)).mappings()]


@conformance
def test_new_items_land_once_unchanged_items_never_changed_items_again(engine, server):
    serve(server, "/feed", rss([("a", "First"), ("b", "Second")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
    stats = collector(engine).run()
    assert (stats.claimed, stats.succeeded, stats.items_seen, stats.items_new) == (1, 1, 2, 2)
    raw = rows(engine, schema.listings_raw)
    assert {r["source_item_id"] for r in raw} == {"a", "b"}
    first = next(r for r in raw if r["source_item_id"] == "a")["raw_json"]
    assert first == {
        "title": "First", "url": "http://127.0.0.1/a", "summary": "<p>About First</p>",
        "published_at": "2026-11-21T10:00:00+00:00", "author": None, "categories": ["jobs"],
    }

    with engine.begin() as conn:  # due again
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    serve(server, "/feed", rss([("a", "First"), ("b", "Second, edited"), ("c", "Third")]))
    stats = collector(engine).run()
    assert (stats.items_seen, stats.items_new) == (3, 2)
    raw = rows(engine, schema.listings_raw)
    assert sorted(r["source_item_id"] for r in raw) == ["a", "b", "b", "c"]


@conformance
def test_success_schedules_the_next_fetch_one_interval_later_and_records_telemetry(engine, server):
    serve(server, "/feed", rss([("a", "A")]), etag='"e1"')
    with engine.begin() as conn:
        source_id = add_source(conn, server.url("/feed"), fetch_interval_minutes=30)
    before = now()
    collector(engine).run()
    [source] = rows(engine, schema.sources)
    assert before + timedelta(minutes=30) <= source["next_fetch_at"] <= now() + timedelta(minutes=30)
    assert (source["etag"], source["consecutive_failures"], source["locked_until"]) == ('"e1"', 0, None)
    started, completed = rows(engine, schema.ingestion_events)
    assert (started["event"], started["source_id"], started["run_id"]) == ("ingestion.started", source_id, "run-1")
    assert started["source_type"] == "rss" and started["scheduled_at"] is None
    assert completed["event"] == "ingestion.completed"
    assert (completed["success"], completed["http_status"], completed["items_seen"], completed["items_new"]) == (True, 200, 1, 1)
    assert completed["failure_reason"] is None and completed["duration_ms"] >= 0

    # The next fetch is conditional: a 304 adds nothing and keeps the cadence.
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    stats = collector(engine).run()
    assert (stats.not_modified, stats.items_new) == (1, 0)
    assert server.requests[-1]["headers"]["If-None-Match"] == '"e1"'
    assert rows(engine, schema.ingestion_events)[-1]["http_status"] == 304


def test_a_failing_source_backs_off_and_never_stops_the_others(engine, server):
    serve(server, "/good", rss([("a", "A")]))
    server.routes["/bad"] = lambda h: h.reply(503, b"down", {"Retry-After": "3600"})
    serve(server, "/junk", b"<rss version='2.0'><channel><title>t</title></item></channel></rss>")  # malformed, with nothing readable
    with engine.begin() as conn:
        good = add_source(conn, server.url("/good"))
        bad = add_source(conn, server.url("/bad"), consecutive_failures=2)
        junk = add_source(conn, server.url("/junk"))
    stats = collector(engine).run()
    assert stats.succeeded == 1 and dict(stats.failed) == {"http_5xx": 1, "parse_error": 1}
    by_id = {r["id"]: r for r in rows(engine, schema.sources)}
    assert by_id[good]["consecutive_failures"] == 0
    assert (by_id[bad]["consecutive_failures"], by_id[bad]["last_failure_reason"]) == (3, "http_5xx")
    # Backoff would give 20 minutes; Retry-After (one hour) is the floor.
    assert by_id[bad]["next_fetch_at"] >= now() + timedelta(minutes=59)
    assert by_id[junk]["last_failure_reason"] == "parse_error"
    events = {e["source_id"]: e for e in rows(engine, schema.ingestion_events) if e["event"] == "ingestion.completed"}
    assert (events[bad]["success"], events[bad]["http_status"], events[bad]["failure_reason"]) == (False, 503, "http_5xx")
    assert events[bad]["retry_in_minutes"] >= 59


@pytest.mark.parametrize("retry_after", ["1000000000000", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_hostile_retry_after_is_rate_limited_within_the_cap(engine, server, retry_after):
    # It once raised OverflowError (recorded as a parse_error, with a traceback) or
    # parked the source, still enabled, until the year 9999.
    server.routes["/far"] = lambda h: h.reply(429, b"later", {"Retry-After": retry_after})
    with engine.begin() as conn:
        add_source(conn, server.url("/far"))
    c = collector(engine)
    stats = c.run()
    assert dict(stats.failed) == {"rate_limited": 1}
    [source] = rows(engine, schema.sources)
    cap = c.policy.transient_cap
    assert source["last_failure_reason"] == "rate_limited" and source["enabled"]
    assert source["next_fetch_at"] <= now() + cap
    with engine.connect() as conn:
        group = conn.execute(sa.select(schema.politeness_groups.c.next_request_at)
                             .where(schema.politeness_groups.c.name == "127.0.0.1")).scalar_one()
    assert group <= now() + cap, "the group's deferral is bounded by the same cap"


@conformance
def test_a_fetch_stores_at_most_the_item_cap_and_leaves_the_rest_for_the_next(engine, server):
    # 25 items, a cap of 10: three fetches store them all, none twice, and each capped
    # fetch says how many it left; the validators are dropped so the next is no 304.
    serve(server, "/many", rss([(f"g{i}", f"Item {i}") for i in range(25)]), etag='"v1"')
    with engine.begin() as conn:
        add_source(conn, server.url("/many"))
    c = collector(engine)
    c.settings = dataclasses.replace(c.settings, max_items_per_fetch=10)
    stored, left = [], []
    for _ in range(4):
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
        stats = c.run()
        stored.append(stats.items_new)
        event = rows(engine, schema.ingestion_events)[-1]
        left.append((event["details"] or {}).get("items_left"))
        assert event["items_seen"] == 25 or event["http_status"] == 304
    assert stored == [10, 10, 5, 0] and left == [15, 5, None, None]
    raw = rows(engine, schema.listings_raw)
    assert sorted(r["source_item_id"] for r in raw) == sorted(f"g{i}" for i in range(25))
    assert rows(engine, schema.sources)[0]["etag"] == '"v1"', "the fetch that stored the last ones keeps it"


def test_permanent_failures_disable_the_source_with_a_reason(engine, server):
    server.routes["/gone"] = lambda h: h.reply(410, b"gone")
    with engine.begin() as conn:
        add_source(conn, server.url("/gone"), consecutive_failures=9)
    collector(engine).run()
    [source] = rows(engine, schema.sources)
    assert source["enabled"] is False
    assert source["disabled_reason"].startswith("http_4xx 10 times in a row")


@conformance
def test_a_permanent_redirect_updates_the_stored_url(engine, server):
    serve(server, "/new", rss([("a", "A")]))
    server.routes["/old"] = lambda h: h.reply(301, headers={"Location": "/new"})
    with engine.begin() as conn:
        add_source(conn, server.url("/old"))
    collector(engine).run()
    assert rows(engine, schema.sources)[0]["url"] == server.url("/new")


def test_max_sources_is_never_exceeded(engine, server):
    serve(server, "/feed", rss([("a", "A")]))
    with engine.begin() as conn:
        for i in range(7):
            add_source(conn, server.url(f"/feed?{i}"))
    stats = collector(engine, batch_size=2).run(max_sources=5, concurrency=2)
    assert stats.claimed == 5
    due = [s for s in rows(engine, schema.sources) if s["next_fetch_at"] is None]
    assert len(due) == 2


def test_sources_fetch_once_per_interval_on_their_own_cadence(engine, server):
    serve(server, "/feed", rss([("a", "A")]))
    t = now()
    with engine.begin() as conn:
        add_source(conn, server.url("/feed?due"), next_fetch_at=t - timedelta(minutes=1))
        add_source(conn, server.url("/feed?later"), next_fetch_at=t + timedelta(minutes=10))
        add_source(conn, server.url("/feed?new"))
    assert collector(engine).run().claimed == 2
    assert collector(engine).run().claimed == 0, "nothing is due twice within its interval"
    assert sorted(r["path"] for r in server.requests) == ["/feed?due", "/feed?new"]


def test_a_youtube_source_that_names_no_channel_fails_as_invalid_config(engine, server):
    with engine.begin() as conn:  # written directly: `sources add` would refuse it
        add_source(conn, server.url("/not-a-channel"), source_type="youtube")
    stats = collector(engine).run()
    assert dict(stats.failed) == {"invalid_config": 1}
    [event] = [e for e in rows(engine, schema.ingestion_events) if e["event"] == "ingestion.completed"]
    assert "is not a YouTube channel, @handle, user or playlist URL" in event["details"]["error"]


def test_pipeline_collect_command(engine, db_url, server):
    serve(server, "/feed", rss([("a", "A"), ("b", "B")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
    result = run("collect", "--json", env={"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32"})
    assert result.returncode == 0, result.stderr
    totals = json.loads(result.stdout.strip().splitlines()[-1])
    assert (totals["claimed"], totals["fetched"], totals["items_new"]) == (1, 1, 2)
    assert totals["fetch_latency_p50_ms"] is not None


# -- the rss adapter's parsing --------------------------------------------------------


def test_entry_identity_is_guid_then_link_then_content_hash():
    body = (
        b"<rss version='2.0'><channel>"
        b"<item><guid>g1</guid><link>http://127.0.0.1/1</link><title>a</title></item>"
        b"<item><link>http://127.0.0.1/2</link><title>b</title></item>"
        b"<item><title>c</title></item></channel></rss>"
    )
    ids = [i.source_item_id for i in parse_feed(body, "http://127.0.0.1/feed")]
    assert ids[:2] == ["g1", "http://127.0.0.1/2"] and ids[2].startswith("sha256:")


def test_content_hash_identities_keep_when_plain_text_is_escaped():
    """An entry with neither id nor link is identified by a hash of what it says: of the
    text as read, not as escaped for the raw item, so entries stored before plain text
    was escaped (issue 33) are not new again. Pinned: the identities the code gave then."""
    rss = (b"<rss version='2.0'><channel><title>t</title>"
           b"<item><title>A&lt;B &amp; C</title><description>x</description></item></channel></rss>")
    [item] = parse_feed(rss, "http://127.0.0.1/feed")
    assert item.raw["title"] == "A&lt;B &amp; C"
    assert item.source_item_id == "sha256:af81f1df69a58f1e33f7ec26cfb3b064f47a22aa6ad4acd2d31dc63cb79d6c8f"
    json_feed = (b'{"version": "https://jsonfeed.org/version/1.1", "title": "t",'
                 b' "items": [{"title": "A<B & C", "content_text": "x<y"}]}')
    [item] = parse_feed(json_feed, "http://127.0.0.1/feed")
    assert (item.raw["title"], item.raw["summary"]) == ("A&lt;B &amp; C", "x&lt;y")
    assert item.source_item_id == "sha256:e8d1ae9fe539874058f7b801b17df170666cbcdf3679b8dd2c75b4f8228c31de"


PODCAST = """<rss version='2.0'><channel><title>Show</title><link>http://127.0.0.1/show</link>
<item><title>Trailer</title><link>http://127.0.0.1/trailer</link></item>
<item><guid>ep-special</guid><title>Special</title><link>http://127.0.0.1/show</link></item>
{}</channel></rss>"""


@pytest.mark.parametrize("told_by", ["enclosure", "title and date"])
def test_episodes_that_share_their_show_s_link_are_each_an_item(told_by):
    """Fifteen episodes without a guid, each linking to the show: the link names no one
    of them, so each is told by its enclosure (or its title and date). Entries with an id,
    or with a link no other entry carries, keep the identity they always had: no item
    already stored is new after the upgrade (the real-world corpus: bench/RESULTS.md)."""
    episodes = "".join(
        f"<item><title>Episode {n}</title><link>http://127.0.0.1/show</link>"
        f"<pubDate>Mon, {n:02d} Nov 2026 08:00:00 GMT</pubDate>"
        + (f"<enclosure url='http://127.0.0.1/ep{n}.mp3' length='1' type='audio/mpeg'/>" if told_by == "enclosure" else "")
        + "</item>" for n in range(1, 16))
    items = parse_feed(PODCAST.format(episodes).encode(), "http://127.0.0.1/feed")
    ids = [i.source_item_id for i in items]
    assert ids[:2] == ["http://127.0.0.1/trailer", "ep-special"], "identities as before"
    assert len(set(ids[2:])) == 15 and all(i.startswith("http://127.0.0.1/show#") for i in ids[2:])
    if told_by == "enclosure":
        assert ids[2] == "http://127.0.0.1/show#enclosure=http://127.0.0.1/ep1.mp3"
    newer = "<item><title>Episode 16</title><link>http://127.0.0.1/show</link></item>" + episodes
    again = [i.source_item_id for i in parse_feed(PODCAST.format(newer).encode(), "http://127.0.0.1/feed")]
    assert set(ids) < set(again), "a new episode ahead of the others changes no identity"
    assert [html_to_text(i.raw["title"]) for i in items[2:4]] == ["Episode 1", "Episode 2"]


def test_episodes_that_share_a_link_are_each_stored(engine, server):
    """The whole path: a shared link no longer collapses a podcast's episodes into one
    listing (which held whichever episode was stored last)."""
    episodes = "".join(
        f"<item><title>Episode {n}</title><link>http://127.0.0.1/show</link>"
        f"<enclosure url='http://127.0.0.1/ep{n}.mp3' length='1' type='audio/mpeg'/></item>" for n in range(1, 4))
    serve(server, "/podcast", PODCAST.format(episodes).encode())
    with engine.begin() as conn:
        add_source(conn, server.url("/podcast"))
    assert collector(engine).run().items_new == 5
    assert len(rows(engine, schema.listings_raw)) == 5


def test_an_item_without_a_link_of_its_own_gets_none_and_its_source_learns_its_site(engine, server):
    """A feed item with no link, or only a urn:/tag: id, was given the feed's own URL as
    its link (a reader who clicked landed on XML): now it has none, an id that is a web
    address stands in, and the source keeps the site the feed names, which messages
    offer instead (tests/test_notifier.py)."""
    serve(server, "/feed", (
        "<rss version='2.0'><channel><title>t</title><link>http://127.0.0.1/blog/</link>"
        "<item><title>No link</title><description>x</description></item>"
        "<item><guid isPermaLink='false'>urn:uuid:1</guid><title>Urn id</title></item>"
        "<item><guid isPermaLink='false'>http://127.0.0.1/blog/?p=7</guid><title>Web id</title></item>"
        "<item><title>Linked</title><link>http://127.0.0.1/blog/linked</link></item>"
        "</channel></rss>").encode())
    with engine.begin() as conn:
        source_id = add_source(conn, server.url("/feed"))
    assert collector(engine).run().items_new == 4
    Processor(engine, Settings(database_url=str(engine.url)), "test-worker").run()
    with engine.connect() as conn:
        urls = dict(conn.execute(sa.select(schema.listings.c.title, schema.listings.c.url)).all())
        site = conn.execute(sa.select(schema.sources.c.site_url).where(schema.sources.c.id == source_id)).scalar_one()
    assert urls == {"No link": "", "Urn id": "", "Web id": "http://127.0.0.1/blog/?p=7",
                    "Linked": "http://127.0.0.1/blog/linked"}
    assert site == "http://127.0.0.1/blog/"


def test_atom_is_read_too():
    body = (
        b"<?xml version='1.0'?><feed xmlns='http://www.w3.org/2005/Atom'><title>t</title>"
        b"<entry><id>urn:x:1</id><title>Hello</title><link href='http://127.0.0.1/h'/>"
        b"<updated>2026-11-20T08:00:00Z</updated><author><name>Ann</name></author></entry></feed>"
    )
    [item] = parse_feed(body, "http://127.0.0.1/atom")
    assert (item.source_item_id, item.url, item.raw["author"]) == ("urn:x:1", "http://127.0.0.1/h", "Ann")
    assert item.raw["published_at"] == "2026-11-20T08:00:00+00:00"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # Malformed XML with nothing a lenient reader finds either (one it can read is read).
        (b"<rss version='2.0'><channel><title>t</title></item></channel></rss>", "malformed XML"),
        (b"<html><body><p>just a page</p></body></html>", "not a feed"),
        (
            (
                b"<?xml version='1.0'?><!DOCTYPE rss [<!ENTITY a 'aaaaaaaaaa'>"
                b"<!ENTITY b '&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;'>"
                b"<!ENTITY c '&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;'>]>"
                b"<rss version='2.0'><channel><item><title>&c;</title></item></channel></rss>"
            ),
            "declares XML entities; they are never expanded",
        ),
        (
            (
                "<?xml version='1.0' encoding='utf-16'?><!DOCTYPE rss [<!ENTITY a 'x'>]>"
                "<rss version='2.0'><channel><item><title>&a;</title></item></channel></rss>"
            ).encode("utf-16"),
            "declares XML entities",
        ),
    ],
    ids=["malformed", "not-a-feed", "entity-bomb", "entity-bomb-utf16"],
)
def test_unusable_documents_are_parse_errors(body, message):
    with pytest.raises(FetchError) as error:
        parse_feed(body, "http://127.0.0.1/feed")
    assert error.value.reason is FailureReason.PARSE_ERROR and message in str(error.value)


ENTITY_SPOOF = (
    "<?xml version='1.0' encoding='{name}'?><!DOCTYPE rss [<!ENTITY a 'SPOOFED'>"
    "<!ENTITY b '&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;'>]>"
    "<rss version='2.0'><channel><title>t</title><item><guid>1</guid><title>&b;</title></item>"
    "</channel></rss>"
)


@pytest.mark.parametrize(
    ("name", "codec"),
    [("utf-16", "utf-16-le"), ("utf-16", "utf-16-be"), ("utf-32", "utf-32"), ("utf-32", "utf-32-le"),
     ("utf-32", "utf-32-be"), ("cp037", "cp037")],
)
@pytest.mark.parametrize("content_type", [None, "application/rss+xml"])
def test_entity_declarations_are_refused_in_every_encoding(name, codec, content_type):
    # Byte-order-mark-less UTF-16, UTF-32 and EBCDIC once passed a check for the bytes
    # "<!ENTITY", and the parser expanded the entity into the title.
    body = ENTITY_SPOOF.format(name=name).encode(codec)
    with pytest.raises(FetchError) as error:
        items = parse_feed(body, "http://127.0.0.1/feed", content_type)
        pytest.fail(f"parsed, titles {[i.raw['title'][:20] for i in items]}")
    assert error.value.reason is FailureReason.PARSE_ERROR and "declares XML entities" in error.value.message


@pytest.mark.parametrize(("body", "titles"), [
    # White space, or a byte-order mark and a newline, before the XML declaration.
    (b"\n  <?xml version='1.0'?><rss version='2.0'><channel><item><title>a</title></item></channel></rss>", ["a"]),
    (b"\xef\xbb\xbf\r\n<?xml version='1.0'?><rss version='2.0'><channel><item><title>b</title></item></channel></rss>",
     ["b"]),
    # A mismatched tag, an unbound prefix, a stray "&", HTML entities with no DTD.
    (b"<rss version='2.0'><channel><item><title>a</title></b></item><item><title>c</title></item></channel></rss>",
     ["a", "c"]),
    (b"<rss version='2.0'><channel><item><title>a</title><media:x>y</media:x></item></channel></rss>", ["a"]),
    (b"<rss version='2.0'><channel><item><title>Fish & chips</title></item></channel></rss>", ["Fish & chips"]),
    (b"<rss version='2.0'><channel><item><title>Caf&eacute;&nbsp;&mdash; open</title></item></channel></rss>",
     ["Caf\u00e9 \u2014 open"]),
])
def test_what_a_forgiving_reader_reads_is_read(body, titles):
    # Each was once a parse_error for the whole feed; feedparser alone reads them.
    assert [html_to_text(item.raw["title"]) for item in parse_feed(body, "http://127.0.0.1/feed")] == titles


RSS_ITEM = "<rss version='2.0'><channel><title>t</title><item><link>http://127.0.0.1/1</link>{}</item></channel></rss>"
ATOM_ENTRY = ("<feed xmlns='http://www.w3.org/2005/Atom'><title>t</title>"
              "<entry><id>urn:x:1</id><link href='http://127.0.0.1/1'/>{}</entry></feed>")


@pytest.mark.parametrize(("document", "title"), [
    # Plain text keeps its "<" and "&", escaped or in CDATA, whatever follows them.
    (RSS_ITEM.format("<title>A&lt;B and C</title>"), "A<B and C"),
    (RSS_ITEM.format("<title><![CDATA[A<B and C]]></title>"), "A<B and C"),
    (RSS_ITEM.format("<title>Price &lt;500 EUR</title>"), "Price <500 EUR"),
    (RSS_ITEM.format("<title>Price &lt; 500 EUR</title>"), "Price < 500 EUR"),
    (RSS_ITEM.format("<title>R&amp;D &amp;copy 2026</title>"), "R&D &copy 2026"),
    (ATOM_ENTRY.format("<title type='text'>A&lt;B and C</title>"), "A<B and C"),
    (ATOM_ENTRY.format("<title>Use &lt;br&gt; less</title>"), "Use <br> less"),
    # HTML is read as a browser shows it: its tags dropped, what it escaped kept.
    (ATOM_ENTRY.format("<title type='html'>The &amp;lt;entry&amp;gt; element</title>"), "The <entry> element"),
    (ATOM_ENTRY.format("<title type='html'>&lt;b&gt;Bold&lt;/b&gt; move</title>"), "Bold move"),
    (RSS_ITEM.format("<title>&lt;b&gt;Bold&lt;/b&gt; &amp;amp; brave</title>"), "Bold & brave"),  # HTML by its look
    (ATOM_ENTRY.format("<title type='xhtml'><div xmlns='http://www.w3.org/1999/xhtml'>A &lt;b&gt; <b>c</b></div></title>"),
     "A <b> c"),
])
@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "feedparser"])
def test_a_title_reads_as_its_type_says(document, title, fast, monkeypatch):
    """Each field is converted by its declared type (Atom's type attribute) or the one
    feedparser detects (RSS has none): plain text stays text, HTML keeps what it escaped."""
    if not fast:
        monkeypatch.setattr("pipeline.fetching.quickfeed.parse", lambda document, detected: None)
    [item] = parse_feed(document.encode(), "http://127.0.0.1/feed")
    assert normalise(item.raw).title == title


def test_a_plain_text_summary_keeps_its_less_than_signs():
    document = ATOM_ENTRY.format("<title>t</title><summary>if a&lt;b then b&gt;a</summary>")
    [item] = parse_feed(document.encode(), "http://127.0.0.1/feed")
    assert normalise(item.raw).summary == "if a<b then b>a"


@pytest.mark.parametrize("content", [
    "<content type='html'>&lt;p&gt;Remote &lt;b&gt;role&lt;/b&gt;&lt;/p&gt;</content>",
    "<content type='xhtml'><div xmlns='http://www.w3.org/1999/xhtml'><p>Remote <b>role</b></p></div></content>",
    "<content type='text'>Remote role</content>",
    "<content type='text/html' mode='base64'>PHA+UmVtb3RlIDxiPnJvbGU8L2I+PC9wPg==</content>",
    "<content type='text/html' mode='escaped'>&lt;p&gt;Remote role&lt;/p&gt;</content>",
])
def test_atom_content_in_every_encoding_is_kept(content):
    body = (f"<feed xmlns='http://www.w3.org/2005/Atom'><title>t</title><entry><id>urn:x:1</id>"
            f"<title>a</title>{content}</entry></feed>").encode()
    [item] = parse_feed(body, "http://127.0.0.1/feed")
    assert "Remote" in item.raw["summary"] and "role" in item.raw["summary"], item.raw


def test_the_author_is_the_persons_name():
    # Once stored as "jane@example.org (Jane Doe)", as RSS writes it.
    body = (b"<rss version='2.0'><channel><item><title>a</title><author>jane@example.org (Jane Doe)</author></item>"
            b"<item><title>b</title><author>jane@example.org</author></item></channel></rss>")
    assert [item.raw["author"] for item in parse_feed(body, "http://127.0.0.1/feed")] == ["Jane Doe", "jane@example.org"]


def test_entries_without_id_or_link_differing_in_language_are_two():
    body = (b"<feed xmlns='http://www.w3.org/2005/Atom' xml:lang='en'><title>t</title>"
            b"<entry xml:lang=''><content type='text'>Same</content></entry>"
            b"<entry><content type='text'>Same</content></entry></feed>")
    assert len({item.source_item_id for item in parse_feed(body, "http://127.0.0.1/feed")}) == 2


def test_a_lenient_reread_never_expands_an_entity():
    # Malformed AND declaring an entity: refused before either parser sees it.
    body = (b"\n<?xml version='1.0'?><!DOCTYPE rss [<!ENTITY a 'SPOOFED'>]><rss version='2.0'><channel>"
            b"<item><title>&a;</title></b></item></channel></rss>")
    with pytest.raises(FetchError, match="declares XML entities"):
        parse_feed(body, "http://127.0.0.1/feed")


def test_an_external_dtd_without_entity_declarations_still_parses():
    body = (
        b'<?xml version="1.0"?><!DOCTYPE rss PUBLIC "-//Netscape Communications//DTD RSS 0.91//EN"'
        b' "http://my.netscape.com/publish/formats/rss-0.91.dtd">'
        b"<rss version='0.91'><channel><title>t</title><item><title>a</title>"
        b"<link>http://127.0.0.1/a</link></item></channel></rss>"
    )
    assert [i.raw["title"] for i in parse_feed(body, "http://127.0.0.1/feed")] == ["a"]


def test_a_wrong_declared_encoding_is_tolerated():
    body = "<?xml version='1.0' encoding='iso-8859-1'?><rss version='2.0'><channel><item><guid>g</guid><title>café</title></item></channel></rss>"
    [item] = parse_feed(body.encode("utf-8"), "http://127.0.0.1/feed")
    assert item.raw["title"] == "café"


def test_an_atom_03_entry_dated_only_by_created_keeps_its_date():
    """feedparser reads Atom 0.3's <created>; the entry was stored without a date."""
    doc = ("<?xml version='1.0'?><feed version='0.3' xmlns='http://purl.org/atom/ns#'><title>t</title>"
           "<entry><id>tag:example.org,2004:1</id><title>Created only</title>"
           "<link rel='alternate' type='text/html' href='http://127.0.0.1/1'/>"
           "<created>2004-01-02T03:04:05Z</created></entry></feed>")
    [item] = parse_feed(doc.encode(), "http://127.0.0.1/feed")
    assert item.raw["published_at"] == "2004-01-02T03:04:05+00:00"


@pytest.mark.slow
def test_concurrent_collector_processes_fetch_each_source_once(engine, db_url, server):
    """Processes: each collector is one, as workers on several machines would be. The
    feed holds its answers until more requests are in flight than one collector's four
    threads can make: a second process has claimed sources, however busy the machine
    (a first process that started seconds earlier would otherwise take them all)."""
    import subprocess
    import sys
    import threading

    in_flight, shared = [0], threading.Event()
    lock = threading.Lock()

    def held_feed(h: Handler) -> None:
        with lock:
            in_flight[0] += 1
            if in_flight[0] > 4:
                shared.set()
        try:
            shared.wait(timeout=60)  # past it the answers go out, and the test fails below
            h.reply(200, rss([("a", "A")]), {"Content-Type": "application/rss+xml"})
        finally:
            with lock:
                in_flight[0] -= 1

    server.routes["/feed"] = held_feed
    with engine.begin() as conn:
        for i in range(60):
            add_source(conn, server.url(f"/feed?{i}"))
    env = {
        **{k: v for k, v in __import__("os").environ.items() if k != "DATABASE_URL"},
        "DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "collect", "--json", "--concurrency", "4"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(3)
    ]
    totals = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        totals.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(t["claimed"] for t in totals) == 60
    assert sum(1 for t in totals if t["claimed"]) >= 2, "the processes really shared the work"
    paths = [r["path"] for r in server.requests]
    assert len(paths) == 60 and len(set(paths)) == 60, "no source was fetched twice"
    assert len(rows(engine, schema.listings_raw)) == 60


@pytest.mark.slow
def test_a_collector_killed_mid_fetch_is_taken_over_after_its_lease(engine, db_url, server):
    """A process (it is killed with SIGKILL in the middle of a fetch); its lease is
    ended by moving it into the past, not by waiting for it."""
    import os
    import signal
    import subprocess
    import sys

    reached, release = threading.Event(), threading.Event()

    def feed(h: Handler) -> None:
        if not reached.is_set():
            reached.set()
            release.wait(60)  # the first fetch never finishes: its collector dies meanwhile
        h.reply(200, rss([("a", "A"), ("b", "B")]), {"Content-Type": "application/rss+xml"})

    server.routes["/feed"] = feed
    with engine.begin() as conn:
        source_id = add_source(conn, server.url("/feed"))
    env = {"DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32", "PIPELINE_HTTP_TIMEOUT_SECONDS": "60"}
    victim = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "collect"],
                              env={**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, **env})
    try:
        assert reached.wait(60), "the first collector reached the server"
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    finally:
        release.set()
    [held] = rows(engine, schema.sources)
    assert held["claimed_by"].startswith("cli-collect:") and held["locked_until"] is not None

    survivor = run("collect", "--json", env=env)
    assert survivor.returncode == 0, survivor.stderr
    assert json.loads(survivor.stdout.strip().splitlines()[-1])["claimed"] == 0, "lease still live"
    expire_leases(engine, schema.sources)
    survivor = run("collect", "--json", env=env)
    totals = json.loads(survivor.stdout.strip().splitlines()[-1])
    assert (totals["claimed"], totals["fetched"], totals["items_new"]) == (1, 1, 2)
    assert sorted(r["source_item_id"] for r in rows(engine, schema.listings_raw)) == ["a", "b"]
    events = [e["event"] for e in rows(engine, schema.ingestion_events) if e["source_id"] == source_id]
    assert events == ["ingestion.started", "ingestion.started", "ingestion.completed"]


def test_every_event_is_also_a_json_log_line(engine, server, caplog):
    serve(server, "/feed", rss([("a", "A")]))
    with engine.begin() as conn:
        source_id = add_source(conn, server.url("/feed"))
    with caplog.at_level("INFO", logger="pipeline.ingestion"):
        collector(engine).run()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "pipeline.ingestion"]
    assert [line["event"] for line in lines] == ["ingestion.started", "ingestion.completed"]
    completed = lines[1]
    assert (completed["source_id"], completed["run_id"], completed["items_new"]) == (source_id, "run-1", 1)
    assert completed["success"] is True and completed["duration_ms"] >= 0


# -- the pass as a whole ----------------------------------------------------------------


def completed_events(engine: sa.Engine) -> dict[int, dict]:
    return {e["source_id"]: e for e in rows(engine, schema.ingestion_events) if e["event"] == "ingestion.completed"}


def test_a_slow_source_delays_no_other_source(engine, server):
    """The slow source answers once every fast one's fetch is recorded (or after 60 s,
    and the test fails): a state, not a moment."""

    def slow(h: Handler) -> None:
        wait_until("the fast sources recorded", lambda: len(completed_events(engine)) >= 12, timeout=60,
                   every=0.05, fail=False)
        h.reply(200, rss([("s", "Slow")]), {"Content-Type": "application/rss+xml"})

    server.routes["/slow"] = slow
    serve(server, "/feed", rss([("a", "A")]))
    with engine.begin() as conn:
        slow_id = add_source(conn, server.url("/slow"), priority=1)  # claimed first
        fast_ids = [add_source(conn, server.url(f"/feed?{i}")) for i in range(12)]
    settings = Settings(database_url=str(engine.url), http_timeout_seconds=10.0, allow_networks=("127.0.0.1/32",))
    stats = Collector(engine, settings, "w", random_unit=lambda: 0.5).run(concurrency=2)
    assert stats.succeeded == 13
    events = completed_events(engine)
    slow_done = events[slow_id]["occurred_at"]
    # Before, a claim batch waited for its slowest fetch: sources claimed after the slow
    # one were only fetched once it had finished. Now every fast source is done first.
    assert all(events[i]["occurred_at"] < slow_done for i in fast_ids)


@conformance
def test_a_source_whose_write_the_database_refuses_fails_alone(engine, server, monkeypatch):
    from pipeline.fetching import collector as collector_module

    serve(server, "/feed", rss([("a", "A"), ("b", "B")]))
    with engine.begin() as conn:
        ids = [add_source(conn, server.url(f"/feed?{i}")) for i in range(4)]
    poison = ids[1]
    store = collector_module.store_items

    def refuse_one(conn, batch):
        if any(source_id == poison for source_id, _ in batch):
            # A real error from the database: the source_type CHECK refuses the row.
            conn.execute(sa.insert(schema.sources).values(name="x", url="x", source_type="nonsense"))
        return store(conn, batch)

    monkeypatch.setattr(collector_module, "store_items", refuse_one)
    stats = collector(engine).run()
    assert stats.succeeded == 3 and dict(stats.failed) == {"parse_error": 1}
    by_id = {r["id"]: r for r in rows(engine, schema.sources)}
    assert by_id[poison]["last_failure_reason"] == "parse_error" and by_id[poison]["locked_until"] is None
    assert all(by_id[i]["consecutive_failures"] == 0 for i in ids if i != poison)
    assert sorted(r["source_id"] for r in rows(engine, schema.listings_raw)) == sorted(
        [i for i in ids if i != poison] * 2
    ), "the other sources' items are stored; none of the refused source's"
    assert "the database refused this source's items" in completed_events(engine)[poison]["details"]["error"]


def test_a_database_that_cannot_take_the_write_now_fails_the_pass_and_blames_no_source(engine, db_url, server):
    """The database could not do the write for now (a lock held past its timeout, as a
    restart, a cut connection or a full disk are): the pass fails, to be retried, and
    no source is recorded as failing. Taken for the source's own data being refused,
    each source of the batch was written again alone and recorded as a parse error."""
    serve(server, "/feed", rss([("a", "A"), ("b", "B")]))
    with engine.begin() as conn:
        ids = [add_source(conn, server.url(f"/feed?{i}")) for i in range(2)]
    with locked_against(engine, db_url, schema.listings_raw) as impatient, \
            pytest.raises(sa.exc.OperationalError, match="lock timeout"):
        collector(impatient).run()
    by_id = {r["id"]: r for r in rows(engine, schema.sources)}
    assert [(by_id[i]["last_failure_reason"], by_id[i]["consecutive_failures"]) for i in ids] == [(None, 0)] * 2


def test_items_are_made_storable_whatever_the_feed_holds(engine, server):
    long_guid = "g" * 5000
    serve(server, "/feed", rss([(long_guid, "Long id"), ("short", "Short id")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
    assert collector(engine).run().items_new == 2
    ids = sorted(r["source_item_id"] for r in rows(engine, schema.listings_raw))
    assert ids[0].startswith("sha256:") and len(ids[0]) == 71 and ids[1] == "short"


@conformance
def test_items_are_stored_as_they_were_read_whatever_their_text(engine):
    """store_items writes each item's JSON into its statement as it is (PostgreSQL): ids,
    links and content with quotes, backslashes, escapes, line separators and non-ASCII
    text come back unchanged, and the content hash is the hash of the same text."""
    from pipeline.fetching.base import Item
    from pipeline.fetching.collector import store_items

    odd = 'a "quoted" \\ back\\slash, \u2028 line, \t tab, caf\u00e9 \U0001f600 </script> \\u0000 ]},'
    items = [
        Item(f"id {odd} {n}", f"http://127.0.0.1/item?q={n}&x=\"{n}\"",
             {"title": f"{odd} {n}", "url": "http://127.0.0.1/", "summary": odd, "n": n, "f": 1.5,
              "nested": {"list": [odd, None, True]}, "published_at": None, "author": None, "categories": []})
        for n in range(3)
    ]
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/feed")
        assert store_items(conn, [(source, items)]) == {source: 3}
    stored = {r["source_item_id"]: r for r in rows(engine, schema.listings_raw)}
    assert set(stored) == {item.source_item_id for item in items}
    for item in items:
        row = stored[item.source_item_id]
        assert (row["url"], row["raw_json"], row["content_hash"]) == (item.url, item.raw, item.content_hash)
    with engine.begin() as conn:  # the same items again: nothing new
        assert store_items(conn, [(source, items)]) == {}


@conformance
def test_item_strings_lose_nul_and_lone_surrogates():
    from pipeline.fetching.base import Item

    item = Item("id\x00", "http://127.0.0.1/\x00", {"title": "a\x00b", "categories": ["x\ud800y"]})
    assert (item.source_item_id, item.url) == ("id", "http://127.0.0.1/")
    assert item.raw == {"title": "ab", "categories": ["x?y"]}
    item.raw_text.encode("utf-8")  # storable as UTF-8


def test_every_failure_code_through_the_collector(engine, server):
    """Waits for the fetcher's own 1 s timeout, in a run of its own: the slow route answers
    only once that run is over, and the other routes are fetched in a run whose timeout no
    busy machine reaches."""
    import socket

    over = threading.Event()

    def slow(h: Handler) -> None:
        over.wait(60)
        h.reply(200, rss([("a", "A")]))

    with socket.socket() as probe:  # a port that was free a moment ago: connection refused
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    server.routes["/404"] = lambda h: h.reply(404, b"no")
    server.routes["/500"] = lambda h: h.reply(500, b"no")
    server.routes["/429"] = lambda h: h.reply(429, b"slow down", {"Retry-After": "7200"})
    server.routes["/slow"] = slow
    server.routes["/huge"] = lambda h: h.reply(200, b"<rss>" + b"x" * 200_000)
    serve(server, "/malformed", b"<rss version='2.0'><channel><title>t</title></item></channel></rss>")
    serve(server, "/page", b"<html><body><ul><li>a</li></ul></body></html>")
    expected = {
        f"http://127.0.0.1:{closed_port}/feed": ("rss", "network_error"),
        server.url("/404"): ("rss", "http_4xx"),
        server.url("/500"): ("rss", "http_5xx"),
        server.url("/429"): ("rss", "rate_limited"),
        server.url("/malformed"): ("rss", "parse_error"),
        server.url("/huge"): ("rss", "too_large"),
        server.url("/feed", host="127.0.0.2"): ("rss", "blocked_address"),
        server.url("/page"): ("http", "invalid_config"),
    }

    def add(url: str, kind: str) -> int:
        with engine.begin() as conn:
            return add_source(conn, url, source_type=kind, config={"item": "li[["} if kind == "http" else {})

    def collect(timeout: float) -> CollectStats:
        settings = Settings(database_url=str(engine.url), http_timeout_seconds=timeout,
                            max_response_bytes=100_000, allow_networks=("127.0.0.1/32",))
        return Collector(engine, settings, "w", random_unit=lambda: 0.5).run()

    slow_url = server.url("/slow")
    by_url = {slow_url: add(slow_url, "rss")}
    try:
        stats = collect(timeout=1.0)
    finally:
        over.set()
    assert (stats.succeeded, dict(stats.failed)) == (0, {"timeout": 1})
    by_url |= {url: add(url, kind) for url, (kind, _) in expected.items()}
    stats = collect(timeout=60.0)  # /slow waits out its backoff: the others are due
    assert stats.succeeded == 0 and sum(stats.failed.values()) == len(expected)
    expected[slow_url] = ("rss", "timeout")
    sources = {r["id"]: r for r in rows(engine, schema.sources)}
    events = completed_events(engine)
    for url, (_, code) in expected.items():
        source_id = by_url[url]
        assert (sources[source_id]["last_failure_reason"], events[source_id]["failure_reason"]) == (code, code), url
        assert events[source_id]["success"] is False and events[source_id]["retry_in_minutes"] > 0
    # Retry-After (2 h) is the floor over the 5-minute first backoff.
    assert events[by_url[server.url("/429")]]["retry_in_minutes"] >= 119
    # A config this version cannot use is found before the host is asked.
    assert "/page" not in {r["path"] for r in server.requests}


def test_concurrency_caps_fetches_in_flight(engine, server):
    in_flight = InFlight()
    server.routes["/hold"] = in_flight.holding_until(
        lambda h: h.reply(200, rss([("a", "A")]), {"Content-Type": "application/rss+xml"}), together=3, total=12,
    )
    with engine.begin() as conn:
        for i in range(12):
            add_source(conn, server.url(f"/hold?{i}"))
    # The suite's politeness limits are generous, so the run's own cap is the only limit in play.
    stats = collector(engine).run(concurrency=3)
    assert stats.succeeded == 12 and in_flight.peak == 3


def test_relative_links_resolve_against_content_location(engine, server):
    # Once resolved against the feed's own URL, ignoring the server's Content-Location.
    body = b"<rss version='2.0'><channel><item><title>a</title><link>/relative/uri</link></item></channel></rss>"
    server.routes["/moved"] = lambda h: h.reply(200, body, {
        "Content-Type": "application/rss+xml", "Content-Location": "http://example.com/feeds/main.xml"})
    server.routes["/plain"] = lambda h: h.reply(200, body, {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        moved = add_source(conn, server.url("/moved"))
        plain = add_source(conn, server.url("/plain"))
    collector(engine).run()
    links = {r["source_id"]: (r["raw_json"]["url"], r["source_item_id"]) for r in rows(engine, schema.listings_raw)}
    assert links[moved][0] == "http://example.com/relative/uri"
    assert links[plain] == (server.url("/relative/uri"), "/relative/uri"), "identity as written, as before"

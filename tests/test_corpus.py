"""The bad-input corpus (tests/corpus/): feeds broken in the ways real feeds are, each
fetched, stored and normalised by the real pipeline, each with its expected outcome.
One broken feed never stops the others."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.listings.normalize import SUMMARY_CHARS, TITLE_CHARS
from pipeline.listings.processor import Processor
from pipeline.storage import schema
from tests.helpers import add_source
from tests.http_server import LocalServer

CORPUS = Path(__file__).resolve().parent / "corpus"

# Documents the collector refuses, with the failure code and a fragment of the reason.
REFUSED = {
    "not_a_feed.html": "malformed XML",
    "billion_laughs.xml": "never expanded",  # refused unread: no entity is expanded
    "xxe.xml": "never expanded",  # no external entity is ever fetched
}
# Malformed XML (an unclosed tag, control characters) is read again leniently, as
# feedparser alone reads it (issue 11: at least as forgiving as feedparser); it is a
# parse_error only when nothing readable is found (not_a_feed.html).


def generated() -> dict[str, bytes]:
    """The corpus' big members, made here rather than stored."""
    huge = "<p>" + "A very long description. " * 40_000 + "</p>"  # about 1 MB
    many = "".join(
        f"<item><guid>n{i}</guid><title>Item {i}</title><link>https://example.com/n/{i}</link></item>"
        for i in range(5000)
    )
    return {
        "huge_entry.xml": (
            '<?xml version="1.0"?><rss version="2.0"><channel><title>Huge</title><item><guid>huge</guid>'
            f"<title>{'Long title ' * 200}</title><link>https://example.com/huge</link>"
            f"<description><![CDATA[{huge}]]></description></item></channel></rss>"
        ).encode(),
        "thousands.xml": f'<?xml version="1.0"?><rss version="2.0"><channel><title>Many</title>{many}</channel></rss>'.encode(),
    }


@pytest.fixture
def corpus_server():
    server = LocalServer().start()
    documents = {p.name: p.read_bytes() for p in CORPUS.iterdir()} | generated()
    for name, body in documents.items():
        server.routes[f"/{name}"] = lambda h, body=body: h.reply(200, body, {"Content-Type": "application/xml"})
    yield server, sorted(documents)
    server.stop()


def listings_of(engine: sa.Engine, source_id: int) -> dict[str, dict]:
    t = schema.listings
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t).where(t.c.source_id == source_id)).mappings()
        return {r["source_item_id"]: dict(r) for r in rows}


def test_every_corpus_member_has_its_expected_outcome(engine, corpus_server):
    server, names = corpus_server
    with engine.begin() as conn:
        ids = {name: add_source(conn, server.url(f"/{name}")) for name in names}
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",))
    collected = Collector(engine, settings, "corpus").run()
    assert collected.claimed == len(names)
    with engine.connect() as conn:
        sources = {r.id: r for r in conn.execute(sa.select(schema.sources))}
    for name, source_id in ids.items():
        source = sources[source_id]
        if name in REFUSED:
            assert source.last_failure_reason == "parse_error", name
        else:
            assert source.consecutive_failures == 0 and source.last_success_at, (name, source.last_failure_reason)
    with engine.connect() as conn:
        details = dict(conn.execute(
            sa.select(schema.ingestion_events.c.source_id, schema.ingestion_events.c.details)
            .where(schema.ingestion_events.c.event == "ingestion.completed")).all())
    for name, fragment in REFUSED.items():
        assert fragment in details[ids[name]]["error"], (name, details[ids[name]])

    processed = Processor(engine, settings, "corpus").run()
    assert processed.failed == processed.gave_up == 0, "every stored item normalises"
    site = server.url("")

    assert [x["title"] for x in listings_of(engine, ids["wrong_encoding.xml"]).values()] == ["Café crème ½ price"]
    assert [x["title"] for x in listings_of(engine, ids["utf16_no_declared_encoding.xml"]).values()] == [
        "Grüße aus Köln — ✓"]

    relative = listings_of(engine, ids["missing_and_relative_ids.xml"])
    assert relative["/jobs/7"]["url"] == f"{site}/jobs/7", "a relative link is resolved against the feed"
    assert relative["has-guid"]["url"] == "", "no link: none (never the feed's)"
    assert len(relative) == 3, "two identical items without id or link are one (by content hash)"

    dupes = listings_of(engine, ids["duplicate_ids.xml"])
    assert sorted(dupes) == ["dup", "other"] and dupes["dup"]["title"] == "Second version"

    dates = {k: v["published_at"] for k, v in listings_of(engine, ids["odd_dates.xml"]).items()}
    assert dates == {"d-bad": None, "d-future": datetime(2099, 1, 1, tzinfo=UTC), "d-none": None,
                     "d-offset": datetime(2026, 11, 22, 7, 30, tzinfo=UTC)}

    injected = listings_of(engine, ids["injection.xml"])
    # Markup is read as markup and plain text as text, by the type feedparser gives each
    # field: these RSS titles are plain text by its test (a <script> is no HTML it knows),
    # and are stored as they read; every message escapes them (tests/test_notifier.py).
    assert (injected["i-script"]["title"], injected["i-script"]["summary"]) == (
        "<script>alert('x')</script>Senior <b>Python</b> developer", "Real text.")
    assert (injected["i-escaped"]["title"], injected["i-escaped"]["summary"]) == (
        "<script>alert(1)</script>Escaped markup &amp; entities", "click bold")
    assert injected["i-jsurl"]["url"] == "", "a javascript: link is never kept"
    for listing in injected.values():
        assert "<" not in listing["summary"], "HTML's tags are dropped"
        assert listing["url"] == "" or listing["url"].startswith("https://"), "a web link, or none"

    malformed = listings_of(engine, ids["malformed.xml"])
    assert sorted(x["title"] for x in malformed.values()) == ["Second", "Unclosed tag"]
    [controls] = listings_of(engine, ids["control_characters.xml"]).values()
    assert (controls["title"], controls["summary"]) == ("Tab here, bell and form feed", "line break"), controls

    assert listings_of(engine, ids["empty.xml"]) == {}
    [atom] = listings_of(engine, ids["atom_xml_base.xml"]).values()
    assert (atom["url"], atom["title"], atom["summary"]) == (
        "https://example.com/blog/posts/1", "Relative link", "XHTML summary")

    [huge] = listings_of(engine, ids["huge_entry.xml"]).values()
    assert len(huge["title"]) <= TITLE_CHARS and len(huge["summary"]) == SUMMARY_CHARS
    assert huge["summary"].endswith("…")
    assert len(listings_of(engine, ids["thousands.xml"])) == 5000

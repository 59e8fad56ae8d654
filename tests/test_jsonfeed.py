"""JSON Feed 1.0 and 1.1 through the rss adapter, told from RSS and Atom by the document
itself (issue 11: once, a JSON Feed was a parse_error, "not a feed")."""

from __future__ import annotations

import json

import pytest

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.fetching.rss import parse_feed
from pipeline.storage import schema
from tests.helpers import add_source
from tests.test_collector import collector, rows, server  # noqa: F401 (fixture)
from tests.test_processor import processor

FEED_URL = "http://127.0.0.1/feed.json"

V11 = {
    "version": "https://jsonfeed.org/version/1.1",
    "title": "Jobs",
    "items": [
        {"id": "1", "url": "/jobs/1", "title": "Python developer", "content_html": "<p>Remote <b>role</b></p>",
         "date_published": "2026-11-20T08:00:00+01:00", "authors": [{"name": "Ann"}], "tags": ["jobs", 7]},
        {"id": 2, "external_url": "https://example.com/elsewhere", "content_text": "Plain text only",
         "date_modified": "2026-11-21T10:00:00Z"},
        {"url": "https://example.com/no-id", "summary": "An item with no id"},
        "not an item",
    ],
}
V10 = {
    "version": "https://jsonfeed.org/version/1",
    "items": [{"id": "a", "url": "https://example.com/a", "title": "A", "author": {"name": "Bob"},
               "content_text": "text"}],
}


def test_json_feed_1_1_items_become_the_same_raw_fields_as_rss():
    items = parse_feed(json.dumps(V11).encode(), FEED_URL, "application/feed+json")
    assert [i.source_item_id for i in items] == ["1", "2", "https://example.com/no-id"]
    first, second, third = (i.raw for i in items)
    assert first == {
        "title": "Python developer", "url": "http://127.0.0.1/jobs/1", "summary": "<p>Remote <b>role</b></p>",
        "published_at": "2026-11-20T07:00:00+00:00", "author": "Ann", "categories": ["jobs"],
    }
    assert (second["url"], second["summary"], second["published_at"]) == (
        "https://example.com/elsewhere", "Plain text only", "2026-11-21T10:00:00+00:00")
    assert third["summary"] == "An item with no id"


@pytest.mark.parametrize("content_type", [None, "application/json", "text/plain; charset=iso-8859-1"])
def test_json_feed_1_0_is_read_whatever_the_content_type(content_type):
    body = b"\xef\xbb\xbf\n" + json.dumps(V10).encode()
    [item] = parse_feed(body, FEED_URL, content_type)
    assert (item.source_item_id, item.raw["author"], item.raw["title"]) == ("a", "Bob", "A")


@pytest.mark.parametrize(("body", "message"), [
    (b'{"items": []}', "without a jsonfeed.org version"),
    (b'{"version": "https://jsonfeed.org/version/1.1", "items": {}}', "without an items list"),
    (b'{"version": "https://jsonfeed.org/version/1.1", "items": [', "malformed JSON"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
])
def test_json_that_is_not_a_feed_is_a_parse_error(body, message):
    with pytest.raises(FetchError) as caught:
        parse_feed(body, FEED_URL)
    assert caught.value.reason is FailureReason.PARSE_ERROR and message in caught.value.message


def test_a_json_feed_source_is_collected_and_processed(engine, server):  # noqa: F811
    server.routes["/feed.json"] = lambda h: h.reply(200, json.dumps(V11).encode(),
                                                   {"Content-Type": "application/feed+json"})
    with engine.begin() as conn:
        add_source(conn, server.url("/feed.json"))
    stats = collector(engine).run()
    assert (stats.succeeded, stats.items_new) == (1, 3)
    assert processor(engine).run().inserted == 3
    listings = {r["source_item_id"]: r for r in rows(engine, schema.listings)}
    assert listings["1"]["summary"] == "Remote role" and listings["1"]["url"] == server.url("/jobs/1")

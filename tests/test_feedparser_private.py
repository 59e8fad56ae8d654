"""feedparser's private functions, as pipeline/fetching/feedparser_private.py wraps them,
still do what ``feedparser.parse`` does with the same text: a feedparser that renames
or changes one fails here, by name, before the fast path quietly drifts from it."""

from __future__ import annotations

import feedparser
import pytest

from pipeline.fetching import feedparser_private

DATES = [
    "Tue, 10 Jun 2003 04:00:00 GMT",  # RFC 822
    "Tue, 10 Jun 2003 04:00:00 +0200",
    "2003-06-10T04:00:00Z",  # W3C-DTF / ISO 8601
    "2003-06-10T04:00:00.25-05:30",
    "2003-06-10",
    "Sun Jan  4 16:29:06 PST 2004",  # asctime
    "2004-05-25 \uc624\ud6c4 11:23:17",  # Korean (Nate)
    "not a date",
]


def rss(item: str) -> bytes:
    return ('<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>t</title>'
            f'<link>http://example.com/</link><item>{item}</item></channel></rss>').encode()


@pytest.mark.parametrize("value", DATES)
def test_parse_date_reads_a_date_as_feedparser_does(value):
    [entry] = feedparser.parse(rss(f"<title>x</title><pubDate>{value}</pubDate>")).entries
    assert feedparser_private.parse_date(value) == entry.get("published_parsed")
    if value != "not a date":
        assert feedparser_private.parse_date(value) is not None, "every format above is one feedparser reads"


def test_repair_cp1252_turns_c1_controls_into_what_windows_1252_meant():
    text = "\x93quoted\x94 \x80 10\x96 20\x85 more"
    [entry] = feedparser.parse(rss(f"<title>{text}</title>")).entries
    assert feedparser_private.repair_cp1252(text) == entry.title == "\u201cquoted\u201d \u20ac 10\u2013 20\u2026 more"


@pytest.mark.parametrize("base, link", [
    ("http://example.com/feed/", "item/1"),
    ("http://example.com/feed/", "/item/2?a=b#c"),
    ("http://example.com/feed/", "http:/example.org/one-slash"),  # mended
    ("http://example.com/feed/", "https://other.example/abs"),
    ("", "relative/stays"),
])
def test_urljoin_resolves_a_link_as_feedparser_does(base, link):
    body = ('<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom"'
            f' xml:base="{base}"><title>t</title><entry><title>x</title><id>urn:x</id>'
            f'<link href="{link}"/></entry></feed>').encode()
    [entry] = feedparser.parse(body).entries
    assert feedparser_private.urljoin(base, link) == entry.link

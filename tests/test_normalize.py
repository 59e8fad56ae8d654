"""The normaliser: raw items into listing values, a pure function."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.core.errors import NormaliseError
from pipeline.listings.normalize import SUMMARY_CHARS, html_to_text, normalise

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("html", "text"),
    [
        ("plain text, no markup", "plain text, no markup"),
        ("<p>Hello <b>world</b> &amp; friends</p>", "Hello world & friends"),
        ("<p>a</p><p>b</p>\n\n<br>c", "a b c"),
        ("<script>alert(1)</script>shown<style>p{}</style>", "shown"),
        ("<SCRIPT type=x>bad()</SCRIPT>ok", "ok"),
        ("<!-- hidden <b>x</b> -->shown", "shown"),
        ("<![CDATA[<b>bold</b> & co]]>", "bold & co"),
        ('<a title="x > y" href=\'a>b\'>link</a> tail', "link tail"),
        ("I <3 python and a < b", "I <3 python and a < b"),
        ("caf&eacute; &#8212; &#x263A;", "café — ☺"),
        # What the markup escaped is text, as the page shows it.
        ("&lt;script&gt;alert(1)&lt;/script&gt; hi", "<script>alert(1)</script> hi"),
        ("The &lt;entry&gt; element", "The <entry> element"),
        ("&#60;img src=x onerror=alert(1)&#62; hi", "<img src=x onerror=alert(1)> hi"),
        ("unterminated <b", "unterminated"),
        ("<script>never closed", ""),
        # A "<" that opens no tag is text, whatever follows once a tag is gone.
        ("<<?>?", "<?"),
        ("a <<b>i>x</i> b", "a <i>x b"),
        ("<</b>/b> c", "</b> c"),
        ("&lt;<b>script>", "<script>"),
    ],
)
def test_html_to_text(html, text):
    assert html_to_text(html) == text


def test_a_complete_item():
    raw = {
        "title": "<b>Senior</b> Python developer", "url": "https://jobs.example/1",
        "summary": "<p>Remote &amp; flexible</p>", "published_at": "2026-11-20T10:00:00+02:00",
        "author": "  Ann  ", "categories": ["Jobs", "jobs", " Python ", 7, ""],
    }
    listing = normalise(raw, source_category="remote")
    assert listing.title == "Senior Python developer" and listing.summary == "Remote & flexible"
    assert listing.published_at == datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    assert listing.author == "Ann" and listing.url == "https://jobs.example/1"
    assert listing.categories == ["Jobs", "Python", "remote"], "deduplicated, case-insensitively"


def test_the_content_hash_follows_the_content():
    a = normalise({"title": "A", "url": "http://x/1"})
    assert a.content_hash == normalise({"title": "<i>A</i>", "url": "http://x/1"}).content_hash
    assert a.content_hash != normalise({"title": "B", "url": "http://x/1"}).content_hash
    # Pinned: a listing's hash is what it was before prices were kept (revision 0016), or
    # every stored listing would count as changed when next processed.
    assert a.content_hash == "e4b64311b8891545dadcf9b0ed8bf1e9d6a76e251e39128e982b9030c6ad1212"


def test_a_price_is_plain_text_bounded_and_part_of_the_content():
    raw = {"title": "Road bike", "url": "http://x/1", "price": "<b>&euro;&nbsp;1,299</b>\n "}
    priced = normalise(raw)
    assert priced.price == "€ 1,299"
    assert normalise({**raw, "price": "  "}).price is None
    assert normalise({**raw, "price": "9" * 500}).price == "9" * 99 + "…"
    assert priced.content_hash != normalise({**raw, "price": "€1,199"}).content_hash
    assert priced.content_hash != normalise({"title": "Road bike", "url": "http://x/1"}).content_hash
    with pytest.raises(NormaliseError, match="price must be text"):
        normalise({**raw, "price": {"amount": 1}})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-20T10:00:00Z", datetime(2026, 11, 20, 10, tzinfo=UTC)),
        ("2026-11-20T10:00:00", datetime(2026, 11, 20, 10, tzinfo=UTC)),  # naive: taken as UTC
        # Every date a database holds is kept, however far off: feedparser reads them all.
        ("2150-01-01T00:00:00+00:00", datetime(2150, 1, 1, tzinfo=UTC)),
        ("9999-12-31T23:59:59+00:00", datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("1000-01-01T00:00:00+00:00", datetime(1000, 1, 1, tzinfo=UTC)),
        ("0999-12-31T23:59:59+00:00", None),  # before MariaDB's DATETIME
        ("9999-12-31T23:00:00-05:00", None),  # past year 9999 in UTC
        ("yesterday", None),
        (None, None),
        (12345, None),
    ],
)
def test_publication_times_become_utc_or_unknown(value, expected):
    assert normalise({"url": "http://x/1", "published_at": value}).published_at == expected


def test_an_item_without_a_link_of_its_own_has_none():
    """The raw row's URL (the feed, for a feed item without a link) identifies the item
    but is never its link: a reader who clicks would land on the feed's XML."""
    for raw in ({"title": "t"}, {"title": "t", "url": ""}, {"title": "t", "url": "javascript:alert(1)"},
                {"title": "t", "url": "urn:uuid:1"}):
        listing = normalise(raw, fallback_url="http://x/raw")
        assert (listing.url, listing.canonical_url, listing.identity_url) == ("", None, "http://x/raw")
    linked = normalise({"title": "t", "url": "http://x/1"}, fallback_url="http://x/raw")
    assert (linked.url, linked.identity_url) == ("http://x/1", "http://x/1")
    assert normalise({}, fallback_url="http://x/raw").title == "", "no title and no link: no stand-in"
    with pytest.raises(NormaliseError, match="no usable url"):
        normalise({"title": "t", "url": "not a url"})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "raw_json is not valid JSON"),
        ([1, 2], "raw_json must be a JSON object, not list"),
        ({"url": "http://x/1", "title": {"nested": 1}}, "title must be text, not dict"),
    ],
)
def test_unusable_raw_json_says_why(raw, message):
    with pytest.raises(NormaliseError, match=message):
        normalise(raw)


def test_fields_are_bounded_and_a_title_defaults_to_the_url():
    listing = normalise({"url": "http://x/1", "summary": "word " * 5000})
    assert len(listing.summary) == SUMMARY_CHARS and listing.summary.endswith("…")
    assert listing.title == "http://x/1"


def test_json_text_is_accepted():
    assert normalise('{"title": "t", "url": "http://x/1"}').title == "t"


@pytest.mark.parametrize(("link", "stored"), [
    # Markup in the host: not a host at all, so no link (the raw row's URL only identifies it).
    ('http://a"><svg/onload=alert(1)>', ""),
    # Markup in the path or query: kept as what it means, percent-encoded.
    ('http://example.com/a"><svg onload=alert(1)>', "http://example.com/a%22%3E%3Csvg%20onload=alert(1)%3E"),
    ("http://example.com/?q=<b>'x'</b>", "http://example.com/?q=%3Cb%3E%27x%27%3C/b%3E"),
    ("http://user:pw@example.com/x", "http://example.com/x"),
    ("http://example.com/caf\u00e9", "http://example.com/caf%C3%A9"),
    ("http://127.0.0.1:99999/x", ""),
])
def test_a_stored_link_is_a_url_never_markup(link, stored):
    listing = normalise({"title": "t", "url": link}, fallback_url="http://127.0.0.1/feed")
    assert listing.url == stored

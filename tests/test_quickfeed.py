"""The fast path of feed parsing (pipeline/fetching/quickfeed.py) gives exactly the items
feedparser gives, or steps aside: on the bad-input corpus, on plain and unusual feeds,
and on feeds hypothesis writes with the texts that make parsers disagree (entities,
markup, mis-decoded UTF-8, windows-1252 code points, e-mail addresses in authors,
relative and odd links, duplicate categories, dates good and bad)."""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import pytest
from feedparser.encodings import convert_to_utf8
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.core.errors import FetchError
from pipeline.fetching import quickfeed, rss
from tests.test_corpus import generated

CORPUS = Path(__file__).resolve().parent / "corpus"
FEED_URL = "http://127.0.0.1/feed"
ATOM = "http://www.w3.org/2005/Atom"


def outcome(body: bytes, content_type: str | None, *, fast: bool, monkeypatch: pytest.MonkeyPatch):
    """What read_feed makes of ``body``: the items, the site and the refresh hint, or the
    failure, by either path."""
    with monkeypatch.context() as patch:
        if not fast:
            patch.setattr(quickfeed, "parse", lambda document, detected: None)
        try:
            parsed = rss.read_feed(body, FEED_URL, content_type)
            return [(i.source_item_id, i.url, i.raw) for i in parsed.items], parsed.site_url, parsed.refresh_minutes
        except FetchError as error:
            return (error.reason, str(error))


def fast_entries(body: bytes, content_type: str = "application/xml"):
    detected: dict = {}
    return quickfeed.entries(convert_to_utf8({"content-type": content_type}, body, detected), detected)


def assert_alike(body: bytes, content_type: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert outcome(body, content_type, fast=True, monkeypatch=monkeypatch) == outcome(
        body, content_type, fast=False, monkeypatch=monkeypatch
    )


DOCUMENTS = {p.name: p.read_bytes() for p in sorted(CORPUS.iterdir())} | generated()


@pytest.mark.parametrize("content_type", ["application/xml", "text/plain; charset=iso-8859-1", None])
@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_the_bad_input_corpus_reads_alike(name, content_type, monkeypatch):
    assert_alike(DOCUMENTS[name], content_type, monkeypatch)


WORDPRESS = b"""<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:content="http://purl.org/rss/1.0/modules/content/"
  xmlns:wfw="http://wellformedweb.org/CommentAPI/" xmlns:dc="http://purl.org/dc/elements/1.1/"
  xmlns:atom="http://www.w3.org/2005/Atom" xmlns:slash="http://purl.org/rss/1.0/modules/slash/">
<channel><title>A blog</title><atom:link href="https://blog.example/feed/" rel="self" type="application/rss+xml" />
<link>https://blog.example</link><description>Words</description><language>en-US</language>
<item><title>Hiring: a Python engineer &#8211; remote</title>
  <link>https://blog.example/2026/11/hiring/?utm_source=rss&amp;utm_medium=rss</link>
  <comments>https://blog.example/2026/11/hiring/#respond</comments>
  <dc:creator><![CDATA[Jane Doe]]></dc:creator><pubDate>Mon, 23 Nov 2026 09:00:00 +0000</pubDate>
  <category><![CDATA[Jobs]]></category><category><![CDATA[Python]]></category><category>Jobs</category>
  <guid isPermaLink="false">https://blog.example/?p=42</guid>
  <description><![CDATA[<p>We are hiring&#8230;</p>]]></description>
  <content:encoded><![CDATA[<p>We are hiring a <b>Python</b> engineer.</p>]]></content:encoded>
  <wfw:commentRss>https://blog.example/2026/11/hiring/feed/</wfw:commentRss><slash:comments>0</slash:comments>
  <enclosure url="https://blog.example/a.mp3" length="1" type="audio/mpeg" />
</item>
<item><title>Caf\xc3\xa9 &amp; \xe2\x80\x9cquotes\xe2\x80\x9d</title><link>/relative/7</link><guid>7</guid>
  <author>jane@example.org (Jane Doe)</author><source url="https://other.example/rss">Other</source></item>
</channel></rss>"""

ATOM_FEED = b"""<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom" xml:lang="en"><title>Atom</title><id>urn:feed</id>
<updated>2026-11-23T10:00:00Z</updated>
<entry><title type="html">Ships &lt;b&gt;today&lt;/b&gt;</title><id>tag:example.org,2026:1</id>
  <link rel="alternate" type="text/html" href="https://example.org/1"/>
  <link rel="replies" href="https://example.org/1#comments"/><link rel="enclosure" href="https://example.org/1.mp3"/>
  <published>2026-11-23T09:00:00+01:00</published><updated>2026-11-23T10:00:00Z</updated>
  <author><name>Ann</name><email>ann@example.org</email><uri>https://ann.example</uri></author>
  <category term="news" scheme="https://example.org/tags" label="News"/><category term="news"/>
  <summary>Short</summary><content type="html">&lt;p&gt;Long&lt;/p&gt;</content></entry>
<entry><id>tag:example.org,2026:2</id><title>Only an id</title><content type="text">Body first</content>
  <summary>Summary after content</summary><author><email>only@example.org</email></author></entry>
</feed>"""


RSS_1 = b"""<?xml version="1.0" encoding="utf-8"?>
<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://purl.org/rss/1.0/"
  xmlns:dc="http://purl.org/dc/elements/1.1/">
<channel rdf:about="https://news.example/"><title>News</title><link>https://news.example/</link>
  <items><rdf:Seq><rdf:li rdf:resource="https://news.example/1"/></rdf:Seq></items></channel>
<item rdf:about="https://news.example/1"><title>One</title><link>https://news.example/1</link>
  <dc:date>2026-11-23T09:00:00+09:00</dc:date><dc:creator>Kei</dc:creator><dc:subject>tech</dc:subject></item>
</rdf:RDF>"""

# WordPress's Atom names a base on the root: relative links resolve against it.
ATOM_WITH_BASE = ATOM_FEED.replace(b'xml:lang="en"', b'xml:lang="en" xml:base="https://example.org/blog/"').replace(
    b'href="https://example.org/1"', b'href="posts/1"'
)


@pytest.mark.parametrize(
    "body", [WORDPRESS, ATOM_FEED, RSS_1, ATOM_WITH_BASE], ids=["wordpress-rss", "atom", "rss-1.0", "atom-xml-base"]
)
def test_plain_feeds_take_the_fast_path_and_read_alike(body, monkeypatch):
    assert fast_entries(body) is not None
    assert_alike(body, "application/xml", monkeypatch)
    assert_alike(body, "text/plain; charset=iso-8859-1", monkeypatch)


def test_the_fast_path_reads_what_feedparser_reads():
    """Spelled out once, so that a reader sees the rules: the permalink-less guid is the
    identity, the first summary stays, duplicate categories are one, the author's name
    comes out of the e-mail form, the relative link is the feed's."""
    items = rss.parse_feed(WORDPRESS, FEED_URL, "application/rss+xml")
    assert [i.source_item_id for i in items] == ["https://blog.example/?p=42", "7"]
    first, second = (i.raw for i in items)
    assert first["title"] == "Hiring: a Python engineer \u2013 remote"
    assert first["url"] == "https://blog.example/2026/11/hiring/?utm_source=rss&utm_medium=rss"
    assert first["summary"] == "<p>We are hiring&#8230;</p>"  # CDATA: as written
    assert first["categories"] == ["Jobs", "Python"]
    assert first["author"] == "Jane Doe" and second["author"] == "Jane Doe"
    assert first["published_at"] == "2026-11-23T09:00:00+00:00"
    assert second["url"] == "http://127.0.0.1/relative/7"
    assert second["title"] == "Caf\u00e9 &amp; \u201cquotes\u201d"  # plain text, as raw items hold it


@pytest.mark.parametrize(
    "fragment",
    [
        "<media:title xmlns:media='http://search.yahoo.com/mrss/'>Sets the title</media:title>",
        "<media:group xmlns:media='http://search.yahoo.com/mrss/'><media:title>Nested</media:title></media:group>",
        "<title>Two</title>",
        "<description>A <b>bold</b> word</description>",
        "<published:parsed xmlns:published='urn:other'>Collides with a field</published:parsed>",
        "<title xml:base='http://elsewhere/'>Base below the root</title>",
        "<author>a@example.org</author><dc:creator xmlns:dc='http://purl.org/dc/elements/1.1/'>B</dc:creator>",
        "<itunes:summary xmlns:itunes='http://www.itunes.com/dtds/podcast-1.0.dtd'>Podcast</itunes:summary>",
        "<g:price xmlns:g='http://base.google.com/ns/1.0'>1200.00 EUR</g:price>",  # the adapter stores it
    ],
)
def test_what_the_fast_path_does_not_know_goes_to_feedparser(fragment, monkeypatch):
    body = (
        "<?xml version='1.0'?><rss version='2.0'><channel><title>F</title><item>"
        f"<title>One</title><guid>g1</guid>{fragment}</item></channel></rss>"
    ).encode()
    assert fast_entries(body) is None
    assert_alike(body, "application/xml", monkeypatch)


@pytest.mark.parametrize(
    "body",
    [
        b"<?xml version='1.0'?><!DOCTYPE rss><rss version='2.0'><channel><item><guid>1</guid></item></channel></rss>",
        b"<?xml version='1.0'?><rss version='2.0'><channel><item><guid>1</guid></item></channel>",  # malformed
        b"<?xml version='1.0' encoding='iso-8859-1'?><rss version='2.0'><channel><item><guid>\xe9</guid></item></channel></rss>",
        b"<feed xmlns='http://purl.org/atom/ns#'><entry><id>1</id></entry></feed>",
        b"<rss version='2.0'><channel><item><title>No id, no link</title></item></channel></rss>",
    ],
    ids=["doctype", "malformed", "latin-1", "atom-0.3", "no-identity"],
)
def test_documents_outside_the_subset_go_to_feedparser(body, monkeypatch):
    if b"encoding='iso-8859-1'" not in body:  # Latin-1 is read: converted, it is plain
        assert fast_entries(body) is None
    assert_alike(body, "application/xml", monkeypatch)


# Texts that make parsers disagree: markup and entities (escaped), white space, UTF-8
# read as Latin-1 ("CafÃ©"), windows-1252 code points, e-mail forms, URL-ish strings.
_PIECES = [
    "a", "Zoë", " ", "\n", "\t", "&", "<b>x</b>", "&amp;", "&lt;", "&#8230;", "\u2019", "\xa0", "Ã©", "\x85",
    "\x93quoted\x94", "jane@example.org", "(Jane Doe)", "<>", "http://", "https://example.org/a?b=1&c=2",
    "/rel/1", "javascript:alert(1)", "tag:x,2026:1", "Mon, 23 Nov 2026 09:00:00 GMT", "2026-11-23T09:00:00Z",
    "not a date", "()", "\u00e9t\u00e9", "%20", "#frag", "   padded   ",
]
text = st.lists(st.sampled_from(_PIECES), max_size=5).map("".join)


def _body(value: str, cdata: bool) -> str:
    if cdata and "]]>" not in value:
        return f"<![CDATA[{value}]]>"
    return escape(value)


@st.composite
def rss_item(draw) -> str:
    names = st.sampled_from([
        "title", "link", "description", "guid", "guid-false", "pubDate", "author", "dc:creator",
        "category", "category-domain", "content:encoded", "comments", "dc:date", "dc:subject",
        "source", "x:unknown", "itunes:explicit", "enclosure",
    ])
    parts = []
    # Mostly one of each (a second title or author is outside the fast path), always an
    # identity (without one the entry's hash needs its language: feedparser's), now and
    # then an element the fast path leaves to feedparser.
    chosen = draw(st.lists(names, max_size=9, unique=True)) + draw(st.lists(st.just("category"), max_size=2))
    chosen.insert(
        draw(st.integers(0, len(chosen))), draw(st.sampled_from(["guid", "guid-false", "guid-foreign", "link"]))
    )
    if draw(st.integers(0, 9)) == 0:
        chosen.append(draw(st.sampled_from(["media:title", "title", "author", "description"])))
    for name in chosen:
        value = _body(draw(text), draw(st.booleans()))
        if name == "guid-false":
            parts.append(f'<guid isPermaLink="false">{value}</guid>')
        elif name == "guid-foreign":  # an attribute in a namespace feedparser knows, or not
            prefix = draw(st.sampled_from(["x", "x", "x", "dc"]))
            parts.append(f'<guid {prefix}:isPermaLink="false">{value}</guid>')
        elif name == "category-domain":
            parts.append(f"<category domain={quoteattr(draw(text))}>{value}</category>")
        elif name == "enclosure":
            parts.append(f"<enclosure url={quoteattr(draw(text))} type='audio/mpeg'/>")
        else:
            parts.append(f"<{name}>{value}</{name}>")
    return "<item>" + "".join(parts) + "</item>"


@st.composite
def atom_entry(draw) -> str:
    names = st.sampled_from([
        "title", "title-html", "link", "link-self", "link-foreign", "link-plain", "summary", "content",
        "content-html", "published", "updated", "author", "author-email", "category", "rights",
    ])
    parts = []
    chosen = draw(st.lists(names, max_size=9, unique_by=lambda n: n.split("-")[0]))
    chosen += draw(st.lists(st.just("category"), max_size=2)) + draw(st.lists(st.just("link"), max_size=2))
    chosen.insert(draw(st.integers(0, len(chosen))), "id")
    for name in chosen:
        value = _body(draw(text), draw(st.booleans()))
        if name == "title-html":
            parts.append(f"<title type='html'>{value}</title>")
        elif name == "link":
            parts.append(f"<link rel='alternate' type='text/html' href={quoteattr(draw(text))}/>")
        elif name == "link-self":
            parts.append(f"<link rel='self' href={quoteattr(draw(text))}/>")
        elif name == "link-plain":
            parts.append(f"<link href={quoteattr(draw(text))}/>")
        elif name == "link-foreign":  # rel and type in other namespaces, a thr:count
            parts.append(f"<link x:rel='enclosure' dc:type='text/plain' thr:count='2' href={quoteattr(draw(text))}/>")
        elif name == "content-html":
            parts.append(f"<content type='html'>{value}</content>")
        elif name == "author":
            parts.append(f"<author><name>{value}</name><email>{escape(draw(text))}</email></author>")
        elif name == "author-email":
            parts.append(f"<author><email>{value}</email></author>")
        elif name == "category":
            parts.append(f"<category term={quoteattr(draw(text))} label={quoteattr(draw(text))}/>")
        else:
            parts.append(f"<{name}>{value}</{name}>")
    return "<entry>" + "".join(parts) + "</entry>"


NAMESPACES = (
    "xmlns:dc='http://purl.org/dc/elements/1.1/' xmlns:content='http://purl.org/rss/1.0/modules/content/' "
    "xmlns:x='urn:example:unknown' xmlns:media='http://search.yahoo.com/mrss/' "
    "xmlns:itunes='http://www.itunes.com/dtds/podcast-1.0.dtd' xmlns:thr='http://purl.org/syndication/thread/1.0'"
)


# The root's xml:base, if any (links resolve against it; one below the root sends the
# document to feedparser).
bases = st.sampled_from([
    "", " xml:base='http://example.org/base/'", " xml:base='https://example.org/a/b?q=1'",
    " xml:base='/relative/'", " xml:base=''", " xml:base='javascript:x'", " xml:base='http://example.org'",
])


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.tuples(bases, st.lists(rss_item(), min_size=1, max_size=4)).map(
        lambda doc: f"<?xml version='1.0' encoding='utf-8'?><rss version='2.0' {NAMESPACES}{doc[0]}><channel>"
        f"<title>T</title>{''.join(doc[1])}</channel></rss>"
    ),
    st.tuples(st.lists(st.tuples(rss_item(), st.sampled_from(["", " rdf:about='http://example.org/1'", " rdf:about=''"])),
                       min_size=1, max_size=4)).map(
        lambda doc: "<?xml version='1.0' encoding='utf-8'?><rdf:RDF xmlns:rdf='http://www.w3.org/1999/02/22-rdf-syntax-ns#'"
        f" xmlns='http://purl.org/rss/1.0/' {NAMESPACES}><channel><title>T</title></channel>"
        + "".join(item.replace("<item>", f"<item{about}>", 1) for item, about in doc[0]) + "</rdf:RDF>"
    ),
    st.tuples(bases, st.lists(atom_entry(), min_size=1, max_size=4)).map(
        lambda doc: f"<?xml version='1.0' encoding='utf-8'?><feed xmlns='{ATOM}' {NAMESPACES}{doc[0]}><title>T</title>"
        f"{''.join(doc[1])}</feed>"
    ),
))
def test_feeds_written_by_hypothesis_read_alike(document):
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert_alike(document.encode("utf-8"), "application/xml", monkeypatch)

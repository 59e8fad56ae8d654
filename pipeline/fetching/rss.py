"""The ``rss`` adapter: RSS 0.9x/1.0/2.0 and Atom through feedparser, and JSON Feed
(pipeline/fetching/jsonfeed.py), told apart by the document itself.

Entry identity: guid/id, else link (with the enclosure, or title and date, where other
entries of the document share the link), else a hash of the entry's content. Malformed XML is
read again leniently (feedparser's own fallback), and is a ``parse_error`` only when
nothing readable is found; a wrong declared encoding is tolerated; entities are never
expanded: a document that declares any is refused before it is parsed (``parse_error``).
"""

from __future__ import annotations

import calendar
import codecs
import hashlib
import logging
import math
import re
import xml.sax
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import feedparser
from feedparser.encodings import convert_to_utf8

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.urls import joined_link
from pipeline.fetching import charset, quickfeed
from pipeline.fetching.base import Item, Outcome, Parsed, challenge_error, fetch_and_parse, markup
from pipeline.fetching.jsonfeed import looks_like_json, parse_json_feed
from pipeline.net.http import Fetcher

log = logging.getLogger("pipeline.fetching.rss")

# feedparser's notes that do not make a feed unusable: a declared encoding that was
# wrong (it re-decodes), or a Content-Type that is not XML.
_TOLERATED = (feedparser.CharacterEncodingOverride, feedparser.NonXMLContentType)

# Raw means raw: summaries are stored as the feed sent them, and the processor turns
# them into plain text. Sanitising and rewriting their links here would cost a fifth
# of the parse (bench/RESULTS.md) for HTML that is never shown as HTML.
FEEDPARSER_OPTIONS: dict[str, Any] = {"resolve_relative_uris": False, "sanitize_html": False}


def _iso(parsed: Any) -> str | None:
    """feedparser's UTC struct_time as ISO 8601, or None. (Not always a struct_time: an
    element feedparser does not know is kept under its own name, and one in a namespace
    bound to the prefix ``published`` is called ``published_parsed``.)"""
    if not parsed:
        return None
    try:
        return datetime.fromtimestamp(calendar.timegm(parsed), UTC).isoformat()
    except (OverflowError, ValueError, OSError, TypeError):
        return None


_ENTITY_DECLARATION = re.compile(rb"<!ENTITY", re.IGNORECASE)


def _without_leading_space(body: bytes) -> bytes:
    """``body`` without white space before its first tag (after a UTF-8 byte-order mark,
    which stays): an XML parser refuses a declaration that does not open the document,
    and servers that print a blank line first are common."""
    bom = codecs.BOM_UTF8 if body.startswith(codecs.BOM_UTF8) else b""
    rest = body[len(bom):]
    stripped = rest.lstrip(b" \t\r\n")
    return bom + stripped if stripped[:1] == b"<" and len(stripped) != len(rest) else body


def parse_feed(
    body: bytes,
    url: str,
    content_type: str | None = None,
    *,
    item: Callable[[Mapping[str, Any], str], Item] | None = None,
    content_location: str | None = None,
) -> list[Item]:
    """Items of a feed document (``read_feed``)."""
    return read_feed(body, url, content_type, item=item, content_location=content_location).items


def read_feed(
    body: bytes,
    url: str,
    content_type: str | None = None,
    *,
    item: Callable[[Mapping[str, Any], str], Item] | None = None,
    content_location: str | None = None,
) -> Parsed:
    """Items of a feed document (RSS, Atom, or JSON Feed), and its refresh hints;
    FetchError(parse_error) when it is not a usable feed.

    ``item`` turns one feedparser entry into an Item (default: a generic feed entry).
    Relative links are resolved against ``xml:base``, else ``content_location`` (the
    response's Content-Location), else ``url``.
    """
    base = content_location or url
    if looks_like_json(body):  # JSON Feed: the same adapter, whatever the Content-Type says
        return parse_json_feed(body, base)
    body = _without_leading_space(body)
    body, content_type = charset.as_read(body, content_type)  # its real encoding, if mislabelled
    headers = {"content-type": content_type} if content_type else {}
    if content_location:
        # feedparser's base for relative links. (Only when the server named one: a link
        # written relative keeps its identity as written, pipeline/fetching/rss.py ``_item``.)
        headers["content-location"] = content_location
    # feedparser's own encoding detection (byte-order marks, UTF-16/32 without one,
    # EBCDIC, the XML declaration, the HTTP charset): the text its XML parser reads.
    detected: dict[str, Any] = {}
    document = convert_to_utf8(dict(headers), body, detected)
    # feedparser's XML parser expands entities declared in an internal DTD subset (the
    # "billion laughs"); no real feed needs one, so such a document is refused unread,
    # decided on that same text so that no encoding hides a declaration.
    if _ENTITY_DECLARATION.search(document):
        raise FetchError(
            FailureReason.PARSE_ERROR, "the document declares XML entities; they are never expanded"
        )
    found = None
    if item is None and not content_location and not any(FEEDPARSER_OPTIONS.values()):
        # Plain RSS 2.0, RSS 1.0 and Atom 1.0 read at about a fifth of the CPU, with
        # feedparser's results (pipeline/fetching/quickfeed.py); None for anything else.
        found = quickfeed.parse(document, detected)
        if found is not None and _shared_links(found[0]):
            found = None  # items told apart by their enclosures, which only feedparser reads
    entries, feed = found if found is not None else _feedparser_entries(body, headers, url)
    site = _absolute(str(feed.get("link") or ""), base) or None
    if item is not None:
        return Parsed([item(entry, base) for entry in entries], refresh_minutes(feed), site)
    shared = _shared_links(entries)
    return Parsed([_item(entry, base, shared) for entry in entries], refresh_minutes(feed), site)


# sy:updatePeriod's periods in minutes (the syndication module: the default is daily).
_PERIODS = {"hourly": 60, "daily": 1440, "weekly": 10080, "monthly": 43200, "yearly": 525600}


def refresh_minutes(feed: Mapping[str, Any]) -> float | None:
    """How soon the feed says it is worth reading again, in minutes: RSS ``<ttl>``, or
    ``sy:updatePeriod`` / ``sy:updateFrequency`` (times per period, default 1); the longer
    when both are given; None when neither is, or neither is a usable number."""
    hints = []
    ttl = _positive(feed.get("ttl"))
    if ttl is not None:
        hints.append(ttl)
    period = str(feed.get("sy_updateperiod") or "").strip().lower()
    if period in _PERIODS:
        frequency = _positive(feed.get("sy_updatefrequency") or "1")
        if frequency is not None:
            hints.append(_PERIODS[period] / frequency)
    return max(hints) if hints else None


def _positive(value: Any) -> float | None:
    try:
        number = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if 0 < number < math.inf else None


def _feedparser_entries(body: bytes, headers: dict[str, str], url: str) -> tuple[list[Any], Mapping[str, Any]]:
    """feedparser's entries and feed-level fields for ``body``; FetchError(parse_error)
    when it is not a usable feed."""
    parsed = feedparser.parse(body, response_headers=headers, **FEEDPARSER_OPTIONS)
    problem = parsed.get("bozo_exception")
    if problem is not None and not isinstance(problem, _TOLERATED):
        # A document its XML parser refuses (a mismatched tag, an unbound prefix, a stray
        # "&", an HTML entity such as &eacute; with no DTD) feedparser reads again with
        # its lenient parser, as every forgiving reader does: what that finds is kept. The
        # entity check has run on the same text, so no entity is ever expanded.
        if parsed.entries:
            log.info("read %s leniently: %s", url, problem)
        elif isinstance(problem, xml.sax.SAXException):
            raise challenge_error(body) or FetchError(FailureReason.PARSE_ERROR, f"malformed XML: {problem}")
        else:
            raise challenge_error(body) or FetchError(FailureReason.PARSE_ERROR, f"unreadable feed: {problem}")
    if not parsed.get("version") and not parsed.entries:
        # A bot challenge is no broken feed: blocked, which passes, not parse_error, which
        # would disable the source after a few.
        raise challenge_error(body) or FetchError(FailureReason.PARSE_ERROR, "not a feed (no RSS or Atom document found)")
    return list(parsed.entries), parsed.get("feed") or {}


def _first(entry: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` the entry has. Read as a plain dict: feedparser's own get()
    maps a missing published to updated itself, with a DeprecationWarning each time."""
    fields: dict[str, Any] = entry if isinstance(entry, dict) else dict(entry)
    return next((value for key in keys if (value := dict.get(fields, key))), None)


def _author(entry: Mapping[str, Any]) -> str | None:
    """The person's name: RSS writes ``jane@example.org (Jane Doe)``, which feedparser
    splits into ``author_detail``; the address alone when no name is given."""
    detail = entry.get("author_detail") or {}
    return detail.get("name") or entry.get("author") or None


# A link that is already an absolute http(s) URL with a host, in printable ASCII, with
# nothing urljoin takes apart (a query, a fragment, parameters, an IPv6 literal): urljoin
# gives it back as it is. Kept without the two parses (10 us an item, a feed's 25 items
# 6% of a first fetch's CPU); tests/test_properties.py holds it to ``joined_link``.
_PLAIN_ABSOLUTE = re.compile(r"https?://[^\x00-\x20\x7f-\U0010ffff?#;\[\]/][^\x00-\x20\x7f-\U0010ffff?#;\[\]]*")


def _absolute(link: str, feed_url: str) -> str:
    """An item's link as an absolute http(s) URL (RSS has no xml:base: a relative
    <link>, "/jobs/7", is relative to the feed's URL), or "" for none: javascript:,
    data:, mailto: ... never become a listing's link."""
    if _PLAIN_ABSOLUTE.fullmatch(link):
        return link
    return joined_link(link, feed_url)


def _kind(entry: Mapping[str, Any], field: str) -> str:
    """The type feedparser gives a text field of the entry (declared, or guessed where the
    format has no declaration): text/plain, text/html, application/xhtml+xml. A summary
    feedparser took from the entry's content has the content's."""
    detail = dict.get(entry, f"{field}_detail") if isinstance(entry, dict) else entry.get(f"{field}_detail")
    if detail:
        return str(detail.get("type") or "text/html")
    content = entry.get("content") or []
    if field == "summary" and content and content[0].get("value") == entry.get("summary"):
        return str(content[0].get("type") or "text/html")
    return "text/html"


def _as_markup(entry: Mapping[str, Any], field: str) -> str:
    """A text field of the entry as the HTML fragment a raw item holds (``markup``)."""
    value = entry.get(field) or ""
    return markup(value) if _kind(entry, field) == "text/plain" else value


def _price(entry: Mapping[str, Any]) -> str:
    """The entry's price as its feed writes it ("1200.00 EUR"), as a raw item holds it
    (the keys of ``quickfeed.PRICE_KEYS``)."""
    for key in quickfeed.PRICE_KEYS:
        if isinstance(value := entry.get(key), str) and value.strip():
            return markup(value.strip())
    return ""


def _shared_links(entries: list[Any]) -> frozenset[str]:
    """The links that more than one entry without an id carries: a podcast's episodes
    that all link to the show. Such a link names no one item (``_episode``)."""
    counts = Counter(link for entry in entries if not entry.get("id") and (link := entry.get("link")))
    return frozenset(link for link, count in counts.items() if count > 1)


def _episode(entry: Mapping[str, Any], link: str) -> str:
    """The identity of an entry without an id whose link other entries share: its link
    and its enclosure's URL, else its link and a hash of its title and date as written."""
    enclosure = next((e.get("href") for e in entry.get("enclosures") or [] if e.get("href")), None)
    if enclosure:
        return f"{link}#enclosure={enclosure}"
    date = _first(entry, "published", "updated", "created") or ""
    digest = hashlib.sha256(f"{entry.get('title') or ''}\n{date}".encode()).hexdigest()
    return f"{link}#sha256:{digest}"


def _web_id(entry: Mapping[str, Any], feed_url: str) -> str:
    """The entry's id when it is an absolute http(s) URL (an RSS guid that says it is no
    permalink often is one, e.g. WordPress's ``?p=123``), else "": a link to offer when
    the entry has none. A ``urn:``, a ``tag:`` or a relative id is no link."""
    identity = str(entry.get("id") or "")
    return _absolute(identity, feed_url) if identity.lower().startswith(("http://", "https://")) else ""


def _item(entry: Mapping[str, Any], feed_url: str, shared: frozenset[str] = frozenset()) -> Item:
    """An entry as an item; ``shared``: the links several entries of its document carry
    without an id (``_shared_links``). Its url is its own link, else its id where that is
    a web address, else none ("": never the feed's, where a reader would land)."""
    link = entry.get("link") or ""
    # The identity keeps the link as written, so a feed that moves keeps its items'.
    absolute = _absolute(link, feed_url) or _web_id(entry, feed_url)
    raw = {
        "title": _as_markup(entry, "title"),
        "url": absolute,
        "summary": _as_markup(entry, "summary"),
        # Atom 0.3 entries may carry only <created>, which feedparser reads as created.
        "published_at": _iso(_first(entry, "published_parsed", "updated_parsed", "created_parsed")),
        "author": _author(entry),
        "categories": [t.get("term") for t in entry.get("tags") or [] if t.get("term")],
    }
    if price := _price(entry):  # only where there is one: other items' hashes stay as they were
        raw["price"] = price
    # An id, else the link (unless other entries share it: ``_episode``), else a hash.
    identity = entry.get("id") or (_episode(entry, link) if link in shared else link)
    if not identity:
        # No id and no link: the entry is what it says, in the language it says it in
        # (two entries alike but for xml:lang are two entries, as feedparser counts them).
        # (Without a language the text hashed is as it always was: identities keep.)
        # The text hashed holds the fields as feedparser reads them, before ``markup``
        # escapes plain text, so identities made before that stay.
        languages = [c.get("language") or "" for c in entry.get("content") or []]
        read = {**raw, "title": entry.get("title") or "", "summary": entry.get("summary") or ""}
        text = repr(sorted(read.items())) + (repr(languages) if any(languages) else "")
        digest = hashlib.sha256(text.encode()).hexdigest()
        identity = f"sha256:{digest}"
    return Item(source_item_id=str(identity), url=absolute or feed_url, raw=raw)


class RssAdapter:
    def check_config(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - {"category"}
        if unknown:
            raise ValueError(f"unknown rss config keys {sorted(unknown)}: an rss source takes none")

    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        return fetch_and_parse(
            source, fetcher,
            lambda result: read_feed(result.body, result.url, result.content_type,
                                     content_location=result.content_location),
        )

    def read_push(self, body: bytes, url: str, content_type: str | None) -> list[Item]:
        return read_feed(body, url, content_type).items

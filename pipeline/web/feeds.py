"""Output feeds written out: Atom (RFC 4287) and JSON Feed 1.1, from the entries
pipeline/catalogue/feeds.py reads.

Every value is someone else's text (a listing's title, summary, author, categories), so
it is written as text, never markup: ElementTree escapes it, and the characters XML 1.0
cannot hold at all (control characters, lone surrogates, U+FFFE) are dropped first,
since one of them would make the whole document unreadable. A link is given only when
it is an absolute http(s) URL (a listing's ``javascript:`` link is no link). Ids are
``urn:uuid`` URNs made from what an entry tells (its user, the listing's item key and
the event), so they stay the same when the database is restored from a backup.
"""

from __future__ import annotations

import json
import re
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from pipeline.catalogue.feeds import Entry, Scope

ATOM_NS = "http://www.w3.org/2005/Atom"
ATOM_TYPE = "application/atom+xml"
JSON_FEED_TYPE = "application/feed+json"
JSON_FEED_VERSION = "https://jsonfeed.org/version/1.1"
GENERATOR = "listings-pipeline"
# What XML 1.0 can hold (its Char production); anything else is dropped.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# A fixed namespace for the ids' UUIDs (version 5): the same inputs, the same id.
_IDS = uuid.UUID("5b0f6c0e-8f0e-4d47-9d2a-6f0c6f7d1c11")


@dataclass(frozen=True)
class Document:
    """One feed as it is written: what it shows, and where it is read."""

    scope: Scope
    entries: Sequence[Entry]
    atom_url: str  # its own URLs: each document links to itself and to the other
    json_url: str

    @property
    def title(self) -> str:
        if self.scope.filter_id is None:
            return f"Matches for {self.scope.user_name}"
        return f"Matches for {self.scope.user_name}: {self.scope.query}"

    @property
    def id(self) -> str:
        return _urn(f"feed {self.scope.feed_id} {self.scope.created_at.isoformat()}")

    @property
    def updated(self) -> datetime:
        """When it last changed: its newest entry's update, or when it was made."""
        return max((e.updated for e in self.entries), default=self.scope.created_at)

    def entry_id(self, entry: Entry) -> str:
        return _urn(f"user {self.scope.user_id} {entry.identity}")


def clean(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot hold."""
    return _NOT_XML.sub("", text)


def web_link(url: str | None) -> str | None:
    """``url`` when it is an absolute http(s) URL a reader may follow; None otherwise."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return url if parts.scheme.lower() in ("http", "https") and parts.netloc else None


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _urn(key: str) -> str:
    return f"urn:uuid:{uuid.uuid5(_IDS, key)}"


def _text(entry: Entry) -> str:
    """An entry's text: its summary, then its price and where it came from."""
    parts = [entry.summary.strip(), f"Price: {entry.price}" if entry.price else "", f"From: {entry.source}"]
    return "\n\n".join(part for part in parts if part)


def _author(entry: Entry) -> str | None:
    """The entry's author as both formats write it: cleaned, none when nothing is left."""
    author = clean(entry.author or "")
    return author if author.strip() else None


def _tags(entry: Entry) -> list[str]:
    """The entry's categories as both formats write them: cleaned, the empty ones left out."""
    return [tag for tag in map(clean, entry.categories) if tag.strip()]


def atom(doc: Document) -> bytes:
    """``doc`` as an Atom feed, UTF-8."""
    ET.register_namespace("", ATOM_NS)

    def add(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
        element = ET.SubElement(parent, f"{{{ATOM_NS}}}{tag}", {k: clean(v) for k, v in attrs.items()})
        if text is not None:
            element.text = clean(text)
        return element

    feed = ET.Element(f"{{{ATOM_NS}}}feed")
    add(feed, "id", doc.id)
    add(feed, "title", doc.title, type="text")
    add(feed, "updated", rfc3339(doc.updated))
    add(feed, "link", rel="self", type=ATOM_TYPE, href=doc.atom_url)
    add(feed, "link", rel="alternate", type=JSON_FEED_TYPE, href=doc.json_url)
    add(add(feed, "author"), "name", GENERATOR)
    add(feed, "generator", GENERATOR)
    for entry in doc.entries:
        item = add(feed, "entry")
        add(item, "id", doc.entry_id(entry))
        add(item, "title", entry.title, type="text")
        add(item, "updated", rfc3339(entry.updated))
        add(item, "published", rfc3339(entry.published))
        if link := web_link(entry.link):
            add(item, "link", rel="alternate", href=link)
        if author := _author(entry):
            add(add(item, "author"), "name", author)
        for tag in _tags(entry):
            add(item, "category", term=tag)
        # Content, not a summary: an entry without a link must have one (RFC 4287 4.1.2).
        add(item, "content", _text(entry), type="text")
    written: bytes = ET.tostring(feed, encoding="utf-8", xml_declaration=True)
    return written


def json_feed(doc: Document) -> bytes:
    """``doc`` as a JSON Feed 1.1, UTF-8 (the same text, cleaned alike: a reader's JSON
    parser may be as strict as XML's about lone surrogates)."""
    items = []
    for entry in doc.entries:
        item: dict[str, object] = {
            "id": doc.entry_id(entry), "title": clean(entry.title), "content_text": clean(_text(entry)),
            "date_published": rfc3339(entry.published), "date_modified": rfc3339(entry.updated),
        }
        if link := web_link(entry.link):
            item["url"] = clean(link)
        if author := _author(entry):
            item["authors"] = [{"name": author}]
        if tags := _tags(entry):
            item["tags"] = tags
        item["_listing"] = {"source": clean(entry.source), "price": clean(entry.price) if entry.price else None}
        items.append(item)
    feed = {"version": JSON_FEED_VERSION, "title": clean(doc.title), "feed_url": doc.json_url,
            "authors": [{"name": GENERATOR}], "items": items}
    return json.dumps(feed, ensure_ascii=False, indent=1).encode()

"""The fast path of feed parsing: plain RSS 2.0, RSS 1.0 and Atom 1.0 documents read by
ElementTree, giving exactly the entries feedparser gives, or nothing.

feedparser spends about 5 ms of CPU on a 25-item feed, most of the collector's work per
feed (bench/RESULTS.md); ElementTree builds the same document's tree in C in a small
fraction of that. This module walks the tree and applies feedparser's own rules to the
fields pipeline/fetching/rss.py stores (title, link, summary, published/updated,
author, categories, id; the types of title, summary and content, with feedparser's own
test of whether RSS text looks like HTML), in document order: the same text clean-up (``pop``: strip,
the UTF-8-read-as-Latin-1 repair, the windows-1252 code points), the same URL join
for links and permalink guids against the same base, the same date parser, the same
author and tag rules.

It is a fast path, not a second parser: :func:`entries` returns None, and the caller
parses with feedparser, for anything outside the plain subset it knows: a document
feedparser's encoding detection flags, a DOCTYPE, malformed XML, xml:base below the
root element, an entry element feedparser gives a meaning this module does not copy
(media:title, contributor, itunes:summary, ...), markup inside a text field, Atom
``type="xhtml"`` or ``src`` content, two authors, a second summary before any content,
an entry with neither id nor link (its identity then hashes the content's language).
Which elements feedparser gives a meaning to is read from feedparser itself (its
``_start_`` and ``_end_`` handlers), so an element a newer feedparser learns goes to
the fallback rather than being missed.

tests/test_quickfeed.py holds both paths to the same items on the bad-input corpus and
on feeds hypothesis writes; bench/parse_agreement.py compares them field by field on
the 2,923 real-world feeds of ``../shared/corpus``.
"""

from __future__ import annotations

import functools
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from feedparser.api import StrictFeedParser
from feedparser.urls import make_safe_absolute_uri

from pipeline.core.errors import NotPlainFeed
from pipeline.fetching.feedparser_private import parse_date, repair_cp1252, urljoin

_ATOM = "http://www.w3.org/2005/Atom"
_RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
_RSS1 = "http://purl.org/rss/1.0/"
# feedparser's prefixes by lower-cased namespace URI ("content", "dc", "media", ...; ""
# for RSS and Atom themselves).
_PREFIXES: dict[str, str] = {uri.lower(): prefix for uri, prefix in StrictFeedParser.namespaces.items()}
_XMLNS = re.compile(rb"""xmlns:([A-Za-z_][\w.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_FIRST_ELEMENT = re.compile(rb"<\w")
_DECLARATION = re.compile(rb"<!(DOCTYPE|ENTITY)", re.IGNORECASE)
# What feedparser keeps of an entry that _item reads (and their neighbours): an element
# feedparser has no handler for is stored under its own name, so one of these names
# would overwrite a field.
_FIELDS = frozenset({
    "title", "link", "links", "summary", "content", "id", "author", "author_detail", "authors",
    "tags", "published", "published_parsed", "updated", "updated_parsed", "guidislink",
})
# Elements feedparser has handlers for whose effects never reach the fields we store
# (each handler read: they save under their own names, or set the feed's image).
_IGNORED = frozenset({
    "comments", "enclosure", "media_content", "media_thumbnail", "rights",
    "itunes_explicit", "itunes_block", "itunes_image", "itunes_subtitle",
})
# A shopping or listing feed's price (Google's product namespace, xmlns:g=
# "http://base.google.com/ns/1.0", as feedparser names its elements), which the rss
# adapter stores: a sale price first, the price the item sells at while it lasts. Such a
# feed is read by feedparser, which saves elements of namespaces it does not know.
PRICE_KEYS = ("g_sale_price", "g_price")
_TEXT_TYPES = frozenset({"text", "html", "text/plain", "text/html", "plain"})
_HTML_TYPES = frozenset({"application/xhtml+xml", "text/html"})
_AUTHOR_PARTS = frozenset({"name", "email", "uri", "url"})
_BASE = frozenset({"xml:base", "base"})  # feedparser reads either
_LANG = frozenset({"xml:lang", "lang"})
# feedparser's repair of a link's query: "?a=1&b;=2" written for "?a=1&b=2".
_LINK_ENTITY = re.compile("&([A-Za-z0-9_]+);")
_EMAIL = re.compile(
    r"""(([a-zA-Z0-9\_\-\.\+]+)@((\[[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.)|(([a-zA-Z0-9\-]+\.)+))"""
    r"""([a-zA-Z]{2,4}|[0-9]{1,3})(\]?))(\?subject=\S+)?"""
)


@functools.cache
def _has_handler(key: str) -> bool:
    return hasattr(StrictFeedParser, "_start_" + key) or hasattr(StrictFeedParser, "_end_" + key)


def _map_content_type(value: str) -> str:
    value = value.lower()
    return {"text": "text/plain", "plain": "text/plain", "html": "text/html",
            "xhtml": "application/xhtml+xml"}.get(value, value)


class _Keys:
    """feedparser's name for an element (``content_encoded``, ``pubdate``): its
    namespace's prefix, known or as the document binds it, and the local name lower-cased."""

    def __init__(self, document: bytes) -> None:
        self._document = document
        self._bound: dict[str, set[str]] | None = None
        self._cache: dict[str, str] = {}

    def __call__(self, tag: str) -> str:
        key = self._cache.get(tag)
        if key is None:
            key = self._cache[tag] = self._key(tag)
        return key

    def _key(self, tag: str) -> str:
        if tag[:1] != "{":
            return tag.lower()
        uri, local = tag[1:].split("}", 1)
        lower = uri.lower()
        if "backend.userland.com/rss" in lower:
            lower = "http://backend.userland.com/rss"
        prefix = _PREFIXES.get(lower)
        if prefix is None:
            prefix = self._document_prefix(uri)
        return f"{prefix}_{local}".lower() if prefix else local.lower()

    def _document_prefix(self, uri: str) -> str:
        """The prefix the document binds an unknown namespace to (feedparser names its
        elements by it); unsure when it binds more than one, or none (a default namespace)."""
        if self._bound is None:
            self._bound = {}
            for match in _XMLNS.finditer(self._document):
                value = (match.group(2) if match.group(2) is not None else match.group(3)).decode()
                self._bound.setdefault(value, set()).add(match.group(1).decode())
        prefixes = self._bound.get(uri, set())
        if len(prefixes) != 1:
            raise NotPlainFeed(f"namespace {uri!r} is bound to {len(prefixes)} prefixes")
        return next(iter(prefixes))


def _attributes(element: ET.Element) -> dict[str, str]:
    """Attributes as feedparser's handlers see them: named by :func:`_attribute_key`,
    rel and type values lower-cased. (An xml:base below the root never gets here:
    :func:`entries` sends such a document to feedparser first.)"""
    attrs = {}
    for name, value in element.attrib.items():
        key = _attribute_key(name)
        attrs[key] = value.lower() if key in ("rel", "type") else value
    return attrs


@functools.cache
def _attribute_key(name: str) -> str:
    """feedparser's name for an attribute: ``prefix:name`` in a namespace it knows by a
    prefix (``xml:lang``, ``rdf:about``); the bare name, lower-cased, otherwise (an
    unknown namespace's attribute included, as its SAX handler does)."""
    if name[:1] != "{":
        return name.lower()
    uri, local = name[1:].split("}", 1)
    prefix = _PREFIXES.get(uri.lower(), "")
    return f"{prefix}:{local}".lower() if prefix else local.lower()


def _names_a_base(element: ET.Element) -> bool:
    return bool(element.attrib) and any(_attribute_key(name) in _BASE for name in element.attrib)


def _document_base(root: ET.Element) -> str | None:
    """The base URI feedparser resolves the entries' links against: "" when the root
    names none; its xml:base as feedparser carries it down a level (joined, then made a
    safe absolute URI against itself); None when that is not settled by the first level."""
    values = [value for name, value in root.attrib.items() if _attribute_key(name) in _BASE]
    if len(values) > 1:
        return None
    first = urljoin("", values[0]) if values else ""
    if not first:
        return ""
    settled = make_safe_absolute_uri(first, first) or first
    return settled if (make_safe_absolute_uri(settled, settled) or settled) == settled else None


def _text(element: ET.Element) -> str:
    if len(element):
        raise NotPlainFeed(f"markup inside <{element.tag}>")
    return (element.text or "").strip()


def _clean(value: str, *, resolve: str | None = None) -> str:
    """feedparser's ``pop`` for a text it expects: a relative URI joined to ``resolve``
    (the document's base, "" for none) when given, mis-decoded UTF-8 repaired,
    windows-1252 code points mapped."""
    if resolve is not None and value:
        value = urljoin(resolve, value)
    if value.isascii():
        return value  # both repairs leave ASCII as it is
    try:
        value = value.encode("iso-8859-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        pass
    return repair_cp1252(value)


def _check_descendants(element: ET.Element, keys: _Keys) -> None:
    """An element feedparser ignores may hold one it does not (media:title in a
    media:group sets the title): every descendant must be ignorable too."""
    for child in element.iter():
        if child is element:
            continue
        key = keys(child.tag)
        if key in _FIELDS or (_has_handler(key) and key not in _IGNORED):
            raise NotPlainFeed(f"<{key}> inside <{keys(element.tag)}>")


def _text_type(attrs: Mapping[str, str]) -> None:
    if set(attrs) - {"type", *_LANG}:
        raise NotPlainFeed(f"attributes {sorted(attrs)}")
    if "type" in attrs and attrs["type"] not in _TEXT_TYPES:
        raise NotPlainFeed(f"content type {attrs['type']!r}")


def _add_tag(tags: list[dict[str, str | None]], term: str | None, scheme: str | None, label: str | None) -> None:
    if not (term or scheme or label):
        return
    tag = {"term": term, "scheme": scheme, "label": label}
    if tag not in tags:
        tags.append(tag)


def _author(element: ET.Element, keys: _Keys, entry: dict[str, Any]) -> None:
    """RSS's ``jane@example.org (Jane Doe)`` or Atom's name/email children, as
    feedparser's ``_sync_author_detail`` leaves ``author`` and ``author_detail``."""
    if "authors" in entry:
        raise NotPlainFeed("more than one author")
    entry["authors"] = []
    if len(element) == 0:
        author = _clean(_text(element))
        entry["author"] = author
        if not author:
            return
        detail: dict[str, str] = {}
        name, match = author, _EMAIL.search(author)
        if match:
            email = match.group(0)
            name = name.replace(email, "").replace("()", "").replace("<>", "").replace("&lt;&gt;", "").strip()
            if name[:1] == "(":
                name = name[1:]
            if name[-1:] == ")":
                name = name[:-1]
            name = name.strip()
            detail["email"] = email
        if name:
            detail["name"] = name
        entry["author_detail"] = detail
        return
    if (element.text or "").strip():
        raise NotPlainFeed("text beside an author's parts")
    parts: dict[str, str] = {}
    for child in element:
        key = keys(child.tag)
        if key not in _AUTHOR_PARTS or key in parts or (child.tail or "").strip():
            raise NotPlainFeed(f"<{key}> in an author")
        parts["href" if key in ("uri", "url") else key] = _text(child)
    given, address = parts.get("name"), parts.get("email")
    entry["author_detail"] = {k: v for k, v in parts.items() if k in ("name", "email")}
    entry["author"] = f"{given} ({address})" if given and address else given or address or ""


def _kind(attrs: Mapping[str, str], default: str, value: str, atom: bool) -> str:
    """A text field's type as feedparser gives it (``title_detail["type"]`` ...): the
    declared one, else the element's default; outside Atom, plain text that looks like
    HTML (feedparser's own test) is HTML."""
    kind = _map_content_type(attrs.get("type", default))
    # Its test needs a close tag or an entity: text with neither "<" nor "&" skips it.
    if not atom and kind == "text/plain" and ("<" in value or "&" in value) and StrictFeedParser.looks_like_html(value):
        return "text/html"
    return kind


def _entry(item: ET.Element, keys: _Keys, base: str, atom: bool) -> dict[str, Any]:
    """One entry's fields, in the order feedparser saves them; ``base`` is the
    document's base URI ("" for none), ``atom`` whether it is an Atom document (whose
    plain text fields are never taken for HTML)."""
    attrs = _attributes(item)
    entry: dict[str, Any] = {}
    about = attrs.get("rdf:about")
    if about is not None:
        entry["id"] = about  # RSS 1.0: the item's rdf:about, as written
    if set(attrs) - _LANG - {"rdf:about"}:
        raise NotPlainFeed(f"attributes on the entry: {sorted(attrs)}")
    has_content = False
    titled = False
    for child in item:
        key = keys(child.tag)
        attrs = _attributes(child)
        if key == "title":
            _text_type(attrs)
            if titled:
                raise NotPlainFeed("two titles")
            value = _clean(_text(child))
            entry["title"] = value
            entry["title_detail"] = {"type": _kind(attrs, "text/plain", value, atom)}
            titled = bool(value)
        elif key == "link":
            rel = attrs.get("rel", "alternate")
            kind = attrs.get("type", "application/atom+xml" if rel == "self" else "text/html")
            if "url" in attrs or "uri" in attrs:
                raise NotPlainFeed("a link's url or uri attribute")
            href = attrs.get("href")
            if href is not None:
                if len(child):
                    _check_descendants(child, keys)
                if rel == "alternate" and _map_content_type(kind) in _HTML_TYPES:
                    entry["link"] = urljoin(base, href)
            else:
                if attrs:
                    raise NotPlainFeed(f"a link without href but with {sorted(attrs)}")
                value = _clean(_text(child), resolve=base)
                value = _LINK_ENTITY.sub(r"&\g<1>", value.replace("&amp;", "&"))
                entry["link"] = value
        elif key in ("description", "summary"):
            _text_type(attrs)
            if "summary" in entry and not has_content:
                raise NotPlainFeed("a second summary (feedparser reads it as content)")
            value = _clean(_text(child))
            entry["summary"] = value
            default = "text/html" if key == "description" else "text/plain"
            entry["summary_detail"] = {"type": _kind(attrs, default, value, atom)}
        elif key in ("content", "content_encoded"):
            _text_type(attrs)
            has_content = True
            value = _clean(_text(child))
            default = "text/html" if key == "content_encoded" else "text/plain"
            entry.setdefault("content", []).append({"type": _kind(attrs, default, value, atom), "value": value})
            entry.setdefault("summary", value)
        elif key in ("guid", "id"):
            if set(attrs) - {"ispermalink"}:
                raise NotPlainFeed(f"attributes on the id: {sorted(attrs)}")
            permalink = attrs.get("ispermalink", "true") == "true"
            value = _clean(_text(child), resolve=base if permalink else None)
            entry["id"] = value
            if permalink:
                entry.setdefault("link", value)
        elif key in ("pubdate", "published", "updated", "dc_date"):
            if attrs:
                raise NotPlainFeed(f"attributes on <{key}>")
            field = "published" if key in ("pubdate", "published") else "updated"
            value = _clean(_text(child))
            entry[field] = value
            entry[field + "_parsed"] = parse_date(value)
        elif key in ("author", "dc_creator"):
            if attrs:
                raise NotPlainFeed(f"attributes on <{key}>")
            _author(child, keys, entry)
        elif key in ("category", "dc_subject"):
            if set(attrs) - {"term", "scheme", "domain", "label"}:
                raise NotPlainFeed(f"attributes on <{key}>: {sorted(attrs)}")
            tags = entry.setdefault("tags", [])
            _add_tag(tags, attrs.get("term"), attrs.get("scheme", attrs.get("domain")), attrs.get("label"))
            value = _clean(_text(child))
            if value:
                if tags and not tags[-1]["term"]:
                    tags[-1]["term"] = value
                else:
                    _add_tag(tags, value, None, None)
        elif key == "source" and not len(child):
            pass  # RSS's <source url="...">Its title</source>: feedparser saves it apart
        elif key in _FIELDS or key in PRICE_KEYS or (_has_handler(key) and key not in _IGNORED):
            raise NotPlainFeed(f"<{key}> in an entry")
        else:
            _check_descendants(child, keys)
    if not entry.get("id") and not entry.get("link"):
        raise NotPlainFeed("an entry with neither id nor link")
    return entry


def entries(document: bytes, detected: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The entries feedparser would find in ``document``, or None when unsure (``parse``)."""
    found = parse(document, detected)
    return None if found is None else found[0]


def parse(document: bytes, detected: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]] | None:
    """The entries feedparser would find in ``document``, and the refresh hints and site
    link of its feed as feedparser names them (``ttl``, ``sy_updateperiod``,
    ``sy_updatefrequency``, ``link``); or None when unsure.

    ``document`` is feedparser's own UTF-8 conversion of the response
    (``feedparser.encodings.convert_to_utf8``), ``detected`` what that conversion
    recorded; the caller passes no Content-Location or Content-Language (they move
    links and languages), else the fast path does not apply.
    """
    if not detected.get("encoding") or detected.get("bozo"):
        return None  # feedparser reads it leniently, or after a fix of its encoding
    start = _FIRST_ELEMENT.search(document)
    if start is None or _DECLARATION.search(document, 0, start.start()):
        return None  # a DOCTYPE, which feedparser rewrites
    try:
        root = ET.fromstring(document)
    except ET.ParseError:
        return None
    keys = _Keys(document)
    base = _document_base(root)
    if base is None:
        return None
    try:
        if root.tag == f"{{{_ATOM}}}feed":
            items = [e for e in root if e.tag == f"{{{_ATOM}}}entry"]
            feed: list[ET.Element] = [root]
        elif root.tag == "rss" and not {_attribute_key(name) for name in root.attrib} - {"version", *_BASE}:
            channels = [e for e in root if e.tag == "channel"]
            if len(channels) != 1 or len(root) != 1:
                return None
            items = [e for e in channels[0] if e.tag == "item"]
            feed = channels
        elif root.tag == f"{{{_RDF}}}RDF":  # RSS 1.0: the items beside the channel
            items = [e for e in root if e.tag == f"{{{_RSS1}}}item"]
            feed = [e for e in root if e.tag == f"{{{_RSS1}}}channel"]
        else:
            return None
        if not items:
            return None
        opened = 0  # every element feedparser would open an entry for must be one of these
        for element in root.iter():
            opened += keys(element.tag) in ("item", "entry")
            if element is not root and _names_a_base(element):
                return None  # an xml:base below the root: links resolve level by level
        if opened != len(items):
            return None
        atom = root.tag == f"{{{_ATOM}}}feed"
        return [_entry(item, keys, base, atom) for item in items], _hints(feed) | _site_link(feed, keys, base)
    except NotPlainFeed:
        return None


_SY = "http://purl.org/rss/1.0/modules/syndication/"
# The feed-level elements that say how often to refresh, by feedparser's names.
_HINTS = {"ttl": "ttl", f"{{{_SY}}}updatePeriod": "sy_updateperiod", f"{{{_SY}}}updateFrequency": "sy_updatefrequency"}


def _hints(feed: list[ET.Element]) -> dict[str, str]:
    """The refresh hints among the feed element's children (the last of each, as
    feedparser keeps it), their text stripped."""
    return {_HINTS[child.tag]: _text(child) for element in feed for child in element if child.tag in _HINTS}


def _site_link(feed: list[ET.Element], keys: _Keys, base: str) -> dict[str, str]:
    """The feed's ``link`` as feedparser gives it: the last of the feed element's links,
    an RSS ``<link>``'s text or an Atom alternate HTML link's href, resolved against the
    document's base; unsure (NotPlainFeed) of a link written any other way."""
    found: dict[str, str] = {}
    for element in feed:
        for child in element:
            if keys(child.tag) != "link":
                continue
            attrs = _attributes(child)
            if "href" in attrs:
                rel = attrs.get("rel", "alternate")
                kind = attrs.get("type", "application/atom+xml" if rel == "self" else "text/html")
                if set(attrs) - {"href", "rel", "type", "title", "hreflang", "length"}:
                    raise NotPlainFeed(f"a feed link with {sorted(attrs)}")
                if rel == "alternate" and _map_content_type(kind) in _HTML_TYPES:
                    found["link"] = urljoin(base, attrs["href"])
            elif attrs or len(child):
                raise NotPlainFeed(f"a feed link without href but with {sorted(attrs)}")
            else:
                found["link"] = _LINK_ENTITY.sub(r"&\g<1>", _clean(_text(child), resolve=base))
    return found

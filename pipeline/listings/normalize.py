"""Raw items into listings: the normaliser, a pure function (no I/O, no clock).

``normalise`` takes a raw row's ``raw_json`` (title, url, summary, published_at, author,
categories; and a page item's price: pipeline/fetching/base.py ``Item``, whose text
fields are HTML fragments, plain text escaped) and returns the listing's values: text
fields as the plain text they read as (HTML tags dropped, then entities decoded, white
space collapsed, lengths bounded: docs/architecture.md, "Text"), the publication time
in UTC, categories as a clean list, and a hash of all of it. Input it cannot use raises ``NormaliseError`` saying what is
wrong.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from html import unescape
from typing import Any

from pipeline.core import fields
from pipeline.core.errors import NormaliseError
from pipeline.core.fields import Fields
from pipeline.core.prices import parse_price
from pipeline.core.urls import web_urls

TITLE_CHARS = 500
SUMMARY_CHARS = 5000
AUTHOR_CHARS = 200
CATEGORY_CHARS = 100
PRICE_CHARS = 100
MAX_CATEGORIES = 50
# The publication times every supported database holds (MariaDB's DATETIME is the
# narrowest): any date a feed gives inside them is kept, however far off it looks.
EARLIEST = datetime(1000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)




@dataclass(frozen=True)
class Listing:
    url: str  # the item's own link; "" when it has none (never the feed's: a reader lands nowhere)
    title: str
    summary: str
    author: str | None
    published_at: datetime | None
    categories: list[str]
    # The canonical spelling of ``url`` (pipeline/core/urls.py), None without one; and of
    # the URL that identifies the item (its own, else where it was found: the raw row's),
    # which its ``item_key`` is made of. Derived, so not part of the content hash.
    canonical_url: str | None
    identity_url: str
    price: str | None = None  # as the page shows it (a page source's ``price`` selector)
    # What it says of itself beyond its words (pipeline/core/fields.py ``Fields.as_json``),
    # None when nothing: the structured data's, and its price's amount and currency.
    fields: dict[str, str] | None = None

    @property
    def content_hash(self) -> str:
        # Fields joined by a separator no normalised text contains (control characters
        # are white space, collapsed away): cheaper than encoding JSON, just as exact.
        fields = (
            self.url, self.title, self.summary, self.author or "\x00",
            self.published_at.isoformat() if self.published_at else "\x00",
            "\x1f".join(self.categories),
            # Only when there is one: the hashes of listings without a price stay as they were.
            *(() if self.price is None else (self.price,)),
            # Likewise its fields besides the price, which the price's text tells already:
            # the hashes of listings without other fields stay as they were.
            *((json.dumps(other, sort_keys=True),) if (other := {
                k: v for k, v in (self.fields or {}).items() if k not in ("price", "currency")}) else ()),
        )
        return hashlib.sha256("\x1e".join(fields).encode()).hexdigest()


def normalise(raw: Any, *, fallback_url: str | None = None, source_category: str | None = None) -> Listing:
    """The listing a raw item describes. ``fallback_url``: where the item was found (the
    raw row's url), which identifies an item without a link of its own but is never
    given as its link. ``source_category`` (the source's own category) is added to the
    item's categories, so filters can restrict by it."""
    if isinstance(raw, str):  # JSON text, as a driver without JSON support returns it
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise NormaliseError(f"raw_json is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise NormaliseError(f"raw_json must be a JSON object, not {type(raw).__name__}")
    own = _url(raw.get("url"))
    identity = own or _url(fallback_url)
    if identity is None:
        raise NormaliseError(f"no usable url (an absolute http(s) URL): {raw.get('url')!r}")
    url, canonical = own or ("", None)
    title = _bounded(html_to_text(_text(raw.get("title"), "title")), TITLE_CHARS)
    summary = _bounded(html_to_text(_text(raw.get("summary"), "summary")), SUMMARY_CHARS)
    author = _short_text(_text(raw.get("author"), "author"), AUTHOR_CHARS) or None
    price = _bounded(html_to_text(_text(raw.get("price"), "price")), PRICE_CHARS) or None
    return Listing(
        url=url,
        title=title or url,
        summary=summary,
        author=author,
        published_at=_published(raw.get("published_at")),
        categories=_categories(raw.get("categories"), source_category),
        canonical_url=canonical,
        identity_url=identity[1],
        price=price,
        fields=_fields(raw.get("fields"), price),
    )


def _fields(value: Any, price: str | None) -> dict[str, str] | None:
    """The item's fields as stored; the price's amount and currency read from its text
    where its fields name none (a price selector's, a feed's g:price)."""
    if value is None and price is None:  # most items: nothing to read
        return None
    found = Fields.from_json(value)
    if found.price is None and (amount := parse_price(price)) is not None:
        found = found.merged(fields.price(amount.value, amount.currency))
    return found.as_json() or None


def _text(value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise NormaliseError(f"{field} must be text, not {type(value).__name__}")


def _url(value: Any) -> tuple[str, str] | None:
    """A listing's link, an absolute http(s) URL with a real host, never markup, and its
    canonical spelling (pipeline/core/urls.py ``web_urls``)."""
    return web_urls(value)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _short_text(value: str, limit: int) -> str:
    """``html_to_text`` of a short text bounded to ``limit``: an author's name or a
    category, which repeat from item to item of a feed, remembered."""
    return _short_text_cached(value, limit) if len(value) <= _SHORT else _bounded(html_to_text(value), limit)


_SHORT = 200  # what _short_text remembers: texts no longer than this, the last 4096


@functools.lru_cache(maxsize=4096)
def _short_text_cached(value: str, limit: int) -> str:
    return _bounded(html_to_text(value), limit)


def _published(value: Any) -> datetime | None:
    """ISO 8601 (as the adapters write it) to UTC; a naive time is taken as UTC.
    Unparseable, or outside what a database holds (``EARLIEST``, ``LATEST``): unknown."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        stamp = datetime.fromisoformat(value.strip())
        stamp = stamp.replace(tzinfo=UTC) if stamp.tzinfo is None else stamp.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: a time zone past year 9999
        return None
    return stamp if EARLIEST <= stamp <= LATEST else None


def _categories(value: Any, source_category: str | None) -> list[str]:
    items = value if isinstance(value, list) else [value] if isinstance(value, str) else []
    if source_category:
        items = [*items, source_category]
    seen: set[str] = set()
    result = []
    for item in items:
        if not isinstance(item, str):
            continue
        text = _short_text(item, CATEGORY_CHARS)
        key = text.casefold()
        if text and key not in seen:
            seen.add(key)
            result.append(text)
        if len(result) == MAX_CATEGORIES:
            break
    return result


# -- HTML to plain text ---------------------------------------------------------------------
# Regular expressions rather than an HTML parser: all of it runs in C, about ten times
# faster than html.parser on a typical summary (bench/RESULTS.md, processor). The output
# is plain text and is never parsed as HTML again, so it need not be a faithful DOM.

_MARKUP = re.compile(r"[<&]")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")  # C0 controls that are not white space
_INVISIBLE = re.compile(
    r"<(script|style|template|noscript|head|title|iframe|object|svg)\b[^>]*>.*?(?:</\1\s*>|$)"
    r"|<!--.*?(?:-->|$)",
    re.IGNORECASE | re.DOTALL,
)
_CDATA = re.compile(r"<!\[CDATA\[(.*?)(?:\]\]>|$)", re.DOTALL)
# A tag: "<" then a letter, "/", "!" or "?", up to the ">" that is outside quotes. A "<"
# followed by anything else ("a < b", "<3") is text.
_ATTRIBUTES = r"""[^>"']*(?:(?:"[^"]*"|'[^']*')[^>"']*)*>?"""
_TAG = re.compile(r"</?[a-zA-Z!?]" + _ATTRIBUTES)
# Tags that end a line or a block when rendered: they become a space. Every other tag
# (<b>, <a>, <span>, ...) goes without one, so "Real <i>text</i>." reads "Real text.".
_BLOCK_TAG = re.compile(
    r"</?(?:p|div|br|li|ul|ol|h[1-6]|tr|td|th|table|thead|tbody|blockquote|section|article|header|"
    r"footer|hr|pre|dd|dt|dl|figure|figcaption|main|nav|aside|address|summary|details)\b" + _ATTRIBUTES,
    re.IGNORECASE,
)


def html_to_text(value: str) -> str:
    """Plain text of an HTML fragment, as a browser shows it: tags, comments, scripts and
    styles dropped (block tags such as <p> and <br> become a space), then entities
    decoded, white space collapsed to single spaces. What the markup escaped stays text:
    "&lt;entry&gt;" reads "<entry>", as it does on the page (plain text is stored as it
    reads and escaped wherever it meets markup: docs/architecture.md, "Text")."""
    if not value:
        return value
    if _MARKUP.search(value):  # plain text, the common case for titles, skips all of this
        value = _INVISIBLE.sub(" ", value)
        if "<![" in value:  # a CDATA section left in a fragment wraps the markup meant: unwrapped
            value = _CDATA.sub(r"\1", value)
        value = _TAG.sub("", _BLOCK_TAG.sub(" ", value))
        if "&" in value:
            value = unescape(value)
    if _CONTROL.search(value):  # NUL and the like: no database text type stores NUL
        value = _CONTROL.sub(" ", value)
    return " ".join(value.split())  # str.split: several times faster than a \\s+ regex

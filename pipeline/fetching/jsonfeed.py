"""JSON Feed 1.0 and 1.1 (https://jsonfeed.org/version/1.1), read by the ``rss`` adapter
when a document is JSON: users add a feed URL, whatever format it is in.

Each item becomes the same raw fields an RSS or Atom entry does (pipeline/fetching/rss.py):
title, url (``url``, else ``external_url``, resolved against the feed's URL), summary
(``content_html``, else ``content_text``, else ``summary``), published_at
(``date_published``, else ``date_modified``), author (1.1's ``authors``, else 1.0's
``author``: the first one's name), categories (``tags``). Identity: ``id``, else the
url, else a hash of the item's content.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.urls import joined_link
from pipeline.fetching.base import Item, Parsed, markup

VERSION_PREFIX = "https://jsonfeed.org/version/"


def looks_like_json(body: bytes) -> bool:
    """Whether ``body`` is a JSON object (its first character after white space and a
    UTF-8 byte-order mark is ``{``): no XML document starts so."""
    return body.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"


def parse_json_feed(body: bytes, feed_url: str) -> Parsed:
    """Items of a JSON Feed, and the site it is of (``home_page_url``); FetchError(parse_error)
    when it is not one."""
    try:
        document = json.loads(body.decode("utf-8-sig"))
    except RecursionError:
        raise FetchError(FailureReason.PARSE_ERROR, "JSON nested too deeply to be a feed") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FetchError(FailureReason.PARSE_ERROR, f"malformed JSON: {exc}") from None
    version = document.get("version") if isinstance(document, dict) else None
    if not isinstance(version, str) or not version.startswith(VERSION_PREFIX):
        raise FetchError(FailureReason.PARSE_ERROR, "not a feed (JSON without a jsonfeed.org version)")
    entries = document.get("items")
    if not isinstance(entries, list):
        raise FetchError(FailureReason.PARSE_ERROR, "a JSON Feed without an items list")
    site = joined_link(_text(document.get("home_page_url")), feed_url) or None
    return Parsed([_item(entry, feed_url) for entry in entries if isinstance(entry, dict)], site_url=site)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _date(value: Any) -> str | None:
    """An RFC 3339 date as ISO 8601 in UTC, or None."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def _author(entry: dict[str, Any]) -> str | None:
    authors = entry.get("authors")
    people = authors if isinstance(authors, list) else [entry.get("author")]
    for person in people:
        if isinstance(person, dict) and _text(person.get("name")).strip():
            return _text(person.get("name")).strip()
    return None


def _item(entry: dict[str, Any], feed_url: str) -> Item:
    link = _text(entry.get("url")) or _text(entry.get("external_url"))
    absolute = joined_link(link, feed_url)
    tags = entry.get("tags")
    html = _text(entry.get("content_html"))
    title = _text(entry.get("title"))
    summary = html or _text(entry.get("content_text")) or _text(entry.get("summary"))
    read = {
        "title": title,
        "url": absolute,
        "summary": summary,
        "published_at": _date(entry.get("date_published")) or _date(entry.get("date_modified")),
        "author": _author(entry),
        "categories": [t for t in tags if isinstance(t, str) and t] if isinstance(tags, list) else [],
    }
    identity = entry.get("id")
    identity = str(identity) if isinstance(identity, str | int) and str(identity) else link
    if not identity:  # the fields as read, before plain text is escaped: identities made before keep
        digest = hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()
        identity = f"sha256:{digest}"
    # JSON Feed's title, summary and content_text are plain text; content_html is HTML.
    raw = {**read, "title": markup(title), "summary": summary if html else markup(summary)}
    return Item(source_item_id=identity, url=absolute or feed_url, raw=raw)

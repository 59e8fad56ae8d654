"""The adapter protocol: one per ``source_type``, each turning a source into items.

An adapter fetches through the run's ``Fetcher`` (so every request gets the guard, the
cap and the timeouts) and raises ``FetchError`` with a code of the taxonomy when it
cannot. The collector chooses the adapter by ``source_type`` (pipeline/fetching/registry.py).
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.inputs import MAX_ITEM_ID_CHARS
from pipeline.fetching import websub
from pipeline.net.http import Fetcher, FetchResult

# Longer item ids are stored as their hash (pipeline/core/inputs.py says why this long).


def _storable(value: Any) -> Any:
    """``value`` with every string made storable: NUL characters dropped (no database text
    type, nor PostgreSQL's jsonb, stores one) and lone surrogates, which have no UTF-8
    form, replaced."""
    if isinstance(value, str):
        if "\x00" in value:
            value = value.replace("\x00", "")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_storable(v) for v in value]
    return value


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def markup(text: str) -> str:
    """Plain text as the HTML fragment a raw item's title, summary and price hold: the
    normaliser reads those as HTML (pipeline/listings/normalize.py), so a "<" or "&" of
    plain text ("A<B and C", "R&D") is escaped to read as itself. Text without either is
    given back as it is, so its raw item (and its hash) stays what it was."""
    return html.escape(text, quote=False) if "<" in text or "&" in text else text


# A bot challenge served instead of the page or feed (answered with 200: a 403 or 429
# fails before any body is read), told by its title
# or by its challenge platform's own resources. Never by a captcha widget alone: pages
# with a reCAPTCHA on their contact form are pages.
_CHALLENGE_TITLES = (
    "just a moment...", "attention required! | cloudflare", "are you a robot", "are you human",
    "verify you are human", "human verification", "robot check", "pardon our interruption",
    "access to this page has been denied", "captcha challenge",
)
_CHALLENGE_MARKERS = (
    b"/cdn-cgi/challenge-platform/", b"cf-browser-verification", b"captcha-delivery.com", b"px-captcha",
    b"_incapsula_resource",
)


def challenge(title: str, body: bytes) -> str | None:
    """What shows ``body`` (an HTML document titled ``title``) to be a bot challenge, or None."""
    folded = title.casefold()
    if any(t in folded for t in _CHALLENGE_TITLES):
        return f"titled {title[:80]!r}"
    lowered = body[:200_000].lower()
    if marker := next((m for m in _CHALLENGE_MARKERS if m in lowered), None):
        return f"its page loads {marker.decode()}"
    return None


_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)


def challenge_error(body: bytes) -> FetchError | None:
    """The failure of a fetch that got a bot challenge where a feed was expected (an HTML
    document, its title read without parsing it), or None."""
    found = _TITLE.search(body[:65_536])
    title = " ".join(found.group(1).decode("utf-8", "replace").split()) if found else ""
    if what := challenge(html.unescape(title), body):
        return FetchError(FailureReason.BLOCKED, f"the site answered with a bot challenge ({what}), not the feed")
    return None


@dataclass(frozen=True)
class Item:
    """One thing a source yielded; ``raw`` is what lands in ``listings_raw.raw_json``:
    at least title, url, summary, published_at (ISO 8601 or None), author, categories.
    Title, summary and price are HTML fragments (plain text goes through ``markup``);
    raw's url is the item's own link, "" when it has none. ``url`` is that link, or for
    an item without one where it was found (the feed): it identifies the item
    (pipeline/core/urls.py ``item_key``) but is never offered as its link."""

    source_item_id: str
    url: str
    raw: dict[str, Any]

    def __post_init__(self) -> None:
        if not self._already_storable():
            for name in ("source_item_id", "url", "raw"):
                object.__setattr__(self, name, _storable(getattr(self, name)))
        if len(self.source_item_id) > MAX_ITEM_ID_CHARS:
            digest = hashlib.sha256(self.source_item_id.encode()).hexdigest()
            object.__setattr__(self, "source_item_id", f"sha256:{digest}")

    def _already_storable(self) -> bool:
        """True when ``_storable`` would change nothing, found without walking ``raw``:
        its JSON text (which the item needs anyway: kept as ``raw_text``) holds no NUL
        (json writes one as ``\\u0000``; text that merely spells that takes the walk)
        and encodes to UTF-8 (a lone surrogate does not); the same of the id and URL."""
        try:
            text = json.dumps(self.raw, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):
            return False  # the walk, then raw_text, says what is wrong
        if "\\u0000" in text or not _encodes(text):
            return False
        for value in (self.source_item_id, self.url):
            if not isinstance(value, str) or "\x00" in value or not _encodes(value):
                return False
        self.__dict__["raw_text"] = text  # the cached property's value (frozen: no setattr)
        return True

    @functools.cached_property
    def raw_text(self) -> str:
        """``raw`` as JSON text, keys sorted: what is stored, and what is hashed."""
        return json.dumps(self.raw, sort_keys=True, ensure_ascii=False)

    @functools.cached_property
    def content_hash(self) -> str:
        return hashlib.sha256(self.raw_text.encode()).hexdigest()


@dataclass(frozen=True)
class Parsed:
    """A document's items, and how soon it says it is worth reading again."""

    items: list[Item]
    refresh_minutes: float | None = None  # RSS <ttl>, sy:updatePeriod / sy:updateFrequency
    site_url: str | None = None  # the site the document is a feed of (its <link>, home_page_url)


@dataclass(frozen=True)
class Outcome:
    """What one fetch produced, besides its items."""

    items: list[Item] = field(default_factory=list)
    # The publisher's "not sooner than" (the document's hints, Cache-Control, Expires):
    # a floor of an adaptive cadence (pipeline/core/cadence.py).
    refresh_minutes: float | None = None
    http_status: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    moved_to: str | None = None  # a permanent redirect: the source's new URL
    not_modified: bool = False
    # Keys to merge into the source's config, e.g. a YouTube @handle's channel id once
    # resolved, so it is looked up once.
    config_updates: dict[str, Any] | None = None
    # The site a feed says it is of: where a message about an item without a link of its
    # own sends the reader (sources.site_url).
    site_url: str | None = None
    # The WebSub hub the document advertises, and its topic (pipeline/fetching/websub.py).
    hub: str | None = None
    topic: str | None = None


class Adapter(Protocol):
    def check_config(self, config: Mapping[str, Any]) -> None:
        """ValueError saying what is wrong with a source's ``config`` for this adapter."""
        ...

    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        """Fetch ``source`` (a ``sources`` row) and return its current items."""
        ...


@runtime_checkable
class Pushable(Protocol):
    """An adapter whose sources a WebSub hub can push to (pipeline/fetching/websub.py)."""

    def read_push(self, body: bytes, url: str, content_type: str | None) -> list[Item]:
        """The items of a distribution pushed for the topic ``url``, with the same
        identities a fetch of the source gives them; FetchError when it is no feed."""
        ...


def fetch_and_parse(
    source: Mapping[str, Any],
    fetcher: Fetcher,
    parse: Callable[[FetchResult], list[Item] | Parsed],
    *,
    url: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Outcome:
    """A conditional GET of ``url`` (default: the source's URL); ``parse`` turns a fresh
    body into items (and, for a feed, its refresh hints)."""
    result = fetcher.fetch(
        url or source["url"], etag=source.get("etag"), last_modified=source.get("last_modified"),
        headers=headers,
    )
    fresh = None if result.fresh_seconds is None else result.fresh_seconds / 60
    if result.not_modified:  # keep the validators we sent unless the server sent new ones
        return Outcome(
            http_status=304,
            etag=result.etag or source.get("etag"),
            last_modified=result.last_modified or source.get("last_modified"),
            moved_to=result.moved_to,
            not_modified=True,
            refresh_minutes=fresh,
        )
    parsed = parse(result)
    if isinstance(parsed, list):
        parsed = Parsed(parsed)
    hints = [m for m in (fresh, parsed.refresh_minutes) if m is not None]
    hub, topic = websub.discover(result)
    return Outcome(
        hub=hub,
        topic=topic,
        items=parsed.items,
        refresh_minutes=max(hints) if hints else None,
        http_status=result.status,
        etag=result.etag,
        last_modified=result.last_modified,
        moved_to=result.moved_to,
        site_url=parsed.site_url,
    )

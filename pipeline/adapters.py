"""The adapter protocol: one per ``source_type``, each turning a source into items.

An adapter fetches through the run's ``Fetcher`` (so every request gets the guard, the
cap and the timeouts) and raises ``FetchError`` with a code of the taxonomy when it
cannot. The collector (pipeline/collector.py) chooses the adapter by ``source_type``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pipeline.failures import FailureReason, FetchError
from pipeline.http import Fetcher, FetchResult


@dataclass(frozen=True)
class Item:
    """One thing a source yielded; ``raw`` is what lands in ``listings_raw.raw_json``:
    at least title, url, summary, published_at (ISO 8601 or None), author, categories."""

    source_item_id: str
    url: str
    raw: dict[str, Any]

    @property
    def content_hash(self) -> str:
        encoded = json.dumps(self.raw, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(encoded).hexdigest()


@dataclass(frozen=True)
class Outcome:
    """What one fetch produced, besides its items."""

    items: list[Item] = field(default_factory=list)
    http_status: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    moved_to: str | None = None  # a permanent redirect: the source's new URL
    not_modified: bool = False


class Adapter(Protocol):
    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        """Fetch ``source`` (a ``sources`` row) and return its current items."""
        ...


def fetch_and_parse(
    source: Mapping[str, Any], fetcher: Fetcher, parse: Callable[[FetchResult], list[Item]]
) -> Outcome:
    """A conditional GET of the source's URL; ``parse`` turns a fresh body into items."""
    result = fetcher.fetch(
        source["url"], etag=source.get("etag"), last_modified=source.get("last_modified")
    )
    if result.not_modified:  # keep the validators we sent unless the server sent new ones
        return Outcome(
            http_status=304,
            etag=result.etag or source.get("etag"),
            last_modified=result.last_modified or source.get("last_modified"),
            moved_to=result.moved_to,
            not_modified=True,
        )
    return Outcome(
        items=parse(result),
        http_status=result.status,
        etag=result.etag,
        last_modified=result.last_modified,
        moved_to=result.moved_to,
    )


@functools.cache
def _adapters() -> dict[str, Adapter]:
    # Imported here: the adapters import this module for Item, Outcome, fetch_and_parse.
    from pipeline.page import PageAdapter
    from pipeline.rss import RssAdapter

    return {"rss": RssAdapter(), "http": PageAdapter()}


def adapter_for(source_type: str) -> Adapter:
    try:
        return _adapters()[source_type]
    except KeyError:
        raise FetchError(
            FailureReason.INVALID_CONFIG,
            f"no adapter for source type {source_type!r} in this version",
        ) from None

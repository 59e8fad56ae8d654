"""The adapter for each ``source_type``: the one place that knows every adapter."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.kinds import SourceType
from pipeline.fetching.base import Adapter, Outcome, Pushable
from pipeline.fetching.page import PageAdapter
from pipeline.fetching.rss import RssAdapter
from pipeline.fetching.youtube import YouTubeAdapter
from pipeline.net.http import Fetcher


@functools.cache
def _adapters() -> dict[str, Adapter]:
    return {SourceType.RSS: RssAdapter(), SourceType.PAGE: PageAdapter(), SourceType.YOUTUBE: YouTubeAdapter()}


def adapter_for(source_type: str) -> Adapter:
    try:
        return _adapters()[source_type]
    except KeyError:
        raise FetchError(
            FailureReason.INVALID_CONFIG,
            f"no adapter for source type {source_type!r} in this version",
        ) from None


def fetch_source(source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
    """Fetch ``source`` (a ``sources`` row) with its type's adapter, once its config is
    known good: a config this version cannot use fails as ``invalid_config`` without a
    request to the host."""
    adapter = adapter_for(source["source_type"])
    config = source.get("config") or {}
    if not isinstance(config, Mapping):
        raise FetchError(FailureReason.INVALID_CONFIG, "config must be a JSON object")
    try:
        adapter.check_config(config)
    except ValueError as exc:
        raise FetchError(FailureReason.INVALID_CONFIG, str(exc)) from None
    return adapter.fetch(source, fetcher)


def push_reader(source_type: str) -> Pushable | None:
    """The adapter that reads what a WebSub hub pushes for sources of ``source_type``, or
    None: a type that takes no pushes (a page is not a feed) is never subscribed."""
    adapter = _adapters().get(source_type)
    return adapter if isinstance(adapter, Pushable) else None

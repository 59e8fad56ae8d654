"""The ``youtube`` adapter: a channel (URL, id or @handle) or a playlist, as items.

Without an API key it reads YouTube's public Atom feed (``/feeds/videos.xml``, the
newest 15 videos), through the rss adapter's parser. With ``api_key`` in the source's
config it reads the Data API v3 instead (``playlistItems`` of the channel's uploads
playlist, up to 50), whose quota errors are ``youtube_quota``. Both give each video the
identity ``yt:video:<id>``, so switching between them stores nothing twice.

An @handle or a custom (``/c/...``) URL is resolved to its channel id once; the id is
stored in the source's config (``channel_id``) and used from then on.

For youtube.com URLs the feed comes from https://www.youtube.com. A URL on any other
host is read the same way from that host (a mirror, the offline demo, the tests).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from pipeline.core import redact
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.fetching.base import Item, Outcome, fetch_and_parse, markup
from pipeline.fetching.rss import parse_feed
from pipeline.net.http import Fetcher

YOUTUBE_HOSTS = frozenset(
    {"youtube.com", "www.youtube.com", "m.youtube.com", "music.youtube.com", "youtu.be"}
)
PUBLIC_ORIGIN = "https://www.youtube.com"
API_BASE = "https://www.googleapis.com/youtube/v3"
# YouTube publishes every channel's uploads through this WebSub hub, under a topic of its
# own; its feeds do not advertise it (playlists have none).
HUB = "https://pubsubhubbub.appspot.com/subscribe"
CONFIG_KEYS = frozenset({"api_key", "api_base", "channel_id", "category"})

CHANNEL_ID = re.compile(r"UC[\w-]{22}")
HANDLE = re.compile(r"@[\w.-]{1,100}")
_PLAYLIST_ID = re.compile(r"[\w-]{2,64}")
_NAME = re.compile(r"[\w.-]{1,100}")

# Where a channel page names its own id: the canonical link first (other channels'
# ids appear all over the page), then the page's structured data.
_PAGE_CHANNEL_ID = (
    re.compile(rb'<link[^>]+rel="canonical"[^>]+href="[^"]*/channel/(UC[\w-]{22})"'),
    re.compile(rb'<meta[^>]+itemprop="(?:identifier|channelId)"[^>]+content="(UC[\w-]{22})"'),
    re.compile(rb'"externalId":"(UC[\w-]{22})"'),
)

# The Data API's error reasons (error.errors[].reason) that are not plain HTTP failures.
_QUOTA_REASONS = frozenset({"quotaExceeded", "dailyLimitExceeded"})
_RATE_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})
_KEY_REASONS = frozenset(
    {"keyInvalid", "keyExpired", "accessNotConfigured", "ipRefererBlocked", "forbidden"}
)

Kind = Literal["channel", "playlist", "user", "handle", "custom"]


@dataclass(frozen=True)
class Target:
    """What a youtube source points at, and where its public feed is served."""

    kind: Kind
    value: str  # a channel id, playlist id, user name, @handle or custom name
    origin: str

    def feed_url(self, channel_id: str | None = None) -> str:
        if channel_id or self.kind == "channel":
            query = {"channel_id": channel_id or self.value}
        elif self.kind == "playlist":
            query = {"playlist_id": self.value}
        elif self.kind == "user":
            query = {"user": self.value}
        else:
            raise ValueError(f"{self.kind} {self.value!r} must be resolved to a channel id first")
        return f"{self.origin}/feeds/videos.xml?{urlencode(query)}"

    def page_url(self) -> str:
        path = self.value if self.kind == "handle" else f"c/{self.value}"
        return f"{self.origin}/{quote(path, safe='@')}"


def youtube_url(value: str) -> str | None:
    """A bare channel id or @handle as its channel URL; None when ``value`` is neither."""
    if CHANNEL_ID.fullmatch(value):
        return f"{PUBLIC_ORIGIN}/channel/{value}"
    if HANDLE.fullmatch(value):
        return f"{PUBLIC_ORIGIN}/{value}"
    return None


def parse_target(url: str) -> Target:
    """What ``url`` points at; ValueError saying why when it is no channel or playlist."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    origin = PUBLIC_ORIGIN if host in YOUTUBE_HOSTS else f"{parts.scheme}://{parts.netloc}"
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    segments = [s for s in parts.path.split("/") if s]
    if "list" in query and _PLAYLIST_ID.fullmatch(query["list"]):  # /playlist?list=, /watch?...&list=
        return Target("playlist", query["list"], origin)
    if segments[-2:] == ["feeds", "videos.xml"] or segments == ["feeds", "videos.xml"]:
        for key, kind in (("channel_id", "channel"), ("playlist_id", "playlist"), ("user", "user")):
            if query.get(key):
                return Target(kind, query[key], origin)  # type: ignore[arg-type]
    if len(segments) >= 2 and segments[0] == "channel" and CHANNEL_ID.fullmatch(segments[1]):
        return Target("channel", segments[1], origin)
    if segments and HANDLE.fullmatch(segments[0]):
        return Target("handle", segments[0], origin)
    if len(segments) >= 2 and segments[0] in ("user", "c") and _NAME.fullmatch(segments[1]):
        return Target("user" if segments[0] == "user" else "custom", segments[1], origin)
    raise ValueError(
        f"{url!r} is not a YouTube channel, @handle, user or playlist URL"
        " (for example https://www.youtube.com/@name or .../playlist?list=...)"
    )


class YouTubeAdapter:
    def check_config(self, config: Mapping[str, Any]) -> None:
        """ValueError naming what is wrong with a youtube source's config."""
        unknown = set(config) - CONFIG_KEYS
        if unknown:
            raise ValueError(f"unknown youtube config keys {sorted(unknown)}: use {sorted(CONFIG_KEYS)}")
        for key in ("api_key", "api_base", "channel_id"):
            if key in config and (not isinstance(config[key], str) or not config[key].strip()):
                raise ValueError(f"youtube config {key!r} must be a non-empty string")
        if "channel_id" in config and not CHANNEL_ID.fullmatch(config["channel_id"]):
            raise ValueError(f"youtube config channel_id {config['channel_id']!r} is not a channel id (UC...)")
        if "api_base" in config and urlsplit(config["api_base"]).scheme not in ("http", "https"):
            raise ValueError(f"youtube config api_base {config['api_base']!r} is not an http(s) URL")

    def read_push(self, body: bytes, url: str, content_type: str | None) -> list[Item]:
        return read_push(body, url, content_type)

    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        config = source.get("config") or {}  # checked by registry.fetch_source
        try:
            target = parse_target(source["url"])
        except ValueError as exc:
            raise FetchError(FailureReason.INVALID_CONFIG, str(exc)) from None
        if config.get("api_key"):
            return _ApiClient(config, fetcher).fetch(source, target)
        channel_id = config.get("channel_id")
        resolved = None
        if channel_id is None and target.kind in ("handle", "custom"):
            channel_id = resolved = _channel_id_from_page(target, fetcher)
        outcome = fetch_and_parse(
            source, fetcher, lambda result: parse_feed(result.body, result.url, result.content_type, item=_feed_item),
            url=target.feed_url(channel_id),
        )
        return _with(outcome, target, channel_id, resolved)


def _with(outcome: Outcome, target: Target, channel_id: str | None, resolved: str | None) -> Outcome:
    """The outcome, minus any redirect (the stored URL is the channel's, not the feed's),
    plus the channel id when it was resolved just now, and the channel's WebSub hub
    (``hub``)."""
    hub, topic = hub_for(target, channel_id, (outcome.hub, outcome.topic))
    return Outcome(
        items=outcome.items, http_status=outcome.http_status, etag=outcome.etag,
        last_modified=outcome.last_modified, not_modified=outcome.not_modified,
        config_updates={"channel_id": resolved} if resolved else None, hub=hub, topic=topic,
    )


def hub_for(target: Target, channel_id: str | None,
            advertised: tuple[str | None, str | None]) -> tuple[str | None, str | None]:
    """The WebSub hub and topic of a youtube source: on YouTube, ``HUB`` for a channel
    (its uploads' topic), none for a playlist; elsewhere (a mirror, the demo) what the
    feed advertised."""
    if target.origin != PUBLIC_ORIGIN:
        return advertised
    if channel_id is None and target.kind == "channel":
        channel_id = target.value
    if channel_id is None:
        return None, None
    return HUB, f"{PUBLIC_ORIGIN}/xml/feeds/videos.xml?{urlencode({'channel_id': channel_id})}"


def read_push(body: bytes, url: str, content_type: str | None) -> list[Item]:
    """The videos of a distribution the hub pushed (an Atom feed of the new or changed
    videos), as the public feed's: the same identities, so a pushed video and the next
    poll are one item."""
    return parse_feed(body, url, content_type, item=_feed_item)


def _channel_id_from_page(target: Target, fetcher: Fetcher) -> str:
    page = fetcher.fetch(target.page_url())
    for pattern in _PAGE_CHANNEL_ID:
        found = pattern.search(page.body)
        if found:
            return found.group(1).decode()
    raise FetchError(
        FailureReason.PARSE_ERROR, f"no channel id found on the page of {target.value}",
        http_status=page.status,
    )


def _feed_item(entry: Mapping[str, Any], feed_url: str) -> Item:
    """A video of the public feed. View counts and ratings (media:community) change all
    the time and are left out, so an unchanged video is never stored again."""
    video_id = entry.get("yt_videoid") or str(entry.get("id", "")).removeprefix("yt:video:")
    thumbnails = entry.get("media_thumbnail") or [{}]
    return _video(
        video_id=video_id,
        title=entry.get("title") or "",
        summary=entry.get("summary") or "",
        published=entry.get("published") or entry.get("updated"),
        author=entry.get("author") or None,
        channel_id=entry.get("yt_channelid"),
        thumbnail=thumbnails[0].get("url"),
        fallback_url=entry.get("link") or feed_url,
    )


def _video(
    *, video_id: str, title: str, summary: str, published: str | None, author: str | None,
    channel_id: str | None, thumbnail: str | None, fallback_url: str,
) -> Item:
    url = f"{PUBLIC_ORIGIN}/watch?v={video_id}" if video_id else fallback_url
    raw: dict[str, Any] = {
        "title": markup(title),  # a video's title and description are plain text
        "url": url,
        "summary": markup(summary),
        "published_at": _iso(published),
        "author": author,
        "categories": [],
        "video_id": video_id or None,
        "channel_id": channel_id,
        "thumbnail": thumbnail,
    }
    identity = f"yt:video:{video_id}" if video_id else url
    return Item(source_item_id=identity, url=url, raw=raw)


def _iso(value: str | None) -> str | None:
    if not value:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.astimezone(UTC).isoformat()


class _ApiClient:
    """The Data API v3: the key goes in a header, never in a URL or a message."""

    def __init__(self, config: Mapping[str, Any], fetcher: Fetcher) -> None:
        self.base = str(config.get("api_base") or API_BASE).rstrip("/")
        self.headers = {"X-Goog-Api-Key": str(config["api_key"])}
        self.fetcher = fetcher
        self.channel_id: str | None = config.get("channel_id")

    def fetch(self, source: Mapping[str, Any], target: Target) -> Outcome:
        resolved = None
        if target.kind == "playlist":
            playlist = target.value
        else:
            if self.channel_id is None:
                self.channel_id = resolved = self._channel_id(target)
            playlist = "UU" + self.channel_id[2:]  # every channel's uploads playlist
        url = self._url("playlistItems", part="snippet,contentDetails", playlistId=playlist, maxResults=50)
        outcome = self._call(lambda: fetch_and_parse(source, self.fetcher, self._items, url=url,
                                                     headers=self.headers))
        return _with(outcome, target, self.channel_id, resolved)

    def _url(self, method: str, **params: Any) -> str:
        return f"{self.base}/{method}?{urlencode(params)}"

    def _channel_id(self, target: Target) -> str:
        if target.kind == "channel":
            return target.value
        if target.kind == "custom":  # the API cannot look these up: read the page
            return _channel_id_from_page(target, self.fetcher)
        key = "forHandle" if target.kind == "handle" else "forUsername"
        url = self._url("channels", part="id", **{key: target.value})
        result = self._call(lambda: self.fetcher.fetch(url, headers=self.headers))
        items = _json(result.body).get("items") or []
        if not items or not CHANNEL_ID.fullmatch(str(items[0].get("id", ""))):
            raise FetchError(FailureReason.HTTP_4XX, f"YouTube knows no channel {target.value}",
                             http_status=result.status)
        return str(items[0]["id"])

    def _call(self, request: Any) -> Any:
        """Run ``request``, turning the API's own error reasons into the taxonomy. The
        key is taken out of any message: an API (or anything at ``api_base``) may echo it."""
        try:
            return request()
        except FetchError as exc:
            error = _api_error(exc)
            message = redact.scrub(error.message, [self.headers["X-Goog-Api-Key"]])
            if message != error.message:
                error = FetchError(error.reason, message,
                                   http_status=error.http_status, retry_after=error.retry_after)
            raise error from None

    @staticmethod
    def _items(result: Any) -> list[Item]:
        items = []
        for entry in _json(result.body).get("items") or []:
            snippet = entry.get("snippet") or {}
            details = entry.get("contentDetails") or {}
            video_id = (snippet.get("resourceId") or {}).get("videoId") or details.get("videoId")
            if not video_id or "videoOwnerChannelId" not in snippet:
                continue  # a private or deleted video has no owner: nothing to show anyone
            thumbnails = snippet.get("thumbnails") or {}
            best: dict[str, Any] = next((thumbnails[k] for k in ("high", "medium", "default") if k in thumbnails), {})
            items.append(
                _video(
                    video_id=video_id,
                    title=snippet.get("title") or "",
                    summary=snippet.get("description") or "",
                    published=details.get("videoPublishedAt") or snippet.get("publishedAt"),
                    author=snippet.get("videoOwnerChannelTitle") or snippet.get("channelTitle"),
                    channel_id=snippet.get("videoOwnerChannelId") or snippet.get("channelId"),
                    thumbnail=best.get("url"),
                    fallback_url=result.url,
                )
            )
        return items


def _json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FetchError(FailureReason.PARSE_ERROR, f"the API answered with something not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FetchError(FailureReason.PARSE_ERROR, "the API answered with JSON that is not an object")
    return data


def _api_error(error: FetchError) -> FetchError:
    """A Data API error response, classified by its ``error.errors[].reason``."""
    if error.http_status not in (400, 403, 429) or not error.body:
        return error
    try:
        details = json.loads(error.body).get("error") or {}
        reasons = {e.get("reason") for e in details.get("errors") or [] if isinstance(e, dict)}
        message = str(details.get("message") or "")[:200]
    except (ValueError, AttributeError, UnicodeDecodeError):
        return error
    for codes, reason in (
        (_QUOTA_REASONS, FailureReason.YOUTUBE_QUOTA),
        (_RATE_REASONS, FailureReason.RATE_LIMITED),
        (_KEY_REASONS, FailureReason.INVALID_CONFIG),
    ):
        if reasons & codes:
            return FetchError(
                reason, f"YouTube Data API: {', '.join(sorted(r for r in reasons if r))}: {message}",
                http_status=error.http_status, retry_after=error.retry_after,
            )
    return error

"""``pipeline serve``: the output feeds over HTTP (a WSGI application).

``GET /feeds/<token>.atom`` and ``/feeds/<token>.json`` (and HEAD) answer with the feed
the token opens (pipeline/catalogue/feeds.py), or 404 for a token that is unknown,
revoked or malformed, the same answer for each, so nothing tells them apart. Conditional
requests are answered as RFC 9110 says: an ETag (a hash of the body, so it changes
exactly when the body does) and Last-Modified (the feed's newest entry); a request whose
If-None-Match names the ETag, or, without If-None-Match, whose If-Modified-Since is not
older than Last-Modified, gets 304 and no body. A feed is private to whoever holds the
URL: ``Cache-Control: private``, and no request is logged (its path holds the token).
A body over 1 KB is gzipped for a client that accepts it (each encoding its own
ETag). ``GET /healthz`` says whether the database answers. ``/websub/<token>`` is the
WebSub callback: a hub's verification (GET) and pushes (POST), pipeline/fetching/websub.py.
``POST /alertmanager`` takes Alertmanager's webhook (with PIPELINE_ALERTMANAGER_TOKEN only)
and tells its alerts to the operator's channel.
A database that does not answer is 503 with Retry-After, never a traceback.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs
from wsgiref.util import application_uri

import sqlalchemy as sa
from limits import RateLimitItemPerMinute, storage, strategies
from sqlalchemy.engine import Engine

from pipeline.catalogue import feeds as catalogue
from pipeline.core import errors
from pipeline.core.errors import PipelineError, UserError
from pipeline.core.settings import Settings
from pipeline.fetching import push, websub
from pipeline.notify import operator
from pipeline.web.after_push import AfterPush
from pipeline.web.feeds import ATOM_TYPE, JSON_FEED_TYPE, Document, atom, json_feed

log = logging.getLogger(__name__)

_FEED_PATH = re.compile(r"/feeds/([^/.]+)\.(atom|json)")
ALERTMANAGER_PATH = "/alertmanager"  # Alertmanager's webhook (deploy/alertmanager/alertmanager.yml)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{20,100}")  # a WebSub callback's (secrets.token_urlsafe(32))
FORMATS: dict[str, tuple[str, Callable[[Document], bytes]]] = {
    "atom": (f"{ATOM_TYPE}; charset=utf-8", atom),
    "json": (f"{JSON_FEED_TYPE}; charset=utf-8", json_feed),
}
CACHE_CONTROL = "private, max-age=300"  # a reader polls no more often than every 5 minutes
RETRY_AFTER_SECONDS = 30
_GZIP_FROM = 1024  # bytes; a smaller body is sent as it is
_COMMON = [("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"),
           ("X-Robots-Tag", "noindex")]

StartResponse = Callable[..., Any]


def feed_urls(base: str, token: str) -> tuple[str, str]:
    """A feed's Atom and JSON Feed URLs under ``base``: the paths ``_FEED_PATH`` reads."""
    return f"{base}/feeds/{token}.atom", f"{base}/feeds/{token}.json"


class FeedApp:
    """The WSGI application. ``public_url``: the base URL readers reach the service at
    (PIPELINE_PUBLIC_URL), which the feeds' own links start with; None: the request's
    own scheme and host."""

    def __init__(self, engine: Engine, public_url: str | None = None, settings: Settings | None = None) -> None:
        self.engine = engine
        self.public_url = public_url.rstrip("/") if public_url else None
        self.settings = settings or Settings(database_url=str(engine.url))
        self.after_push = AfterPush(engine, self.settings)  # processes and notifies what pushes store
        # Each subscription's pushes in the last minute (a moving window, in memory: per
        # process). A hub that pushes more is answered 429 and retries later.
        self._pushes = strategies.MovingWindowRateLimiter(storage.MemoryStorage())
        self._push_rate = RateLimitItemPerMinute(self.settings.websub_pushes_per_minute)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "")
        try:
            if path.startswith(websub.CALLBACK_PATH):
                return self._websub(environ, start_response, path.removeprefix(websub.CALLBACK_PATH), method)
            if path == ALERTMANAGER_PATH and self.settings.alertmanager_token:
                return self._alertmanager(environ, start_response, method)
            if method not in ("GET", "HEAD"):
                return _plain(start_response, "405 Method Not Allowed", "only GET and HEAD\n",
                              [("Allow", "GET, HEAD")])
            if path == "/healthz":
                with self.engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return _plain(start_response, "200 OK", "ok\n", head=method == "HEAD")
            if found := _FEED_PATH.fullmatch(path):
                return self._feed(environ, start_response, found.group(1), found.group(2), head=method == "HEAD")
        except sa.exc.DBAPIError as exc:  # the database is away: readers and hubs retry
            log.warning("the database did not answer: %s", type(exc).__name__)
            return _plain(start_response, "503 Service Unavailable", "the database does not answer; retry later\n",
                          [("Retry-After", str(RETRY_AFTER_SECONDS))])
        except Exception as exc:  # noqa: BLE001 -- a case nobody listed: one line in the log, a plain 500
            log.error("%s %s failed: %s: %s", method, path[:200], type(exc).__name__, str(exc)[:500])
            return _plain(start_response, "500 Internal Server Error", "internal error\n")
        return _plain(start_response, "404 Not Found", "no such feed\n")

    def _feed(self, environ: dict[str, Any], start_response: StartResponse, token: str, kind: str,
              *, head: bool) -> Iterable[bytes]:
        with self.engine.connect() as conn:
            scope = catalogue.resolve(conn, token)
        if scope is None:
            return _plain(start_response, "404 Not Found", "no such feed\n")
        base = self.public_url or application_uri(environ).rstrip("/")
        atom_url, json_url = feed_urls(base, token)
        doc = Document(scope, catalogue.entries(self.engine, scope), atom_url=atom_url, json_url=json_url)
        content_type, render = FORMATS[kind]
        body = render(doc)
        digest = hashlib.sha256(body).hexdigest()[:32]
        encoding = []
        if _accepts_gzip(environ.get("HTTP_ACCEPT_ENCODING", "")) and len(body) > _GZIP_FROM:
            body, digest = gzip.compress(body, compresslevel=6, mtime=0), f"{digest}-gzip"  # its own ETag
            encoding = [("Content-Encoding", "gzip")]
        etag = f'"{digest}"'
        modified = doc.updated.replace(microsecond=0)
        headers = [("ETag", etag), ("Last-Modified", format_datetime(modified, usegmt=True)),
                   ("Cache-Control", CACHE_CONTROL), ("Vary", "Accept-Encoding"), *_COMMON]
        if _not_modified(environ, etag, modified):
            start_response("304 Not Modified", headers)
            return []
        start_response("200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body))), *encoding,
                                  *headers])
        return [] if head else [body]

    def _websub(self, environ: dict[str, Any], start_response: StartResponse, token: str,
                method: str) -> Iterable[bytes]:
        """A hub's verification of intent (GET) or distribution (POST) for the
        subscription ``token`` names (pipeline/fetching/websub.py)."""
        if method == "GET":
            params = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True).items()}
            challenge = websub.verify(self.engine, token, params) if _TOKEN.fullmatch(token) else None
            push.verified(self.engine, None if challenge is None else params.get("hub.mode"))
            if challenge is None:
                return _plain(start_response, "404 Not Found", "no such subscription\n")
            return _plain(start_response, "200 OK", challenge)
        if not _TOKEN.fullmatch(token):
            push.refused(self.engine, "no_subscription")
            return _plain(start_response, "404 Not Found", "no such subscription\n")
        if method != "POST":
            return _plain(start_response, "405 Method Not Allowed", "GET or POST\n", [("Allow", "GET, POST")])
        if not self._pushes.hit(self._push_rate, token):
            push.refused(self.engine, "rate_limited")
            wait = max(1, int(self._pushes.get_window_stats(self._push_rate, token).reset_time - time.time()) + 1)
            return _plain(start_response, "429 Too Many Requests", "too many pushes; retry later\n",
                          [("Retry-After", str(wait))])
        length = _content_length(environ)
        if not 0 <= length <= self.settings.max_response_bytes:
            push.refused(self.engine, "too_large")
            return _plain(start_response, "413 Content Too Large", "the body is too large\n")
        body = environ["wsgi.input"].read(length) if length else b""
        headers = {"content-type": environ.get("CONTENT_TYPE") or "",
                   "x-hub-signature": environ.get("HTTP_X_HUB_SIGNATURE") or ""}
        received = datetime.now(UTC)
        got = push.receive(self.engine, self.settings, token, body, headers)
        if got.stored and got.source_id is not None:
            self.after_push.wake(got.source_id, received)
        return _plain(start_response, f"{got.status} {HTTPStatus(got.status).phrase}", got.reason + "\n")

    def _alertmanager(self, environ: dict[str, Any], start_response: StartResponse, method: str) -> Iterable[bytes]:
        """Alertmanager's webhook (deploy/alertmanager): its alerts, told to the operator's
        channel as the sensors' are. Only with PIPELINE_ALERTMANAGER_TOKEN, brought as a
        bearer token; an alert that cannot be told now answers 503, and Alertmanager
        sends it again."""
        if method != "POST":
            return _plain(start_response, "405 Method Not Allowed", "POST\n", [("Allow", "POST")])
        token = self.settings.alertmanager_token or ""
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if not hmac.compare_digest(given, f"Bearer {token}".encode()):
            return _plain(start_response, "401 Unauthorized", "a bearer token is needed\n",
                          [("WWW-Authenticate", "Bearer")])
        length = _content_length(environ)
        if not 0 < length <= self.settings.max_response_bytes:
            return _plain(start_response, "413 Content Too Large", "the body is empty or too large\n")
        try:
            alerts = operator.from_alertmanager(json.loads(environ["wsgi.input"].read(length)))
        except (ValueError, RecursionError, UserError) as exc:
            return _plain(start_response, "400 Bad Request", f"{errors.reason(exc)[:200]}\n")
        if not operator.configured(self.settings):
            log.warning("%d alerts from Alertmanager and nobody to tell: PIPELINE_OPERATOR_ALERT_URL is not set",
                        len(alerts))
            return _plain(start_response, "503 Service Unavailable", "PIPELINE_OPERATOR_ALERT_URL is not set\n")
        for alert in alerts:
            try:
                operator.send(self.settings, alert)
            except PipelineError as exc:  # a DeliveryError, or the guard refusing the channel
                log.warning("the operator was not told %s: %s", alert.title, errors.reason(exc))
                return _plain(start_response, "503 Service Unavailable", "the operator's channel failed\n",
                              [("Retry-After", str(RETRY_AFTER_SECONDS))])
        return _plain(start_response, "200 OK", f"{len(alerts)} alerts told\n")


def _content_length(environ: dict[str, Any]) -> int:
    """The request's Content-Length: 0 when it has none, -1 when it is no number."""
    try:
        return int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return -1


def _accepts_gzip(header: str) -> bool:
    """Whether Accept-Encoding accepts gzip (``gzip;q=0`` refuses it)."""
    for part in header.lower().split(","):
        name, _, params = part.strip().partition(";")
        if name.strip() == "gzip":
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


def _not_modified(environ: dict[str, Any], etag: str, modified: Any) -> bool:
    """RFC 9110 13.1.2 and 13.1.3: If-None-Match decides when it is sent (weak
    comparison: ``W/"x"`` matches ``"x"``; ``*`` matches any); else If-Modified-Since, a
    date not older than the last change (an unparseable date is ignored)."""
    if (none_match := environ.get("HTTP_IF_NONE_MATCH")) is not None:
        tags = {t.strip().removeprefix("W/") for t in none_match.split(",")}
        return "*" in tags or etag in tags
    if since := environ.get("HTTP_IF_MODIFIED_SINCE"):
        try:
            return bool(modified <= parsedate_to_datetime(since))
        except (TypeError, ValueError):
            return False
    return False


def _plain(start_response: StartResponse, status: str, text: str, extra: list[tuple[str, str]] | None = None,
           *, head: bool = False) -> Iterable[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                            *_COMMON, *(extra or [])])
    return [] if head else [body]

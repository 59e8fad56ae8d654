"""The demo site: its feeds over HTTP on 127.0.0.1, a WebSub hub that pushes its job
board, and a webhook receiver whose home page lists the signed deliveries it received
and the operator alerts (``/operator``: what ``dev.py up`` sets as the operator's channel)."""


from __future__ import annotations

import hashlib
import hmac
import html
import json
import secrets
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from pipeline.core.settings import DEFAULT_DEMO_PORT
from pipeline.demo.content import (
    CHANNEL_ID,
    DEMO_OPERATOR_SECRET,
    DEMO_SECRET,
    DEMO_USER,
    FEEDS,
    HUB_PATH,
    JOBS_PATH,
    Feed,
)
from pipeline.notify.delivery import IDEMPOTENCY_HEADER, headline, verify

OPERATOR_PATH = "/operator"  # the operator's channel, as dev.py up sets it
OPERATOR_ALERTS_FILE = "operator-alerts.jsonl"  # beside the deliveries' file
HUB_SUBSCRIBERS_FILE = "hub-subscribers.json"  # the hub's verified subscribers, beside it too


class Deliveries:
    """What the webhook receiver got: kept in memory and appended to a JSON-lines file, so
    the page shows them again after a restart. A repeated Idempotency-Key is counted and
    dropped, as a receiver should."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.received: list[dict[str, Any]] = []
        self.repeats = 0
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self.received.append(json.loads(line))

    def add(self, record: dict[str, Any]) -> bool:
        """Store ``record``; False when its key was seen before."""
        with self.lock:
            if any(r["key"] == record["key"] for r in self.received):
                self.repeats += 1
                return False
            self.received.append(record)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
            return True


class _Handler(BaseHTTPRequestHandler):
    server: DemoSite
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        site = self.server.url
        if parts.path in FEEDS:
            self._feed(FEEDS[parts.path], site)
        elif parts.path == f"/channel/{CHANNEL_ID}":
            self._reply(200, f'<html><head><link rel="canonical" href="{site}/channel/{CHANNEL_ID}">'
                        "</head><body>Demo channel</body></html>".encode(), "text/html")
        elif parts.path == "/deliveries.json":
            with self.server.deliveries.lock:
                body = {"received": self.server.deliveries.received[-200:],
                        "total": len(self.server.deliveries.received),
                        "repeats_dropped": self.server.deliveries.repeats}
            self._reply(200, json.dumps(body).encode(), "application/json")
        elif parts.path == "/operator-alerts.json":
            with self.server.operator_alerts.lock:
                body = {"received": self.server.operator_alerts.received[-200:],
                        "total": len(self.server.operator_alerts.received)}
            self._reply(200, json.dumps(body).encode(), "application/json")
        elif parts.path == "/":
            self._reply(200, self._home(), "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if urlsplit(self.path).path == HUB_PATH:
            status = self.server.hub.request({k: v[-1] for k, v in parse_qs(body.decode("utf-8", "replace")).items()},
                                             self.server.url)
            self._reply(status, b"", "text/plain")
            return
        if urlsplit(self.path).path == OPERATOR_PATH:
            self._operator_alert(body)
            return
        if urlsplit(self.path).path != "/hook":
            self._reply(404, b"not found", "text/plain")
            return
        if not verify(DEMO_SECRET, body, dict(self.headers)):  # the signature, and a timestamp within 5 min
            self._reply(401, b"bad signature or stale timestamp", "text/plain")
            return
        payload = json.loads(body)
        record = {"received_at": datetime.now(UTC).isoformat(timespec="seconds"),
                  "key": self.headers.get(IDEMPOTENCY_HEADER), "user": payload["user"]["name"]}
        if "items" in payload:  # a digest: one delivery of several listings
            titles = [item["listing"]["title"] for item in payload["items"]]
            record |= {"notification_id": payload["digest_id"], "filter": f"digest of {len(titles)}",
                       "title": "; ".join(titles[:3]) + (" ..." if len(titles) > 3 else ""),
                       "url": _link(payload["items"][0]["listing"])}
        else:
            listing = payload["listing"]
            event = payload.get("event", "new")
            record |= {"notification_id": payload["notification_id"], "filter": payload["filter"].get("query", ""),
                       "event": event, "url": _link(listing), "title": headline(event, listing)}
        self.server.deliveries.add(record)
        self._reply(204, b"", "text/plain")

    def _operator_alert(self, body: bytes) -> None:
        """An operator alert (pipeline/notify/operator.py), signed with the demo's operator secret."""
        if not verify(DEMO_OPERATOR_SECRET, body, dict(self.headers)):
            self._reply(401, b"bad signature or stale timestamp", "text/plain")
            return
        alert = json.loads(body)
        self.server.operator_alerts.add({
            "received_at": datetime.now(UTC).isoformat(timespec="seconds"), "key": self.headers.get(IDEMPOTENCY_HEADER),
            "event": alert.get("event", ""), "title": alert.get("title", ""), "link": alert.get("link") or ""})
        self._reply(204, b"", "text/plain")

    def _feed(self, feed: Feed, site: str) -> None:
        now = self.server.clock()
        latest, etag = feed.latest(now), feed.etag(now)
        if self.headers.get("If-None-Match") == etag:
            self._reply(304, b"", feed.content_type, {"ETag": etag})
            return
        ks = list(range(latest, max(latest - feed.shown, -1), -1))
        self._reply(200, feed.render(site, ks, now), feed.content_type, {"ETag": etag})

    def _home(self) -> bytes:
        with self.server.deliveries.lock:
            recent = list(reversed(self.server.deliveries.received[-50:]))
            total, repeats = len(self.server.deliveries.received), self.server.deliveries.repeats
        rows = "".join(
            f"<tr><td>{html.escape(r['received_at'])}</td><td>{html.escape(r.get('user', DEMO_USER))}</td>"
            f"<td>{r['notification_id']}</td>"
            f"<td>{html.escape(r['filter'])}</td>"
            f"<td><a href=\"{html.escape(r['url'])}\">{html.escape(r['title'])}</a></td></tr>"
            for r in recent
        )
        with self.server.operator_alerts.lock:
            told = list(reversed(self.server.operator_alerts.received[-10:]))
        alerts = "".join(
            f"<li>{html.escape(a['received_at'])} <a href=\"{html.escape(a['link'])}\">{html.escape(a['title'])}</a></li>"
            for a in told) or "<li>none: nothing has needed a person</li>"
        feeds = "".join(f'<li><a href="{p}">{p}</a></li>' for p in FEEDS)
        return (
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">"
            "<title>Pipeline demo: deliveries</title><style>body{font-family:sans-serif;margin:2em}"
            "td,th{padding:.2em .8em;text-align:left}tr:nth-child(even){background:#f3f3f3}</style></head><body>"
            "<h1>Webhook deliveries to the demo's users</h1>"
            f"<p>{total} received, signatures verified; {repeats} repeats dropped by Idempotency-Key."
            " This page refreshes every 5 seconds.</p>"
            "<table><tr><th>received (UTC)</th><th>user</th><th>notification</th><th>filter</th><th>listing</th></tr>"
            f"{rows}</table><h2>Operator alerts</h2><p>What the pipeline told its operator (a failed run, a"
            " check that started failing or passes again), newest first:</p>"
            f"<ul>{alerts}</ul><h2>Feeds served</h2><ul>{feeds}</ul></body></html>"
        ).encode()

    def _reply(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if status != 304:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the pipeline's own telemetry says what was fetched


class Hub:
    """The demo site's WebSub hub, for its job board (``content.JOBS_PATH``), as a hub
    does it: a subscription request is answered 202 and its intent verified on a thread
    (a GET of the callback, which must echo the challenge); each new job is then pushed
    to every verified subscriber within a second of its appearing, signed
    ``X-Hub-Signature: sha256=...`` with the subscriber's secret. Loopback only, as the
    whole demo: a callback elsewhere is refused. Its subscribers are kept in ``store``
    (a JSON file, owner-only: it holds their secrets), so a restart forgets none, as a
    hub with storage does; one whose callback answers 410 Gone is dropped."""

    def __init__(self, site: DemoSite, store: Path | None = None) -> None:
        self.site = site
        self.lock = threading.Lock()
        self.store = store
        self.subscribers: dict[str, str] = {}  # callback -> secret, once verified
        if store is not None and store.exists():
            self.subscribers = {str(k): str(v) for k, v in json.loads(store.read_text(encoding="utf-8")).items()}
        # The newest job pushed: a hub pushes what is published after it starts, never the past.
        self.published = FEEDS[JOBS_PATH].latest(site.clock())
        self.pushes = 0
        self._stop = threading.Event()

    def request(self, form: dict[str, str], site: str) -> int:
        callback, topic = form.get("hub.callback", ""), form.get("hub.topic", "")
        if (form.get("hub.mode") != "subscribe" or topic != f"{site}{JOBS_PATH}"
                or urlsplit(callback).hostname != "127.0.0.1" or not form.get("hub.secret")):
            return 400
        threading.Thread(target=self._verify, args=(callback, topic, form["hub.secret"]), daemon=True).start()
        return 202

    def _verify(self, callback: str, topic: str, secret: str) -> None:
        challenge = secrets.token_urlsafe(16)
        query = urlencode({"hub.mode": "subscribe", "hub.topic": topic, "hub.challenge": challenge,
                           "hub.lease_seconds": "864000"})
        try:
            with urllib.request.urlopen(f"{callback}?{query}", timeout=10) as answer:  # noqa: S310 (loopback)
                verified = answer.status == 200 and answer.read().decode() == challenge
        except OSError:
            verified = False
        if verified:
            with self.lock:
                self.subscribers[callback] = secret
                self._save()

    def _save(self) -> None:
        """Write the subscribers to ``store`` (with the lock held): whole, then renamed."""
        if self.store is None:
            return
        self.store.parent.mkdir(parents=True, exist_ok=True)
        written = self.store.with_suffix(".tmp")
        written.write_text(json.dumps(self.subscribers), encoding="utf-8")
        written.chmod(0o600)
        written.replace(self.store)

    def run(self) -> None:
        """Push each new job to the verified subscribers (a thread of the site's)."""
        feed = FEEDS[JOBS_PATH]
        while not self._stop.wait(0.5):
            now = self.site.clock()
            latest = feed.latest(now)
            with self.lock:
                subscribers = dict(self.subscribers)
                new = latest > self.published
                self.published = latest
            if not (new and subscribers):
                continue
            body = feed.render(self.site.url, list(range(latest, max(latest - feed.shown, -1), -1)), now)
            for callback, secret in subscribers.items():
                signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
                request = urllib.request.Request(callback, data=body, method="POST", headers={
                    "Content-Type": feed.content_type, "X-Hub-Signature": f"sha256={signature}"})
                try:
                    with urllib.request.urlopen(request, timeout=10):  # noqa: S310 (loopback)
                        self.pushes += 1
                except urllib.error.HTTPError as exc:
                    if exc.code == 410:  # the subscriber ended it (section 7): pushed to no more
                        with self.lock:
                            self.subscribers.pop(callback, None)
                            self._save()
                except OSError:  # a subscriber that is away misses this push; polling has it
                    pass

    def stop(self) -> None:
        self._stop.set()


class DemoSite(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, deliveries_file: Path,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.deliveries = Deliveries(deliveries_file)
        self.operator_alerts = Deliveries(deliveries_file.with_name(OPERATOR_ALERTS_FILE))
        self.clock = clock  # what the feeds show is a function of it (content.Feed)
        self.hub = Hub(self, deliveries_file.with_name(HUB_SUBSCRIBERS_FILE))
        threading.Thread(target=self.hub.run, name="demo-hub", daemon=True).start()

    def server_close(self) -> None:
        self.hub.stop()
        super().server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def serve(port: int, deliveries_file: Path, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted."""
    with DemoSite(port, deliveries_file) as site:
        if ready is not None:
            ready(site.url)
        try:
            site.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            pass


def parse_site(url: str) -> str:
    """``url`` without a trailing slash; only loopback http URLs are accepted."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the demo site must be an http URL on 127.0.0.1, not {url!r}")
    if parse_qs(parts.query) or parts.path not in ("", "/"):
        raise ValueError(f"give the demo site's root, e.g. http://127.0.0.1:{DEFAULT_DEMO_PORT}, not {url!r}")
    return url.rstrip("/")


def _link(listing: dict[str, Any]) -> str:
    """Where a delivered listing's row links: its own link, else its source's site (a
    listing without a link of its own carries ``url`` null), else nowhere."""
    return listing.get("url") or listing.get("site_url") or ""

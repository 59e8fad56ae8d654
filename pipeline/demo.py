"""The offline demo: a local site with feeds that grow, and a webhook receiver to watch.

``python3 dev.py up`` runs ``pipeline demo serve`` beside the Dagster UI and seeds the
database with ``pipeline demo seed``: four sources on this site (an RSS job board, an
Atom news feed, an HTML events page read with CSS selectors, and a YouTube-style
channel read by the youtube adapter), and a user "demo" whose filters match some of
what they publish, delivered by signed webhook back to this site. Its home page lists
the deliveries it received, with their signatures checked.

Content is a function of the clock: item k of a feed appears at EPOCH + k * period, so
the feeds gain items while the demo runs, and a restart carries on where it left off.
Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import html
import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import sqlalchemy as sa

from pipeline import schema, sources, users
from pipeline.delivery import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, verify
from pipeline.settings import DEFAULT_DEMO_PORT

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
CHANNEL_ID = "UCdemoChannel0000000000A"  # 24 characters, as YouTube's are
# The demo user's webhook secret: the demo receiver checks signatures with it. A demo
# value, public on purpose; real users get a generated one (`pipeline users add`).
DEMO_SECRET = "demo-webhook-secret-not-for-production"
DEMO_USER = "demo"
DEMO_FILTERS = ("python", "rust remote", "postgresql", "dagster")
INTERVAL_MINUTES = 1

_ROLES = (
    "Senior Python developer", "Rust engineer", "Data engineer (Python, SQL)",
    "Frontend developer (TypeScript)", "Site reliability engineer", "PostgreSQL DBA",
    "Machine learning engineer", "Go backend developer", "Dagster platform engineer",
)
_PLACES = ("remote", "Berlin", "Lisbon", "remote, EU time zones", "Toronto", "Nairobi")
_COMPANIES = ("Acme Data", "Northwind", "Globex", "Initech", "Umbrella Analytics", "Hooli")
_TOPICS = (
    "PostgreSQL 18 brings asynchronous I/O", "Python 3.15 speeds up the interpreter again",
    "A Rust rewrite halves a service's memory", "Dagster adds pools for run concurrency",
    "Why SKIP LOCKED makes a good work queue", "Remote work: what changed in five years",
    "Feed readers are back", "How to backfill a year of data without tears",
)
_EVENTS = ("Python meetup", "Rust workshop", "PostgreSQL user group", "Data engineering night",
           "Dagster office hours")
_VIDEOS = ("Intro to Dagster assets", "PostgreSQL indexes, explained", "Python async in 20 minutes",
           "Rust for Python developers", "Building a feed pipeline, live")


@dataclass(frozen=True)
class Feed:
    """One of the site's feeds: item k appears at EPOCH + k * period; the newest ``shown``
    are listed."""

    path: str
    period: timedelta
    shown: int
    render: Callable[[str, list[int]], bytes]
    content_type: str

    def latest(self, now: datetime) -> int:
        return int((now - EPOCH) / self.period)

    def published(self, k: int) -> datetime:
        return EPOCH + k * self.period


def _rng(kind: str, k: int) -> random.Random:
    return random.Random(f"{kind}-{k}")  # the same item on every request and restart


def _jobs(base: str, ks: list[int]) -> bytes:
    items = []
    for k in ks:
        rng = _rng("job", k)
        role, place, company = rng.choice(_ROLES), rng.choice(_PLACES), rng.choice(_COMPANIES)
        summary = (f"<p><b>{company}</b> is hiring a {role.lower()} ({place}).</p>"
                   f"<ul><li>{rng.randint(3, 12)} years of experience</li><li>Salary band {rng.randint(60, 140)}k</li></ul>")
        items.append(
            f"<item><guid isPermaLink=\"false\">job-{k}</guid><title>{html.escape(role)} at {company}"
            f" ({place})</title><link>{base}/jobs/{k}</link>"
            f"<pubDate>{format_datetime(JOBS.published(k), usegmt=True)}</pubDate>"
            f"<category>jobs</category><description>{html.escape(summary)}</description></item>"
        )
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel>'
        f"<title>Demo job board</title><link>{base}/</link><description>New jobs every minute</description>"
        + "".join(items) + "</channel></rss>"
    ).encode()


def _news(base: str, ks: list[int]) -> bytes:
    entries = []
    for k in ks:
        rng = _rng("news", k)
        topic = rng.choice(_TOPICS)
        stamp = NEWS.published(k).isoformat()
        entries.append(
            f"<entry><id>tag:demo,2026:news-{k}</id><title>{html.escape(topic)} (part {k % 7 + 1})</title>"
            f'<link href="{base}/news/{k}"/><updated>{stamp}</updated><published>{stamp}</published>'
            f"<author><name>Demo newsroom</name></author>"
            f'<summary type="html">{html.escape(f"<p>{topic}. Read the <i>whole</i> story.</p>")}</summary></entry>'
        )
    updated = NEWS.published(ks[0]).isoformat() if ks else EPOCH.isoformat()
    return (
        '<?xml version="1.0" encoding="utf-8"?><feed xmlns="http://www.w3.org/2005/Atom">'
        f"<title>Demo news</title><id>tag:demo,2026:news</id><updated>{updated}</updated>"
        + "".join(entries) + "</feed>"
    ).encode()


def _events(base: str, ks: list[int]) -> bytes:
    rows = []
    for k in ks:
        rng = _rng("event", k)
        name = rng.choice(_EVENTS)
        day = (EVENTS.published(k) + timedelta(days=rng.randint(3, 30))).strftime("%d %B")
        rows.append(
            f'<li class="event"><h3><a href="/events/{k}">{html.escape(name)} #{k}</a></h3>'
            f'<p class="blurb">On {day}, {rng.choice(_PLACES)}. Talks, pizza and questions.</p></li>'
        )
    return (
        "<!doctype html><html><head><title>Demo events</title></head><body>"
        f'<h1>Upcoming events</h1><ul class="events">{"".join(rows)}</ul></body></html>'
    ).encode()


def _videos(base: str, ks: list[int]) -> bytes:
    entries = []
    for k in ks:
        rng = _rng("video", k)
        title = f"{rng.choice(_VIDEOS)} (episode {k % 50 + 1})"
        video_id = f"demo{k:07d}"
        stamp = VIDEOS.published(k).isoformat()
        entries.append(
            f"<entry><id>yt:video:{video_id}</id><yt:videoId>{video_id}</yt:videoId>"
            f"<yt:channelId>{CHANNEL_ID}</yt:channelId><title>{html.escape(title)}</title>"
            f'<link rel="alternate" href="{base}/watch?v={video_id}"/>'
            f"<author><name>Demo channel</name></author><published>{stamp}</published><updated>{stamp}</updated>"
            f"<media:group><media:title>{html.escape(title)}</media:title>"
            f"<media:description>{html.escape(title)}: a demo video about data pipelines.</media:description>"
            f'<media:community><media:statistics views="{rng.randint(10, 9999)}"/></media:community>'
            "</media:group></entry>"
        )
    return (
        '<?xml version="1.0" encoding="UTF-8"?><feed xmlns:yt="http://www.youtube.com/xml/schemas/2015"'
        ' xmlns:media="http://search.yahoo.com/mrss/" xmlns="http://www.w3.org/2005/Atom">'
        f"<id>yt:channel:{CHANNEL_ID}</id><yt:channelId>{CHANNEL_ID}</yt:channelId><title>Demo channel</title>"
        + "".join(entries) + "</feed>"
    ).encode()


JOBS = Feed("/feeds/jobs.rss", timedelta(minutes=1), 20, _jobs, "application/rss+xml")
NEWS = Feed("/feeds/news.atom", timedelta(seconds=90), 20, _news, "application/atom+xml")
EVENTS = Feed("/events.html", timedelta(minutes=2), 10, _events, "text/html; charset=utf-8")
VIDEOS = Feed("/feeds/videos.xml", timedelta(minutes=3), 15, _videos, "application/atom+xml")
FEEDS = {feed.path: feed for feed in (JOBS, NEWS, EVENTS, VIDEOS)}


def source_specs(site: str) -> list[sources.SourceSpec]:
    """The demo's sources on ``site`` (e.g. http://127.0.0.1:8780)."""
    return [
        sources.make_spec(f"{site}{JOBS.path}", source_type="rss", name="Demo job board",
                          interval=INTERVAL_MINUTES, category="jobs"),
        sources.make_spec(f"{site}{NEWS.path}", source_type="rss", name="Demo news",
                          interval=INTERVAL_MINUTES, category="news"),
        sources.make_spec(f"{site}{EVENTS.path}", source_type="http", name="Demo events page",
                          interval=INTERVAL_MINUTES, category="events",
                          config={"item": "li.event", "title": "h3", "link": "a", "summary": ".blurb"}),
        sources.make_spec(f"{site}/channel/{CHANNEL_ID}", source_type="youtube", name="Demo channel",
                          interval=INTERVAL_MINUTES, category="video"),
    ]


def seed(conn: sa.Connection, site: str) -> dict[str, int]:
    """Add the demo sources, user and filters where missing; safe to run on every start."""
    added = sources.import_sources(conn, source_specs(site)).added
    t = schema.users
    filters = 0
    if conn.execute(sa.select(t.c.id).where(t.c.name == DEMO_USER)).first() is None:
        users.add_user(conn, DEMO_USER, webhook=f"{site}/hook", secret=DEMO_SECRET)
        for keywords in DEMO_FILTERS:
            users.add_filter(conn, DEMO_USER, keywords)
            filters += 1
    return {"sources_added": added, "filters_added": filters}


# -- the site -------------------------------------------------------------------------------


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
        elif parts.path == "/":
            self._reply(200, self._home(), "text/html; charset=utf-8")
        else:
            self._reply(404, b"not found", "text/plain")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if urlsplit(self.path).path != "/hook":
            self._reply(404, b"not found", "text/plain")
            return
        if not verify(DEMO_SECRET, body, self.headers.get(SIGNATURE_HEADER, "")):
            self._reply(401, b"bad signature", "text/plain")
            return
        payload = json.loads(body)
        self.server.deliveries.add({
            "received_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "key": self.headers.get(IDEMPOTENCY_HEADER), "notification_id": payload["notification_id"],
            "user": payload["user"]["name"], "keywords": payload["filter"]["keywords"],
            "title": payload["listing"]["title"], "url": payload["listing"]["url"],
        })
        self._reply(204, b"", "text/plain")

    def _feed(self, feed: Feed, site: str) -> None:
        latest = feed.latest(datetime.now(UTC))
        etag = f'"{feed.path}-{latest}"'
        if self.headers.get("If-None-Match") == etag:
            self._reply(304, b"", feed.content_type, {"ETag": etag})
            return
        ks = list(range(latest, max(latest - feed.shown, -1), -1))
        self._reply(200, feed.render(site, ks), feed.content_type, {"ETag": etag})

    def _home(self) -> bytes:
        with self.server.deliveries.lock:
            recent = list(reversed(self.server.deliveries.received[-50:]))
            total, repeats = len(self.server.deliveries.received), self.server.deliveries.repeats
        rows = "".join(
            f"<tr><td>{html.escape(r['received_at'])}</td><td>{r['notification_id']}</td>"
            f"<td>{html.escape(' '.join(r['keywords']))}</td>"
            f"<td><a href=\"{html.escape(r['url'])}\">{html.escape(r['title'])}</a></td></tr>"
            for r in recent
        )
        feeds = "".join(f'<li><a href="{p}">{p}</a></li>' for p in FEEDS)
        return (
            "<!doctype html><html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">"
            "<title>Pipeline demo: deliveries</title><style>body{font-family:sans-serif;margin:2em}"
            "td,th{padding:.2em .8em;text-align:left}tr:nth-child(even){background:#f3f3f3}</style></head><body>"
            f"<h1>Webhook deliveries to user {DEMO_USER!r}</h1>"
            f"<p>{total} received, signatures verified; {repeats} repeats dropped by Idempotency-Key."
            " This page refreshes every 5 seconds.</p>"
            "<table><tr><th>received (UTC)</th><th>notification</th><th>filter</th><th>listing</th></tr>"
            f"{rows}</table><h2>Feeds served</h2><ul>{feeds}</ul></body></html>"
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


class DemoSite(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, deliveries_file: Path) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.deliveries = Deliveries(deliveries_file)

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

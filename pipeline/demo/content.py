"""The demo site's content, a function of the clock, and the seed that adds its sources,
user and filters (pipeline/demo/__init__.py tells the whole story)."""


from __future__ import annotations

import html
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import sqlalchemy as sa

from pipeline.catalogue import feeds, sources, users
from pipeline.core.kinds import SourceType
from pipeline.storage import schema

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
CHANNEL_ID = "UCdemoChannel0000000000A"  # 24 characters, as YouTube's are
# The demo user's webhook secret: the demo receiver checks signatures with it. A demo
# value, public on purpose; real users get a generated one (`pipeline users add`).
DEMO_SECRET = "demo-webhook-secret-not-for-production"
# The operator alerts' secret, as dev.py up sets PIPELINE_OPERATOR_ALERT_SECRET (dev.py
# runs before the project is installed and cannot import it: a test holds the two equal).
DEMO_OPERATOR_SECRET = "demo-operator-secret-not-for-production"
DEMO_USER = "demo"
# A second user at the same receiver, with a daily digest (08:00 UTC) of a phrase.
DIGEST_USER, DIGEST_AT, DIGEST_FILTER = "demo-digest", "daily@08:00", '"data engineer" OR "machine learning"'
# In the filter language (README, "Filters"): words, a phrase, an alternative, a field,
# a price condition (the events page's tickets start at PRICE_FROM euros and rise), and
# a location (the events page marks up each event's place).
DEMO_FILTERS = ("python -frontend", "rust remote", '"data engineer" OR postgresql', "title:dagster",
                '"office hours" price:<=15', "workshop location:berlin")
# A filter that watches what it notified of (`filters add --changes`): an event's ticket
# price rises, then the event leaves the page; each is a change alert.
DEMO_WATCH = '"python meetup" OR "rust workshop"'
# An event's ticket: PRICE_FROM euros when listed, PRICE_STEP more every PRICE_EVERY, at
# most PRICE_RISES times.
PRICE_FROM, PRICE_STEP, PRICE_EVERY, PRICE_RISES = 10, 5, timedelta(minutes=4), 3
INTERVAL_MINUTES = 1
HUB_PATH, JOBS_PATH = "/hub", "/feeds/jobs.rss"  # the demo site's WebSub hub, and the feed it pushes

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
    """One of the site's feeds: item k appears at a moment of its own in
    [EPOCH + k * period, EPOCH + (k + 1) * period), drawn at random once (seeded by k), so
    items come at ``period`` on average but off any beat: a fetch on the same cadence
    is not locked to one phase of the feed (every item waiting the same time). The
    newest ``shown`` are listed, as ``render(site, ks, now)`` shows them; an item that
    changes as it ages does so every ``changes_every``."""

    path: str
    period: timedelta
    shown: int
    render: Callable[[str, list[int], datetime], bytes]
    content_type: str
    changes_every: timedelta | None = None

    def etag(self, now: datetime) -> str:
        """What the feed shows at ``now``, as a validator: it changes when it does."""
        latest = self.latest(now)
        return f'"{self.path}-{latest}"' if self.changes_every is None else \
            f'"{self.path}-{latest}-{int((now - EPOCH) / self.changes_every)}"'

    def latest(self, now: datetime) -> int:
        k = int((now - EPOCH) / self.period)
        return k if self.published(k) <= now else k - 1

    def published(self, k: int) -> datetime:
        return EPOCH + (k + _rng(self.path, k).random()) * self.period


def _rng(kind: str, k: int) -> random.Random:
    return random.Random(f"{kind}-{k}")  # the same item on every request and restart


def _jobs(base: str, ks: list[int], _now: datetime) -> bytes:
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
    # It advertises the demo site's WebSub hub (pipeline/demo/site.py): subscribed, the
    # pipeline is pushed each new job within a second of its appearing.
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom">'
        f'<channel><atom:link rel="hub" href="{base}{HUB_PATH}"/><atom:link rel="self" href="{base}{JOBS_PATH}"/>'
        f"<title>Demo job board</title><link>{base}/</link><description>New jobs every minute</description>"
        + "".join(items) + "</channel></rss>"
    ).encode()


def _news(base: str, ks: list[int], _now: datetime) -> bytes:
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


def ticket_price(k: int, now: datetime) -> int:
    """Event k's ticket price at ``now``, in euros: it rises as the event fills."""
    rises = min(PRICE_RISES, int((now - EVENTS.published(k)) / PRICE_EVERY))
    return PRICE_FROM + PRICE_STEP * max(0, rises)


def _events(base: str, ks: list[int], now: datetime) -> bytes:
    rows = []
    for k in ks:
        rng = _rng("event", k)
        name = rng.choice(_EVENTS)
        day = (EVENTS.published(k) + timedelta(days=rng.randint(3, 30))).strftime("%d %B")
        # Marked up as schema.org microdata, as event sites do: the pipeline reads each
        # event's place and ticket price from it (pipeline/core/fields.py).
        rows.append(
            f'<li class="event" itemscope itemtype="https://schema.org/Event"><h3><a href="/events/{k}">'
            f'<span itemprop="name">{html.escape(name)} #{k}</span></a></h3>'
            f'<p class="blurb">On {day}, <span itemprop="location" itemscope itemtype="https://schema.org/Place">'
            f'<span itemprop="name">{rng.choice(_PLACES)}</span></span>. Talks, pizza and questions.</p>'
            f'<p>Tickets <span class="price" itemprop="offers" itemscope itemtype="https://schema.org/Offer">'
            f'<meta itemprop="priceCurrency" content="EUR"><span itemprop="price" content="{ticket_price(k, now)}">'
            f'&euro;{ticket_price(k, now)}</span></span></p></li>'
        )
    return (
        "<!doctype html><html><head><title>Demo events</title></head><body>"
        f'<h1>Upcoming events</h1><ul class="events">{"".join(rows)}</ul></body></html>'
    ).encode()


def _videos(base: str, ks: list[int], _now: datetime) -> bytes:
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


JOBS = Feed(JOBS_PATH, timedelta(minutes=1), 20, _jobs, "application/rss+xml")
NEWS = Feed("/feeds/news.atom", timedelta(seconds=90), 20, _news, "application/atom+xml")
EVENTS = Feed("/events.html", timedelta(minutes=2), 10, _events, "text/html; charset=utf-8",
              changes_every=PRICE_EVERY)
VIDEOS = Feed("/feeds/videos.xml", timedelta(minutes=3), 15, _videos, "application/atom+xml")
FEEDS = {feed.path: feed for feed in (JOBS, NEWS, EVENTS, VIDEOS)}


def source_specs(site: str) -> list[sources.SourceSpec]:
    """The demo's sources on ``site`` (e.g. http://127.0.0.1:8780)."""
    return [
        sources.make_spec(f"{site}{JOBS.path}", source_type=SourceType.RSS, name="Demo job board",
                          interval=INTERVAL_MINUTES, category="jobs"),
        sources.make_spec(f"{site}{NEWS.path}", source_type=SourceType.RSS, name="Demo news",
                          interval=INTERVAL_MINUTES, category="news"),
        sources.make_spec(f"{site}{EVENTS.path}", source_type=SourceType.PAGE, name="Demo events page",
                          interval=INTERVAL_MINUTES, category="events",
                          config={"item": "li.event", "title": "h3", "link": "a", "summary": ".blurb",
                                  "price": ".price"}),
        sources.make_spec(f"{site}/channel/{CHANNEL_ID}", source_type=SourceType.YOUTUBE, name="Demo channel",
                          interval=INTERVAL_MINUTES, category="video"),
    ]


def seed(conn: sa.Connection, site: str) -> dict[str, Any]:
    """Add the demo sources, user and filters where missing; safe to run on every start.
    The demo user's matches get an output feed when the user is added: its token is
    returned (``feed_token``) to be shown, since it is never shown again."""
    added = sources.import_sources(conn, source_specs(site)).added
    t = schema.users
    filters = 0
    token = None
    if conn.execute(sa.select(t.c.id).where(t.c.name == DEMO_USER)).first() is None:
        users.add_user(conn, DEMO_USER, webhook=f"{site}/hook", secret=DEMO_SECRET)
        for query in DEMO_FILTERS:
            users.add_filter(conn, DEMO_USER, query)
            filters += 1
        users.add_filter(conn, DEMO_USER, DEMO_WATCH, changes=True)
        filters += 1
        token = feeds.add_feed(conn, DEMO_USER).token
        # The demo user owns the job board: told should it fail (and recover).
        board = conn.execute(sa.select(schema.sources.c.id).where(schema.sources.c.url == source_specs(site)[0].url))
        sources.set_owner(conn, board.scalar_one(), DEMO_USER)
    if conn.execute(sa.select(t.c.id).where(t.c.name == DIGEST_USER)).first() is None:
        users.add_user(conn, DIGEST_USER, webhook=f"{site}/hook", secret=DEMO_SECRET)
        users.set_delivery(conn, DIGEST_USER, digest=DIGEST_AT)
        users.add_filter(conn, DIGEST_USER, DIGEST_FILTER)
        filters += 1
    return {"sources_added": added, "filters_added": filters, "feed_token": token}

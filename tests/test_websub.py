"""WebSub: a feed that advertises a hub is subscribed to from its fetch, the hub's
verification of intent is answered only for what we asked, pushes signed with the
subscription's secret land in listings_raw as the same items a poll would store, and a
pushed source is polled only as a safety net. The hub is this test's own (a real HTTP
server on 127.0.0.1 taking subscriptions; the test does what a hub then does: verify,
publish), and `pipeline serve`'s application answers on a real port."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode

import httpx
import pytest
import sqlalchemy as sa

from pipeline.catalogue import sources, users
from pipeline.core.settings import Settings
from pipeline.fetching import websub
from pipeline.fetching.collector import Collector
from pipeline.net.http import FetchResult
from pipeline.storage import counters, schema
from pipeline.web.app import FeedApp
from tests.helpers import add_source, served, wait_until
from tests.http_server import LocalServer
from tests.test_cli import run
from tests.test_notifier import SECRET


def feed(hub: str, topic: str, items: list[tuple[str, str]], *, advertise: bool = True) -> bytes:
    links = (f'<atom:link rel="hub" href="{hub}"/><atom:link rel="self" href="{topic}"/>' if advertise else "")
    entries = "".join(f"<item><guid>{g}</guid><title>{t}</title><link>http://127.0.0.1/{g}</link></item>"
                      for g, t in items)
    return (f'<?xml version="1.0"?><rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom"><channel>'
            f"<title>Jobs</title>{links}{entries}</channel></rss>").encode()


@pytest.fixture
def callback(engine) -> Iterator[str]:
    """`pipeline serve`'s application on a free port (a thread): the callback's base URL."""
    settings = Settings(database_url=str(engine.url), max_response_bytes=20_000, allow_networks=("127.0.0.1/32",))
    with served(FeedApp(engine, settings=settings)) as url:
        yield url


@pytest.fixture
def hub() -> Iterator[LocalServer]:
    """The feed's site and its hub: /hub takes subscription requests (202), as hubs do."""
    srv = LocalServer().start()
    srv.routes["/hub"] = lambda h: h.reply(202)
    yield srv
    srv.stop()


def subscribed(engine: sa.Engine, hub: LocalServer, callback: str, *, verify: bool) -> tuple[int, dict[str, str]]:
    """A source of a feed that advertises ``hub``, fetched once: its id and what it
    asked the hub (verified by the hub when ``verify``)."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("a", "First")]))
    with engine.begin() as conn:
        source_id = add_source(conn, topic)
    collector(engine, callback).run()
    [asked] = requests_to_hub(hub)
    if verify:
        assert httpx.get(asked["hub.callback"] + "?" + urlencode(
            {"hub.mode": "subscribe", "hub.topic": topic, "hub.challenge": "c"})).text == "c"
    return source_id, asked


def collector(engine: sa.Engine, callback: str) -> Collector:
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",),
                        websub_callback_url=callback, websub_safety_hours=6)
    return Collector(engine, settings, "test", random_unit=lambda: 0.5)


def requests_to_hub(hub: LocalServer) -> list[dict[str, str]]:
    return [{k: v[0] for k, v in parse_qs(r["body"].decode()).items()}
            for r in hub.requests if r["method"] == "POST" and r["path"] == "/hub"]


def raw_titles(engine: sa.Engine) -> list[str]:
    t = schema.listings_raw
    with engine.connect() as conn:
        return [r["title"] for r in conn.execute(sa.select(t.c.raw_json).order_by(t.c.id)).scalars()]


def signature(secret: str, body: bytes, method: str = "sha256") -> str:
    return f"{method}={hmac.new(secret.encode(), body, getattr(hashlib, method)).hexdigest()}"


def test_a_feed_with_a_hub_is_subscribed_verified_and_pushed_to_once(engine, hub, callback):
    """Waits for a state: the pushed item's alert, which the service's own thread
    delivers after the push is answered."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("a", "First")]),
                                            {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        source_id = add_source(conn, topic)
        users.add_user(conn, "alice", webhook=hub.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "second")
    hub.routes["/hook"] = lambda h: h.reply(204)
    assert collector(engine, callback).run().succeeded == 1
    [asked] = requests_to_hub(hub)
    assert (asked["hub.mode"], asked["hub.topic"]) == ("subscribe", topic)
    assert asked["hub.callback"].startswith(f"{callback}/websub/") and len(asked["hub.secret"]) >= 32
    secret = asked["hub.secret"]

    # The hub verifies intent: only the mode and topic asked for, on that token.
    def verification(**params: str) -> httpx.Response:
        return httpx.get(asked["hub.callback"] + "?" + urlencode(params))

    assert verification(**{"hub.mode": "subscribe", "hub.topic": hub.url("/other"),
                           "hub.challenge": "x"}).status_code == 404
    assert verification(**{"hub.mode": "unsubscribe", "hub.topic": topic, "hub.challenge": "x"}).status_code == 404
    assert httpx.get(f"{callback}/websub/{'A' * 43}?hub.mode=subscribe&hub.challenge=x").status_code == 404
    answer = verification(**{"hub.mode": "subscribe", "hub.topic": topic, "hub.challenge": "c-123",
                             "hub.lease_seconds": "864000"})
    assert (answer.status_code, answer.text) == (200, "c-123")
    with engine.connect() as conn:
        assert websub.pushed(conn, [source_id], datetime.now(UTC)) == {source_id}

    # The hub publishes: the new item lands at once, the old one is not stored again.
    body = feed(hub_url, topic, [("b", "Second"), ("a", "First")])
    pushed = httpx.post(asked["hub.callback"], content=body,
                        headers={"Content-Type": "application/rss+xml", "X-Hub-Signature": signature(secret, body)})
    assert pushed.status_code == 202 and raw_titles(engine) == ["First", "Second"]
    # Processed and notified at once by the service itself: no stage run, no sensor tick.
    delivered = wait_until("the pushed item's alert", lambda: [
        json.loads(r["body"]) for r in hub.requests if r["path"] == "/hook"], timeout=60, every=0.05)
    assert [d["listing"]["title"] for d in delivered] == ["Second"]
    for method in ("sha1", "sha384", "sha512"):  # every algorithm the Recommendation names
        again = feed(hub_url, topic, [(f"{method}", method)])
        assert httpx.post(asked["hub.callback"], content=again,
                          headers={"X-Hub-Signature": signature(secret, again, method)}).status_code == 202
    assert raw_titles(engine)[-3:] == ["sha1", "sha384", "sha512"]

    # Forged, unsigned or oversized pushes: acknowledged (or refused for size), never stored.
    forged = feed(hub_url, topic, [("x", "Forged")])
    for headers in ({"X-Hub-Signature": signature("not-the-secret", forged)}, {},
                    {"X-Hub-Signature": "md5=" + hashlib.md5(forged).hexdigest()}):
        assert httpx.post(asked["hub.callback"], content=forged, headers=headers).status_code == 202
    big = b"x" * 30_000
    assert httpx.post(asked["hub.callback"], content=big,
                      headers={"X-Hub-Signature": signature(secret, big)}).status_code == 413
    assert "Forged" not in raw_titles(engine)
    with engine.connect() as conn:  # every push counted, every refusal by why
        counted = counters.totals(conn, [counters.WEBSUB_PUSHES.name])
    assert {label: int(v) for (_, label), v in counted.items() if v} == {
        "taken": 4, "bad_signature": 3, "too_large": 1}
    assert httpx.post(f"{callback}/websub/{'A' * 43}", content=body,
                      headers={"X-Hub-Signature": signature(secret, body)}).status_code == 410, "not ours"

    # The next poll finds the pushed item already stored, and is put off to the safety cadence.
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("b", "Second"), ("a", "First")]),
                                            {"Content-Type": "application/rss+xml"})
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    polled = collector(engine, callback).run()
    assert polled.items_new == 0 and len(raw_titles(engine)) == 5
    with engine.connect() as conn:
        next_fetch = conn.execute(sa.select(schema.sources.c.next_fetch_at)).scalar_one()
    assert next_fetch > datetime.now(UTC) + timedelta(hours=5), "pushed: polled every 6 hours"
    assert len(requests_to_hub(hub)) == 1, "verified and leased: not asked again"
    shown = run("sources", "show", str(source_id), env={"DATABASE_URL": engine.url.render_as_string(False)})
    assert f"WebSub: pushed by {hub_url} until " in shown.stdout and "(pushes: 4, the last " in shown.stdout
    status = run("status", env={"DATABASE_URL": engine.url.render_as_string(False)}).stdout
    assert "pushed         1 by their hubs (WebSub; the first lease ends in 10.0 days), 0 awaiting" in status


def test_a_lapsed_or_denied_subscription_is_asked_again_and_the_source_polls_on_its_own_cadence(engine, hub,
                                                                                                 callback):
    topic = hub.url("/feed")
    source_id, asked = subscribed(engine, hub, callback, verify=False)
    denied = httpx.get(asked["hub.callback"] + "?" + urlencode({"hub.mode": "denied", "hub.topic": topic,
                                                                   "hub.reason": "not here"}))
    assert denied.status_code == 200
    t = schema.websub_subscriptions
    with engine.connect() as conn:
        assert conn.execute(sa.select(t.c.state, t.c.last_error)).one() == ("denied", "the hub denied it: not here")
    # A day on, asked again; an active lease about to end is renewed; then it lapses.
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(requested_at=datetime.now(UTC) - timedelta(days=2)))
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    collector(engine, callback).run()
    assert len(requests_to_hub(hub)) == 2
    with engine.begin() as conn:  # verified: then its lease nears its end
        conn.execute(sa.update(t).values(state="active", requested_at=datetime.now(UTC) - timedelta(days=6),
                                         lease_until=datetime.now(UTC) + timedelta(hours=12)))
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
        token, secret = conn.execute(sa.select(t.c.callback_token, t.c.secret)).one()
    collector(engine, callback).run()
    assert len(requests_to_hub(hub)) == 3, "a lease ending within a day is renewed at the next fetch"
    with engine.connect() as conn:  # a renewal keeps the callback, its secret and pushes going
        assert conn.execute(sa.select(t.c.callback_token, t.c.secret, t.c.state)).one() == (token, secret, "active")
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(lease_until=datetime.now(UTC) - timedelta(minutes=1)))
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    collector(engine, callback).run()
    with engine.connect() as conn:
        next_fetch = conn.execute(sa.select(schema.sources.c.next_fetch_at)).scalar_one()
        assert not websub.pushed(conn, [source_id], datetime.now(UTC))
    assert next_fetch < datetime.now(UTC) + timedelta(hours=2), "not pushed: its own hourly cadence"


def test_a_disabled_source_s_pushes_end_its_subscription(engine, hub, callback):
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    source_id, asked = subscribed(engine, hub, callback, verify=True)
    with engine.begin() as conn:
        sources.disable_source(conn, source_id)
    body = feed(hub_url, topic, [("b", "Second")])
    answer = httpx.post(asked["hub.callback"], content=body,
                        headers={"X-Hub-Signature": signature(asked["hub.secret"], body)})
    assert answer.status_code == 410 and raw_titles(engine) == ["First"]
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.websub_subscriptions)).scalar_one() == 0


def test_a_hub_is_found_in_link_headers_first_then_in_the_document():
    def result(body: bytes, links: dict[str, str] | None = None) -> FetchResult:
        return FetchResult(url="http://127.0.0.1/feed", status=200, body=body, content_type=None, etag=None,
                           last_modified=None, moved_to=None, elapsed_ms=0, links=links or {})

    assert websub.discover(result(b"<feed/>", {"hub": "https://hub.example/", "self": "https://x.example/f"})) == (
        "https://hub.example/", "https://x.example/f")
    assert websub.discover(result(b"<feed><link rel='hub' href='/hub'/></feed>")) == (
        "http://127.0.0.1/hub", "http://127.0.0.1/feed")
    assert websub.discover(result(b'<feed><link href="javascript:x" rel="hub"/></feed>')) == (None, None)
    assert websub.discover(result(b"<rss><channel><title>t</title></channel></rss>")) == (None, None)


def test_no_subscription_without_a_callback_url(engine, hub):
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("a", "First")]))
    with engine.begin() as conn:
        add_source(conn, topic)
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",))
    assert Collector(engine, settings, "test").run().succeeded == 1
    assert requests_to_hub(hub) == []


def test_a_hub_named_in_the_link_header_is_subscribed_to(engine, hub, callback):
    """websub.rocks 100: the hub and topic in HTTP Link headers, none in the document."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("a", "First")], advertise=False), {
        "Content-Type": "application/rss+xml", "Link": f'<{hub_url}>; rel="hub", <{topic}>; rel="self"'})
    with engine.begin() as conn:
        add_source(conn, topic)
    collector(engine, callback).run()
    [asked] = requests_to_hub(hub)
    assert (asked["hub.mode"], asked["hub.topic"]) == ("subscribe", topic)

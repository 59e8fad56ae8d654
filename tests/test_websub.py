"""WebSub: a feed that advertises a hub is subscribed to from its fetch, the hub's
verification of intent is answered only for what we asked, pushes signed with the
subscription's secret land in listings_raw as the same items a poll would store, and a
pushed source is polled only as a safety net. The hub is this test's own (a real HTTP
server on 127.0.0.1 taking subscriptions; the test does what a hub then does: verify,
publish), and `pipeline serve`'s application answers on a real port."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlencode

import httpx
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.catalogue import sources, users
from pipeline.core.settings import Settings
from pipeline.fetching import websub, youtube
from pipeline.fetching.collector import Collector
from pipeline.net.http import Fetcher, FetchResult
from pipeline.queue.claim import WorkQueue
from pipeline.storage import counters, schema
from pipeline.web.app import FeedApp
from tests.helpers import add_source, served, wait_until
from tests.http_server import LocalServer
from tests.test_cli import run
from tests.test_notifier import SECRET
from tests.test_youtube import atom


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


def _totals(engine: sa.Engine, name: str) -> dict[tuple[str, str], float]:
    with engine.connect() as conn:
        return counters.totals(conn, [name])


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
    verifications = {label: v for (_, label), v in _totals(engine, counters.WEBSUB_VERIFICATIONS.name).items() if v}
    assert verifications == {"refused": 3, "subscribed": 1}, "every verification counted, refusals by name"
    assert {label: v for (_, label), v in _totals(engine, counters.WEBSUB_HUB_REQUESTS.name).items() if v} == {
        "subscribe": 1}

    # The hub publishes: the new item lands at once, the old one is not stored again.
    body = feed(hub_url, topic, [("b", "Second"), ("a", "First")])
    pushed = httpx.post(asked["hub.callback"], content=body,
                        headers={"Content-Type": "application/rss+xml", "X-Hub-Signature": signature(secret, body)})
    assert pushed.status_code == 202 and raw_titles(engine) == ["First", "Second"]
    # Processed and notified at once by the service itself: no stage run, no sensor tick.
    delivered = wait_until("the pushed item's alert", lambda: [
        json.loads(r["body"]) for r in hub.requests if r["path"] == "/hook"], timeout=60, every=0.05)
    assert [d["listing"]["title"] for d in delivered] == ["Second"]
    # How long it took, in the metrics: one alert, within the histogram's buckets.
    name = counters.PUSH_TO_DELIVERY.bucket_series
    observed = wait_until("the push's delivery counted", lambda: {
        label: v for (_, label), v in _totals(engine, name).items() if v}, timeout=60, every=0.05)
    assert sum(observed.values()) == 1 and "+Inf" not in observed
    for method in ("sha1", "sha384", "sha512"):  # every algorithm the Recommendation names
        again = feed(hub_url, topic, [(f"{method}", method)])
        assert httpx.post(asked["hub.callback"], content=again,
                          headers={"X-Hub-Signature": signature(secret, again, method)}).status_code == 202
    assert raw_titles(engine)[-3:] == ["sha1", "sha384", "sha512"]

    # Forged, unsigned or oversized pushes: acknowledged (or refused for size), never stored.
    forged = feed(hub_url, topic, [("x", "Forged")])
    for headers in ({"X-Hub-Signature": signature("not-the-secret", forged)}, {},
                    {"X-Hub-Signature": "md5=" + hashlib.md5(forged).hexdigest()},
                    {"X-Hub-Signature": "sha256=\u00e9t\u00e9".encode()}):  # answered 500: a str compare raised
        assert httpx.post(asked["hub.callback"], content=forged, headers=headers).status_code == 202
    big = b"x" * 30_000
    assert httpx.post(asked["hub.callback"], content=big,
                      headers={"X-Hub-Signature": signature(secret, big)}).status_code == 413
    assert "Forged" not in raw_titles(engine)
    with engine.connect() as conn:  # every push counted, every refusal by why
        counted = counters.totals(conn, [counters.WEBSUB_PUSHES.name])
    assert {label: int(v) for (_, label), v in counted.items() if v} == {
        "taken": 4, "bad_signature": 4, "too_large": 1}
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
    assert timedelta(hours=3.9) < next_fetch - datetime.now(UTC) <= timedelta(hours=4), (
        "pushed: polled every 4 of its intervals (hourly here), at most every 6 hours")
    assert len(requests_to_hub(hub)) == 1, "verified and leased: not asked again"
    shown = run("sources", "show", str(source_id), env={"DATABASE_URL": engine.url.render_as_string(False)})
    assert f"WebSub: pushed by {hub_url} until " in shown.stdout and "(pushes: 4, the last " in shown.stdout
    status = run("status", env={"DATABASE_URL": engine.url.render_as_string(False)}).stdout
    assert "pushed         1 by their hubs (WebSub; the first lease ends in 10.0 days), 0 awaiting" in status


def make_due(engine: sa.Engine, **values: object) -> None:
    """The subscription's next request to its hub is due now (as time would make it)."""
    with engine.begin() as conn:
        conn.execute(sa.update(schema.websub_subscriptions).values(due_at=datetime.now(UTC) - timedelta(seconds=1),
                                                                   **values))


def subscription(engine: sa.Engine) -> sa.Row:
    t = schema.websub_subscriptions
    with engine.connect() as conn:
        return conn.execute(sa.select(t)).one()


def test_what_a_hub_is_asked_is_claimed_work_retried_renewed_and_lapsing_to_the_own_cadence(engine, hub, callback):
    """websub.rocks 300-series (verification, renewal): what a hub is asked is due in a
    claim queue (WEBSUB_DUE), taken by the collector's runs whether or not a source is
    due; a denial is asked again a day on, a request not verified again later (doubling),
    a verified lease renewed ahead of its end with the same callback and a new secret."""
    topic = hub.url("/feed")
    source_id, asked = subscribed(engine, hub, callback, verify=False)
    with engine.begin() as conn:  # no source is due from here on: only the queue's work
        conn.execute(sa.update(schema.sources).values(next_fetch_at=datetime.now(UTC) + timedelta(hours=1)))
    before = datetime.now(UTC)
    assert subscription(engine).due_at > before + timedelta(minutes=59), "waits an hour for the verification"
    make_due(engine)
    assert collector(engine, callback).run().hub_requests == 1
    assert requests_to_hub(hub)[-1] == asked, "not verified: asked again, the same callback and secret"
    assert subscription(engine).due_at > before + timedelta(hours=1, minutes=59), "then two hours"

    denied = httpx.get(asked["hub.callback"] + "?" + urlencode({"hub.mode": "denied", "hub.topic": topic,
                                                                   "hub.reason": "not here"}))
    assert denied.status_code == 200
    row = subscription(engine)
    assert (row.state, row.last_error) == ("denied", "the hub denied it: not here")
    assert row.due_at > before + timedelta(hours=23), "a denial is asked again a day on"
    make_due(engine)
    collector(engine, callback).run()
    assert len(requests_to_hub(hub)) == 3

    answer = httpx.get(asked["hub.callback"] + "?" + urlencode({"hub.mode": "subscribe", "hub.topic": topic,
                                                                   "hub.challenge": "c", "hub.lease_seconds": "3600"}))
    assert answer.text == "c"
    row = subscription(engine)
    assert row.state == "active" and row.attempts == 0
    # A short lease is renewed a fifth of it before its end: 48 minutes on.
    assert timedelta(minutes=47) < row.due_at - before < timedelta(minutes=49)
    make_due(engine)
    collector(engine, callback).run()
    renewal = requests_to_hub(hub)[-1]
    assert len(requests_to_hub(hub)) == 4 and renewal == {**asked, "hub.lease_seconds": "604800",
                                                          "hub.secret": renewal["hub.secret"]}
    assert renewal["hub.secret"] != asked["hub.secret"], "a renewal brings a new secret (replays)"
    assert subscription(engine).state == "active", "a renewal keeps the callback and pushes going"
    assert collector(engine, callback).run().hub_requests == 0, "renewed: nothing due until it is verified or late"

    with engine.begin() as conn:  # the lease runs out unrenewed: polled on its own cadence
        conn.execute(sa.update(schema.websub_subscriptions).values(
            lease_until=datetime.now(UTC) - timedelta(minutes=1)))
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    collector(engine, callback).run()
    with engine.connect() as conn:
        next_fetch = conn.execute(sa.select(schema.sources.c.next_fetch_at)).scalar_one()
        assert not websub.pushed(conn, [source_id], datetime.now(UTC))
    assert next_fetch < datetime.now(UTC) + timedelta(hours=2), "not pushed: its own hourly cadence"


def push(asked: dict[str, str], body: bytes, secret: str) -> int:
    return httpx.post(asked["hub.callback"], content=body, headers={"X-Hub-Signature": signature(secret, body)}).status_code


def test_a_captured_push_sent_again_never_puts_a_listing_back_in_time(engine, hub, callback):
    """A push is signed, not dated: one captured and sent again verified, and put its
    item back to the text a later push replaced until the next poll. Every way of
    sending one again: at once, after a newer push, after a renewal gave the
    subscription a new secret (the old one verifies only until the hub has the new one
    and the overlap ends); and the digests kept are only those a secret still accepted
    could sign."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    source_id, asked = subscribed(engine, hub, callback, verify=True)
    old_secret = asked["hub.secret"]
    first, second = (feed(hub_url, topic, [("a", text)]) for text in ("Old text", "New text"))
    assert push(asked, first, old_secret) == 202 and push(asked, second, old_secret) == 202
    assert raw_titles(engine)[-2:] == ["Old text", "New text"]
    for replay in (second, first, first):
        assert push(asked, replay, old_secret) == 202, "acknowledged, as any push the hub may retry"
    assert raw_titles(engine)[-1] == "New text" and len(raw_titles(engine)) == 3, "nothing stored again"
    with engine.connect() as conn:
        counted = {label: int(v) for (_, label), v in counters.totals(conn, [counters.WEBSUB_PUSHES.name]).items() if v}
    assert counted == {"taken": 2, "repeated": 3}

    # A renewal brings a new secret; the old one verifies until the hub has the new one.
    make_due(engine)
    collector(engine, callback).run()
    new_secret = requests_to_hub(hub)[-1]["hub.secret"]
    assert new_secret != old_secret
    third, fourth, fifth = (feed(hub_url, topic, [("a", text)]) for text in ("Third", "Fourth", "Fifth"))
    assert push(asked, third, old_secret) == 202 and raw_titles(engine)[-1] == "Third", "sent before the renewal"
    assert push(asked, fourth, new_secret) == 202 and raw_titles(engine)[-1] == "Fourth"
    assert httpx.get(asked["hub.callback"] + "?" + urlencode(
        {"hub.mode": "subscribe", "hub.topic": topic, "hub.challenge": "c", "hub.lease_seconds": "864000"})).text == "c"
    overlap_end = subscription(engine).previous_secret_until
    assert overlap_end - datetime.now(UTC) <= websub.ROTATION_OVERLAP
    with engine.begin() as conn:  # the overlap ends, as time would end it
        conn.execute(sa.update(schema.websub_subscriptions).values(
            previous_secret_until=datetime.now(UTC) - timedelta(seconds=1)))
    for replay in (first, third, fifth):  # captured ones, and one the old secret signs now
        assert push(asked, replay, old_secret) == 202
    assert raw_titles(engine)[-1] == "Fourth" and len(raw_titles(engine)) == 5
    assert push(asked, fifth, new_secret) == 202 and raw_titles(engine)[-1] == "Fifth"

    # The next renewal forgets what only the retired secret signed (before the current
    # secret was made); what the current one may have signed is kept.
    p = schema.websub_pushes
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(p)).scalar_one() == 5
    make_due(engine)
    collector(engine, callback).run()
    assert requests_to_hub(hub)[-1]["hub.secret"] not in (old_secret, new_secret)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(p)).scalar_one() == 3, "Third, Fourth, Fifth"
    assert source_id


def test_a_hub_that_forgets_its_subscriber_is_found_out_by_the_next_poll_and_asked_again(engine, hub, callback):
    """Push cannot go silent: the hub forgot the subscription (a restart without storage)
    and pushes nothing while the feed publishes. The safety poll, four of the source's
    intervals on (not a fixed 6 hours), finds an item no push brought: counted as
    missed by push, the hub asked again at once, the source polled at its own cadence
    until a push comes; `sources show`, `status`, the metric and the `push_health`
    check say so, and a push puts it back to the safety cadence. A subscription that
    has heard no push for long is asked again too."""
    from assets.checks import ASSET_CHECKS
    from resources import PipelineDatabase

    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    source_id, asked = subscribed(engine, hub, callback, verify=True)
    env = {"DATABASE_URL": engine.url.render_as_string(False)}

    def poll(items: list[tuple[str, str]]) -> timedelta:
        """A poll (made due now) of the feed listing ``items``; how far off the next is."""
        hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, items), {"Content-Type": "application/rss+xml"})
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
        assert collector(engine, callback).run().succeeded == 1
        with engine.connect() as conn:
            return conn.execute(sa.select(schema.sources.c.next_fetch_at)).scalar_one() - datetime.now(UTC)

    def push_check() -> tuple[bool, str | None]:
        [definition] = [d for d in ASSET_CHECKS if any(k.name == "push_health" for k in d.check_keys)]
        found = definition(database=PipelineDatabase(database_url=env["DATABASE_URL"]))
        return found.passed, found.description

    assert timedelta(hours=3.9) < poll([("a", "First")]) <= timedelta(hours=4), "pushed: the safety cadence"
    assert push_check() == (True, None)
    # The hub forgot us; the feed publishes two items that no push brings.
    assert poll([("c", "Third"), ("b", "Second"), ("a", "First")]) <= timedelta(hours=1), "its own cadence"
    row = subscription(engine)
    assert (row.missed, row.state) == (2, "active")
    again = requests_to_hub(hub)
    assert again == [asked, {**asked, "hub.secret": again[1]["hub.secret"]}], (
        "asked again at once, in the same run: the same callback (a new secret: replays)")
    assert {label: v for (_, label), v in _totals(engine, counters.WEBSUB_MISSED_ITEMS.name).items()} == {"": 2}
    shown = run("sources", "show", str(source_id), env=env).stdout
    assert "push health: missed: polled at its own cadence, the hub asked again, until a push comes;" \
           " 2 items found by polls that no push brought" in shown, shown
    assert "push trouble   1 missing pushes" in run("status", env=env).stdout
    scraped = run("metrics", env=env).stdout
    assert 'pipeline_websub_subscriptions{health="missed"} 1.0' in scraped and \
           "pipeline_websub_missed_items_total 2.0" in scraped
    assert push_check() == (False, "1 subscriptions in trouble: 1 missed")
    assert poll([("c", "Third"), ("b", "Second"), ("a", "First")]) <= timedelta(hours=1), "no push yet: own cadence"

    # The hub verifies again and pushes: trusted again, polled at the safety cadence.
    body = feed(hub_url, topic, [("d", "Fourth")])
    assert httpx.post(asked["hub.callback"], content=body, headers={
        "Content-Type": "application/rss+xml", "X-Hub-Signature": signature(asked["hub.secret"], body)}).status_code == 202
    assert push_check() == (True, None)
    assert poll([("d", "Fourth"), ("c", "Third")]) > timedelta(hours=3.9)
    assert "push health: pushed;" in run("sources", "show", str(source_id), env=env).stdout

    # Silent for long (no push for over a day, its source hourly): the hub is asked again.
    with engine.begin() as conn:
        conn.execute(sa.update(schema.websub_subscriptions).values(
            missed_at=datetime.now(UTC) - timedelta(days=3), last_push_at=datetime.now(UTC) - timedelta(days=2),
            verified_at=datetime.now(UTC) - timedelta(days=2)))
    asked_before = len(requests_to_hub(hub))
    poll([("d", "Fourth"), ("c", "Third")])
    assert len(requests_to_hub(hub)) == asked_before + 1, "silent for long: asked again"


def test_a_hub_that_refuses_a_request_is_asked_again_later_and_others_are_asked_meanwhile(engine, hub, callback):
    """One hub's trouble stops no other: its refusal is recorded and retried later."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    hub.routes["/hub"] = lambda h: h.reply(503)
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub_url, topic, [("a", "First")]))
    hub.routes["/other"] = lambda h: h.reply(200, feed(hub.url("/hub2"), hub.url("/other"), [("b", "Other")]))
    hub.routes["/hub2"] = lambda h: h.reply(202)
    with engine.begin() as conn:
        add_source(conn, topic)
        add_source(conn, hub.url("/other"))
    assert collector(engine, callback).run().hub_requests == 2
    t = schema.websub_subscriptions
    with engine.connect() as conn:
        rows = {r.topic: r for r in conn.execute(sa.select(t))}
    assert rows[topic].last_error.startswith("the hub refused to subscribe: ")
    assert rows[hub.url("/other")].last_error is None
    assert sorted(r["path"] for r in hub.requests if r["method"] == "POST") == ["/hub", "/hub2"]
    assert {label: v for (_, label), v in _totals(engine, counters.WEBSUB_HUB_REQUESTS.name).items() if v} == {
        "subscribe": 1, "failed": 1}
    make_due(engine)
    hub.routes["/hub"] = lambda h: h.reply(202)
    assert collector(engine, callback).run().hub_requests == 2, "asked again when due"


def test_subscriptions_waiting_behind_a_slow_hub_keep_their_claim(engine, hub, callback):
    """A claim's subscriptions are asked one after another, each up to a request's
    timeout: those waiting keep their leases (extended while the slow hub is asked), so
    no other worker asks their hubs as well. Their leases ran out instead. Waits for two
    extensions of a 3 s lease: the extension is the product's timer, and what is tested
    is that it keeps the claim."""
    hub.routes["/feed"] = lambda h: h.reply(200, feed(hub.url("/hub"), hub.url("/feed"), [("a", "First")]))
    hub.routes["/other"] = lambda h: h.reply(200, feed(hub.url("/hub"), hub.url("/other"), [("b", "Other")]))
    with engine.begin() as conn:
        add_source(conn, hub.url("/feed"))
        add_source(conn, hub.url("/other"))
    assert collector(engine, callback).run().hub_requests == 2
    make_due(engine)
    release = threading.Event()
    hub.routes["/hub"] = lambda h: (release.wait(120), h.reply(202))
    slow = collector(engine, callback)
    slow.settings = dataclasses.replace(slow.settings, lease_seconds=3)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(slow.run()))
    worker.start()
    other = WorkQueue(engine, schema.WEBSUB_DUE, lease_seconds=3)
    t = schema.websub_subscriptions
    try:
        wait_until("the slow hub to be asked", lambda: len(requests_to_hub(hub)) == 3, timeout=60, every=0.05)
        with engine.connect() as conn:
            first = conn.execute(sa.select(t.c.locked_until).where(t.c.claimed_by.is_not(None))).scalar_one()
        seen: set = set()

        def extended_twice() -> bool:
            assert not other.claim("other-worker", 10), "a waiting subscription was taken over"
            with engine.connect() as conn:
                seen.update(conn.execute(sa.select(t.c.locked_until).where(t.c.claimed_by.is_not(None))).scalars())
            return len({stamp for stamp in seen if stamp is not None and stamp > first}) >= 2

        wait_until("the waiting lease to be extended twice", extended_twice, timeout=60, every=0.2)
    finally:
        release.set()
        worker.join(60)
    assert result[0].hub_requests == 2 and len(requests_to_hub(hub)) == 4, "each hub asked once"


def test_a_disabled_or_removed_source_s_hub_is_asked_to_stop(engine, hub, callback):
    """websub.rocks 300-series (unsubscribing): the hub is asked to unsubscribe, and
    its verification of that is echoed only for what we asked; a push meanwhile is 410."""
    topic, hub_url = hub.url("/feed"), hub.url("/hub")
    source_id, asked = subscribed(engine, hub, callback, verify=True)
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=datetime.now(UTC) + timedelta(hours=1)))
    bystander = httpx.get(asked["hub.callback"] + "?" + urlencode(
        {"hub.mode": "unsubscribe", "hub.topic": topic, "hub.challenge": "x"}))
    assert bystander.status_code == 404, "an unsubscription nobody asked for"
    with engine.begin() as conn:
        sources.disable_source(conn, source_id)
    body = feed(hub_url, topic, [("b", "Second")])
    answer = httpx.post(asked["hub.callback"], content=body,
                        headers={"X-Hub-Signature": signature(asked["hub.secret"], body)})
    assert answer.status_code == 410 and raw_titles(engine) == ["First"]
    assert collector(engine, callback).run().hub_requests == 1
    ending = requests_to_hub(hub)[-1]
    assert ending == {"hub.mode": "unsubscribe", "hub.topic": topic, "hub.callback": asked["hub.callback"]}
    assert "asking " + hub_url + " to stop pushing" in run(
        "sources", "show", str(source_id), env={"DATABASE_URL": engine.url.render_as_string(False)}).stdout
    assert httpx.get(asked["hub.callback"] + "?" + urlencode(
        {"hub.mode": "subscribe", "hub.topic": topic, "hub.challenge": "x"})).status_code == 404, "ended"
    confirmed = httpx.get(asked["hub.callback"] + "?" + urlencode(
        {"hub.mode": "unsubscribe", "hub.topic": topic, "hub.challenge": "bye"}))
    assert (confirmed.status_code, confirmed.text) == (200, "bye")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.websub_subscriptions)).scalar_one() == 0

    # Enabled again: subscribed afresh (a new callback); then removed: the hub is told.
    with engine.begin() as conn:
        sources.enable_source(conn, source_id)
    collector(engine, callback).run()
    again = requests_to_hub(hub)[-1]
    assert again["hub.mode"] == "subscribe" and again["hub.callback"] != asked["hub.callback"]
    httpx.get(again["hub.callback"] + "?" + urlencode({"hub.mode": "subscribe", "hub.topic": topic,
                                                       "hub.challenge": "c"}))
    with engine.begin() as conn:
        sources.remove_sources(conn, [source_id])
    assert subscription(engine).source_id is None
    assert collector(engine, callback).run().hub_requests == 1
    assert requests_to_hub(hub)[-1] == {"hub.mode": "unsubscribe", "hub.topic": topic,
                                        "hub.callback": again["hub.callback"]}
    # A hub that never verifies the ending: after five tries the row goes (pushes get 410).
    for _ in range(5):
        make_due(engine)
        collector(engine, callback).run()
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.websub_subscriptions)).scalar_one() == 0
    assert [r["hub.mode"] for r in requests_to_hub(hub)][3:] == ["unsubscribe"] * 5, "five tries in all"


def test_a_source_its_failures_disable_ends_its_subscription_and_one_never_verified_goes_quietly(engine, hub,
                                                                                                 callback):
    source_id, asked = subscribed(engine, hub, callback, verify=True)
    hub.routes["/feed"] = lambda h: h.reply(410)  # gone, the tenth time in a row: the source is disabled
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None, consecutive_failures=9))
    collector(engine, callback).run()
    with engine.connect() as conn:
        assert conn.execute(sa.select(schema.sources.c.enabled)).scalar_one() is False
    assert requests_to_hub(hub)[-1]["hub.mode"] == "unsubscribe"

    with engine.begin() as conn:  # never verified, then disabled: nothing to tell the hub
        other = add_source(conn, hub.url("/feed2"))
    hub.routes["/feed2"] = lambda h: h.reply(200, feed(hub.url("/hub"), hub.url("/feed2"), [("z", "Z")]))
    collector(engine, callback).run()
    asked_before = len(requests_to_hub(hub))
    with engine.begin() as conn:
        sources.disable_source(conn, other)
    collector(engine, callback).run()
    assert len(requests_to_hub(hub)) == asked_before
    t = schema.websub_subscriptions
    with engine.connect() as conn:
        assert conn.execute(sa.select(t.c.source_id)).scalars().all() == [source_id]


def test_a_hub_is_found_in_link_headers_first_then_in_the_document():
    def result(body: bytes, links: dict[str, str] | None = None) -> FetchResult:
        return FetchResult(url="http://127.0.0.1/feed", status=200, body=body, content_type=None, etag=None,
                           last_modified=None, moved_to=None, links=links or {})

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


def test_a_youtube_channel_is_pushed_by_youtube_s_hub_and_a_pushed_video_is_the_polled_one(engine, hub, callback):
    """YouTube's feeds name no hub: a channel's is YouTube's own, with a topic of its own
    (a playlist has none); a mirror (here the test's server) is taken at its word. The
    hub's notification (an Atom entry without the feed's media group) is read by the
    youtube adapter: the video's identity is the poll's."""
    channel = "UCabcdefghijklmnopqrstuv"
    public = youtube.Target("channel", channel, youtube.PUBLIC_ORIGIN)
    assert youtube.hub_for(public, None, (None, None)) == (
        youtube.HUB, f"https://www.youtube.com/xml/feeds/videos.xml?channel_id={channel}")
    handle = youtube.Target("handle", "@name", youtube.PUBLIC_ORIGIN)
    assert youtube.hub_for(handle, channel, ("https://elsewhere/", "x"))[0] == youtube.HUB
    assert youtube.hub_for(youtube.Target("playlist", "PLx", youtube.PUBLIC_ORIGIN), None, (None, None)) == (
        None, None)
    mirror = youtube.Target("channel", channel, hub.url(""))
    assert youtube.hub_for(mirror, None, ("http://127.0.0.1/h", "t")) == ("http://127.0.0.1/h", "t")

    hub_url, topic = hub.url("/hub"), hub.url(f"/xml/feeds/videos.xml?channel_id={channel}")
    hub.routes["/feeds/videos.xml"] = lambda h: h.reply(200, atom(), {
        "Content-Type": "application/atom+xml", "Link": f'<{hub_url}>; rel="hub", <{topic}>; rel="self"'})
    with engine.begin() as conn:
        add_source(conn, hub.url(f"/channel/{channel}"), source_type="youtube")
    collector(engine, callback).run()
    [asked] = requests_to_hub(hub)
    assert asked["hub.topic"] == topic
    httpx.get(asked["hub.callback"] + "?" + urlencode({"hub.mode": "subscribe", "hub.topic": topic,
                                                       "hub.challenge": "c"}))
    # What YouTube's hub pushes for a new upload.
    body = (f'<?xml version="1.0"?><feed xmlns:yt="http://www.youtube.com/xml/schemas/2015"'
            f' xmlns="http://www.w3.org/2005/Atom"><link rel="hub" href="{hub_url}"/><link rel="self" href="{topic}"/>'
            f"<title>YouTube video feed</title><entry><id>yt:video:vidpushed01</id><yt:videoId>vidpushed01"
            f"</yt:videoId><yt:channelId>{channel}</yt:channelId><title>Pushed video</title>"
            f'<link rel="alternate" href="https://www.youtube.com/watch?v=vidpushed01"/>'
            f"<author><name>Chan</name></author><published>2026-11-28T01:00:00+00:00</published>"
            f"<updated>2026-11-28T01:00:05+00:00</updated></entry></feed>").encode()
    assert httpx.post(asked["hub.callback"], content=body, headers={
        "Content-Type": "application/atom+xml", "X-Hub-Signature": signature(asked["hub.secret"], body)}
    ).status_code == 202
    t = schema.listings_raw
    with engine.connect() as conn:
        pushed = conn.execute(sa.select(t.c.source_item_id).order_by(t.c.id.desc()).limit(1)).scalar_one()
    assert pushed == "yt:video:vidpushed01"
    polled = youtube.read_push(atom([("vidpushed01", "Pushed video", "2026-11-28T01:00:00+00:00")]), topic, None)
    assert [item.source_item_id for item in polled] == [pushed]


def test_a_subscription_pushed_to_too_often_is_answered_429_and_others_are_not(engine, hub):
    """Each subscription takes PIPELINE_WEBSUB_PUSHES_PER_MINUTE pushes a minute; more are
    429 with Retry-After (hubs retry), counted, and another subscription's go on. (Three
    requests well inside the window.)"""
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",), websub_pushes_per_minute=2)
    with served(FeedApp(engine, settings=settings)) as url:
        source_id, asked = subscribed(engine, hub, url, verify=True)
        body = feed(hub.url("/hub"), hub.url("/feed"), [("b", "Second")])
        headers = {"X-Hub-Signature": signature(asked["hub.secret"], body)}
        answers = [httpx.post(asked["hub.callback"], content=body, headers=headers) for _ in range(3)]
        assert [a.status_code for a in answers] == [202, 202, 429]
        assert 1 <= int(answers[-1].headers["Retry-After"]) <= 61
        assert httpx.post(f"{url}/websub/{'B' * 43}", content=body, headers=headers).status_code == 410, \
            "another callback has a window of its own"
    with engine.connect() as conn:
        counted = counters.totals(conn, [counters.WEBSUB_PUSHES.name])
    assert counted[(counters.WEBSUB_PUSHES.name, "rate_limited")] == 1


@pytest.fixture
def real_hub(tmp_path) -> Iterator[dict]:
    """Flask-WebSub's hub (from the package index, its tasks run in the request by Celery's
    eager mode) and a publisher's feed that names it in Link headers, served on a real
    port of 127.0.0.1 by a thread; ``publish`` sets the feed and has the hub distribute it."""
    from celery import Celery
    from flask import Flask
    from flask_websub.hub import Hub, SQLite3HubStorage
    from werkzeug.serving import make_server

    app = Flask("test-hub")
    app.config.update(PUBLISH_SUPPORTED=True, HUB_MIN_LEASE_SECONDS=60)
    celery = Celery("test-hub", broker="memory://")
    celery.conf.update(task_always_eager=True)
    websub_hub = Hub(SQLite3HubStorage(str(tmp_path / "hub.db")), celery, SIGNATURE_ALGORITHM="sha512",
                     MAX_ATTEMPTS=1, PUBLISH_SUPPORTED=True)
    app.register_blueprint(websub_hub.build_blueprint(url_prefix="/hub"))
    state = {"feed": b""}
    server = make_server("127.0.0.1", 0, app, threaded=True)
    base = f"http://127.0.0.1:{server.server_port}"
    hub_url, topic = f"{base}/hub", f"{base}/feed"

    @app.route("/feed")
    def the_feed():  # a publisher naming its hub
        return state["feed"], 200, {"Content-Type": "application/rss+xml",
                                    "Link": f'<{hub_url}>; rel="hub", <{topic}>; rel="self"'}

    def publish(items: list[tuple[str, str]]) -> int:
        state["feed"] = feed(hub_url, topic, items, advertise=False)
        return httpx.post(hub_url, data={"hub.mode": "publish", "hub.topic": topic}, timeout=30).status_code

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.update(hub_url=hub_url, topic=topic, publish=publish, callbacks=lambda: list(
        websub_hub.storage.get_callbacks(topic)))
    yield state
    server.shutdown()
    thread.join()


def test_flask_websubs_hub_verifies_pushes_signed_and_ends_a_subscription(engine, real_hub, callback):
    """A hub implementation from the package index, end to end: discovery by Link header,
    subscription and its verification, a publication pushed signed (sha512) and stored,
    then the source removed and the unsubscription verified. (The hub's verification
    and pushes happen inside the requests that cause them: eager tasks.)"""
    real_hub["publish"]([("a", "First")])
    with engine.begin() as conn:
        source_id = add_source(conn, real_hub["topic"])
    stats = collector(engine, callback).run()
    assert (stats.succeeded, stats.hub_requests) == (1, 1)
    row = subscription(engine)
    assert row.state == "active" and row.hub == real_hub["hub_url"], row.last_error
    [(callback_url, _)] = real_hub["callbacks"]()
    assert callback_url.startswith(f"{callback}/websub/")

    assert real_hub["publish"]([("b", "Second"), ("a", "First")]) == 202
    assert raw_titles(engine) == ["First", "Second"], "pushed, signed by the hub, stored once"
    assert subscription(engine).pushes == 1

    with engine.begin() as conn:
        sources.remove_sources(conn, [source_id])
    assert collector(engine, callback).run().hub_requests == 1
    assert real_hub["callbacks"]() == [], "the hub verified the unsubscription and forgot us"
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.websub_subscriptions)).scalar_one() == 0


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_any_signature_header_is_a_verdict_never_an_error(header):
    """Whatever text a hub (or anyone) sends as X-Hub-Signature, the push is signed or
    not: non-ASCII text made compare_digest raise, and the callback answered 500."""
    assert websub.signed("s3cret", b"<rss/>", header) in (True, False)
    assert websub.signed("s3cret", b"<rss/>", "sha256=" + header) in (True, False)


@pytest.mark.parametrize("hub, plain_http_hubs, trusted", [
    ("https://hub.example/", False, True),
    ("http://127.0.0.1:8780/hub", False, True),  # this machine: nothing on the way
    ("http://localhost/hub", False, True),
    ("http://[::1]/hub", False, True),
    ("http://hub.example/", False, False),
    ("http://10.0.0.5/hub", False, False),
    ("http://hub.example/", True, True),  # the operator's setting: a trusted plain-http hub
])
def test_a_subscription_s_secret_goes_over_https_or_to_this_machine_only(hub, plain_http_hubs, trusted):
    settings = Settings(database_url="sqlite://", websub_plain_http_hubs=plain_http_hubs)
    assert websub.trusted(hub, settings) is trusted


def test_a_plain_http_hub_elsewhere_is_never_sent_a_secret(engine, callback):
    """WebSub: the secret SHOULD go over https only. It was sent to any hub, so anyone on
    the way could read it and forge pushes. A feed advertising a plain-http hub is polled
    and never subscribed; a subscription to one made before is let go unasked."""
    site = LocalServer().start()
    try:
        topic = site.url("/feed")
        site.routes["/feed"] = lambda h: h.reply(200, feed("http://hub.example/hub", topic, [("a", "First")]))
        with engine.begin() as conn:
            source_id = add_source(conn, topic)
        collector(engine, callback).run()
        assert raw_titles(engine) == ["First"], "polled as any feed"
    finally:
        site.stop()
    t = schema.websub_subscriptions
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() == 0, "never subscribed"
    with engine.begin() as conn:  # one made before the rule, due for renewal
        conn.execute(sa.insert(t).values(
            source_id=source_id, hub="http://hub.example/hub", topic=topic, callback_token="t" * 43, secret="s" * 43,
            state=websub.ACTIVE, requested_at=datetime.now(UTC), due_at=datetime.now(UTC), attempts=0))

    class NoPost(Fetcher):
        def post(self, *args, **kwargs):
            raise AssertionError("the secret was sent")

    settings = Settings(database_url=str(engine.url), websub_callback_url=callback)
    with NoPost(allow_networks=("127.0.0.1/32",)) as fetcher:
        assert websub.ask_due(engine, settings, fetcher, "test") == 1
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one() == 0, "let go, unasked"

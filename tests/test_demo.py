"""The offline demo's site and seed: every demo source feeds the real pipeline, each
delivery reaches the demo receiver signed, and an unchanged feed costs a 304."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.catalogue import feeds
from pipeline.core.settings import Settings
from pipeline.demo import content
from pipeline.demo.site import DemoSite, parse_site
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier, NotifyStats
from pipeline.storage import schema

# The site's feeds are a function of its clock: pinned, what they show is the same on every
# run (at this moment the job board lists data engineer and machine learning roles, which
# the digest user's filter wants; a window of 20 jobs has none about once in 150 minutes).
SITE_NOW = datetime(2026, 11, 2, 8, 0, tzinfo=UTC)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[DemoSite]:
    clock = [SITE_NOW]  # a test moves it on: site.move_to(...)
    server = DemoSite(0, tmp_path / "deliveries.jsonl", clock=lambda: clock[0])
    server.move_to = lambda moment: clock.__setitem__(0, moment)  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def received(site: DemoSite) -> dict:
    with urllib.request.urlopen(f"{site.url}/deliveries.json", timeout=5) as response:
        return json.loads(response.read())


def test_every_demo_source_feeds_the_pipeline_and_the_receiver_gets_signed_deliveries(engine, site):
    with engine.begin() as conn:
        first = content.seed(conn, site.url)
        assert first == {"sources_added": 4, "filters_added": len(content.DEMO_FILTERS) + 2,
                         "feed_token": first["feed_token"]} and first["feed_token"]
        assert content.seed(conn, site.url) == {"sources_added": 0, "filters_added": 0, "feed_token": None}, \
            "safe on every start"
        owner = conn.execute(sa.select(schema.users.c.name).join(
            schema.source_owners, schema.source_owners.c.user_id == schema.users.c.id)).scalars().all()
        assert owner == [content.DEMO_USER], "the demo user owns the job board"
    # Every delivery one by one: the demo's content, not the alert limits (tests/test_changes.py).
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",), alert_limit=1000)
    collected = Collector(engine, settings, "demo-test").run()
    assert (collected.succeeded, sum(collected.failed.values())) == (4, 0)
    with engine.connect() as conn:
        per_source = dict(conn.execute(
            sa.select(schema.sources.c.source_type, sa.func.count())
            .join(schema.listings_raw, schema.listings_raw.c.source_id == schema.sources.c.id)
            .group_by(schema.sources.c.source_type)
        ).all())
    # 20 jobs + 20 news (rss), 10 events (http), 15 videos (youtube)
    assert per_source == {"rss": 40, "http": 10, "youtube": 15}
    assert Processor(engine, settings, "demo-test").run().inserted == 65
    with engine.connect() as conn:  # the events page's microdata: each event's place and ticket price
        events = conn.execute(sa.select(schema.listings.c.fields).join(schema.sources).where(
            schema.sources.c.source_type == "http")).scalars().all()
    assert len(events) == 10 and all(f["location"] and f["currency"] == "EUR" and f["price"] for f in events)
    notified = Notifier(engine, settings, "demo-test").run()
    n = schema.notifications
    with engine.connect() as conn:
        held = conn.execute(sa.select(n.c.next_attempt_at).where(n.c.status == "held")).scalars().all()
    assert held, "the digest user's matches wait for the daily digest"
    assert notified.sent == notified.notifications_created - len(held) > 0 and notified.dead == 0
    got = received(site)
    assert got["total"] == notified.sent and got["repeats_dropped"] == 0
    with engine.connect() as conn:
        held_by = dict(conn.execute(
            sa.select(schema.users.c.name, sa.func.count()).join(n, n.c.user_id == schema.users.c.id)
            .where(n.c.status == "held").group_by(schema.users.c.name)).all())
    # At 08:00 UTC the digest user's matches go out as one delivery; what passed the
    # other users' alert limits (PIPELINE_ALERT_LIMIT) goes out as one summary each.
    digests = Notifier(engine, settings, "demo-test")
    digests.make_digests(stats := NotifyStats(), now=max(held))
    digests.deliver(stats)
    assert (stats.digests_sent, stats.sent) == (len(held_by), len(held))
    summaries = {r["user"]: r["filter"] for r in received(site)["received"][-len(held_by):]}
    assert summaries == {user: f"digest of {count}" for user, count in held_by.items()}
    assert held_by[content.DIGEST_USER] > 0

    # Nothing new on the site (its clock stands still): each source answers 304.
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    again = Collector(engine, settings, "demo-test").run()
    assert (again.succeeded, again.items_new, again.not_modified) == (4, 0, 4)

    # Four minutes on, the younger events' tickets cost more: the demo user's watching
    # filter tells each price rise of an event it notified them of, once.
    before = received(site)["total"]
    site.move_to(SITE_NOW + content.PRICE_EVERY)
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))
    Collector(engine, settings, "demo-test").run()
    Processor(engine, settings, "demo-test").run()
    Notifier(engine, settings, "demo-test").run()
    changed = [r for r in received(site)["received"][before:] if r.get("event") == "changed"]
    assert changed and all(r["user"] == content.DEMO_USER and r["filter"] == content.DEMO_WATCH for r in changed)
    assert all(r["title"].startswith("Changed: ") and r["title"].endswith(("€15)", "€20)", "€25)")) for r in changed)

    # The demo user's output feed holds what they were told, the price rises too.
    with engine.connect() as conn:
        scope = feeds.resolve(conn, first["feed_token"])
        told = conn.execute(sa.select(sa.func.count()).select_from(n).join(schema.users)
                            .where(schema.users.c.name == content.DEMO_USER)).scalar_one()
    assert scope is not None and scope.user_name == content.DEMO_USER
    shown = feeds.entries(engine, scope)
    assert len(shown) == min(told, feeds.FEED_ENTRIES)
    assert any(e.title.startswith("Changed: ") for e in shown)


def test_the_receiver_refuses_a_bad_signature_and_drops_a_repeat(site):
    from datetime import UTC, datetime, timedelta

    from pipeline.notify.delivery import signed_headers

    body = json.dumps({"notification_id": 7, "user": {"name": "demo"}, "filter": {"keywords": ["python"]},
                       "listing": {"title": "t", "url": "http://127.0.0.1/x"}}).encode()

    def post(headers: dict[str, str]) -> int:
        request = urllib.request.Request(f"{site.url}/hook", data=body, method="POST",
                                         headers={**headers, "Idempotency-Key": "notification-7"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    now = datetime.now(UTC)
    assert post(signed_headers(["another-secret-entirely"], "notification-7", body, now)) == 401
    # A delivery captured and replayed later: its timestamp is past the tolerance.
    assert post(signed_headers([content.DEMO_SECRET], "notification-7", body, now - timedelta(minutes=6))) == 401
    assert post(signed_headers([content.DEMO_SECRET], "notification-7", body, now)) == 204
    assert post(signed_headers([content.DEMO_SECRET], "notification-7", body, now)) == 204
    got = received(site)
    assert (got["total"], got["repeats_dropped"]) == (1, 1)


def test_operator_alerts_sent_as_dev_py_configures_them_reach_the_demo_page(site, monkeypatch):
    """``dev.py up`` makes the demo site the operator's channel: an alert the pipeline
    sends (signed with dev.py's secret, which the site checks) shows on its page; one
    signed otherwise is refused. dev.py cannot import the project: the two secrets are
    held equal here."""
    import dev
    from pipeline.core.errors import DeliveryError
    from pipeline.notify import operator

    assert dev.DEMO_OPERATOR_SECRET == content.DEMO_OPERATOR_SECRET
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_URL", f"{site.url}/operator")
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_SECRET", dev.DEMO_OPERATOR_SECRET)
    alert = operator.OperatorAlert(key="run-failed-r1", event=operator.RUN_FAILED, title="Dagster run of ingest failed",
                                   text="Run r1 failed.", link="http://127.0.0.1:3000/runs/r1")
    operator.send(Settings.from_env(), alert)
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_SECRET", "not-the-demo-secret")
    with pytest.raises(DeliveryError):
        operator.send(Settings.from_env(), alert)
    with urllib.request.urlopen(f"{site.url}/operator-alerts.json", timeout=5) as response:
        told = json.loads(response.read())
    assert told["total"] == 1 and told["received"][0]["title"] == "Dagster run of ingest failed"
    with urllib.request.urlopen(f"{site.url}/", timeout=5) as response:
        assert "Dagster run of ingest failed" in response.read().decode()


@pytest.mark.parametrize("url", ["http://10.0.0.1:8780", "https://127.0.0.1:8780", "http://127.0.0.1:8780/feeds"])
def test_the_demo_site_must_be_a_loopback_root(url):
    with pytest.raises(ValueError, match="demo site"):
        parse_site(url)


def test_items_appear_off_the_beat_yet_in_order_and_latest_agrees() -> None:
    """Item k appears somewhere in its period, drawn once: on average one a period, but
    a fetch on the same cadence is not locked to one phase of the feed."""
    from datetime import timedelta
    from itertools import pairwise

    from pipeline.demo.content import EPOCH, JOBS

    moments = [JOBS.published(k) for k in range(200)]
    assert all(EPOCH + k * JOBS.period <= m < EPOCH + (k + 1) * JOBS.period for k, m in enumerate(moments))
    gaps = [b - a for a, b in pairwise(moments)]
    assert min(gaps) > timedelta(0) and len({round(g.total_seconds()) for g in gaps}) > 20, "in order, unevenly"
    for k in (5, 50, 150):
        for now in (moments[k], moments[k + 1] - timedelta(microseconds=1)):
            assert JOBS.latest(now) == k


def test_the_demo_hub_pushes_each_new_job_and_the_service_alerts_at_once(engine, site, tmp_path):
    """The demo's job board advertises the demo site's hub: the collector subscribes
    (PIPELINE_WEBSUB_CALLBACK_URL at `pipeline serve`'s app), the hub verifies on its
    thread, and when the site's clock passes a new job the hub pushes it and the service
    processes and delivers it itself: no stage runs after the first fetch. Waits for
    states (the verification, the push's delivery), never for a moment."""
    from pipeline.fetching import websub
    from pipeline.web.app import FeedApp
    from tests.helpers import served, wait_until

    with engine.begin() as conn:
        content.seed(conn, site.url)
    settings = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",), alert_limit=1000)
    app = FeedApp(engine, settings=settings)
    with served(app) as callback:
        fetching = Settings(database_url=str(engine.url), allow_networks=("127.0.0.1/32",), alert_limit=1000,
                            websub_callback_url=callback)
        Collector(engine, fetching, "demo-test").run()
        board = schema.sources.c.url == site.url + content.JOBS_PATH
        with engine.connect() as conn:
            board_id = conn.execute(sa.select(schema.sources.c.id).where(board)).scalar_one()

        def verified() -> bool:
            with engine.connect() as conn:
                return bool(websub.pushed(conn, [board_id], datetime.now(UTC)))

        wait_until("the hub's verification of intent", verified, timeout=60, every=0.1)
        Processor(engine, settings, "demo-test").run()
        Notifier(engine, settings, "demo-test").run()
        before = received(site)["total"]
        # The next jobs appear: the hub pushes, the service alerts the users they match.
        site.move_to(SITE_NOW + 10 * content.JOBS.period)
        newest = content.JOBS.latest(SITE_NOW + 10 * content.JOBS.period)

        def pushed_and_stored() -> bool:
            with engine.connect() as conn:
                return conn.execute(sa.select(sa.func.count()).select_from(schema.listings).where(
                    schema.listings.c.source_item_id == f"job-{newest}")).scalar_one() == 1

        wait_until("the pushed job processed by the service", pushed_and_stored, timeout=60, every=0.1)
        assert site.hub.pushes >= 1
        wait_until("the service's round after the push", lambda: app.after_push.rounds >= 1, timeout=60, every=0.1)
        n, listings = schema.notifications, schema.listings
        pushed_jobs = [f"job-{k}" for k in range(content.JOBS.latest(SITE_NOW) + 1, newest + 1)]
        with engine.connect() as conn:  # the pushed jobs' notifications: each sent (or held for a digest)
            told = conn.execute(sa.select(n.c.status).join(listings, listings.c.id == n.c.listing_id).where(
                listings.c.source_id == board_id, listings.c.source_item_id.in_(pushed_jobs))).scalars().all()
        assert told and "pending" not in told and received(site)["total"] - before == told.count("sent"), told


def test_the_demo_hub_keeps_its_subscribers_across_a_restart_and_drops_one_that_answers_gone(site, tmp_path):
    """A hub with storage: a subscriber verified before a restart is pushed to after it
    (the demo hub kept them in memory, and after `dev.py up` was stopped and started
    again 13 jobs were published over 13 minutes and none pushed); one whose callback
    answers 410 Gone is pushed to no more. Waits for states (the verification, a push)."""
    from urllib.parse import parse_qs, urlsplit

    from tests.helpers import wait_until
    from tests.http_server import LocalServer

    subscriber = LocalServer().start()
    pushes: list[bytes] = []
    subscriber.routes["/cb"] = lambda h: h.reply(
        200, parse_qs(urlsplit(h.path).query)["hub.challenge"][0].encode(), {"Content-Type": "text/plain"})
    try:
        callback, topic = subscriber.url("/cb"), f"{site.url}{content.JOBS_PATH}"
        assert site.hub.request({"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback,
                                 "hub.secret": "s" * 32}, site.url) == 202
        wait_until("the verification", lambda: callback in site.hub.subscribers, timeout=60, every=0.05)
        site.shutdown()
        site.server_close()
        clock = [SITE_NOW]
        again = DemoSite(0, tmp_path / "deliveries.jsonl", clock=lambda: clock[0])
        thread = threading.Thread(target=again.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        try:
            assert again.hub.subscribers == {callback: "s" * 32}, "remembered across the restart"
            assert oct((tmp_path / "hub-subscribers.json").stat().st_mode & 0o777) == "0o600", "it holds secrets"

            def took(h) -> None:
                pushes.append(h.body)
                h.reply(202)

            subscriber.routes["/cb"] = took
            clock[0] = SITE_NOW + 2 * content.JOBS.period
            wait_until("a push after the restart", lambda: pushes, timeout=60, every=0.05)
            subscriber.routes["/cb"] = lambda h: h.reply(410)
            clock[0] = SITE_NOW + 4 * content.JOBS.period
            wait_until("the subscriber that answered 410 dropped", lambda: not again.hub.subscribers,
                       timeout=60, every=0.05)
        finally:
            again.shutdown()
            again.server_close()
    finally:
        subscriber.stop()

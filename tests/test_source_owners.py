"""Source health for owners: a source's owner hears once when it starts failing (after
PIPELINE_OWNER_ALERT_FAILURES failed fetches in a row, at once for a block or a
disable) and once when it recovers, through their own channel, signed; the alert is
written in the fetch's fenced completion, so a fetch fenced out tells nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from pipeline.catalogue import sources, users
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.kinds import SourceHealth
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.fetching.decide import SourceDecision, owner_alert
from pipeline.notify.delivery import verify
from pipeline.storage import schema, upkeep
from tests.helpers import add_source
from tests.test_cli import assert_one_line_error, run
from tests.test_collector import rss
from tests.test_notifier import SECRET, add_user, notifier, posts

T = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SOURCE = {"id": 7, "name": "Jobs", "url": "http://127.0.0.1/jobs", "consecutive_failures": 2,
          "last_success_at": T - timedelta(days=1)}


def failed(failures: int, *, disabled: str | None = None) -> SourceDecision:
    return SourceDecision(next_fetch_at=T + timedelta(hours=1), fetched_at=T, consecutive_failures=failures,
                          failure=FailureReason.HTTP_5XX, disabled_reason=disabled)


def error(reason: FailureReason = FailureReason.HTTP_5XX, status: int | None = 500) -> FetchError:
    return FetchError(reason, "the server said no", http_status=status)


OK = SourceDecision(next_fetch_at=T + timedelta(hours=1), fetched_at=T, consecutive_failures=0)


# -- the rule (pure) ------------------------------------------------------------------


def test_an_owner_hears_once_at_the_nth_failure_and_once_at_the_recovery():
    assert owner_alert(SOURCE, error(), failed(2), alerted=False, after_failures=3) is None
    alert = owner_alert(SOURCE, error(), failed(3), alerted=False, after_failures=3)
    assert alert is not None and (alert.event, alert.reason) == (SourceHealth.FAILING, "http_5xx")
    assert "Jobs (http://127.0.0.1/jobs) fails" in alert.detail and "failed fetches in a row: 3" in alert.detail
    assert "last success 2026-11-26 12:00 UTC" in alert.detail and "retried at 2026-11-27 13:00" in alert.detail
    assert owner_alert(SOURCE, error(), failed(4), alerted=True, after_failures=3) is None, "told once"
    recovered = owner_alert(SOURCE, None, OK, alerted=True, after_failures=3)
    assert recovered is not None and recovered.event is SourceHealth.RECOVERED and recovered.reason is None
    assert owner_alert(SOURCE, None, OK, alerted=False, after_failures=3) is None, "nothing to recover from"


@pytest.mark.parametrize("blocked", [
    error(FailureReason.HTTP_4XX, 403), error(FailureReason.HTTP_4XX, 401),
    error(FailureReason.RATE_LIMITED, 429), error(FailureReason.BLOCKED, 200),
])
def test_a_block_is_told_at_the_first_failure(blocked):
    alert = owner_alert(SOURCE, blocked, failed(1), alerted=False, after_failures=3)
    assert alert is not None and alert.event is SourceHealth.FAILING and alert.reason == blocked.reason.value


def test_a_404_waits_for_the_streak_but_a_disable_is_told_at_once():
    assert owner_alert(SOURCE, error(FailureReason.HTTP_4XX, 404), failed(1), alerted=False, after_failures=3) is None
    alert = owner_alert(SOURCE, error(FailureReason.HTTP_4XX, 404), failed(1, disabled="http_4xx 5 times"),
                        alerted=False, after_failures=10)
    assert alert is not None and "It is disabled: http_4xx 5 times" in alert.detail
    assert "pipeline sources enable 7" in alert.detail


# -- end to end: a real feed server, the collector, the notifier, a webhook receiver ------


def collector(engine: sa.Engine) -> Collector:
    settings = Settings(database_url=str(engine.url), http_timeout_seconds=2.0, allow_networks=("127.0.0.1/32",),
                        owner_alert_failures=3)
    return Collector(engine, settings, "test-worker", run_id="run-1", random_unit=lambda: 0.5)


def due(engine: sa.Engine) -> None:
    """Every source due now: the backoff's wait is not what these tests are about."""
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))


def alerts(engine: sa.Engine) -> list[dict]:
    t = schema.source_alerts
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.id)).mappings()]


def hooks(receiver) -> list[dict]:
    return [json.loads(p["body"]) for p in posts(receiver) if p["path"] == "/hook"]


def test_an_owner_hears_once_when_a_source_fails_and_once_when_it_recovers(engine, receiver):
    state = {"failing": True}
    good = rss([("a", "A")])

    def feed(h):
        if state["failing"]:
            h.reply(500, b"down")
        else:
            h.reply(200, good, {"Content-Type": "application/rss+xml"})

    receiver.routes["/feed"] = feed
    with engine.begin() as conn:
        add_user(conn, "alice", receiver.url("/hook"))
        add_user(conn, "bob", receiver.url("/bob"))
        source_id = add_source(conn, receiver.url("/feed"), name="Jobs board")
        other = add_source(conn, receiver.url("/other"))  # failing too, owned by nobody
        sources.set_owner(conn, source_id, "alice")
    receiver.routes["/other"] = lambda h: h.reply(500, b"down")

    for _ in range(2):
        collector(engine).run()
        due(engine)
    assert alerts(engine) == [], "two failures: not yet"
    collector(engine).run()
    [alert] = alerts(engine)
    assert (alert["source_id"], alert["event"], alert["reason"], alert["status"]) == (
        source_id, "failing", "http_5xx", "pending")

    stats = notifier(engine).run()
    assert stats.source_alerts_sent == 1 and stats.sent == 0
    [post] = [p for p in posts(receiver) if p["path"] == "/hook"]
    assert verify(SECRET, post["body"], post["headers"]), "signed with the owner's secret"
    [body] = hooks(receiver)
    assert body["event"] == "source_failing" and body["user"]["name"] == "alice"
    assert body["listing"]["title"] == "Source failing: Jobs board"
    assert body["listing"]["source_id"] == source_id and body["listing"]["reason"] == "http_5xx"
    assert "failed fetches in a row: 3" in body["listing"]["summary"]
    assert body["idempotency_key"].startswith("source-failing-")
    assert alerts(engine)[0]["status"] == "sent"

    due(engine)
    collector(engine).run()  # a fourth failure: told already
    assert len(alerts(engine)) == 1

    state["failing"] = False
    due(engine)
    collector(engine).run()
    assert [a["event"] for a in alerts(engine)] == ["failing", "recovered"]
    assert notifier(engine).run().source_alerts_sent == 1
    assert [b["event"] for b in hooks(receiver)] == ["source_failing", "source_recovered"]
    assert "failed fetches in a row before it: 4" in hooks(receiver)[1]["listing"]["summary"]

    due(engine)
    collector(engine).run()  # healthy and told so: nothing
    state["failing"] = True
    due(engine)
    collector(engine).run()  # one failure of a new streak: not yet
    assert len(alerts(engine)) == 2
    assert {a["source_id"] for a in alerts(engine)} == {source_id}, f"source {other} has no owner"
    assert not [p for p in posts(receiver) if p["path"] == "/bob"]


def test_a_fetch_fenced_out_tells_the_owner_nothing(engine, receiver):
    """The fetch's completion is fenced out (an operator's refresh took the claim while it
    was in flight): the third failure it saw is not written, nor is its alert."""
    with engine.begin() as conn:
        add_user(conn, "alice", receiver.url("/hook"))
        source_id = add_source(conn, receiver.url("/feed"), consecutive_failures=2)
        sources.set_owner(conn, source_id, "alice")

    def feed(h):
        with engine.begin() as conn:
            sources.refresh_source(conn, source_id)
        h.reply(500, b"down")

    receiver.routes["/feed"] = feed
    stats = collector(engine).run(max_sources=1)
    assert stats.fenced_out == 1
    assert alerts(engine) == []


def test_an_owner_s_failing_channel_retries_the_alert_and_a_disabled_owner_hears_nothing(engine, receiver):
    receiver.routes["/hook"] = lambda h: h.reply(503, b"busy")
    with engine.begin() as conn:
        add_user(conn, "alice", receiver.url("/hook"))
        add_user(conn, "bob", receiver.url("/bob"))
        mine = add_source(conn, "http://127.0.0.1/a")
        bobs = add_source(conn, "http://127.0.0.1/b")
        sources.set_owner(conn, mine, "alice")
        sources.set_owner(conn, bobs, "bob")
        users.set_user_enabled(conn, "bob", False)
        for source_id in (mine, bobs):
            conn.execute(sa.insert(schema.source_alerts).values(
                source_id=source_id, user_id=sa.select(schema.source_owners.c.user_id)
                .where(schema.source_owners.c.source_id == source_id).scalar_subquery(),
                event="failing", reason="http_5xx", detail="it fails"))
    stats = notifier(engine).run()
    assert (stats.source_alerts_sent, stats.source_alerts_retrying, stats.source_alerts_dead) == (0, 1, 1)
    by_source = {a["source_id"]: a for a in alerts(engine)}
    assert by_source[mine]["status"] == "failed" and "503" in by_source[mine]["last_error"]
    assert by_source[mine]["next_attempt_at"] > datetime.now(UTC)
    assert (by_source[bobs]["status"], by_source[bobs]["last_error"]) == ("dead", "the owner is disabled")
    assert not [p for p in posts(receiver) if p["path"] == "/bob"]


def test_sources_owner_command(engine, db_url):
    with engine.begin() as conn:
        users.add_user(conn, "alice", webhook="http://127.0.0.1/hook", secret=SECRET)
    env = {"DATABASE_URL": db_url}
    added = run("sources", "add", "http://127.0.0.1/jobs", "--owner", "alice", env=env)
    assert added.returncode == 0, added
    source_id = added.stdout.strip()
    assert run("sources", "owner", source_id, env=env).stdout.startswith("owner alice (user ")
    assert "owner alice" in run("sources", "show", source_id, env=env).stdout
    assert run("sources", "owner", source_id, "--none", env=env).returncode == 0
    assert run("sources", "owner", source_id, env=env).stdout.strip() == "no owner"
    assert_one_line_error(run("sources", "owner", source_id, "nobody", env=env), "no user named (or with id) 'nobody'")
    assert_one_line_error(run("sources", "owner", "999", "alice", env=env), "no source with id 999")


def test_retention_deletes_old_alerts_that_ended_and_keeps_those_still_to_send(engine):
    with engine.begin() as conn:
        user = add_user(conn, "alice", "http://127.0.0.1/hook")
        source_id = add_source(conn)
        old, recent = datetime.now(UTC) - timedelta(days=100), datetime.now(UTC) - timedelta(days=1)
        for status, created in (("sent", old), ("dead", old), ("failed", old), ("sent", recent)):
            conn.execute(sa.insert(schema.source_alerts).values(
                source_id=source_id, user_id=user, event="failing", detail=status, status=status, created_at=created))
    purged = upkeep.purge(engine, Settings(database_url=str(engine.url), event_retention_days=90))
    assert purged.source_alerts == 2
    assert sorted((a["status"], a["created_at"] > old) for a in alerts(engine)) == [("failed", False), ("sent", True)]

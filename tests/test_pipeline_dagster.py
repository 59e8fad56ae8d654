"""The processor and notifier in Dagster: assets, checks, sensors, backfills, upkeep."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.storage.dagster_run import DagsterRun

from assets import ASSET_CHECKS, passes
from assets.backfills import refetch_sources_job, rematch_window_job, reprocess_window_job
from assets.policies import LINGER_TAG, STAGE_TAG, stage_kinds
from assets.stages import LISTINGS, NOTIFICATIONS, STAGES_OP, CarriedPasses, FollowUps, stage_assets
from pipeline.catalogue import sources, users
from pipeline.storage import health, politeness_groups, schema
from pipeline.storage.status import collect_status
from resources import PipelineDatabase
from sensors.pipeline_work import pending_notifications_sensor, unprocessed_listings_sensor
from sensors.upkeep import upkeep_job
from tests.conftest import conformance
from tests.helpers import add_source, now, wait_until
from tests.http_server import LocalServer
from tests.test_collector import rss, serve
from tests.test_collector_dagster import made, materialize, metadata_of, unwrap

SECRET = "receiver-shared-secret-0123"


@pytest.fixture
def server():
    srv = LocalServer().start()
    srv.routes["/hook"] = lambda h: h.reply(204)
    yield srv
    srv.stop()


def resources(db_url: str) -> dict:
    return {"database": PipelineDatabase(database_url=db_url)}


def checks_of(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {f"{e.asset_key.to_user_string()}:{e.check_name}": e.passed
            for e in result.get_asset_check_evaluations()}


def test_the_three_assets_carry_a_listing_from_feed_to_receiver(engine, db_url, server, monkeypatch):
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    serve(server, "/feed", rss([("a", "Python developer"), ("b", "Java developer")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python")
    result = dg.materialize([stage_assets, *ASSET_CHECKS], resources=resources(db_url))
    assert result.success
    assert metadata_of(result, "listings_raw")["items_new"] == 2
    assert metadata_of(result, "listings")["inserted"] == 2
    assert (metadata_of(result, "notifications")["notifications_created"],
            metadata_of(result, "notifications")["sent"]) == (1, 1)
    # Each stage reports the failure codes that can happen to it: a delivery parses no
    # feed and spends no YouTube quota.
    codes = {k for k in metadata_of(result, "notifications") if k.startswith("errors_")}
    assert {"errors_http_5xx", "errors_channel_error", "errors_blocked_address"} <= codes
    assert not codes & {"errors_youtube_quota", "errors_parse_error"}
    assert [json.loads(r["body"])["listing"]["title"] for r in server.requests if r["method"] == "POST"] == [
        "Python developer"]
    assert all(checks_of(result).values()), checks_of(result)
    with engine.connect() as conn:
        states = dict(conn.execute(sa.select(schema.worker_state.c.worker_name, schema.worker_state.c.last_status)).all())
    assert states == {"collector": "ok", "processor": "ok", "notifier": "ok"}


def test_the_assets_declare_retry_policies_and_pools():
    assert stage_assets.op.retry_policy.backoff is dg.Backoff.EXPONENTIAL
    assert stage_assets.op.retry_policy.jitter is dg.Jitter.PLUS_MINUS and stage_assets.op.pool == "stages"


@pytest.mark.parametrize(("url", "kind"), [
    ("sqlite:////tmp/x/pipeline.db", "sqlite"), ("postgresql://u@h/db", "postgres"),
    ("postgresql+psycopg://u@h/db", "postgres"), ("mysql://root@h/db", "mariadb"), ("mariadb://root@h/db", "mariadb"),
])
def test_each_stage_shows_the_database_it_runs_on(monkeypatch, url, kind):
    """The assets' kinds named PostgreSQL on the embedded SQLite."""
    for spec in stage_assets.specs:  # read when the definitions loaded, in this env
        assert spec.kinds == stage_kinds()
    monkeypatch.setenv("DATABASE_URL", url)
    assert stage_kinds() == {"python", kind}
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("PIPELINE_STATE_DIR", "/tmp/state")
    assert stage_kinds() == {"python", "sqlite"}, "the embedded default"


def test_the_checks_fail_when_something_is_wrong(engine, db_url):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x", consecutive_failures=4, last_failure_reason="timeout",
                            locked_until=now() - timedelta(hours=1), claimed_by="gone", claim_token="t")
        add_source(conn, "http://127.0.0.1:9/y", enabled=False, consecutive_failures=10,
                   last_failure_reason="http_4xx", disabled_reason="http_4xx 10 times in a row")
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="old", url="http://x/1", raw_json={}, content_hash="h",
            fetched_at=now() - timedelta(hours=5)))
        user = users.add_user(conn, "alice", webhook="http://127.0.0.1:9/hook", secret=SECRET).id
        listing = conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="l", url="http://x/l", content_hash="h", matched_at=now()
        ).returning(schema.listings.c.id)).scalar()
        conn.execute(sa.insert(schema.notifications).values(user_id=user, listing_id=listing, cluster_id=listing,
                                                            channel="webhook",
                                                            status="dead", attempts=8, last_error="HTTP 500"))
        retried = conn.execute(sa.insert(schema.listings).values(  # its channel failed it twice: retrying
            source_id=source, source_item_id="r", url="http://x/r", content_hash="h", matched_at=now()
        ).returning(schema.listings.c.id)).scalar()
        conn.execute(sa.insert(schema.notifications).values(
            user_id=user, listing_id=retried, cluster_id=retried, channel="webhook", status="failed", attempts=2,
            next_attempt_at=now() + timedelta(minutes=2), last_error="HTTP 410 from http://a:b@hook.example/x"))
        conn.execute(sa.insert(schema.filters).values(user_id=user, keywords=["python"], query="python",
                                                      error="its query does not compile", failed_at=now()))
        conn.execute(sa.insert(schema.websub_subscriptions).values(  # verified once; its lease ran out
            source_id=source, hub="http://127.0.0.1:9/hub", topic="http://127.0.0.1:9/x", callback_token="c" * 43,
            secret="s" * 43, state="active", requested_at=now() - timedelta(days=8),
            verified_at=now() - timedelta(days=8), lease_until=now() - timedelta(days=1)))
    result = dg.materialize(ASSET_CHECKS, resources=resources(db_url), selection=dg.AssetSelection.all_asset_checks())
    checks = checks_of(result)
    assert checks == {
        "listings_raw:push_health": False, "notifications:failing_channels": False,
        "listings_raw:expired_leases_reclaimed": False, "listings:expired_leases_reclaimed": True,
        "notifications:expired_leases_reclaimed": True, "listings:freshness": False,
        "listings_raw:failing_sources": False, "notifications:dead_notifications": False,
        "notifications:failing_filters": False,
        "listings_raw:freshness": True, "notifications:freshness": True, "listings:given_up_raw_rows": True,
        "listings_raw:schedule_adherence": True,
    }
    [raw_freshness] = [e for e in result.get_asset_check_evaluations()
                       if (e.asset_key.to_user_string(), e.check_name) == ("listings", "freshness")]
    assert 299 <= raw_freshness.metadata["unprocessed_rows_oldest_minutes"].value <= 301
    [channels] = [e for e in result.get_asset_check_evaluations() if e.check_name == "failing_channels"]
    assert channels.description == "1 users' channels failing: 1 notifications retrying after 2 or more failed attempts"
    assert channels.metadata["which"].value.endswith("| alice | 1 |  | HTTP 410 from http://\\*\\*\\*@hook.example/x |")
    [push] = [e for e in result.get_asset_check_evaluations() if e.check_name == "push_health"]
    assert push.description == "1 subscriptions in trouble: 1 expired" and push.metadata["push_expired"].value == 1
    assert "| 1 http://127.0.0.1:9/x | expired | 0 | never | http://127.0.0.1:9/hub |" in push.metadata["which"].value


@conformance
def test_the_schedule_check_warns_when_the_last_hours_p95_lateness_is_over_the_limit(engine, db_url, monkeypatch):
    """p95 over the last hour of how late fetches started after their due time, against
    PIPELINE_LATENESS_MAX_MINUTES: 19 fetches on time and one 10 minutes late put p95 at
    30 s; two of twenty 10 minutes late put it at 10 minutes."""
    monkeypatch.setenv("PIPELINE_LATENESS_MAX_MINUTES", "5")
    selection = dg.AssetSelection.checks(dg.AssetCheckKey(dg.AssetKey("listings_raw"), "schedule_adherence"))

    def adherence() -> dg.AssetCheckEvaluation:
        result = dg.materialize(ASSET_CHECKS, resources=resources(db_url), selection=selection)
        [evaluation] = result.get_asset_check_evaluations()
        return evaluation

    assert adherence().passed, "an hour without fetches passes"
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        at = now() - timedelta(minutes=5)
        late = [0.0] * 19 + [600.0]
        rows = [{"event": schema.EVENT_STARTED, "source_id": source, "occurred_at": at,
                 "scheduled_at": at - timedelta(seconds=s)} for s in late]
        conn.execute(sa.insert(schema.ingestion_events), rows)
    first = adherence()
    assert first.passed and first.metadata["lateness_p95_minutes"].value == 0.5
    with engine.begin() as conn:  # one more late fetch, one fewer on time: p95 at 10 min
        conn.execute(sa.insert(schema.ingestion_events), [{**rows[-1]}])
        conn.execute(sa.delete(schema.ingestion_events).where(
            schema.ingestion_events.c.id == sa.select(sa.func.min(schema.ingestion_events.c.id)).scalar_subquery()))
    second = adherence()
    assert not second.passed and second.severity == dg.AssetCheckSeverity.WARN
    assert (second.metadata["fetches"].value, second.metadata["lateness_p95_minutes"].value) == (20, 10.0)
    # Late, and why: no group asks for more than its spacing allows, so the collectors
    # are behind; then the source's group is spaced 2 hours apart for its hourly source.
    assert second.metadata["groups_over_capacity"].value == 0
    assert "the collectors are behind" in second.description
    with engine.begin() as conn:
        politeness_groups.set_limits(conn, "127.0.0.1", min_interval_seconds=7200)
    third = adherence()
    assert not third.passed and third.metadata["groups_over_capacity"].value == 1
    assert "politeness groups asking for more fetches than their spacing allows: 1" in third.description
    assert "| 127.0.0.1 | 1 | 0.0167 | 0.00833 |" in third.metadata["over_capacity"].value


@conformance
def test_the_freshness_checks_judge_the_oldest_waiting_work_of_each_stage(engine, db_url, monkeypatch):
    """Fresh means nothing has waited too long, whatever the last materialisation: an idle
    stage is fresh; an overdue source, a listing unmatched or a notification due for
    longer than PIPELINE_FRESHNESS_MAX_MINUTES is stale; a given-up raw row is counted."""
    monkeypatch.setenv("PIPELINE_FRESHNESS_MAX_MINUTES", "30")
    checks = dg.AssetSelection.all_asset_checks()
    assert all(checks_of(dg.materialize(ASSET_CHECKS, resources=resources(db_url), selection=checks)).values())
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x", next_fetch_at=now() - timedelta(minutes=45))
        add_source(conn, "http://127.0.0.1:9/soon", next_fetch_at=now() + timedelta(minutes=5))
        conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="l", url="http://x/l", content_hash="h",
            updated_at=now() - timedelta(minutes=20)))
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="bad", url="http://x/2", raw_json={}, content_hash="h",
            processed_at=now(), last_error="no title", attempts=5))
    result = checks_of(dg.materialize(ASSET_CHECKS, resources=resources(db_url), selection=checks))
    assert (result["listings_raw:freshness"], result["listings:freshness"], result["notifications:freshness"],
            result["listings:given_up_raw_rows"]) == (False, True, True, False)
    with engine.begin() as conn:
        conn.execute(sa.update(schema.listings).values(updated_at=now() - timedelta(minutes=31)))
    result = checks_of(dg.materialize(ASSET_CHECKS, resources=resources(db_url), selection=checks))
    assert result["notifications:freshness"] is False


def tick(sensor, instance: dg.DagsterInstance, db_url: str, cursor: str | None = None):
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(db_url)) as context:
        return unwrap(sensor(context)), context.cursor


def test_the_processor_and_notifier_sensors_request_runs_only_when_there_is_work(engine, db_url):
    with dg.DagsterInstance.ephemeral() as instance:
        for sensor in (unprocessed_listings_sensor, pending_notifications_sensor):
            result, _ = tick(sensor, instance, db_url)
            assert isinstance(result, dg.SkipReason) and result.skip_message.startswith("no ")
        with engine.begin() as conn:
            source = add_source(conn, "http://127.0.0.1:9/x")
            conn.execute(sa.insert(schema.listings_raw).values(
                source_id=source, source_item_id="a", url="http://x/a", raw_json={"url": "http://x/a"},
                content_hash="h"))
        result, cursor = tick(unprocessed_listings_sensor, instance, db_url, cursor="6")
        assert isinstance(result, dg.RunRequest) and (result.run_key, json.loads(cursor)["tick"]) == ("unprocessed-7", 7)
        assert result.tags[STAGE_TAG] == "processor" and result.tags["pipeline/unprocessed_rows"] == "1"
        assert isinstance(tick(pending_notifications_sensor, instance, db_url)[0], dg.SkipReason)
        with engine.begin() as conn:
            conn.execute(sa.insert(schema.listings).values(source_id=source, source_item_id="a",
                                                           url="http://x/a", content_hash="h"))
        result, _ = tick(pending_notifications_sensor, instance, db_url)
        assert isinstance(result, dg.RunRequest) and result.tags[STAGE_TAG] == "notifier"
        # A full pool waits, and says so.
        for i in range(2):
            instance.add_run(DagsterRun(job_name="process", run_id=f"r{i}", status=dg.DagsterRunStatus.STARTED,
                                        tags={STAGE_TAG: "processor"}))
        result, _ = tick(unprocessed_listings_sensor, instance, db_url)
        assert isinstance(result, dg.SkipReason) and "2 processor runs active, the limit is 2" in result.skip_message


def day(d: int) -> datetime:
    return datetime(2026, 11, d, 12, 0, tzinfo=UTC)


def test_a_reprocess_backfill_touches_exactly_its_window_and_notifies_no_one_twice(engine, db_url, server, monkeypatch):
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python")
        conn.execute(sa.update(schema.filters).values(created_at=day(1)))
        for d in (18, 19, 20):
            conn.execute(sa.insert(schema.listings_raw).values(
                source_id=source, source_item_id=f"d{d}", url=f"http://x/{d}", content_hash=str(d),
                raw_json={"title": f"<b>Python</b> job {d}", "url": f"http://x/{d}"}, fetched_at=day(d)))
    materialize(db_url, "listings", "notifications")
    with engine.begin() as conn:  # as an older normaliser would have left them
        conn.execute(sa.update(schema.listings).values(title="stale"))
        processed = dict(conn.execute(sa.select(schema.listings_raw.c.source_item_id, schema.listings_raw.c.processed_at)).all())
        # Live work waiting meanwhile: the processor's own runs take it, not the backfill.
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="live", url="http://x/live", content_hash="live",
            raw_json={"title": "Live", "url": "http://x/live"}, fetched_at=now()))
    result = reprocess_window_job.execute_in_process(resources=resources(db_url), run_config={
        "ops": {"reprocess_raw_rows": {"config": {"since": "2026-11-19", "until": "2026-11-20"}}}})
    assert result.success
    with engine.connect() as conn:
        titles = dict(conn.execute(sa.select(schema.listings.c.source_item_id, schema.listings.c.title)).all())
        after = dict(conn.execute(sa.select(schema.listings_raw.c.source_item_id, schema.listings_raw.c.processed_at)).all())
    assert titles == {"d18": "stale", "d19": "Python job 19", "d20": "stale"}
    assert after["live"] is None, "the backfill re-processed its window only"
    assert after["d18"] == processed["d18"] and after["d20"] == processed["d20"] and after["d19"] > processed["d19"]
    with engine.begin() as conn:
        conn.execute(sa.delete(schema.listings_raw).where(schema.listings_raw.c.source_item_id == "live"))
    materialize(db_url, "notifications")  # the changed listing is matched again
    sent = [json.loads(r["body"])["listing"]["title"] for r in server.requests if r["method"] == "POST"]
    assert len(sent) == 3, "the re-matched listing notified no one twice"


def test_the_window_backfills_are_not_partitioned_and_name_what_is_wrong(db_url):
    """On-demand jobs are never meant to be complete: partitioned by day they showed 695
    "missing" partitions. A window they are not given, or cannot read, fails the run
    before anything is done, saying what to give."""
    for job in (reprocess_window_job, rematch_window_job):
        assert job.partitions_def is None, job.name
    op = {reprocess_window_job: "reprocess_raw_rows", rematch_window_job: "rematch_listings"}
    for job, config, said in (
        (reprocess_window_job, {}, "name the window: since: 2026-11-19"),
        (rematch_window_job, {"since": "19.11.2026"}, "since '19.11.2026' is not a time: write 2026-11-19"),
        (reprocess_window_job, {"since": "2026-11-20", "until": "2026-11-19"},
         "since 2026-11-20 00:00 is not before until 2026-11-19 00:00"),
    ):
        result = job.execute_in_process(resources=resources(db_url), raise_on_error=False,
                                        run_config={"ops": {op[job]: {"config": config}}})
        [failure] = [e for e in result.all_events if e.is_step_failure]
        assert said in str(failure.step_failure_data.error.message), (job.name, config)


def test_refetch_without_sources_fails_naming_what_to_give(db_url):
    result = refetch_sources_job.execute_in_process(resources=resources(db_url), raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    assert "name the sources to re-fetch: source_ids: [1, 2]" in str(failure.step_failure_data.error.message)


def test_a_rematch_backfill_gives_history_only_when_asked_and_never_twice(engine, db_url, server):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        for d in (18, 19):
            conn.execute(sa.insert(schema.listings).values(
                source_id=source, source_item_id=f"d{d}", url=f"http://x/{d}", title=f"Python {d}",
                author="Jane Smith", content_hash=str(d), ingested_at=day(d), updated_at=day(d), matched_at=day(d)))
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python author:smith")  # created now: after both listings

    def rematch(any_age: bool) -> int:
        """Run the backfill for 2026-11-19; how many notifications exist afterwards."""
        result = rematch_window_job.execute_in_process(resources=resources(db_url), run_config={
            "ops": {"rematch_listings": {"config": {"since": "2026-11-19", "until": "2026-11-20", "any_age": any_age}}}})
        assert result.success
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(schema.notifications)).scalar_one())

    assert rematch(False) == 0, "a new filter does not reach back by default"
    assert rematch(True) == 1, "on request, the chosen day's history"
    assert rematch(True) == 1, "and never a second time"


def test_refetch_backfill_fetches_the_chosen_sources_now(engine, db_url, server, monkeypatch):
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    serve(server, "/feed", rss([("a", "A")]))
    with engine.begin() as conn:
        chosen = add_source(conn, server.url("/feed?1"), next_fetch_at=now() + timedelta(hours=5))
        add_source(conn, server.url("/feed?2"), next_fetch_at=now() + timedelta(hours=5))
    unknown = refetch_sources_job.execute_in_process(
        resources=resources(db_url), raise_on_error=False,
        run_config={"ops": {"refetch_chosen_sources": {"config": {"source_ids": [chosen, 999]}}}})
    assert not unknown.success and server.requests == [], "an id that names no source: nothing is re-fetched"
    [failure] = [e for e in unknown.all_events if e.is_step_failure]
    assert "no source with id 999" in str(failure.step_failure_data.error.message)
    result = refetch_sources_job.execute_in_process(
        resources=resources(db_url),
        run_config={"ops": {"refetch_chosen_sources": {"config": {"source_ids": [chosen]}}}})
    assert result.success
    assert [r["path"] for r in server.requests] == ["/feed?1"]


@conformance
def test_upkeep_deletes_only_old_processed_raw_rows_and_old_events(engine, db_url):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        for item, processed in (("old", now() - timedelta(days=40)), ("recent", now() - timedelta(days=2)),
                                ("pending", None)):
            conn.execute(sa.insert(schema.listings_raw).values(
                source_id=source, source_item_id=item, url="http://x", raw_json={}, content_hash="h",
                processed_at=processed))
        conn.execute(sa.insert(schema.ingestion_events), [
            {"event": "ingestion.completed", "source_id": source, "occurred_at": now() - timedelta(days=100)},
            {"event": "ingestion.completed", "source_id": source, "occurred_at": now()},
        ])
    assert upkeep_job.execute_in_process(resources=resources(db_url)).success
    with engine.connect() as conn:
        left = set(conn.execute(sa.select(schema.listings_raw.c.source_item_id)).scalars())
        events = conn.execute(sa.select(sa.func.count()).select_from(schema.ingestion_events)).scalar()
    assert left == {"recent", "pending"} and events == 1


def failing_check(db_url: str) -> dg.AssetCheckEvaluation:
    [check] = [c for c in ASSET_CHECKS if c.check_specs_by_output_name
               and any(spec.name == "failing_sources" for spec in c.check_specs)]
    result = dg.materialize([check], resources=resources(db_url), selection=dg.AssetSelection.all_asset_checks())
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


@conformance
def test_failing_sources_counts_what_status_counts_from_the_first_failure(engine, db_url):
    """One failed fetch is a failing source, in `pipeline status` and in the check alike
    (the check once waited for three in a row: hours on an hourly cadence)."""
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/x", consecutive_failures=1, last_failure_reason="timeout")
    evaluation = failing_check(db_url)
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    assert not evaluation.passed and evaluation.severity is dg.AssetCheckSeverity.WARN
    assert metadata["failing_timeout"] == 1 and metadata["failing_http_5xx"] == 0, "every code, zero-filled"
    assert collect_status(engine).failing == {"timeout": 1}


def unchecked_materialisations(result: dg.ExecuteInProcessResult) -> list[tuple[str, int]]:
    """The materialisations of ``result`` (asset, its nth) that are not followed by an
    evaluation of each of their asset's checks before the asset's next materialisation."""
    checks: dict[str, set[str]] = {}
    for definition in ASSET_CHECKS:
        for key in definition.check_keys:
            checks.setdefault(key.asset_key.to_user_string(), set()).add(key.name)
    missing: list[tuple[str, int]] = []
    open_: dict[str, tuple[int, set[str]]] = {}  # asset -> (its nth materialisation, checks evaluated since)
    made_so_far: dict[str, int] = {}

    def close(asset: str) -> None:
        if asset in open_ and open_[asset][1] != checks.get(asset, set()):
            missing.append((asset, open_[asset][0]))

    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
            asset = event.asset_key.to_user_string()
            close(asset)
            made_so_far[asset] = made_so_far.get(asset, 0) + 1
            open_[asset] = (made_so_far[asset], set())
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            data = event.event_specific_data
            asset = data.asset_key.to_user_string()
            if asset in open_:
                open_[asset][1].add(data.check_name)
    for asset in list(open_):
        close(asset)
    return missing


def test_a_stage_run_evaluates_its_asset_s_checks_after_materialising_it(engine, db_url):
    """Dagster's UI shows a check's result beside the latest materialisation only when the
    check ran in the same run or after it: evaluated by `health_checks` alone every 15
    minutes, every check read "Not Evaluated" beside each minute's new materialisation.
    A run evaluates its asset's checks after materialising it; a run with nothing to do
    (an observation) evaluates none."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="a", url="http://x/a", raw_json={"title": "A", "url": "http://x/a"},
            content_hash="h"))
    with dg.DagsterInstance.ephemeral() as instance:
        worked = materialize(db_url, "listings", instance=instance)
        events = [e.event_type_value for e in worked.all_events
                  if e.event_type in (dg.DagsterEventType.ASSET_MATERIALIZATION,
                                      dg.DagsterEventType.ASSET_CHECK_EVALUATION)]
        assert events == ["ASSET_MATERIALIZATION"] + ["ASSET_CHECK_EVALUATION"] * 3, events
        assert checks_of(worked) == {"listings:expired_leases_reclaimed": True, "listings:freshness": True,
                                     "listings:given_up_raw_rows": True}
        idle = materialize(db_url, "listings", instance=instance)
        assert not idle.get_asset_check_evaluations() and not made(idle, "listings")


def test_a_check_that_cannot_run_after_a_materialisation_is_recorded_failed_saying_why(engine, db_url, monkeypatch):
    """A check that raises is recorded failed with its reason, not left out: left out,
    the materialisation read "0 / 3 Passed" and green, and nobody was told."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="a", url="http://x/a", raw_json={"title": "A", "url": "http://x/a"},
            content_hash="h"))

    def cannot(*args, **kwargs):
        raise sa.exc.OperationalError("SELECT", {}, Exception("the database system is starting up\nDETAIL: x"))

    monkeypatch.setattr(health, "stale_leases", cannot)
    worked = materialize(db_url, "listings")
    [evaluation] = [e for e in worked.get_asset_check_evaluations() if e.check_name == "expired_leases_reclaimed"]
    assert not evaluation.passed and evaluation.description == "could not run: the database system is starting up"
    assert checks_of(worked)["listings:freshness"], "the other checks ran"


def test_the_failing_sources_check_says_which_since_when_and_why(engine, db_url):
    """A count says something fails, not what: the check's table names each failing
    source (disabled by its failures too), its last good fetch and its last error."""
    good = now() - timedelta(days=2)
    with engine.begin() as conn:
        flaky = add_source(conn, "http://127.0.0.1:9/flaky", name="Flaky | board", consecutive_failures=2,
                           last_failure_reason="http_5xx", last_success_at=good)
        add_source(conn, "http://127.0.0.1:9/gone", consecutive_failures=10, last_failure_reason="http_4xx",
                   enabled=False)
        add_source(conn, "http://127.0.0.1:9/fine")
        conn.execute(sa.insert(schema.ingestion_events).values(
            source_id=flaky, event=schema.EVENT_COMPLETED, success=False, failure_reason="http_5xx",
            details={"error": "HTTP 503 from 127.0.0.1: <unknown> *upstream*"}))
    table = failing_check(db_url).metadata["which"].value
    lines = table.splitlines()
    assert len(lines) == 4, table
    assert "| http://127.0.0.1:9/gone | never fetched well | 10 (disabled) | http_4xx |" in lines[2]
    # Text in angle brackets is shown, not taken for HTML (the UI showed nothing of
    # "<unknown>"); Markdown's own characters are escaped.
    assert lines[3] == (f"| {flaky} | Flaky \\| board | {good:%Y-%m-%d %H:%M} UTC | 2 | http_5xx"
                        " | HTTP 503 from 127.0.0.1: &lt;unknown&gt; \\*upstream\\* |")


def test_a_source_an_operator_disabled_is_not_counted_as_failing(engine, db_url):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x", consecutive_failures=2, last_failure_reason="http_4xx")
        sources.disable_source(conn, source)
    evaluation = failing_check(db_url)
    assert evaluation.passed, {k: v.value for k, v in evaluation.metadata.items()}
    assert collect_status(engine).disabled_by_failures == 0


def test_each_stage_has_a_named_job_that_runs_in_process_without_the_checks():
    from assets.jobs import STAGE_JOBS, health_checks_job
    from pipeline.definitions import defs

    for job, asset in zip(STAGE_JOBS, ("listings_raw", "listings", "notifications"), strict=True):
        resolved = defs.resolve_job_def(job.name)
        assert resolved.executor_def is dg.in_process_executor
        assert [str(k.to_user_string()) for k in resolved.asset_layer.executable_asset_keys] == [asset]
        assert not list(resolved.asset_layer.asset_graph.asset_check_keys), f"{job.name} runs no check"
        assert resolved.tags[STAGE_TAG]
    checks = defs.resolve_job_def(health_checks_job.name)
    assert len(list(checks.asset_layer.asset_graph.asset_check_keys)) == len(ASSET_CHECKS)


def test_upkeep_purges_finished_runs_past_their_retention():
    """Dagster keeps every run for ever; the upkeep job deletes finished ones after
    PIPELINE_RUN_RETENTION_DAYS, and never a run still going."""
    from sensors.upkeep import purge_runs

    with dg.DagsterInstance.ephemeral() as instance:
        for run_id, status in (("done", dg.DagsterRunStatus.SUCCESS), ("failed", dg.DagsterRunStatus.FAILURE),
                               ("going", dg.DagsterRunStatus.STARTED)):
            instance.add_run(DagsterRun(job_name="collect", run_id=run_id, status=status))
        assert purge_runs(instance, older_than=timedelta(days=14)) == 0, "all are recent"
        assert purge_runs(instance, older_than=timedelta(0), batch=1) == 2
        assert [r.run_id for r in instance.get_runs()] == ["going"]


@conformance
def test_one_ingest_run_collects_processes_and_notifies(engine, db_url, server, monkeypatch):
    """What due sources start: the item is delivered by the same run that fetched it,
    not a sensor tick and a run launch later at each hand-off."""
    from pipeline.definitions import defs

    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    serve(server, "/feed", rss([("a", "Python developer")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python")
    job = defs.resolve_job_def("ingest")
    assert job.executor_def is dg.in_process_executor and job.tags[STAGE_TAG] == "collector"
    result = job.execute_in_process(resources=resources(db_url))
    assert result.success
    materialized = [e.asset_key.to_user_string()
                    for e in result.get_asset_materialization_events()]
    assert materialized == ["listings_raw", "listings", "notifications"]
    every_check = {f"{k.asset_key.to_user_string()}:{k.name}" for c in ASSET_CHECKS for k in c.check_keys}
    assert set(checks_of(result)) == every_check, "each asset's checks, after its materialisation, in its step"
    assert [json.loads(r["body"])["listing"]["title"] for r in server.requests if r["method"] == "POST"] == [
        "Python developer"]


def one_due_now_and_one_later(engine: sa.Engine, server: LocalServer, first: str, second: str) -> None:
    """Source /a due now, /b in 30 s, each with one item titled as given; both come due
    again an hour after their fetch. /b is what a run that lingered too long would fetch;
    30 s, not 2: a loaded machine took longer than 2 s to start the run's first pass,
    which then fetched /b as due (it runs 30 s only when the linger is broken)."""
    serve(server, "/a", rss([("a", first)]))
    serve(server, "/b", rss([("b", second)]))
    with engine.begin() as conn:
        add_source(conn, server.url("/a"))
        add_source(conn, server.url("/b"), next_fetch_at=now() + timedelta(seconds=30))


def ingest_lingering(db_url: str, seconds: int, tags: dict[str, str] | None = None) -> dg.ExecuteInProcessResult:
    from pipeline.definitions import defs

    config = {"ops": {STAGES_OP: {"config": {"linger_seconds": seconds}}}}
    return defs.resolve_job_def("ingest").execute_in_process(run_config=config, resources=resources(db_url), tags=tags)


def a_delivered_then_b_moved(engine: sa.Engine, server: LocalServer, *, to: timedelta) -> None:
    """Source /a due now, /b due in 400 s (within a 600 s linger), each with one item that
    alice's filter matches; when /a's item is delivered, /b's next fetch moves to ``to``
    from then."""
    serve(server, "/a", rss([("a", "Python developer")]))
    serve(server, "/b", rss([("b", "Python engineer")]))
    with engine.begin() as conn:
        add_source(conn, server.url("/a"))
        second = add_source(conn, server.url("/b"), next_fetch_at=now() + timedelta(seconds=400))
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python")

    def delivered_then_b_moved(h) -> None:
        if h.body and b"Python developer" in h.body:  # the first pass's delivery
            with engine.begin() as conn:
                conn.execute(sa.update(schema.sources).where(schema.sources.c.id == second)
                             .values(next_fetch_at=now() + to))
        h.reply(204)

    server.routes["/hook"] = delivered_then_b_moved


def test_a_lingering_ingest_run_takes_sources_as_they_come_due(engine, db_url, server, monkeypatch):
    """An ingest run the sensor starts lingers: it delivers what its first pass fetched,
    waits for the next source to come due (here when that delivery arrives), fetches, processes and
    notifies it too, and ends when no source comes due within its linger: one run
    instead of one per fetch, each item delivered by the pass that fetched it."""
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    # Due within the linger, but not before the first pass is delivered: its delivery
    # makes /b due (a state, not a moment, however slow the machine).
    a_delivered_then_b_moved(engine, server, to=timedelta(0))
    from pipeline.notify import notifier

    full_loads: list[int] = []  # the filters read and compiled whole, not the new ones only
    load = notifier.load_filters

    def counted(*args, **kwargs):
        if kwargs.get("ids") is None:
            full_loads.append(1)
        return load(*args, **kwargs)

    monkeypatch.setattr(notifier, "load_filters", counted)
    result = ingest_lingering(db_url, 600)
    assert result.success
    materialized = [e.asset_key.to_user_string() for e in result.get_asset_materialization_events()]
    assert materialized == ["listings_raw", "listings", "notifications"] * 2, "a pass each, then the chain"
    assert unchecked_materialisations(result) == [], (
        "every materialisation has its asset's checks evaluated after it: a lingering run evaluated them at most"
        " once a minute, and the UI showed a green asset with '0 / 4 Passed' beside a failing check")
    assert len(full_loads) == 1, (
        "the run's notifier passes keep its filters between them: each made a notifier that read and compiled"
        " every filter again (at 30,000 filters, most of a core when a lingering run's follow-ups ran every"
        " second: bench/soak_stack.py)")
    delivered = [json.loads(r["body"])["listing"]["title"] for r in server.requests if r["method"] == "POST"]
    assert delivered == ["Python developer", "Python engineer"]
    fetches = [r["path"] for r in server.requests if r["method"] == "GET"]
    assert fetches == ["/a", "/b"], "each source once: their next fetch is an hour away, past the linger"



def test_a_lingering_run_under_a_steady_stream_of_due_sources_delivers_as_it_fetches_and_ends_on_time(
        engine, db_url, server, monkeypatch):
    """Sources come due one after another faster than their fetches end, as 100,000 hourly
    sources do: the pass went on claiming for as long as any came due, and the run's
    processing and notifying waited for it to end (bench/soak_stack.py: nothing delivered
    after the first minutes, raw rows piling up, runs that never ended). Now what the pass
    fetched goes out while it still fetches, and it claims nothing once the linger is
    over: the sources due after it are left for the next run. The sources come due
    relative to the first fetch (a state, however slow the machine is to start the run);
    each feed answers in 1.5 s (a slow host, so that fetches overlap); waits for states,
    60 s at most each."""
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    count = 30
    for i in range(count):
        serve(server, f"/s{i}", rss([(f"s{i}", f"Python job {i}")]))
    with engine.begin() as conn:
        ids = [add_source(conn, server.url(f"/s{i}"), next_fetch_at=now() + timedelta(hours=1))
               for i in range(count)]
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == ids[0]).values(next_fetch_at=now()))
        users.add_user(conn, "alice", webhook=server.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "python")
    server.routes["/hook"] = lambda h: h.reply(204)
    first = server.routes["/s0"]

    def first_then_the_stream(h) -> None:
        # One source due every second from now on: 30 s of them, past the 8 s linger.
        with engine.begin() as conn:
            for i, source_id in enumerate(ids[1:], start=1):
                conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source_id)
                             .values(next_fetch_at=now() + timedelta(seconds=i)))
        first(h)

    server.routes["/s0"] = first_then_the_stream
    for i in range(count):
        answer = server.routes[f"/s{i}"]
        server.routes[f"/s{i}"] = lambda h, answer=answer: (time.sleep(1.5), answer(h))

    def gets() -> int:
        return sum(1 for r in list(server.requests) if r["method"] == "GET")

    def posts() -> list[str]:
        return [json.loads(r["body"])["listing"]["title"] for r in list(server.requests) if r["method"] == "POST"]

    ran: dict[str, dg.ExecuteInProcessResult] = {}
    runner = threading.Thread(target=lambda: ran.setdefault("result", ingest_lingering(db_url, 8)))
    runner.start()
    try:
        wait_until("the first delivery", posts, 60, every=0.1)
        fetched_then = gets()
        assert fetched_then < count, "delivered while the pass still fetched, not after it took every source"
    finally:
        runner.join(120)
    assert ran["result"].success
    fetched = gets()
    assert fetched < count, f"the pass stopped claiming when the linger ended ({fetched} of {count} fetched)"
    delivered = posts()
    assert sorted(delivered) == sorted(f"Python job {i}" for i in range(fetched)) == sorted(set(delivered)), \
        "every item fetched delivered once"


def _pass(asset: dg.AssetKey) -> passes.Pass:
    return passes.Pass(asset, {"claimed": 1}, worked=True, changed=True)


def test_while_a_lingering_run_fetches_a_long_delivery_holds_up_no_processing_or_matching():
    """The hour at 100,000 sources: the stages after the collector took turns on one
    thread, so each item waited for a whole round of delivering what came before it
    (fetch to delivery p95 14 s). Each now has a thread of its own: a delivery pass that
    has not ended (here: until the others have run three times; 30 s at most) holds up
    neither processing nor matching."""
    released = threading.Event()
    calls: Counter[str] = Counter()

    def delivering() -> passes.Pass:
        calls["deliver"] += 1
        released.wait(30)
        return _pass(NOTIFICATIONS)

    def other(name: str, asset: dg.AssetKey) -> Callable[[], passes.Pass]:
        def run() -> passes.Pass:
            calls[name] += 1
            if min(calls["process"], calls["match"]) >= 3:
                released.set()
            return _pass(asset)
        return run

    carried = CarriedPasses()
    with FollowUps([delivering, other("process", LISTINGS), other("match", NOTIFICATIONS)], carried, every=0.01):
        assert released.wait(30), f"processing and matching waited for the delivery pass: {dict(calls)}"
    done = carried.into(lambda: _pass(NOTIFICATIONS))()
    assert done.metadata["claimed"] == calls["deliver"] + calls["match"] + 1, "every pass that worked is carried"


def test_while_a_lingering_run_fetches_a_stage_whose_pass_took_longer_than_its_round_goes_again_at_once():
    """A pass starts at most every ``every`` seconds, and at once after one that took
    longer: the second between rounds was waited after every round, however long it had
    been. The stage's pass here takes an hour by the clock FollowUps reads, and its
    round is 600 s: three passes follow one another at once (30 s at most)."""
    clock = [0.0]
    passed = threading.Semaphore(0)

    def an_hour() -> passes.Pass:
        clock[0] += 3600
        passed.release()
        return _pass(LISTINGS)

    following = FollowUps([an_hour], CarriedPasses(), every=600)
    following.clock = lambda: clock[0]
    with following:
        assert all(passed.acquire(timeout=30) for _ in range(3)), "a pass longer than its round waited for the next"


def test_a_lingering_run_whose_next_source_another_worker_took_ends_with_no_skipped_step(
        engine, db_url, server, monkeypatch):
    """The run view tells the truth: every materialisation comes from the step that
    defines its asset, and a healthy run has no skipped step. Before, the collector's step
    made the listings and notifications passes of a lingering run itself; when the source
    it waited for was taken by another worker (two lingering runs share the sources), it
    ended with nothing in hand and the two steps after it were SKIPPED ("due to skipped
    dependencies"). Waits one poll (made 0.1 s here) after the source leaves."""
    import assets.stages

    monkeypatch.setattr(assets.stages, "POLL_SECONDS", 0.1)
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    # /b is due within the linger: the run waits for it after its first pass, and
    # meanwhile another worker's fetch moves it an hour on.
    a_delivered_then_b_moved(engine, server, to=timedelta(hours=1))
    result = ingest_lingering(db_url, 600)
    assert result.success
    steps = {e.step_key: e.event_type_value for e in result.all_events
             if e.event_type in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_SKIPPED,
                                 dg.DagsterEventType.STEP_FAILURE)}
    assert set(steps.values()) == {"STEP_SUCCESS"}, steps
    from pipeline.definitions import defs

    made = [(e.asset_key.to_user_string(), e.step_key) for e in result.all_events
            if e.event_type is dg.DagsterEventType.ASSET_MATERIALIZATION]
    assert [asset for asset, _ in made] == ["listings_raw", "listings", "notifications"]
    for asset, step in made:
        assert step == defs.resolve_assets_def(asset).op.name, f"{asset} materialised by step {step}"
    assert [r["path"] for r in server.requests if r["method"] == "GET"] == ["/a"]


def test_a_fetch_that_stores_nothing_new_leaves_no_asset_older_than_the_one_above_it(
        engine, db_url, server, monkeypatch):
    """`listings` showed "Unsynced" in the UI: each collector pass that fetched a feed
    and found nothing new materialised `listings_raw`, and the processor, with nothing
    to take, did not materialise `listings` after it. A pass that stores nothing records
    an observation; the stages after one that stored items materialise, having taken
    them in."""
    from pipeline.definitions import defs

    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    serve(server, "/feed", rss([("a", "Python developer")]))
    with engine.begin() as conn:
        source = add_source(conn, server.url("/feed"))
    ingest = defs.resolve_job_def("ingest")
    first = ingest.execute_in_process(resources=resources(db_url))
    assert [e.asset_key.to_user_string() for e in first.get_asset_materialization_events()] == [
        "listings_raw", "listings", "notifications"], "items stored: all three, in pipeline order"
    with engine.begin() as conn:  # due again; the feed has not changed
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source).values(next_fetch_at=now()))
    again = ingest.execute_in_process(resources=resources(db_url))
    assert again.get_asset_materialization_events() == []
    assert metadata_of(again, "listings_raw", dg.AssetObservation)["fetched"] == 1, "the fetch, observed"
    assert {a for a in ("listings", "notifications") if made(again, a, dg.AssetObservation)} == {
        "listings", "notifications"}


def test_which_passes_of_a_run_materialise():
    """A pass that changed its asset, and every pass after it in the run's chain."""
    from assets.passes import Pass, materialises

    def chain(*changed: bool) -> list[Pass]:
        return [Pass(dg.AssetKey(str(i)), {}, worked=True, changed=c) for i, c in enumerate(changed)]

    assert materialises(chain(False, False, False)) == [False, False, False]
    assert materialises(chain(True, False, False)) == [True, True, True], "the processor took the items in"
    assert materialises(chain(False, True, False)) == [False, True, True]
    assert materialises(chain(False, False, True)) == [False, False, True]


def test_an_ingest_run_lingers_no_longer_than_its_tag_says(engine, db_url, server, monkeypatch):
    """The sensor tags the run with when its linger ends, and counts on it: the run never
    lingers past that, however long its config would let it. A run that starts after
    that end (a slow container start, a full run queue) still takes every source due
    when it starts, not one claim's worth: on a loaded machine each run took 4 of 300."""
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    monkeypatch.setenv("PIPELINE_CONCURRENCY", "2")  # a claim takes 2 at most
    one_due_now_and_one_later(engine, server, "A", "B")
    for n in range(5):
        serve(server, f"/c{n}", rss([(f"c{n}", f"C{n}")]))
        with engine.begin() as conn:
            add_source(conn, server.url(f"/c{n}"))
    over = (datetime.now(UTC) - timedelta(seconds=1)).isoformat(timespec="seconds")
    result = ingest_lingering(db_url, 600, tags={LINGER_TAG: over})
    assert result.success
    assert sorted(r["path"] for r in server.requests if r["method"] == "GET") == ["/a", *(f"/c{n}" for n in range(5))]


def test_the_processor_and_notifier_sensors_leave_the_work_to_a_running_ingest_run(engine, db_url):
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/x")
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="a", url="http://x/a", raw_json={"url": "http://x/a"}, content_hash="h"))
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_run(DagsterRun(job_name="ingest", run_id="r1", status=dg.DagsterRunStatus.STARTED,
                                    tags={STAGE_TAG: "collector"}))
        result, _ = tick(unprocessed_listings_sensor, instance, db_url)
        assert isinstance(result, dg.SkipReason) and "1 ingest run(s) going" in result.skip_message
        instance.report_run_failed(instance.get_run_by_id("r1"))
        result, _ = tick(unprocessed_listings_sensor, instance, db_url)
        assert isinstance(result, dg.RunRequest), "once it has ended, the processor takes the work"


def test_a_follow_up_failing_round_after_round_is_logged_once_and_once_when_it_works_again(caplog):
    """The database refusing writes while a lingering run fetched: each follow-up thread
    logged a traceback every round (a second), 120 of them in two minutes, burying the
    run's other lines. Now one line as the failures start and one as a pass works again;
    the failures are still tried every round (30 s at most here)."""
    rounds: Counter[str] = Counter()
    worked = threading.Event()

    def flaky() -> passes.Pass:
        rounds["tried"] += 1
        if rounds["tried"] <= 5:
            raise RuntimeError("cannot execute UPDATE in a read-only transaction")
        worked.set()
        return _pass(LISTINGS)

    with caplog.at_level(logging.WARNING, logger="assets.stages"), FollowUps([flaky], CarriedPasses(), every=0.01):
        assert worked.wait(30), "tried again each round until it worked"
    said = [r.getMessage() for r in caplog.records if r.name == "assets.stages"]
    assert said == ["a follow-up pass during the collector's failed; trying again each round, quietly until one works",
                    "a follow-up pass during the collector's works again, after 5 failed rounds"]

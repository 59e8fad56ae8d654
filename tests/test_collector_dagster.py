"""The collector in Dagster: the listings_raw stage and due_sources_sensor."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.storage.dagster_run import DagsterRun

from assets.policies import LINGER_TAG, run_worker
from assets.stages import STAGES_OP, stage_assets
from pipeline.storage import schema
from pipeline.storage.status import next_due_in
from resources import PipelineDatabase
from sensors import runs
from sensors.due_sources import STAGE_TAG, due_sources_sensor
from tests.conftest import conformance
from tests.helpers import add_source, now
from tests.http_server import LocalServer
from tests.test_collector import rss, serve


@pytest.fixture
def server():
    srv = LocalServer().start()
    yield srv
    srv.stop()


def materialize(db_url: str, *keys: str, **kwargs) -> dg.ExecuteInProcessResult:
    """The stages named (all three when none is), as a job selecting them runs them."""
    return dg.materialize([stage_assets], selection=list(keys) or None,
                          resources={"database": PipelineDatabase(database_url=db_url)}, **kwargs)


def made(result: dg.ExecuteInProcessResult, asset: str, kind=dg.AssetMaterialization) -> list:
    """The materialisations (or observations) of ``asset`` the run recorded."""
    recorded = (result.asset_materializations_for_node(STAGES_OP) if kind is dg.AssetMaterialization
                else result.asset_observations_for_node(STAGES_OP))
    return [m for m in recorded if m.asset_key == dg.AssetKey(asset)]


def metadata_of(result: dg.ExecuteInProcessResult, asset: str, kind=dg.AssetMaterialization) -> dict:
    [materialization] = made(result, asset, kind)
    return {k: v.value for k, v in materialization.metadata.items()}


def test_the_asset_runs_a_collector_pass_and_reports_its_totals(engine, db_url, server, monkeypatch):
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    serve(server, "/feed", rss([("a", "A"), ("b", "B")]))
    server.routes["/down"] = lambda h: h.reply(500, b"no")
    with engine.begin() as conn:
        add_source(conn, server.url("/feed"))
        add_source(conn, server.url("/down"))
    result = materialize(db_url, "listings_raw")
    assert result.success, "a failing source does not fail the step"
    metadata = metadata_of(result, "listings_raw")
    assert (metadata["claimed"], metadata["fetched"], metadata["failed"]) == (2, 1, 1)
    assert (metadata["items_new"], metadata["failed_http_5xx"]) == (2, 1)
    assert metadata["fetch_latency_p50_ms"] >= 0 and metadata["fetch_latency_p95_ms"] >= 0


def evaluate(instance: dg.DagsterInstance, db_url: str, cursor: str | None = None):
    """One tick; returns what it asked for and the cursor it left."""
    with dg.build_sensor_context(
        instance=instance, cursor=cursor,
        resources={"database": PipelineDatabase(database_url=db_url)},
    ) as context:
        return unwrap(due_sources_sensor(context)), context.cursor


def recorded_events(db_url: str, cursor: str | None, kind: type) -> tuple[list, str | None]:
    """One tick, on an instance of its own: the asset events of ``kind`` it recorded
    (observations, check evaluations), and the cursor it left."""
    with dg.DagsterInstance.ephemeral() as instance, dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"database": PipelineDatabase(database_url=db_url)},
    ) as context:
        result = due_sources_sensor(context)
        return [e for e in result.asset_events if isinstance(e, kind)], context.cursor


def unwrap(result: dg.SensorResult) -> dg.RunRequest | dg.SkipReason:
    """The tick's one decision: a run request, or the reason it skipped."""
    assert isinstance(result, dg.SensorResult)
    if result.skip_reason is not None:
        assert not result.run_requests
        return result.skip_reason
    [request] = result.run_requests
    return request


@conformance  # its SQL on every database (EXISTS and a scalar subquery in one select)
def test_when_the_next_source_comes_due_as_the_sensor_and_a_lingering_run_read_it(engine):
    """``next_due_in``: None when no enabled source waits (all held or disabled), 0 when
    one was never fetched or its lease ran out, else the seconds to the earliest."""
    def due_in():
        with engine.connect() as conn:
            return next_due_in(conn)

    with engine.begin() as conn:
        held = add_source(conn, "http://127.0.0.1/held", next_fetch_at=now() - timedelta(minutes=1),
                          locked_until=now() + timedelta(minutes=5), claimed_by="w", claim_token="t")
        add_source(conn, "http://127.0.0.1/off", enabled=False)
    assert due_in() is None
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1/later", next_fetch_at=now() + timedelta(minutes=30))
        soon = add_source(conn, "http://127.0.0.1/soon", next_fetch_at=now() + timedelta(minutes=10))
    assert 9 * 60 < due_in() <= 10 * 60
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == soon).values(next_fetch_at=None))
    assert due_in() == 0.0, "never fetched: due now"
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == soon)
                     .values(next_fetch_at=now() + timedelta(minutes=10)))
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == held)
                     .values(locked_until=now() - timedelta(seconds=1)))
    assert due_in() == 0.0, "a lease that ran out: due again now"


def test_the_sensor_requests_a_run_only_when_sources_are_due(engine, db_url):
    with dg.DagsterInstance.ephemeral() as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "no source is due" in result.skip_message
        with engine.begin() as conn:
            add_source(conn, "http://127.0.0.1:9/later", next_fetch_at=now() + timedelta(hours=1))
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason), "a source due later is not due"
        with engine.begin() as conn:
            add_source(conn, "http://127.0.0.1:9/now")
        result, cursor = evaluate(instance, db_url, cursor="41")
        assert isinstance(result, dg.RunRequest)
        assert result.run_key == "due-sources-42" and json.loads(cursor)["tick"] == 42
        assert result.tags[STAGE_TAG] == "collector" and result.tags["pipeline/due_sources"] == "1"


def test_the_sensor_waits_while_the_collector_pool_is_full(engine, db_url, monkeypatch):
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "1")
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/now")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_run(
            DagsterRun(job_name="collect", run_id="r1", status=dg.DagsterRunStatus.STARTED,
                       tags={STAGE_TAG: "collector"})
        )
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason)
        assert "1 collector runs active, the limit is 1" in result.skip_message


def test_the_sensor_observes_the_backlog_when_it_changes_and_every_ten_minutes(engine, db_url, monkeypatch):
    """A tick records the due sources and the oldest one's age as an observation of
    listings_raw, whether it asks for a run or not, so the UI plots the backlog: when a
    count changed since the last one recorded, else every OBSERVE_EVERY_SECONDS. One per
    tick grew the event log without end, and made every tick read "0 runs requested"."""
    clock = [1_000_000.0]
    monkeypatch.setattr("sensors.runs.wall_clock", lambda: clock[0])
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/a", next_fetch_at=now() - timedelta(minutes=10))
        add_source(conn, "http://127.0.0.1:9/b", next_fetch_at=now() - timedelta(minutes=2))

    def tick(cursor):
        return recorded_events(db_url, cursor, dg.AssetObservation)

    observations, cursor = tick(None)
    [observation] = observations
    assert isinstance(observation, dg.AssetObservation) and observation.asset_key == dg.AssetKey("listings_raw")
    metadata = {k: v.value for k, v in observation.metadata.items()}
    assert metadata["due_sources_waiting"] == 2
    assert 600 <= metadata["due_sources_oldest_age_seconds"] < 3600
    clock[0] += 10
    observations, cursor = tick(cursor)
    assert observations == [], "the same backlog ten seconds later: nothing new to plot"
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/c")
    observations, cursor = tick(cursor)
    assert [{k: v.value for k, v in e.metadata.items()}["due_sources_waiting"] for e in observations] == [3]
    clock[0] += 599
    assert tick(cursor)[0] == []
    clock[0] += 1
    assert len(tick(cursor)[0]) == 1, "an unchanged backlog is plotted every ten minutes"


def test_the_sensor_records_the_freshness_check_when_its_verdict_changes(engine, db_url, monkeypatch):
    """Work left waiting past PIPELINE_FRESHNESS_MAX_MINUTES is told though no run
    materialises anything (a run stuck while alive, none launched): the stage's sensor
    records the asset's freshness check from the waits it reads anyway, when the verdict
    changes and every ten minutes. The check ran only after a materialisation or on the
    15-minute schedule: a stage that stopped was told an hour and more later."""
    clock = [1_000_000.0]
    monkeypatch.setattr("sensors.runs.wall_clock", lambda: clock[0])
    monkeypatch.setenv("PIPELINE_FRESHNESS_MAX_MINUTES", "5")
    with engine.begin() as conn:
        stuck = add_source(conn, "http://127.0.0.1:9/a", next_fetch_at=now() - timedelta(minutes=10))

    def judged(cursor):
        return recorded_events(db_url, cursor, dg.AssetCheckEvaluation)

    [evaluation], cursor = judged(None)
    assert (evaluation.asset_key, evaluation.check_name, evaluation.passed) == (
        dg.AssetKey("listings_raw"), "freshness", False)
    assert evaluation.description == "oldest waiting work: 10 min (limit 5)"
    clock[0] += 30
    assert judged(cursor)[0] == [], "the same verdict: nothing recorded"
    with engine.begin() as conn:
        conn.execute(schema.sources.update().where(schema.sources.c.id == stuck)
                     .values(next_fetch_at=now() + timedelta(minutes=10)))
    clock[0] += 30
    [evaluation], cursor = judged(cursor)
    assert evaluation.passed, "taken: fresh again, recorded at once"
    clock[0] += 600
    assert [e.passed for e in judged(cursor)[0]] == [True], "an unchanged verdict is recorded every ten minutes"


def test_the_sensor_records_that_it_looked_at_most_once_a_minute_where_the_metrics_see_it(engine, db_url,
                                                                                         monkeypatch):
    """The daemon's sign of life outside Dagster: a killed daemon stopped every sensor,
    and with them every alert of the daemon's, and nothing outside Dagster could tell
    (PipelineSensorsStopped reads this row's age from the metrics)."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from pipeline.storage.metrics import registry

    clock = [1_000_000.0]
    monkeypatch.setattr("sensors.runs.wall_clock", lambda: clock[0])

    def look(cursor):
        return recorded_events(db_url, cursor, object)[1]

    def last_looked():
        with engine.connect() as conn:
            return conn.execute(sa.select(schema.worker_state.c.last_run_at)
                                .where(schema.worker_state.c.worker_name == "sensor:collector")).scalar()

    cursor = look(None)
    first = last_looked()
    assert first is not None
    clock[0] += 30
    cursor = look(cursor)
    assert last_looked() == first, "half a minute later: not written again"
    clock[0] += 30
    look(cursor)
    assert last_looked() > first
    [family] = [f for f in text_string_to_metric_families(generate_latest(registry(engine)).decode())
                if f.name == "pipeline_worker_last_run_timestamp_seconds"]
    assert {s.labels["worker"]: s.value for s in family.samples} == {"sensor:collector": last_looked().timestamp()}


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING])
def test_the_sensor_asks_for_no_run_while_one_of_its_stage_has_not_started(engine, db_url, status):
    """A queued or starting run will claim the due sources: another request would only
    queue an empty run behind it."""
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/now")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_run(DagsterRun(job_name="collect", run_id="r1", status=status, tags={STAGE_TAG: "collector"}))
        result, _ = evaluate(instance, db_url)
    assert isinstance(result, dg.SkipReason) and "queued or starting" in result.skip_message


def test_an_empty_pass_records_an_observation_not_a_materialisation(engine, db_url):
    result = materialize(db_url, "listings_raw")
    assert result.success
    assert made(result, "listings_raw") == []
    metadata = metadata_of(result, "listings_raw", dg.AssetObservation)
    assert metadata["claimed"] == 0 and metadata["failed_timeout"] == 0, "every failure code, zero-filled"


@pytest.mark.parametrize("status", [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING])
def test_a_run_that_stopped_progressing_holds_no_slot(engine, db_url, monkeypatch, status):
    """A run whose process was killed stays STARTED (or STARTING) in Dagster's records for
    ever under the default run launcher. With no event for PIPELINE_STALE_LEASE_MINUTES
    and no live lease, the sensor does not count it; a live lease keeps it counted."""
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "1")
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/now")
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_run(DagsterRun(job_name="collect", run_id="r1", status=status, tags={STAGE_TAG: "collector"}))
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason), "a run that just started is counted"
        later = time.time() + 11 * 60
        monkeypatch.setattr(runs, "wall_clock", lambda: later)
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.RunRequest), "11 minutes without an event or a lease: not counted"
        with engine.begin() as conn:
            add_source(conn, "http://127.0.0.1:9/held", claimed_by=run_worker("r1"), claim_token="t",
                       locked_until=now() + timedelta(minutes=5))
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason), "a run whose lease is renewed is alive, events or not"


def test_the_sensor_starts_lingering_ingest_runs_and_leaves_due_sources_to_one_that_waits(
    engine, db_url, monkeypatch
):
    """Requested runs linger PIPELINE_INGEST_LINGER_SECONDS (a tag says until when). While
    one lingers waiting (no lease held) it takes due sources within seconds: the sensor
    asks for no other. One busy with a long pass leaves room for another, up to the
    limit; one whose linger is over counts as any active run."""
    monkeypatch.setenv("PIPELINE_INGEST_LINGER_SECONDS", "300")
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/now")
    with dg.DagsterInstance.ephemeral() as instance:
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest)
        assert request.run_config == {"ops": {STAGES_OP: {"config": {"linger_seconds": 300}}}}
        until = request.tags[LINGER_TAG]
        assert datetime.fromisoformat(until) > datetime.now(UTC)
        instance.add_run(DagsterRun(job_name="ingest", run_id="r1", status=dg.DagsterRunStatus.STARTED,
                                    tags={STAGE_TAG: "collector", LINGER_TAG: until}))
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "r1 lingers" in result.skip_message
        with engine.begin() as conn:
            add_source(conn, "http://127.0.0.1:9/slow", claimed_by=run_worker("r1"), claim_token="t",
                       locked_until=now() + timedelta(minutes=5))
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.RunRequest), "r1 is busy fetching: a second run may take the rest"
        later = time.time() + 400
        monkeypatch.setattr(runs, "wall_clock", lambda: later)
        monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "1")
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "1 collector runs active" in result.skip_message
    monkeypatch.setenv("PIPELINE_INGEST_LINGER_SECONDS", "0")
    with dg.DagsterInstance.ephemeral() as instance:
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest) and not request.run_config and LINGER_TAG not in request.tags


def test_runs_that_end_together_hand_over_although_they_fill_the_limit(engine, db_url, monkeypatch):
    """Two busy runs at the limit whose lingers both end within the hand-over (after a
    fault their lanes fell into step): the next run is asked for beside them, once. It
    was refused ("2 collector runs active"), so both stopped claiming before the next
    was asked for, and nothing was claimed for a wind-down, a look and a start. With one
    lingering on, the limit holds as before."""
    monkeypatch.setenv("PIPELINE_INGEST_LINGER_SECONDS", "300")
    monkeypatch.setenv("PIPELINE_SENSOR_INTERVAL_SECONDS", "30")
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "2")
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/due")
        for run_id in ("r1", "r2", "r3"):  # each busy fetching: it holds a lease
            add_source(conn, f"http://127.0.0.1:9/{run_id}", claimed_by=run_worker(run_id), claim_token="t",
                       locked_until=now() + timedelta(minutes=5))

    def runs_lingering(**left: float) -> dg.DagsterInstance:
        instance = dg.DagsterInstance.ephemeral()
        for run_id, seconds in left.items():
            until = (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="seconds")
            instance.add_run(DagsterRun(job_name="ingest", run_id=run_id, status=dg.DagsterRunStatus.STARTED,
                                        tags={STAGE_TAG: "collector", LINGER_TAG: until}))
        return instance

    with runs_lingering(r1=20, r2=40) as instance:
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest), "both end within the hand-over: the next starts beside them"
    with runs_lingering(r1=20, r2=40, r3=290) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "3 collector runs active" in result.skip_message
    with runs_lingering(r1=20, r2=200) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "2 collector runs active" in result.skip_message, \
            "r2 lingers on: no hand-over yet"


def test_a_lingering_run_hands_over_to_the_next_before_its_linger_ends(engine, db_url, monkeypatch):
    """In its last look interval and HANDOVER_START_SECONDS, a lingering run no longer
    keeps the sensor from asking for the next run when a source comes due by then: the
    next run starts before this one ends (the sensor waited for it to end, and sources due
    in between waited up to a look and a run's start: bench/soak_stack.py saw no fetch for
    30 s at every hand-over). When nothing comes due by then, or the linger has longer to
    go, the sensor waits as before. Busy or waiting for work, alike."""
    monkeypatch.setenv("PIPELINE_INGEST_LINGER_SECONDS", "300")
    monkeypatch.setenv("PIPELINE_SENSOR_INTERVAL_SECONDS", "30")
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1:9/soon", next_fetch_at=now() + timedelta(seconds=40))

    def lingering_until(seconds: float, successor: float | None = None) -> dg.DagsterInstance:
        """r1 lingering ``seconds`` more; with a ``successor``, r2 lingering that long,
        added before r1 (the records come newest first: r1 is read first)."""
        instance = dg.DagsterInstance.ephemeral()
        runs = [("r1", seconds)] if successor is None else [("r2", successor), ("r1", seconds)]
        for run_id, left in runs:
            until = (datetime.now(UTC) + timedelta(seconds=left)).isoformat(timespec="seconds")
            instance.add_run(DagsterRun(job_name="ingest", run_id=run_id, status=dg.DagsterRunStatus.STARTED,
                                        tags={STAGE_TAG: "collector", LINGER_TAG: until}))
        return instance

    with lingering_until(20) as instance:
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest), "r1 ends in 20 s, a source comes due in 40: the next run is asked for"
        assert datetime.fromisoformat(request.tags[LINGER_TAG]) > datetime.now(UTC) + timedelta(seconds=250)
    with lingering_until(200) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "r1 lingers" in result.skip_message, "r1 takes it"
    # Busy: r1 holds a lease (fetching), as a lingering run under a steady stream of due
    # sources always does. Its end was no hand-over: the next run was asked for only
    # once r1 had ended and a source was due (a look and a start with no fetch).
    with engine.begin() as conn:
        busy = add_source(conn, "http://127.0.0.1:9/busy", claimed_by=run_worker("r1"), claim_token="t",
                          locked_until=now() + timedelta(minutes=5))
    with lingering_until(20) as instance:
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest), "r1 is busy and ends in 20 s, a source comes due in 40"
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "5")
    with lingering_until(20, successor=280) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason), "its successor lingers on: r1 ending busy is no reason to ask"
    # A stalled run (no event for 11 minutes, no lease: its container killed) takes
    # nothing, however long its tag says it lingers: r1's end is still the hand-over.
    later = time.time() + 11 * 60
    monkeypatch.setattr(runs, "wall_clock", lambda: later)
    with dg.DagsterInstance.ephemeral() as instance:
        for run_id, left in (("dead", 250), ("r1", 20)):
            until = datetime.fromtimestamp(later + left, UTC).isoformat(timespec="seconds")
            instance.add_run(DagsterRun(job_name="ingest", run_id=run_id, status=dg.DagsterRunStatus.STARTED,
                                        tags={STAGE_TAG: "collector", LINGER_TAG: until}))
        request, _ = evaluate(instance, db_url)
        assert isinstance(request, dg.RunRequest), "r1 ends in 20 s; the stalled run's linger takes nothing"
        assert "dagster/max_runtime" not in instance.get_run_by_id("dead").tags, "its linger is not over"
    # Past its linger by as long again, it waits for nothing: it is ended through run
    # monitoring (a runtime limit it has passed), where it held its slots for the hour.
    later += 300 + 11 * 60
    with dg.DagsterInstance.ephemeral() as instance:
        until = datetime.fromtimestamp(later - 11 * 60 - 1, UTC).isoformat(timespec="seconds")
        instance.add_run(DagsterRun(job_name="ingest", run_id="dead", status=dg.DagsterRunStatus.STARTED,
                                    tags={STAGE_TAG: "collector", LINGER_TAG: until}))
        evaluate(instance, db_url)
        tags = instance.get_run_by_id("dead").tags
        assert 0 < int(tags["dagster/max_runtime"]) < later - time.time() + 60, "a limit it has passed"
        assert "no live lease, past its linger" in tags["pipeline/stalled"]
        evaluate(instance, db_url)
        assert instance.get_run_by_id("dead").tags == tags, "once"
    monkeypatch.undo()
    monkeypatch.setenv("PIPELINE_INGEST_LINGER_SECONDS", "300")
    monkeypatch.setenv("PIPELINE_SENSOR_INTERVAL_SECONDS", "30")
    monkeypatch.delenv("PIPELINE_COLLECTOR_MAX_RUNS", raising=False)
    with engine.begin() as conn:
        conn.execute(sa.delete(schema.sources).where(schema.sources.c.id == busy))
    monkeypatch.setenv("PIPELINE_COLLECTOR_MAX_RUNS", "5")
    with lingering_until(20, successor=280) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "lingers, waiting" in result.skip_message, \
            "its successor lingers: r1 ending is no reason to ask again"
        assert "r1" not in result.skip_message
    monkeypatch.delenv("PIPELINE_COLLECTOR_MAX_RUNS")
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source)
                     .values(next_fetch_at=now() + timedelta(hours=1)))
    with lingering_until(20) as instance:
        result, _ = evaluate(instance, db_url)
        assert isinstance(result, dg.SkipReason) and "no work comes due" in result.skip_message, \
            "nothing comes due before a run asked at the next look could take it"

"""The operator hears when the pipeline needs a person (sensors/alerts.py,
pipeline/notify/operator.py): a failed run once, with its link and error; an asset check
once when it starts failing and once when it passes again; through a signed webhook or
Apprise, served here by a local receiver. Nothing is passed over: with no channel, or a
send that fails, the tick fails naming what went untold, and the next tells it.

Each runs on the Dagster storages the project runs on: the run-sharded SQLite that
``dev.py up`` makes (whose event log refuses a plain event cursor) and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from pipeline.notify.delivery import verify
from pipeline.storage import db
from sensors.alerts import (
    NOT_CONFIGURED,
    NotTold,
    check_alerts,
    retry_alerts,
    run_failure_alert,
    tick_alerts,
)
from tests.helpers import wait_until
from tests.test_pipeline_dagster import resources

SECRET = "operator-shared-secret-0123"
VERDICT = {"passed": False}


@dg.asset
def watched() -> int:
    return 1


@dg.asset_check(asset=watched)
def healthy() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=VERDICT["passed"], description="3 sources failing, 1 disabled by failures")


@dg.op
def breaks() -> None:
    raise RuntimeError("the feed parser fell over")


@dg.job
def broken() -> None:
    breaks()


# The database refusing writes for a while: the step's first attempt fails, the next waits
# for the test to let it go on (the run lives, retrying) and works, unless HOPELESS.
GO_ON = threading.Event()
REFUSED = "cannot execute UPDATE in a read-only transaction"


@dg.op(retry_policy=dg.RetryPolicy(max_retries=1), config_schema={"hopeless": bool})
def writes(context) -> None:  # unannotated: Dagster refuses this module's string annotation
    if context.retry_number == 0 or context.op_config["hopeless"]:
        raise RuntimeError(REFUSED)
    assert GO_ON.wait(120), "the test lets the retried attempt go on"


@dg.job(config={"ops": {"writes": {"config": {"hopeless": False}}}})
def retried() -> None:
    writes()


# An asset whose check is evaluated twice in one step, as a lingering run evaluates its
# checks after every pass: passing, then (once the test has looked) failing.
LOOKED = threading.Event()


@dg.asset(check_specs=[dg.AssetCheckSpec("steady", asset="lingering")])
def lingering(context):  # noqa: ANN001, ANN201 (unannotated: Dagster refuses this module's string annotations)
    context.log_event(dg.AssetCheckEvaluation(asset_key=dg.AssetKey("lingering"), check_name="steady", passed=True))
    assert LOOKED.wait(120), "the test looks between the two evaluations"
    yield dg.MaterializeResult()
    yield dg.AssetCheckResult(check_name="steady", passed=False, description="its work waits")


DEFINITIONS = dg.Definitions(assets=[watched, lingering], asset_checks=[healthy], jobs=[broken, retried])


@pytest.fixture(params=["sqlite", "postgresql"])
def instance(request, tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance on each storage the project runs on: SQLite as ``dev.py up``
    makes it (run-sharded), and PostgreSQL, in a database of its own that this test
    creates (dagster-postgres makes its tables in it)."""
    if request.param == "sqlite":
        with dg.DagsterInstance.local_temp(str(tmp_path)) as made:
            assert made.event_log_storage.is_run_sharded, "as dev.py up's storage is"
            yield made
        return
    databases = request.getfixturevalue("pg_databases")
    name = databases.create()
    url = db.parse_url(databases.url(name)).set(drivername="postgresql+psycopg2")
    (tmp_path / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url: " + json.dumps(url.render_as_string(hide_password=False)) + "\n")
    try:
        with dg.DagsterInstance.from_config(str(tmp_path)) as made:
            yield made
    finally:
        databases.drop(name)


def tick(sensor, instance: dg.DagsterInstance, db_url: str, cursor: str | None = None) -> tuple[dg.SkipReason, str | None]:
    """One tick of ``sensor``: its skip reason (it never requests a run) and cursor."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(db_url),
                                 definitions=DEFINITIONS) as context:
        return sensor(context), context.cursor


def evaluate(instance: dg.DagsterInstance, passed: bool) -> None:
    VERDICT["passed"] = passed
    dg.materialize([watched, healthy], instance=instance)


def alerts(receiver) -> list[dict]:
    """The alerts the receiver was sent, each checked for its signature."""
    found = []
    for request in receiver.requests:
        assert verify(SECRET, request["body"], request["headers"]), "signed with the operator's secret"
        found.append(json.loads(request["body"]))
    return found


@pytest.fixture
def operator_webhook(receiver, monkeypatch):
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_URL", receiver.url("/hook"))
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_SECRET", SECRET)
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    monkeypatch.setenv("PIPELINE_UI_URL", "http://ui.example:3000/")
    return receiver


def test_a_check_alerts_once_when_it_starts_failing_and_once_when_it_passes_again(instance, db_url, operator_webhook):
    receiver = operator_webhook
    evaluate(instance, passed=False)
    result, cursor = tick(check_alerts, instance, db_url)
    [failing] = alerts(receiver)
    assert (failing["event"], failing["title"]) == ("check_failing", "Asset check watched:healthy is failing (ERROR)")
    assert "3 sources failing" in failing["text"] and failing["link"] == "http://ui.example:3000/assets/watched?view=checks"
    assert "failing now: watched:healthy" in result.skip_message
    for _ in range(2):  # a second tick on the same result, and a new result failing still
        result, cursor = tick(check_alerts, instance, db_url, cursor)
        assert len(receiver.requests) == 1, "still failing: nothing more"
        evaluate(instance, passed=False)
    receiver.routes["/hook"] = lambda h: h.reply(503, b"down")
    evaluate(instance, passed=True)
    with pytest.raises(NotTold, match="not told that watched:healthy passes again"):  # the cursor stays
        tick(check_alerts, instance, db_url, cursor)
    receiver.routes["/hook"] = lambda h: h.reply(204)
    result, cursor = tick(check_alerts, instance, db_url, cursor)
    refused, passing = alerts(receiver)[1:]
    assert refused == passing and passing["event"] == "check_passing", "sent again, under the same key"
    assert "failing now: none" in result.skip_message
    result, _ = tick(check_alerts, instance, db_url, cursor)
    assert "0 alerts sent" in result.skip_message and len(receiver.requests) == 3


def test_a_failure_that_came_and_went_between_two_looks_is_told_failing_then_passing(instance, db_url,
                                                                                     operator_webhook):
    """The sensor looks once a minute; a check that failed and passed again in between
    (a hub that forgot its subscriber and was asked again within seconds, in the fault
    drill on SQLite) is still told: its first failure, then that it passes. Told by
    its latest result alone, it was never told at all."""
    receiver = operator_webhook
    evaluate(instance, passed=True)
    _, cursor = tick(check_alerts, instance, db_url)
    assert receiver.requests == []
    evaluate(instance, passed=False)
    evaluate(instance, passed=False)
    evaluate(instance, passed=True)
    result, cursor = tick(check_alerts, instance, db_url, cursor)
    assert [a["event"] for a in alerts(receiver)] == ["check_failing", "check_passing"]
    assert "failing now: none" in result.skip_message
    tick(check_alerts, instance, db_url, cursor)
    assert len(receiver.requests) == 2, "told once"


def test_a_check_that_fails_later_in_the_same_run_is_told(instance, db_url, operator_webhook):
    """A run's check execution is one record, rewritten by each evaluation in the run: a
    lingering run evaluates its checks after every pass, and the sensor, which marked
    the records it had read by their ids, read none of the later evaluations. In the
    fault drill a user's webhook answering 410 failed ``failing_channels`` for 4 minutes
    of one lingering run and nobody was told. The run executes on a thread of the
    test's, its second evaluation held until the test has looked."""
    receiver = operator_webhook
    LOOKED.clear()
    running = threading.Thread(target=dg.materialize, args=([lingering],), kwargs={"instance": instance})
    running.start()
    key = dg.AssetCheckKey(dg.AssetKey("lingering"), "steady")
    try:
        wait_until("the first evaluation", lambda: any(
            r.event is not None and isinstance(r.event.dagster_event.event_specific_data, dg.AssetCheckEvaluation)
            for r in instance.event_log_storage.get_asset_check_execution_history(key, limit=5)), 60, 0.1)
        result, cursor = tick(check_alerts, instance, db_url)
        assert receiver.requests == [] and "failing now: none" in result.skip_message
    finally:
        LOOKED.set()
        running.join()
    result, cursor = tick(check_alerts, instance, db_url, cursor)
    [failing] = alerts(receiver)
    assert (failing["event"], failing["details"]["check"]) == ("check_failing", "lingering:steady")
    assert "failing now: lingering:steady" in result.skip_message


def test_a_failed_run_alerts_once_with_its_link_and_error(instance, db_url, operator_webhook):
    receiver = operator_webhook
    result, cursor = tick(run_failure_alert, instance, db_url)
    assert result.skip_message == "no run failed since the last look" and cursor is None
    run = broken.execute_in_process(instance=instance, raise_on_error=False)
    result, cursor = tick(run_failure_alert, instance, db_url, cursor)
    [alert] = alerts(receiver)
    assert (alert["event"], alert["title"], alert["idempotency_key"]) == (
        "run_failed", "Dagster run of broken failed", f"run-failed-{run.run_id}")
    assert alert["link"] == f"http://ui.example:3000/runs/{run.run_id}"
    assert "RuntimeError: the feed parser fell over" in alert["details"]["steps"]["breaks"]
    assert "breaks: " in alert["text"] and result.skip_message == "1 failed runs told"
    result, cursor = tick(run_failure_alert, instance, db_url, cursor)
    assert result.skip_message == "no run failed since the last look" and len(receiver.requests) == 1
    # A send that fails fails the tick and keeps the failure for the next.
    receiver.routes["/hook"] = lambda h: h.reply(503, b"down")
    again = broken.execute_in_process(instance=instance, raise_on_error=False)
    with pytest.raises(NotTold, match=f"not told the failure of run {again.run_id}"):
        tick(run_failure_alert, instance, db_url, cursor)
    receiver.routes["/hook"] = lambda h: h.reply(204)
    tick(run_failure_alert, instance, db_url, cursor)
    assert [a["details"]["run_id"] for a in alerts(receiver)] == [run.run_id, again.run_id, again.run_id]


def test_without_a_channel_a_failure_fails_the_tick_and_is_told_once_there_is_one(
    instance, db_url, receiver, monkeypatch
):
    """No channel: nothing to tell skips saying so; something to tell fails every tick,
    naming it, and moves past nothing, so a channel set later hears it all."""
    monkeypatch.delenv("PIPELINE_OPERATOR_ALERT_URL", raising=False)
    result, check_cursor = tick(check_alerts, instance, db_url)
    assert result.skip_message.endswith(NOT_CONFIGURED)
    _, run_cursor = tick(run_failure_alert, instance, db_url)
    evaluate(instance, passed=False)
    run = broken.execute_in_process(instance=instance, raise_on_error=False)
    for _ in range(2):
        with pytest.raises(NotTold, match="untold: watched:healthy is failing"):
            tick(check_alerts, instance, db_url, check_cursor)
        with pytest.raises(NotTold, match=f"1 failed runs untold \\(broken {run.run_id}\\)"):
            tick(run_failure_alert, instance, db_url, run_cursor)
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_URL", receiver.url("/hook"))
    monkeypatch.setenv("PIPELINE_OPERATOR_ALERT_SECRET", SECRET)
    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    tick(check_alerts, instance, db_url, check_cursor)
    tick(run_failure_alert, instance, db_url, run_cursor)
    assert sorted(a["event"] for a in alerts(receiver)) == ["check_failing", "run_failed"]


def test_a_step_retrying_is_told_while_its_run_lives_and_once_when_it_works_again(instance, db_url,
                                                                                 operator_webhook):
    """The database refusing writes for two minutes: the stage's step fails, waits, and
    its retry works, so no run fails and ``run_failure_alert`` has nothing to tell (the
    fault drill: told by nothing, the work 2.5 minutes late at p95). The retry is told
    while the run still lives; its working again once. The run executes on a thread of
    the test's, its retried attempt held until the test has looked."""
    receiver = operator_webhook
    GO_ON.clear()
    result, cursor = tick(retry_alerts, instance, db_url)
    assert "0 run events read" in result.skip_message
    running = threading.Thread(target=retried.execute_in_process, kwargs={"instance": instance})
    running.start()
    try:
        [run] = wait_until("the run's step waiting to retry", lambda: [
            r for r in instance.get_runs() if instance.all_logs(r.run_id, of_type=dg.DagsterEventType.STEP_RESTARTED)],
            60, 0.1)
        result, cursor = tick(retry_alerts, instance, db_url, cursor)
        [retrying] = alerts(receiver)
        assert (retrying["event"], retrying["title"]) == ("step_retrying", "Run of retried is retrying writes (retry 1)")
        assert REFUSED in retrying["text"] and retrying["link"] == f"http://ui.example:3000/runs/{run.run_id}"
        assert f"failing now: run {run.run_id}" in result.skip_message
        result, cursor = tick(retry_alerts, instance, db_url, cursor)
        assert len(receiver.requests) == 1, "still retrying: told once"
    finally:
        GO_ON.set()
        running.join()
    result, cursor = tick(retry_alerts, instance, db_url, cursor)
    assert [a["event"] for a in alerts(receiver)] == ["step_retrying", "step_working"]
    assert alerts(receiver)[1]["title"] == "Run of retried works again after 1 retries of writes"
    assert "failing now: none" in result.skip_message
    tick(retry_alerts, instance, db_url, cursor)
    assert len(receiver.requests) == 2


def test_retries_between_two_looks_are_told_and_a_run_they_did_not_save_is_left_to_run_failure_alert(
    instance, db_url, operator_webhook, monkeypatch
):
    """A retry that came and went between two looks is told, retrying then working; one
    whose run failed for good is told retrying, the run's failure is
    ``run_failure_alert``'s, and the run is forgotten once a look no longer reads it (no
    overlap between looks here, so the next one does not)."""
    monkeypatch.setattr("sensors.alerts.LOOK_OVERLAP_SECONDS", 0)
    receiver = operator_webhook
    GO_ON.set()
    _, cursor = tick(retry_alerts, instance, db_url)
    saved = retried.execute_in_process(instance=instance)
    lost = retried.execute_in_process(instance=instance, raise_on_error=False,
                                      run_config={"ops": {"writes": {"config": {"hopeless": True}}}})
    assert not lost.success
    result, cursor = tick(retry_alerts, instance, db_url, cursor)
    told = {(a["details"]["run_id"], a["event"]) for a in alerts(receiver)}
    assert told == {(saved.run_id, "step_retrying"), (saved.run_id, "step_working"), (lost.run_id, "step_retrying")}
    assert f"failing now: run {lost.run_id}" in result.skip_message
    result, cursor = tick(retry_alerts, instance, db_url, cursor)
    assert "failing now: none" in result.skip_message and len(receiver.requests) == 3
    assert json.loads(cursor)["seen"] == {}, "ended runs leave nothing in the cursor"


BOOM = """
import os
import dagster as dg

@dg.sensor(minimum_interval_seconds=1, default_status=dg.DefaultSensorStatus.RUNNING)
def boom():
    if os.path.exists(os.environ["BOOM_FLAG"]):
        raise RuntimeError("the source table is gone")
    return dg.SkipReason("all well")

defs = dg.Definitions(sensors=[boom])
"""


def test_a_sensor_whose_ticks_fail_is_told_once_with_its_error_and_once_when_it_works_again(
    tmp_path, db_url, operator_webhook
):
    """Starts the Dagster daemon (a process of its own, for up to a minute) on a
    definitions file whose sensor raises while a flag file exists: the ticks a daemon
    records are what ``tick_alerts`` reads, and only the daemon makes them. A sensor
    that raised on every tick (a stage sensor that cannot read the database, an alert
    sensor that cannot send) was red in the UI and told to nobody."""
    receiver = operator_webhook
    home, flag = tmp_path / "home", tmp_path / "boom"
    home.mkdir()
    (tmp_path / "defs.py").write_text(BOOM)
    flag.touch()
    env = {**os.environ, "DAGSTER_HOME": str(home), "BOOM_FLAG": str(flag)}
    daemon = subprocess.Popen([str(Path(sys.executable).parent / "dagster-daemon"), "run", "-f", str(tmp_path / "defs.py")],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            def ticks() -> list:
                return [t for state in instance.all_instigator_state()
                        for t in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=5)
                        if t.is_completed]

            wait_until("a failed tick of boom", lambda: any(t.is_failure for t in ticks()), 120, 0.5)
            result, cursor = tick(tick_alerts, instance, db_url)
            [failing] = alerts(receiver)
            assert (failing["event"], failing["title"]) == ("ticks_failing", "Sensor boom fails its ticks")
            assert "RuntimeError: the source table is gone" in failing["text"]
            assert failing["link"] == "http://ui.example:3000/automation"
            assert "failing now: sensor boom" in result.skip_message
            failed = max(t.timestamp for t in ticks())
            wait_until("another failed tick", lambda: max(t.timestamp for t in ticks()) > failed, 120, 0.5)
            result, cursor = tick(tick_alerts, instance, db_url, cursor)
            assert len(receiver.requests) == 1, "still failing: told once"
            flag.unlink()
            wait_until("a tick that works", lambda: any(not t.is_failure for t in ticks()), 120, 0.5)
            result, cursor = tick(tick_alerts, instance, db_url, cursor)
            assert [a["event"] for a in alerts(receiver)] == ["ticks_failing", "ticks_working"]
            assert "failing now: none" in result.skip_message
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)


def test_the_operator_command_sends_a_test_and_tells_what_a_supervisor_saw(operator_webhook, monkeypatch):
    """`pipeline operator test` tries the channel; `operator tell` is how `dev.py up`
    tells that it restarted a stack whose services died. Without a channel: one line,
    status 1."""
    import pipeline.notify.operator as events
    from pipeline.cli.operator import operator_tell
    from tests.test_cli import run

    receiver = operator_webhook
    done = run("operator", "test")
    assert done.returncode == 0 and done.stdout == "told the operator: Test alert from the listings pipeline\n"
    done = run("operator", "tell", "--event", "stack_restarted", "dev.py restarted the Dagster stack",
               "dagster dev exited on its own (status 1)")
    assert done.returncode == 0, done.stderr
    test, restarted = alerts(receiver)
    assert test["event"] == "test"
    assert (restarted["event"], restarted["title"], restarted["text"]) == (
        "stack_restarted", "dev.py restarted the Dagster stack", "dagster dev exited on its own (status 1)")
    assert test["idempotency_key"] != restarted["idempotency_key"]
    choices = next(p for p in operator_tell.params if p.name == "event").type.choices
    assert set(choices) == {events.MESSAGE, events.STACK_RESTARTED}, "one home for the events"
    monkeypatch.delenv("PIPELINE_OPERATOR_ALERT_URL")
    done = run("operator", "test")
    assert done.returncode == 1 and done.stderr == "pipeline: PIPELINE_OPERATOR_ALERT_URL is not set\n"


ALERTMANAGER_MESSAGE = {  # Alertmanager's webhook body (version 4), as deploy/alertmanager sends it
    "version": "4", "status": "firing", "receiver": "operator", "externalURL": "http://127.0.0.1:9093",
    "groupKey": "{}:{alertname=\"PipelineDeadNotifications\"}",
    "alerts": [{
        "status": "firing", "fingerprint": "6a1f00c1b2e3d4f5", "startsAt": "2026-12-02T01:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://127.0.0.1:9090/graph?g0.expr=x",
        "labels": {"alertname": "PipelineDeadNotifications", "severity": "warn", "status": "dead"},
        "annotations": {"summary": "3 notifications gave up", "description": "pipeline notifications list"},
    }],
}


def test_alertmanager_s_alerts_reach_the_operator_s_channel_through_pipeline_serve(engine, operator_webhook,
                                                                                  monkeypatch):
    """Prometheus's alerts do not fire into the void: Alertmanager's webhook to `pipeline
    serve`'s /alertmanager (its bearer token checked) is told to the operator's channel,
    signed as every operator alert is; a channel that fails answers 503, so Alertmanager
    sends again. Without PIPELINE_ALERTMANAGER_TOKEN the path does not exist."""
    import httpx

    from pipeline.core.settings import Settings
    from pipeline.web.app import FeedApp
    from tests.helpers import served

    receiver = operator_webhook
    with served(FeedApp(engine, settings=Settings.from_env())) as url:
        assert httpx.post(f"{url}/alertmanager", json=ALERTMANAGER_MESSAGE).status_code == 405, "not set up: none"
    monkeypatch.setenv("PIPELINE_ALERTMANAGER_TOKEN", "am-token-0123456789")
    with served(FeedApp(engine, settings=Settings.from_env())) as url:
        def post(body: object, token: str = "am-token-0123456789") -> httpx.Response:
            return httpx.post(f"{url}/alertmanager", json=body,
                              headers={"Authorization": f"Bearer {token}".encode()})  # bytes: UTF-8 as sent

        assert post(ALERTMANAGER_MESSAGE, token="wrong").status_code == 401
        assert post(ALERTMANAGER_MESSAGE, token="wrōng").status_code == 401, "non-ASCII: refused, not a 500"
        assert post({"alerts": "no"}).status_code == 400
        assert post(ALERTMANAGER_MESSAGE).status_code == 200
        [alert] = alerts(receiver)
        assert (alert["event"], alert["title"]) == (
            "alert_firing", "Prometheus alert PipelineDeadNotifications (warn): 3 notifications gave up")
        assert alert["link"] == "http://127.0.0.1:9090/graph?g0.expr=x" and "status=dead" in alert["text"]
        receiver.routes["/hook"] = lambda h: h.reply(503, b"down")
        resolved = {**ALERTMANAGER_MESSAGE, "alerts": [{**ALERTMANAGER_MESSAGE["alerts"][0], "status": "resolved"}]}
        assert post(resolved).status_code == 503, "not told: Alertmanager sends it again"
        receiver.routes["/hook"] = lambda h: h.reply(204)
        assert post(resolved).status_code == 200
        assert [a["event"] for a in alerts(receiver)] == ["alert_firing", "alert_resolved", "alert_resolved"]

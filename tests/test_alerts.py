"""The operator hears when the pipeline needs a person (sensors/alerts.py,
pipeline/notify/operator.py): a failed run once, with its link and error; an asset check
once when it starts failing and once when it passes again; through a signed webhook or
Apprise, served here by a local receiver; nothing without a configured channel."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from pipeline.core.errors import DeliveryError
from pipeline.notify.delivery import verify
from sensors.alerts import NOT_CONFIGURED, check_alerts, run_failure_alert
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


def tick(instance: dg.DagsterInstance, db_url: str, cursor: str | None = None) -> tuple[dg.SkipReason, str | None]:
    """One tick of ``check_alerts``: its skip reason (it never requests a run) and cursor."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(db_url)) as context:
        return check_alerts(context), context.cursor


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


def test_a_check_alerts_once_when_it_starts_failing_and_once_when_it_passes_again(db_url, operator_webhook):
    receiver = operator_webhook
    with dg.DagsterInstance.ephemeral() as instance:
        evaluate(instance, passed=False)
        result, cursor = tick(instance, db_url)
        [failing] = alerts(receiver)
        assert (failing["event"], failing["title"]) == ("check_failing", "Asset check watched:healthy is failing (ERROR)")
        assert "3 sources failing" in failing["text"] and failing["link"] == "http://ui.example:3000/assets/watched?view=checks"
        assert "failing now: watched:healthy" in result.skip_message
        evaluate(instance, passed=False)
        result, cursor = tick(instance, db_url, cursor)
        assert len(receiver.requests) == 1, "still failing: nothing more"
        receiver.routes["/hook"] = lambda h: h.reply(503, b"down")
        evaluate(instance, passed=True)
        with pytest.raises(DeliveryError):  # the tick fails; its cursor stays where it was
            tick(instance, db_url, cursor)
        receiver.routes["/hook"] = lambda h: h.reply(204)
        result, cursor = tick(instance, db_url, cursor)
        refused, passing = alerts(receiver)[1:]
        assert refused == passing and passing["event"] == "check_passing", "sent again, under the same key"
        assert "failing now: none" in result.skip_message
        result, _ = tick(instance, db_url, cursor)
        assert result.skip_message == "no asset check evaluated since the last look" and len(receiver.requests) == 3


def test_a_failed_run_alerts_once_with_its_link_and_error(db_url, operator_webhook):
    receiver = operator_webhook
    with dg.DagsterInstance.ephemeral() as instance:
        run = broken.execute_in_process(instance=instance, raise_on_error=False)
        [failure] = [e for e in run.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE]
        with dg.build_run_status_sensor_context(
            sensor_name="run_failure_alert", dagster_event=failure, dagster_instance=instance,
            dagster_run=instance.get_run_by_id(run.run_id), resources=resources(db_url),
        ) as context:
            assert run_failure_alert(context.for_run_failure()) is None
    [alert] = alerts(receiver)
    assert (alert["event"], alert["title"], alert["idempotency_key"]) == (
        "run_failed", "Dagster run of broken failed", f"run-failed-{run.run_id}")
    assert alert["link"] == f"http://ui.example:3000/runs/{run.run_id}"
    assert "RuntimeError: the feed parser fell over" in alert["details"]["steps"]["breaks"]
    assert "breaks: " in alert["text"]


def test_without_a_channel_the_alert_sensors_skip_saying_why(db_url, monkeypatch):
    monkeypatch.delenv("PIPELINE_OPERATOR_ALERT_URL", raising=False)
    with dg.DagsterInstance.ephemeral() as instance:
        evaluate(instance, passed=False)
        result, cursor = tick(instance, db_url)
        assert result.skip_message == NOT_CONFIGURED and cursor is None

"""Sensors that tell the operator (pipeline/notify/operator.py).

``run_failure_alert``: once per failed run of this code location, with the run's link and
its steps' errors. ``check_alerts``: once when an asset check starts failing, and once
when it passes again, with its description and the asset's link; a check failing on the
sensor's first look counts as starting to fail. Without PIPELINE_OPERATOR_ALERT_URL both
skip, saying so. A send that fails fails the tick, and the next tick sends again (under
the same idempotency key, so a receiver drops what it had).
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import json
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from pipeline.core.settings import Settings
from pipeline.notify import operator
from resources import PipelineDatabase

NOT_CONFIGURED = "PIPELINE_OPERATOR_ALERT_URL is not set: there is nobody to tell"
EVALUATIONS_PER_TICK = 1000


@dg.run_failure_sensor(
    name="run_failure_alert", default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) of each failed run, once, with its link.",
)
def run_failure_alert(context: dg.RunFailureSensorContext, database: PipelineDatabase) -> dg.SkipReason | None:
    settings = database.settings()
    if not operator.configured(settings):
        return dg.SkipReason(NOT_CONFIGURED)
    operator.send(settings, run_failed(context, settings))
    return None


def run_failed(context: dg.RunFailureSensorContext, settings: Settings) -> operator.OperatorAlert:
    """The alert of the run ``context`` tells of: its job, its failed steps and their errors."""
    run = context.dagster_run
    steps = {}
    for event in context.get_step_failure_events():
        error = event.step_failure_data.error
        while error is not None and error.cause is not None:  # Dagster's wrapper, then what the code raised
            error = error.cause
        steps[str(event.step_key)] = error.message.strip() if error is not None else "no error recorded"
    lines = [f"{step}: {message}" for step, message in steps.items()] or [context.failure_event.message or "failed"]
    return operator.OperatorAlert(
        key=f"run-failed-{run.run_id}", event=operator.RUN_FAILED,
        title=f"Dagster run of {run.job_name} failed",
        text=f"Run {run.run_id} of job {run.job_name} failed.\n" + "\n".join(lines),
        link=f"{settings.ui_url}/runs/{run.run_id}",
        details={"run_id": run.run_id, "job": run.job_name, "steps": steps},
    )


@dataclass(frozen=True)
class Evaluation:
    """One asset check's result, as the event log has it."""

    storage_id: int
    check: str  # "asset:check_name"
    asset_path: tuple[str, ...]
    passed: bool
    severity: str
    description: str | None


def evaluations_after(instance: dg.DagsterInstance, storage_id: int | None, limit: int) -> list[Evaluation]:
    """The asset check results recorded after ``storage_id`` (all, when None), oldest first.
    Dagster's one public reader of them is ``get_event_records`` (deprecated for 2.0,
    when ``fetch_*`` readers take its place): wrapped here, and only here."""
    import warnings

    records_filter = dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION,
                                           after_cursor=storage_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        records = instance.get_event_records(records_filter, limit=limit, ascending=True)
    found = []
    for record in records:
        event = record.event_log_entry.dagster_event
        data = event.event_specific_data if event is not None else None
        if not isinstance(data, dg.AssetCheckEvaluation):
            continue
        key = data.asset_check_key
        found.append(Evaluation(
            record.storage_id, f"{key.asset_key.to_user_string()}:{key.name}", tuple(key.asset_key.path),
            bool(data.passed), data.severity.value, data.description,
        ))
    return found


def changes(failing: Sequence[str], evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """The evaluations that change a check's state (failing or not), each check's last one
    of ``evaluations``, given the checks ``failing`` before them."""
    last = {e.check: e for e in evaluations}
    return [e for e in last.values() if e.passed == (e.check in failing)]


@dg.sensor(
    name="check_alerts", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) once when an asset check starts "
    "failing and once when it passes again.",
)
def check_alerts(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SkipReason:
    settings = database.settings()
    if not operator.configured(settings):
        return dg.SkipReason(NOT_CONFIGURED)
    state = json.loads(context.cursor) if context.cursor else {"after": None, "failing": []}
    evaluations = evaluations_after(context.instance, state["after"], EVALUATIONS_PER_TICK)
    if not evaluations:
        return dg.SkipReason("no asset check evaluated since the last look")
    changed = changes(state["failing"], evaluations)
    failing = set(state["failing"])
    for evaluation in changed:  # a send that fails fails the tick: the cursor stays
        operator.send(settings, check_alert(evaluation, settings))
        (failing.add if not evaluation.passed else failing.discard)(evaluation.check)
    context.update_cursor(json.dumps({"after": evaluations[-1].storage_id, "failing": sorted(failing)}))
    return dg.SkipReason(f"{len(evaluations)} check results read, {len(changed)} alerts sent;"
                         f" failing now: {', '.join(sorted(failing)) or 'none'}")


def check_alert(evaluation: Evaluation, settings: Settings) -> operator.OperatorAlert:
    if evaluation.passed:
        event, title = operator.CHECK_PASSING, f"Asset check {evaluation.check} passes again"
    else:
        event, title = operator.CHECK_FAILING, f"Asset check {evaluation.check} is failing ({evaluation.severity})"
    return operator.OperatorAlert(
        key=f"check-{evaluation.check}-{evaluation.storage_id}", event=event, title=title,
        text=f"{title}: {evaluation.description}" if evaluation.description else title,
        link=f"{settings.ui_url}/assets/{'/'.join(evaluation.asset_path)}?view=checks",
        details={"check": evaluation.check, "passed": evaluation.passed, "severity": evaluation.severity,
                 "description": evaluation.description},
    )


"""Sensors that tell the operator (pipeline/notify/operator.py).

``run_failure_alert``: once per failed run, with the run's link and its steps' errors.
``check_alerts``: once when an asset check starts failing, and once when it passes
again, with its description and the asset's link, from every result since its last look
(a failure that came and went between two looks is told, failing then passing); a check
failing on the sensor's first look counts as starting to fail.

Neither moves past something it did not tell: a send that fails, or a failure with no
PIPELINE_OPERATOR_ALERT_URL to tell it to, fails the tick (red in the sensor's tick
list, with what went untold), and the next tick tries again (under the same idempotency
key, so a receiver drops what it had). With nothing to tell they skip, and say so when
no channel is set. Both read the instance through Dagster's readers that hold on every
storage the project runs on: the run-sharded SQLite of ``dev.py up`` (whose event log
refuses a plain event cursor) and PostgreSQL.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from pipeline.core.settings import Settings
from pipeline.notify import operator
from resources import PipelineDatabase

NOT_CONFIGURED = "PIPELINE_OPERATOR_ALERT_URL is not set: there is nobody to tell"
RUNS_PER_TICK = 50  # failed runs told in one tick; more wait for the next
# The first look (no cursor yet) tells the runs that failed this long before it: a run
# that failed while the daemon started is not passed over.
FIRST_LOOK_SECONDS = 24 * 3600
# A check's latest executions read at each look for its results since the last (one
# planned by a run in flight has none yet): a lingering run evaluates each check after
# every pass, so a minute holds a few of them.
EXECUTIONS_READ = 100


class NotTold(Exception):
    """Something the operator must hear went untold this tick (no channel, or its send
    failed): the tick fails, saying what, and the next tick tries again."""


@dg.sensor(
    name="run_failure_alert", minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) of each failed run, once, with its link; "
    "a failure it could not tell fails the tick and is told at the next.",
)
def run_failure_alert(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SkipReason:
    settings = database.settings()
    after = json.loads(context.cursor)["after"] if context.cursor else None
    failures = failed_runs_after(context.instance, after, RUNS_PER_TICK)
    if not failures:
        said = "no run failed since the last look"
        return dg.SkipReason(said if operator.configured(settings) else f"{said}; {NOT_CONFIGURED}")
    if not operator.configured(settings):
        raise NotTold(f"{NOT_CONFIGURED}: {len(failures)} failed runs untold ("
                      + ", ".join(f"{f.job} {f.run_id}" for f in failures[:5]) + ")")
    for failure in failures:
        tell(settings, run_failed(failure, settings), f"the failure of run {failure.run_id}")
        context.update_cursor(json.dumps({"after": failure.storage_id}))
    return dg.SkipReason(f"{len(failures)} failed runs told")


@dataclass(frozen=True)
class FailedRun:
    """A run's failure, as the event log has it."""

    storage_id: int
    run_id: str
    job: str
    message: str
    steps: Mapping[str, str]  # step key -> the error it raised


def failed_runs_after(instance: dg.DagsterInstance, storage_id: int | None, limit: int) -> list[FailedRun]:
    """The runs that failed after ``storage_id`` (in the last FIRST_LOOK_SECONDS, when
    None), oldest first. ``fetch_run_status_changes`` reads the storage's index of run
    status changes, whose ids are one sequence even where the event log is sharded by
    run (the SQLite storage of ``dev.py up``)."""
    records_filter = dg.RunStatusChangeRecordsFilter(
        event_type=dg.DagsterEventType.RUN_FAILURE, after_storage_id=storage_id,
        after_timestamp=time.time() - FIRST_LOOK_SECONDS if storage_id is None else None)
    found = []
    for record in instance.fetch_run_status_changes(records_filter, limit=limit, ascending=True).records:
        entry = record.event_log_entry
        run = instance.get_run_by_id(entry.run_id)
        steps = {}
        for event in instance.all_logs(entry.run_id, of_type=dg.DagsterEventType.STEP_FAILURE):
            data = event.dagster_event.step_failure_data if event.dagster_event is not None else None
            error = data.error if data is not None else None
            while error is not None and error.cause is not None:  # Dagster's wrapper, then what the code raised
                error = error.cause
            steps[str(event.step_key)] = error.message.strip() if error is not None else "no error recorded"
        message = entry.dagster_event.message if entry.dagster_event is not None else None
        found.append(FailedRun(record.storage_id, entry.run_id, run.job_name if run else "(run deleted)",
                               message or "failed", steps))
    return found


def run_failed(failure: FailedRun, settings: Settings) -> operator.OperatorAlert:
    """The alert of a failed run: its job, its failed steps and their errors."""
    lines = [f"{step}: {message}" for step, message in failure.steps.items()] or [failure.message]
    return operator.OperatorAlert(
        key=f"run-failed-{failure.run_id}", event=operator.RUN_FAILED,
        title=f"Dagster run of {failure.job} failed",
        text=f"Run {failure.run_id} of job {failure.job} failed.\n" + "\n".join(lines),
        link=f"{settings.ui_url}/runs/{failure.run_id}",
        details={"run_id": failure.run_id, "job": failure.job, "steps": dict(failure.steps)},
    )


@dataclass(frozen=True)
class Evaluation:
    """One asset check's result, as the event log has it."""

    record_id: int
    check: str  # "asset:check_name"
    asset_path: tuple[str, ...]
    passed: bool
    severity: str
    description: str | None


def evaluations_since(instance: dg.DagsterInstance, keys: Iterable[dg.AssetCheckKey],
                      seen: Mapping[str, int]) -> dict[str, list[Evaluation]]:
    """Each check's results recorded after the one ``seen`` last (its record id, by
    "asset:check_name"), oldest first; the latest alone for a check not seen yet, none
    for one never evaluated. Read from the instance's record of check executions (an
    index every storage keeps, run-sharded SQLite too), newest first, past executions
    planned by a run that has not evaluated them yet, at most EXECUTIONS_READ of them."""
    found = {}
    for key in keys:
        name = f"{key.asset_key.to_user_string()}:{key.name}"
        after = seen.get(name)
        new = []
        for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=EXECUTIONS_READ):
            if after is not None and record.id <= after:
                break
            event = record.event.dagster_event if record.event is not None else None
            data = event.event_specific_data if event is not None else None
            if isinstance(data, dg.AssetCheckEvaluation):
                new.append(Evaluation(record.id, name, tuple(key.asset_key.path), bool(data.passed),
                                      data.severity.value, data.description))
                if after is None:
                    break  # a check not seen before: its latest result is its state
        if new:
            found[name] = new[::-1]
    return found


def changes(failing: Iterable[str], since: Mapping[str, Sequence[Evaluation]]) -> list[Evaluation]:
    """The results to tell, given the checks told ``failing`` and each check's results
    since the last look (oldest first): a check told passing that failed at any of them
    is told failing (its first failure), and passing again if its latest passes, so a
    failure that came and went between two looks is still told; a check told failing
    whose latest passes is told passing."""
    told, alerts = set(failing), []
    for name, new in sorted(since.items()):
        if name not in told:
            first_failure = next((e for e in new if not e.passed), None)
            if first_failure is None:
                continue
            alerts.append(first_failure)
        if new[-1].passed:
            alerts.append(new[-1])
    return alerts


def check_keys(context: dg.SensorEvaluationContext) -> list[dg.AssetCheckKey]:
    """The asset checks of the sensor's code location."""
    repository = context.repository_def
    return sorted(repository.asset_graph.asset_check_keys, key=str) if repository is not None else []


@dg.sensor(
    name="check_alerts", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) once when an asset check starts "
    "failing and once when it passes again; a change it could not tell fails the tick and is told at the next.",
)
def check_alerts(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SkipReason:
    settings = database.settings()
    keys = check_keys(context)
    names = {f"{key.asset_key.to_user_string()}:{key.name}" for key in keys}
    state = json.loads(context.cursor) if context.cursor else {}
    # A check no longer defined is forgotten.
    failing = set(state.get("failing", [])) & names
    seen = {name: i for name, i in state.get("seen", {}).items() if name in names}
    since = evaluations_since(context.instance, keys, seen)
    changed = changes(failing, since)
    if changed and not operator.configured(settings):
        raise NotTold(f"{NOT_CONFIGURED}: untold: " + ", ".join(
            f"{e.check} {'passes again' if e.passed else 'is failing'}" for e in changed))
    for evaluation in changed:
        tell(settings, check_alert(evaluation, settings),
             f"that {evaluation.check} {'passes again' if evaluation.passed else 'is failing'}")
        (failing.discard if evaluation.passed else failing.add)(evaluation.check)
    seen.update({name: new[-1].record_id for name, new in since.items()})
    context.update_cursor(json.dumps({"failing": sorted(failing), "seen": seen}))
    said = (f"{sum(map(len, since.values()))} check results read, {len(changed)} alerts sent;"
            f" failing now: {', '.join(sorted(failing)) or 'none'}")
    return dg.SkipReason(said if operator.configured(settings) else f"{said}; {NOT_CONFIGURED}")


def tell(settings: Settings, alert: operator.OperatorAlert, what: str) -> None:
    """Send ``alert``; a send that fails raises NotTold, naming ``what`` went untold."""
    try:
        operator.send(settings, alert)
    except Exception as exc:  # any send failure fails the tick the same way
        raise NotTold(f"the operator was not told {what}: {exc}") from exc


def check_alert(evaluation: Evaluation, settings: Settings) -> operator.OperatorAlert:
    if evaluation.passed:
        event, title = operator.CHECK_PASSING, f"Asset check {evaluation.check} passes again"
    else:
        event, title = operator.CHECK_FAILING, f"Asset check {evaluation.check} is failing ({evaluation.severity})"
    return operator.OperatorAlert(
        key=f"check-{evaluation.check}-{evaluation.record_id}", event=event, title=title,
        text=f"{title}: {evaluation.description}" if evaluation.description else title,
        link=f"{settings.ui_url}/assets/{'/'.join(evaluation.asset_path)}?view=checks",
        details={"check": evaluation.check, "passed": evaluation.passed, "severity": evaluation.severity,
                 "description": evaluation.description},
    )

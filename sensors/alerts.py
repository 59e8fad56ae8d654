"""Sensors that tell the operator (pipeline/notify/operator.py).

``run_failure_alert``: once per failed run, with the run's link and its steps' errors.
``check_alerts``: once when an asset check starts failing, and once when it passes
again, with its description and the asset's link, from every result since its last look
(a failure that came and went between two looks is told, failing then passing); a check
failing on the sensor's first look counts as starting to fail.
``tick_alerts``: the same for the ticks of every sensor and schedule of the instance (the
daemon records each): once when one's ticks start failing, with the error its code
raised, and once when a tick works again. A stage sensor that cannot read the database,
or an alert sensor that cannot send, is told this way (by this sensor's next tick once
the channel works again: it tells its own failures too).
``retry_alerts``: the same for the runs whose step is retrying: once when a run's step
fails an attempt and waits to retry (the database refusing writes for two minutes, which
the retries outlast, so no run fails), with the error, and once when that run works
again (a pass recorded, or the step done). A run whose retries all fail is
``run_failure_alert``'s.

None moves past something it did not tell: a send that fails, or a failure with no
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

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
# A sensor's or schedule's latest ticks read at each look for those since the last: the
# stage sensors tick every PIPELINE_SENSOR_INTERVAL_SECONDS (30), a few a minute.
TICKS_READ = 100
# A look reads the runs in progress and those updated since the last look, less this
# (clocks of the daemon and a run worker may differ a little); the first, those of
# FIRST_LOOK_SECONDS, at most RUNS_READ of them.
LOOK_OVERLAP_SECONDS = 120
RUNS_READ = 200


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
            steps[str(event.step_key)] = raised(data.error if data is not None else None)
        message = entry.dagster_event.message if entry.dagster_event is not None else None
        found.append(FailedRun(record.storage_id, entry.run_id, run.job_name if run else "(run deleted)",
                               message or "failed", steps))
    return found


def raised(error: Any) -> str:
    """What the code raised, from Dagster's record of an error (its wrappers' causes
    followed to the innermost); "no error recorded" for none."""
    while error is not None and error.cause is not None:  # Dagster's wrapper, then what the code raised
        error = error.cause
    return error.message.strip() if error is not None else "no error recorded"


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

    mark: float  # when it was evaluated (its event's timestamp)
    name: str  # "asset:check_name"
    asset_path: tuple[str, ...]
    passed: bool
    severity: str
    description: str | None

    def told(self) -> str:
        return f"that {self.name} {'passes again' if self.passed else 'is failing'}"

    def alert(self, settings: Settings) -> operator.OperatorAlert:
        if self.passed:
            event, title = operator.CHECK_PASSING, f"Asset check {self.name} passes again"
        else:
            event, title = operator.CHECK_FAILING, f"Asset check {self.name} is failing ({self.severity})"
        return operator.OperatorAlert(
            key=f"check-{self.name}-{self.mark}", event=event, title=title,
            text=f"{title}: {self.description}" if self.description else title,
            link=f"{settings.ui_url}/assets/{'/'.join(self.asset_path)}?view=checks",
            details={"check": self.name, "passed": self.passed, "severity": self.severity,
                     "description": self.description},
        )


def check_name(key: dg.AssetCheckKey) -> str:
    """A check as the alerts and the cursor name it: "asset:check_name"."""
    return f"{key.asset_key.to_user_string()}:{key.name}"


def evaluations_since(instance: dg.DagsterInstance, keys: Iterable[dg.AssetCheckKey],
                      seen: Mapping[str, float]) -> dict[str, list[Evaluation]]:
    """Each check's results recorded after the one ``seen`` last (when it was
    evaluated, by "asset:check_name"), oldest first; the latest alone for a check not
    seen yet, none for one never evaluated. Read from the instance's record of check
    executions (an index every storage keeps, run-sharded SQLite too), its latest
    EXECUTIONS_READ. A run's execution is one record, planned when the run starts and
    rewritten by each evaluation in it (a lingering run evaluates its checks after every
    pass, for minutes): a record is new when its evaluation is, whatever its place."""
    found = {}
    for key in keys:
        name = check_name(key)
        after = seen.get(name)
        new = []
        for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=EXECUTIONS_READ):
            event = record.event.dagster_event if record.event is not None else None
            data = event.event_specific_data if event is not None else None
            if not isinstance(data, dg.AssetCheckEvaluation) or record.event is None:
                continue  # planned, not evaluated yet
            if after is None or record.event.timestamp > after:
                new.append(Evaluation(record.event.timestamp, name, tuple(key.asset_key.path), bool(data.passed),
                                      data.severity.value, data.description))
        new.sort(key=lambda e: e.mark)
        if new:
            found[name] = new if after is not None else new[-1:]  # a check not seen: its latest is its state
    return found


class Result(Protocol):
    """A result an alert sensor tells: a check's evaluation, an instigator's tick or a
    run's step attempt."""

    @property
    def name(self) -> str: ...
    @property
    def mark(self) -> float: ...  # where the sensor's cursor stands once it has read this
    @property
    def passed(self) -> bool: ...
    def told(self) -> str: ...
    def alert(self, settings: Settings) -> operator.OperatorAlert: ...


T = TypeVar("T", bound=Result)


def changes(failing: Iterable[str], since: Mapping[str, Sequence[T]]) -> list[T]:
    """The results to tell, given the names told ``failing`` and each name's results
    since the last look (oldest first): a check (or sensor) told passing that failed at
    any of them is told failing (its first failure), and passing again if its latest
    passes, so a failure that came and went between two looks is still told; one told
    failing whose latest passes is told passing."""
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
    keys = check_keys(context)
    names = {check_name(key) for key in keys}
    return tell_changes(context, database.settings(), "check results",
                        lambda seen, _: (evaluations_since(context.instance, keys, seen), names))


@dataclass(frozen=True)
class Tick:
    """One finished tick of a sensor or schedule, as the daemon recorded it."""

    name: str  # "sensor due_sources_sensor", "schedule upkeep_schedule"
    mark: float  # when it started (the daemon's tick timestamp)
    passed: bool  # False: the tick failed
    error: str | None  # what the code raised, when it failed

    def told(self) -> str:
        return f"that {self.name} {'works again' if self.passed else 'fails its ticks'}"

    def alert(self, settings: Settings) -> operator.OperatorAlert:
        kind, name = self.name.split(" ", 1)
        if self.passed:
            event, title = operator.TICKS_WORKING, f"{kind.capitalize()} {name} works again"
        else:
            event, title = operator.TICKS_FAILING, f"{kind.capitalize()} {name} fails its ticks"
        return operator.OperatorAlert(
            key=f"ticks-{self.name.replace(' ', '-')}-{self.mark}", event=event, title=title,
            text=f"{title}: {self.error}" if self.error else title, link=f"{settings.ui_url}/automation",
            details={"instigator": name, "type": kind, "passed": self.passed, "error": self.error},
        )


def ticks_since(instance: dg.DagsterInstance, seen: Mapping[str, float]) -> dict[str, list[Tick]]:
    """Each sensor's and schedule's finished ticks after the one ``seen`` last (its
    timestamp, by "sensor NAME" or "schedule NAME"), oldest first; the latest alone for
    one not seen yet. A tick in progress is left for the next look."""
    found = {}
    for state in instance.all_instigator_state():
        name = f"{state.instigator_type.value.lower()} {state.instigator_name}"
        after = seen.get(name)
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, after=after,
                                   limit=TICKS_READ if after is not None else 2)
        new = [Tick(name, tick.timestamp, not tick.is_failure, raised(tick.error) if tick.is_failure else None)
               for tick in ticks if tick.is_completed and (after is None or tick.timestamp > after)]
        new.sort(key=lambda t: t.mark)
        if new:
            found[name] = new if after is not None else new[-1:]
    return found


@dg.sensor(
    name="tick_alerts", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) once when a sensor's or schedule's ticks "
    "start failing (with the error) and once when one works again; a change it could not tell fails "
    "the tick and is told at the next.",
)
def tick_alerts(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SkipReason:
    return tell_changes(context, database.settings(), "ticks", lambda seen, _: (ticks_since(context.instance, seen), None))


Read = Callable[[Mapping[str, float], float | None], tuple[dict[str, list[T]], set[str] | None]]


def tell_changes(context: dg.SensorEvaluationContext, settings: Settings, read_what: str, read: Read[T]) -> dg.SkipReason:
    """One look of an alert sensor: ``read`` each name's results since the cursor's
    ``seen`` marks (and when the last look began, None at the first), tell what
    ``changes`` finds, and move the cursor only past what was told. ``read`` also gives
    the names still known (None: all): the others (a check no longer defined, a run
    long ended) are forgotten."""
    began = time.time()
    state = json.loads(context.cursor) if context.cursor else {}
    since, known = read(state.get("seen", {}), state.get("looked"))
    failing = {name for name in state.get("failing", []) if known is None or name in known}
    seen = {name: mark for name, mark in state.get("seen", {}).items() if known is None or name in known}
    changed = changes(failing, since)
    if changed and not operator.configured(settings):
        raise NotTold(f"{NOT_CONFIGURED}: untold: " + ", ".join(r.told().removeprefix("that ") for r in changed))
    for result in changed:
        tell(settings, result.alert(settings), result.told())
        (failing.discard if result.passed else failing.add)(result.name)
    seen.update({name: new[-1].mark for name, new in since.items()})
    context.update_cursor(json.dumps({"failing": sorted(failing), "seen": seen, "looked": began}))
    said = (f"{sum(map(len, since.values()))} {read_what} read, {len(changed)} alerts sent;"
            f" failing now: {', '.join(sorted(failing)) or 'none'}")
    return dg.SkipReason(said if operator.configured(settings) else f"{said}; {NOT_CONFIGURED}")


@dataclass(frozen=True)
class Attempt:
    """A run's step failing an attempt and waiting to retry, or the run working after one."""

    name: str  # "run RUN_ID"
    mark: float  # when (the event's timestamp)
    passed: bool  # True: the run recorded a pass or finished its step after a retry
    job: str
    step: str
    retry: int  # the retries the step had waited for by then
    error: str | None  # what the failed attempt raised

    def told(self) -> str:
        return f"that {self.name} ({self.job}) {'works again' if self.passed else 'is retrying its step'}"

    def alert(self, settings: Settings) -> operator.OperatorAlert:
        run_id = self.name.removeprefix("run ")
        if self.passed:
            event = operator.STEP_WORKING
            title = f"Run of {self.job} works again after {self.retry} retries of {self.step}"
        else:
            event = operator.STEP_RETRYING
            title = f"Run of {self.job} is retrying {self.step} (retry {self.retry})"
        return operator.OperatorAlert(
            key=f"step-{run_id}-{self.step}-{self.mark}", event=event, title=title,
            text=f"{title}: {self.error}" if self.error else f"{title} (run {run_id})",
            link=f"{settings.ui_url}/runs/{run_id}",
            details={"run_id": run_id, "job": self.job, "step": self.step, "retry": self.retry,
                     "passed": self.passed, "error": self.error},
        )


# After a retry, these say the run works again: a lingering run records each pass as it
# makes it (assets/passes.py), long before its step succeeds.
WORKING = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.ASSET_MATERIALIZATION,
           dg.DagsterEventType.ASSET_OBSERVATION}
IN_PROGRESS = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def retries_since(instance: dg.DagsterInstance, seen: Mapping[str, float],
                  looked: float | None) -> tuple[dict[str, list[Attempt]], set[str]]:
    """Each run's retries and, after its first, its signs of working, later than the one
    ``seen`` last (by "run RUN_ID"), oldest first; and the names of the runs read (in
    progress, or updated since the last look ``looked``): a run that ended is forgotten
    at the next look that does not read it. Each run's log is read through
    ``all_logs``, which every storage serves, run-sharded SQLite too, and only a run that
    has retried is read past its retries."""
    after = datetime.fromtimestamp((looked - LOOK_OVERLAP_SECONDS) if looked is not None
                                   else time.time() - FIRST_LOOK_SECONDS, tz=UTC)
    runs = {record.dagster_run.run_id: record.dagster_run
            for filters in (dg.RunsFilter(statuses=IN_PROGRESS), dg.RunsFilter(updated_after=after))
            for record in instance.get_run_records(filters, limit=RUNS_READ)}
    found: dict[str, list[Attempt]] = {}
    for run_id, run in runs.items():
        retries = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
        if not retries:
            continue
        name, first = f"run {run_id}", min(entry.timestamp for entry in retries)
        attempts: list[Attempt] = []
        counted: dict[str, int] = {}
        for entry in sorted(instance.all_logs(run_id, of_type={dg.DagsterEventType.STEP_UP_FOR_RETRY, *WORKING}),
                            key=lambda e: e.timestamp):
            event, step = entry.dagster_event, str(entry.step_key)
            if event is None or entry.timestamp < first:
                continue
            if event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY:
                counted[step] = counted.get(step, 0) + 1
                error = raised(getattr(event.event_specific_data, "error", None))
                attempts.append(Attempt(name, entry.timestamp, False, run.job_name, step, counted[step], error))
            else:
                attempts.append(Attempt(name, entry.timestamp, True, run.job_name, step, counted.get(step, 0), None))
        new = [a for a in attempts if name not in seen or a.mark > seen[name]]
        if new:  # the first look tells how each run stands, not how it got there
            found[name] = new if looked is not None else new[-1:]
    return found, {f"run {run_id}" for run_id in runs}


@dg.sensor(
    name="retry_alerts", minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tells the operator (PIPELINE_OPERATOR_ALERT_URL) once when a run's step fails an attempt and "
    "waits to retry (with the error), and once when that run works again; a change it could not tell fails "
    "the tick and is told at the next.",
)
def retry_alerts(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SkipReason:
    return tell_changes(context, database.settings(), "run events",
                        lambda seen, looked: retries_since(context.instance, seen, looked))


def tell(settings: Settings, alert: operator.OperatorAlert, what: str) -> None:
    """Send ``alert``; a send that fails raises NotTold, naming ``what`` went untold."""
    try:
        operator.send(settings, alert)
    except Exception as exc:  # any send failure fails the tick the same way
        raise NotTold(f"the operator was not told {what}: {exc}") from exc

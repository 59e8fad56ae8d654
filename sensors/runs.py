"""What the stage sensors share: observe the backlog, is there room, and is there work.

Backlog: a tick records the stage's waiting work and its oldest item's age as an
observation of the stage's asset, so the UI plots them over time: when a count changed
since the last one recorded, and at least every ``OBSERVE_EVERY_SECONDS`` otherwise. (One
per tick grew the event log by three observations every ten seconds, never deleted, and
a tick that reported one showed as "0 runs requested", never "Skipped" with its reason.)
Alive: at most once a minute, the tick records that its sensor looked (worker_state's
``sensor:STAGE``), so a daemon that stopped is seen by readers outside Dagster.
Freshness: the asset's ``freshness`` check is judged from the same waits and recorded
when its verdict changes (and every ``OBSERVE_EVERY_SECONDS``), so work left waiting by
runs that stopped taking it is told within a tick of passing the limit.
Room: no run of the stage still starting (it will claim the work), none lingering
waiting for work (it takes the work as it comes due), and fewer active runs tagged with the stage than
PIPELINE_<STAGE>_MAX_RUNS (default 2). A run counts only
while it progresses: an event within PIPELINE_STALE_LEASE_MINUTES, or a live lease;
one that does not, and is past its linger by as long, is ended through run monitoring
(``end_stalled``), where it held its slots for run_monitoring's hour.
Hand-over: when the stage's last linger (of a run waiting for work or busy fetching)
ends before the next look and a run's start, and work is due or comes due by then, the
next run is asked for now (``HANDOVER_START_SECONDS``), to start before that one ends,
even when the runs ending fill the limit.
Work: a capped count over the claim queues' own partial indexes (``WorkQueue.count_ready``),
so a tick costs the same whatever the size of the tables. One request per tick at most:
the cursor counts the ticks that asked, and the run_key makes a retried tick a no-op.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg

from assets.checks import FRESHNESS_QUEUES, freshness_verdict
from assets.policies import LINGER_TAG, STAGE_TAG, run_worker
from assets.stages import STAGES_OP
from pipeline.core.settings import Settings
from pipeline.queue.spec import QueueSpec
from pipeline.storage import health
from pipeline.storage.status import looked, waited_seconds
from resources import PipelineDatabase

# A run that has not reached its step yet: it has claimed nothing so far.
NOT_YET_STARTED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
]
ACTIVE = [*NOT_YET_STARTED, dg.DagsterRunStatus.STARTED]
COUNT_CAP = 1000
OBSERVE_EVERY_SECONDS = 600  # an unchanged backlog is recorded this often, so plots go on
# A sensor records that it looked (worker_state) at most this often: the daemon's sign of
# life, which PipelineSensorsStopped (deploy/prometheus/alerts.yml) judges against 3 minutes.
ALIVE_EVERY_SECONDS = 60
# A lingering run hands over to its successor: in the last look interval and this long
# before its linger ends (a run's start: 3 s in a container on the simulated internet,
# bench/RESULTS.md; more on a busy machine or a long queue), the sensor asks for the next
# run when work comes due by then. Waiting for the run to end left every source due in
# between waiting up to a look interval and a start.
HANDOVER_START_SECONDS = 30


@dataclass
class Cursor:
    """What a stage sensor keeps between ticks: how many ticks asked for a run (the run
    key), the backlog counts last recorded and when. Written as JSON; a cursor of an older
    version (the tick count alone) is read as that count."""

    tick: int = 0
    observed: dict[str, int] = field(default_factory=dict)
    observed_at: float = 0.0
    fresh: bool | None = None  # the freshness verdict last recorded, and when
    judged_at: float = 0.0
    alive_at: float = 0.0  # when the sensor last recorded its look in worker_state

    @classmethod
    def read(cls, text: str | None) -> "Cursor":
        if not text:
            return cls()
        if text.isdigit():
            return cls(tick=int(text))
        data = json.loads(text)
        return cls(int(data["tick"]), {k: int(v) for k, v in data["observed"].items()}, float(data["observed_at"]),
                   data.get("fresh"), float(data.get("judged_at", 0.0)), float(data.get("alive_at", 0.0)))

    def text(self) -> str:
        return json.dumps({"tick": self.tick, "observed": self.observed, "observed_at": self.observed_at,
                           "fresh": self.fresh, "judged_at": self.judged_at, "alive_at": self.alive_at})


def sensor_interval() -> int:
    """Seconds between a stage sensor's looks (Settings: PIPELINE_SENSOR_INTERVAL_SECONDS).
    Read when the definitions load; each look is one capped, indexed count."""
    return Settings.from_env().sensor_interval_seconds


def max_runs(stage: str) -> int:
    """Runs of ``stage`` in flight at once (Settings: PIPELINE_<STAGE>_MAX_RUNS)."""
    return Settings.from_env().max_runs(stage)


def look_for_work(
    context: dg.SensorEvaluationContext, database: PipelineDatabase, *, stage: str,
    asset: dg.AssetKey, queues: Mapping[str, QueueSpec], work: str, run_key_prefix: str, count_tag: str,
    yield_to: str | None = None,  # a job whose active runs take this stage's work too
    linger_seconds: int = 0,  # runs requested keep taking work as it comes due this long
    next_work_in: Callable[[], float | None] | None = None,  # seconds until work comes due (None: none waits)
) -> dg.SensorResult:
    """One tick of a stage's sensor: observe the stage's backlog on its asset (each
    queue's waiting rows, capped, and the oldest one's age), then request a run when
    there is work and room, saying why not otherwise."""
    observed: dict[str, float | int] = {}
    counts: dict[str, int] = {}
    waited: dict[str, float] = {}
    ready = 0
    with database.engine.connect() as conn:
        for name, spec in queues.items():
            waiting = database.queue(spec).count_ready(cap=COUNT_CAP)
            observed[f"{name}_waiting"] = counts[name] = waiting
            observed[f"{name}_oldest_age_seconds"] = waited[name] = waited_seconds(conn, spec)
            ready += waiting
    cursor = Cursor.read(context.cursor)
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    if counts != cursor.observed or wall_clock() - cursor.observed_at >= OBSERVE_EVERY_SECONDS:
        events.append(dg.AssetObservation(asset_key=asset, metadata=observed))
        cursor.observed, cursor.observed_at = counts, wall_clock()
    # The asset's freshness check, judged from the same waits: recorded when its verdict
    # changes, so a stage whose runs stopped taking work (stuck, or none launched) is
    # told though it materialises nothing, and every OBSERVE_EVERY_SECONDS otherwise.
    verdict = freshness_verdict({name: waited[name] for name in FRESHNESS_QUEUES[asset.to_user_string()]},
                                database.settings().freshness_max_minutes)
    if verdict["passed"] != cursor.fresh or wall_clock() - cursor.judged_at >= OBSERVE_EVERY_SECONDS:
        events.append(dg.AssetCheckEvaluation(asset_key=asset, check_name="freshness", **verdict))
        cursor.fresh, cursor.judged_at = verdict["passed"], wall_clock()
    if wall_clock() - cursor.alive_at >= ALIVE_EVERY_SECONDS:
        looked(database.engine, stage)
        cursor.alive_at = wall_clock()
    decision = _request_if_work(
        context, database, cursor, stage=stage, work=work, ready=ready, run_key_prefix=run_key_prefix,
        count_tag=count_tag, yield_to=yield_to, linger_seconds=linger_seconds, next_work_in=next_work_in,
    )
    context.update_cursor(cursor.text())
    if isinstance(decision, dg.SkipReason):
        return dg.SensorResult(skip_reason=decision, asset_events=events)
    return dg.SensorResult(run_requests=[decision], asset_events=events)


def wall_clock() -> float:
    """The sensors' clock, in seconds since the epoch (a test moves it)."""
    return time.time()


def _last_sign_of_life(instance: dg.DagsterInstance, record: dg.RunRecord) -> float:
    """When the run last did something Dagster saw: a change of status or an event."""
    latest = record.update_timestamp.timestamp()
    events = instance.get_records_for_run(record.dagster_run.run_id, ascending=False, limit=1).records
    return max([latest, *(event.timestamp for event in events)])


@dataclass
class _Runs:
    """The active runs one query selected, as a stage's sensor counts them."""

    active: int = 0  # progressing (queued, or an event within the limit, or a live lease)
    starting: int = 0  # of those, not at their step yet: they will claim the work
    lingering: str | None = None  # the run lingering longest, waiting for work (no lease held)
    lingering_until: float = 0.0  # when its linger ends (its LINGER_TAG)
    ends: list[float] = field(default_factory=list)  # each progressing run's linger end (0: none)
    stalled: list[str] = field(default_factory=list)  # active in Dagster, not progressing

    @property
    def lingers_until(self) -> float:
        """When the last linger of the progressing runs ends, busy or waiting: the stage
        has a lingering run to take what comes due until then."""
        return max(self.ends, default=0.0)


def _runs(context: dg.SensorEvaluationContext, database: PipelineDatabase, filters: dg.RunsFilter) -> _Runs:
    """Read the active runs ``filters`` selects once, and count them. A run progresses while
    it is queued (waiting its turn), logged an event within PIPELINE_STALE_LEASE_MINUTES,
    or holds a live lease; one that does not is stalled (a run whose process was killed
    stays STARTED for ever under the default run launcher, which cannot check a run
    worker's health). A run lingers while its LINGER_TAG is still ahead; one that holds
    no lease is waiting, and takes the work as it comes due within seconds
    (assets/stages.py): another run would only wait beside it, while a lingering run
    busy with a long pass leaves room for another, up to the stage's limit."""
    quiet_limit = database.settings().stale_lease_minutes * 60
    found = _Runs()
    live_lease: dict[str, bool] = {}

    def holds_lease(run_id: str) -> bool:
        if run_id not in live_lease:
            with database.engine.connect() as conn:
                live_lease[run_id] = health.holds_live_lease(conn, run_worker(run_id))
        return live_lease[run_id]

    for record in context.instance.get_run_records(filters=filters):
        run = record.dagster_run
        until = run.tags.get(LINGER_TAG)
        ends = datetime.fromisoformat(until).timestamp() if until is not None else 0.0
        if not (run.status == dg.DagsterRunStatus.QUEUED
                or wall_clock() - (alive := _last_sign_of_life(context.instance, record)) <= quiet_limit
                or holds_lease(run.run_id)):
            found.stalled.append(run.run_id)  # lingering or not, it takes nothing
            if wall_clock() - ends > quiet_limit:  # not waiting for work either: its linger is long over
                end_stalled(context, record, f"no event for {(wall_clock() - alive) / 60:.0f} minutes, no live "
                            "lease, past its linger: stopped while alive")
            continue
        found.active += 1
        found.starting += run.status in NOT_YET_STARTED
        found.ends.append(ends)
        if ends > max(wall_clock(), found.lingering_until) and not holds_lease(run.run_id):
            # The one lingering longest: a run handing over beside its successor is not it.
            found.lingering, found.lingering_until = run.run_id, ends
    return found


# Dagster's run monitoring ends a run whose runtime passes its ``dagster/max_runtime``
# tag (Dagster's docs: run monitoring, general run timeouts), terminating it and marking
# it failed: that frees its run-queue and pool slots, and run_failure_alert tells it.
MAX_RUNTIME_TAG = "dagster/max_runtime"
STALLED_TAG = "pipeline/stalled"  # why the sensor ended a run: shown on the run's page


def end_stalled(context: dg.SensorEvaluationContext, record: dg.RunRecord, why: str) -> None:
    """End a stalled run (a process stopped while alive, a container frozen) through run
    monitoring, at its next look, rather than the hour of run_monitoring's
    max_runtime_seconds: a runtime limit it has already passed. Once per run. (The
    instance's ``add_run_tags`` is the one way to do it from a sensor, and not in
    Dagster's public API: it is used here only.)"""
    run = record.dagster_run
    if STALLED_TAG in run.tags:
        return
    started = record.start_time if record.start_time is not None else record.create_timestamp.timestamp()
    context.instance.add_run_tags(run.run_id, {MAX_RUNTIME_TAG: str(max(1, int(wall_clock() - started) - 1)),
                                               STALLED_TAG: why})
    context.log.warning(f"run {run.run_id} ended through run monitoring: {why}")


def _request_if_work(
    context: dg.SensorEvaluationContext, database: PipelineDatabase, cursor: Cursor, *, stage: str, work: str,
    ready: int, run_key_prefix: str, count_tag: str, yield_to: str | None, linger_seconds: int,
    next_work_in: Callable[[], float | None] | None = None,
) -> dg.RunRequest | dg.SkipReason:
    stalled: list[str] = []
    if yield_to is not None:
        going = _runs(context, database, dg.RunsFilter(statuses=ACTIVE, job_name=yield_to))
        if going.active:
            # An ingest run processes and notifies after it collects: it takes this work.
            return dg.SkipReason(f"{going.active} {yield_to} run(s) going; they take this work after they collect")
        stalled = going.stalled
    runs = _runs(context, database, dg.RunsFilter(statuses=ACTIVE, tags={STAGE_TAG: stage}))
    if runs.starting:
        # It will claim the work this tick would ask for: asking again now only queues an
        # empty run behind it.
        return dg.SkipReason(f"{runs.starting} {stage} run(s) queued or starting; they will take the work")
    handing_over = False
    handover = sensor_interval() + HANDOVER_START_SECONDS
    now = wall_clock()
    if runs.lingering and runs.lingering_until - now > handover:
        return dg.SkipReason(f"run {runs.lingering} lingers, waiting for work: it takes the work as it comes due")
    # The stage's last linger ends within the hand-over, whether its run waits for work
    # or is busy fetching (under a steady stream of due sources a lingering run is never
    # idle: each run ended before the next was asked for, and nothing was fetched for
    # up to a look and a start, bench/soak_stack.py).
    left = runs.lingers_until - now
    if 0 < left <= handover:
        due_in = next_work_in() if next_work_in is not None else None
        if ready or (due_in is not None and due_in <= left + handover):
            handing_over = True  # the next run starts before this one ends, taking what comes due then
        elif runs.lingering:
            return dg.SkipReason(f"run {runs.lingering} lingers {left:.0f} s more, and no work comes due before "
                                 "a run asked at the next look could take it")
    stalled = sorted({*stalled, *runs.stalled})
    if stalled:
        context.log.warning(
            f"not counted, not progressing (no event for PIPELINE_STALE_LEASE_MINUTES, no live lease): "
            f"runs {', '.join(stalled)}; those past their linger are ended through run monitoring"
        )
    limit = max_runs(stage)
    # Handing over, every run's linger ends within the hand-over: they stop claiming
    # then, and their successor starts beside them, over the limit. Counted against it,
    # runs whose lingers end together (lanes fallen into step) all stopped claiming
    # before the next was asked for: nothing claimed for a wind-down, a look and a
    # start. One successor per hand-over: it lingers on, so the next tick counts every
    # run again.
    ending = sum(now < end <= now + handover for end in runs.ends) if handing_over else 0
    if runs.active - ending >= limit:
        return dg.SkipReason(f"{runs.active} {stage} runs active, the limit is {limit}")
    if ready == 0 and not handing_over:
        return dg.SkipReason(f"no {work}")
    cursor.tick += 1
    tick = cursor.tick
    tags = {STAGE_TAG: stage, count_tag: str(ready) + ("+" if ready >= COUNT_CAP else "")}
    if not linger_seconds:
        return dg.RunRequest(run_key=f"{run_key_prefix}-{tick}", tags=tags)
    until = datetime.fromtimestamp(wall_clock() + linger_seconds, UTC)
    return dg.RunRequest(
        run_key=f"{run_key_prefix}-{tick}",
        tags={**tags, LINGER_TAG: until.isoformat(timespec="seconds")},
        run_config={"ops": {STAGES_OP: {"config": {"linger_seconds": linger_seconds}}}},
    )


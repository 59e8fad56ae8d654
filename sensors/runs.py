"""What the stage sensors share: observe the backlog, is there room, and is there work.

Backlog: each tick records the stage's waiting work and its oldest item's age as an
observation of the stage's asset, so the UI plots them over time.
Room: no run of the stage still starting (it will claim the work), and fewer active
runs tagged with the stage than PIPELINE_<STAGE>_MAX_RUNS (default 2).
Work: a capped count over the claim queues' own partial indexes (``WorkQueue.count_ready``),
so a tick costs the same whatever the size of the tables. One request per tick at most:
the cursor counts the ticks that asked, and the run_key makes a retried tick a no-op.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Mapping

import dagster as dg
import sqlalchemy as sa

from assets.policies import STAGE_TAG
from pipeline.core.settings import Settings
from pipeline.queue.claim import QueueSpec
from pipeline.storage import schema
from pipeline.storage.status import oldest_waiting
from resources import PipelineDatabase

# A run that has not reached its step yet: it has claimed nothing so far.
NOT_YET_STARTED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
]
ACTIVE = [*NOT_YET_STARTED, dg.DagsterRunStatus.STARTED]
COUNT_CAP = 1000


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
) -> dg.SensorResult:
    """One tick of a stage's sensor: observe the stage's backlog on its asset (each
    queue's waiting rows, capped, and the oldest one's age), then request a run when
    there is work and room, saying why not otherwise."""
    observed: dict[str, float | int] = {}
    ready = 0
    with database.engine.connect() as conn:
        now_sql = schema.now_sql(conn.dialect.name)
        now = conn.execute(sa.select(now_sql)).scalar_one()
        for name, spec in queues.items():
            waiting = database.queue(spec).count_ready(cap=COUNT_CAP)
            oldest = oldest_waiting(conn, spec, now_sql)
            observed[f"{name}_waiting"] = waiting
            observed[f"{name}_oldest_age_seconds"] = round((now - oldest).total_seconds(), 1) if oldest else 0.0
            ready += waiting
    observation = dg.AssetObservation(asset_key=asset, metadata=observed)
    decision = _request_if_work(
        context, stage=stage, work=work, ready=ready, run_key_prefix=run_key_prefix, count_tag=count_tag,
        yield_to=yield_to,
    )
    if isinstance(decision, dg.SkipReason):
        return dg.SensorResult(skip_reason=decision, asset_events=[observation])
    return dg.SensorResult(run_requests=[decision], asset_events=[observation])


def _request_if_work(
    context: dg.SensorEvaluationContext, *, stage: str, work: str, ready: int,
    run_key_prefix: str, count_tag: str, yield_to: str | None,
) -> dg.RunRequest | dg.SkipReason:
    if yield_to is not None:
        going = context.instance.get_runs_count(dg.RunsFilter(statuses=ACTIVE, job_name=yield_to))
        if going:
            # An ingest run processes and notifies after it collects: it takes this work.
            return dg.SkipReason(f"{going} {yield_to} run(s) going; they take this work after they collect")
    tags = {STAGE_TAG: stage}
    starting = context.instance.get_runs_count(dg.RunsFilter(statuses=NOT_YET_STARTED, tags=tags))
    if starting:
        # It will claim the work this tick would ask for: asking again now only queues an
        # empty run behind it.
        return dg.SkipReason(f"{starting} {stage} run(s) queued or starting; they will take the work")
    active = context.instance.get_runs_count(dg.RunsFilter(statuses=ACTIVE, tags=tags))
    limit = max_runs(stage)
    if active >= limit:
        return dg.SkipReason(f"{active} {stage} runs active, the limit is {limit}")
    if ready == 0:
        return dg.SkipReason(f"no {work}")
    tick = int(context.cursor or "0") + 1
    context.update_cursor(str(tick))
    return dg.RunRequest(
        run_key=f"{run_key_prefix}-{tick}",
        tags={STAGE_TAG: stage, count_tag: str(ready) + ("+" if ready >= COUNT_CAP else "")},
    )

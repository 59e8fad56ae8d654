"""``due_sources_sensor``: requests a collector run when sources are due and there is room."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.


import os

import dagster as dg

from assets.collector import listings_raw
from pipeline import schema
from resources import PipelineDatabase

STAGE_TAG = "pipeline/stage"
ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def max_collector_runs() -> int:
    """Collector runs in flight at once (PIPELINE_COLLECTOR_MAX_RUNS, default 2)."""
    return max(1, int(os.environ.get("PIPELINE_COLLECTOR_MAX_RUNS", "2")))


@dg.sensor(
    name="due_sources_sensor",
    target=listings_raw,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (one indexed count) for due sources; requests a collector run when "
    "some are due and fewer than PIPELINE_COLLECTOR_MAX_RUNS collector runs are active.",
)
def due_sources_sensor(
    context: dg.SensorEvaluationContext, database: PipelineDatabase
) -> dg.RunRequest | dg.SkipReason:
    active = context.instance.get_runs_count(
        dg.RunsFilter(statuses=ACTIVE, tags={STAGE_TAG: "collector"})
    )
    limit = max_collector_runs()
    if active >= limit:
        return dg.SkipReason(f"{active} collector runs active, the limit is {limit}")
    due = database.queue(schema.SOURCES_DUE).count_ready(cap=1000)
    if due == 0:
        return dg.SkipReason("no source is due")
    # One request per tick at most: the run_key makes a retried tick a no-op, and the
    # cursor remembers the last tick that asked.
    tick = int(context.cursor or "0") + 1
    context.update_cursor(str(tick))
    return dg.RunRequest(
        run_key=f"due-sources-{tick}",
        tags={STAGE_TAG: "collector", "pipeline/due_sources": str(due) + ("+" if due >= 1000 else "")},
    )

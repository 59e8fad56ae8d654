"""``due_sources_sensor``: requests an ingest run (collect, process, notify) when sources are
due and the collector has room."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import dagster as dg

from assets.jobs import ingest_job
from assets.policies import STAGE_TAG
from pipeline.storage import schema
from pipeline.storage.status import next_due_in
from resources import PipelineDatabase
from sensors.runs import look_for_work, max_runs, sensor_interval

__all__ = ["STAGE_TAG", "due_sources_sensor", "max_collector_runs"]


def max_collector_runs() -> int:
    """Collector runs in flight at once (PIPELINE_COLLECTOR_MAX_RUNS, default 2)."""
    return max_runs("collector")


@dg.sensor(
    name="due_sources_sensor",
    target=ingest_job,
    minimum_interval_seconds=sensor_interval(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (two indexed counts) for due sources and WebSub hubs due to be asked "
    "(subscribe, renew, unsubscribe) and records them as an observation; "
    "requests an ingest run (collect, process, notify) when some are due, no collector run is "
    "starting, no ingest run lingers waiting for them, and fewer than PIPELINE_COLLECTOR_MAX_RUNS "
    "collector runs are active. The run lingers PIPELINE_INGEST_LINGER_SECONDS (300), taking "
    "sources as they come due: one run instead of one per fetch; in its last look interval and 30 s, "
    "the next run is asked for when sources come due by then, so none waits for a run to start.",
)
def due_sources_sensor(context: dg.SensorEvaluationContext, database: PipelineDatabase) -> dg.SensorResult:
    return look_for_work(
        context, database, stage="collector", asset=dg.AssetKey("listings_raw"),
        queues={"due_sources": schema.SOURCES_DUE, "due_hub_requests": schema.WEBSUB_DUE},
        work="source is due and no WebSub hub is due to be asked",
        run_key_prefix="due-sources", count_tag="pipeline/due_sources",
        linger_seconds=database.settings().ingest_linger_seconds,
        next_work_in=lambda: _next_due_in(database),
    )


def _next_due_in(database: PipelineDatabase) -> float | None:
    with database.engine.connect() as conn:
        return next_due_in(conn)

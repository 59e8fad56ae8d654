"""``unprocessed_listings_sensor`` and ``pending_notifications_sensor``: the processor and
the notifier are triggered as the collector is, by an indexed look for their work."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import dagster as dg

from assets.jobs import ingest_job, notify_job, process_job
from pipeline.storage import schema
from resources import PipelineDatabase
from sensors.runs import look_for_work, sensor_interval


@dg.sensor(
    name="unprocessed_listings_sensor",
    target=process_job,
    minimum_interval_seconds=sensor_interval(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (one indexed count) for raw rows not processed yet; requests a processor "
    "run when there are some, no ingest run (which processes them) is going and fewer than "
    "PIPELINE_PROCESSOR_MAX_RUNS are active.",
)
def unprocessed_listings_sensor(
    context: dg.SensorEvaluationContext, database: PipelineDatabase
) -> dg.SensorResult:
    return look_for_work(
        context, database, stage="processor", asset=dg.AssetKey("listings"),
        queues={"unprocessed_rows": schema.RAW_UNPROCESSED}, work="raw row waits to be processed",
        run_key_prefix="unprocessed", count_tag="pipeline/unprocessed_rows", yield_to=ingest_job.name,
    )


@dg.sensor(
    name="pending_notifications_sensor",
    target=notify_job,
    minimum_interval_seconds=sensor_interval(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (three indexed counts) for listings not matched yet, notifications due and "
    "sources' owners' alerts due; "
    "requests a notifier run when there are some, no ingest run (which notifies them) is going "
    "and fewer than PIPELINE_NOTIFIER_MAX_RUNS are active.",
)
def pending_notifications_sensor(
    context: dg.SensorEvaluationContext, database: PipelineDatabase
) -> dg.SensorResult:
    return look_for_work(
        context, database, stage="notifier", asset=dg.AssetKey("notifications"),
        queues={"unmatched_listings": schema.LISTINGS_UNMATCHED, "due_notifications": schema.NOTIFICATIONS_DUE,
                "due_source_alerts": schema.SOURCE_ALERTS_DUE},
        work="listing waits to be matched and no notification or source alert is due",
        run_key_prefix="notify", count_tag="pipeline/notifier_work", yield_to=ingest_job.name,
    )

"""``unprocessed_listings_sensor`` and ``pending_notifications_sensor``: the processor and
the notifier are triggered as the collector is, by an indexed look for their work."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import dagster as dg

from assets.notifier import notifications
from assets.processor import listings
from pipeline.storage import schema
from resources import PipelineDatabase
from sensors.runs import COUNT_CAP, request_if_work, sensor_interval


@dg.sensor(
    name="unprocessed_listings_sensor",
    target=listings,
    minimum_interval_seconds=sensor_interval(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (one indexed count) for raw rows not processed yet; requests a processor "
    "run when there are some and fewer than PIPELINE_PROCESSOR_MAX_RUNS are active.",
)
def unprocessed_listings_sensor(
    context: dg.SensorEvaluationContext, database: PipelineDatabase
) -> dg.RunRequest | dg.SkipReason:
    return request_if_work(
        context, stage="processor", work="raw row waits to be processed",
        count=lambda: database.queue(schema.RAW_UNPROCESSED).count_ready(cap=COUNT_CAP),
        run_key_prefix="unprocessed", count_tag="pipeline/unprocessed_rows",
    )


@dg.sensor(
    name="pending_notifications_sensor",
    target=notifications,
    minimum_interval_seconds=sensor_interval(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Looks (two indexed counts) for listings not matched yet and notifications due; "
    "requests a notifier run when there are some and fewer than PIPELINE_NOTIFIER_MAX_RUNS are active.",
)
def pending_notifications_sensor(
    context: dg.SensorEvaluationContext, database: PipelineDatabase
) -> dg.RunRequest | dg.SkipReason:
    def count() -> int:
        unmatched = database.queue(schema.LISTINGS_UNMATCHED).count_ready(cap=COUNT_CAP)
        return unmatched + database.queue(schema.NOTIFICATIONS_DUE).count_ready(cap=COUNT_CAP)

    return request_if_work(
        context, stage="notifier", work="listing waits to be matched and no notification is due",
        count=count, run_key_prefix="notify", count_tag="pipeline/notifier_work",
    )

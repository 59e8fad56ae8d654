"""``upkeep_schedule``: retention, daily (pipeline/storage/upkeep.py)."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import dagster as dg

from assets.policies import STAGE_TAG
from pipeline.storage.status import recorded
from pipeline.storage.upkeep import purge
from resources import PipelineDatabase


@dg.op(description="Delete processed raw rows older than PIPELINE_RAW_RETENTION_DAYS (30) and "
       "ingestion events older than PIPELINE_EVENT_RETENTION_DAYS (90).")
def purge_old_rows(context: dg.OpExecutionContext, database: PipelineDatabase) -> None:
    with recorded(database.engine, "upkeep"):
        purged = purge(database.engine, database.settings())
    context.log.info(f"purged {purged.raw_rows} processed raw rows and {purged.events} events")
    context.add_output_metadata({"raw_rows_deleted": purged.raw_rows, "events_deleted": purged.events})


@dg.job(name="upkeep", description="Retention of processed raw rows and old telemetry.",
        tags={STAGE_TAG: "upkeep"})
def upkeep_job() -> None:
    purge_old_rows()


upkeep_schedule = dg.ScheduleDefinition(
    name="upkeep_schedule",
    job=upkeep_job,
    cron_schedule="17 3 * * *",  # daily, 03:17 UTC: away from the top of the hour
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)

"""``upkeep_schedule``: retention, daily (pipeline/storage/upkeep.py)."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from datetime import UTC, datetime, timedelta

import dagster as dg

from assets.policies import STAGE_TAG
from pipeline.storage.status import recorded
from pipeline.storage.upkeep import purge
from resources import PipelineDatabase

FINISHED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


@dg.op(description="Delete processed raw rows older than PIPELINE_RAW_RETENTION_DAYS (30), "
       "ingestion events and sources' owners' alerts that ended older than PIPELINE_EVENT_RETENTION_DAYS "
       "(90), and finished Dagster runs older than PIPELINE_RUN_RETENTION_DAYS (14).")
def purge_old_rows(context: dg.OpExecutionContext, database: PipelineDatabase) -> None:
    settings = database.settings()
    with recorded(database.engine, "upkeep"):
        purged = purge(database.engine, settings)
    runs = purge_runs(context.instance, older_than=timedelta(days=settings.run_retention_days))
    context.log.info(f"purged {purged.raw_rows} processed raw rows, {purged.events} events,"
                     f" {purged.source_alerts} source alerts, {runs} runs")
    context.add_output_metadata(
        {"raw_rows_deleted": purged.raw_rows, "events_deleted": purged.events,
         "source_alerts_deleted": purged.source_alerts, "runs_deleted": runs}
    )


def purge_runs(instance: dg.DagsterInstance, *, older_than: timedelta, batch: int = 500) -> int:
    """Delete finished runs created more than ``older_than`` ago, with their event logs:
    Dagster keeps every run for ever, and a busy pipeline makes thousands a day."""
    before = datetime.now(UTC) - older_than
    deleted = 0
    while True:
        records = instance.get_run_records(
            filters=dg.RunsFilter(statuses=FINISHED, created_before=before), limit=batch
        )
        for record in records:
            instance.delete_run(record.dagster_run.run_id)
        deleted += len(records)
        if len(records) < batch:
            return deleted


@dg.job(name="upkeep", description="Retention of processed raw rows, old telemetry and old runs.",
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

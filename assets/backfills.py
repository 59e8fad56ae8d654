"""Backfills on demand from the UI (Launchpad, or "Launch backfill" for partitioned jobs).

* ``refetch_sources``: re-fetch chosen sources now (config: ``source_ids``).
* ``reprocess_window``: daily partitions of ``fetched_at``; the raw rows of each chosen
  day are processed again (after a normaliser change). A listing whose content changes
  is matched again, and can never notify anyone twice.
* ``rematch_window``: daily partitions of ``ingested_at``; the listings of each chosen
  day are matched again. With ``any_age``, filters created after those listings apply
  too (the history a new filter does not get by default). Never notifies anyone twice.

Partitions start at PIPELINE_BACKFILL_START (an ISO date, default 2025-01-01).
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.


import dagster as dg
from pydantic import Field

from assets.policies import STAGE_TAG, run_worker
from pipeline.catalogue.sources import refetch_sources
from pipeline.core.errors import SourceError
from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor, reopen_window
from pipeline.notify.notifier import Notifier
from resources import PipelineDatabase

# end_offset=1: today is a partition too, so today's rows can be re-processed.
DAYS = dg.DailyPartitionsDefinition(start_date=Settings.from_env().backfill_start.isoformat(), end_offset=1)
TAGS = {STAGE_TAG: "backfill"}


class RefetchConfig(dg.Config):
    # A default, so the launchpad opens with the field to fill in rather than an error.
    source_ids: list[int] = Field(default_factory=list, description="Ids of the sources to re-fetch now "
                                  "(`pipeline sources list` shows them).")


@dg.op(description="Make the chosen sources due now, then run a collector pass.")
def refetch_chosen_sources(context: dg.OpExecutionContext, config: RefetchConfig, database: PipelineDatabase) -> None:
    if not config.source_ids:
        raise dg.Failure("name the sources to re-fetch: source_ids: [1, 2] (`pipeline sources list` shows ids)")
    try:
        due, stats = refetch_sources(database.engine, database.settings(), config.source_ids,
                                     worker=run_worker(context.run.run_id), run_id=context.run.run_id)
    except SourceError as exc:  # an id that names no source: nothing was done
        raise dg.Failure(str(exc)) from None
    skipped = sorted(set(config.source_ids) - set(due))
    if skipped:
        context.log.warning(f"not re-fetched (disabled): {skipped}")
    context.add_output_metadata({"made_due": len(due), "skipped": len(skipped), **{
        k: v for k, v in stats.as_dict().items() if isinstance(v, int)}})


@dg.job(name="refetch_sources", tags=TAGS, description="Re-fetch chosen sources now.")
def refetch_sources_job() -> None:
    refetch_chosen_sources()


@dg.op(description="Reopen the raw rows fetched on the partition's day, then run a processor pass.")
def reprocess_raw_rows(context: dg.OpExecutionContext, database: PipelineDatabase) -> None:
    window = context.partition_time_window
    reopened = reopen_window(database.engine, window.start, window.end)
    # As many rows as were reopened, oldest first: the window's own rows, not a full live
    # pass (the processor's sensor runs that); what is left is processed there.
    stats = Processor(database.engine, database.settings(), worker=run_worker(context.run.run_id)).run(
        max_rows=reopened
    ) if reopened else None
    totals = stats.as_dict() if stats else {}
    context.log.info(f"reopened {reopened} raw rows of {window.start:%Y-%m-%d}; processor: {totals}")
    context.add_output_metadata({"reopened": reopened, **totals})


@dg.job(name="reprocess_window", partitions_def=DAYS, tags=TAGS,
        description="Process again the raw rows fetched on the chosen days.")
def reprocess_window_job() -> None:
    reprocess_raw_rows()


class RematchConfig(dg.Config):
    any_age: bool = False  # also apply filters created after these listings arrived


@dg.op(description="Match the listings that arrived on the partition's day again.")
def rematch_listings(context: dg.OpExecutionContext, config: RematchConfig, database: PipelineDatabase) -> None:
    window = context.partition_time_window
    created = Notifier(database.engine, database.settings(), worker=run_worker(context.run.run_id)).rematch(
        window.start, window.end, any_age=config.any_age
    )
    context.log.info(f"{created} new notifications for listings of {window.start:%Y-%m-%d}")
    context.add_output_metadata({"notifications_created": created, "any_age": config.any_age})


@dg.job(name="rematch_window", partitions_def=DAYS, tags=TAGS,
        description="Match again the listings that arrived on the chosen days; never notifies twice.")
def rematch_window_job() -> None:
    rematch_listings()


BACKFILL_JOBS = [refetch_sources_job, reprocess_window_job, rematch_window_job]

"""Backfills on demand from the UI (Jobs, then the Launchpad), each one run over what the
operator names: no partitions, so no page of days "missing" for jobs that are never
meant to be complete.

* ``refetch_sources``: re-fetch chosen sources now (config: ``source_ids``).
* ``reprocess_window``: the raw rows fetched in a window (config: ``since``, ``until``,
  UTC) are processed again (after a normaliser change). A listing whose content changes
  is matched again, and can never notify anyone twice.
* ``rematch_window``: the listings that arrived in a window are matched again. With
  ``any_age``, filters created after those listings apply too (the history a new filter
  does not get by default). Never notifies anyone twice.

`pipeline backfill reprocess|rematch --since --until` does the same from the command line.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.


from datetime import datetime

import dagster as dg
from pydantic import Field

from assets.policies import STAGE_TAG, run_worker
from pipeline.catalogue.sources import refetch_sources
from pipeline.core.errors import SourceError, UserError
from pipeline.core.inputs import moment, window
from pipeline.listings.processor import Processor, reopen_window
from pipeline.notify.notifier import Notifier
from resources import PipelineDatabase

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


class WindowConfig(dg.Config):
    # Defaults, so the launchpad opens with the fields to fill in rather than an error.
    since: str = Field(default="", description="The window's start, UTC: 2026-11-19 or 2026-11-19T08:00.")
    until: str = Field(default="", description="The window's end (excluded), UTC; default: now.")

    def window(self) -> tuple[datetime, datetime]:
        """The window asked for; dg.Failure naming what is wrong (nothing was done)."""
        if not self.since.strip():
            raise dg.Failure("name the window: since: 2026-11-19 (UTC; until: defaults to now)")
        try:
            return window(moment(self.since, "since"), moment(self.until, "until") if self.until.strip() else None)
        except UserError as exc:
            raise dg.Failure(str(exc)) from None


@dg.op(description="Reopen the raw rows fetched in the window, then process as many as were reopened.")
def reprocess_raw_rows(context: dg.OpExecutionContext, config: WindowConfig, database: PipelineDatabase) -> None:
    start, end = config.window()
    reopened = reopen_window(database.engine, start, end)
    # As many rows as were reopened, oldest first: the window's own rows, not a full live
    # pass (the processor's sensor runs that); what is left is processed there.
    stats = Processor(database.engine, database.settings(), worker=run_worker(context.run.run_id)).run(
        max_rows=reopened
    ) if reopened else None
    totals = stats.as_dict() if stats else {}
    context.log.info(f"reopened {reopened} raw rows fetched from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M};"
                     f" processor: {totals}")
    context.add_output_metadata({"reopened": reopened, **totals})


@dg.job(name="reprocess_window", tags=TAGS,
        description="Process again the raw rows fetched in a window (config: since, until; UTC).")
def reprocess_window_job() -> None:
    reprocess_raw_rows()


class RematchConfig(WindowConfig):
    any_age: bool = False  # also apply filters created after these listings arrived


@dg.op(description="Match the listings that arrived in the window again.")
def rematch_listings(context: dg.OpExecutionContext, config: RematchConfig, database: PipelineDatabase) -> None:
    start, end = config.window()
    created = Notifier(database.engine, database.settings(), worker=run_worker(context.run.run_id)).rematch(
        start, end, any_age=config.any_age
    )
    context.log.info(f"{created} new notifications for the listings that arrived from {start:%Y-%m-%d %H:%M}"
                     f" to {end:%Y-%m-%d %H:%M}")
    context.add_output_metadata({"notifications_created": created, "any_age": config.any_age})


@dg.job(name="rematch_window", tags=TAGS,
        description="Match again the listings that arrived in a window (config: since, until, any_age);"
        " never notifies twice.")
def rematch_window_job() -> None:
    rematch_listings()


BACKFILL_JOBS = [refetch_sources_job, reprocess_window_job, rematch_window_job]

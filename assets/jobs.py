"""The named jobs the sensors launch, and the health checks' job.

Named, so the timeline, the Jobs page and the run list say what ran (``ingest``, not
``__anonymous_asset_job``). Each is one step (assets/stages.py) selecting the stages it
runs, in the run's own process, without check steps: the step evaluates each asset's
checks itself, after the materialisation (assets/passes.py), and ``health_checks`` runs
them all on its own cadence.
``ingest`` is what due sources start: collect, then process and notify what was
collected, in one run, so an item is delivered seconds after its fetch instead of a
sensor tick and a run launch later at each hand-off. ``process`` and ``notify`` take the
work that arrives otherwise (a backfill, a requeue, a delivery to retry).
"""
from __future__ import annotations  # nothing here is a decorated function Dagster inspects

from typing import Any

import dagster as dg

from assets.policies import STAGE_TAG
from assets.stages import LISTINGS, LISTINGS_RAW, NOTIFICATIONS


def _stage_job(name: str, asset: dg.AssetKey, stage: str, description: str) -> Any:  # Dagster keeps the class private
    return dg.define_asset_job(
        name=name,
        selection=dg.AssetSelection.assets(asset).without_checks(),
        executor_def=dg.in_process_executor,
        tags={STAGE_TAG: stage},
        description=description,
    )


ingest_job = dg.define_asset_job(
    name="ingest",
    selection=dg.AssetSelection.assets(LISTINGS_RAW, LISTINGS, NOTIFICATIONS).without_checks(),
    executor_def=dg.in_process_executor,
    tags={STAGE_TAG: "collector"},  # the collector's runs: its sensor counts them
    description="Collect the due sources, then process and notify what was collected, in one run.",
)
collect_job = _stage_job("collect", LISTINGS_RAW, "collector",
                         "One collector pass: fetch the due sources, store their new and changed items.")
process_job = _stage_job("process", LISTINGS, "processor",
                         "One processor pass: raw rows become listings until none waits.")
notify_job = _stage_job("notify", NOTIFICATIONS, "notifier",
                        "One notifier pass: match new listings, deliver the due notifications.")

health_checks_job = dg.define_asset_job(
    name="health_checks",
    selection=dg.AssetSelection.all_asset_checks(),
    executor_def=dg.in_process_executor,
    tags={STAGE_TAG: "health"},
    description="Every asset check (docs/runbook.md, Asset checks).",
)

health_checks_schedule = dg.ScheduleDefinition(
    name="health_checks_schedule",
    job=health_checks_job,
    cron_schedule="*/15 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Runs the asset checks every 15 minutes, apart from the stage runs.",
)

# One stage's pass each (the stage sensors launch process and notify runs, and ingest
# runs for the collector; collect runs are launched by hand).
STAGE_JOBS = [collect_job, process_job, notify_job]

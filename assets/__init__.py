"""The pipeline's Dagster assets: ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier), defined by one step (assets/stages.py), their checks, each stage's named job, and the backfill jobs. Each module stays
short; the logic lives in ``pipeline``.
"""

from __future__ import annotations

import dagster as dg

from assets.backfills import BACKFILL_JOBS
from assets.checks import ASSET_CHECKS
from assets.jobs import STAGE_JOBS, health_checks_job, health_checks_schedule, ingest_job
from assets.stages import stage_assets

ASSETS: list[dg.AssetsDefinition] = [stage_assets]
JOBS = [ingest_job, *STAGE_JOBS, health_checks_job, *BACKFILL_JOBS]
SCHEDULES = [health_checks_schedule]
__all__ = ["ASSETS", "ASSET_CHECKS", "BACKFILL_JOBS", "JOBS", "SCHEDULES"]

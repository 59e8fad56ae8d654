"""The pipeline's Dagster assets: ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier), their checks, each stage's named job, and the backfill jobs. Each module stays
short; the logic lives in ``pipeline``.
"""

from __future__ import annotations

import dagster as dg

from assets.backfills import BACKFILL_JOBS
from assets.checks import ASSET_CHECKS
from assets.collector import listings_raw
from assets.jobs import SENSOR_JOBS, health_checks_job, health_checks_schedule
from assets.notifier import notifications
from assets.processor import listings

ASSETS: list[dg.AssetsDefinition] = [listings_raw, listings, notifications]
JOBS = [*SENSOR_JOBS, health_checks_job, *BACKFILL_JOBS]
SCHEDULES = [health_checks_schedule]
__all__ = ["ASSETS", "ASSET_CHECKS", "BACKFILL_JOBS", "JOBS", "SCHEDULES"]

"""The pipeline's Dagster assets: ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier), their checks, and the backfill jobs. Each module stays
short; the logic lives in ``pipeline``.
"""

from __future__ import annotations

import dagster as dg

from assets.backfills import BACKFILL_JOBS
from assets.checks import ASSET_CHECKS
from assets.collector import listings_raw
from assets.notifier import notifications
from assets.processor import listings

ASSETS: list[dg.AssetsDefinition] = [listings_raw, listings, notifications]
__all__ = ["ASSETS", "ASSET_CHECKS", "BACKFILL_JOBS"]

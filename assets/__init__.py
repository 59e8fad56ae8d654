"""The pipeline's Dagster assets: ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier). Each module stays short; the logic lives in ``pipeline``.
"""

from __future__ import annotations

import dagster as dg

from assets.collector import listings_raw

ASSETS: list[dg.AssetsDefinition] = [listings_raw]
ASSET_CHECKS: list[dg.AssetChecksDefinition] = []

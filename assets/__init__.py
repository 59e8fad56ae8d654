"""The pipeline's Dagster assets: ``listings_raw`` (collector), ``listings`` (processor) and
``notifications`` (notifier). Each module stays short; the logic lives in ``pipeline``.
"""

from __future__ import annotations

import dagster as dg

# Filled in as each stage lands (see ../shared/DESIGN.md, "Dagster").
ASSETS: list[dg.AssetsDefinition] = []
ASSET_CHECKS: list[dg.AssetChecksDefinition] = []

"""The one ``dg.Definitions`` of the project, loaded by workspace.yaml."""

from __future__ import annotations

import dagster as dg

from assets import ASSET_CHECKS, ASSETS, BACKFILL_JOBS
from resources import PipelineDatabase
from sensors import JOBS, SCHEDULES, SENSORS

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    sensors=SENSORS,
    schedules=SCHEDULES,
    jobs=[*JOBS, *BACKFILL_JOBS],
    resources={"database": PipelineDatabase()},
)

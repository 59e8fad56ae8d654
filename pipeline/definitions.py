"""The one ``dg.Definitions`` of the project, loaded by workspace.yaml."""

from __future__ import annotations

import dagster as dg

from assets import ASSET_CHECKS, ASSETS
from assets import JOBS as ASSET_JOBS
from assets import SCHEDULES as ASSET_SCHEDULES
from resources import PipelineDatabase
from sensors import JOBS, SCHEDULES, SENSORS

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    sensors=SENSORS,
    schedules=[*SCHEDULES, *ASSET_SCHEDULES],
    jobs=[*JOBS, *ASSET_JOBS],
    resources={"database": PipelineDatabase()},
)

"""Sensors that look for due work cheaply, and schedules for upkeep."""

from __future__ import annotations

import dagster as dg

from sensors.alerts import check_alerts, retry_alerts, run_failure_alert, tick_alerts
from sensors.due_sources import due_sources_sensor
from sensors.pipeline_work import pending_notifications_sensor, unprocessed_listings_sensor
from sensors.upkeep import upkeep_job, upkeep_schedule

SENSORS: list[dg.SensorDefinition] = [
    due_sources_sensor, unprocessed_listings_sensor, pending_notifications_sensor, run_failure_alert, check_alerts,
    tick_alerts, retry_alerts,
]
SCHEDULES: list[dg.ScheduleDefinition] = [upkeep_schedule]
JOBS: list[dg.JobDefinition] = [upkeep_job]

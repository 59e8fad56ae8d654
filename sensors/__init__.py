"""Sensors that look for due work cheaply, and schedules for upkeep."""

from __future__ import annotations

import dagster as dg

from sensors.due_sources import due_sources_sensor

SENSORS: list[dg.SensorDefinition] = [due_sources_sensor]
SCHEDULES: list[dg.ScheduleDefinition] = []

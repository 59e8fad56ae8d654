"""Sensors that look for due work cheaply, and schedules for upkeep."""

from __future__ import annotations

import dagster as dg

SENSORS: list[dg.SensorDefinition] = []
SCHEDULES: list[dg.ScheduleDefinition] = []

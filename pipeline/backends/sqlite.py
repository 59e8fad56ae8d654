"""SQLite, the embedded default: one writer at a time (the file is locked for the
transaction), ON CONFLICT for skipping and adding (on_conflict.py), executemany run
in-process; "now" is this host's clock, the one the file's writers share."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from pipeline.backends.clock import seconds_text
from pipeline.backends.on_conflict import OnConflict


class SQLite(OnConflict):
    name = "sqlite"
    database_clock = False

    def on_conflict_insert(self, table: sa.Table) -> sqlite.Insert:
        return sqlite.insert(table)

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        """Times are UTC text: the days between them (``julianday``) in seconds; the age
        is never negative, so the cast floors."""
        age = (sa.func.julianday(now) - sa.func.julianday(since)) * sa.literal_column("86400.0")
        return sa.cast(age / seconds_text(step), sa.Integer())

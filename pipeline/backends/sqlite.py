"""SQLite, the embedded default: one writer at a time (the file is locked for the
transaction), ON CONFLICT for skipping and adding (on_conflict.py), executemany run
in-process; "now" is this host's clock, the one the file's writers share."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from pipeline.backends.on_conflict import OnConflict


class SQLite(OnConflict):
    name = "sqlite"
    database_clock = False

    def on_conflict_insert(self, table: sa.Table) -> sqlite.Insert:
        return sqlite.insert(table)

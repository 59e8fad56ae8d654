"""Ids never given twice on SQLite: a table whose ``INTEGER PRIMARY KEY`` has no
AUTOINCREMENT gives the next row the largest id plus one, so deleting the newest row
(a removed source) gave its id to the next one, and a filter's ``source:1`` followed
the new source 1. Each table with an id is copied with AUTOINCREMENT (batch mode; the
migration environment turns foreign keys off around it); the sequence starts after the
largest id copied. PostgreSQL's and MariaDB's sequences never went back: nothing to do.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

TABLES = ("sources", "users", "filters", "ingestion_events", "listings", "listings_raw", "source_alerts",
          "websub_subscriptions", "feed_tokens", "notifications")


def _copy_all(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _copy_all(True)


def downgrade() -> None:
    _copy_all(False)

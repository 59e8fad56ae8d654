"""A filter that failed (its query no longer compiles, or its matching raised): its
``error`` and ``failed_at``, recorded by the notifier, which leaves it out and matches
every other filter (pipeline/notify/notifier.py); `pipeline status`, the metrics and the
``failing_filters`` asset check count those that failed within a day.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column("filters", sa.Column("error", sa.Text()))
    op.add_column("filters", sa.Column("failed_at", _TIME))


def downgrade() -> None:
    with op.batch_alter_table("filters") as batch:
        batch.drop_column("failed_at")
        batch.drop_column("error")

"""Adaptive cadence per source: a source may learn its fetch interval from how often it
publishes, within its own bounds (pipeline/core/cadence.py).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD COLUMNs (SQLite allows a NOT NULL column with a default): no table copy.
    op.add_column(
        "sources", sa.Column("adaptive_cadence", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("sources", sa.Column("min_interval_minutes", sa.Integer()))
    op.add_column("sources", sa.Column("max_interval_minutes", sa.Integer()))


def downgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        for name in ("max_interval_minutes", "min_interval_minutes", "adaptive_cadence"):
            batch.drop_column(name)

"""Counters of work done, for the Prometheus metrics (pipeline/storage/counters.py).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_counts",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", "label", "shard", name="pk_metric_counts"),
    )


def downgrade() -> None:
    op.drop_table("metric_counts")

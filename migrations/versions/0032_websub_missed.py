"""What the safety poll of a pushed source finds that its hub never pushed: how many
items (``missed``) and when last (``missed_at``). A subscription whose poll found such
items and that has heard no push since is polled at its source's own cadence and asked
of its hub again (pipeline/fetching/websub.py, "Push that cannot go silent").

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column("websub_subscriptions", sa.Column("missed", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.add_column("websub_subscriptions", sa.Column("missed_at", _TIME))


def downgrade() -> None:
    with op.batch_alter_table("websub_subscriptions") as batch:
        batch.drop_column("missed_at")
        batch.drop_column("missed")

"""Sources count their claims, as raw rows and notifications do: the claim adds one, a
completed fetch resets it, so a fetch that kills its worker every time ends as a failure
(and backs off) instead of being claimed first on every run.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both databases (SQLite allows a NOT NULL column with a
    # default); batch mode would copy the whole table on SQLite.
    op.add_column(
        "sources", sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0"))
    )


def downgrade() -> None:
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("attempts")

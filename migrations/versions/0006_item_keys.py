"""Exactly once per user per item across sources: listings and notifications carry the
item's key (pipeline/core/urls.py ``item_key``), and a user has at most one notification per
key. Rows written before this revision keep a NULL key (NULLs never clash), so they
follow the old rule (once per listing) and are never re-notified.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("listings", sa.Column("item_key", sa.String(64)))
    op.add_column("notifications", sa.Column("item_key", sa.String(64)))
    # A unique index, not a table constraint: SQLite cannot add a constraint in place.
    op.create_index(
        "uq_notifications_user_id_item_key", "notifications", ["user_id", "item_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_notifications_user_id_item_key", "notifications")
    with op.batch_alter_table("notifications") as batch:
        batch.drop_column("item_key")
    with op.batch_alter_table("listings") as batch:
        batch.drop_column("item_key")

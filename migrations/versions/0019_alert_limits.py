"""Alert limits (pipeline/notify/notifier.py ``AlertLimits``): an index of a user's
notifications by creation time, for counting the last window's.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_notifications_user_id_created_at", "notifications", ["user_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_notifications_user_id_created_at", table_name="notifications")

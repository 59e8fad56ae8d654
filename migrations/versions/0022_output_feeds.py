"""Output feeds (pipeline/catalogue/feeds.py): a user's matches, or one filter's, as a
feed at an unguessable URL; the table keeps each URL's token as its SHA-256 only. The
index on a user's notifications by time gains the id, which orders a feed's ties.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "feed_tokens",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("filter_id", _ID),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("created_at", _TIME, nullable=False, server_default=sa.text("CURRENT_TIMESTAMP")),
        sa.Column("revoked_at", _TIME),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE",
                                name=op.f("fk_feed_tokens_user_id_users")),
        sa.ForeignKeyConstraint(["filter_id"], ["filters.id"], ondelete="CASCADE",
                                name=op.f("fk_feed_tokens_filter_id_filters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feed_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_feed_tokens_token_hash")),
    )
    op.create_index(op.f("ix_feed_tokens_user_id"), "feed_tokens", ["user_id"])
    # A feed reads its user's notifications newest first, ties (one transaction's) by id:
    # the alert limit's index with the id, so a page is a range of it, not a sort.
    op.create_index("ix_notifications_user_id_created_at_id", "notifications", ["user_id", "created_at", "id"])
    op.drop_index("ix_notifications_user_id_created_at", table_name="notifications")


def downgrade() -> None:
    op.create_index("ix_notifications_user_id_created_at", "notifications", ["user_id", "created_at"])
    op.drop_index("ix_notifications_user_id_created_at_id", table_name="notifications")
    op.drop_table("feed_tokens")

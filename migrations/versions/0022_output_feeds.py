"""Output feeds (pipeline/catalogue/feeds.py): a user's matches, or one filter's, as a
feed at an unguessable URL; the table keeps each URL's token as its SHA-256 only.

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


def downgrade() -> None:
    op.drop_table("feed_tokens")

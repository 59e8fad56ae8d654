"""WebSub subscriptions (pipeline/fetching/websub.py): one per source whose feed
advertises a hub, while PIPELINE_WEBSUB_CALLBACK_URL is set.

Revision ID: 0027
Revises: 0026
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "websub_subscriptions",
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("hub", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("callback_token", sa.String(64), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", _TIME, nullable=False),
        sa.Column("verified_at", _TIME),
        sa.Column("lease_until", _TIME),
        sa.Column("pushes", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_push_at", _TIME),
        sa.Column("last_error", sa.Text()),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_websub_subscriptions_source_id_sources")),
        sa.PrimaryKeyConstraint("source_id", name=op.f("pk_websub_subscriptions")),
        sa.UniqueConstraint("callback_token", name=op.f("uq_websub_subscriptions_callback_token")),
        sa.CheckConstraint("state IN ('requested', 'active', 'denied')", name=op.f("ck_websub_subscriptions_state")),
    )


def downgrade() -> None:
    op.drop_table("websub_subscriptions")

"""A user's channel whose receiver answered 410 Gone is remembered by its URL's digest
(``gone_channels``): its notifications are held, unsent, until the channel is set
again or a day has passed (pipeline/notify/delivery.py, ``gone``), where each of them
was retried for hours and then dead.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "gone_channels",
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("gone_at", _TIME, nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE",
                                name=op.f("fk_gone_channels_user_id_users")),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_gone_channels")),
    )


def downgrade() -> None:
    op.drop_table("gone_channels")

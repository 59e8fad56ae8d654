"""A replayed push never stored (pipeline/fetching/websub.py, "Replays"): the pushes a
subscription took, by their body's digest (``websub_pushes``), and a secret rotated at
each renewal (``previous_secret`` verifying beside the new one until the hub has the
new one, ``secret_since``), so that digests are kept only while a secret that could
sign them is accepted.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("websub_subscriptions", sa.Column("previous_secret", sa.String(64)))
    op.add_column("websub_subscriptions", sa.Column("previous_secret_until", _TIME))
    op.add_column("websub_subscriptions", sa.Column("secret_since", _TIME))
    op.create_table(
        "websub_pushes",
        sa.Column("subscription_id", _ID, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("received_at", _TIME, nullable=False),
        sa.ForeignKeyConstraint(["subscription_id"], ["websub_subscriptions.id"], ondelete="CASCADE",
                                name=op.f("fk_websub_pushes_subscription_id_websub_subscriptions")),
        sa.PrimaryKeyConstraint("subscription_id", "digest", name=op.f("pk_websub_pushes")),
    )


def downgrade() -> None:
    op.drop_table("websub_pushes")
    with op.batch_alter_table("websub_subscriptions") as batch:
        batch.drop_column("secret_since")
        batch.drop_column("previous_secret_until")
        batch.drop_column("previous_secret")

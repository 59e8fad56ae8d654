"""Change alerts (pipeline/storage/watches.py): filters that watch what they notified of,
the watches, a listing gone from its source, and what a notification tells (its event),
a user's notifications unique per listing and event.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column("filters", sa.Column("changes", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("listings", sa.Column("gone_at", _TIME))
    op.add_column("notifications", sa.Column("event", sa.String(40), nullable=False,
                                             server_default=sa.text("'new'")))
    # SQLite: batch mode copies the table to drop a constraint.
    with op.batch_alter_table("notifications") as batch:
        batch.drop_constraint("uq_notifications_user_id_listing_id", type_="unique")
    op.create_index("uq_notifications_user_id_listing_id_event", "notifications",
                    ["user_id", "listing_id", "event"], unique=True)
    op.create_table(
        "watches",
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("listing_id", _ID, nullable=False),
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("filter_id", _ID),
        sa.Column("version", sa.String(16), nullable=False),
        sa.Column("created_at", _TIME, nullable=False, server_default=sa.text("CURRENT_TIMESTAMP")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE", name=op.f("fk_watches_user_id_users")),
        sa.ForeignKeyConstraint(["listing_id"], ["listings.id"], ondelete="CASCADE",
                                name=op.f("fk_watches_listing_id_listings")),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_watches_source_id_sources")),
        sa.ForeignKeyConstraint(["filter_id"], ["filters.id"], ondelete="SET NULL",
                                name=op.f("fk_watches_filter_id_filters")),
        sa.PrimaryKeyConstraint("user_id", "listing_id", name=op.f("pk_watches")),
    )
    op.create_index(op.f("ix_watches_listing_id"), "watches", ["listing_id"])
    op.create_index(op.f("ix_watches_source_id"), "watches", ["source_id"])


def downgrade() -> None:
    op.drop_table("watches")
    op.execute("DELETE FROM notifications WHERE event <> 'new'")
    op.drop_index("uq_notifications_user_id_listing_id_event", "notifications")
    with op.batch_alter_table("notifications") as batch:
        batch.create_unique_constraint("uq_notifications_user_id_listing_id", ["user_id", "listing_id"])
        batch.drop_column("event")
    with op.batch_alter_table("listings") as batch:
        batch.drop_column("gone_at")
    with op.batch_alter_table("filters") as batch:
        batch.drop_column("changes")

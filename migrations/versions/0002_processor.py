"""The processor and notifier: listings remember the raw row they show; indexes for
window backfills (listings by ingested_at), raw rows that failed and dead notifications.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    # The raw row whose content a listing shows: an upsert only moves forward, so two
    # processors finishing out of order can never put older content back.
    with op.batch_alter_table("listings") as batch:
        batch.add_column(sa.Column("raw_id", ID))
    op.create_index("ix_listings_ingested_at", "listings", ["ingested_at"])
    # Raw rows the processor gave up on (processed, with an error): few, so the partial
    # index is small and costs nothing on the rows that succeed.
    op.create_index(
        "ix_listings_raw_failed", "listings_raw", ["id"],
        postgresql_where=sa.text("last_error IS NOT NULL"),
        sqlite_where=sa.text("last_error IS NOT NULL"),
    )
    op.create_index(
        "ix_notifications_dead", "notifications", ["id"],
        postgresql_where=sa.text("status = 'dead'"), sqlite_where=sa.text("status = 'dead'"),
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_dead", "notifications")
    op.drop_index("ix_listings_raw_failed", "listings_raw")
    op.drop_index("ix_listings_ingested_at", "listings")
    with op.batch_alter_table("listings") as batch:
        batch.drop_column("raw_id")

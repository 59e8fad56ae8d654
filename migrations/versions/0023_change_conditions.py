"""Change alerts people can act on (pipeline/storage/watches.py): a watched listing is
gone only after two good fetches in a row without it (``listings.missed`` counts them);
a watch keeps the price its user last heard of (``watches.price``, filled here from the
listing's price, the best there is for watches made before); and a watching filter
may ask for price conditions only (``filters.price_drop``, a percent, and
``filters.price_below``, an amount).

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("listings", sa.Column("missed", sa.SmallInteger(), nullable=False, server_default=sa.text("0")))
    op.add_column("watches", sa.Column("price", sa.Text()))
    op.add_column("filters", sa.Column("price_drop", sa.Double()))
    op.add_column("filters", sa.Column("price_below", sa.Double()))
    listings = sa.table("listings", sa.column("id"), sa.column("price", sa.Text()))
    watches = sa.table("watches", sa.column("listing_id"), sa.column("price", sa.Text()))
    op.execute(sa.update(watches).values(price=sa.select(listings.c.price).where(
        listings.c.id == watches.c.listing_id).scalar_subquery()))


def downgrade() -> None:
    # Not batch mode: on SQLite it copies the table, and dropping ``listings`` with foreign
    # keys on deletes every notification by cascade. SQLite drops a column itself (3.35+).
    op.drop_column("filters", "price_below")
    op.drop_column("filters", "price_drop")
    op.drop_column("watches", "price")
    op.drop_column("listings", "missed")

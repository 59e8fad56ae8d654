"""A page item's price (a page source's ``price`` selector, pipeline/fetching/page.py):
a listing's ``price``, compared by change alerts with its title and summary.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("listings", sa.Column("price", sa.Text()))


def downgrade() -> None:
    op.drop_column("listings", "price")

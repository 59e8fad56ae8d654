"""A listing's fields (pipeline/core/fields.py): price, salary, area, rooms, location and
company, read from structured data, a feed's g:price or a page source's selectors, as
one JSON value. Listings stored before have none until their source brings them again.

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column("listings", sa.Column("fields", JSON))


def downgrade() -> None:
    op.drop_column("listings", "fields")

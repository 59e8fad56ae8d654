"""The filter language: a filter keeps the expression its user wrote
(pipeline/notify/query.py). Filters from before it have none and match by their keywords,
as they did.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("filters", sa.Column("query", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("filters") as batch:
        batch.drop_column("query")

"""The politeness count's index covers claimed sources only (``claimed_by IS NOT NULL``).

Its predicate was ``locked_until IS NOT NULL``, which the plain due-source claim's
expired-lease branch also implies; PostgreSQL 18's B-tree skip scan then let that branch
read this index instead of its own (``ix_sources_due_leased``). The count now names the
claim's holder too (the claim columns are always set and cleared together, so the rows
counted are the same), and no other query can use the index.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _index(predicate: str) -> None:
    op.drop_index("ix_sources_politeness_leased", "sources")
    op.create_index(
        "ix_sources_politeness_leased", "sources", ["politeness_group", "locked_until"],
        postgresql_where=sa.text(predicate),
        sqlite_where=sa.text(predicate),
    )


def upgrade() -> None:
    _index("claimed_by IS NOT NULL")


def downgrade() -> None:
    _index("locked_until IS NOT NULL")

"""The due sources' level index on PostgreSQL: the free sources by priority, then due
time (never-due first), then id. The claim reads the due sources a priority level at a
time from it, a few rows however many are due, where it sorted every due source by its
aged priority: a polite claim of 8 took 4 ms with 1,000 due, 21 with 10,000 and 92 with
100,000 (bench/polite_claim.py), so a backlog drained ever more slowly the longer it was.
SQLite and MariaDB keep the sort (no LATERAL): no index there.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

NAME = "ix_sources_due_levels"
STATISTICS = "st_sources_due_key"
# Never-due sources (NULL) as -infinity: pipeline/queue/spec.py ``AgedTerm.due_key``.
DUE_KEY = "coalesce(next_fetch_at, '-infinity'::timestamptz)"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.create_index(NAME, "sources", ["priority", sa.text(DUE_KEY), "id"],
                    postgresql_where=sa.text("enabled AND locked_until IS NULL"))
    # The planner takes no statistics from a partial index's expression: without these it
    # guessed 0.5% of a level due and sorted what a bitmap scan found (every due source
    # of the level) rather than read the index in order and stop at the claim's limit.
    # Expression statistics need PostgreSQL 14; before it the guess stands.
    if bind.dialect.server_version_info >= (14,):
        op.execute(f"CREATE STATISTICS {STATISTICS} ON ({DUE_KEY}) FROM sources")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    op.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    op.drop_index(NAME, table_name="sources")

"""An index on politeness_groups.next_request_at: the polite claim finds the groups with no
room from the few whose next request is ahead (spaced or deferred) and the fetches in
flight, instead of counting every group's fetches in flight with every claim, a cost that
grew with the groups (bench/polite_claim.py). Without the index that read is a scan of
every group's row.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_politeness_groups_next_request_at"), "politeness_groups", ["next_request_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_politeness_groups_next_request_at"), table_name="politeness_groups")

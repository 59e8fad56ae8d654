"""Per-filter routing (`filters route`): a filter may send its matches through a channel
of its own (a webhook with its own secret, or an Apprise URL) and in a mode of its own
(instant or digest) instead of its user's.

Revision ID: 0024
Revises: 0023
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("filters", sa.Column("channel", sa.String(16)))
    op.add_column("filters", sa.Column("channel_url", sa.Text()))
    op.add_column("filters", sa.Column("secret", sa.Text()))
    op.add_column("filters", sa.Column("mode", sa.String(8)))


def downgrade() -> None:
    # Not batch mode: on SQLite it copies the table, and dropping ``filters`` with foreign
    # keys on would cascade. SQLite drops a column itself (3.35 and later).
    for column in ("mode", "secret", "channel_url", "channel"):
        op.drop_column("filters", column)

"""The site a source is a feed of (``sources.site_url``, its ``<link>``): a listing
without a link of its own keeps none (it was given the feed's URL, where a reader
lands on XML), and its messages send the reader to the source's site instead, saying
so (pipeline/notify/delivery.py).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sources", sa.Column("site_url", sa.Text()))


def downgrade() -> None:
    # Not batch mode: on SQLite it copies the table, and dropping ``sources`` with foreign
    # keys on deletes every listing by cascade. SQLite drops a column itself (3.35 and later).
    op.drop_column("sources", "site_url")

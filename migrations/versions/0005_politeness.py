"""Politeness groups: every source belongs to one (its host by default), and the claim
hands out a source only when its group has room (fetches in flight, spacing, deferral).

Existing sources are put in their host's group, computed here from their URL and type
by the rule of pipeline/fetching/politeness.py as it stood at this revision.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from urllib.parse import urlsplit

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

UTC_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
NAME = sa.Text().with_variant(sa.String(255), "mysql", "mariadb")  # a key: bounded on MariaDB


def _group(url: str, source_type: str, config: dict | None) -> str:
    named = (config or {}).get("politeness_group")
    if isinstance(named, str) and named.strip():
        return named.strip().lower()
    if source_type == "youtube":
        return "youtube"
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    return host or "*"


def upgrade() -> None:
    groups = op.create_table(
        "politeness_groups",
        sa.Column("name", NAME, nullable=False),
        sa.Column("max_in_flight", sa.Integer()),
        sa.Column("min_interval_ms", sa.Integer()),
        sa.Column("next_request_at", UTC_TIME),
        sa.Column("deferred_reason", sa.Text()),
        sa.Column("claims", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.CheckConstraint("max_in_flight >= 1", name="max_in_flight"),
        sa.CheckConstraint("min_interval_ms >= 0", name="min_interval"),
        sa.PrimaryKeyConstraint("name", name="pk_politeness_groups"),
    )
    # The default group: its limits are every group's defaults (2 fetches at once, one
    # second apart), and sources given no group belong to it.
    op.bulk_insert(groups, [{"name": "*", "max_in_flight": 2, "min_interval_ms": 1000}])
    bind = op.get_bind()
    sources = sa.table(
        "sources", sa.column("id"), sa.column("url"), sa.column("source_type"), sa.column("config", sa.JSON())
    )
    assigned = {
        row.id: _group(row.url, row.source_type, row.config)
        for row in bind.execute(sa.select(sources.c.id, sources.c.url, sources.c.source_type, sources.c.config))
    }
    names = sorted(set(assigned.values()) - {"*"})
    if names:
        op.bulk_insert(groups, [{"name": name} for name in names])
    op.add_column("sources", sa.Column(
        "politeness_group", NAME, nullable=False, server_default=sa.text("'*'")
    ))
    update = sa.text("UPDATE sources SET politeness_group = :group WHERE id = :id")
    for source_id, group in assigned.items():
        if group != "*":
            bind.execute(update, {"group": group, "id": source_id})
    op.create_index(
        "ix_sources_politeness_leased", "sources", ["politeness_group", "locked_until"],
        postgresql_where=sa.text("locked_until IS NOT NULL"),
        sqlite_where=sa.text("locked_until IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_sources_politeness_leased", "sources")
    with op.batch_alter_table("sources") as batch:
        batch.drop_column("politeness_group")
    op.drop_table("politeness_groups")

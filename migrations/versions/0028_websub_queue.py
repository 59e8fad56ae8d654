"""WebSub subscriptions become a claim queue (``WEBSUB_DUE``): ``due_at`` says when the
hub is next asked (subscribe, renew before the lease ends, unsubscribe once the source
is disabled or removed), claimed by the collector's runs as every other piece of work.
A row keyed by its own id outlives a removed source (``source_id`` set NULL) until the
hub has been told to stop.

The table is made anew and its rows copied: an active subscription is due for renewal a
day before its lease ends (pipeline/fetching/websub.py ``renew_at``), the others at once.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-28
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_COPIED = {"source_id": _ID, "hub": sa.Text(), "topic": sa.Text(), "callback_token": sa.String(64),
           "secret": sa.String(64), "state": sa.String(16), "requested_at": _TIME, "verified_at": _TIME,
           "lease_until": _TIME, "pushes": sa.Integer(), "last_push_at": _TIME, "last_error": sa.Text()}
_STATES = "('requested', 'active', 'denied', 'unsubscribing')"
_PENDING = "due_at IS NOT NULL"  # the claim queue's (pipeline/storage/schema.py WEBSUB_DUE)


def _aware(value: datetime | None) -> datetime | None:
    return None if value is None or value.tzinfo else value.replace(tzinfo=UTC)


def upgrade() -> None:
    bind = op.get_bind()
    old = sa.Table("websub_subscriptions", sa.MetaData(), *(sa.Column(c, kind) for c, kind in _COPIED.items()))
    rows = [dict(r) for r in bind.execute(sa.select(old)).mappings()]
    op.drop_table("websub_subscriptions")
    table = op.create_table(
        "websub_subscriptions",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("source_id", _ID),
        sa.Column("hub", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("callback_token", sa.String(64), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", _TIME, nullable=False),
        sa.Column("verified_at", _TIME),
        sa.Column("lease_until", _TIME),
        sa.Column("pushes", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_push_at", _TIME),
        sa.Column("last_error", sa.Text()),
        sa.Column("due_at", _TIME),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("locked_until", _TIME),
        sa.Column("claimed_by", sa.Text()),
        sa.Column("claim_token", sa.String(36)),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="SET NULL",
                                name=op.f("fk_websub_subscriptions_source_id_sources")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_websub_subscriptions")),
        sa.UniqueConstraint("source_id", name=op.f("uq_websub_subscriptions_source_id")),
        sa.UniqueConstraint("callback_token", name=op.f("uq_websub_subscriptions_callback_token")),
        sa.CheckConstraint(f"state IN {_STATES}", name=op.f("ck_websub_subscriptions_state")),
    )
    dialect = bind.dialect.name
    if dialect in ("postgresql", "sqlite"):
        where = {f"{dialect}_where": sa.text(f"{_PENDING} AND locked_until IS NULL")}
        op.create_index("ix_websub_subscriptions_due_free", "websub_subscriptions", ["due_at", "id"], **where)
        where = {f"{dialect}_where": sa.text(f"{_PENDING} AND locked_until IS NOT NULL")}
        op.create_index("ix_websub_subscriptions_due_leased", "websub_subscriptions", ["locked_until"], **where)
    else:  # MariaDB: one index leads with the lease (revision 0010)
        op.create_index("ix_websub_subscriptions_due_free", "websub_subscriptions",
                        ["locked_until", "due_at", "id"])
    now = datetime.now(UTC)
    for row in rows:
        lease_until = _aware(row["lease_until"])
        due = max(now, lease_until - timedelta(days=1)) if row["state"] == "active" and lease_until else now
        row["due_at"] = due if dialect == "postgresql" else due.replace(tzinfo=None)  # UTC, as stored there
    if rows:
        op.bulk_insert(table, rows)


def downgrade() -> None:
    bind = op.get_bind()
    old = sa.Table("websub_subscriptions", sa.MetaData(), *(sa.Column(c, kind) for c, kind in _COPIED.items()))
    rows = [dict(r) for r in bind.execute(sa.select(old).where(
        old.c.source_id.is_not(None), old.c.state != "unsubscribing")).mappings()]
    op.drop_table("websub_subscriptions")
    table = op.create_table(
        "websub_subscriptions",
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("hub", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("callback_token", sa.String(64), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("requested_at", _TIME, nullable=False),
        sa.Column("verified_at", _TIME),
        sa.Column("lease_until", _TIME),
        sa.Column("pushes", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_push_at", _TIME),
        sa.Column("last_error", sa.Text()),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_websub_subscriptions_source_id_sources")),
        sa.PrimaryKeyConstraint("source_id", name=op.f("pk_websub_subscriptions")),
        sa.UniqueConstraint("callback_token", name=op.f("uq_websub_subscriptions_callback_token")),
        sa.CheckConstraint("state IN ('requested', 'active', 'denied')", name=op.f("ck_websub_subscriptions_state")),
    )
    if rows:
        op.bulk_insert(table, rows)

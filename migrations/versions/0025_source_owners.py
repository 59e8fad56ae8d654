"""Source health for owners: a source may have an owner (``source_owners``), who is told
once when it starts failing and once when it recovers; what they are told waits in
``source_alerts``, a claim queue delivered as notifications are.

Revision ID: 0025
Revises: 0024
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
_NOW = sa.text("CURRENT_TIMESTAMP")
_PENDING = "status IN ('pending', 'failed')"  # the claim queue's (pipeline/storage/schema.py SOURCE_ALERTS_DUE)


def upgrade() -> None:
    op.create_table(
        "source_owners",
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("alerted_at", _TIME),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_source_owners_source_id_sources")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE",
                                name=op.f("fk_source_owners_user_id_users")),
        sa.PrimaryKeyConstraint("source_id", name=op.f("pk_source_owners")),
    )
    op.create_index(op.f("ix_source_owners_user_id"), "source_owners", ["user_id"])
    op.create_table(
        "source_alerts",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("source_id", _ID, nullable=False),
        sa.Column("user_id", _ID, nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(32)),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", _TIME, nullable=False, server_default=_NOW),
        sa.Column("status", sa.String(8), nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", _TIME, nullable=False, server_default=_NOW),
        sa.Column("last_error", sa.Text()),
        sa.Column("sent_at", _TIME),
        sa.Column("locked_until", _TIME),
        sa.Column("claimed_by", sa.Text()),
        sa.Column("claim_token", sa.String(36)),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_source_alerts_source_id_sources")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], ondelete="CASCADE",
                                name=op.f("fk_source_alerts_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_source_alerts")),
        sa.CheckConstraint("status IN ('pending', 'sent', 'failed', 'dead', 'held')",
                           name=op.f("ck_source_alerts_status")),
        sa.CheckConstraint("event IN ('failing', 'recovered')", name=op.f("ck_source_alerts_event")),
    )
    op.create_index(op.f("ix_source_alerts_source_id"), "source_alerts", ["source_id"])
    op.create_index(op.f("ix_source_alerts_user_id"), "source_alerts", ["user_id"])
    dialect = op.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        where = {f"{dialect}_where": sa.text(f"{_PENDING} AND locked_until IS NULL")}
        op.create_index("ix_source_alerts_due_free", "source_alerts", ["next_attempt_at", "id"], **where)
        where = {f"{dialect}_where": sa.text(f"{_PENDING} AND locked_until IS NOT NULL")}
        op.create_index("ix_source_alerts_due_leased", "source_alerts", ["locked_until"], **where)
    else:  # MariaDB: one index leads with the pending column and the lease (revision 0010)
        op.create_index("ix_source_alerts_due_free", "source_alerts",
                        ["status", "locked_until", "next_attempt_at", "id"])


def downgrade() -> None:
    op.drop_table("source_alerts")
    op.drop_table("source_owners")

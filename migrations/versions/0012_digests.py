"""Digests and quiet hours: a user's delivery settings, a notification's digest, and the
status "held" (pipeline/notify/schedule.py).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_HELD = "status = 'held' AND digest_id IS NULL"
MARIADB = ("mysql", "mariadb")


def _status_check(statuses: str) -> None:
    # SQLite cannot alter a constraint in place: batch mode copies the table there.
    with op.batch_alter_table("notifications") as batch:
        batch.drop_constraint(op.f("ck_notifications_status"), type_="check")
        batch.create_check_constraint(op.f("ck_notifications_status"), f"status IN ({statuses})")


def upgrade() -> None:
    for name in ("digest", "quiet_hours", "timezone"):
        op.add_column("users", sa.Column(name, sa.Text()))
    op.add_column("notifications", sa.Column("digest_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite")))
    _status_check("'pending', 'sent', 'failed', 'dead', 'held'")
    if op.get_bind().dialect.name not in MARIADB:  # no partial indexes there (schema.py)
        op.create_index("ix_notifications_held", "notifications", ["next_attempt_at"],
                        postgresql_where=sa.text(_HELD), sqlite_where=sa.text(_HELD))
    op.create_index(op.f("ix_notifications_digest_id"), "notifications", ["digest_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_notifications_digest_id"), "notifications")
    if op.get_bind().dialect.name not in MARIADB:
        op.drop_index("ix_notifications_held", "notifications")
    op.execute("UPDATE notifications SET status = 'pending' WHERE status = 'held'")
    _status_check("'pending', 'sent', 'failed', 'dead'")
    with op.batch_alter_table("notifications") as batch:
        batch.drop_column("digest_id")
    with op.batch_alter_table("users") as batch:
        for name in ("timezone", "quiet_hours", "digest"):
            batch.drop_column(name)

"""Webhook secret rotation: the secret a rotation replaced keeps signing beside the new
one until ``previous_secret_until`` (`users set --secret-file`), so a receiver can move
to the new secret without losing a delivery (pipeline/notify/delivery.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column("users", sa.Column("previous_secret", sa.Text()))
    op.add_column("users", sa.Column("previous_secret_until", _TIME))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("previous_secret_until")
        batch.drop_column("previous_secret")

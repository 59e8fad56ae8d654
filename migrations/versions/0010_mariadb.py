"""MariaDB: the claim queues' indexes there, and item ids that fit its keys.

MariaDB has no partial index: each queue gets one index led by the columns its pending
predicate tests and the lease, then its order (pipeline/queue/claim.py
``QueueSpec.indexes``). PostgreSQL and SQLite keep their partial indexes.

Item ids longer than 760 characters are stored as their SHA-256 from now on (they were
from 1000 on): ``source_items``' key (a BIGINT and the id) must fit InnoDB's 3072
bytes. The ids of 761 to 1000 characters stored so far are rewritten to that form here,
in the three tables that hold them, so an item keeps its identity. Not undone by the
downgrade (a hash cannot be reversed; the old code reads the rewritten ids as ids).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

MARIADB = ("mysql", "mariadb")
# Each queue's index on MariaDB: (pending columns, locked_until, the queue's order).
QUEUE_INDEXES = {
    "ix_sources_due_free": ("sources", ["enabled", "locked_until", "next_fetch_at"]),
    "ix_listings_raw_unprocessed_free": ("listings_raw", ["processed_at", "locked_until", "fetched_at", "id"]),
    "ix_listings_unmatched_free": ("listings", ["matched_at", "locked_until", "updated_at", "id"]),
    "ix_notifications_due_free": ("notifications", ["status", "locked_until", "next_attempt_at", "id"]),
}
LONGEST_ID = 760


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in MARIADB:
        for name, (table, columns) in QUEUE_INDEXES.items():
            op.create_index(name, table, columns)
    for table, key in (("source_items", ("source_id", "source_item_id")), ("listings_raw", ("id",)),
                       ("listings", ("id",))):
        rows = bind.execute(sa.text(
            # length() counts characters on PostgreSQL and SQLite (bytes on MariaDB,
            # whose databases start at this revision, with no rows).
            f"SELECT {', '.join(key)}, source_item_id FROM {table}"
            f" WHERE length(source_item_id) > {LONGEST_ID}"
        )).all()
        where = " AND ".join(f"{column} = :k{n}" for n, column in enumerate(key))
        for row in rows:
            hashed = "sha256:" + hashlib.sha256(row[-1].encode()).hexdigest()
            bind.execute(sa.text(f"UPDATE {table} SET source_item_id = :new WHERE {where}"),
                         {"new": hashed, **{f"k{n}": value for n, value in enumerate(row[:-1])}})


def downgrade() -> None:
    if op.get_bind().dialect.name in MARIADB:
        for name, (table, _columns) in QUEUE_INDEXES.items():
            op.drop_index(name, table)

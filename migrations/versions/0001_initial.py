"""The initial schema: sources, raw listings and the items seen, listings, users, filters,
notifications, telemetry and worker state, with the claim columns and partial indexes of each queue.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# A migration is a snapshot: it spells out its types and predicates instead of
# importing pipeline.storage.schema, which will move on. tests/test_migrations.py checks that
# the head revision and pipeline.storage.schema describe the same database.
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# MariaDB (support added with revision 0010): microseconds, and bounded text in keys.
TS = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
NAME = sa.Text().with_variant(sa.String(255), "mysql", "mariadb")
ITEM_ID = sa.Text().with_variant(sa.String(760), "mysql", "mariadb")
NOW = sa.text("CURRENT_TIMESTAMP")


def _claim_columns() -> list[sa.Column]:
    return [
        sa.Column("locked_until", TS),
        sa.Column("claimed_by", sa.Text()),
        sa.Column("claim_token", sa.String(36)),
    ]


def _partial_index(name: str, table: str, columns: list[str], where: str) -> None:
    op.create_index(
        name, table, columns, postgresql_where=sa.text(where), sqlite_where=sa.text(where)
    )


def _queue_indexes(table: str, queue: str, columns: list[str], pending_pg: str, pending_lite: str) -> None:
    """The free and leased partial indexes of one claim queue (pipeline/queue/claim.py)."""
    for dialect_where, dialect in ((pending_pg, "postgresql"), (pending_lite, "sqlite")):
        if op.get_bind().dialect.name != dialect:
            continue
        _partial_index(
            f"ix_{table}_{queue}_free", table, columns, f"{dialect_where} AND locked_until IS NULL"
        )
        _partial_index(
            f"ix_{table}_{queue}_leased",
            table,
            ["locked_until"],
            f"{dialect_where} AND locked_until IS NOT NULL",
        )


def upgrade() -> None:
    op.create_table(
        "sources",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("source_type", sa.String(16), nullable=False),
        sa.Column("config", JSON, nullable=False, server_default=sa.text("'{}'")),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("fetch_interval_minutes", sa.Integer(), nullable=False, server_default=sa.text("60")),
        sa.Column("next_fetch_at", TS),
        sa.Column("last_fetched_at", TS),
        sa.Column("last_success_at", TS),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_failure_reason", sa.String(32)),
        sa.Column("disabled_reason", sa.Text()),
        sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("etag", sa.Text()),
        sa.Column("last_modified", sa.Text()),
        sa.Column("content_hash", sa.String(64)),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        *_claim_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_sources"),
        sa.UniqueConstraint("url", name="uq_sources_url"),
        sa.CheckConstraint(
            "source_type IN ('rss', 'http', 'youtube')", name=op.f("ck_sources_source_type")
        ),
        sa.CheckConstraint(
            "fetch_interval_minutes BETWEEN 1 AND 10080", name=op.f("ck_sources_fetch_interval")
        ),
    )
    _queue_indexes("sources", "due", ["next_fetch_at"], "enabled", "enabled = 1")

    op.create_table(
        "listings_raw",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("source_id", ID, nullable=False),
        sa.Column("source_item_id", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("raw_json", JSON, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("fetched_at", TS, nullable=False, server_default=NOW),
        sa.Column("processed_at", TS),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.Text()),
        *_claim_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_listings_raw"),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name="fk_listings_raw_source_id_sources", ondelete="CASCADE"
        ),
    )
    _queue_indexes(
        "listings_raw", "unprocessed", ["fetched_at", "id"], "processed_at IS NULL", "processed_at IS NULL"
    )

    op.create_table(
        "source_items",
        sa.Column("source_id", ID, nullable=False),
        sa.Column("source_item_id", ITEM_ID, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("first_seen_at", TS, nullable=False, server_default=NOW),
        sa.Column("changed_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("source_id", "source_item_id", name="pk_source_items"),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name="fk_source_items_source_id_sources", ondelete="CASCADE"
        ),
    )

    op.create_table(
        "listings",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("source_id", ID, nullable=False),
        sa.Column("source_item_id", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("summary", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("author", sa.Text()),
        sa.Column("published_at", TS),
        sa.Column("categories", JSON, nullable=False, server_default=sa.text("'[]'")),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("ingested_at", TS, nullable=False, server_default=NOW),
        sa.Column("updated_at", TS, nullable=False, server_default=NOW),
        sa.Column("matched_at", TS),
        *_claim_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_listings"),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name="fk_listings_source_id_sources", ondelete="CASCADE"
        ),
        sa.UniqueConstraint(
            "source_id", "source_item_id", name="uq_listings_source_id_source_item_id"
        ),
    )
    _queue_indexes(
        "listings", "unmatched", ["updated_at", "id"], "matched_at IS NULL", "matched_at IS NULL"
    )

    op.create_table(
        "users",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("channel_url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text()),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("id", name="pk_users"),
        sa.UniqueConstraint("name", name="uq_users_name"),
        sa.CheckConstraint("channel IN ('webhook', 'apprise')", name=op.f("ck_users_channel")),
    )

    op.create_table(
        "filters",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("keywords", JSON, nullable=False),
        sa.Column("source_id", ID),
        sa.Column("category", sa.Text()),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.PrimaryKeyConstraint("id", name="pk_filters"),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_filters_user_id_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name="fk_filters_source_id_sources", ondelete="CASCADE"
        ),
    )
    op.create_index("ix_filters_user_id", "filters", ["user_id"])

    op.create_table(
        "notifications",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("user_id", ID, nullable=False),
        sa.Column("listing_id", ID, nullable=False),
        sa.Column("filter_id", ID),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("status", sa.String(8), nullable=False, server_default=sa.text("'pending'")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", TS, nullable=False, server_default=NOW),
        sa.Column("last_error", sa.Text()),
        sa.Column("created_at", TS, nullable=False, server_default=NOW),
        sa.Column("sent_at", TS),
        *_claim_columns(),
        sa.PrimaryKeyConstraint("id", name="pk_notifications"),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_notifications_user_id_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["listing_id"],
            ["listings.id"],
            name="fk_notifications_listing_id_listings",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["filter_id"], ["filters.id"], name="fk_notifications_filter_id_filters", ondelete="SET NULL"
        ),
        sa.UniqueConstraint("user_id", "listing_id", name="uq_notifications_user_id_listing_id"),
        sa.CheckConstraint(
            "status IN ('pending', 'sent', 'failed', 'dead')", name=op.f("ck_notifications_status")
        ),
    )
    op.create_index("ix_notifications_listing_id", "notifications", ["listing_id"])
    pending = "status IN ('pending', 'failed')"
    _queue_indexes("notifications", "due", ["next_attempt_at", "id"], pending, pending)

    op.create_table(
        "ingestion_events",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("occurred_at", TS, nullable=False, server_default=NOW),
        sa.Column("source_id", ID),
        sa.Column("source_type", sa.String(16)),
        sa.Column("run_id", sa.Text()),
        sa.Column("scheduled_at", TS),
        sa.Column("duration_ms", sa.Integer()),
        sa.Column("success", sa.Boolean()),
        sa.Column("failure_reason", sa.String(32)),
        # Double precision everywhere, by name on MariaDB (its FLOAT is single precision, and
        # Dagster, once imported, compiles a generic Float there as FLOAT(32): pipeline/storage/schema.py).
        sa.Column("retry_in_minutes", sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), "mysql", "mariadb")),
        sa.Column("http_status", sa.Integer()),
        sa.Column("items_seen", sa.Integer()),
        sa.Column("items_new", sa.Integer()),
        sa.Column("details", JSON),
        sa.PrimaryKeyConstraint("id", name="pk_ingestion_events"),
        sa.ForeignKeyConstraint(
            ["source_id"], ["sources.id"], name="fk_ingestion_events_source_id_sources", ondelete="CASCADE"
        ),
    )
    op.create_index(
        "ix_ingestion_events_source_id_occurred_at", "ingestion_events", ["source_id", "occurred_at"]
    )
    op.create_index("ix_ingestion_events_occurred_at", "ingestion_events", ["occurred_at"])

    op.create_table(
        "worker_state",
        sa.Column("worker_name", NAME, nullable=False),
        sa.Column("last_run_at", TS),
        sa.Column("last_status", sa.Text()),
        sa.Column("last_error", sa.Text()),
        sa.PrimaryKeyConstraint("worker_name", name="pk_worker_state"),
    )


def downgrade() -> None:
    for table in (
        "worker_state",
        "ingestion_events",
        "notifications",
        "filters",
        "users",
        "listings",
        "source_items",
        "listings_raw",
        "sources",
    ):
        op.drop_table(table)

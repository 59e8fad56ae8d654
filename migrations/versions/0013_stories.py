"""One alert per story across sources (pipeline/listings/stories.py): a listing's cluster
and fingerprint, the keys its copies are found by, the lock that puts new listings in
clusters one batch at a time, and a notification's story, at most one per user.

Listings stored before this revision file no keys: a copy of one of them from another
source is a story of its own. A notification from before is its listing's story.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column("listings", sa.Column("cluster_id", _ID))
    op.add_column("listings", sa.Column("simhash", sa.BigInteger()))
    copies = sa.text("cluster_id IS NOT NULL")  # MariaDB ignores the condition: a whole index
    op.create_index(op.f("ix_listings_cluster_id"), "listings", ["cluster_id"],
                    postgresql_where=copies, sqlite_where=copies)
    op.create_table(
        "story_keys",
        sa.Column("key", sa.BigInteger(), nullable=False),
        sa.Column("listing_id", _ID, nullable=False),
        sa.Column("simhash", sa.BigInteger()),
        sa.ForeignKeyConstraint(["listing_id"], ["listings.id"], ondelete="CASCADE",
                                name=op.f("fk_story_keys_listing_id_listings")),
        sa.PrimaryKeyConstraint("key", "listing_id", name=op.f("pk_story_keys")),
    )
    op.create_index(op.f("ix_story_keys_listing_id"), "story_keys", ["listing_id"])
    lock = op.create_table(
        "story_lock",
        sa.Column("id", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_story_lock")),
    )
    op.bulk_insert(lock, [{"id": 1}])
    op.add_column("notifications", sa.Column("cluster_id", _ID))
    op.execute("UPDATE notifications SET cluster_id = listing_id")
    op.create_index("uq_notifications_user_id_cluster_id", "notifications", ["user_id", "cluster_id"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_notifications_user_id_cluster_id", "notifications")
    with op.batch_alter_table("notifications") as batch:
        batch.drop_column("cluster_id")
    op.drop_table("story_lock")
    op.drop_table("story_keys")
    op.drop_index(op.f("ix_listings_cluster_id"), "listings")
    with op.batch_alter_table("listings") as batch:
        batch.drop_column("simhash")
        batch.drop_column("cluster_id")

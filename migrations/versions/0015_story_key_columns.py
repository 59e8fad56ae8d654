"""A listing's story keys as columns of its own row, each with an index, instead of five
rows of ``story_keys`` (pipeline/listings/stories.py): the same lookups, at a third of
the database's work to store a listing (no second table, no foreign-key check per key,
no second index per key).

The values carry over: a link key is the old key less its tag (bit 62), the bands are
cut from the stored fingerprint. On a large ``listings`` this rewrites every row that
has keys: run it at a quiet time, with processing stopped (a processor of the older
code writes ``story_keys``: docs/deployment.md, "Upgrades").

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_URL_TAG = 1 << 62  # revision 0013's link keys: the hash, tagged above every band key
_BANDS = 4
_KEYS = ("story_key", *(f"story_band_{band}" for band in range(_BANDS)))


def _quote(name: str) -> str:
    return str(op.get_bind().dialect.identifier_preparer.quote(name))


def upgrade() -> None:
    op.add_column("listings", sa.Column("story_key", sa.BigInteger()))
    for band in range(_BANDS):
        op.add_column("listings", sa.Column(f"story_band_{band}", sa.Integer()))
    key = _quote("key")  # a reserved word in MariaDB
    op.execute(
        f"UPDATE listings SET story_key = (SELECT k.{key} - {_URL_TAG} FROM story_keys k"
        f" WHERE k.listing_id = listings.id AND k.{key} >= {_URL_TAG})"
        f" WHERE id IN (SELECT listing_id FROM story_keys WHERE {key} >= {_URL_TAG})"
    )
    bands = ", ".join(f"story_band_{band} = (simhash >> {16 * band}) & 65535" for band in range(_BANDS))
    op.execute(f"UPDATE listings SET {bands} WHERE simhash IS NOT NULL")
    for column in _KEYS:
        keyed = sa.text(f"{column} IS NOT NULL")  # MariaDB ignores the condition: a whole index
        op.create_index(op.f(f"ix_listings_{column}_id"), "listings", [column, "id"],
                        postgresql_where=keyed, sqlite_where=keyed)
    op.drop_table("story_keys")


def downgrade() -> None:
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
    key = _quote("key")
    op.execute(f"INSERT INTO story_keys ({key}, listing_id) SELECT story_key + {_URL_TAG}, id FROM listings"
               " WHERE story_key IS NOT NULL")
    for band in range(_BANDS):
        op.execute(f"INSERT INTO story_keys ({key}, listing_id, simhash) SELECT {band << 16} + story_band_{band}, id,"
                   f" simhash FROM listings WHERE story_band_{band} IS NOT NULL")
    # Not in batch mode: SQLite would copy ``listings`` and drop the old one, which its
    # foreign key's ON DELETE CASCADE would empty ``story_keys`` with (SQLite >= 3.35
    # drops a column in place).
    for column in _KEYS:
        op.drop_index(op.f(f"ix_listings_{column}_id"), "listings")
        op.drop_column("listings", column)

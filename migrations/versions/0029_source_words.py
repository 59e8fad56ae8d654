"""A source's boilerplate (pipeline/listings/boilerplate.py): the runs of words all of its
items had when it last brought several at once, taken out of its listings' texts for their
fingerprints, so that items of one template stop sharing the story detector's band keys.
Existing sources start with none: each learns its own when it next brings several items.

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "source_words",
        sa.Column("source_id", _ID, autoincrement=False, nullable=False),
        sa.Column("words", _JSON, nullable=False),
        sa.ForeignKeyConstraint(["source_id"], ["sources.id"], ondelete="CASCADE",
                                name=op.f("fk_source_words_source_id_sources")),
        sa.PrimaryKeyConstraint("source_id", name=op.f("pk_source_words")),
    )


def downgrade() -> None:
    op.drop_table("source_words")

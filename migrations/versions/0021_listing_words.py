"""A listing's words and keys (``listings.words``: " a:smith c:remote node node.js
python "), so that ``pipeline filters test`` finds the listings holding a word, an
author's word or a category with one search and checks them without reading their text
into words again (pipeline/catalogue/workbench.py). The
listings already stored get theirs here, in batches by id: 106 s per million listings
on the benchmark's machine, measured with their words alone (bench/RESULTS.md,
"Filter workbench"; an author's words and categories add little to that).

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from pipeline.core.words import word_string

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

BATCH = 5000
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")  # the listings' categories


def upgrade() -> None:
    op.add_column("listings", sa.Column("words", sa.Text()))
    conn = op.get_bind()
    listings = sa.table("listings", sa.column("id", sa.BigInteger()), sa.column("title", sa.Text()),
                        sa.column("summary", sa.Text()), sa.column("author", sa.Text()),
                        sa.column("categories", JSON), sa.column("words", sa.Text()))
    after = 0
    while True:
        rows = conn.execute(
            sa.select(listings.c.id, listings.c.title, listings.c.summary, listings.c.author, listings.c.categories)
            .where(listings.c.id > after).order_by(listings.c.id).limit(BATCH)
        ).all()
        if not rows:
            return
        after = rows[-1].id
        conn.execute(sa.update(listings).where(listings.c.id == sa.bindparam("row_id"))
                     .values(words=sa.bindparam("row_words")),
                     [{"row_id": r.id, "row_words": word_string(r.title or "", r.summary or "", r.author,
                                                                  r.categories or ())} for r in rows])


def downgrade() -> None:
    op.drop_column("listings", "words")

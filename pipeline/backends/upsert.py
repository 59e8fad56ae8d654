"""What a forward-only upsert is, on every database: a batch of rows inserted, or written
over the stored row with their key only when they are not older than it (by ``order``),
with ``on_change`` applied when their ``hash`` differs from the stored one. The listing
upsert (pipeline/listings/processor.py) is one; each backend writes it its own way."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa


@dataclass(frozen=True, eq=False)  # compared by identity: a backend builds its statement once per spec
class ForwardUpsert:
    table: sa.Table
    columns: tuple[str, ...]  # each row's columns, in this order
    keys: tuple[str, ...]  # the unique key a row is matched on
    order: str  # a row not older than the stored one (by this column; NULL is oldest) writes over it
    hash: str  # content that differs from the stored one's (by this column) ...
    on_change: Mapping[str, sa.ColumnElement[Any]]  # ... also sets these
    content: tuple[str, ...]  # what a newer row writes (``order`` too)
    returning: tuple[str, ...]  # what a backend that can hand back the rows it wrote hands back

    def forward(self, new: Any) -> sa.ColumnElement[bool]:
        """The row ``new`` (the database's name for the row proposed) is not older."""
        t = self.table
        return sa.or_(t.c[self.order].is_(None), new[self.order] >= t.c[self.order])

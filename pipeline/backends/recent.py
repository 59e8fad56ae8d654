"""What a lookup of the most recent rows per key is, on every database: for each of
several integer key columns, the ``per_key`` most recent rows (by id) under each value
asked, leaving out some ids. The story lookup (pipeline/listings/stories.py) is one: a new
listing's candidates are the recent listings that share one of its keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa


@dataclass(frozen=True, eq=False)  # compared by identity: a backend builds its statement once per spec
class RecentPerKey:
    table: sa.Table
    keys: tuple[str, ...]  # the integer key columns, asked in this order (``key_number``)
    columns: tuple[str, ...]  # what each row found gives, with ``key_number`` and ``key_value``
    per_key: int
    # Where a backend can leave out cheaply the rows no caller wants: for the keys after
    # the first, a row whose ``fingerprint`` differs in more than ``max_distance`` bits
    # from every fingerprint asking with that key's value.
    fingerprint: str
    max_distance: int

    def union(self, part: Callable[[int, str, Any, list[sa.Column[Any]]], sa.Select[Any]]) -> sa.CompoundSelect[Any]:
        """The lookup as one statement: ``part(number, column, key_number, stored)`` is
        the select of one key column (``key_number`` its label column, ``stored`` the
        columns it gives), and the parts are joined by UNION ALL."""
        stored = [self.table.c[name] for name in self.columns]
        return sa.union_all(*(
            part(number, column, sa.literal_column(str(number), sa.Integer()).label("key_number"), stored)
            for number, column in enumerate(self.keys)
        ))


@dataclass(frozen=True)
class Asking:
    """What one lookup asks: per key column (in ``RecentPerKey.keys`` order) the values,
    and the (value, fingerprint as a signed 64-bit integer) pairs asking; the ids to
    leave out."""

    values: Sequence[Sequence[int]]
    prints: Sequence[Sequence[tuple[int, int]]]
    exclude: Sequence[int] = field(default_factory=list)

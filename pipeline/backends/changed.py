"""What storing only the new or changed rows is, on every database: ``hashes`` keeps each
key's newest content hash (``touched`` set to the database's CURRENT_TIMESTAMP when it
changes); a row whose key is new there, or whose hash differs from the one kept, goes into
``rows``; a row whose hash is unchanged writes nothing. The collector's item storage
(pipeline/fetching/collector.py ``store_items``) is one: a source's items, kept per
(source, item id), and a raw row for each item new or changed.

A row is a tuple in ``columns`` order. Its ``json`` column holds a ``JSONValue``: the
value and its JSON text, so that a backend sends whichever its driver takes without
encoding the value again (PostgreSQL writes the text into the one JSON parameter the
batch travels in)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import sqlalchemy as sa


class JSONValue(NamedTuple):
    value: Any
    text: str  # ``value`` as JSON


@dataclass(frozen=True, eq=False)  # compared by identity: a backend builds its statement once per spec
class StoreChanged:
    hashes: sa.Table
    keys: tuple[str, ...]  # a row's key, in both tables (the primary key of ``hashes``)
    hash: str  # the content hash column, in both tables
    touched: str  # of ``hashes``: when the hash last changed
    rows: sa.Table
    columns: tuple[str, ...]  # a row's columns of ``rows``, in this order (keys and hash among them)
    json: str  # the column whose value is a ``JSONValue``
    returning: str  # handed back for each row stored

    def position(self, column: str) -> int:
        return self.columns.index(column)

    @cached_property
    def _key(self) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
        positions = [self.position(k) for k in self.keys]
        if len(positions) == 1:
            return lambda row: (row[positions[0]],)
        return operator.itemgetter(*positions)

    def key_of(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        return self._key(row)

    def unique(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """``rows`` with one per key: the last given, where the first was."""
        key = self._key
        return list({key(row): row for row in rows}.values())

    def kept(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """What ``hashes`` keeps of ``row``: its key and its hash."""
        return {**dict(zip(self.keys, self._key(row), strict=True)), self.hash: row[self.position(self.hash)]}

    def bound(self, row: tuple[Any, ...]) -> dict[str, Any]:
        """``row`` as the parameters of an insert into ``rows`` (the JSON as its value)."""
        values = dict(zip(self.columns, row, strict=True))
        values[self.json] = values[self.json].value
        return values

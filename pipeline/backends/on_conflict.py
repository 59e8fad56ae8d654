"""What PostgreSQL and SQLite share: INSERT ... ON CONFLICT, to skip a row whose key
exists or to update it, as an executemany. PostgreSQL overrides the bulk paths with one
statement per batch (postgresql.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from pipeline.backends.changed import StoreChanged
from pipeline.backends.portable import CHUNK, Portable, Rows
from pipeline.backends.upsert import ForwardUpsert


class OnConflict(Portable):
    """A database whose INSERT takes ON CONFLICT clauses (``on_conflict_insert``)."""

    def on_conflict_insert(self, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
        """The database's INSERT, which takes ON CONFLICT clauses."""
        raise NotImplementedError

    def record_hashes(self, conn: Connection, spec: StoreChanged, rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
        """ON CONFLICT DO UPDATE ... WHERE the hash differs, RETURNING the keys: a row
        whose hash is unchanged is neither written nor handed back. A thousand rows per
        statement, each row's values bound apart."""
        t = spec.hashes
        values = [spec.kept(row) for row in rows]
        changed: set[tuple[Any, ...]] = set()
        for start in range(0, len(values), CHUNK):
            insert = self.on_conflict_insert(t).values(values[start:start + CHUNK])  # new text each chunk
            stmt = insert.on_conflict_do_update(
                index_elements=[t.c[k] for k in spec.keys],
                set_={spec.hash: insert.excluded[spec.hash], spec.touched: sa.func.current_timestamp()},
                where=t.c[spec.hash] != insert.excluded[spec.hash],
            ).returning(*(t.c[k] for k in spec.keys))
            changed.update(tuple(found) for found in conn.execute(stmt))
        return changed

    def insert_ignoring_conflicts(self, conn: Connection, table: sa.Table, rows: Rows, keys: list[str]) -> int:
        if not rows:
            return 0
        # An executemany: SQLite runs it in-process, and its rowcount is the total inserted.
        stmt = self.on_conflict_insert(table).on_conflict_do_nothing(index_elements=keys or None)
        return int(conn.execute(stmt.execution_options(preserve_rowcount=True), list(rows)).rowcount)

    def upsert(self, conn: Connection, table: sa.Table, rows: Rows, keys: Sequence[str]) -> None:
        if not rows:
            return
        insert = self.on_conflict_insert(table)
        conn.execute(insert.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys],
            set_={k: insert.excluded[k] for k in rows[0] if k not in keys}), list(rows))

    def add_to(self, conn: Connection, table: sa.Table, keys: Sequence[str], value: str, rows: Rows) -> None:
        if not rows:
            return
        conn.execute(self.adding(self.on_conflict_insert(table), table, keys, value),
                     sorted(rows, key=lambda r: tuple(r[k] for k in keys)))

    def upsert_forward(self, conn: Connection, spec: ForwardUpsert, rows: Rows) -> Sequence[sa.Row[Any]] | None:
        """INSERT ... ON CONFLICT (keys) DO UPDATE ... WHERE not older; an executemany."""
        stmt = self._built(("forward", spec), lambda: self._forward(spec, self.on_conflict_insert(spec.table)))
        conn.execute(stmt, list(rows))
        return None

    @staticmethod
    def _forward(spec: ForwardUpsert, insert: postgresql.Insert | sqlite.Insert) -> Any:
        """``insert`` (of ``spec``'s rows) as the forward-only upsert."""
        t, new = spec.table, insert.excluded
        changed = t.c[spec.hash] != new[spec.hash]
        return insert.on_conflict_do_update(
            index_elements=[t.c[k] for k in spec.keys],
            set_={
                **{name: new[name] for name in spec.content},
                spec.order: new[spec.order],
                **{name: sa.case((changed, value), else_=t.c[name]) for name, value in spec.on_change.items()},
            },
            where=spec.forward(new),
        )

    @staticmethod
    def adding(insert: postgresql.Insert | sqlite.Insert, table: sa.Table, keys: Sequence[str], value: str) -> sa.Insert:
        """``insert`` adding its ``value`` to the stored row's where its ``keys`` exist."""
        return insert.on_conflict_do_update(
            index_elements=[table.c[k] for k in keys], set_={value: table.c[value] + insert.excluded[value]}
        )

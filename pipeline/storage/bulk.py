"""Writing many rows in one statement, on every dialect: plain inserts, and inserts that
skip or update rows whose unique key exists already."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pipeline.queue.dialects import MARIADB
from pipeline.queue.recordset import json_rows, recordset


def on_conflict_insert(
    conn: sa.Connection, table: sa.Table
) -> postgresql.Insert | sqlite.Insert | None:
    """The dialect's INSERT that takes ON CONFLICT clauses, or None where there is none."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    return None


# ``keys`` of ``insert_ignoring_conflicts`` for "any unique key of the table".
ANY_UNIQUE_KEY: list[str] = []


def insert_ignoring_conflicts(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], keys: list[str]
) -> int:
    """Insert ``rows`` (all with the same keys), skipping those whose ``keys`` already
    exist (``ANY_UNIQUE_KEY``: that clash with a row on any unique key); return how many
    went in. One statement on PostgreSQL (``insert_rows``)."""
    if not rows:
        return 0
    if conn.dialect.name == "postgresql":
        return insert_rows(conn, table, rows, ignore_conflicts_on=keys or ("*",))
    if conn.dialect.name in MARIADB:
        # INSERT IGNORE skips a row that clashes on any unique key (every caller's keys
        # are all of its table's); it would also turn a value too long into a warning,
        # but every value here is checked before (pipeline/core/inputs.py) or made here.
        ignore = sa.insert(table).prefix_with("IGNORE").execution_options(preserve_rowcount=True)
        return int(conn.execute(ignore, list(rows)).rowcount)
    insert = on_conflict_insert(conn, table)
    if insert is not None:
        # executemany: SQLite runs it in-process, and its rowcount is the total inserted.
        stmt = insert.on_conflict_do_nothing(index_elements=keys or None)
        return int(conn.execute(stmt.execution_options(preserve_rowcount=True), list(rows)).rowcount)
    # Any other dialect: look first (correct within one transaction of one writer; a
    # NULL clashes with nothing, as in SQL).
    key_sets = [keys] if keys else _unique_keys(table)
    present = [
        {tuple(r) for r in conn.execute(sa.select(*(table.c[k] for k in ks)))} for ks in key_sets
    ]
    fresh = []
    for r in rows:
        values = [tuple(r[k] for k in ks) for ks in key_sets]
        if any(None not in v and v in seen for v, seen in zip(values, present, strict=True)):
            continue
        fresh.append(r)
        for v, seen in zip(values, present, strict=True):
            seen.add(v)
    if fresh:
        conn.execute(sa.insert(table), fresh)
    return len(fresh)


def _unique_keys(table: sa.Table) -> list[list[str]]:
    """The column lists of ``table``'s unique constraints and unique indexes."""
    keys = [[c.name for c in u.columns] for u in table.constraints if isinstance(u, sa.UniqueConstraint)]
    keys += [[c.name for c in i.columns] for i in table.indexes if i.unique]
    return keys


_INSERTS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], sa.Insert] = {}


def insert_rows(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]],
    *, ignore_conflicts_on: Sequence[str] = (),
) -> int:
    """Insert ``rows`` (all with the same keys) in one statement; return how many went in.

    PostgreSQL: ``INSERT INTO t (cols) SELECT cols FROM jsonb_to_recordset(:rows)``, built
    once per column set, with ``ON CONFLICT (ignore_conflicts_on) DO NOTHING`` when given.
    One bound JSON text whatever the number of rows: an executemany (insertmanyvalues)
    costs a round of Python work per row, and psycopg re-parsed each generated statement
    (bench/RESULTS.md, matching). Elsewhere: an executemany, which SQLite runs in-process.
    """
    if not rows:
        return 0
    if conn.dialect.name != "postgresql":
        if ignore_conflicts_on:
            keys = [] if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
            return insert_ignoring_conflicts(conn, table, rows, keys)
        conn.execute(sa.insert(table), list(rows))
        return len(rows)
    columns = tuple(rows[0])
    key = (table.name, columns, tuple(ignore_conflicts_on))
    stmt = _INSERTS.get(key)
    if stmt is None:
        v = recordset(sa.column(name, table.c[name].type) for name in columns)
        select = sa.select(*(v.c[name] for name in columns))
        if ignore_conflicts_on:
            # ("*",): a clash on any unique key of the table.
            targets = None if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
            stmt = postgresql.insert(table).from_select(list(columns), select).on_conflict_do_nothing(
                index_elements=targets
            )
        else:
            stmt = sa.insert(table).from_select(list(columns), select)
        # SQLAlchemy keeps an INSERT's rowcount only when asked to.
        stmt = stmt.execution_options(preserve_rowcount=True)
        _INSERTS[key] = stmt
    return int(conn.execute(stmt, {"rows": json_rows(rows)}).rowcount)

"""Writing many rows in one statement, on every database: plain inserts, and inserts that
skip rows whose unique key exists already. Each database's way is its backend's
(pipeline/backends/)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.backends.portable import ANY_UNIQUE_KEY

__all__ = ["ANY_UNIQUE_KEY", "insert_ignoring_conflicts", "insert_rows"]


def insert_ignoring_conflicts(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]], keys: list[str]
) -> int:
    """Insert ``rows`` (all with the same keys), skipping those whose ``keys`` already
    exist (``ANY_UNIQUE_KEY``: that clash with a row on any unique key); return how many
    went in. One statement on PostgreSQL (``insert_rows``)."""
    return backend_for(conn).insert_ignoring_conflicts(conn, table, rows, keys)


def insert_rows(
    conn: sa.Connection, table: sa.Table, rows: Sequence[Mapping[str, Any]],
    *, ignore_conflicts_on: Sequence[str] = (),
) -> int:
    """Insert ``rows`` (all with the same keys) in one statement; return how many went in.
    With ``ignore_conflicts_on`` (a key's columns, or ("*",) for any unique key) a row
    whose key exists is skipped. PostgreSQL: one bound JSON text whatever the number of
    rows (pipeline/backends/postgresql.py); elsewhere an executemany."""
    return backend_for(conn).insert_rows(conn, table, rows, ignore_conflicts_on=ignore_conflicts_on)

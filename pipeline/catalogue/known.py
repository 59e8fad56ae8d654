"""Ids an operator names must exist: one rule, one message, for every command.

A command given an id that names nothing fails as a whole (exit 1, one line naming the
ids), before it changes anything, so "requeue 99999" never reads as a success.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from pipeline.core.errors import PipelineError, UserError


def require_ids(
    conn: sa.Connection, table: sa.Table, ids: Iterable[int], noun: str, error: type[PipelineError] = UserError,
) -> None:
    """``error`` naming every one of ``ids`` that ``table`` has no row for (``noun``: what
    a row is, "source"); nothing when all exist."""
    wanted = sorted(set(ids))
    if not wanted:
        return
    found = set(conn.execute(sa.select(table.c.id).where(table.c.id.in_(wanted))).scalars())
    missing = [str(i) for i in wanted if i not in found]
    if len(missing) == 1:
        raise error(f"no {noun} with id {missing[0]}")
    if missing:
        raise error(f"no {noun}s with ids {', '.join(missing)}")

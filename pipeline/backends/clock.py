"""Whose clock is "now" in SQL that compares with stored times: the one rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa


def sql_now(
    type_: sa.types.TypeEngine[datetime], *, database_clock: bool, minus: timedelta = timedelta(0),
    bind: str | None = None,
) -> sa.ColumnElement[datetime]:
    """"Now" (less ``minus``) for SQL that compares with stored times (leases, due times,
    ages): the one rule. With ``database_clock`` (PostgreSQL) the database's own clock,
    the truth that hosts with skewed clocks share; otherwise (SQLite, whose file is on
    this host) this host's clock: the bound parameter ``bind``, whose value the caller
    gives at each execution of a statement built once, or else a literal of now."""
    if database_clock:
        now = sa.func.now(type_=type_)
        return now if not minus else now - sa.literal(minus, sa.Interval())
    if bind is not None:
        return sa.bindparam(bind, type_=type_)
    return sa.literal(datetime.now(UTC) - minus, type_)


def seconds_text(step: timedelta) -> sa.ColumnElement[Any]:
    """``step`` in seconds as SQL text, not a parameter: a claim is compiled once, sent
    as text."""
    return sa.literal_column(f"{step.total_seconds():.1f}")

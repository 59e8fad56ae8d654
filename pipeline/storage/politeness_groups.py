"""The politeness groups' rows: created with their sources, their limits set and listed,
a whole group deferred (a Retry-After for the host), and what a group's fetches in flight
are. The policy is pipeline/core/politeness.py; the claim that enforces it is
pipeline/fetching/politeness.py."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline.core.errors import SourceError
from pipeline.core.inputs import NAME_CHARS, text_problem
from pipeline.core.politeness import (
    DEFAULT,
    initial_limits,
    over_capacity,
    spacing_allows_per_minute,
)
from pipeline.storage import schema
from pipeline.storage.bulk import insert_ignoring_conflicts

_groups, _sources = schema.politeness_groups, schema.sources


def ensure_groups(conn: Connection, names: Iterable[str]) -> None:
    """Create the rows of groups that have none, with their initial limits (the default
    group's, or a loopback host's)."""
    rows = [{"name": name, **initial_limits(name)} for name in sorted(set(names)) if name != DEFAULT]
    if rows:
        insert_ignoring_conflicts(conn, _groups, rows, ["name"])


def set_limits(
    conn: Connection, name: str, *, max_in_flight: int | None = None,
    min_interval_seconds: float | None = None, reset: bool = False, create: bool = True,
) -> None:
    """Set a group's limits (creating its row unless ``create`` is false: then a name no
    group has, a typo most likely, is a SourceError); ``reset`` returns them to the defaults.
    The default group's limits (``*``) are every other group's defaults."""
    if problem := text_problem(name, "group", NAME_CHARS):
        raise ValueError(problem)
    if not create and name != DEFAULT and conn.execute(
            sa.select(_groups.c.name).where(_groups.c.name == name)).first() is None:
        raise SourceError(f"no politeness group named {name!r} (`pipeline politeness list` names them);"
                          " give --create to set the limits of a group before its sources are added")
    if max_in_flight is not None and max_in_flight < 1:
        raise ValueError(f"max in flight must be at least 1, got {max_in_flight}")
    if min_interval_seconds is not None and min_interval_seconds < 0:
        raise ValueError(f"the interval cannot be negative, got {min_interval_seconds}")
    if reset and name == DEFAULT:
        raise ValueError("the default group's limits are the defaults: set them, do not reset them")
    ensure_groups(conn, [name])
    values: dict[str, Any] = {}
    if reset:
        values.update(initial_limits(name))
    if max_in_flight is not None:
        values["max_in_flight"] = max_in_flight
    if min_interval_seconds is not None:
        values["min_interval_ms"] = round(min_interval_seconds * 1000)
    if values:
        conn.execute(sa.update(_groups).where(_groups.c.name == name).values(values))


def fetching(sources: sa.FromClause, now: sa.ColumnElement[datetime]) -> sa.ColumnElement[bool]:
    """A source being fetched: claimed, its lease running. ``claimed_by`` is named, not
    only the lease, because it is the predicate of ix_sources_politeness_leased, which
    serves every count of a group's fetches (migration 0007)."""
    return sources.c.claimed_by.is_not(None) & (sources.c.locked_until > now)


def list_groups(conn: Connection) -> list[dict[str, Any]]:
    """Every group with its effective limits, its sources, its fetches in flight, the
    fetches a minute its enabled sources ask for (``asks_per_minute``: each one over its
    ``fetch_interval_minutes``), what its spacing allows (``allows_per_minute``, None
    without spacing) and whether they ask for more (``over_capacity``, both by
    pipeline/core/politeness.py)."""
    g, d, s = _groups, _groups.alias("d"), _sources
    now = schema.now_sql(conn)
    counts = (
        sa.select(
            s.c.politeness_group.label("name"),
            sa.func.count().label("sources"),
            sa.func.count(sa.case((fetching(s, now), 1))).label("in_flight"),  # MariaDB has no FILTER
            sa.func.sum(sa.case((s.c.enabled, sa.literal(1.0) / s.c.fetch_interval_minutes), else_=0)).label("asks"),
        )
        .group_by(s.c.politeness_group)
        .subquery()
    )
    query = (
        sa.select(
            g.c.name,
            sa.func.coalesce(g.c.max_in_flight, d.c.max_in_flight).label("max_in_flight"),
            sa.func.coalesce(g.c.min_interval_ms, d.c.min_interval_ms).label("min_interval_ms"),
            (g.c.max_in_flight.is_(None) & g.c.min_interval_ms.is_(None)).label("defaults"),
            g.c.next_request_at, g.c.deferred_reason,
            sa.func.coalesce(counts.c.sources, 0).label("sources"),
            sa.func.coalesce(counts.c.in_flight, 0).label("in_flight"),
            counts.c.asks,
        )
        .select_from(g)
        .join(d, d.c.name == DEFAULT)
        .outerjoin(counts, counts.c.name == g.c.name)
        .order_by(g.c.name)
    )
    groups = []
    for row in conn.execute(query).mappings():
        group = dict(row)
        asks = float(group.pop("asks") or 0)  # PostgreSQL's and MariaDB's sums are decimals
        group["asks_per_minute"] = asks
        group["allows_per_minute"] = spacing_allows_per_minute(group["min_interval_ms"])
        group["over_capacity"] = over_capacity(asks, group["min_interval_ms"])
        groups.append(group)
    return groups


def cadence_floor_minutes(conn: Connection, name: str) -> float:
    """The shortest interval at which group ``name`` can fetch each of its enabled
    sources: its spacing times their number (0 for a group without spacing, whose
    fetches in flight bound how many at once, not how often)."""
    g, d, s = _groups, _groups.alias("d"), _sources
    spacing = conn.execute(
        sa.select(sa.func.coalesce(g.c.min_interval_ms, d.c.min_interval_ms))
        .select_from(g).join(d, d.c.name == DEFAULT).where(g.c.name == name)
    ).scalar()
    if not spacing:
        return 0.0
    count = conn.execute(
        sa.select(sa.func.count()).select_from(s).where(s.c.politeness_group == name, s.c.enabled)
    ).scalar_one()
    return float(spacing) * int(count) / 60_000


def defer(conn: Connection, name: str, until: datetime, reason: str) -> None:
    """Start no fetch of group ``name`` before ``until`` (a Retry-After that applies to
    the whole host); an earlier deferral is never shortened."""
    g = _groups
    conn.execute(
        sa.update(g)
        .where(g.c.name == name, sa.or_(g.c.next_request_at.is_(None), g.c.next_request_at < until))
        .values(next_request_at=until, deferred_reason=reason)
    )

"""Rows for tests: small builders over pipeline.storage.schema, shared by tests and worker processes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from pipeline.fetching import politeness
from pipeline.storage import schema


def now() -> datetime:
    return datetime.now(UTC)


def wait_until(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll ``check`` until it returns something true, and return that; AssertionError
    naming ``what`` after ``timeout`` seconds (for processes started by a test)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)
    return value


def add_source(conn: sa.Connection, url: str = "http://127.0.0.1/feed", **values: Any) -> int:
    row = {"name": url, "url": url, "source_type": "rss", **values}
    row.setdefault("politeness_group", politeness.group_for(url, row["source_type"]))
    politeness.ensure_groups(conn, [row["politeness_group"]])
    return int(
        conn.execute(
            sa.insert(schema.sources).values(row).returning(schema.sources.c.id)
        ).scalar_one()
    )


def add_raw_rows(
    conn: sa.Connection,
    source_id: int,
    count: int,
    *,
    start: datetime | None = None,
    step: timedelta = timedelta(milliseconds=1),
) -> list[int]:
    """``count`` unprocessed raw rows, fetched_at ascending from ``start``."""
    start = start or now() - timedelta(days=1)
    rows = [
        {
            "source_id": source_id,
            "source_item_id": f"item-{i}",
            "url": f"http://127.0.0.1/item/{i}",
            "raw_json": {"title": f"item {i}"},
            "content_hash": f"hash-{i}",
            "fetched_at": start + i * step,
        }
        for i in range(count)
    ]
    inserted: list[int] = []
    for chunk in range(0, len(rows), 5000):
        result = conn.execute(
            sa.insert(schema.listings_raw).returning(schema.listings_raw.c.id),
            rows[chunk : chunk + 5000],
        )
        inserted.extend(result.scalars())
    return inserted


def raw_states(conn: sa.Connection, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    t = schema.listings_raw
    result = conn.execute(sa.select(t).where(t.c.id.in_(list(ids))))
    return {row["id"]: dict(row) for row in result.mappings()}

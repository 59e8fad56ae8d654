"""What the pipeline database holds right now: rows per table, claims in flight, expired leases."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline import schema


@dataclass(frozen=True)
class TableStatus:
    table: str
    rows: int
    in_flight: int | None = None  # claimed, lease still running
    expired_leases: int | None = None  # claimed, lease ran out: claimable again


def _now_sql(engine: Engine) -> sa.ColumnElement[datetime]:
    if engine.dialect.name == "postgresql":
        return sa.func.now()
    return sa.literal(datetime.now(UTC), schema.UTCDateTime())


def collect_status(engine: Engine) -> list[TableStatus]:
    now = _now_sql(engine)
    claimable = {t.name for t in schema.CLAIMABLE_TABLES}
    result = []
    with engine.connect() as conn:
        for table in schema.metadata.sorted_tables:
            if table.name not in claimable:
                count = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                result.append(TableStatus(table.name, count))
                continue
            lease = table.c.locked_until
            row = conn.execute(
                sa.select(
                    sa.func.count(),
                    sa.func.count().filter(lease > now),
                    sa.func.count().filter(lease <= now),
                ).select_from(table)
            ).one()
            result.append(TableStatus(table.name, row[0], row[1], row[2]))
    return result


def status_as_json(statuses: list[TableStatus]) -> dict[str, Any]:
    return {"tables": [asdict(s) for s in statuses]}


def status_as_text(statuses: list[TableStatus]) -> str:
    header = ("table", "rows", "in flight", "expired leases")
    lines = [header] + [
        (
            s.table,
            str(s.rows),
            "-" if s.in_flight is None else str(s.in_flight),
            "-" if s.expired_leases is None else str(s.expired_leases),
        )
        for s in statuses
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))
        ).rstrip()
        for line in lines
    )

"""Many rows as ONE bound parameter on PostgreSQL: a JSON array read by jsonb_to_recordset.

``UPDATE t ... FROM jsonb_to_recordset(:rows) AS v(id bigint, ...)`` or ``INSERT INTO t
SELECT ... FROM jsonb_to_recordset(:rows) AS v(...)``: the statement text is the same
for any number of rows (compiled once, planned once), the client serialises the rows in
one C-speed ``jsontext.dumps`` (orjson), and the server casts each field to its column's type. Used
for batch writes whose rows carry values of their own (the fenced writes, pipeline/queue/fenced.py; the bulk inserts, pipeline/backends/postgresql.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from pipeline.core import jsontext


def recordset(columns: Iterable[sa.ColumnClause[Any]], name: str = "v") -> sa.TableValuedAlias:
    """``jsonb_to_recordset(CAST(:rows AS jsonb)) AS name(col type, ...)`` as a FROM item."""
    rows = sa.cast(sa.bindparam("rows", type_=sa.Text()), postgresql.JSONB())
    return sa.func.jsonb_to_recordset(rows).table_valued(*columns, name=name).render_derived(
        with_types=True
    )


def json_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """The ``rows`` parameter: times as ISO 8601 in UTC; nested dicts and lists as JSON."""

    def encode(value: Any) -> Any:
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError(f"naive datetime {value!r}: the pipeline stores UTC-aware times only")
            return value.astimezone(UTC).isoformat()
        raise TypeError(f"cannot send {type(value).__name__} {value!r} in a recordset")

    return jsontext.dumps(list(rows), default=encode)


def integers(name: str) -> sa.Cast[Any]:
    """``CAST(string_to_array(:name, ',') AS BIGINT[])``: many integers as one text
    parameter (``integer_list``), a tenth of the client's work of sending a list, which
    the driver dumps element by element in Python."""
    return sa.cast(sa.func.string_to_array(sa.bindparam(name, type_=sa.Text()), ","),
                   postgresql.ARRAY(sa.BigInteger()))


def integer_list(values: Iterable[int]) -> str:
    """The parameter of ``integers``."""
    return ",".join(map(str, values))

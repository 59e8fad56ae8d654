"""The one timestamp type, stored as each database keeps time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect

from pipeline.backends.mariadb import MARIADB

_ZERO = timedelta(0)


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every database.

    PostgreSQL stores ``timestamptz``. SQLite has no such type: values are stored as
    naive UTC text (which sorts and compares correctly) and come back tagged UTC.
    MariaDB stores naive UTC in ``DATETIME(6)`` (microseconds; the session's time zone
    is UTC, mariadb.py ``configure``, so its CURRENT_TIMESTAMP defaults are UTC too).
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        if dialect.name in MARIADB:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the pipeline stores UTC-aware times only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" or dialect.name in MARIADB else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # A str is raw SQLite text, e.g. from a text() query.
        stamp: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        if stamp.tzinfo is None:
            return stamp.replace(tzinfo=UTC)
        if stamp.utcoffset() == _ZERO:  # already UTC (the session time zone): the hot path
            return stamp
        return stamp.astimezone(UTC)

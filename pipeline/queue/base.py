"""What every claim queue's statements stand on (``QueueBase``): the queue's engine,
spec, lease and strategy, PostgreSQL's own driver path (a psycopg connection lent by
the engine's pool, errors as SQLAlchemy's), and time: "now" and the lease's end as each
database reads them. The claim is pipeline/queue/claim.py, the fenced writes
pipeline/queue/fenced.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from pipeline.backends.clock import sql_now
from pipeline.queue.dialects import (
    DriverStatement,
    Strategy,
    dollar_placeholders,
    strategy_for,
)
from pipeline.queue.spec import QueueSpec, Row


class QueueBase:
    """A queue's engine, spec, lease and strategy, its driver path and its time."""

    def __init__(
        self,
        engine: Engine,
        spec: QueueSpec,
        *,
        lease_seconds: int = 300,
        strategy: Strategy | None = None,
        columns: Iterable[str] | None = None,
    ) -> None:
        """``columns``: what a claim returns besides what the queue itself reads (``id``,
        the columns of its order, its attempts); every column when None."""
        if lease_seconds < 1:
            raise ValueError(f"lease_seconds must be at least 1, got {lease_seconds}")
        self.engine = engine
        self.spec = spec
        self.lease = timedelta(seconds=lease_seconds)
        self.strategy = strategy or strategy_for(engine.dialect.name)
        self.columns = self._returned(columns)
        # A claim, and a fenced write the caller does not put in its own transaction,
        # is one statement: atomic by itself, so on PostgreSQL it runs in autocommit
        # (one round trip, no BEGIN/COMMIT). SQLite keeps BEGIN IMMEDIATE: there, a
        # write that starts as a read can fail on a busy snapshot without waiting.
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._one_statement = engine if self.strategy is Strategy.SQLITE else self._autocommit
        self._time_type = spec.table.c.locked_until.type
        self._claim_names = [c.name for c in self.columns]  # what a claim returns, in order
        # The fenced writes' statements, built once per set of columns (fenced.py).
        self._fenced: dict[tuple[str, ...], sa.Update] = {}
        self._fenced_sql: dict[tuple[str, ...], DriverStatement] = {}
        self._build_statements()

    def _build_statements(self) -> None:
        """What a kind of queue builds once, when it is made (``WorkQueue``: its claim)."""

    def _returned(self, columns: Iterable[str] | None) -> tuple[sa.Column[Any], ...]:
        t, spec = self.spec.table, self.spec
        if columns is None:
            return tuple(t.c)
        names = ["id", *(name for term in spec.order for name in term.names)]
        if spec.attempts is not None:
            names.append(spec.attempts.name)
        for name in columns:
            if name not in t.c:
                raise ValueError(f"{t.name} has no column {name!r} for a claim to return")
            names.append(name)
        return tuple(t.c[name] for name in dict.fromkeys(names))

    # -- the driver's own path (PostgreSQL) ---------------------------------------------

    def _driver_sql(
        self, stmt: sa.Update | sa.Select[Any], convert: Mapping[str, Callable[[Any], Any] | None] | None = None,
    ) -> DriverStatement:
        """``stmt`` as psycopg runs it: compiled by the engine's dialect, its placeholders
        then PostgreSQL's own."""
        compiled = stmt.compile(dialect=self.engine.dialect)
        sql, order = dollar_placeholders(str(compiled))
        return DriverStatement(sql, order, dict(compiled.params), convert or {})

    @contextmanager
    def _driver(self) -> Iterator[Any]:
        """A psycopg connection from the engine's pool, in autocommit while it is lent.

        Its errors reach the caller as SQLAlchemy's (``sa.exc.DBAPIError``), as every
        other statement's do, and a connection the error broke leaves the pool.
        """
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        try:
            raw = self.engine.raw_connection()  # unlike Engine.connect, it does not wrap errors
        except dbapi_error as exc:
            raise sa.exc.DBAPIError.instance(None, None, exc, dbapi_error, hide_parameters=True) from exc
        pg = raw.driver_connection
        assert pg is not None
        try:
            pg.autocommit = True
            yield pg
        except dbapi_error as exc:
            broken = bool(pg.closed or pg.broken or self.engine.dialect.is_disconnect(exc, pg, None))
            if broken:
                # As SQLAlchemy does on a disconnect: this connection leaves the pool, and
                # every other the pool holds is stale too (a server restart): the engine
                # starts a new pool (the old one's idle connections are closed now, those
                # lent out when they come back).
                raw.invalidate(exc)
                self.engine.dispose()
            raise sa.exc.DBAPIError.instance(
                None, None, exc, dbapi_error, hide_parameters=True, connection_invalidated=broken
            ) from exc
        finally:
            if not pg.closed:
                if pg.info.transaction_status == pg.info.transaction_status.IDLE:
                    pg.autocommit = False  # as the pool lends it to everyone else
                else:
                    raw.invalidate()
            raw.close()

    def _rows(self, cursor: Any) -> list[Row]:
        """A claim's rows (``self.columns``, in order: psycopg's ``description`` builds a
        column object per column at each call)."""
        names = self._claim_names
        return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]

    # -- time ---------------------------------------------------------------------------

    def now(self) -> sa.ColumnElement[datetime]:
        """"Now" in this queue's statements (``sql_now``); off PostgreSQL, the bound
        parameter ``claim_now``, set per execution (see ``_time_params``)."""
        return sql_now(self._time_type, database_clock=self.strategy is Strategy.POSTGRES, bind="claim_now")

    def _lease_until(self) -> sa.ColumnElement[datetime]:
        if self.strategy is Strategy.POSTGRES:
            return self.now() + sa.bindparam("claim_lease", type_=sa.Interval())
        return sa.bindparam("claim_until", type_=self._time_type)

    def _time_params(self, lease: timedelta) -> dict[str, Any]:
        if self.strategy is Strategy.POSTGRES:
            return {"claim_lease": lease}
        now = datetime.now(UTC)
        return {"claim_now": now, "claim_until": now + lease}

    def _time_params_in(self, conn: Connection) -> dict[str, Any]:
        """The time parameters of statements sent in ``conn``'s transaction: this host's
        clock, or on MariaDB the database's, read in that transaction (``_database_time``)."""
        if self.strategy is Strategy.MARIADB:
            return self._database_time(conn, self.lease)
        return self._time_params(self.lease)

    def _database_time(self, conn: Connection, lease: timedelta) -> dict[str, Any]:
        """MariaDB: ``claim_now`` and ``claim_until`` by the database's clock, read in
        the transaction that uses them, so workers on hosts with skewed clocks agree
        (PostgreSQL's statements read ``now()`` themselves)."""
        now = conn.execute(sa.select(sa.func.utc_timestamp(sa.literal_column("6")))).scalar_one()
        now = now.replace(tzinfo=UTC)
        return {"claim_now": now, "claim_until": now + lease}

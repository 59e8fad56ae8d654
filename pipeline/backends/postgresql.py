"""PostgreSQL, production: many rows in one statement whatever their number, read from
one bound JSON text (``recordset.py``); conflicts skipped or added to with ON CONFLICT
(on_conflict.py); "now" is the database's clock."""

from __future__ import annotations

import json
import operator
import zlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection, Engine

from pipeline.backends.changed import StoreChanged
from pipeline.backends.clock import seconds_text
from pipeline.backends.on_conflict import OnConflict
from pipeline.backends.portable import IDLE_IN_TRANSACTION_TIMEOUT_MS, Rows, held_by_session
from pipeline.backends.recent import Asking, RecentPerKey
from pipeline.backends.recordset import integer_list, integers, json_rows, recordset
from pipeline.backends.upsert import ForwardUpsert
from pipeline.core.errors import DatabaseUnavailable


class PostgreSQL(OnConflict):
    name = "postgresql"
    database_clock = True
    reads_levels = True

    def engine_options(self, url: sa.URL, options: dict[str, Any]) -> None:
        """No pool_pre_ping: it costs a round trip per checkout, a fifth of a small claim.
        A connection lost to a server restart fails one statement; SQLAlchemy then
        invalidates the pool, and the step's RetryPolicy runs it again."""
        connect_args = options.setdefault("connect_args", {})
        connect_args.setdefault("connect_timeout", 10)
        connect_args.setdefault("application_name", "listings-pipeline")

    def configure(self, engine: Engine) -> None:
        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Every timestamp is UTC (UTCDateTime): timestamptz values then come back
            # from the driver already in UTC, whatever the server's default zone. No JIT:
            # the pipeline's statements are short, and compiling one took longer than
            # running it (37 ms against 18 for a batch's story lookup, bench/RESULTS.md).
            autocommit = dbapi_conn.autocommit
            dbapi_conn.autocommit = True
            dbapi_conn.execute(
                "SELECT set_config('TimeZone', 'UTC', false), set_config('jit', 'off', false),"
                " CASE WHEN current_setting('idle_in_transaction_session_timeout') = '0'"
                " THEN set_config('idle_in_transaction_session_timeout', %s, false) END",
                [str(IDLE_IN_TRANSACTION_TIMEOUT_MS)],
            )
            dbapi_conn.autocommit = autocommit

    def insert_rows(self, conn: Connection, table: sa.Table, rows: Rows, *,
                    ignore_conflicts_on: Sequence[str] = ()) -> int:
        """``INSERT INTO t (cols) SELECT cols FROM jsonb_to_recordset(:rows)``, with ``ON
        CONFLICT (ignore_conflicts_on) DO NOTHING`` when given. One bound JSON text
        whatever the number of rows: an executemany (insertmanyvalues) costs a round of
        Python work per row, and psycopg re-parsed each generated statement
        (bench/RESULTS.md, matching)."""
        if not rows:
            return 0
        columns = tuple(rows[0])

        def build() -> sa.Insert:
            v = recordset(sa.column(name, table.c[name].type) for name in columns)
            select = sa.select(*(v.c[name] for name in columns))
            stmt: sa.Insert = sa.insert(table).from_select(list(columns), select)
            if ignore_conflicts_on:
                # ("*",): a clash on any unique key of the table.
                targets = None if tuple(ignore_conflicts_on) == ("*",) else list(ignore_conflicts_on)
                stmt = postgresql.insert(table).from_select(list(columns), select).on_conflict_do_nothing(
                    index_elements=targets
                )
            # SQLAlchemy keeps an INSERT's rowcount only when asked to.
            return stmt.execution_options(preserve_rowcount=True)

        stmt = self._built(("insert", table.name, columns, tuple(ignore_conflicts_on)), build)
        return int(conn.execute(stmt, {"rows": json_rows(rows)}).rowcount)

    def insert_ignoring_conflicts(self, conn: Connection, table: sa.Table, rows: Rows, keys: list[str]) -> int:
        return self.insert_rows(conn, table, rows, ignore_conflicts_on=keys or ("*",))

    def add_to(self, conn: Connection, table: sa.Table, keys: Sequence[str], value: str, rows: Rows) -> None:
        """INSERT ... SELECT FROM jsonb_to_recordset(:rows) ORDER BY the key ... ON
        CONFLICT DO UPDATE adding: one statement, one bound JSON text. An executemany of
        the rows, which psycopg runs as a pipeline, took 7% of the collector's client
        samples on an unchanged pass (bench/RESULTS.md)."""
        if not rows:
            return
        def build() -> sa.Insert:
            columns = [*keys, value]
            v = recordset(sa.column(c, table.c[c].type) for c in columns)
            ordered = sa.select(*(v.c[c] for c in columns)).order_by(*(v.c[k] for k in keys))
            return self.adding(postgresql.insert(table).from_select(columns, ordered), table, keys, value)

        stmt = self._built(("add", table.name, tuple(keys), value), build)
        conn.execute(stmt, {"rows": json_rows(rows)})

    def upsert_forward(self, conn: Connection, spec: ForwardUpsert, rows: Rows) -> Sequence[sa.Row[Any]] | None:
        """One statement, the rows one JSON parameter, RETURNING what the spec names of
        the rows it wrote (a row older than the stored one writes nothing)."""
        def build() -> Any:
            t = spec.table
            v = recordset(sa.column(name, t.c[name].type) for name in spec.columns)
            insert = postgresql.insert(t).from_select(list(spec.columns), sa.select(*(v.c[name] for name in spec.columns)))
            return self._forward(spec, insert).returning(*(t.c[name] for name in spec.returning))

        return conn.execute(self._built(("forward", spec), build), {"rows": json_rows(rows)}).all()

    def store_changed(self, conn: Connection, spec: StoreChanged, rows: Sequence[tuple[Any, ...]]) -> list[Any]:
        """One statement for the whole batch, whatever its size: the rows arrive as one
        JSON array of arrays (binding an array per column cost psycopg more CPU than the
        rest of the write), the upsert of the hashes hands back only the keys new or
        changed, and exactly those get a row. The JSON column's text goes into the array
        as it is (it is JSON: encoding it as a string took about 4 us of client CPU per
        item against 1, and the server parsed it twice). The statement's text is in
        pipeline/queue/sql/listings_raw.store.postgresql.sql, as the collector sends it."""
        unique = spec.unique(list(rows))
        if not unique:
            return []
        sql, encoders, row = self._built(("store", spec), lambda: self.store_statement(spec, conn.dialect))
        # Column by column (a C-level map each), then a row at a time into its brackets.
        columns = [map(encode, values) for encode, values in zip(encoders, zip(*unique, strict=True), strict=True)]
        packed = "[" + ",".join(map(row.format, *columns)) + "]"
        return list(conn.exec_driver_sql(sql, {"rows": packed}).scalars())

    @staticmethod
    def store_statement(spec: StoreChanged, dialect: sa.Dialect) -> tuple[str, list[Callable[[Any], str]], str]:
        """``store_changed``'s SQL, how each column's value is written into the array,
        and a packed row's template (``[{},{},...]``)."""
        fields: list[str] = []
        encoders: list[Callable[[Any], str]] = []
        for n, name in enumerate(spec.columns):
            type_ = spec.rows.c[name].type
            if name == spec.json:
                fields.append(f"e->{n} AS {name}")
                encoders.append(operator.attrgetter("text"))  # a JSONValue's
            elif isinstance(type_, sa.String):
                fields.append(f"e->>{n} AS {name}")
                encoders.append(_string)
            elif isinstance(type_, sa.Integer):
                fields.append(f"(e->>{n})::{type_.compile(dialect).lower()} AS {name}")
                encoders.append("%d".__mod__)
            else:
                raise TypeError(f"store_changed packs text, integer and JSON columns, not {name} ({type_})")
        keys, kept = ", ".join(spec.keys), ", ".join((*spec.keys, spec.hash))
        hashes, h = spec.hashes.name, spec.hash
        sql = "\n".join([
            "WITH incoming AS MATERIALIZED (",
            f"    SELECT {', '.join(fields)}",
            "    FROM jsonb_array_elements(%(rows)s::jsonb) AS e",
            "), changed AS (",
            f"    INSERT INTO {hashes} ({kept})",
            f"    SELECT {kept} FROM incoming",
            f"    ON CONFLICT ({keys}) DO UPDATE",
            f"        SET {h} = excluded.{h}, {spec.touched} = CURRENT_TIMESTAMP",
            f"        WHERE {hashes}.{h} <> excluded.{h}",
            f"    RETURNING {keys}",
            ")",
            f"INSERT INTO {spec.rows.name} ({', '.join(spec.columns)})",
            f"SELECT {', '.join(f'i.{name}' for name in spec.columns)}",
            f"FROM incoming i JOIN changed c USING ({keys})",
            f"RETURNING {spec.returning}",
        ])
        return sql, encoders, "[" + ",".join(["{}"] * len(encoders)) + "]"

    def adding_from(self, table: sa.Table, keys: Sequence[str], value: str, columns: Sequence[str],
                    select: sa.Selectable) -> sa.Insert:
        """``INSERT ... SELECT ... ON CONFLICT DO UPDATE`` adding: a data-modifying CTE
        (SQLite's ON CONFLICT after a SELECT needs a WHERE to parse, and it runs no
        such CTE: it has no use for one)."""
        return self.adding(postgresql.insert(table).from_select(list(columns), select), table, keys, value)

    def whole_steps(self, since: sa.ColumnElement[datetime], now: sa.ColumnElement[datetime],
                    step: timedelta) -> sa.ColumnElement[Any]:
        return sa.func.floor(sa.extract("epoch", now - since) / seconds_text(step))

    def where_pairs(self, query: sa.Select[Any], first: sa.Column[Any], second: sa.Column[Any]) -> sa.Select[Any]:
        """A join with the pairs as two paired arrays (``unnest``): one probe of an index
        on the pair per pair, and the same SQL text for every batch (a tuple IN list
        would be new text each time, compiled and parsed again)."""
        pairs = sa.func.unnest(
            sa.bindparam("firsts", type_=postgresql.ARRAY(first.type)),
            sa.bindparam("seconds", type_=postgresql.ARRAY(second.type)),
        ).table_valued(
            sa.column("first", first.type), sa.column("second", second.type), name="k"
        ).render_derived()  # AS k(first, second): unnest's columns get these names
        return query.join(pairs, sa.and_(first == pairs.c.first, second == pairs.c.second))

    def pairs_params(self, pairs: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
        return {"firsts": [p[0] for p in pairs], "seconds": [p[1] for p in pairs]}

    def recent_per_key(self, conn: Connection, spec: RecentPerKey, asking: Asking) -> Sequence[sa.Row[Any]]:
        """A lateral join per value asked, over the key's index (id descending); for the
        keys after the first, only rows near a fingerprint asking with that value (a far
        smaller answer when keys are crowded). The integers go as text (``integers``)."""
        stmt = self._built(("recent", spec), lambda: self._recent_lateral(spec))
        params: dict[str, Any] = {"exclude": integer_list(asking.exclude)}
        for number, values in enumerate(asking.values):
            params[f"values_{number}"] = integer_list(values)
            if number:
                params[f"asking_{number}"] = integer_list(value for value, _ in asking.prints[number])
                params[f"prints_{number}"] = integer_list(print_ for _, print_ in asking.prints[number])
        return conn.execute(stmt, params).all()

    @staticmethod
    def _recent_lateral(spec: RecentPerKey) -> sa.CompoundSelect[Any]:
        t = spec.table

        def part(number: int, column: str, key_number: Any, stored: list[sa.Column[Any]]) -> sa.Select[Any]:
            values = sa.func.unnest(integers(f"values_{number}")).table_valued(
                sa.column("value", sa.BigInteger()), name=f"v{number}").render_derived()
            recent = (sa.select(*stored).where(t.c[column] == values.c.value, t.c.id != sa.all_(integers("exclude")))
                      .order_by(t.c.id.desc()).limit(spec.per_key).lateral(f"r{number}"))
            found = (sa.select(key_number, values.c.value.label("key_value"), *recent.c)
                     .select_from(values).join(recent, sa.true()))
            if not number:
                return found
            # After the first key: near one asking with this value.
            asking = sa.func.unnest(integers(f"asking_{number}"), integers(f"prints_{number}")).table_valued(
                sa.column("value", sa.BigInteger()), sa.column("print", sa.BigInteger()), name=f"a{number}",
            ).render_derived()
            near = sa.func.bit_count(sa.cast(recent.c[spec.fingerprint].op("#")(asking.c["print"]), postgresql.BIT(64)))
            # A semi-join: each row once, however many fingerprints ask with its value.
            return found.where(sa.exists().select_from(asking).where(
                asking.c.value == values.c.value, near <= spec.max_distance))

        return spec.union(part)

    def serialising_lock(self, table: sa.Table) -> sa.Select[Any]:
        """Also plans the rest of the transaction's statements for their own parameters:
        a prepared statement is otherwise planned once for any (``plan_cache_mode``), and
        the story lookup's generic plan, made blind to how many keys are asked and how
        many listings there are, took 10 times as long (bench/RESULTS.md, "One alert per
        story")."""
        return sa.select(*table.primary_key.columns,
                         sa.func.set_config("plan_cache_mode", "force_custom_plan", True)).with_for_update()

    def late_seconds(
        self, conn: Connection, happened: sa.Column[datetime], due: sa.Column[datetime],
        where: Sequence[sa.ColumnElement[bool]], quantiles: Sequence[float], *,
        since: sa.ColumnElement[datetime], by_hour: bool,
    ) -> list[tuple[datetime, int, tuple[float, ...]]]:
        """In SQL: ``percentile_cont`` over the lateness in seconds, per hour by
        ``date_trunc``."""
        late = sa.func.greatest(sa.extract("epoch", happened - due), 0)
        start = sa.func.date_trunc("hour", happened) if by_hour else since
        query = sa.select(
            start.label("start"), sa.func.count().label("n"),
            *(sa.func.percentile_cont(q).within_group(late).label(f"q{i}") for i, q in enumerate(quantiles)),
        ).where(*where)
        if by_hour:
            query = query.group_by(start).order_by(start.desc())
        return [(r["start"], int(r["n"]), tuple(float(r[f"q{i}"]) for i in range(len(quantiles))))
                for r in conn.execute(query).mappings() if r["n"]]

    def on_conflict_insert(self, table: sa.Table) -> postgresql.Insert:
        return postgresql.insert(table)

    def session_lock(self, engine: Engine, name: str, wait_seconds: int) -> AbstractContextManager[Connection | None]:
        """A session advisory lock, keyed by ``name``'s CRC-32 (advisory locks are per
        database)."""
        key = zlib.crc32(name.encode())

        def acquire(conn: Connection) -> sa.Executable:
            conn.execute(sa.text(f"SET lock_timeout = '{int(wait_seconds)}s'"))
            try:
                conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            except sa.exc.OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) == "55P03":  # lock_not_available
                    raise DatabaseUnavailable(f"another session held lock {name!r} for {wait_seconds} s; "
                                              "try again") from None
                raise
            conn.execute(sa.text("RESET lock_timeout"))
            return sa.text("SELECT pg_advisory_unlock(:key)").bindparams(key=key)

        return held_by_session(engine, acquire)

    def estimated_rows(self, conn: Connection, table: sa.Table) -> int | None:
        """The planner's estimate (``pg_class.reltuples``, kept by VACUUM and ANALYZE);
        None for a table never analysed yet (-1: none kept, where 0 was read as empty)."""
        value = conn.execute(
            sa.text("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(:t)"), {"t": table.name},
        ).scalar()
        return None if value is None or value < 0 else int(value)


_string: Callable[[Any], str] = json.JSONEncoder(ensure_ascii=False).encode

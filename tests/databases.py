"""Test databases on a server: created, migrated once, and lent again and again.

A test worker migrates one database per server once (``ServerDatabases.shared``) and
lends it to test after test; before each loan ``Reusable.reset`` puts back the state the
migrations left: it truncates the tables a test wrote to (restarting their identities),
puts back the rows the migrations seeded, and replaces the whole database when a test
changed its schema (a trigger, a function, a column, a database setting), so no test
sees another's rows or objects. Resetting a database costs a few milliseconds; cloning
a PostgreSQL template cost about 0.1 s a test and migrating a MariaDB database about
0.9 s.

Tests that need a database of their own (several processes over minutes, a Dagster
instance's storage, an empty one for the migrations) ask for it: ``migrated()``,
``create()``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from pipeline.core import politeness
from pipeline.storage import db, politeness_groups
from pipeline.storage.migrate import upgrade

# Every feed of the suite is served from 127.0.0.1, one politeness group: test databases
# start with generous default limits, as an operator would set them for such a host.
# The politeness tests (tests/test_politeness.py) set limits of their own.
TEST_MAX_IN_FLIGHT = 64
VERSION_TABLE = "alembic_version"


def migrate(engine: sa.Engine) -> None:
    """Bring a test database to the head revision, with the suite's politeness defaults."""
    upgrade(engine)
    with engine.begin() as conn:
        politeness_groups.set_limits(conn, politeness.DEFAULT, max_in_flight=TEST_MAX_IN_FLIGHT,
                              min_interval_seconds=0)


class Reusable:
    """One migrated database lent to test after test, and how to put it back as the
    migrations left it. The dialect's catalogue queries are the subclass's."""

    # The database's objects and settings, one row each: a test that changes them
    # leaves a database that must be replaced.
    SCHEMA: str
    # The names of the tables whose identity (sequence, AUTO_INCREMENT) has been taken from.
    IDENTITY_TAKEN: str

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = db.create_engine(url, poolclass=sa.pool.NullPool)
        tables = sa.MetaData()
        tables.reflect(self.engine)
        self.tables = {name: t for name, t in tables.tables.items() if name != VERSION_TABLE}
        with self.engine.connect() as conn:
            self.seeds = {
                name: rows for name, t in self.tables.items()
                if (rows := [dict(r) for r in conn.execute(sa.select(t)).mappings()])
            }
            self.schema = self._schema(conn)
        for name in self.seeds:
            if any(c.identity is not None or c.autoincrement is True for c in self.tables[name].c):
                raise RuntimeError(f"the migrations seed {name}, whose identity a reset would restart "
                                   "under its rows: tests/databases.py cannot put it back")
        # A table is written when it holds a row, or when its identity has been taken from;
        # a seeded table, when its rows differ from the seeds (reset compares them).
        holding = " UNION ALL ".join(f"SELECT '{name}' FROM (SELECT 1 FROM {name} LIMIT 1) AS r"
                                     for name in self.tables if name not in self.seeds)
        self.written_sql = f"{holding} UNION {self.IDENTITY_TAKEN}"
        # Who refers to whom: truncating a table truncates the tables that refer to it.
        self.referrers: dict[str, set[str]] = {name: set() for name in self.tables}
        for name, t in self.tables.items():
            for fk in t.foreign_keys:
                if fk.column.table.name in self.referrers:
                    self.referrers[fk.column.table.name].add(name)

    def _schema(self, conn: sa.Connection) -> Any:
        return conn.exec_driver_sql(self.SCHEMA).all()

    def reset(self) -> bool:
        """Put the database back as the migrations left it; False when a test changed its
        schema, so that it must be replaced instead."""
        with self.engine.connect() as conn:
            self.end_other_sessions(conn)
            if self._schema(conn) != self.schema:
                return False
            written = {name for (name,) in conn.exec_driver_sql(self.written_sql)}
            for name, rows in self.seeds.items():
                now = [dict(r) for r in conn.execute(sa.select(self.tables[name])).mappings()]
                if now != rows:
                    written.add(name)
            if written:
                truncated = self._with_referrers(written)
                self.truncate(conn, sorted(truncated))
                for name in sorted(truncated & self.seeds.keys()):
                    conn.execute(sa.insert(self.tables[name]), self.seeds[name])
            conn.commit()
        return True

    def _with_referrers(self, names: set[str]) -> set[str]:
        todo, seen = list(names), set(names)
        while todo:
            for referrer in self.referrers[todo.pop()] - seen:
                seen.add(referrer)
                todo.append(referrer)
        return seen

    def end_other_sessions(self, conn: sa.Connection) -> None:
        raise NotImplementedError

    def truncate(self, conn: sa.Connection, names: list[str]) -> None:
        raise NotImplementedError

    def dispose(self) -> None:
        self.engine.dispose()


class ReusablePostgres(Reusable):
    # pg_sequences.last_value is NULL until the first nextval after a (re)start.
    IDENTITY_TAKEN = """
        SELECT d.refobjid::regclass::text FROM pg_sequences s
        JOIN pg_depend d ON d.objid = (quote_ident(s.schemaname) || '.' || quote_ident(s.sequencename))::regclass
                        AND d.deptype IN ('a', 'i')
        WHERE s.schemaname = current_schema() AND s.last_value IS NOT NULL"""
    SCHEMA = """
        SELECT kind, name FROM (
            SELECT 'relation', c.oid::regclass::text || ' ' || c.relkind::text || c.relrowsecurity::text
                   || ' ' || coalesce((SELECT string_agg(a.attname || ':' || a.atttypid::regtype::text
                                                         || a.attnotnull::text, ',' ORDER BY a.attnum)
                                       FROM pg_attribute a
                                       WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '')
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp)'
            UNION ALL SELECT 'trigger', tgname FROM pg_trigger WHERE NOT tgisinternal
            UNION ALL SELECT 'function', p.oid::regprocedure::text
                FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
            UNION ALL SELECT 'schema', nspname FROM pg_namespace WHERE nspname !~ '^pg_(toast|temp)'
            UNION ALL SELECT 'policy', polname FROM pg_policy
            UNION ALL SELECT 'setting', array_to_string(setconfig, ',') FROM pg_db_role_setting
                WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
            UNION ALL SELECT 'revision', version_num FROM alembic_version
        ) AS objects(kind, name) ORDER BY kind, name"""

    def end_other_sessions(self, conn: sa.Connection) -> None:
        """A test's leftover connections (a process it started, an engine it did not
        dispose of) would hold the locks TRUNCATE waits for."""
        conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    def truncate(self, conn: sa.Connection, names: list[str]) -> None:
        conn.exec_driver_sql(f"TRUNCATE {', '.join(names)} RESTART IDENTITY")


class ReusableMariaDB(Reusable):
    # AUTO_INCREMENT is 1 in a table whose identity nothing has taken (or TRUNCATE reset).
    IDENTITY_TAKEN = """
        SELECT table_name FROM information_schema.tables
        WHERE table_schema = DATABASE() AND auto_increment > 1"""
    SCHEMA = """
        SELECT 'column', CONCAT_WS(' ', table_name, column_name, column_type, is_nullable, column_key)
            FROM information_schema.columns WHERE table_schema = DATABASE()
        UNION ALL SELECT 'trigger', trigger_name FROM information_schema.triggers
            WHERE trigger_schema = DATABASE()
        UNION ALL SELECT 'routine', routine_name FROM information_schema.routines
            WHERE routine_schema = DATABASE()
        UNION ALL SELECT 'index', CONCAT_WS(' ', table_name, index_name, column_name)
            FROM information_schema.statistics WHERE table_schema = DATABASE()
        UNION ALL SELECT 'charset', CONCAT_WS(' ', default_character_set_name, default_collation_name)
            FROM information_schema.schemata WHERE schema_name = DATABASE()
        UNION ALL SELECT 'revision', version_num FROM alembic_version
        ORDER BY 1, 2"""

    def end_other_sessions(self, conn: sa.Connection) -> None:
        ids = conn.exec_driver_sql("SELECT id FROM information_schema.processlist "
                                   "WHERE db = DATABASE() AND id <> CONNECTION_ID()").scalars().all()
        for session in ids:
            try:
                conn.exec_driver_sql(f"KILL CONNECTION {int(session)}")
            except sa.exc.DBAPIError:
                pass  # it ended meanwhile

    def truncate(self, conn: sa.Connection, names: list[str]) -> None:
        conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for name in names:
                conn.exec_driver_sql(f"TRUNCATE TABLE {name}")
        finally:
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 1")


class ServerDatabases:
    """Creates and drops databases on one server; ``close`` drops every one it created
    that is left (tests that keep theirs to the end once left them behind: two per
    session, on a server other sessions share)."""

    CREATE = "CREATE DATABASE {name}"
    DROP = "DROP DATABASE IF EXISTS {name}"
    REUSABLE: Callable[[str], Reusable]

    def __init__(self, server_url: str) -> None:
        self.server = db.parse_url(server_url)
        self.admin = sa.create_engine(self.server, isolation_level="AUTOCOMMIT")
        self._names = itertools.count()
        # Unique on the server: each test worker is a process, and other sessions may
        # share the server.
        self.prefix = f"pipeline_test_{os.getpid()}"
        self.created: set[str] = set()
        self._shared: Reusable | None = None
        self._shared_name = ""

    def url(self, name: str) -> str:
        return self.server.set(database=name).render_as_string(hide_password=False)

    def create(self, clause: str = "") -> str:
        name = f"{self.prefix}_{next(self._names)}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(self.CREATE.format(name=name) + clause)
        self.created.add(name)
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(self.DROP.format(name=name))
        self.created.discard(name)

    def migrated(self) -> str:
        """A database of the caller's own at the head revision; the caller drops it."""
        name = self.create()
        engine = db.create_engine(self.url(name))
        migrate(engine)
        engine.dispose()
        return name

    def shared(self) -> str:
        """The URL of this worker's reusable database at the head revision, as the
        migrations left it (replaced when the last test changed its schema)."""
        if self._shared is not None and not self._shared.reset():
            self._shared.dispose()
            self.drop(self._shared_name)
            self._shared = None
        if self._shared is None:
            self._shared_name = self.migrated()
            self._shared = self.REUSABLE(self.url(self._shared_name))
        return self._shared.url

    def close(self) -> None:
        if self._shared is not None:
            self._shared.dispose()
        for name in sorted(self.created):
            self.drop(name)
        self.admin.dispose()


class PostgresDatabases(ServerDatabases):
    """Each private database a clone of a template migrated once."""

    DROP = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    REUSABLE = ReusablePostgres

    def __init__(self, server_url: str) -> None:
        super().__init__(server_url)
        self.template: str | None = None

    def migrated(self) -> str:
        if self.template is None:
            self.template = super().migrated()
        return self.create(f" TEMPLATE {self.template}")


class MariaDatabases(ServerDatabases):
    """MariaDB has no template databases: each private one is migrated. utf8mb4_bin:
    the pipeline's text compares case-sensitively, as on PostgreSQL (pipeline/storage/db.py)."""

    CREATE = "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    REUSABLE = ReusableMariaDB

"""Migrations apply, revert and re-apply on both databases, and never drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pipeline.core.errors import SchemaMismatch
from pipeline.backends.mariadb import MARIADB
from pipeline.storage import db, migrate, schema
from tests.conftest import conformance
from tests.helpers import wait_until

pytestmark = conformance

TABLES = {t.name for t in schema.metadata.sorted_tables}


def table_names(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade(empty_db_url):
    engine = db.create_engine(empty_db_url)
    migrate.upgrade(engine)
    assert table_names(engine) == TABLES
    assert migrate.current_revision(engine) == migrate.head_revision()
    migrate.downgrade(engine, "base")
    assert table_names(engine) == set()
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert table_names(engine) == TABLES
    migrate.check_schema(engine)
    engine.dispose()


def _on_this_database(dialect: str):
    """Alembic's filter: leave out the indexes that are not created on ``dialect`` (a
    queue's partial indexes, or its MariaDB index: ``QueueSpec.indexes``)."""
    def include(item, name, type_, reflected, compare_to) -> bool:
        rule = getattr(item, "_ddl_if", None)
        if type_ != "index" or reflected or rule is None or rule.dialect is None:
            return True
        dialects = (rule.dialect,) if isinstance(rule.dialect, str) else rule.dialect
        return dialect in dialects
    return include


def test_migrations_match_the_table_definitions(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "compare_type": True, "include_object": _on_this_database(conn.dialect.name)})
        diff = compare_metadata(context, schema.metadata)
    assert diff == [], f"pipeline/storage/schema.py and migrations/ disagree: {diff}"


def _schema_objects(engine: sa.Engine) -> dict[str, str]:
    """Every index and constraint, as the database itself prints it."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            indexes = conn.execute(
                sa.text(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
                    " AND tablename <> 'alembic_version'"
                )
            )
            constraints = conn.execute(
                sa.text(
                    "SELECT conname, pg_get_constraintdef(c.oid) FROM pg_constraint c"
                    " JOIN pg_namespace n ON n.oid = c.connamespace"
                    " WHERE n.nspname = 'public'"
                    " AND c.conrelid::regclass::text <> 'alembic_version'"
                )
            )
            return dict(list(indexes) + list(constraints))
        if engine.dialect.name in MARIADB:
            tables = [t for t in sa.inspect(conn).get_table_names() if t != "alembic_version"]
            return {table: _normalise_mariadb_ddl(conn.exec_driver_sql(f"SHOW CREATE TABLE {table}").one()[1])
                    for table in tables}
        rows = conn.execute(
            sa.text(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"
                " AND name NOT LIKE 'alembic%'"
            )
        )
        return {name: _normalise_sqlite_ddl(sql) for name, sql in rows}


def _normalise_mariadb_ddl(sql: str) -> str:
    """MariaDB prints a table as it is, its items in the order they were added: sort
    them, and drop the AUTO_INCREMENT counter."""
    lines = [line.strip().rstrip(",") for line in sql.splitlines()]
    return "\n".join([lines[0], *sorted(lines[1:-1]), re.sub(r" AUTO_INCREMENT=\d+", "", lines[-1])])


def _normalise_sqlite_ddl(sql: str) -> str:
    """SQLite keeps DDL as written: ignore spacing, quoting, the order of table items, and
    the parentheses a table copied by Alembic's batch mode puts around a default."""
    text = re.sub(r'[\s"]+', " ", sql).strip()
    text = re.sub(r"DEFAULT \(([^()]*)\)", r"DEFAULT \1", text)
    head, paren, body = text.partition("(")
    if not head.upper().startswith("CREATE TABLE"):
        return text
    items, depth, current = [], 0, ""
    for char in body[: body.rindex(")")]:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += char
    items.append(current.strip())
    return head + paren + ", ".join(sorted(items)) + ")"


def test_indexes_and_constraints_match_the_table_definitions(engine, empty_db_url):
    """compare_metadata does not see partial-index predicates or CHECKs; this does."""
    fresh = db.create_engine(empty_db_url)
    schema.metadata.create_all(fresh)
    from_code, from_migrations = _schema_objects(fresh), _schema_objects(engine)
    fresh.dispose()
    assert from_migrations == from_code


def test_every_claim_queue_has_its_indexes_in_the_migrations(engine):
    names = {ix["name"] for t in schema.CLAIMABLE_TABLES for ix in sa.inspect(engine).get_indexes(t.name)}
    for spec in schema.QUEUES:
        assert f"ix_{spec.table.name}_{spec.name}_free" in names
        if engine.dialect.name not in MARIADB:  # one index serves both branches there
            assert f"ix_{spec.table.name}_{spec.name}_leased" in names


def test_item_ids_too_long_for_mariadbs_keys_become_their_hash_and_keep_their_identity(backend, empty_db_url):
    from pipeline.fetching.base import Item

    if backend == "mariadb":
        pytest.skip("MariaDB's support starts with the revision that rewrites them: it has no older ids")
    engine = db.create_engine(empty_db_url)
    migrate.upgrade(engine, "0009")
    long_id, short_id = "x" * 800 + "é", "y" * 760
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sources (name, url, source_type) VALUES ('s', 'http://127.0.0.1/f', 'rss')"))
        for item_id in (long_id, short_id):
            conn.execute(sa.text("INSERT INTO source_items (source_id, source_item_id, content_hash)"
                                 " VALUES (1, :id, 'h')"), {"id": item_id})
            conn.execute(sa.text("INSERT INTO listings_raw (source_id, source_item_id, url, raw_json, content_hash)"
                                 " VALUES (1, :id, 'http://127.0.0.1/i', '{}', 'h')"), {"id": item_id})
            conn.execute(sa.text("INSERT INTO listings (source_id, source_item_id, url, content_hash)"
                                 " VALUES (1, :id, 'http://127.0.0.1/i', 'h')"), {"id": item_id})
    migrate.upgrade(engine)
    hashed = Item(long_id, "http://127.0.0.1/i", {}).source_item_id
    assert hashed.startswith("sha256:") and Item(short_id, "http://127.0.0.1/i", {}).source_item_id == short_id
    with engine.connect() as conn:
        for table in ("source_items", "listings_raw", "listings"):
            stored = sorted(conn.execute(sa.text(f"SELECT source_item_id FROM {table}")).scalars())
            assert stored == sorted([hashed, short_id]), table
    engine.dispose()


def test_story_keys_move_into_their_listings_and_back(backend, empty_db_url):
    """Revision 0015 carries revision 0013's ``story_keys`` rows into the listings' own
    columns, with the values this code computes (or copies of the older listings would
    not be found), and its downgrade puts the same rows back."""
    from pipeline.listings import stories
    from pipeline.listings.normalize import normalise

    engine = db.create_engine(empty_db_url)
    migrate.upgrade(engine, "0014")
    texts = [("Harbour bridge reopens after a week of repairs",
              "Traffic flows again across the harbour bridge this morning, the city said.",
              "https://news.example/bridge?utm_source=feed"),
             ("Short", "", "https://news.example/short"),  # too few words: a link key only
             ("Home", "", "https://news.example/")]  # a home page: no key at all
    marks = [stories.Marks.of(normalise({"title": t, "summary": x, "url": u}))
             for t, x, u in texts]
    old_keys = set()
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sources (name, url, source_type) VALUES ('s', 'http://127.0.0.1/f', 'rss')"))
        for number, mark in enumerate(marks, 1):
            simhash = None if mark.fingerprint is None else stories.to_signed(mark.fingerprint)
            conn.execute(sa.text("INSERT INTO listings (id, source_id, source_item_id, url, content_hash, simhash)"
                                 " VALUES (:id, 1, :id, 'http://127.0.0.1/i', 'h', :simhash)"),
                         {"id": number, "simhash": simhash})
            # Revision 0013's keys: the link's, tagged with bit 62; each band with its position.
            if mark.url_key is not None:
                old_keys.add(((1 << 62) | mark.url_key, number, None))
            for band, value in enumerate(stories.bands(mark.fingerprint) if mark.fingerprint is not None else ()):
                old_keys.add(((band << 16) | value, number, simhash))
        for key in old_keys:
            conn.execute(sa.insert(sa.table("story_keys", sa.column("key"), sa.column("listing_id"),
                                            sa.column("simhash"))).values(dict(zip(("key", "listing_id", "simhash"), key))))
    assert sum(1 for key in old_keys if key[1] == 1) == 5 and sum(1 for key in old_keys if key[1] == 2) == 1
    migrate.upgrade(engine)
    columns = ("simhash", *schema.STORY_KEYS)
    with engine.connect() as conn:
        stored = [dict(zip(columns, row)) for row in conn.execute(
            sa.select(*(schema.listings.c[c] for c in columns)).order_by(schema.listings.c.id))]
    assert stored == [mark.columns() for mark in marks]
    migrate.downgrade(engine, "0014")
    with engine.connect() as conn:
        assert set(map(tuple, conn.execute(sa.text("SELECT * FROM story_keys")))) == old_keys
    engine.dispose()


def test_a_database_newer_than_the_code_is_refused(engine):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    with pytest.raises(SchemaMismatch, match="9999_from_the_future, which is newer than this code"):
        migrate.check_schema(engine)
    with pytest.raises(SchemaMismatch, match="newer than this code"):
        migrate.upgrade(engine)


def test_an_unmigrated_database_asks_for_an_upgrade(empty_db_url):
    engine = db.create_engine(empty_db_url)
    with pytest.raises(SchemaMismatch, match="has no pipeline schema.*run `pipeline db upgrade`"):
        migrate.check_schema(engine)
    engine.dispose()


def test_queue_tables_are_vacuumed_early_on_postgresql(pg_engine):
    with pg_engine.connect() as conn:
        options = dict(conn.execute(sa.text(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN"
            " ('sources', 'listings_raw', 'listings', 'notifications', 'users')"
        )).all())
    for table in ("sources", "listings_raw", "listings", "notifications"):
        assert "autovacuum_vacuum_scale_factor=0.01" in options[table], (table, options[table])
    assert options["users"] is None, "only the queue tables"


def test_the_suites_databases_are_all_dropped_at_the_end(pg_server_url):
    """A test that keeps its database to the end of the session (the chaos and deploy
    tests) must not leave it on the server."""
    from tests.databases import PostgresDatabases

    databases = PostgresDatabases(pg_server_url)
    databases.prefix += "_leak_check"
    kept = [databases.migrated(), databases.migrated()]
    databases.drop(kept[0])
    databases.close()
    admin = sa.create_engine(databases.server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        left = conn.execute(sa.text("SELECT datname FROM pg_database WHERE datname LIKE :p"),
                            {"p": f"{databases.prefix}%"}).scalars().all()
    admin.dispose()
    assert left == []


def test_a_mariadb_database_that_compares_text_without_case_is_refused_by_name(mariadb_databases):
    """A database of its own, created with the collation that must be refused."""
    from tests.test_cli import assert_one_line_error, run

    name = mariadb_databases.create()
    with mariadb_databases.admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
    result = run("db", "upgrade", env={"DATABASE_URL": mariadb_databases.url(name)})
    assert_one_line_error(result, f"database {name} compares text by utf8mb4_general_ci",
                          "COLLATE utf8mb4_bin")
    mariadb_databases.drop(name)


def test_the_mariadb_tables_compile_alike_with_dagster_loaded():
    """Dagster's storage, once imported, compiles a generic Float as FLOAT(32) and a
    generic DateTime as DATETIME(6) on MySQL-family databases, for every table in the
    process: the schema names its MariaDB types, so its DDL does not depend on it."""
    import dagster._core.storage.sql  # noqa: F401 -- registers those compilations
    from sqlalchemy.dialects import mysql
    from sqlalchemy.schema import CreateTable

    for table in schema.metadata.sorted_tables:
        ddl = str(CreateTable(table).compile(dialect=mysql.dialect()))
        assert "FLOAT(32)" not in ddl, ddl
    assert "retry_in_minutes DOUBLE" in str(CreateTable(schema.ingestion_events).compile(dialect=mysql.dialect()))


def upgrade_process(db_url: str) -> subprocess.Popen[str]:
    """`pipeline db upgrade` in its own interpreter, as a container starting runs it."""
    env = {**{k: v for k, v in os.environ.items() if k != "DATABASE_URL"}, "DATABASE_URL": db_url}
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "db", "upgrade"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_three_upgrades_at_once_on_an_empty_database_all_succeed(empty_db_url):
    """Processes: run containers starting together each run `pipeline db upgrade`; on
    PostgreSQL two of three once exited 1 (a column "already exists")."""
    processes = [upgrade_process(empty_db_url) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in processes]
    assert [code for code, _ in results] == [0, 0, 0], results
    engine = db.create_engine(empty_db_url)
    try:
        assert migrate.current_revision(engine) == migrate.head_revision()
        assert table_names(engine) == TABLES
    finally:
        engine.dispose()


def _waiting_for_the_lock(conn: sa.Connection) -> bool:
    """Does another session of this database wait for the migration lock?"""
    if conn.dialect.name == "postgresql":
        query = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                 " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
    else:
        query = ("SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()"
                 " AND INFO LIKE 'SELECT GET_LOCK%%'")
    found = conn.exec_driver_sql(query).scalar()
    conn.rollback()  # a fresh snapshot each look
    return bool(found)


@pytest.mark.conformance("postgresql", "mariadb")
def test_an_upgrade_waits_while_another_holds_the_migration_lock(empty_db_url):
    """A process, and a wait for the state where it waits on the lock (however long it
    takes to start): it has migrated nothing then, and migrates once the lock is free."""
    engine = db.create_engine(empty_db_url)
    try:
        with migrate.migration_lock(engine) as held, engine.connect() as look:
            assert held is not None
            process = upgrade_process(empty_db_url)
            wait_until("the upgrade waits for the lock", lambda: _waiting_for_the_lock(look), timeout=120, every=0.1)
            assert table_names(engine) == set()
        assert process.wait(timeout=300) == 0, process.stderr.read()
        assert migrate.current_revision(engine) == migrate.head_revision()
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_downgrade_on_sqlite_keeps_the_rows_of_the_tables_it_copies(backend, empty_db_url):
    """SQLite's batch mode copies a table and drops the old one; with foreign keys on,
    dropping ``sources`` deleted every listing by cascade (a downgrade below 0009 emptied
    ``listings``). Migrations run with foreign keys off, checked after, on again."""
    engine = db.create_engine(empty_db_url)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO sources (name, url, source_type) VALUES ('s', 'http://127.0.0.1/f', 'rss')"))
        conn.execute(sa.text("INSERT INTO listings (source_id, source_item_id, url, content_hash)"
                             " VALUES (1, 'a', 'http://127.0.0.1/a', 'h')"))
    engine.dispose()
    migrate.downgrade(engine, "0008")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM listings")).scalar() == 1
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1, "on again for the pipeline's work"
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM listings")).scalar() == 1
    engine.dispose()


def test_the_newest_migration_by_its_file_name_is_alembics_head():
    """A command checks the schema without Alembic, reading the newest revision from the
    migrations' file names (``NNNN_what.py``): it must be the head Alembic finds."""
    assert migrate.newest_revision() == migrate.head_revision()

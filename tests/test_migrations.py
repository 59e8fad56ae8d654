"""Migrations apply, revert and re-apply on both databases, and never drift from the code."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from pipeline.core.errors import SchemaMismatch
from pipeline.storage import db, migrate, schema

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


def test_migrations_match_the_table_definitions(engine):
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
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
        rows = conn.execute(
            sa.text(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL"
                " AND name NOT LIKE 'alembic%'"
            )
        )
        return {name: _normalise_sqlite_ddl(sql) for name, sql in rows}


def _normalise_sqlite_ddl(sql: str) -> str:
    """SQLite keeps DDL as written: ignore spacing, quoting and the order of table items."""
    text = re.sub(r'[\s"]+', " ", sql).strip()
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


def test_every_claim_queue_has_its_partial_indexes_in_the_migrations(engine):
    names = {ix["name"] for t in schema.CLAIMABLE_TABLES for ix in sa.inspect(engine).get_indexes(t.name)}
    for spec in schema.QUEUES:
        assert f"ix_{spec.table.name}_{spec.name}_free" in names
        assert f"ix_{spec.table.name}_{spec.name}_leased" in names


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
    from tests.conftest import PostgresDatabases

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

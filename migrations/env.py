"""Alembic environment: migrates the engine pipeline/storage/migrate.py hands over, or DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from pipeline.core.settings import Settings
from pipeline.storage import db, schema

config = context.config
target_metadata = schema.metadata


def run_migrations_online() -> None:
    held = config.attributes.get("connection")  # the one holding the migration lock
    if held is not None:
        _migrate(held)
        return
    engine = config.attributes.get("engine")
    if engine is None:  # run by the alembic command line
        engine = db.create_engine(Settings.from_env().database_url)
    with engine.connect() as connection:
        _migrate(connection)


def _migrate(connection: Connection) -> None:
    if connection.dialect.name == "sqlite":
        _without_foreign_keys(connection)
        return
    _run(connection)


def _without_foreign_keys(connection: Connection) -> None:
    """SQLite's batch mode copies a table and drops the old one; with foreign keys on,
    dropping ``sources`` or ``listings`` deletes every row that references them, by
    cascade (a downgrade below 0009 once emptied ``listings``). SQLite's own procedure
    for such changes: foreign keys off around them (a pragma that only works outside a
    transaction), then checked."""
    if connection.in_transaction():
        connection.commit()
    raw = connection.connection.driver_connection  # autocommit (pipeline/storage/db.py)
    raw.execute("PRAGMA foreign_keys = OFF")
    try:
        _run(connection)
        problems = raw.execute("PRAGMA foreign_key_check").fetchall()
        if problems:
            raise RuntimeError(f"the migration left rows whose references are gone: {problems[:5]}")
    finally:
        if connection.in_transaction():
            connection.commit()
        raw.execute("PRAGMA foreign_keys = ON")


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place: batch mode copies the table.
        render_as_batch=connection.dialect.name == "sqlite",
        # One transaction per revision, so a failed step leaves the previous one.
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; use `pipeline db upgrade`")
run_migrations_online()

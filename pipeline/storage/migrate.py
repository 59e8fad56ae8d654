"""The database's schema revision: upgrading and downgrading it with Alembic
(migrations/versions), and refusing to work on a database at another revision."""

from __future__ import annotations

import functools
import re
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import backend_for
from pipeline.core.errors import SchemaMismatch
from pipeline.storage import db

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic is imported where a migration runs or a revision is looked up: a command that
# finds the database at this code's revision (every command, nearly always) reads the
# version table and the migrations' file names, and loads no Alembic (80 ms of a start).

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
LOCK_NAME = "pipeline.migrate"
# How long a migrator waits for another to finish (a big table's index can take minutes).
LOCK_WAIT_SECONDS = 3600


def alembic_config(engine: Engine, connection: sa.Connection | None = None) -> Config:
    """Alembic's configuration: migrations/env.py migrates ``connection`` when given
    (the one holding the migration lock), else a connection of ``engine``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    cfg.attributes["connection"] = connection
    return cfg


def migration_lock(engine: Engine) -> AbstractContextManager[sa.Connection | None]:
    """Hold the database's migration lock: one migrator at a time, however many
    containers start together. Another waits, then finds the schema at the revision it
    wants and does nothing. The lock is the backend's (``session_lock``: an advisory
    lock on PostgreSQL, a named lock on MariaDB, both on the connection returned, which
    the migrations then run on, and released if the process dies; a lock file beside an
    SQLite database, None returned: the migrations take a connection of their own)."""
    return backend_for(engine).session_lock(engine, LOCK_NAME, LOCK_WAIT_SECONDS)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


@functools.cache
def newest_revision() -> str:
    """The newest migration's revision, by its file's name (``NNNN_what.py``, revision
    ``NNNN``: tests/test_migrations.py checks that it is Alembic's head)."""
    return max(p.name.split("_", 1)[0] for p in (MIGRATIONS_DIR / "versions").glob("[0-9][0-9][0-9][0-9]_*.py"))


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _stored_revision(engine: Engine) -> str | None:
    """The revision in Alembic's version table, read as Alembic stores it (one row);
    None when it has none. DatabaseUnavailable when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    except sa.exc.OperationalError:
        db.check_connection(engine)  # unreachable: said in one line
        return None  # no version table
    except sa.exc.ProgrammingError:
        return None  # no version table (PostgreSQL, MariaDB)


def upgrade(engine: Engine, revision: str = "head") -> None:
    db.check_connection(engine)
    _refuse_newer_schema(engine)
    _check_target(revision)
    from alembic import command

    with migration_lock(engine) as conn:
        command.upgrade(alembic_config(engine, conn), revision)


def downgrade(engine: Engine, revision: str) -> None:
    db.check_connection(engine)
    _check_target(revision)
    from alembic import command

    with migration_lock(engine) as conn:
        command.downgrade(alembic_config(engine, conn), revision)


def _check_target(revision: str) -> None:
    """SchemaMismatch, in one line, for a revision no migration has (alembic would
    print its traceback)."""
    relative = re.fullmatch(r"(head|base)?[+-]\d+", revision) is not None  # alembic's "-1"
    if revision not in ("head", "base") and not relative and not _known_revision(revision):
        raise SchemaMismatch(
            f"no schema revision {revision!r}: the revisions are 0001 to {head_revision()}"
            ", head, base, or a step such as -1"
        )


def _refuse_newer_schema(engine: Engine) -> None:
    current = current_revision(engine)
    if current is not None and not _known_revision(current):
        raise SchemaMismatch(
            f"the database at {db.display_url(engine.url)} has schema revision {current},"
            f" which is newer than this code knows (its newest is {head_revision()});"
            " upgrade the pipeline package before using this database"
        )


def _known_revision(revision: str) -> bool:
    """Whether a migration has exactly this id (alembic's own lookup asserts on some
    input, such as an empty one, and guesses at prefixes)."""
    from alembic.script import ScriptDirectory

    return revision in {script.revision for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()}


def check_schema(engine: Engine) -> None:
    """Stop unless the database is reachable and at exactly this code's schema revision."""
    if _stored_revision(engine) == newest_revision():
        return  # nearly always: one query, and no Alembic
    db.check_connection(engine)
    _refuse_newer_schema(engine)
    current, head = current_revision(engine), head_revision()
    if current != head:
        state = "has no pipeline schema" if current is None else f"is at revision {current}"
        raise SchemaMismatch(
            f"the database at {db.display_url(engine.url)} {state}, this code needs {head}:"
            " run `pipeline db upgrade`"
        )

"""The database's schema revision: upgrading and downgrading it with Alembic
(migrations/versions), and refusing to work on a database at another revision."""

from __future__ import annotations

import re
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Engine

from pipeline.core.errors import SchemaMismatch
from pipeline.storage import db

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "migrations/versions holds no revision"
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    db.check_connection(engine)
    _refuse_newer_schema(engine)
    _check_target(revision)
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    db.check_connection(engine)
    _check_target(revision)
    command.downgrade(alembic_config(engine), revision)


def _check_target(revision: str) -> None:
    """SchemaMismatch, in one line, for a revision no migration has (alembic would
    print its traceback)."""
    relative = re.fullmatch(r"(head|base)?[+-]\d+", revision) is not None  # alembic's "-1"
    if revision not in ("head", "base") and not relative and not _known_revision(revision):
        raise SchemaMismatch(
            f"no schema revision {revision!r}: the revisions are 0001 to {head_revision()},"
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
    try:
        return ScriptDirectory(str(MIGRATIONS_DIR)).get_revision(revision) is not None
    except CommandError:  # "Can't locate revision identified by ..."
        return False


def check_schema(engine: Engine) -> None:
    """Stop unless the database is reachable and at exactly this code's schema revision."""
    db.check_connection(engine)
    _refuse_newer_schema(engine)
    current, head = current_revision(engine), head_revision()
    if current != head:
        state = "has no pipeline schema" if current is None else f"is at revision {current}"
        raise SchemaMismatch(
            f"the database at {db.display_url(engine.url)} {state}, this code needs {head}:"
            " run `pipeline db upgrade`"
        )

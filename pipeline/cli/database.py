"""`pipeline db`: upgrade, downgrade and show the schema revision."""

from __future__ import annotations

import click

from pipeline.cli import common


@click.group("db", cls=common.HelpGroup)
def db_group() -> None:
    """Create and migrate the pipeline database."""


@db_group.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    from pipeline.storage import db, migrate

    engine = common.engine(check=False)
    migrate.upgrade(engine, revision)
    click.echo(f"{db.display_url(engine.url)} is at schema revision {migrate.current_revision(engine)}")


@db_group.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION ("base" removes every table)."""
    from pipeline.storage import db, migrate

    engine = common.engine(check=False)
    migrate.downgrade(engine, revision)
    click.echo(f"{db.display_url(engine.url)} is at schema revision {migrate.current_revision(engine)}")


@db_group.command("current")
def db_current() -> None:
    """Print the database's schema revision and the code's newest."""
    from pipeline.storage import db, migrate

    engine = common.engine(check=False)
    db.check_connection(engine)
    click.echo(f"database: {migrate.current_revision(engine) or 'none'}; code: {migrate.head_revision()}")

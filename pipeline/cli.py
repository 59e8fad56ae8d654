"""The `pipeline` command line; it calls the same core functions as the Dagster assets.

Errors the user can act on (a bad DATABASE_URL, an unreachable or outdated database) are
one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import json
import sys

import click
import sqlalchemy as sa

from pipeline import db
from pipeline.errors import PipelineError
from pipeline.settings import Settings
from pipeline.status import collect_status, status_as_json, status_as_text


def _engine(*, check: bool = True) -> sa.Engine:
    engine = db.create_engine(Settings.from_env().database_url)
    if check:
        db.check_schema(engine)
    return engine


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Fetch sources on their own cadence, normalise what they yield, notify users.

    The database is DATABASE_URL (default: a SQLite file in the project's .state/).
    """


@cli.group("db")
def db_group() -> None:
    """Create and migrate the pipeline database."""


@db_group.command("upgrade")
@click.argument("revision", default="head")
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    engine = _engine(check=False)
    db.upgrade(engine, revision)
    click.echo(f"{db.display_url(engine.url)} is at schema revision {db.current_revision(engine)}")


@db_group.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION ("base" removes every table)."""
    engine = _engine(check=False)
    db.downgrade(engine, revision)
    click.echo(f"{db.display_url(engine.url)} is at schema revision {db.current_revision(engine)}")


@db_group.command("current")
def db_current() -> None:
    """Print the database's schema revision and the code's newest."""
    engine = _engine(check=False)
    db.check_connection(engine)
    click.echo(f"database: {db.current_revision(engine) or 'none'}; code: {db.head_revision()}")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Rows per table, claims in flight and expired leases."""
    statuses = collect_status(_engine())
    if as_json:
        click.echo(json.dumps(status_as_json(statuses), indent=2))
    else:
        click.echo(status_as_text(statuses))


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="pipeline", standalone_mode=False)
    except PipelineError as exc:
        click.echo(f"pipeline: {exc}", err=True)
        return 1
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        click.echo(f"pipeline: database error: {reason}", err=True)
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

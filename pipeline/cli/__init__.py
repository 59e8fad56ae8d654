"""The `pipeline` command line; it calls the same core functions as the Dagster assets.

Errors the user can act on (a bad DATABASE_URL, an unreachable or outdated database) are
one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import sys
import unicodedata

import click

from pipeline.cli import common, database, demo, metrics, operator, sources, stages, users, web
from pipeline.core import errors, redact
from pipeline.core.errors import PipelineError

# Every module of the command line imports what a command needs in the command, so
# `pipeline --help` and a read command start at once (tests/test_cli.py holds it by what
# they import): SQLAlchemy, the fetcher and the parsers load only for a command that uses them.


@click.group(cls=common.HelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Fetch sources on their own cadence, normalise what they yield, notify users.

    The database is DATABASE_URL (default: a SQLite file in the project's .state/).
    """


for _command in (
    database.db_group, sources.sources_group, sources.politeness_group, stages.collect,
    stages.process, stages.notify, stages.run_once, stages.backfill_group, users.users_group,
    users.filters_group, users.notifications_group, web.feeds_group, web.serve, demo.demo_group,
    metrics.metrics_group, operator.operator_group,
):
    cli.add_command(_command)


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Sources due and failing, each queue's backlog and its age, claims in flight,
    expired leases, notifications by status, each stage's last run."""
    from pipeline.storage.status import collect_status, status_as_json, status_as_text

    current = collect_status(common.engine())
    if as_json:
        click.echo(common.as_json(status_as_json(current)))
    else:
        click.echo(status_as_text(current))


def _one_line(message: str) -> str:
    """``message`` with its control characters and line breaks escaped (``\\r``): an
    error quotes what the operator typed, and a carriage return or a newline in it must
    not break the one line an error is, nor overwrite it on a terminal."""
    return "".join(repr(c)[1:-1] if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c for c in message)


def _database_error(exc: Exception) -> bool:
    """Whether ``exc`` is the database driver's error, as SQLAlchemy wraps it: none can be
    when the command never loaded SQLAlchemy."""
    sqlalchemy = sys.modules.get("sqlalchemy")
    return sqlalchemy is not None and isinstance(exc, sqlalchemy.exc.DBAPIError)


def main(argv: list[str] | None = None) -> int:
    for n, arg in enumerate(sys.argv[1:] if argv is None else argv, 1):
        try:
            arg.encode()
        except UnicodeEncodeError:  # bytes the locale could not decode (surrogate escapes)
            click.echo(f"pipeline: argument {n} is not valid UTF-8 text", err=True)
            return 1
    try:
        cli.main(args=argv, prog_name="pipeline", standalone_mode=False)
    except PipelineError as exc:
        click.echo(f"pipeline: {_one_line(redact.userinfo(str(exc)))}", err=True)  # a URL's password never shows
        return 1
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except Exception as exc:  # last: click's own exceptions are Exceptions too
        if not _database_error(exc):
            raise
        # The server's own message, its first line only: later lines (PostgreSQL's
        # CONTEXT) can quote a bound value, and the statement's parameters never show.
        diag = getattr(getattr(exc, "orig", None), "diag", None)
        reason = redact.userinfo(getattr(diag, "message_primary", None) or "") or errors.reason(exc)
        click.echo(f"pipeline: database error: {_one_line(reason)}", err=True)
        return 1
    return 0


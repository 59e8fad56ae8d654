"""The `pipeline` command line; it calls the same core functions as the Dagster assets.

Errors the user can act on (a bad DATABASE_URL, an unreachable or outdated database) are
one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import sqlalchemy as sa

from pipeline import db, schema, sources
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


@cli.group("sources")
def sources_group() -> None:
    """Add, import, list and steer the sources."""


@sources_group.command("add")
@click.argument("url")
@click.option("--type", "source_type", type=click.Choice(schema.SOURCE_TYPES),
              help="Adapter; default: youtube for YouTube URLs, channel ids and @handles, else rss.")
@click.option("--name", help="Display name; default: the URL.")
@click.option("--interval", type=int, default=schema.DEFAULT_FETCH_INTERVAL_MINUTES,
              show_default=True, help="Minutes between fetches (1 to 10080).")
@click.option("--category", help="A category recorded with the source.")
def sources_add(
    url: str, source_type: str | None, name: str | None, interval: int, category: str | None
) -> None:
    """Add a source and print its id."""
    spec = sources.make_spec(
        url, source_type=source_type, name=name, interval=interval, category=category
    )
    with _engine().begin() as conn:
        click.echo(sources.add_source(conn, spec))


@sources_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
def sources_import(file: Path) -> None:
    """Add every source of an OPML, YAML or CSV FILE whose URL is new.

    All entries are checked first: one bad entry rejects the whole file.
    """
    specs = sources.read_source_file(file)
    with _engine().begin() as conn:
        result = sources.import_sources(conn, specs)
    click.echo(f"{result.added} added, {result.present} already present")


@sources_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sources_list(as_json: bool) -> None:
    """Every source with its schedule and health."""
    with _engine().connect() as conn:
        rows = sources.list_sources(conn)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        state = "enabled" if row["enabled"] else f"disabled ({row['disabled_reason']})"
        failing = (
            f", {row['consecutive_failures']} failures ({row['last_failure_reason']})"
            if row["consecutive_failures"]
            else ""
        )
        due = row["next_fetch_at"].isoformat() if row["next_fetch_at"] else "now"
        click.echo(
            f"{row['id']:>6}  {row['source_type']:<7} every {row['fetch_interval_minutes']} min,"
            f" next {due}, {state}{failing}  {row['url']}"
        )


@sources_group.command("enable")
@click.argument("source_id", type=int)
def sources_enable(source_id: int) -> None:
    """Enable a source, clear its failure streak and make it due now."""
    with _engine().begin() as conn:
        sources.enable_source(conn, source_id)


@sources_group.command("disable")
@click.argument("source_id", type=int)
@click.option("--reason", default="disabled by an operator", show_default=True)
def sources_disable(source_id: int, reason: str) -> None:
    """Stop fetching a source."""
    with _engine().begin() as conn:
        sources.disable_source(conn, source_id, reason)


@sources_group.command("refresh")
@click.argument("source_id", type=int)
def sources_refresh(source_id: int) -> None:
    """Make a source due now."""
    with _engine().begin() as conn:
        sources.refresh_source(conn, source_id)


@cli.command("collect")
@click.option("--max-sources", type=click.IntRange(min=1), help="Claim at most this many sources.")
@click.option("--concurrency", type=click.IntRange(min=1),
              help="Fetches at once in this process; default: PIPELINE_CONCURRENCY.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def collect(max_sources: int | None, concurrency: int | None, as_json: bool) -> None:
    """One collector pass: fetch due sources until none is due or the cap is hit."""
    import os
    import socket

    from pipeline.collector import Collector

    worker = f"cli:{socket.gethostname()}:{os.getpid()}"
    stats = Collector(_engine(), Settings.from_env(), worker).run(
        max_sources=max_sources, concurrency=concurrency
    )
    totals = stats.as_dict()
    if as_json:
        click.echo(json.dumps(totals))
    else:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(stats.failed.items())) or "none"
        click.echo(
            f"{totals['claimed']} sources claimed, {totals['fetched']} fetched"
            f" ({totals['not_modified']} unchanged), {totals['items_new']} new items;"
            f" failed: {failed}"
        )


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

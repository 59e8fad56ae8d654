"""The `pipeline` command line; it calls the same core functions as the Dagster assets.

Errors the user can act on (a bad DATABASE_URL, an unreachable or outdated database) are
one line on stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa

from pipeline import db, politeness, schema, sources
from pipeline.errors import PipelineError
from pipeline.inputs import MAX_ID
from pipeline.settings import Settings
from pipeline.status import collect_status, status_as_json, status_as_text

# Every id a command takes: a positive 64-bit integer, refused by click (in one line)
# before the database sees it.
ID = click.IntRange(1, MAX_ID)


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
@click.option("--config", "config", metavar="JSON",
              help='Adapter options as a JSON object, e.g. \'{"item": "li.job"}\' for an http '
                   'page or \'{"api_key": "..."}\' for youtube.')
@click.option("--group", "group", metavar="NAME",
              help="Politeness group (default: the URL's host, or its registrable domain with"
                   " PIPELINE_POLITENESS_GROUP_BY=domain; youtube for YouTube sources).")
@click.option("--check", is_flag=True,
              help="Fetch the source once first and say what it holds; nothing is stored if it"
                   " fails. A page that advertises one feed is replaced by that feed.")
def sources_add(
    url: str, source_type: str | None, name: str | None, interval: int, category: str | None,
    config: str | None, group: str | None, check: bool,
) -> None:
    """Add a source and print its id.

    URL is a feed, a page, or a YouTube channel URL, channel id (UC...), @handle or
    playlist URL.
    """
    settings = Settings.from_env()
    spec = sources.make_spec(
        url, source_type=source_type, name=name, interval=interval, category=category,
        config=config, politeness_group=group, group_by=settings.politeness_group_by,
    )
    if check:
        from pipeline import discovery
        from pipeline.http import Fetcher

        with Fetcher.from_settings(settings) as fetcher:
            checked = discovery.check(spec, fetcher, settings.politeness_group_by)
        spec = checked.spec
        if checked.found_from:
            click.echo(f"{checked.found_from} is a page; adding the feed it advertises: {spec.url}", err=True)
        click.echo(f"checked: {checked.items} items at {spec.url}", err=True)
    with _engine().begin() as conn:
        click.echo(sources.add_source(conn, spec))


@sources_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--check", is_flag=True,
              help="Fetch every entry once first (as `sources add --check`); one that fails"
                   " rejects the file. Entries are fetched one after another: for small files.")
def sources_import(file: Path, check: bool) -> None:
    """Add every source of an OPML, YAML or CSV FILE whose URL is new.

    All entries are checked first: one bad entry rejects the whole file.
    """
    settings = Settings.from_env()
    specs = sources.read_source_file(file, group_by=settings.politeness_group_by)
    if check:
        from pipeline import discovery
        from pipeline.http import Fetcher

        with Fetcher.from_settings(settings) as fetcher:
            checked = discovery.check_all(specs, fetcher, settings.politeness_group_by, str(file))
        for c in checked:
            if c.found_from:
                click.echo(f"{c.found_from} is a page; importing the feed it advertises: {c.spec.url}", err=True)
        specs = [c.spec for c in checked]
        click.echo(f"checked: {sum(c.items for c in checked)} items in {len(checked)} sources", err=True)
    with _engine().begin() as conn, _progress(len(specs), f"importing {len(specs):,} sources") as bar:
        result = sources.import_sources(conn, specs, progress=bar.update)
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
@click.argument("source_id", type=ID)
def sources_enable(source_id: int) -> None:
    """Enable a source, clear its failure streak and make it due now."""
    with _engine().begin() as conn:
        sources.enable_source(conn, source_id)


@sources_group.command("disable")
@click.argument("source_id", type=ID)
@click.option("--reason", default="disabled by an operator", show_default=True)
def sources_disable(source_id: int, reason: str) -> None:
    """Stop fetching a source."""
    with _engine().begin() as conn:
        sources.disable_source(conn, source_id, reason)


@sources_group.command("refresh")
@click.argument("source_id", type=ID)
def sources_refresh(source_id: int) -> None:
    """Make a source due now."""
    with _engine().begin() as conn:
        sources.refresh_source(conn, source_id)


@cli.group("politeness")
def politeness_group() -> None:
    """Per-group limits on fetches: how many at once, how far apart (across all workers)."""


@politeness_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def politeness_list(as_json: bool) -> None:
    """Every politeness group: its limits, sources, fetches in flight and deferral."""
    with _engine().connect() as conn:
        rows = politeness.list_groups(conn)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        limits = "defaults" if row["defaults"] and row["name"] != politeness.DEFAULT else "own limits"
        deferred = (
            f", deferred until {row['next_request_at']:%Y-%m-%d %H:%M:%S} ({row['deferred_reason']})"
            if row["deferred_reason"] else ""
        )
        click.echo(
            f"{row['name']:<32} {row['in_flight']}/{row['max_in_flight']} in flight,"
            f" {row['min_interval_ms'] / 1000:g} s apart ({limits}), {row['sources']} sources{deferred}"
        )


@politeness_group.command("set")
@click.argument("name")
@click.option("--max-in-flight", type=click.IntRange(1, 2**31 - 1), help="Fetches of the group at once, across all workers.")
@click.option("--interval", "interval", type=float, metavar="SECONDS",
              help="Least time between the starts of two fetches of the group.")
@click.option("--reset", is_flag=True, help="Return the group to the defaults (the limits of '*').")
def politeness_set(name: str, max_in_flight: int | None, interval: float | None, reset: bool) -> None:
    """Set the limits of group NAME ('*': the defaults of every group without its own)."""
    try:
        with _engine().begin() as conn:
            politeness.set_limits(conn, name, max_in_flight=max_in_flight,
                                  min_interval_seconds=interval, reset=reset)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _worker(stage: str) -> str:
    import os
    import socket

    return f"cli-{stage}:{socket.gethostname()}:{os.getpid()}"


def _collect(max_sources: int | None, concurrency: int | None) -> dict[str, Any]:
    from pipeline.collector import Collector

    stats = Collector(_engine(), Settings.from_env(), _worker("collect")).run(
        max_sources=max_sources, concurrency=concurrency
    )
    return stats.as_dict()


def _process(max_rows: int | None) -> dict[str, Any]:
    from pipeline.processor import Processor

    return Processor(_engine(), Settings.from_env(), _worker("process")).run(max_rows=max_rows).as_dict()


def _notify(max_rows: int | None) -> dict[str, Any]:
    from pipeline.notifier import Notifier

    stats = Notifier(_engine(), Settings.from_env(), _worker("notify")).run(
        max_listings=max_rows, max_notifications=max_rows
    )
    return stats.as_dict()


def _say_collect(totals: dict[str, Any]) -> str:
    failed = ", ".join(f"{k} {v}" for k, v in sorted(totals["failed_by_reason"].items())) or "none"
    return (
        f"{totals['claimed']} sources claimed, {totals['fetched']} fetched"
        f" ({totals['not_modified']} unchanged), {totals['items_new']} new items; failed: {failed}"
    )


def _say_process(totals: dict[str, Any]) -> str:
    return (
        f"{totals['claimed']} raw rows: {totals['inserted']} new listings, {totals['updated']} updated,"
        f" {totals['unchanged']} unchanged, {totals['failed']} failed (to retry),"
        f" {totals['gave_up']} given up"
    )


def _say_notify(totals: dict[str, Any]) -> str:
    return (
        f"{totals['listings_matched']} listings matched, {totals['notifications_created']} notifications"
        f" created; {totals['sent']} sent, {totals['retrying']} to retry, {totals['dead']} dead"
    )


def _report(totals: dict[str, Any], as_json: bool, say: Callable[[dict[str, Any]], str]) -> None:
    click.echo(json.dumps(totals) if as_json else say(totals))


@cli.command("collect")
@click.option("--max-sources", type=click.IntRange(min=1), help="Claim at most this many sources.")
@click.option("--concurrency", type=click.IntRange(min=1),
              help="Fetches at once in this process; default: PIPELINE_CONCURRENCY.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def collect(max_sources: int | None, concurrency: int | None, as_json: bool) -> None:
    """One collector pass: fetch due sources until none is due or the cap is hit."""
    _report(_collect(max_sources, concurrency), as_json, _say_collect)


@cli.command("process")
@click.option("--max-rows", type=click.IntRange(min=1), help="Claim at most this many raw rows.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def process(max_rows: int | None, as_json: bool) -> None:
    """One processor pass: raw rows become listings until none is left or the cap is hit."""
    _report(_process(max_rows), as_json, _say_process)


@cli.command("notify")
@click.option("--max", "max_rows", type=click.IntRange(min=1),
              help="Match at most this many listings and deliver at most this many notifications.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass's totals as JSON.")
def notify(max_rows: int | None, as_json: bool) -> None:
    """One notifier pass: match new listings against filters, deliver due notifications."""
    _report(_notify(max_rows), as_json, _say_notify)


@cli.command("run")
@click.option("--once", is_flag=True, required=True, help="One pass of each stage, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print each stage's totals as JSON.")
def run_once(once: bool, as_json: bool) -> None:
    """Collect, process and notify once, in this process (the Dagster UI runs them on
    their sensors instead)."""
    stages: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        ("collect", lambda: _collect(None, None), _say_collect),
        ("process", lambda: _process(None), _say_process),
        ("notify", lambda: _notify(None), _say_notify),
    ]
    for stage, run_stage, say in stages:
        totals = run_stage()
        click.echo(json.dumps({"stage": stage, **totals}) if as_json else f"{stage}: {say(totals)}")


_WHEN = click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"])


def _utc(value: datetime | None) -> datetime:
    return datetime.now(UTC) if value is None else value.replace(tzinfo=UTC)


def _window(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    start, end = _utc(since), _utc(until)
    if start >= end:
        raise click.BadParameter(f"--since {start:%Y-%m-%d %H:%M} is not before --until {end:%Y-%m-%d %H:%M}")
    return start, end


def _progress(length: int, label: str) -> Any:
    """A progress bar on stderr (drawn only on a terminal), so --json output stays clean."""
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


@cli.group("backfill")
def backfill_group() -> None:
    """Re-fetch, re-process or re-match on demand, as the Dagster backfill jobs do.

    Times are UTC. Nothing is ever notified twice: notifications are unique per user
    and listing.
    """


@backfill_group.command("reprocess")
@click.option("--since", type=_WHEN, required=True, help="Raw rows fetched at or after this time (UTC).")
@click.option("--until", type=_WHEN, help="...and before this time; default: now.")
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
def backfill_reprocess(since: datetime, until: datetime | None, as_json: bool) -> None:
    """Process again the raw rows fetched in a window (after a normaliser change)."""
    from pipeline.processor import Processor, reopen_window

    start, end = _window(since, until)
    engine = _engine()
    reopened = reopen_window(engine, start, end)  # then a pass, as the reprocess_window job does
    with _progress(reopened, f"reprocessing {reopened:,} raw rows") as bar:
        stats = Processor(engine, Settings.from_env(), _worker("backfill")).run(progress=bar.update)
    totals = {"reopened": reopened, **stats.as_dict()}
    _report(totals, as_json, lambda t: f"{t['reopened']} reopened; {_say_process(t)}")


@backfill_group.command("rematch")
@click.option("--since", type=_WHEN, required=True, help="Listings that arrived at or after this time (UTC).")
@click.option("--until", type=_WHEN, help="...and before this time; default: now.")
@click.option("--any-age", is_flag=True, help="Also apply filters created after those listings arrived.")
@click.option("--json", "as_json", is_flag=True, help="Print the totals as JSON.")
def backfill_rematch(since: datetime, until: datetime | None, any_age: bool, as_json: bool) -> None:
    """Match again the listings that arrived in a window; new matches become pending
    notifications (the next `pipeline notify` sends them)."""
    from pipeline.notifier import Notifier

    start, end = _window(since, until)
    notifier = Notifier(_engine(), Settings.from_env(), _worker("backfill"))
    total = notifier.count_window(start, end)
    with _progress(total, f"re-matching {total:,} listings") as bar:
        created = notifier.rematch(start, end, any_age=any_age, progress=bar.update)
    _report({"listings": total, "notifications_created": created}, as_json,
            lambda t: f"{t['listings']} listings matched again: {t['notifications_created']} new notifications")


@backfill_group.command("refetch")
@click.argument("source_ids", type=ID, nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the collector's totals as JSON.")
def backfill_refetch(source_ids: tuple[int, ...], as_json: bool) -> None:
    """Make the chosen sources due now and run a collector pass."""
    from pipeline.collector import refetch_sources

    due, stats = refetch_sources(_engine(), Settings.from_env(), source_ids, worker=_worker("backfill"))
    skipped = sorted(set(source_ids) - set(due))
    if skipped:
        click.echo(f"not re-fetched (no such source, or disabled): {skipped}", err=True)
    _report(stats.as_dict(), as_json, _say_collect)


@cli.group("users")
def users_group() -> None:
    """Add and list the users who receive notifications."""


@users_group.command("add")
@click.argument("name")
@click.option("--webhook", metavar="URL", help="Deliver by signed HTTP POST to this URL.")
@click.option("--secret-file", type=click.File("r"), metavar="FILE",
              help="Read the webhook's HMAC secret (16+ characters) from FILE, '-' for standard"
                   " input; or set PIPELINE_WEBHOOK_SECRET. Default: generated and printed once."
                   " Never on the command line: process listings and shell history would show it.")
@click.option("--apprise", "apprise_url", metavar="URL",
              help="Deliver through Apprise: mailto://..., slack://..., json://..., any Apprise URL.")
def users_add(name: str, webhook: str | None, secret_file: Any, apprise_url: str | None) -> None:
    """Add a user with one delivery channel and print the user's id."""
    import os

    from pipeline import users

    secret = secret_file.read().strip() if secret_file is not None else None
    secret = secret or os.environ.get("PIPELINE_WEBHOOK_SECRET", "").strip() or None
    with _engine().begin() as conn:
        user = users.add_user(conn, name, webhook=webhook, secret=secret, apprise_url=apprise_url)
    click.echo(user.id)
    if user.secret:
        click.echo(f"webhook secret (shown once; the receiver verifies X-Pipeline-Signature with it): {user.secret}",
                   err=True)


@users_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def users_list(as_json: bool) -> None:
    """Every user and channel (secrets never shown)."""
    from pipeline import users

    with _engine().connect() as conn:
        rows = users.list_users(conn)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        state = "" if row["enabled"] else "  (disabled)"
        click.echo(f"{row['id']:>6}  {row['name']:<20} {row['channel']:<8} {row['target']}{state}")


@cli.group("filters")
def filters_group() -> None:
    """Add, list, enable and disable users' filters."""


@filters_group.command("add")
@click.argument("user")
@click.option("--keywords", required=True, help='Words that must all appear, e.g. "python remote".')
@click.option("--source", "source_id", type=ID, help="Only listings of this source id.")
@click.option("--category", help="Only listings with this category.")
def filters_add(user: str, keywords: str, source_id: int | None, category: str | None) -> None:
    """Add a filter for USER (a name or id) and print its id. It applies to listings that
    arrive from now on."""
    from pipeline import users

    with _engine().begin() as conn:
        click.echo(users.add_filter(conn, user, keywords, source_id=source_id, category=category))


@filters_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def filters_list(as_json: bool) -> None:
    """Every filter with its user."""
    from pipeline import users

    with _engine().connect() as conn:
        rows = users.list_filters(conn)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    for row in rows:
        limits = "".join(
            [f" source {row['source_id']}" if row["source_id"] else "",
             f" category {row['category']!r}" if row["category"] else "",
             "" if row["enabled"] else " (disabled)"]
        )
        click.echo(f"{row['id']:>6}  {row['name']:<20} {' '.join(row['keywords'])}{limits}")


@filters_group.command("enable")
@click.argument("filter_id", type=ID)
def filters_enable(filter_id: int) -> None:
    """Enable a filter."""
    from pipeline import users

    with _engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, True)


@filters_group.command("disable")
@click.argument("filter_id", type=ID)
def filters_disable(filter_id: int) -> None:
    """Disable a filter."""
    from pipeline import users

    with _engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, False)


@cli.group("notifications")
def notifications_group() -> None:
    """Steer notifications."""


@notifications_group.command("requeue")
@click.option("--dead", is_flag=True, help="Every dead notification.")
@click.option("--id", "ids", type=ID, multiple=True, help="This notification (repeatable).")
def notifications_requeue(dead: bool, ids: tuple[int, ...]) -> None:
    """Make dead (or chosen) notifications pending again, attempts reset. Sent ones never."""
    from pipeline import users

    with _engine().begin() as conn:
        count = users.requeue_notifications(conn, ids=list(ids), dead=dead)
    click.echo(f"{count} notifications requeued")


@cli.group("demo")
def demo_group() -> None:
    """The offline demo that `python3 dev.py up` runs: a local site and its sources."""


@demo_group.command("serve")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1; default: PIPELINE_DEMO_PORT, else 8780.")
def demo_serve(port: int | None) -> None:
    """Serve the demo's feeds, page and webhook receiver on 127.0.0.1 until interrupted."""
    from pipeline import demo
    from pipeline.settings import demo_port, state_dir

    demo.serve(
        port or demo_port(), state_dir() / "demo" / "deliveries.jsonl",
        ready=lambda url: click.echo(f"demo site on {url} (deliveries listed at {url}/)"),
    )


@demo_group.command("seed")
@click.option("--site", default=None, metavar="URL",
              help="The demo site's root; default: http://127.0.0.1:PIPELINE_DEMO_PORT.")
def demo_seed(site: str | None) -> None:
    """Add the demo sources, user and filters where missing (safe on every start)."""
    from pipeline import demo
    from pipeline.settings import demo_port

    try:
        root = demo.parse_site(site or f"http://127.0.0.1:{demo_port()}")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--site") from None
    with _engine().begin() as conn:
        added = demo.seed(conn, root)
    click.echo(f"demo: {added['sources_added']} sources and {added['filters_added']} filters added")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Sources due and failing, each queue's backlog and its age, claims in flight,
    expired leases, notifications by status, each stage's last run."""
    current = collect_status(_engine())
    if as_json:
        click.echo(json.dumps(status_as_json(current), indent=2))
    else:
        click.echo(status_as_text(current))


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="pipeline", standalone_mode=False)
    except PipelineError as exc:
        click.echo(f"pipeline: {exc}", err=True)
        return 1
    except sa.exc.DBAPIError as exc:
        # The server's own message, its first line only: later lines (PostgreSQL's
        # CONTEXT) can quote a bound value, and the statement's parameters never show.
        diag = getattr(exc.orig, "diag", None)
        reason = getattr(diag, "message_primary", None) or str(exc.orig or exc).strip().splitlines()[0]
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

"""`pipeline sources` and `pipeline politeness`: the catalogue of sources and the limits per host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline.cli import common
from pipeline.core import cadence, redact
from pipeline.core.errors import SourceError
from pipeline.core.kinds import EXPORT_FORMATS, PushHealth, SourceType, WebSubState
from pipeline.core.settings import Settings

if TYPE_CHECKING:
    from pipeline.catalogue import sources
    from pipeline.core import politeness
    from pipeline.storage import politeness_groups, schema
else:  # loaded by the commands that use them
    sources = common.lazy("pipeline.catalogue.sources")
    politeness = common.lazy("pipeline.core.politeness")
    politeness_groups = common.lazy("pipeline.storage.politeness_groups")
    schema = common.lazy("pipeline.storage.schema")

PRIORITY_HELP = (f"Among due sources, higher is fetched first ({cadence.MIN_PRIORITY} to "
                 f"{cadence.MAX_PRIORITY}).")
ADAPTIVE_HELP = ("Adaptive: the interval is learned from how often the source publishes, within its"
                 " bounds (docs/runbook.md, Adaptive cadence); fixed: every --interval minutes.")
BOUND_HELP = "{} interval an adaptive cadence may take, in minutes; default: {}."
MIN_HELP = BOUND_HELP.format("Shortest", "PIPELINE_ADAPTIVE_MIN_MINUTES (15)")
MAX_HELP = BOUND_HELP.format("Longest", "PIPELINE_ADAPTIVE_MAX_MINUTES (1440)")
OWNER_HELP = ("The owner (a user) is told through their channel once when the source starts failing"
              " (PIPELINE_OWNER_ALERT_FAILURES failed fetches in a row, a block or a disable) and once"
              " when it recovers.")


@click.group("sources", cls=common.HelpGroup)
def sources_group() -> None:
    """Add, import, export, list, steer and remove the sources."""


@sources_group.command("add")
@click.argument("url")
@click.option("--type", "source_type", type=click.Choice([kind.value for kind in SourceType]),
              help="Adapter; default: youtube for YouTube URLs, channel ids and @handles, else rss.")
@click.option("--name", help="Display name; default: the URL.")
@click.option("--interval", type=int, default=cadence.DEFAULT_INTERVAL_MINUTES,
              show_default=True, help="Minutes between fetches (1 to 10080).")
@click.option("--category", help="A category recorded with the source.")
@click.option("--config", "config", metavar="JSON",
              help='Adapter options as a JSON object, e.g. \'{"item": "li.job"}\' for an http '
                   'page or \'{"api_key": "..."}\' for youtube.')
@click.option("--group", "group", metavar="NAME",
              help="Politeness group (default: the URL's host, or its registrable domain with"
                   " PIPELINE_POLITENESS_GROUP_BY=domain; youtube for YouTube sources).")
@click.option("--priority", type=int, default=0, show_default=True,
              help=PRIORITY_HELP)
@click.option("--adaptive/--fixed", "adaptive", default=None,
              help=ADAPTIVE_HELP + " Default: PIPELINE_ADAPTIVE_CADENCE (off: fixed).")
@click.option("--min-interval", type=int, metavar="MIN", help=MIN_HELP)
@click.option("--max-interval", type=int, metavar="MIN", help=MAX_HELP)
@click.option("--check", is_flag=True,
              help="Fetch the source once first and say what it holds; nothing is stored if it"
                   " fails. A page that advertises one feed is replaced by that feed.")
@click.option("--owner", metavar="USER", help=OWNER_HELP)
def sources_add(
    url: str, source_type: str | None, name: str | None, interval: int, category: str | None,
    config: str | None, group: str | None, priority: int, adaptive: bool | None,
    min_interval: int | None, max_interval: int | None, check: bool, owner: str | None,
) -> None:
    """Add a source and print its id.

    URL is a feed, a page, or a YouTube channel URL, channel id (UC...), @handle or
    playlist URL.
    """
    settings = Settings.from_env()
    spec = sources.make_spec(
        url, source_type=source_type, name=name, interval=interval, category=category,
        config=config, politeness_group=group, group_by=settings.politeness_group_by, priority=priority,
        adaptive=adaptive, min_interval=min_interval, max_interval=max_interval,
        adaptive_default=settings.adaptive_cadence,
    )
    if check:
        from pipeline.catalogue import discovery
        from pipeline.net.http import Fetcher

        with Fetcher.from_settings(settings) as fetcher:
            checked = discovery.check(spec, fetcher, settings.politeness_group_by)
        spec = checked.spec
        if checked.found_from:
            click.echo(f"{redact.userinfo(checked.found_from)} is a page; adding the feed it advertises:"
                       f" {redact.userinfo(spec.url)}", err=True)
        click.echo(f"checked: {checked.items} items at {redact.userinfo(spec.url)}", err=True)
    with common.engine().begin() as conn:
        source_id = sources.add_source(conn, spec)
        if owner is not None:
            sources.set_owner(conn, source_id, owner)
        click.echo(source_id)


@sources_group.command("owner", help="Make USER (a name or id) the source's owner, or say who owns it. " + OWNER_HELP)
@click.argument("source_id", type=common.ID)
@click.argument("user", required=False)
@click.option("--none", "nobody", is_flag=True, help="The source has no owner from now on.")
def sources_owner(source_id: int, user: str | None, nobody: bool) -> None:
    if user is not None and nobody:
        raise click.UsageError("give a USER or --none, not both")
    with common.engine().begin() as conn:
        if user is None and not nobody:
            found = sources.owner_of(conn, source_id)
            click.echo(_owner_line(found))
            return
        sources.set_owner(conn, source_id, user)


def _owner_line(owner: dict[str, Any] | None) -> str:
    if owner is None:
        return "no owner"
    told = f", told it fails at {common.moment(owner['alerted_at'])}" if owner["alerted_at"] else ""
    return f"owner {owner['name']} (user {owner['id']}){told}"


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
    specs = sources.read_source_file(file, group_by=settings.politeness_group_by,
                                     adaptive_default=settings.adaptive_cadence)
    if check:
        from pipeline.catalogue import discovery
        from pipeline.net.http import Fetcher

        with Fetcher.from_settings(settings) as fetcher:
            checked = discovery.check_all(specs, fetcher, settings.politeness_group_by, str(file))
        for c in checked:
            if c.found_from:
                click.echo(f"{redact.userinfo(c.found_from)} is a page; importing the feed it advertises:"
                           f" {redact.userinfo(c.spec.url)}", err=True)
        specs = [c.spec for c in checked]
        click.echo(f"checked: {sum(c.items for c in checked)} items in {len(checked)} sources", err=True)
    with common.engine().begin() as conn:
        sources.owner_ids(conn, specs)  # an unknown owner refused before the progress bar starts: one line
        with common.progress(len(specs), f"importing {len(specs):,} sources") as bar:
            result = sources.import_sources(conn, specs, progress=bar.update)
    click.echo(f"{result.added} added, {result.present} already present")


@sources_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sources_list(as_json: bool) -> None:
    """Every source with its schedule and health."""
    with common.engine().connect() as conn:
        rows = sources.list_sources(conn)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        failing = (
            f", {common.counted(row['consecutive_failures'], 'failure')} ({row['last_failure_reason']})"
            if row["consecutive_failures"]
            else ""
        )
        due = common.moment(row["next_fetch_at"]) if row["next_fetch_at"] else "now"
        # A disabled source is fetched at no time: it says why instead of when.
        state = f"next {due}" if row["enabled"] else f"disabled ({row['disabled_reason']})"
        priority = f", priority {row['priority']}" if row["priority"] else ""
        adaptive = ""
        if row["adaptive_cadence"]:
            low, high = row["min_interval_minutes"] or "default", row["max_interval_minutes"] or "default"
            adaptive = f" (adaptive, {low} to {high})"
        name = "" if row["name"] == row["url"] else f"{row['name']}: "
        click.echo(
            f"{row['id']:>6}  {row['source_type']:<7} every {row['fetch_interval_minutes']} min{adaptive},"
            f" {state}{priority}{failing}  {name}{row['url']}"
        )


@sources_group.command("show")
@click.argument("source_id", type=common.ID)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def sources_show(source_id: int, as_json: bool) -> None:
    """One source: its schedule and health, its latest listings and its latest fetches."""
    with common.engine().connect() as conn:
        source = sources.show_source(conn, source_id)
    if as_json:
        click.echo(common.as_json(source))
        return

    def at(value: object) -> str:
        return common.moment(value) if value else "never"  # type: ignore[arg-type]

    state = f"next {at(source['next_fetch_at']) if source['next_fetch_at'] else 'now'}" if source["enabled"] \
        else f"disabled ({source['disabled_reason']})"
    click.echo(f"source {source['id']}: {source['name']} ({source['source_type']}) {source['url']}")
    click.echo(f"  site {source['site_url'] or '-'}, politeness group {source['politeness_group']},"
               f" every {source['fetch_interval_minutes']} min, {state}")
    failing = (f", {common.counted(source['consecutive_failures'], 'failure')} in a row"
               f" ({source['last_failure_reason']})" if source["consecutive_failures"] else "")
    click.echo(f"  last fetch {at(source['last_fetched_at'])}, last success {at(source['last_success_at'])}{failing}")
    click.echo(f"  {_owner_line(source['owner'])}")
    if pushed := source["websub"]:  # pipeline/fetching/websub.py
        state = {WebSubState.ACTIVE: f"pushed by {pushed['hub']} until {at(pushed['lease_until'])}",
                 WebSubState.REQUESTED: f"asked {pushed['hub']} to push; not verified yet",
                 WebSubState.DENIED: f"{pushed['hub']} denied the subscription",
                 WebSubState.UNSUBSCRIBING: f"asking {pushed['hub']} to stop pushing"}[pushed["state"]]
        if pushed["due_at"] is not None and pushed["state"] != WebSubState.UNSUBSCRIBING:
            state += f"; {'renewed' if pushed['state'] == WebSubState.ACTIVE else 'asked again'} {at(pushed['due_at'])}"
        last = f", the last {at(pushed['last_push_at'])}" if pushed["last_push_at"] else ""
        error = f"; {pushed['last_error']}" if pushed["last_error"] else ""
        click.echo(f"  WebSub: {state} (pushes: {pushed['pushes']:,}{last}){error}")
        missed = (f"; {common.counted(pushed['missed'], 'item')} found by polls that no push brought, the last"
                  f" {at(pushed['missed_at'])}" if pushed["missed"] else "")
        lapsed = (": polled at its own cadence, the hub asked again, until a push comes"
                  if pushed["health"] == PushHealth.MISSED else "")
        click.echo(f"  push health: {pushed['health']}{lapsed}{missed}")
    click.echo(f"  {common.counted(source['listings'], 'listing')}" + (", the latest:" if source["listings"] else ""))
    for listing in source["recent_listings"]:
        click.echo(f"    {at(listing['ingested_at'])}  {listing['title']}  {listing['url'] or '(no link)'}")
    click.echo("  latest fetches:" if source["recent_fetches"] else "  no fetch recorded")
    for fetch in source["recent_fetches"]:
        outcome = ("ok" if fetch["success"] else fetch["failure_reason"] or "failed") + (
            f" {fetch['http_status']}" if fetch["http_status"] else "")
        items = f", {fetch['items_seen']} items seen, {fetch['items_new']} new" if fetch["success"] else ""
        error = f": {fetch['error']}" if fetch["error"] else ""
        click.echo(f"    {at(fetch['occurred_at'])}  {outcome}{items}, {fetch['duration_ms']} ms{error}")


@sources_group.command("set")
@click.argument("source_id", type=common.ID)
@click.option("--name", help="Display name ('': the URL).")
@click.option("--url", help="Another URL for the source, which keeps its id, items, history, owner and push"
                            " state (refused when another source has it).")
@click.option("--category", help="A category recorded with the source ('': none).")
@click.option("--config", "config", metavar="JSON", help="Adapter options as a JSON object (replace the old ones).")
@click.option("--group", "group", metavar="NAME", help="Politeness group.")
@click.option("--check", is_flag=True, help="With --url: fetch the new URL once first; nothing changes if it fails.")
@click.option("--priority", type=int, help=PRIORITY_HELP)
@click.option("--interval", type=int, help="Minutes between fetches (1 to 10080), from the next fetch on.")
@click.option("--adaptive/--fixed", "adaptive", default=None, help=ADAPTIVE_HELP)
@click.option("--min-interval", type=int, metavar="MIN", help=MIN_HELP)
@click.option("--max-interval", type=int, metavar="MIN", help=MAX_HELP)
def sources_set(
    source_id: int, name: str | None, url: str | None, category: str | None, config: str | None,
    group: str | None, check: bool, priority: int | None, interval: int | None, adaptive: bool | None,
    min_interval: int | None, max_interval: int | None,
) -> None:
    """Change (edit) a source: its name, URL, category, options, politeness group,
    priority, fetch interval or cadence. It keeps its id and everything it brought."""
    settings = Settings.from_env()
    if check:
        if url is None:
            raise click.UsageError("--check checks a new --url")
        from pipeline.catalogue import discovery
        from pipeline.net.http import Fetcher

        with Fetcher.from_settings(settings) as fetcher:
            checked = discovery.check(sources.make_spec(url, group_by=settings.politeness_group_by), fetcher,
                                      settings.politeness_group_by)
        url = checked.spec.url
        click.echo(f"checked: {checked.items} items at {redact.userinfo(url)}", err=True)
    with common.engine().begin() as conn:
        sources.set_source(conn, source_id, priority=priority, interval=interval, adaptive=adaptive,
                           min_interval=min_interval, max_interval=max_interval, name=name, url=url,
                           category=category, config=config, group=group, group_by=settings.politeness_group_by)
    changed = [f"{what} {value}" for what, value in (
        ("name", name if name is None else repr(name)), ("URL", url and redact.userinfo(url)),
        ("category", category if category is None else repr(category)), ("options", config), ("group", group),
        ("priority", priority), ("interval", interval and f"{interval} min"),
        ("cadence", None if adaptive is None else "adaptive" if adaptive else "fixed"),
        ("min interval", min_interval and f"{min_interval} min"), ("max interval", max_interval and f"{max_interval} min"),
    ) if value is not None]
    click.echo(f"source {source_id}: " + (", ".join(changed) if changed else "nothing to change"))


@sources_group.command("enable")
@click.argument("source_id", type=common.ID)
def sources_enable(source_id: int) -> None:
    """Enable a source, clear its failure streak and make it due now."""
    with common.engine().begin() as conn:
        sources.enable_source(conn, source_id)
    click.echo(f"source {source_id} enabled, due now")


@sources_group.command("disable")
@click.argument("source_id", type=common.ID)
@click.option("--reason", default="disabled by an operator", show_default=True)
def sources_disable(source_id: int, reason: str) -> None:
    """Stop fetching a source."""
    with common.engine().begin() as conn:
        sources.disable_source(conn, source_id, reason)
    click.echo(f"source {source_id} disabled: {reason}")


@sources_group.command("refresh")
@click.argument("source_ids", type=common.ID, nargs=-1, required=True)
def sources_refresh(source_ids: tuple[int, ...]) -> None:
    """Make sources due now (all or none: an unknown id changes nothing)."""
    from pipeline.catalogue.known import require_ids

    with common.engine().begin() as conn:
        require_ids(conn, schema.sources, source_ids, "source", SourceError)
        for source_id in dict.fromkeys(source_ids):
            sources.refresh_source(conn, source_id)
    click.echo(common.counted(len(set(source_ids)), "source") + " due now")


@sources_group.command("remove")
@click.argument("source_ids", type=common.ID, nargs=-1, required=True)
def sources_remove(source_ids: tuple[int, ...]) -> None:
    """Delete sources with their listings, those listings' notifications, their fetch
    history and the filters scoped to them (all or none: an unknown id deletes nothing).
    To stop fetching and keep the history, use `sources disable`."""
    with common.engine().begin() as conn:
        removed = sources.remove_sources(conn, source_ids)
    click.echo(common.counted(removed["sources"], "source") + " removed with "
               + ", ".join(common.counted(removed[noun + "s"], noun) for noun in ("listing", "notification", "filter")))


@sources_group.command("export")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False), required=False)
@click.option("--format", "form", type=click.Choice(EXPORT_FORMATS),
              help="The file's format; default: FILE's suffix (.opml, .yaml, .csv), or YAML on standard output.")
@click.option("--with-secrets", is_flag=True,
              help="Keep passwords in URLs and secret options (api_key, token, ...); left out by default.")
def sources_export(file: Path | None, form: str | None, with_secrets: bool) -> None:
    """Write every source to FILE (or standard output) as `sources import` reads it:
    URL, type, name, interval, category, politeness group, priority, cadence, options."""
    if form is None:
        suffix = file.suffix.lower().lstrip(".") if file is not None else "yaml"
        form = {"xml": "opml", "yml": "yaml"}.get(suffix, suffix)
        if form not in EXPORT_FORMATS:
            raise SourceError(f"cannot tell the format of {file}: give --format or end the file's name"
                              " in .opml, .yaml or .csv")
    with common.engine().connect() as conn:
        export = sources.export_sources(conn, secrets=with_secrets)
    text = sources.write_sources(export.entries, form)
    if file is None:
        click.echo(text, nl=False)
    else:
        file.write_text(text, encoding="utf-8")
        click.echo(f"{common.counted(len(export.entries), 'source')} written to {file}", err=True)
    if export.without_secrets:
        click.echo(f"{common.counted(export.without_secrets, 'source')} written without a URL password or"
                   " secret options: --with-secrets keeps them", err=True)


@click.group("politeness", cls=common.HelpGroup)
def politeness_group() -> None:
    """Per-group limits on fetches: how many at once, how far apart (across all workers)."""


@politeness_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def politeness_list(as_json: bool) -> None:
    """Every politeness group: its limits, sources, fetches in flight, the fetches a minute
    its sources ask for (and whether its spacing allows them) and deferral."""
    with common.engine().connect() as conn:
        rows = politeness_groups.list_groups(conn)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        limits = "defaults" if row["defaults"] and row["name"] != politeness.DEFAULT else "own limits"
        deferred = (
            f", deferred until {row['next_request_at']:%Y-%m-%d %H:%M:%S} ({row['deferred_reason']})"
            if row["deferred_reason"] else ""
        )
        asked = f", fetches asked a minute: {row['asks_per_minute']:.3g}"
        if row["over_capacity"]:
            asked += f" (its spacing allows {row['allows_per_minute']:.3g}: its sources start late)"
        click.echo(
            f"{row['name']:<32} {row['in_flight']}/{row['max_in_flight']} in flight,"
            f" {row['min_interval_ms'] / 1000:g} s apart ({limits}), {common.counted(row['sources'], 'source')}"
            f"{asked}{deferred}"
        )


@politeness_group.command("set")
@click.argument("name")
@click.option("--max-in-flight", type=click.IntRange(1, 2**31 - 1), help="Fetches of the group at once, across all workers.")
@click.option("--interval", "interval", type=float, metavar="SECONDS",
              help="Least time between the starts of two fetches of the group.")
@click.option("--reset", is_flag=True, help="Return the group to the defaults (the limits of '*').")
@click.option("--create", is_flag=True,
              help="Create the group if no source names it yet (else a new name is refused).")
def politeness_set(
    name: str, max_in_flight: int | None, interval: float | None, reset: bool, create: bool,
) -> None:
    """Set the limits of group NAME ('*': the defaults of every group without its own)."""
    try:
        with common.engine().begin() as conn:
            politeness_groups.set_limits(conn, name, max_in_flight=max_in_flight,
                                  min_interval_seconds=interval, reset=reset, create=create)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if reset:
        click.echo(f"politeness group {name}: back to the defaults")
    else:
        limits = [f"{what} {value}" for what, value in (("at most", max_in_flight and f"{max_in_flight} in flight"),
                                                         ("every", interval is not None and f"{interval:g} s"))
                  if value]
        click.echo(f"politeness group {name}: " + (", ".join(limits) or "as it was"))


sources_group.add_command(sources_set, "edit")  # the same command: `sources edit ID --name ...`

"""`pipeline users`, `filters` and `notifications`: who is notified of what, listing and
requeueing notifications."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from pipeline.cli import common
from pipeline.core.inputs import utc
from pipeline.core.kinds import NotificationStatus


@click.group("users", cls=common.HelpGroup)
def users_group() -> None:
    """Add, list, change and remove the users who receive notifications."""


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

    from pipeline.catalogue import users
    from pipeline.core.settings import Settings
    from pipeline.net.http import AddressGuard

    secret = secret_file.read().strip() if secret_file is not None else None
    secret = secret or os.environ.get("PIPELINE_WEBHOOK_SECRET", "").strip() or None
    guard = AddressGuard(Settings.from_env().allow_networks)  # the one every send is held to
    with common.engine().begin() as conn:
        user = users.add_user(conn, name, webhook=webhook, secret=secret, apprise_url=apprise_url, guard=guard)
    click.echo(user.id)
    if user.secret:
        click.echo(f"webhook secret (shown once; the receiver verifies webhook-signature with it): {user.secret}",
                   err=True)


@users_group.command("set")
@click.argument("user")
@click.option("--digest", metavar="WHEN",
              help="immediate (one message per match), 30m or 2h (a digest every so often, from"
                   " midnight), daily or daily@08:00 (once a day).")
@click.option("--quiet", metavar="START-END",
              help="Quiet hours, e.g. 22:00-07:00 (may span midnight), or off: what matches then"
                   " waits and goes out as one digest when they end.")
@click.option("--tz", "timezone", metavar="ZONE", help="The user's time zone (IANA, e.g. Europe/Berlin; default UTC).")
@click.option("--secret-file", type=click.File("r"), metavar="FILE",
              help="Rotate the webhook's secret to the one in FILE ('-': standard input); the old"
                   " one keeps signing beside it for --overlap-hours.")
@click.option("--overlap-hours", type=click.FloatRange(0, 720), default=24.0, show_default=True,
              help="How long the old secret signs beside the new one after --secret-file.")
def users_set(user: str, digest: str | None, quiet: str | None, timezone: str | None, secret_file: Any,
              overlap_hours: float) -> None:
    """Change when USER (a name or id) is notified, or rotate the webhook's secret.
    Notifications already waiting are re-timed by the new settings."""
    from datetime import timedelta

    from pipeline.catalogue import users

    if digest is None and quiet is None and timezone is None and secret_file is None:
        raise click.UsageError("give --digest, --quiet, --tz or --secret-file")
    with common.engine().begin() as conn:
        if secret_file is not None:
            users.rotate_secret(conn, user, secret_file.read().strip(), timedelta(hours=overlap_hours))
            click.echo(f"new secret in use; the old one signs beside it for {overlap_hours:g} h", err=True)
        if digest is not None or quiet is not None or timezone is not None:
            users.set_delivery(conn, user, digest=digest, quiet=quiet, timezone=timezone)
        [row] = users.list_users(conn, user)
    click.echo(row["delivery"])


@users_group.command("channel")
@click.argument("user")
@click.option("--webhook", metavar="URL", help="Deliver by signed HTTP POST to this URL.")
@click.option("--secret-file", type=click.File("r"), metavar="FILE",
              help="The webhook's secret, from FILE ('-': standard input). Default: the secret in use"
                   " when the user had a webhook already, else one generated and printed once.")
@click.option("--apprise", "apprise_url", metavar="URL", help="Deliver through Apprise (any Apprise URL).")
def users_channel(user: str, webhook: str | None, secret_file: Any, apprise_url: str | None) -> None:
    """Give USER (a name or id) another channel; what is not sent yet goes to it."""
    from pipeline.catalogue import users
    from pipeline.core.settings import Settings
    from pipeline.net.http import AddressGuard

    secret = (secret_file.read().strip() or None) if secret_file is not None else None
    guard = AddressGuard(Settings.from_env().allow_networks)
    with common.engine().begin() as conn:
        generated = users.set_channel(conn, user, webhook=webhook, secret=secret, apprise_url=apprise_url,
                                      guard=guard)
        [row] = users.list_users(conn, user)
    click.echo(f"{row['channel']} {row['target']}")
    if generated:
        click.echo(f"webhook secret (shown once; the receiver verifies webhook-signature with it): {generated}",
                   err=True)


@users_group.command("test")
@click.argument("user")
def users_test(user: str) -> None:
    """Send USER (a name or id) a test message through their channel now and say how it
    went (exit 1 with the channel's error when it failed). Nothing is stored."""
    from pipeline.catalogue import notifications
    from pipeline.core.errors import DeliveryError
    from pipeline.core.redact import channel_url
    from pipeline.core.settings import Settings

    settings = Settings.from_env()
    try:
        message = notifications.send_test(common.engine(), settings, user)
    except DeliveryError as exc:
        raise DeliveryError(f"the test message to {user} was not delivered: {exc}", code=exc.code) from None
    click.echo(f"sent to {message.channel} {channel_url(message.channel_url)} ({message.idempotency_key})")


@users_group.command("remove")
@click.argument("user")
def users_remove(user: str) -> None:
    """Delete USER (a name or id) with their filters and notifications, sent or not.
    To stop notifying and keep them, use `users disable`."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        removed = users.remove_user(conn, user)
    click.echo(f"user {user} removed with " + ", ".join(
        common.counted(removed[noun + "s"], noun) for noun in ("filter", "notification")))


@users_group.command("enable")
@click.argument("user")
def users_enable(user: str) -> None:
    """Enable a user (by name or id): their filters match again."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_user_enabled(conn, user, True)
    click.echo(f"user {user} enabled")


@users_group.command("disable")
@click.argument("user")
def users_disable(user: str) -> None:
    """Disable a user (by name or id): nothing is matched for them, nothing sent."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_user_enabled(conn, user, False)
    click.echo(f"user {user} disabled")


@users_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def users_list(as_json: bool) -> None:
    """Every user and channel (secrets never shown)."""
    from pipeline.catalogue import users

    with common.engine().connect() as conn:
        rows = users.list_users(conn)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        state = "" if row["enabled"] else "  (disabled)"
        if row["gone_since"] is not None:
            state += (f"  (channel gone since {row['gone_since']:%Y-%m-%d %H:%M} UTC: its notifications are held;"
                      " `pipeline users channel` once it is back)")
        click.echo(f"{row['id']:>6}  {row['name']:<20} {row['channel']:<8} {row['target']}  ({row['delivery']}){state}")


@click.group("filters", cls=common.HelpGroup)
def filters_group() -> None:
    """Add, list, enable, disable and remove users' filters."""


@filters_group.command("add")
@click.argument("user")
@click.option(
    "--keywords", "--query", "query", required=True, metavar="FILTER",
    help='The filter: words that must all appear ("python remote"), "exact phrases", -excluded,'
         ' OR and ( ), fields title: summary: author: category: source: and published:7d or'
         ' published:2026-01-01..2026-01-31. See the README, "Filters".')
@click.option("--source", "source_id", type=common.ID, help="Only listings of this source id.")
@click.option("--category", help="Only listings with this category.")
@click.option("--changes", is_flag=True,
              help="Also tell USER when a listing this filter notified them of changes (title or summary)"
                   " or goes from its source, once per change.")
@click.option("--price-drop", type=float, metavar="PERCENT",
              help="Tell a change only when the price dropped at least PERCENT from the price last"
                   " told (implies --changes; with --price-below, either).")
@click.option("--price-below", type=float, metavar="AMOUNT",
              help="Tell a change only when the price is below AMOUNT and below the price last told"
                   " (implies --changes).")
@click.option("--backfill", "backfill_days", type=click.IntRange(1, 3650), metavar="DAYS",
              help="Also notify USER, once, of what it matches among the listings of the last DAYS days"
                   " (at once, or in their digest); try it first with `filters test`.")
def filters_add(user: str, query: str, source_id: int | None, category: str | None, changes: bool,
                price_drop: float | None, price_below: float | None, backfill_days: int | None) -> None:
    """Add a filter for USER (a name or id) and print its id. It applies to listings that
    arrive from now on (and with --backfill to those of the last days)."""
    from pipeline.catalogue import users, workbench
    from pipeline.core.settings import Settings

    engine = common.engine()
    with engine.begin() as conn:
        filter_id = users.add_filter(conn, user, query, source_id=source_id, category=category, changes=changes,
                                     price_drop=price_drop, price_below=price_below)
    click.echo(filter_id)
    if backfill_days is not None:
        made = workbench.backfill_filter(engine, Settings.from_env(), filter_id, query, days=backfill_days,
                                         worker=common.worker("backfill"))
        click.echo(f"{common.counted(made, 'notification')} of the last {backfill_days} days' listings"
                   " made (the next `pipeline notify` sends them)", err=True)


@filters_group.command("test")
@click.argument("user")
@click.argument("query", metavar="FILTER")
@click.option("--days", type=click.IntRange(1, 3650), default=30, show_default=True,
              help="Listings that arrived in the last DAYS days.")
@click.option("--show", type=click.IntRange(0, 10000), default=20, show_default=True,
              help="List at most this many matches, the newest first (all are counted).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def filters_test(user: str, query: str, days: int, show: int, as_json: bool) -> None:
    """What FILTER would have matched for USER among the listings stored, with the words
    and fields that matched; nothing is notified, nothing is stored."""
    from pipeline.catalogue import workbench

    trial = workbench.try_filter(common.engine(), user, query, days=days, shown=show)
    if as_json:
        click.echo(common.as_json(trial.as_dict()))
        return
    click.echo(f"{trial.query!r}: {trial.matched:,} of the {common.counted(trial.listings, 'listing')} of the"
               f" last {days} days match ({trial.read:,} read, {trial.seconds:.2f} s)")
    for hit in trial.hits:
        told = "  (already notified)" if hit.notified else ""
        click.echo(f"{hit.id:>8}  {common.moment(hit.ingested_at)}  {hit.title}{told}")
        click.echo(f"{'':>8}  {hit.url}")
        click.echo(f"{'':>8}  matched: {', '.join(hit.reasons)}")
    if trial.matched > len(trial.hits):
        click.echo(f"... and {trial.matched - len(trial.hits)} more (--show N lists more)")


@filters_group.command("list")
@click.option("--user", help="Only this user's (a name or an id).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def filters_list(user: str | None, as_json: bool) -> None:
    """Every filter with its user."""
    from pipeline.catalogue import users

    with common.engine().connect() as conn:
        rows = users.list_filters(conn, user)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        limits = "".join(
            [f" source {row['source_id']}" if row["source_id"] else "",
             f" category {row['category']!r}" if row["category"] else "",
             _changes(row) if row["changes"] else "",
             f" to {row['channel']} {row['channel_url']}" if row["channel_url"] else "",
             f" ({row['mode']})" if row["mode"] else "",
             "" if row["enabled"] else " (disabled)"]
        )
        click.echo(f"{row['id']:>6}  {row['name']:<20} {row['query']}{limits}")
        if row["failed_at"] is not None:
            click.echo(f"{'':>6}  left out of matching at {row['failed_at']:%Y-%m-%d %H:%M} UTC: {row['error']}")


def _changes(row: dict[str, Any]) -> str:
    """What a watching filter tells of changes, as `filters list` says it."""
    conditions = [f"a drop of {row['price_drop']:g}%" if row["price_drop"] is not None else "",
                  f"below {row['price_below']:g}" if row["price_below"] is not None else ""]
    said = " or ".join(c for c in conditions if c)
    return f" (and its price changes: {said})" if said else " (and its changes)"


@filters_group.command("route")
@click.argument("filter_id", type=common.ID)
@click.option("--webhook", metavar="URL", help="Send this filter's matches by signed HTTP POST to URL.")
@click.option("--secret-file", type=click.File("r"), metavar="FILE",
              help="The webhook's HMAC secret (16+ characters) from FILE, '-' for standard input;"
                   " default: generated and printed once.")
@click.option("--apprise", "apprise_url", metavar="URL", help="Send this filter's matches through Apprise.")
@click.option("--user-channel", is_flag=True, help="Send them through the user's channel again.")
@click.option("--mode", type=click.Choice(["instant", "digest", "user"]),
              help="instant: each match at once, whatever the user's digest; digest: in the user's"
                   " digest (daily when they have none); user: as the user's settings say.")
def filters_route(filter_id: int, webhook: str | None, secret_file: Any, apprise_url: str | None,
                  user_channel: bool, mode: str | None) -> None:
    """Send a filter's matches through a channel and/or in a mode of its own instead of
    its user's (quiet hours stay the user's). What is not yet sent goes the new way."""
    from pipeline.catalogue import users
    from pipeline.core.settings import Settings
    from pipeline.net.http import AddressGuard

    secret = secret_file.read().strip() if secret_file is not None else None
    guard = AddressGuard(Settings.from_env().allow_networks)
    with common.engine().begin() as conn:
        generated = users.route_filter(conn, filter_id, webhook=webhook, secret=secret or None,
                                       apprise_url=apprise_url, user_channel=user_channel, mode=mode, guard=guard)
    if generated:
        click.echo(f"webhook secret (shown once; the receiver verifies webhook-signature with it): {generated}",
                   err=True)


@filters_group.command("remove")
@click.argument("filter_id", type=common.ID)
def filters_remove(filter_id: int) -> None:
    """Delete a filter (the notifications it made stay)."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.remove_filter(conn, filter_id)
    click.echo(f"filter {filter_id} removed")


@filters_group.command("enable")
@click.argument("filter_id", type=common.ID)
def filters_enable(filter_id: int) -> None:
    """Enable a filter."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, True)
    click.echo(f"filter {filter_id} enabled")


@filters_group.command("disable")
@click.argument("filter_id", type=common.ID)
def filters_disable(filter_id: int) -> None:
    """Disable a filter."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, False)
    click.echo(f"filter {filter_id} disabled")


@click.group("notifications", cls=common.HelpGroup)
def notifications_group() -> None:
    """Steer notifications."""


@notifications_group.command("list")
@click.option("--user", help="Only this user's (a name or an id).")
@click.option("--status", type=click.Choice([s.value for s in NotificationStatus]),
              help="Only those in this status.")
@click.option("--since", metavar="WHEN",
              help="Only those created at or after WHEN (ISO 8601: 2026-11-27, or with a time; UTC).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="At most this many, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def notifications_list(
    user: str | None, status: str | None, since: str | None, limit: int, as_json: bool,
) -> None:
    """The latest notifications with their status, attempts and last error, newest first."""
    from pipeline.catalogue import notifications

    moment = None
    if since is not None:
        try:
            moment = datetime.fromisoformat(since.strip())
        except ValueError:
            raise click.UsageError(f"--since {since!r} is not a date or time (ISO 8601: 2026-11-27T08:00)") from None
        moment = utc(moment)
    with common.engine().connect() as conn:
        rows = notifications.list_notifications(conn, user=user, status=status, since=moment, limit=limit)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        when = common.moment(row["sent_at"] or row["created_at"])
        error = f"  last error: {row['last_error']}" if row["last_error"] and row["status"] != "sent" else ""
        click.echo(f"{row['id']:>8}  {row['status']:<7} {when}  {row['user']}  {row['event']}"
                   f" ({common.counted(row['attempts'], 'attempt')}): {row['title']}{error}")


@notifications_group.command("digest")
@click.argument("user")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output: the digest's webhook body.")
def notifications_digest(user: str, as_json: bool) -> None:
    """What USER's (a name or id) held notifications will send as their next digest (or
    at the end of quiet hours), as it will read, and when. Nothing is changed."""
    from pipeline.catalogue import notifications

    held = notifications.preview_digest(common.engine(), user)
    if as_json:
        payload = held.message.payload() if held.message else None
        click.echo(common.as_json({"release_at": held.release_at, "digest": payload}))
        return
    if held.message is None or held.release_at is None:
        click.echo(f"nothing held for {user}")
        return
    title, body = held.message.text()
    click.echo(f"goes out at {common.moment(held.release_at)}\n\n{title}\n\n{body}")


@notifications_group.command("requeue")
@click.option("--dead", is_flag=True, help="Every dead notification.")
@click.option("--id", "ids", type=common.ID, multiple=True, help="This notification (repeatable).")
def notifications_requeue(dead: bool, ids: tuple[int, ...]) -> None:
    """Make dead (or chosen) notifications pending again, attempts reset. Sent ones never."""
    from pipeline.catalogue import notifications

    with common.engine().begin() as conn:
        count = notifications.requeue_notifications(conn, ids=list(ids), dead=dead)
    click.echo(common.counted(count, "notification") + " requeued")

"""`pipeline users`, `filters` and `notifications`: who is notified of what, and requeueing."""

from __future__ import annotations

import json
from typing import Any

import click

from pipeline.cli import common


@click.group("users")
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

    from pipeline.catalogue import users

    secret = secret_file.read().strip() if secret_file is not None else None
    secret = secret or os.environ.get("PIPELINE_WEBHOOK_SECRET", "").strip() or None
    with common.engine().begin() as conn:
        user = users.add_user(conn, name, webhook=webhook, secret=secret, apprise_url=apprise_url)
    click.echo(user.id)
    if user.secret:
        click.echo(f"webhook secret (shown once; the receiver verifies X-Pipeline-Signature with it): {user.secret}",
                   err=True)


@users_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def users_list(as_json: bool) -> None:
    """Every user and channel (secrets never shown)."""
    from pipeline.catalogue import users

    with common.engine().connect() as conn:
        rows = users.list_users(conn)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for row in rows:
        state = "" if row["enabled"] else "  (disabled)"
        click.echo(f"{row['id']:>6}  {row['name']:<20} {row['channel']:<8} {row['target']}{state}")


@click.group("filters")
def filters_group() -> None:
    """Add, list, enable and disable users' filters."""


@filters_group.command("add")
@click.argument("user")
@click.option("--keywords", required=True, help='Words that must all appear, e.g. "python remote".')
@click.option("--source", "source_id", type=common.ID, help="Only listings of this source id.")
@click.option("--category", help="Only listings with this category.")
def filters_add(user: str, keywords: str, source_id: int | None, category: str | None) -> None:
    """Add a filter for USER (a name or id) and print its id. It applies to listings that
    arrive from now on."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        click.echo(users.add_filter(conn, user, keywords, source_id=source_id, category=category))


@filters_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def filters_list(as_json: bool) -> None:
    """Every filter with its user."""
    from pipeline.catalogue import users

    with common.engine().connect() as conn:
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
@click.argument("filter_id", type=common.ID)
def filters_enable(filter_id: int) -> None:
    """Enable a filter."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, True)


@filters_group.command("disable")
@click.argument("filter_id", type=common.ID)
def filters_disable(filter_id: int) -> None:
    """Disable a filter."""
    from pipeline.catalogue import users

    with common.engine().begin() as conn:
        users.set_filter_enabled(conn, filter_id, False)


@click.group("notifications")
def notifications_group() -> None:
    """Steer notifications."""


@notifications_group.command("requeue")
@click.option("--dead", is_flag=True, help="Every dead notification.")
@click.option("--id", "ids", type=common.ID, multiple=True, help="This notification (repeatable).")
def notifications_requeue(dead: bool, ids: tuple[int, ...]) -> None:
    """Make dead (or chosen) notifications pending again, attempts reset. Sent ones never."""
    from pipeline.catalogue import notifications

    with common.engine().begin() as conn:
        count = notifications.requeue_notifications(conn, ids=list(ids), dead=dead)
    click.echo(f"{count} notifications requeued")

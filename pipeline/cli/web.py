"""`pipeline feeds` (output feeds of users' matches) and `pipeline serve`, the web
service that answers for them (pipeline/web/app.py)."""

from __future__ import annotations

import click

from pipeline.cli import common


def base_url() -> str:
    """Where readers reach `pipeline serve`: PIPELINE_PUBLIC_URL, else 127.0.0.1 and its port."""
    from pipeline.core.settings import Settings, web_port

    return Settings.from_env().public_url or f"http://127.0.0.1:{web_port()}"


@click.group("feeds", cls=common.HelpGroup)
def feeds_group() -> None:
    """Output feeds: a user's matches (or one filter's) as Atom and JSON Feed at a
    secret URL that `pipeline serve` answers."""


@feeds_group.command("add")
@click.argument("user")
@click.option("--filter", "filter_id", type=common.ID, help="Only what this filter (one of USER's) matches.")
def feeds_add(user: str, filter_id: int | None) -> None:
    """Make a feed of USER's matches and print its two URLs (Atom, JSON Feed), once:
    the database keeps only a hash of the secret in them. PIPELINE_PUBLIC_URL is where
    readers reach `pipeline serve`."""
    from pipeline.catalogue import feeds
    from pipeline.web.app import feed_urls

    with common.engine().begin() as conn:
        made = feeds.add_feed(conn, user, filter_id=filter_id)
    atom_url, json_url = feed_urls(base_url(), made.token)
    click.echo(f"feed {made.id} (shown once; `pipeline feeds revoke {made.id}` closes it):", err=True)
    click.echo(atom_url)
    click.echo(json_url)


@feeds_group.command("list")
@click.option("--user", help="Only this user's (a name or an id).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def feeds_list(user: str | None, as_json: bool) -> None:
    """Every feed, with its user and filter (the URLs are never shown again)."""
    from pipeline.catalogue import feeds

    with common.engine().connect() as conn:
        rows = feeds.list_feeds(conn, user)
    if as_json:
        click.echo(common.as_json(rows))
        return
    for row in rows:
        what = f"filter {row['filter_id']}" if row["filter_id"] is not None else "all matches"
        state = f"  (revoked {common.moment(row['revoked_at'])})" if row["revoked_at"] else ""
        click.echo(f"{row['id']:>6}  {row['user']:<20} {what:<16} made {common.moment(row['created_at'])}{state}")


@feeds_group.command("revoke")
@click.argument("feed_id", type=common.ID)
def feeds_revoke(feed_id: int) -> None:
    """Close a feed: its URLs answer 404 from now on."""
    from pipeline.catalogue import feeds

    with common.engine().begin() as conn:
        feeds.revoke_feed(conn, feed_id)
    click.echo(f"feed {feed_id} revoked: its URLs answer 404")


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port to listen on; default: PIPELINE_WEB_PORT, else 8790.")
@click.option("--threads", type=click.IntRange(1, 1_000), default=16, show_default=True,
              help="Requests answered at once (each reads the database); connections are not limited,"
                   " and each request must arrive within 10 s.")
def serve(host: str, port: int | None, threads: int) -> None:
    """Answer for the output feeds (/feeds/TOKEN.atom, /feeds/TOKEN.json), the WebSub
    callback (/websub/TOKEN: hubs' verifications and pushes) and /healthz on
    http://HOST:PORT, reading the database at each request. Ctrl-C stops it."""
    from pipeline.core.settings import Settings, web_port
    from pipeline.web.app import FeedApp
    from pipeline.web.server import run_until_interrupted
    from pipeline.web.server import serve as serve_app

    settings = Settings.from_env()
    server = serve_app(host, port or web_port(), FeedApp(common.engine(), settings.public_url, settings),
                       threads=threads, max_body_bytes=settings.max_response_bytes)
    click.echo(f"serving output feeds on http://{host}:{server.server_address[1]}/feeds/", err=True)
    run_until_interrupted(server)

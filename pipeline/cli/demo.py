"""`pipeline demo`: serve the offline demo site, and seed its sources, user and filters."""

from __future__ import annotations

import click

from pipeline.cli import common


@click.group("demo", cls=common.HelpGroup)
def demo_group() -> None:
    """The offline demo that `python3 dev.py up` runs: a local site and its sources."""


@demo_group.command("serve")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1; default: PIPELINE_DEMO_PORT, else 8780.")
def demo_serve(port: int | None) -> None:
    """Serve the demo's feeds, page and webhook receiver on 127.0.0.1 until interrupted."""
    from pipeline.core.settings import demo_port, state_dir
    from pipeline.demo import site as demo_site

    demo_site.serve(
        port or demo_port(), state_dir() / "demo" / "deliveries.jsonl",
        ready=lambda url: click.echo(f"demo site on {url} (deliveries listed at {url}/)"),
    )


@demo_group.command("seed")
@click.option("--site", default=None, metavar="URL",
              help="The demo site's root; default: http://127.0.0.1:PIPELINE_DEMO_PORT.")
def demo_seed(site: str | None) -> None:
    """Add the demo sources, user and filters where missing (safe on every start), and
    print the demo user's output feed (kept in the state folder, since the database
    keeps only its hash)."""
    from pipeline.cli.web import base_url
    from pipeline.core.settings import demo_port, state_dir
    from pipeline.demo import content
    from pipeline.demo import site as demo_site
    from pipeline.web.app import feed_urls

    try:
        root = demo_site.parse_site(site or f"http://127.0.0.1:{demo_port()}")
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--site") from None
    with common.engine().begin() as conn:
        added = content.seed(conn, root)
    click.echo(f"demo: {added['sources_added']} sources and {added['filters_added']} filters added")
    saved = state_dir() / "demo" / "feed-urls.txt"
    if added["feed_token"]:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text("\n".join(feed_urls(base_url(), added["feed_token"])) + "\n")
    if saved.exists():
        click.echo(f"demo: the demo user's matches as a feed (pipeline serve): {saved.read_text().split()[0]}")

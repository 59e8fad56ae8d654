"""`pipeline metrics`: the pipeline's state as Prometheus metrics (pipeline/storage/metrics.py)."""

from __future__ import annotations

import click

from pipeline.cli import common


@click.group("metrics", cls=common.HelpGroup, invoke_without_command=True)
@click.pass_context
def metrics_group(ctx: click.Context) -> None:
    """Print the metrics once in Prometheus's text format (or `serve` them)."""
    if ctx.invoked_subcommand is None:
        from prometheus_client import generate_latest

        from pipeline.storage.metrics import registry

        click.echo(generate_latest(registry(common.engine())).decode(), nl=False)


@metrics_group.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True)
def metrics_serve(host: str, port: int) -> None:
    """Answer Prometheus's scrapes on http://HOST:PORT/metrics, reading the database at
    each scrape. Ctrl-C stops it."""
    from prometheus_client import make_wsgi_app

    from pipeline.storage.metrics import registry
    from pipeline.web.server import run_until_interrupted, serve

    server = serve(host, port, make_wsgi_app(registry(common.engine())))
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    run_until_interrupted(server)

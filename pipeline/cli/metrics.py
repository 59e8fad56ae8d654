"""`pipeline metrics`: the pipeline's state as Prometheus metrics (pipeline/storage/metrics.py)."""

from __future__ import annotations

import threading

import click
from prometheus_client import generate_latest, start_http_server

from pipeline.cli import common
from pipeline.storage.metrics import registry


@click.group("metrics", invoke_without_command=True)
@click.pass_context
def metrics_group(ctx: click.Context) -> None:
    """Print the metrics once in Prometheus's text format (or `serve` them)."""
    if ctx.invoked_subcommand is None:
        click.echo(generate_latest(registry(common.engine())).decode(), nl=False)


@metrics_group.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=9464, show_default=True)
def metrics_serve(host: str, port: int) -> None:
    """Answer Prometheus's scrapes on http://HOST:PORT/metrics, reading the database at
    each scrape. Ctrl-C stops it."""
    server, thread = start_http_server(port, addr=host, registry=registry(common.engine()))
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(5)

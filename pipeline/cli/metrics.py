"""`pipeline metrics`: the pipeline's state as Prometheus metrics (pipeline/storage/metrics.py)."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import click
from prometheus_client import generate_latest, make_wsgi_app

from pipeline.cli import common
from pipeline.storage.metrics import registry

# A scrape's request must arrive within this many seconds; a connection idle for longer
# is closed (once, a thread waited forever on each half-sent request).
READ_TIMEOUT_SECONDS = 10.0
# Connections served at once; past it a new one is closed at once. Prometheus scrapes
# over one connection per target, so a few suffice.
MAX_CONNECTIONS = 16


class _Handler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_SECONDS  # the socket's, for every read of the request

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # one line per scrape is noise


class MetricsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once, each read held to
    ``READ_TIMEOUT_SECONDS``: idle or slow clients cannot pile up threads."""

    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds before accepting (socketserver's is 5)

    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots = threading.BoundedSemaphore(self.max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed, not queued
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve(
    host: str, port: int, app: Any, *, read_timeout: float = READ_TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """``app`` served on HOST:PORT (IPv6 when HOST is an IPv6 address), not yet started."""
    families = {info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    ipv6 = socket.AF_INET6 in families and socket.AF_INET not in families
    server_class = type("Server", (MetricsServer,), {
        "address_family": socket.AF_INET6 if ipv6 else socket.AF_INET, "max_connections": max_connections})
    handler_class = type("Handler", (_Handler,), {"timeout": read_timeout})
    return make_server(host, port, app, server_class=server_class, handler_class=handler_class)  # type: ignore[return-value]


@click.group("metrics", cls=common.HelpGroup, invoke_without_command=True)
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
    server = serve(host, port, make_wsgi_app(registry(common.engine())))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    click.echo(f"serving metrics on http://{host}:{port}/metrics", err=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(5)

"""The WSGI server the pipeline's web services run on (``pipeline serve``, ``pipeline
metrics serve``): the standard library's, with a thread per connection, at most so many
at once, and each request's reads held to a timeout, so that idle or slow clients cannot
pile up threads."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from pipeline.core.errors import ConfigError

# A request must arrive within this many seconds; a connection idle for longer is closed
# (once, a thread waited forever on each half-sent request).
READ_TIMEOUT_SECONDS = 10.0
# Connections served at once; past it a new one is closed at once.
MAX_CONNECTIONS = 16


class _Handler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_SECONDS  # the socket's, for every read of the request

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request is noise (and a feed's line would hold its token)


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``max_connections`` at once, each read held to
    the handler's timeout."""

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
) -> BoundedServer:
    """``app`` served on HOST:PORT (IPv6 when HOST is an IPv6 address), not yet started."""
    try:
        families = {info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    ipv6 = socket.AF_INET6 in families and socket.AF_INET not in families
    server_class = type("Server", (BoundedServer,), {
        "address_family": socket.AF_INET6 if ipv6 else socket.AF_INET, "max_connections": max_connections})
    handler_class = type("Handler", (_Handler,), {"timeout": read_timeout})
    try:
        server: BoundedServer = make_server(host, port, app, server_class=server_class, handler_class=handler_class)
    except OSError as exc:  # the port taken, an address not this machine's: one line
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return server


def run_until_interrupted(server: BoundedServer) -> None:
    """Serve in a thread until Ctrl-C (or SIGTERM's KeyboardInterrupt), then stop."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        thread.join(5)

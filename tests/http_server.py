"""A real HTTP/1.1 server on 127.0.0.1 for tests: routes are plain functions.

Only loopback is ever served or requested. Each route gets the request handler and
writes a complete response with ``reply``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    server: LocalServer

    body: bytes = b""

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.record(self)
        route = self.server.routes.get(path)
        if route is None:
            self.reply(404, b"not found")
        else:
            route(self)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length)
        if len(self.body) < length:
            # The client went away mid-request (a sender SIGKILLed between writing its
            # headers and its body): an incomplete request is not a request, and a real
            # server would not act on it either.
            self.close_connection = True
            return
        self.do_GET()

    def reply(
        self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}) and "Transfer-Encoding" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet test output


class LocalServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), Handler)
        self.routes: dict[str, Route] = {}
        self.requests: list[dict[str, object]] = []
        self.connections: set[int] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def record(self, handler: Handler) -> None:
        with self._lock:
            self.requests.append({"path": handler.path, "headers": dict(handler.headers),
                                  "method": handler.command, "body": handler.body,
                                  "port": handler.client_address[1]})
            self.connections.add(handler.client_address[1])

    def start(self) -> LocalServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away mid-request (a worker killed by a test) is expected."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class InFlight:
    """Counts the requests a route is serving at once; ``peak`` is the most seen."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self._arrived = 0
        self._full = 0  # how many times ``together`` were in flight at once
        self._changed = threading.Condition()

    def holding(self, reply: Route, seconds: float = 0.2) -> Route:
        """A route that holds each request ``seconds`` in flight, then answers with ``reply``."""

        def route(h: Handler) -> None:
            with self._changed:
                self.active += 1
                self.peak = max(self.peak, self.active)
            time.sleep(seconds)
            with self._changed:
                self.active -= 1
            reply(h)

        return route

    def holding_until(self, reply: Route, *, together: int, total: int, grace: float = 0.2) -> Route:
        """A route that holds each request until ``together`` are in flight at once (or the
        last of ``total`` has come), then ``grace`` seconds more, then answers with
        ``reply``. A slow client still fills its cap (a state, not a moment: 60 s at most,
        then a cap never reached shows as a lower ``peak``); one past its cap sends more
        within the grace, which ``peak`` shows."""

        def route(h: Handler) -> None:
            with self._changed:
                self.active += 1
                self._arrived += 1
                self.peak = max(self.peak, self.active)
                if self.active >= together:
                    self._full += 1
                    self._changed.notify_all()
                full_before = self._full - (self.active >= together)
                self._changed.wait_for(lambda: self._full > full_before or self._arrived >= total, timeout=60)
                self._changed.notify_all()
            time.sleep(grace)
            with self._changed:
                self.active -= 1
            reply(h)

        return route

"""A real HTTP/1.1 server on 127.0.0.1 for tests: routes are plain functions.

Only loopback is ever served or requested. Each route gets the request handler and
writes a complete response with ``reply``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    server: LocalServer

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.server.record(self)
        route = self.server.routes.get(path)
        if route is None:
            self.reply(404, b"not found")
        else:
            route(self)

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

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
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
            self.requests.append({"path": handler.path, "headers": dict(handler.headers)})
            self.connections.add(handler.client_address[1])

    def start(self) -> LocalServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

"""The server the pipeline's web services run on (``pipeline serve``, ``pipeline
metrics serve``): Hypercorn, an asyncio server, in front of the WSGI applications
(through a2wsgi's bridge), chosen by measurement against hostile clients
(bench/listening.py, bench/RESULTS.md "Listening sockets").

The standard library's server it replaces gave each connection a thread, at most so
many, each read held to a timeout: 64 connections sending a header line every 4 s held
every slot and nothing else was answered. Here a connection is a coroutine, so idle
and slow clients cost little and never hold what a legitimate request needs, and every
request has **deadlines, not per-read timeouts**:

* its headers within ``DEADLINE_SECONDS`` of the connection's start or of the previous
  response (Hypercorn's keep-alive timer runs until a request's headers are in, and is
  not put off by bytes that trickle in: a drip every 2 s is cut at the deadline);
* its body within ``DEADLINE_SECONDS`` more (``_WholeRequests``, 408 past it): a body
  is read whole, at most ``max_body_bytes`` (a larger declared one is handed to the
  application unread, for it to refuse), before the application's thread is given the
  request, so no thread ever waits on a client; the bodies held at once are at most
  ``BODY_BUDGET_BYTES`` (503 past it);
* the application itself runs on ``threads`` threads (its database reads).
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from a2wsgi import WSGIMiddleware
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config

from pipeline.core.errors import ConfigError

# A request's headers, and then its body, must each arrive within this many seconds.
DEADLINE_SECONDS = 10.0
# Threads running the application at once (requests past it wait for one).
THREADS = 16
# The request body a service takes by default (a Prometheus scrape has none).
MAX_BODY_BYTES = 64 * 1024
# Request bodies held in memory at once, across connections.
BODY_BUDGET_BYTES = 256 * 1024 * 1024

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _WholeRequests:
    """ASGI middleware: each HTTP request's body read whole within the deadline (at
    most ``max_body`` bytes; one declaring more is passed on unread, for the
    application to refuse by its Content-Length), then the request handed on."""

    def __init__(self, app: Any, deadline: float, max_body: int) -> None:  # an ASGI application
        self.app, self.deadline, self.max_body = app, deadline, max_body
        self.held = 0  # bytes of bodies held now (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to start or stop
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await self.app(scope, _replay(b""), send)
            return
        body = await self._body(receive, send)
        if body is None:
            return
        try:
            await self.app(scope, _replay(bytes(body)), send)
        finally:
            self.held -= len(body)  # held until the application is done with it

    async def _body(self, receive: Receive, send: Send) -> bytearray | None:
        """The request's body, whole, counted in ``held``; None when it was answered
        here instead (413, 503, 408) or the client left, its bytes no longer counted."""
        body, whole = bytearray(), False
        try:
            async with asyncio.timeout(self.deadline):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    if len(body) + len(chunk) > self.max_body:
                        await _answer(send, 413, b"the body is too large\n")
                        return None
                    if self.held + len(chunk) > BODY_BUDGET_BYTES:
                        await _answer(send, 503, b"busy: try again\n", [(b"retry-after", b"5")])
                        return None
                    self.held += len(chunk)
                    body += chunk
                    if not message.get("more_body"):
                        whole = True
                        return body
        except TimeoutError:
            await _answer(send, 408, b"the request did not arrive in time\n", [(b"connection", b"close")])
            return None
        finally:
            if not whole:
                self.held -= len(body)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes) -> Receive:
    """A ``receive`` giving ``body`` whole, then waiting as a connection kept open does."""
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the bridge stops listening once the response is sent
        return {"type": "http.disconnect"}

    return receive


async def _answer(send: Send, status: int, text: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(text)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": text})


class Server:
    """A WSGI application served on a socket of its own: ``serve_forever`` (in any
    thread) until ``shutdown``; ``server_address`` is where it listens."""

    def __init__(self, sock: socket.socket, app: Any, *, deadline: float, threads: int, max_body: int) -> None:
        self.socket = sock
        self.server_address = sock.getsockname()
        self.app = _WholeRequests(WSGIMiddleware(app, workers=threads), deadline, max_body)
        self.config = Config()
        self.config.keep_alive_timeout = deadline  # until a request's headers are in: their deadline
        self.config.read_timeout = math.ceil(deadline)
        self.config.accesslog = None  # a feed's request line holds its token
        self.config.errorlog = None  # the application logs what it must, in one line
        self.config.wsgi_max_body_size = max_body
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopped = threading.Event()
        self._started = threading.Event()

    def serve_forever(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        # A copy of the socket, which Hypercorn closes when it stops (``server_close`` closes ours).
        self.config.bind = [f"fd://{os.dup(self.socket.fileno())}"]
        self._started.set()
        try:
            await hypercorn_serve(self.app, self.config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serving, once what is being answered is answered; returns when it has."""
        if not self._started.wait(10) or self._loop is None or self._stop is None:
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._stopped.wait(30)

    def server_close(self) -> None:
        self.socket.close()


def serve(
    host: str, port: int, app: Any, *, deadline: float = DEADLINE_SECONDS, threads: int = THREADS,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Server:
    """``app`` (WSGI) to be served on HOST:PORT (IPv6 when HOST is an IPv6 address): the
    socket is bound now (a taken port is one line), the serving starts with ``serve_forever``."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:  # the port taken, an address not this machine's: one line
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return Server(sock, app, deadline=deadline, threads=threads, max_body=max_body_bytes)


def run_until_interrupted(server: Server) -> None:
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
        server.server_close()

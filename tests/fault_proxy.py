"""A TCP proxy on loopback that can cut a link without closing it: a network partition.

Every connection accepted on ``127.0.0.1:<port>`` is forwarded to ``upstream``, a
(host, port) or the path of a Unix socket (a PostgreSQL the tests started themselves). ``cut()``
stops forwarding in both directions while every socket stays open, as a partition (a
switch that drops packets, a peer that vanished) looks to both ends: nothing arrives,
nothing fails; what each end sends waits in the proxy. ``heal()`` forwards again,
the held bytes first. ``cut_after(marker)`` cuts the link as soon as the client has sent
``marker`` (forwarded first), to cut a worker at a chosen point of its conversation with
the database: in the middle of a transaction, say. ``cut_clients(select)`` cuts only the
connections whose client's port ``select`` picks, those open and those made until
``heal()``: one process's, or one container's, of many on the same host.

An upstream that refuses a connection (a database restarting) closes that client's: the
proxy goes on accepting.

When one end closes its socket (the database ended a session), the proxy closes the
other end's too, after healing: the client then sees the connection fail.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline.storage import db


def postgres_upstream(db_url: str) -> tuple[str, int] | str:
    """Where a test's PostgreSQL listens: host and port, or its Unix socket."""
    url = db.parse_url(db_url)
    socket_dir = url.query.get("host")
    if isinstance(socket_dir, str) and socket_dir.startswith("/"):
        return f"{socket_dir}/.s.PGSQL.{url.port or 5432}"
    return (url.host or "127.0.0.1", url.port or 5432)


class FaultProxy:
    def __init__(self, upstream: tuple[str, int] | str) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self._links: dict[int, _Link] = {}  # the open connections, by client port
        self._select: Callable[[int], bool] | None = None
        self.clients_cut = 0  # connections cut_clients held, open then or made since
        self.connections = 0
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    # -- the fault -------------------------------------------------------------------

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        with self._lock:
            self._select = None
            for link in self._links.values():
                link.open.set()
        self._open.set()

    def cut_clients(self, select: Callable[[int], bool]) -> int:
        """Cut the connections whose client port ``select`` picks (asked once per
        connection), and those it picks as they are made, until ``heal()``; how many open
        ones it cut (``clients_cut`` counts those made since too)."""
        with self._lock:
            self._select = select
            links = list(self._links.items())
        cut = 0
        for port, link in links:
            if select(port):
                link.open.clear()
                cut += 1
        with self._lock:
            self.clients_cut += cut
        return cut

    def cut_after(self, marker: bytes) -> None:
        """Cut the link once the client has sent ``marker`` (it reaches the database)."""
        self._marker = marker

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    @property
    def open_connections(self) -> int:
        """Connections forwarded now (a closed one's sockets are closed and forgotten)."""
        with self._lock:
            return len(self._links)

    # -- forwarding ------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, (_, port) = self._listener.accept()
            except OSError:
                return  # closed
            try:
                if isinstance(self.upstream, str):
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.connect(self.upstream)
                else:
                    server = socket.create_connection(self.upstream)
            except OSError:
                client.close()  # the upstream is down: this client's connection fails
                continue
            link = _Link(port, (client, server))
            with self._lock:
                self.connections += 1
                self._links[port] = link
                select = self._select
            if select is None or not select(port):
                link.open.set()
            else:
                with self._lock:
                    self.clients_cut += 1
            threading.Thread(target=self._pump, args=(client, server, self._watch, link), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None, link), daemon=True).start()

    def _watch(self, data: bytes) -> None:
        marker = self._marker
        if marker is not None and marker in data:
            self._marker = None
            self.cut()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: Callable[[bytes], None] | None,
              link: _Link) -> None:
        def wait_open() -> None:
            self._open.wait()
            link.open.wait()

        try:
            while True:
                wait_open()
                data = src.recv(65536)
                if not data:
                    break
                wait_open()  # cut while receiving: held until healed
                dst.sendall(data)
                if watch is not None:
                    watch(data)  # forwarded first, then (perhaps) cut
        except OSError:
            pass
        finally:
            wait_open()  # an end that closed is seen by the other once healed
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                link.pumps -= 1
                ended = link.pumps == 0
                if ended and self._links.get(link.port) is link:
                    del self._links[link.port]
            if ended:  # both directions done: the connection's sockets are closed, not kept
                for sock in link.sockets:
                    sock.close()

    def close(self) -> None:
        self.heal()
        self._listener.close()
        with self._lock:
            links = list(self._links.values())
        for link in links:
            for sock in link.sockets:
                try:
                    sock.close()
                except OSError:
                    pass


@dataclass
class _Link:
    """One proxied connection: its client's port, its two sockets, whether it forwards
    (cut_clients clears it), and how many of its two directions still run."""

    port: int
    sockets: tuple[socket.socket, socket.socket]
    open: threading.Event = field(default_factory=threading.Event)
    pumps: int = 2

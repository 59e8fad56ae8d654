"""A TCP proxy on loopback that can cut a link without closing it: a network partition.

Every connection accepted on ``127.0.0.1:<port>`` is forwarded to ``upstream``, a
(host, port) or the path of a Unix socket (a PostgreSQL the tests started themselves). ``cut()``
stops forwarding in both directions while every socket stays open, as a partition (a
switch that drops packets, a peer that vanished) looks to both ends: nothing arrives,
nothing fails; what each end sends waits in the proxy. ``heal()`` forwards again,
the held bytes first. ``cut_after(marker)`` cuts the link as soon as the client has sent
``marker`` (forwarded first), to cut a worker at a chosen point of its conversation with
the database: in the middle of a transaction, say.

When one end closes its socket (the database ended a session), the proxy closes the
other end's too, after healing: the client then sees the connection fail.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

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
        self._sockets: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    # -- the fault -------------------------------------------------------------------

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def cut_after(self, marker: bytes) -> None:
        """Cut the link once the client has sent ``marker`` (it reaches the database)."""
        self._marker = marker

    @property
    def is_cut(self) -> bool:
        return not self._open.is_set()

    # -- forwarding ------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if isinstance(self.upstream, str):
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.connect(self.upstream)
            else:
                server = socket.create_connection(self.upstream)
            with self._lock:
                self._sockets += [client, server]
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server, self._watch), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    def _watch(self, data: bytes) -> None:
        marker = self._marker
        if marker is not None and marker in data:
            self._marker = None
            self.cut()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: Callable[[bytes], None] | None) -> None:
        try:
            while True:
                self._open.wait()
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()  # cut while receiving: held until healed
                dst.sendall(data)
                if watch is not None:
                    watch(data)  # forwarded first, then (perhaps) cut
        except OSError:
            pass
        finally:
            self._open.wait()  # an end that closed is seen by the other once healed
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.heal()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.close()
                except OSError:
                    pass

"""Which server holds the pipeline's listening sockets against hostile clients
(issue 63, class 3): ``pipeline serve`` (WebSub callbacks, output feeds, health) and
``metrics serve`` are WSGI applications; each candidate serves the same one.

For each server, in its own process: ``--idle`` connections that send nothing and
``--drippers`` that send a request line and then one header line every
``DRIP_SECONDS``, never ending it (slow-loris), all opened first; then, for
``--seconds``, a legitimate ``GET /healthz`` on a fresh connection every 0.2 s. It
prints, per server: the legitimate requests' median and worst latency and how many
failed (refused, reset or over 5 s), how long the server let a dripper hold its
connection (the longest, capped at the run: a server with a deadline per request cuts
it), and the server's CPU per legitimate request. The baseline is the project's former
bounded server, run in the same way in the same run.

    .venv/bin/python bench/listening.py [--idle 500 --drippers 500 --seconds 30 --repeats 3]

Servers: ``bounded`` (the project's server until 2026-12-02, the standard library's
with a thread per connection, at most 64: ``_bounded``), ``waitress`` (asyncore loop,
buffered requests, poll), ``hypercorn`` (asyncio, its WSGI mode), ``uvicorn``
(asyncio, via a2wsgi), ``granian`` (Rust hyper, its WSGI interface, a header read
timeout), and ``pipeline`` (pipeline/web/server.py: Hypercorn, a2wsgi and a deadline
for the body). Their options are in ``serve``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scratch import commit, load, tree_seconds

DRIP_SECONDS = 2.0
DEADLINE_SECONDS = 10  # what each server is asked for, where it has such a setting
LEGIT_TIMEOUT = 5.0


def app(environ, start_response):
    if environ["REQUEST_METHOD"] == "POST":  # as a push is: its whole body read
        environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    body = b"ok\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(name: str, port: int) -> None:
    """Serve ``app`` on 127.0.0.1:``port`` with server ``name`` until killed."""
    _raise_fd_limit()
    if name == "pipeline":
        from pipeline.web.server import serve as pipeline_serve

        pipeline_serve("127.0.0.1", port, app).serve_forever()
    elif name == "bounded":
        _bounded(port).serve_forever()
    elif name == "waitress":
        import waitress

        waitress.serve(app, host="127.0.0.1", port=port, threads=4, connection_limit=4000,
                       channel_timeout=DEADLINE_SECONDS, asyncore_use_poll=True, _quiet=True)
    elif name == "hypercorn":
        from hypercorn.asyncio import serve as hypercorn_serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"127.0.0.1:{port}"]
        config.keep_alive_timeout = DEADLINE_SECONDS
        config.read_timeout = DEADLINE_SECONDS
        config.accesslog = None
        asyncio.run(hypercorn_serve(app, config, mode="wsgi"))
    elif name == "uvicorn":
        import uvicorn
        from a2wsgi import WSGIMiddleware

        uvicorn.run(WSGIMiddleware(app), host="127.0.0.1", port=port, log_level="warning",
                    timeout_keep_alive=DEADLINE_SECONDS, access_log=False)
    elif name == "granian":
        from granian import Granian
        from granian.constants import Interfaces
        from granian.http import HTTP1Settings

        Granian("listening:app", address="127.0.0.1", port=port, interface=Interfaces.WSGI, workers=1,
                http1_settings=HTTP1Settings(header_read_timeout=DEADLINE_SECONDS * 1000), log_enabled=False,
                working_dir=Path(__file__).resolve().parent).serve()
    else:
        raise SystemExit(f"no server {name!r}")


def _bounded(port: int) -> Any:
    """The project's server before this one (pipeline/web/server.py until 2026-12-02):
    the standard library's WSGI server, a thread per connection, at most 64 at once
    (a 65th closed at once), each read held to a timeout."""
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class Handler(WSGIRequestHandler):
        timeout = DEADLINE_SECONDS

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Bounded(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        request_queue_size = 64

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.slots = threading.BoundedSemaphore(64)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                self.shutdown_request(request)
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    return make_server("127.0.0.1", port, app, server_class=Bounded, handler_class=Handler)


SERVERS = ("bounded", "waitress", "hypercorn", "uvicorn", "granian", "pipeline")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _legit(port: int) -> float | None:
    """One GET /healthz on a fresh connection: its latency, None when it failed."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), LEGIT_TIMEOUT)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await asyncio.wait_for(reader.read(1024), LEGIT_TIMEOUT - (time.perf_counter() - start))
        writer.close()
        return time.perf_counter() - start if data.startswith(b"HTTP/1.1 200") else None
    except (TimeoutError, OSError):
        return None


async def _attack(port: int, idle: int, drippers: int, seconds: float, pid: int, body: bool) -> dict[str, float]:
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]] = []
    for i in range(idle + drippers):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        drip = i >= idle
        if drip and body:
            writer.write(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\n")
        elif drip:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        opened.append((reader, writer, drip))
    start = time.monotonic()
    closed_at: dict[int, float] = {}

    async def watch(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, drip: bool) -> None:
        while time.monotonic() - start < seconds:
            try:
                if drip:
                    writer.write(b"x" * 16 if body else f"X-Drip-{n}: {time.monotonic():.0f}\r\n".encode())
                    await writer.drain()
                if await asyncio.wait_for(reader.read(1024), DRIP_SECONDS) == b"":
                    closed_at[n] = time.monotonic() - start
                    return
            except TimeoutError:
                continue
            except OSError:
                closed_at[n] = time.monotonic() - start
                return

    watchers = [asyncio.create_task(watch(n, r, w, d)) for n, (r, w, d) in enumerate(opened)]
    await asyncio.sleep(1.0)  # every attacker in place
    cpu_before = tree_seconds(pid)
    latencies: list[float | None] = []
    while time.monotonic() - start < seconds:
        latencies.append(await _legit(port))
        await asyncio.sleep(0.2)
    cpu = tree_seconds(pid) - cpu_before
    await asyncio.gather(*watchers)
    for _, writer, _ in opened:
        writer.close()
    good = [x for x in latencies if x is not None]
    drip_ids = [n for n, (_, _, d) in enumerate(opened) if d]
    held = [closed_at.get(n, seconds) for n in drip_ids]
    return {
        "opened": len(opened), "legit": len(latencies), "failed": len(latencies) - len(good),
        "median_ms": 1000 * statistics.median(good) if good else float("nan"),
        "worst_ms": 1000 * max(good) if good else float("nan"),
        "dripper_held_s": max(held) if held else 0.0,
        "cpu_ms_per_request": 1000 * cpu / max(1, len(latencies)),
    }


def run_one(name: str, idle: int, drippers: int, seconds: float, body: bool) -> dict[str, float]:
    port = _free_port()
    here = Path(__file__).resolve().parent
    process = subprocess.Popen([sys.executable, str(here / "listening.py"), "--serve", name, "--port", str(port)],
                               cwd=here, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)  # its workers too are stopped with it
    try:
        deadline = time.monotonic() + 30
        while True:  # waits for the state: the port answers
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"{name} did not start: {process.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.1)
        return asyncio.run(_attack(port, idle, drippers, seconds, process.pid, body))
    finally:
        os.killpg(process.pid, 9)
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve")
    parser.add_argument("--port", type=int)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--drippers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--body", action="store_true", help="drippers send a body, not header lines")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    _raise_fd_limit()
    names = args.servers.split(",")
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(args.repeats):  # interleaved: each repeat runs every server once
        for name in names:
            results[name].append(run_one(name, args.idle, args.drippers, args.seconds, args.body))
    print(f"commit {commit()}, load {load()}")
    print(f"{args.idle} idle + {args.drippers} dripping connections ({'body' if args.body else 'headers'}),"
          f" {args.seconds:.0f} s, "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'server':<10} {'opened':>6} {'legit':>5} {'failed':>6} {'median ms':>9} {'worst ms':>8} "
          f"{'dripper held s':>14} {'CPU ms/request':>14}")
    for name, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"{name:<10} {med['opened']:>6.0f} {med['legit']:>5.0f} {med['failed']:>6.0f} {med['median_ms']:>9.1f} "
              f"{med['worst_ms']:>8.1f} {med['dripper_held_s']:>14.1f} {med['cpu_ms_per_request']:>14.2f}")


if __name__ == "__main__":
    main()

"""The fault drill: does every fault reach the operator, how soon, and does the machine
recover by itself?

Runs the README's main command, `python3 dev.py up --no-demo` (the Dagster UI, daemon and
sensors; the embedded SQLite default, or PostgreSQL with --database-url), against a drill
site of its own on 127.0.0.1: SOURCES feeds, each gaining an item every --period seconds,
the first pushed by the site's own WebSub hub; the operator's channel (every alert the
pipeline sends, signed, with when it came); and a user's webhook, whose filter matches
every item. Then, phase after phase, while items keep appearing, faults are injected
(those of a phase at once, each on its own feed or path: the small setting's whole run is
about 60 minutes on PostgreSQL, most of it the failed sources' own backoff; --only picks
some), the drill waits up to
--signal-minutes for the operator alert that names each, removes them and waits up to
--recover-minutes for the machine to say it recovered (a check passing again, items
flowing). For each fault the table says:

* signal: the operator alert that named it (event and check or job), and how long after
  the injection it came; "none" when none came within the bound;
* recovered: how long after the fault's removal the machine said so, by itself;
* items: of the items the site published while the fault held, how many were stored by
  the end (missed = published, never stored) and the p95 of their delay (stored less
  published).

Nothing is timed by a test: this is a benchmark (bench/RESULTS.md, "The fault drill");
its times depend on the machine and its load: say it with them.

    .venv/bin/python bench/fault_drill.py                    # the small setting, SQLite
    .venv/bin/python bench/fault_drill.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCES = 6  # feed 0 is pushed by the site's hub; the faults take feeds 1-4
OPERATOR_SECRET = "fault-drill-operator-secret-0123"
USER_SECRET = "fault-drill-user-secret-0123456789"
CHALLENGE_PAGE = (b"<!doctype html><html><head><title>Just a moment...</title></head><body>"
                  b"<div id='challenge-running'>Checking your browser before accessing</div></body></html>")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DrillSite(ThreadingHTTPServer):
    """The drill's feeds, hub, operator channel and user webhook, each fault a mode."""

    daemon_threads = True

    def __init__(self, period: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.period, self.started = period, time.time()
        self.lock = threading.Lock()
        self.feed_mode: dict[int, str] = {}  # feed -> "500", "429", "html", "challenge"; absent: ok
        self.hook_mode = "ok"  # or "503", "410"
        self.operator_mode = "ok"  # or "503": the operator's channel down
        self.hub_down = False  # the hub answers 503 and pushes nothing
        self.subscribers: dict[str, str] = {}  # the hub's: callback -> secret
        self.alerts: list[tuple[float, dict[str, Any]]] = []  # (received, the alert)
        self.deliveries: list[float] = []
        self.pushes = 0  # pushes the hub made that their subscriber took
        self._stop = threading.Event()
        threading.Thread(target=self._hub, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def published(self, feed: int, until: float) -> list[tuple[int, float]]:
        """Feed ``feed``'s items published by ``until``: (k, when), each feed off the others' beat."""
        offset = self.period * feed / SOURCES
        count = int((until - self.started - offset) // self.period) + 1
        return [(k, self.started + offset + k * self.period) for k in range(max(0, count))]

    def feed(self, n: int) -> bytes:
        items = self.published(n, time.time())[-20:]
        hub = (f'<atom:link rel="hub" href="{self.url}/hub"/><atom:link rel="self" href="{self.url}/feed/{n}"/>'
               if n == 0 else "")
        entries = "".join(
            f"<item><guid>drill-{n}-{k}</guid><title>drill item {n}-{k}</title>"
            f"<link>{self.url}/item/{n}/{k}</link></item>" for k, _ in reversed(items))
        return (f'<?xml version="1.0"?><rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom"><channel>'
                f"<title>drill feed {n}</title>{hub}{entries}</channel></rss>").encode()

    def _hub(self) -> None:
        """Push feed 0 to its verified subscribers when it gains an item."""
        last = len(self.published(0, time.time()))
        while not self._stop.wait(0.5):
            now = len(self.published(0, time.time()))
            if now == last or self.hub_down:
                continue
            last = now
            body = self.feed(0)
            with self.lock:
                subscribers = dict(self.subscribers)
            for callback, secret in subscribers.items():
                signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
                request = urllib.request.Request(callback, data=body, method="POST", headers={
                    "Content-Type": "application/rss+xml", "X-Hub-Signature": f"sha256={signature}"})
                try:
                    urllib.request.urlopen(request, timeout=10).close()  # loopback
                    self.pushes += 1
                except OSError:
                    pass

    def verify(self, form: dict[str, str]) -> None:
        challenge = secrets.token_urlsafe(12)
        query = urlencode({"hub.mode": "subscribe", "hub.topic": form["hub.topic"], "hub.challenge": challenge,
                           "hub.lease_seconds": "864000"})
        try:
            with urllib.request.urlopen(f"{form['hub.callback']}?{query}", timeout=10) as answer:
                if answer.read().decode() == challenge:
                    with self.lock:
                        self.subscribers[form["hub.callback"]] = form["hub.secret"]
        except OSError:
            pass

    def stop(self) -> None:
        self._stop.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: DrillSite
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path).path.split("/")
        if len(parts) == 3 and parts[1] == "feed":
            n = int(parts[2])
            mode = self.server.feed_mode.get(n)
            if mode == "500":
                return self._reply(500, b"internal error")
            if mode == "429":
                return self._reply(429, b"slow down", {"Retry-After": "30"})
            if mode == "html":
                return self._reply(200, b"<html><body><p>we moved our feed</p></body></html>", ctype="text/html")
            if mode == "challenge":
                return self._reply(503, CHALLENGE_PAGE, ctype="text/html")
            return self._reply(200, self.server.feed(n), ctype="application/rss+xml")
        self._reply(404, b"not found")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        if path == "/hub":
            if self.server.hub_down:
                return self._reply(503, b"hub down")
            form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
            if form.get("hub.mode") == "subscribe":
                threading.Thread(target=self.server.verify, args=(form,), daemon=True).start()
            return self._reply(202, b"")
        if path == "/operator":
            from pipeline.notify.delivery import verify

            if self.server.operator_mode != "ok":
                return self._reply(int(self.server.operator_mode), b"down")

            if not verify(OPERATOR_SECRET, body, dict(self.headers)):
                return self._reply(401, b"bad signature")
            with self.server.lock:
                self.server.alerts.append((time.time(), json.loads(body)))
            return self._reply(204, b"")
        if path == "/hook":
            mode = self.server.hook_mode
            if mode != "ok":
                return self._reply(int(mode), b"no")
            with self.server.lock:
                self.server.deliveries.append(time.time())
            return self._reply(204, b"")
        self._reply(404, b"not found")

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None,
               ctype: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


Predicate = Callable[[dict[str, Any]], bool]


def check_failing(name: str) -> Predicate:
    return lambda a: a["event"] == "check_failing" and a["details"].get("check") == name


def check_passing(name: str) -> Predicate:
    return lambda a: a["event"] == "check_passing" and a["details"].get("check") == name


@dataclass
class Fault:
    name: str
    phase: int  # faults of one phase hold at once (each on its own feed or path)
    inject: Callable[[], None]
    remove: Callable[[], None]
    signal: Predicate  # the operator alert that names it
    # The alert that says it passed; None: items flowing again says it (the fault's
    # feed's next item stored, or, with no feed, the user's next delivery).
    recovered: Predicate | None
    feed: int | None = None  # the feed it holds, whose items are counted
    hold_seconds: float | None = None  # removed this long after its injection, signalled or not
    # Its signal can only come once it is removed (the operator's channel itself down):
    # waited for that long after the removal.
    signal_after_hold: bool = False


def event(*names: str) -> Predicate:
    return lambda a: a["event"] in names


def faults(site: DrillSite, cli: Callable[..., str], stack: Stack, proxy: Any, database: Any) -> list[Fault]:
    failing = "listings_raw:failing_sources"

    def feed_mode(n: int, mode: str | None) -> Callable[[], None]:
        return lambda: site.feed_mode.pop(n, None) if mode is None else site.feed_mode.__setitem__(n, mode)

    def hook(mode: str) -> Callable[[], None]:
        return lambda: setattr(site, "hook_mode", mode)

    def channel(mode: str) -> Callable[[], None]:
        return lambda: setattr(site, "operator_mode", mode)

    def hub(down: bool) -> Callable[[], None]:
        return lambda: setattr(site, "hub_down", down)

    def operator_channel_failure(a: dict[str, Any]) -> bool:
        """check_alerts's failing ticks, told by tick_alerts once the channel works."""
        return a["event"] == "ticks_failing" and a["details"].get("instigator") == "check_alerts"

    def forget() -> None:
        """The hub forgets its subscribers, once it has pushed to one (a drill of this
        fault alone starts before the first subscription is settled: the pipeline asks
        again while its first verification is under way)."""
        pushed = site.pushes
        wait_for(lambda: site.pushes > pushed, 300)
        with site.lock:
            site.subscribers.clear()

    dns: dict[str, str] = {}

    def set_channel() -> None:
        cli("users", "channel", "drill", "--webhook", f"{site.url}/hook")
    told_database = ("run_failed", "check_failing", "ticks_failing", "step_retrying")

    def add_unresolvable() -> None:
        dns["id"] = cli("sources", "add", "http://drill-feed.invalid/feed", "--interval", "1").strip()

    # Phase 1: sources failing each their own way, at once (one check names them all, with
    # a table of which); phase 2: push, a run, a user's channel; phase 3: a channel gone,
    # the hub down; phase 4: the operator's channel down while a user's webhook fails
    # (check_alerts cannot send: its ticks fail); phase 5: a run stuck while alive;
    # phase 6: the daemon killed; phases 7-9 (PostgreSQL): the database cut off, every
    # connection hanging, for 2 minutes; refusing writes (read-only, as a full disk) for
    # 2 minutes; restarted (every connection ended, none taken for 20 s).
    return [
        Fault("source answers 500", 1, feed_mode(1, "500"), feed_mode(1, None), check_failing(failing),
              None, feed=1),
        Fault("source answers 429", 1, feed_mode(2, "429"), feed_mode(2, None), check_failing(failing),
              None, feed=2),
        Fault("source answers a block page", 1, feed_mode(3, "challenge"), feed_mode(3, None),
              check_failing(failing), None, feed=3),
        Fault("feed parses to nothing (a page)", 1, feed_mode(4, "html"), feed_mode(4, None),
              check_failing(failing), None, feed=4),
        Fault("DNS fails for a source", 1, add_unresolvable, lambda: cli("sources", "remove", dns["id"]),
              check_failing(failing), check_passing(failing)),
        Fault("hub forgets its subscriber", 2, forget, lambda: None, check_failing("listings_raw:push_health"),
              check_passing("listings_raw:push_health"), feed=0),
        Fault("run worker killed", 2, stack.kill_a_run, lambda: None, lambda a: a["event"] == "run_failed", None),
        Fault("user's webhook down (503)", 2, hook("503"), hook("ok"),
              check_failing("notifications:failing_channels"), check_passing("notifications:failing_channels")),
        # Gone is for good: the channel holds its notifications until the user's channel is
        # set again (the runbook's step, taken here as the removal), or a day later.
        Fault("user's webhook gone (410)", 3, hook("410"), lambda: (hook("ok")(), set_channel()),
              check_failing("notifications:failing_channels"), check_passing("notifications:failing_channels")),
        Fault("hub down (503, no pushes)", 3, hub(True), hub(False), check_failing("listings_raw:push_health"),
              check_passing("listings_raw:push_health"), feed=0),
        Fault("a run stuck while alive (SIGSTOP)", 5, stack.stop_a_run, stack.continue_runs,
              check_failing("listings_raw:freshness"), check_passing("listings_raw:freshness")),
        # Down 5 minutes: the user's webhook fails meanwhile (its check fails 2-4 minutes
        # in), so check_alerts has a change to tell and cannot; both are told once the
        # channel answers again.
        Fault("operator's channel down 5 min (a user's webhook failing meanwhile)", 4, channel("503"),
              channel("ok"), operator_channel_failure, None, hold_seconds=300, signal_after_hold=True),
        Fault("user's webhook down (told through a channel that is down)", 4, hook("503"), hook("ok"),
              check_failing("notifications:failing_channels"), check_passing("notifications:failing_channels")),
        Fault("the Dagster daemon killed", 6, stack.kill_the_daemon, lambda: None, event("stack_restarted"), None),
        *([Fault("database unreachable for 2 minutes (a partition)", 7, proxy.cut, proxy.heal,
                 event(*told_database), None, hold_seconds=120),
           Fault("database refuses writes for 2 minutes (read-only, as a full disk)", 8, database.read_only,
                 database.writable, event(*told_database), event("step_working"), hold_seconds=120),
           Fault("database restarted (connections ended, 20 s down)", 9, lambda: database.restart(proxy, 20),
                 lambda: None, event(*told_database), None, hold_seconds=60)]
          if proxy is not None else []),
    ]


class Stack:
    """`python3 dev.py up --no-demo` in a session of its own."""

    def __init__(self, state: Path, env: dict[str, str]) -> None:
        self.state, self.env = state, env
        self.stopped: list[int] = []  # runs' processes SIGSTOPped
        self.log = (state / "dev-up.log").open("ab")
        self.process = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "up", "--no-demo", "-p",
                                         str(free_port())], cwd=ROOT, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def find(self, marker: bytes, what: str) -> int | None:
        """The pid of the stack's process whose command line holds ``marker`` (waited for
        up to 120 s), found by the stack's state folder in its environment."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    command = (entry / "cmdline").read_bytes().split(b"\0")
                    environ = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if (any(marker in part for part in command)
                        and f"PIPELINE_STATE_DIR={self.state}".encode() in environ):
                    return int(entry.name)
            time.sleep(0.5)
        print(f"no {what} within 120 s", flush=True)  # the fault's row says: no signal
        return None

    def kill_a_run(self) -> None:
        """SIGKILL the process of a run in flight: `dg dev`'s code server starts each run
        in a process of its own (multiprocessing's spawn), with the stack's environment."""
        if (pid := self.find(b"spawn_main", "run in flight to kill")) is not None:
            os.kill(pid, signal.SIGKILL)

    def stop_a_run(self) -> None:
        """SIGSTOP a run's process: alive, its run STARTED, making no progress."""
        if (pid := self.find(b"spawn_main", "run in flight to stop")) is not None:
            os.kill(pid, signal.SIGSTOP)
            self.stopped.append(pid)

    def continue_runs(self) -> None:
        for pid in self.stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped.clear()

    def kill_the_daemon(self) -> None:
        """SIGKILL the Dagster daemon, as the OOM killer would."""
        if (pid := self.find(b"dagster._daemon", "Dagster daemon")) is not None:
            os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        self.continue_runs()
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


class Database:
    """The drill's PostgreSQL database, as its server's administrator acts on it."""

    def __init__(self, admin: Any, name: str) -> None:
        self.admin, self.name = admin, name

    def _end_sessions(self) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                 f" WHERE datname = '{self.name}' AND pid <> pg_backend_pid()")

    def read_only(self) -> None:
        """Every new session read-only (writes refused, as on a full disk), and every
        session ended so that each new one is."""
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {self.name} SET default_transaction_read_only = on")
        self._end_sessions()

    def writable(self) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {self.name} RESET default_transaction_read_only")
        self._end_sessions()

    def restart(self, proxy: Any, seconds: float) -> None:
        """As a restart looks to its clients: every session ended, and no connection
        taken for ``seconds``."""
        proxy.cut()
        self._end_sessions()
        threading.Timer(seconds, proxy.heal).start()


def wait_for(what: Callable[[], Any], seconds: float, every: float = 1.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(every)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="PostgreSQL (its database is made and dropped); default: SQLite")
    parser.add_argument("--period", type=float, default=60.0, help="seconds between a feed's items")
    parser.add_argument("--signal-minutes", type=float, default=5.0, help="how long a fault's signal is waited for")
    parser.add_argument("--recover-minutes", type=float, default=10.0,
                        help="how long the machine's own recovery is waited for, once the fault is removed")
    parser.add_argument("--only", help="comma-separated fault names (a prefix each)")
    parser.add_argument("--out", type=Path, help="the table as JSON")
    args = parser.parse_args()

    import sqlalchemy as sa

    from pipeline.storage import db, schema

    site = DrillSite(args.period)
    threading.Thread(target=site.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    admin, made, proxy = None, None, None
    with tempfile.TemporaryDirectory(prefix="fault-drill-") as tmp:
        state = Path(tmp)
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DAGSTER_HOME")}
        if args.database_url:
            made = f"fault_drill_{os.getpid()}_{int(time.time())}"  # unique: other runs share the server
            admin = sa.create_engine(db.parse_url(args.database_url), isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql(f"CREATE DATABASE {made}")
            from tests.fault_proxy import FaultProxy, postgres_upstream

            # The pipeline reaches its database through a proxy the drill can cut (phase 4).
            proxy = FaultProxy(postgres_upstream(args.database_url))
            env["DATABASE_URL"] = (db.parse_url(args.database_url).set(database=made, host="127.0.0.1", port=proxy.port,
                                                                        query={}).render_as_string(False))
        web_port = free_port()
        (state / "user-secret").write_text(USER_SECRET)
        env.update(
            PIPELINE_STATE_DIR=str(state), PIPELINE_WEB_PORT=str(web_port), PIPELINE_ALLOW_NETWORKS="127.0.0.1/32",
            PIPELINE_SENSOR_INTERVAL_SECONDS="10", PIPELINE_ALERT_LIMIT="1000000",
            # A stage whose runs stopped taking work is told once its oldest due work has
            # waited this long (the default, 60, is for fleets whose backlog swings).
            PIPELINE_FRESHNESS_MAX_MINUTES="3",
            PIPELINE_WEBSUB_CALLBACK_URL=f"http://127.0.0.1:{web_port}",
            PIPELINE_OPERATOR_ALERT_URL=f"{site.url}/operator", PIPELINE_OPERATOR_ALERT_SECRET=OPERATOR_SECRET)

        def cli(*words: str) -> str:
            return subprocess.run([sys.executable, "-m", "pipeline.cli", *words], cwd=ROOT, env=env, check=True,
                                  capture_output=True, text=True).stdout

        cli("db", "upgrade")
        for n in range(SOURCES):
            cli("sources", "add", f"{site.url}/feed/{n}", "--interval", "1", "--fixed")
        cli("users", "add", "drill", "--webhook", f"{site.url}/hook", "--secret-file", str(state / "user-secret"))
        cli("filters", "add", "drill", "--query", "drill")
        # The drill's own reads go to the database directly, never through the proxy it cuts.
        direct = db.parse_url(args.database_url).set(database=made) if args.database_url else None
        engine = db.create_engine(direct.render_as_string(False) if direct else f"sqlite:///{state / 'pipeline.db'}")

        def stored_since(feed: int, since: float) -> float | None:
            """When feed ``feed`` first had an item stored after ``since`` (a fetch that worked)."""
            t = schema.listings_raw
            with engine.connect() as conn:
                at = conn.execute(sa.select(sa.func.min(t.c.fetched_at)).where(
                    t.c.source_item_id.like(f"drill-{feed}-%"),
                    t.c.fetched_at > datetime.fromtimestamp(since, UTC))).scalar()
            return at.timestamp() if at is not None else None
        stack = Stack(state, env)
        started = time.time()
        rows: list[dict[str, Any]] = []
        try:
            if not wait_for(lambda: site.deliveries, 600, 2):
                raise SystemExit(f"no delivery within 10 minutes; see {state / 'dev-up.log'}")
            print(f"first delivery after {time.time() - started:.0f} s", flush=True)
            chosen = faults(site, cli, stack, proxy, Database(admin, made) if admin is not None else None)
            if args.only:
                chosen = [f for f in chosen if any(f.name.startswith(p) for p in args.only.split(","))]
            for phase in sorted({f.phase for f in chosen}):
                held = [f for f in chosen if f.phase == phase]
                rows += drill(held, site, stored_since, args.signal_minutes * 60, args.recover_minutes * 60)
                for row in rows[-len(held):]:
                    print(json.dumps(row), flush=True)
            time.sleep(2 * args.period)  # the last items have time to arrive
            with engine.connect() as conn:
                stored = {(int(s.split("-")[1]), int(s.split("-")[2])): at.timestamp() for s, at in conn.execute(
                    sa.select(schema.listings_raw.c.source_item_id, sa.func.min(schema.listings_raw.c.fetched_at))
                    .where(schema.listings_raw.c.source_item_id.like("drill-%"))
                    .group_by(schema.listings_raw.c.source_item_id))}
        finally:
            stack.stop()
            engine.dispose()
            site.stop()
            if proxy is not None:
                proxy.heal()
                proxy.close()
            if admin is not None:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {made} WITH (FORCE)")
                admin.dispose()
    for row in rows:
        items(row, site, stored)
    report(rows, args)


def drill(held: list[Fault], site: DrillSite, stored: Callable[[int, float], float | None], signal_seconds: float,
          recover_seconds: float) -> list[dict[str, Any]]:
    """Inject the faults ``held`` (at once), wait for each one's signal, remove them, wait
    for each one's recovery."""
    def first(predicate: Predicate, after: float) -> tuple[float, dict[str, Any]] | None:
        with site.lock:
            return next(((t, a) for t, a in site.alerts if t >= after and predicate(a)), None)

    def each(wanted: dict[str, Callable[[], Any]], seconds: float) -> dict[str, Any]:
        found: dict[str, Any] = {}
        deadline = time.monotonic() + seconds
        while len(found) < len(wanted) and time.monotonic() < deadline:
            for name, look in wanted.items():
                if name not in found and (got := look()):
                    found[name] = got
            time.sleep(1)
        return found

    at: dict[str, float] = {}  # each fault's own injection (one may wait for its state first)
    for fault in held:
        fault.inject()
        at[fault.name] = time.time()
        if fault.hold_seconds is not None:
            threading.Timer(fault.hold_seconds, fault.remove).start()
    longest = max((f.hold_seconds or 0) + signal_seconds if f.signal_after_hold else signal_seconds for f in held)
    signals = each({f.name: (lambda f=f: first(f.signal, at[f.name])) for f in held}, longest)
    removed: dict[str, float] = {}  # each fault's removal
    for fault in held:
        if fault.hold_seconds is None:
            fault.remove()
            removed[fault.name] = time.time()
        else:  # removed by its timer, however soon it was told: it holds its whole time
            time.sleep(max(0.0, at[fault.name] + fault.hold_seconds + 1 - time.time()))
            removed[fault.name] = at[fault.name] + fault.hold_seconds

    def back(fault: Fault) -> Callable[[], float | None]:
        since = removed[fault.name]
        if fault.recovered is not None:
            return lambda: (got[0] if (got := first(fault.recovered, since)) else None)
        if fault.feed is not None:  # its feed's items are stored again
            return lambda: stored(fault.feed, since)
        return lambda: min((t for t in site.deliveries if t > since), default=None)  # items reach the user again

    recoveries = each({f.name: back(f) for f in held}, recover_seconds)
    rows = []
    for fault in held:
        found = signals.get(fault.name)
        details = found[1]["details"] if found else {}
        rows.append({"fault": fault.name, "phase": fault.phase, "feed": fault.feed, "injected": at[fault.name],
                     "removed": removed[fault.name],
                     "signal": (f"{found[1]['event']} {details.get('check') or details.get('job') or details.get('instigator') or ''}"
                                .strip() if found else "none"),
                     "signal_after_s": round(found[0] - at[fault.name], 1) if found else None,
                     "recovered_after_s": (round(recoveries[fault.name] - removed[fault.name], 1)
                                           if fault.name in recoveries else None)})
    return rows


def items(row: dict[str, Any], site: DrillSite, stored: dict[tuple[int, int], float]) -> None:
    """The items ``row``'s fault held back: published while it held, stored by the end or not."""
    feeds = [row["feed"]] if row["feed"] is not None else list(range(SOURCES))
    held = [(n, k, when) for n in feeds for k, when in site.published(n, row["removed"]) if when >= row["injected"]]
    delays = sorted(stored[(n, k)] - when for n, k, when in held if (n, k) in stored)
    row["items_published"] = len(held)
    row["items_missed"] = len(held) - len(delays)
    row["items_p95_delay_s"] = round(delays[min(len(delays) - 1, round(0.95 * (len(delays) - 1)))], 1) if delays else None


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print("\n| fault | signal | after | recovered by itself after | items published / missed | p95 delay |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        after = f"{r['signal_after_s']:.0f} s" if r["signal_after_s"] is not None else f"none in {args.signal_minutes:g} min"
        back = f"{r['recovered_after_s']:.0f} s" if r["recovered_after_s"] is not None else "no"
        delay = f"{r['items_p95_delay_s']:.0f} s" if r["items_p95_delay_s"] is not None else "-"
        print(f"| {r['fault']} | {r['signal']} | {after} | {back} | {r['items_published']} / {r['items_missed']} |"
              f" {delay} |")
    if args.out:
        args.out.write_text(json.dumps({"when": datetime.now(UTC).isoformat(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

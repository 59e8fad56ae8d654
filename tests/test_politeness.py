"""Politeness in the claim: per-group limits hold across worker processes, waiting for a
group's room is never a failure, and a Retry-After defers the whole group. On PostgreSQL
and SQLite, against feeds served on 127.0.0.1 (one host: one group).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.core import politeness
from pipeline.fetching.politeness import SLOT_POLL_SECONDS, PoliteQueue
from pipeline.backends.mariadb import MARIADB
from pipeline.storage import db, politeness_groups, schema
from tests.conftest import conformance
from tests.helpers import add_source, now, wait_until
from tests.http_server import Handler, LocalServer
from tests.test_collector import collector, rows, rss

pytestmark = conformance


class Host:
    """A feed host that records when each request arrived and how many it served at once."""

    def __init__(self, server: LocalServer, answer_seconds: float,
                 hold_until: Callable[[], bool] | None = None) -> None:
        self.server = server
        self.answer_seconds = answer_seconds
        self.hold_until = hold_until  # answers wait until this state is reached once (60 s at most)
        self.arrivals: list[float] = []
        self.paths: list[str] = []
        self.active = 0
        self.peak = 0
        self._lock = threading.Lock()

    def route(self, h: Handler) -> None:
        with self._lock:
            self.arrivals.append(time.monotonic())
            self.paths.append(h.path)
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if (hold := self.hold_until) is not None:
                wait_until("the state the host holds its answers for", hold, timeout=60, every=0.05)
                self.hold_until = None  # reached: later answers do not wait
            time.sleep(self.answer_seconds)  # the feed's own latency
        finally:
            # Counted out before the answer leaves: the client cannot finish (and free its
            # claim) before this, so ``peak`` never counts a request that is already done.
            with self._lock:
                self.active -= 1
        guid = h.path.rsplit("/", 1)[-1]
        h.reply(200, rss([(guid, f"Item {guid}")]), {"Content-Type": "application/rss+xml"})

    def min_gap(self) -> float:
        times = sorted(self.arrivals)
        return min((b - a for a, b in itertools.pairwise(times)), default=float("inf"))


@pytest.fixture
def host_server():
    srv = LocalServer().start()
    yield srv
    srv.stop()


def add_feeds(engine: sa.Engine, server: LocalServer, host: Host, count: int) -> list[int]:
    ids = []
    with engine.begin() as conn:
        for i in range(count):
            path = f"/feeds/{i}"
            server.routes[path] = host.route
            ids.append(add_source(conn, server.url(path)))
    return ids


def record_group_claims(engine: sa.Engine) -> sa.Table:
    """Log, by trigger, the ``next_request_at`` each claim of a group sets.

    A claim hands out a group's source only when the database clock has reached the
    group's ``next_request_at`` and moves it to (its own clock + the spacing), so the
    values logged for consecutive claims are at least the spacing apart, by the
    database's clock, however busy the machine: the spacing rule itself, observed.
    """
    log = sa.Table(
        "test_group_claims", sa.MetaData(),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("grp", sa.Text()), sa.Column("next_request_at", schema.UTCDateTime()),
    )
    log.create(engine)
    body = "INSERT INTO test_group_claims (grp, next_request_at) VALUES (NEW.name, NEW.next_request_at)"
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(
                "CREATE FUNCTION test_log_group_claim() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN {body}; RETURN NULL; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER test_group_claims AFTER UPDATE OF claims ON politeness_groups "
                "FOR EACH ROW WHEN (NEW.claims <> OLD.claims) EXECUTE FUNCTION test_log_group_claim()"
            )
        elif engine.dialect.name in MARIADB:
            conn.exec_driver_sql(
                "CREATE TRIGGER test_group_claims AFTER UPDATE ON politeness_groups FOR EACH ROW"
                f" BEGIN IF NEW.claims <> OLD.claims THEN {body}; END IF; END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER test_group_claims AFTER UPDATE OF claims ON politeness_groups "
                f"FOR EACH ROW WHEN NEW.claims <> OLD.claims BEGIN {body}; END"
            )
    return log


def set_group(engine: sa.Engine, name: str, max_in_flight: int, interval: float) -> None:
    with engine.begin() as conn:
        politeness_groups.set_limits(conn, name, max_in_flight=max_in_flight, min_interval_seconds=interval)


@pytest.mark.slow
def test_a_hundred_sources_on_one_host_three_collectors_stay_within_the_groups_limits(engine, db_url, host_server):
    """Three collector processes contend for one group's room; the spacing alone makes
    it last at least 100 x 0.1 s. The host holds its answers until two collectors hold
    claims, so they share the work however slowly the processes start."""
    # Each feed answers in 0.45 s and the group allows 4 at once, 0.1 s apart: without
    # the cap, 0.45 / 0.1 = 4.5 would be in flight, so both limits bind in turn. Two
    # fetches at once per collector: the first cannot take all four places while the
    # host holds its answers, and three take six.
    def two_collectors_hold_claims() -> bool:
        s = schema.sources
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count(sa.distinct(s.c.claimed_by)))
                                .where(s.c.locked_until > now())).scalar_one() >= 2

    host = Host(host_server, answer_seconds=0.45, hold_until=two_collectors_hold_claims)
    ids = add_feeds(engine, host_server, host, 100)
    set_group(engine, "127.0.0.1", max_in_flight=4, interval=0.1)
    log = record_group_claims(engine)
    env = {
        **os.environ, "DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
        "PIPELINE_HTTP_TIMEOUT_SECONDS": "10", "PIPELINE_LEASE_SECONDS": "60",
    }
    collectors = [
        subprocess.Popen([sys.executable, "-m", "pipeline.cli", "collect", "--json", "--concurrency", "2"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [c.communicate(timeout=300) for c in collectors]
    assert all(c.returncode == 0 for c in collectors), [err for _, err in outputs]
    totals = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]

    assert sorted(host.paths) == sorted(f"/feeds/{i}" for i in range(100)), "every source fetched once"
    assert sum(t["claimed"] for t in totals) == 100 and sum(t["failed"] for t in totals) == 0, totals
    assert host.peak <= 4, f"{host.peak} requests in flight at the host; the group allows 4"
    # The spacing is kept between claims, by the database's clock: 100 claims, one source
    # each, every one at least 100 ms after the one before. A request leaves its worker
    # right after its claim, so the gaps the host sees are that spacing give or take how
    # long each worker took to send (a few ms idle, tens on a busy machine): printed, not
    # asserted, since no bound on a busy machine's scheduling is honest.
    with engine.connect() as conn:
        stamps = conn.execute(sa.select(log.c.next_request_at).order_by(log.c.seq)).scalars().all()
    assert len(stamps) == 100, f"{len(stamps)} group claims for 100 sources; one source per spaced claim"
    claim_gap = min(b - a for a, b in itertools.pairwise(stamps))
    print(f"100 sources, 3 collectors: claimed {[t['claimed'] for t in totals]},"
          f" peak in flight {host.peak}, smallest gap between claims {claim_gap.total_seconds() * 1000:.1f} ms"
          f" (database clock), between requests at the host {host.min_gap() * 1000:.1f} ms")
    assert claim_gap >= timedelta(milliseconds=100), f"two claims {claim_gap} apart; the group asks 100 ms"
    completed = [e for e in rows(engine, schema.ingestion_events) if e["event"] == "ingestion.completed"]
    assert sorted(e["source_id"] for e in completed) == sorted(ids)
    assert all(e["success"] for e in completed)
    assert sum(1 for t in totals if t["claimed"]) >= 2, "the collectors shared the work"


def test_waiting_for_the_groups_room_is_never_a_timeout(engine, host_server):
    """Waits about 6 s: the subject is time spent waiting for the group's room. Twenty-four
    sources on one host answering in 0.5 s, two at a time: the last ones wait 5.5 s for
    room, past the 5 s timeout, and none of them fails. Each request's own time leaves
    4.5 s of the timeout to a busy machine (it once left 1.5 s, and a loaded CI run
    timed one out)."""
    host = Host(host_server, answer_seconds=0.5)
    add_feeds(engine, host_server, host, 24)
    set_group(engine, "127.0.0.1", max_in_flight=2, interval=0)
    c = collector(engine)
    c.settings = type(c.settings)(database_url=str(engine.url), http_timeout_seconds=5.0,
                                  allow_networks=("127.0.0.1/32",))
    stats = c.run(concurrency=32)
    assert (stats.claimed, stats.succeeded, dict(stats.failed)) == (24, 24, {})
    assert sorted(host.paths) == sorted(f"/feeds/{i}" for i in range(24))
    assert host.peak == 2, "two at a time: the group's room, not the run's 16 threads"


def test_a_429_with_retry_after_defers_the_whole_group(engine, host_server):
    host = Host(host_server, answer_seconds=0)
    host_server.routes["/limited"] = lambda h: h.reply(429, b"slow down", {"Retry-After": "600"})
    with engine.begin() as conn:
        limited = add_source(conn, host_server.url("/limited"), priority=10)
    others = add_feeds(engine, host_server, host, 3)
    set_group(engine, "127.0.0.1", max_in_flight=1, interval=0)
    stats = collector(engine).run()
    assert (stats.claimed, dict(stats.failed)) == (1, {"rate_limited": 1})
    assert host.paths == [], "no other source of the host was fetched while it asked us to wait"
    [group] = [g for g in _groups(engine) if g["name"] == "127.0.0.1"]
    assert group["next_request_at"] > now() + timedelta(seconds=590)
    assert group["deferred_reason"] == f"HTTP 429 from source {limited}"
    due = {r["id"] for r in rows(engine, schema.sources) if r["next_fetch_at"] is None}
    assert due == set(others), "the others are still due, not failed"


def _groups(engine: sa.Engine) -> list[dict]:
    with engine.connect() as conn:
        return politeness_groups.list_groups(conn)


def test_a_claim_hands_out_no_more_than_a_group_has_room_for(engine):
    with engine.begin() as conn:
        a = [add_source(conn, f"http://a.example/{i}") for i in range(5)]
        b = [add_source(conn, f"http://b.example/{i}") for i in range(5)]
    set_group(engine, "a.example", max_in_flight=2, interval=0)
    set_group(engine, "b.example", max_in_flight=3, interval=0)
    queue = PoliteQueue(engine)
    first = queue.claim("w1", 10)
    assert sorted(first.ids) == sorted(a[:2] + b[:3])
    assert not queue.claim("w2", 10), "both groups are full"
    queue.complete(first, {"next_fetch_at": now() + timedelta(hours=1)}, ids=[a[0]])
    assert queue.claim("w2", 10).ids == [a[2]], "one slot of a.example came free"


def test_a_spaced_group_hands_out_one_source_per_interval(engine):
    with engine.begin() as conn:
        a = [add_source(conn, f"http://a.example/{i}") for i in range(3)]
        b = add_source(conn, "http://b.example/0")
    set_group(engine, "a.example", max_in_flight=10, interval=3600)
    set_group(engine, "b.example", max_in_flight=10, interval=0)
    queue = PoliteQueue(engine)
    assert sorted(queue.claim("w1", 10).ids) == sorted([a[0], b])
    assert not queue.claim("w2", 10), "a.example's next request is an hour away"
    [group] = [g for g in _groups(engine) if g["name"] == "a.example"]
    assert group["next_request_at"] > now() + timedelta(minutes=59)
    assert queue.next_start_in() > 3500


def test_sources_get_their_group_and_youtube_is_one_provider(engine):
    from pipeline.catalogue import sources

    with engine.begin() as conn:
        plain = sources.add_source(conn, sources.make_spec("https://Feeds.Example.com:8443/a.xml"))
        tube = sources.add_source(conn, sources.make_spec("UCabcdefghijklmnopqrstuv"))
        named = sources.add_source(conn, sources.make_spec("https://x.substack.com/feed",
                                                           politeness_group="Substack"))
    groups = {r["id"]: r["politeness_group"] for r in rows(engine, schema.sources)}
    assert groups == {plain: "feeds.example.com", tube: "youtube", named: "substack"}
    assert {"feeds.example.com", "youtube", "substack"} <= {g["name"] for g in _groups(engine)}


def test_workers_claiming_at_once_never_exceed_a_groups_room(engine):
    """Eight threads, each on its own connection, claim from one group allowing 3 at
    once, hold briefly and release, as fast as they can. After each claim the group's
    live leases are counted: never more than 3, whatever the interleaving."""
    with engine.begin() as conn:
        for i in range(40):
            add_source(conn, f"http://busy.example/{i}")
    set_group(engine, "busy.example", max_in_flight=3, interval=0)
    queue = PoliteQueue(engine, lease_seconds=60)
    t = schema.sources
    seen: list[int] = []
    claims = 0
    lock = threading.Lock()

    def leased_now() -> int:
        with engine.connect() as conn:
            return int(conn.execute(
                sa.select(sa.func.count()).select_from(t)
                .where(t.c.politeness_group == "busy.example", t.c.claim_token.is_not(None))
            ).scalar_one())

    def worker(n: int) -> None:
        nonlocal claims
        for _ in range(60):
            claim = queue.claim(f"w{n}", 2)
            if claim:
                count = leased_now()
                with lock:
                    seen.append(count)
                    claims += 1
                queue.release(claim)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"{claims} claims; leases seen at once: at most {max(seen)}")
    assert claims >= 20, "the workers did claim"
    assert max(seen) <= 3


@contextmanager
def claims_paused_after_their_snapshot(engine: sa.Engine) -> Iterator[tuple[sa.Engine, Callable[[], None]]]:
    """An engine whose claims stop after their statement's snapshot is taken and before
    they lock a group's row, until ``release`` is called: the moment another worker's
    claim can commit in between, made to happen every time.

    The pause is a row-level security policy on ``politeness_groups`` whose check waits
    for an advisory lock the test holds; it applies to a role of the test's own (the
    superuser the rest of the test uses bypasses it), and the claim first reads the
    group rows in its candidate scan, after its snapshot.
    """
    role = f"test_paused_{os.getpid()}"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN")
        conn.exec_driver_sql(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        conn.exec_driver_sql(
            "CREATE FUNCTION test_pause() RETURNS boolean LANGUAGE sql VOLATILE AS"
            " $$ SELECT pg_advisory_lock_shared(4242) IS NOT NULL AND pg_advisory_unlock_shared(4242) $$"
        )
        conn.exec_driver_sql("ALTER TABLE politeness_groups ENABLE ROW LEVEL SECURITY")
        conn.exec_driver_sql("CREATE POLICY test_pause ON politeness_groups USING (test_pause())")
    gate = engine.connect()
    gate.exec_driver_sql("SELECT pg_advisory_lock(4242)")
    paused = db.create_engine(engine.url.set(username=role).render_as_string(hide_password=False))
    try:
        yield paused, lambda: gate.exec_driver_sql("SELECT pg_advisory_unlock(4242)")
    finally:
        paused.dispose()
        gate.close()
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


def waiting_on_the_pause(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND wait_event = 'advisory'"
        ).scalar_one())


@pytest.mark.parametrize(("max_in_flight", "interval", "expected"), [(10, 0, 3), (4, 0, 1), (10, 3600, 0)])
def test_a_claim_that_raced_another_in_its_group_takes_the_room_left(pg_engine, max_in_flight, interval, expected):
    """Worker B's claim takes its snapshot; worker A's claim in the same group commits;
    then B locks the group's row. B's count of fetches in flight (its snapshot's) misses
    A's three: B must add them (never exceeding the group's limit), and must still take
    the room left, instead of coming back empty as if the group were full; A's spacing,
    set by A's later clock, still holds B off a spaced group."""
    with pg_engine.begin() as conn:
        for i in range(20):
            add_source(conn, f"http://race.example/{i}")
    set_group(pg_engine, "race.example", max_in_flight=max_in_flight, interval=interval)
    with claims_paused_after_their_snapshot(pg_engine) as (paused_engine, release):
        taken: list = []
        b = threading.Thread(target=lambda: taken.append(PoliteQueue(paused_engine).claim("b", 3)))
        b.start()
        try:
            wait_until("worker B's claim paused after its snapshot",
                       lambda: waiting_on_the_pause(pg_engine), timeout=60, every=0.05)
            first = PoliteQueue(pg_engine).claim("a", 3)
            assert len(first) == (1 if interval else 3)
        finally:
            release()
            b.join(timeout=60)
        [second] = taken
    assert len(second) == expected, f"B took {len(second)}, A {len(first)}, of {max_in_flight}"
    assert not set(first.ids) & set(second.ids)
    leased = [r for r in rows(pg_engine, schema.sources) if r["claim_token"] is not None]
    assert len(leased) == len(first) + expected <= max_in_flight


@conformance("mariadb", "sqlite")
def test_a_source_leased_between_the_pick_and_the_lease_spends_none_of_its_groups_room(engine, monkeypatch):
    """The step-by-step polite claim (MariaDB; SQLite's writers queue, so there it only
    shows the rule) picks sources, then leases those still free: a source another worker
    leased in between is not handed out, and neither spends the group's spacing nor adds
    to its claims. It once did both: three collectors on MariaDB logged 102 spaced claims
    of a group for 100 sources, each lost race holding the host back for nothing."""
    with engine.begin() as conn:
        add_source(conn, "http://race.example/0")
    set_group(engine, "race.example", max_in_flight=4, interval=60)
    g, s = schema.politeness_groups, schema.sources

    def group() -> tuple:
        with engine.connect() as conn:
            return conn.execute(sa.select(g.c.claims, g.c.next_request_at).where(g.c.name == "race.example")).one()

    before = group()
    take = PoliteQueue._take

    def leased_meanwhile(self, conn, ids, worker, token, params):
        if engine.dialect.name == "sqlite":  # the claim's transaction holds the only write lock
            conn.execute(sa.update(s).where(s.c.id.in_(ids)).values(
                locked_until=now() + timedelta(minutes=5), claimed_by="other", claim_token="other"))
        else:
            with engine.begin() as other:
                other.execute(sa.update(s).where(s.c.id.in_(ids)).values(
                    locked_until=now() + timedelta(minutes=5), claimed_by="other", claim_token="other"))
        return take(self, conn, ids, worker, token, params)

    monkeypatch.setattr(PoliteQueue, "_take", leased_meanwhile)
    assert not PoliteQueue(engine).claim("w", 1), "the source went to the other worker"
    assert group() == before, "no claim of the group was made"


def test_next_start_in_tells_a_lost_race_from_a_full_group(engine):
    """0 while a due source's group has a free slot (a claim that came back short lost
    a race for the group's row: look again at once); the slot poll while every slot is
    held by a fetch in flight; the spacing's wait; None when nothing is due."""
    with engine.begin() as conn:
        ids = [add_source(conn, f"http://full.example/{i}") for i in range(3)]
    set_group(engine, "full.example", max_in_flight=2, interval=0)
    queue = PoliteQueue(engine)
    assert queue.next_start_in() == 0, "a free slot"
    held = queue.claim("w1", 10)
    assert len(held) == 2
    assert queue.next_start_in() == SLOT_POLL_SECONDS, "both slots held by fetches in flight"
    set_group(engine, "full.example", max_in_flight=2, interval=3600)
    queue.complete(held, {"next_fetch_at": now() + timedelta(hours=1)}, ids=[ids[0]])
    assert queue.next_start_in() == 0, "a slot came free and the group's spacing has passed"
    with engine.begin() as conn:
        politeness_groups.defer(conn, "full.example", now() + timedelta(hours=1), "test")
    assert 3500 < queue.next_start_in() <= 3600, "the group is deferred for an hour"
    queue.complete(held, {"next_fetch_at": now() + timedelta(hours=1)}, ids=[ids[1]])
    with engine.begin() as conn:
        conn.execute(sa.update(schema.sources).values(next_fetch_at=now() + timedelta(hours=1)))
    assert queue.next_start_in() is None, "nothing is due"


def test_a_claim_writes_the_started_events_of_exactly_the_sources_it_hands_out(engine):
    """With ``record_started``, the claim itself (one statement on PostgreSQL, its own
    transaction elsewhere) writes one ``ingestion.started`` event per source it leases,
    with the run and the time the source was due; a claim that takes nothing writes none."""
    due_at = now() - timedelta(minutes=5)
    with engine.begin() as conn:
        ids = [add_source(conn, f"http://ev.example/{i}", next_fetch_at=due_at) for i in range(5)]
    set_group(engine, "ev.example", max_in_flight=3, interval=0)
    queue = PoliteQueue(engine, record_started=True, run_id="run-7")
    claim = queue.claim("w1", 10)
    assert len(claim) == 3
    assert not queue.claim("w2", 10), "the group is full"
    events = rows(engine, schema.ingestion_events)
    assert sorted(e["source_id"] for e in events) == sorted(claim.ids)
    assert {(e["event"], e["run_id"], e["source_type"]) for e in events} == {(schema.EVENT_STARTED, "run-7", "rss")}
    assert all(abs(e["scheduled_at"] - due_at) < timedelta(milliseconds=1) for e in events)
    assert set(claim.ids) <= set(ids)


def test_groups_by_registrable_domain_when_asked(engine, tmp_path, monkeypatch):
    from pipeline.catalogue import sources
    from pipeline.core.errors import ConfigError
    from pipeline.core.settings import Settings

    feeds = tmp_path / "feeds.yaml"
    feeds.write_text("- https://a.blog.example.co.uk/feed\n- https://b.blog.example.co.uk/feed\n"
                     "- {url: 'https://c.example.org/feed', group: Mine}\n")
    specs = sources.read_source_file(feeds, group_by="domain")
    assert [s.politeness_group for s in specs] == ["example.co.uk", "example.co.uk", "mine"]
    assert sources.make_spec("https://a.blog.example.co.uk/feed").politeness_group == "a.blog.example.co.uk"
    monkeypatch.setenv("PIPELINE_POLITENESS_GROUP_BY", "Domain")
    assert Settings.from_env().politeness_group_by == "domain"
    monkeypatch.setenv("PIPELINE_POLITENESS_GROUP_BY", "tld")
    with pytest.raises(ConfigError, match="PIPELINE_POLITENESS_GROUP_BY='tld': use one of host, domain"):
        Settings.from_env()


def test_a_loopback_host_is_the_operators_own_machine_and_is_not_spaced(engine):
    # 2,923 feeds served on 127.0.0.1 (the corpus check) took 49 minutes at the default
    # group's one fetch a second: there is nobody on loopback to be polite to.
    with engine.begin() as conn:
        politeness_groups.ensure_groups(conn, ["127.0.0.1", "::1", "localhost", "feeds.example.com"])
        groups = {g["name"]: g for g in politeness_groups.list_groups(conn)}
    for name in ("127.0.0.1", "::1", "localhost"):
        assert (groups[name]["max_in_flight"], groups[name]["min_interval_ms"]) == (
            politeness.LOOPBACK_MAX_IN_FLIGHT, 0), groups[name]
    default = groups["*"]
    assert (groups["feeds.example.com"]["max_in_flight"], groups["feeds.example.com"]["min_interval_ms"]) == (
        default["max_in_flight"], default["min_interval_ms"])
    with engine.begin() as conn:  # an operator's limits win, and a reset comes back here
        politeness_groups.set_limits(conn, "127.0.0.1", max_in_flight=2, min_interval_seconds=1)
        politeness_groups.set_limits(conn, "127.0.0.1", reset=True)
        again = {g["name"]: g for g in politeness_groups.list_groups(conn)}["127.0.0.1"]
    assert (again["max_in_flight"], again["min_interval_ms"]) == (politeness.LOOPBACK_MAX_IN_FLIGHT, 0)

"""Work that kills its worker ends; a lease lives while its work does; a write that
changes what a claimed row means fences its holder out. On PostgreSQL and SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import sqlalchemy as sa

from pipeline.catalogue import notifications, sources, users
from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor
from pipeline.notify.matching import FilterIndex
from pipeline.notify.notifier import NotifyStats
from pipeline.queue.claim import WorkQueue
from pipeline.storage import schema
from tests.conftest import conformance
from tests.helpers import add_source, expire_leases, now, wait_until
from tests.http_server import Handler
from tests.test_collector import collector, rows, rss, serve
from tests.test_notifier import add_listing, add_user, notifier, posts
from tests.test_processor import add_raw, listings, processor

pytestmark = conformance


def run_until_a_pass_survives(engine: sa.Engine, db_url: str, stage: str, table: sa.Table) -> list[int]:
    """Run ``stage`` passes whose handling of POISON kills the process, each once the
    last one's leases have run out (moved into the past), until one pass finishes; the
    exit codes seen."""
    env = {
        **os.environ, "DATABASE_URL": db_url, "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
        "PIPELINE_HTTP_TIMEOUT_SECONDS": "5",
        "PIPELINE_RAW_MAX_ATTEMPTS": "2", "PIPELINE_DELIVERY_MAX_ATTEMPTS": "2",
        "PIPELINE_SOURCE_MAX_ATTEMPTS": "2",
    }
    codes: list[int] = []
    while not codes or codes[-1] != 0:
        assert len(codes) < 8, f"the poison still kills every pass: exit codes {codes}"
        expire_leases(engine, table)  # the dead pass's
        done = subprocess.run([sys.executable, "-m", "tests.poison_worker", stage, "POISON"],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode in (0, 3), done.stderr
        codes.append(done.returncode)
    return codes


@pytest.mark.slow
def test_a_raw_row_that_kills_its_processor_is_given_up_and_spares_the_others(engine, db_url):
    """Processes: each pass is one, and the poison ends it as a crash would."""
    with engine.begin() as conn:
        source_id = add_source(conn)
        for item in ("good-0", "POISON", "good-1", "good-2", "good-3"):
            add_raw(conn, source_id, item, title=item)
    codes = run_until_a_pass_survives(engine, db_url, "process", schema.listings_raw)
    assert codes[0] == 3 and codes[-1] == 0
    raw = {r["source_item_id"]: r for r in rows(engine, schema.listings_raw)}
    poison = raw.pop("POISON")
    assert poison["processed_at"] is not None and poison["claim_token"] is None
    assert "gave up after 3 attempts: claimed 3 times without finishing" in poison["last_error"]
    assert set(listings(engine)) == {"good-0", "good-1", "good-2", "good-3"}
    # The batch the poison killed came back one row at a time: only the poison used up
    # its attempts (at most one lost to the batch's death, one to be done alone).
    assert all(r["attempts"] <= 2 and r["last_error"] is None for r in raw.values()), raw


@pytest.mark.slow
def test_a_notification_whose_send_kills_its_worker_ends_dead(engine, db_url, receiver):
    """Processes: each pass is one, and the poison ends it as a crash would."""
    with engine.begin() as conn:
        source_id = add_source(conn)
        add_user(conn, "alice", receiver.url("/hook"))
        users.add_filter(conn, "alice", "python")
        for item in ("ok-0", "POISON", "ok-1"):
            add_listing(conn, source_id, item, f"Python {item}")
    codes = run_until_a_pass_survives(engine, db_url, "notify", schema.notifications)
    assert codes[0] == 3 and codes[-1] == 0
    by_title = {}
    with engine.connect() as conn:
        n, t = schema.notifications, schema.listings
        for title, status, attempts, error in conn.execute(
            sa.select(t.c.title, n.c.status, n.c.attempts, n.c.last_error).join(t, t.c.id == n.c.listing_id)
        ):
            by_title[title] = (status, attempts, error)
    status, attempts, error = by_title.pop("Python POISON")
    assert (status, attempts) == ("dead", 3) and "no send finished" in error
    assert all(s == "sent" and a <= 2 for s, a, _ in by_title.values()), by_title
    assert not any("POISON" in p["body"].decode() for p in posts(receiver)), "never sent"


@pytest.mark.slow
def test_a_source_whose_fetch_kills_its_collector_fails_and_backs_off(engine, db_url, receiver):
    """Processes: each pass is one, and the poison ends it as a crash would."""
    for path in ("/ok-0", "/POISON", "/ok-1"):
        serve(receiver, path, rss([(path.strip("/"), "Item")]))
    with engine.begin() as conn:
        ids = {path: add_source(conn, receiver.url(path)) for path in ("/ok-0", "/POISON", "/ok-1")}
    codes = run_until_a_pass_survives(engine, db_url, "collect", schema.sources)
    assert codes[0] == 3 and codes[-1] == 0
    by_id = {r["id"]: r for r in rows(engine, schema.sources)}
    poison = by_id[ids["/POISON"]]
    assert (poison["last_failure_reason"], poison["consecutive_failures"], poison["attempts"]) == ("timeout", 1, 0)
    assert poison["next_fetch_at"] > now() and poison["claim_token"] is None
    for path in ("/ok-0", "/ok-1"):
        ok = by_id[ids[path]]
        assert ok["last_success_at"] is not None and ok["consecutive_failures"] == 0, ok


def test_any_error_while_processing_one_row_fails_that_row_only(engine, monkeypatch):
    import pipeline.listings.processor as processor_module

    real = processor_module.normalise

    def normalise(raw, **kwargs):
        if raw["title"] == "bug":
            raise RuntimeError("a normaliser bug")
        return real(raw, **kwargs)

    monkeypatch.setattr(processor_module, "normalise", normalise)
    with engine.begin() as conn:
        source_id = add_source(conn)
        for item in ("a", "bug", "b"):
            add_raw(conn, source_id, item, title=item)
    stats = processor(engine).run()
    assert (stats.claimed, stats.inserted, stats.failed) == (3, 2, 1)
    assert set(listings(engine)) == {"a", "b"}
    [bug] = [r for r in rows(engine, schema.listings_raw) if r["source_item_id"] == "bug"]
    assert bug["last_error"] == "unexpected RuntimeError: a normaliser bug" and bug["processed_at"] is None


def _change_while_matching(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, items: list[str]) -> list[int]:
    """While the matcher holds its first batch, new content for ``items`` is processed.
    Returns the sizes of the batches the matcher was given."""
    real = FilterIndex.matches
    batches: list[int] = []

    def matches(self, texts, **kwargs):
        texts = list(texts)
        batches.append(len(texts))
        if len(batches) == 1:
            with engine.begin() as conn:
                source_id = conn.execute(sa.select(schema.sources.c.id)).scalar_one()
                for item in items:
                    add_raw(conn, source_id, item, title=f"Rust {item}")
            assert Processor(engine, Settings(database_url=str(engine.url)), "p").run().updated == len(items)
        return real(self, texts, **kwargs)

    monkeypatch.setattr(FilterIndex, "matches", matches)
    return batches


def test_new_content_while_a_listing_is_matched_is_matched_again(engine, receiver, monkeypatch):
    with engine.begin() as conn:
        source_id = add_source(conn)
        add_user(conn, "alice", receiver.url("/hook"))
        users.add_filter(conn, "alice", "rust")
        add_raw(conn, source_id, "a", title="Python a")
    processor(engine).run()
    batches = _change_while_matching(engine, monkeypatch, ["a"])
    stats = notifier(engine).run()
    # The first pass over "a" read "Python a" and was fenced out by the change; the
    # listing was claimed afresh and its new content, "Rust a", matched alice.
    assert stats.fenced_out == 1 and batches == [1, 1]
    assert stats.notifications_created == 1 and stats.sent == 1
    [post] = posts(receiver)
    assert b"Rust a" in post["body"]


def test_the_matchers_cap_counts_rows_claimed_not_rows_matched(engine, receiver, monkeypatch):
    with engine.begin() as conn:
        source_id = add_source(conn)
        for item in ("a", "b", "c", "d", "e"):
            add_raw(conn, source_id, item, title=f"Python {item}")
    processor(engine).run()
    batches = _change_while_matching(engine, monkeypatch, ["a", "b", "c"])
    stats = NotifyStats()
    notifier(engine, lease_seconds=300).match(stats, max_listings=3)
    assert batches == [3], "the cap of 3 listings was spent on the first claim"
    assert stats.fenced_out == 3 and stats.listings_matched == 0


def test_a_refresh_fences_out_the_fetch_in_flight(engine):
    with engine.begin() as conn:
        source_id = add_source(conn)
    queue = WorkQueue(engine, schema.SOURCES_DUE)
    in_flight = queue.claim("slow-collector", 1)
    with engine.begin() as conn:
        sources.refresh_source(conn, source_id)
    late = queue.complete(in_flight, {"next_fetch_at": now()})
    assert late.lost == [source_id], "the fetch that began before the refresh is not recorded"
    [row] = rows(engine, schema.sources)
    assert row["next_fetch_at"] is None, "the refresh stands: due now"
    assert queue.claim("next-collector", 1).ids == [source_id]


def test_a_requeue_fences_out_the_send_in_flight(engine, receiver):
    with engine.begin() as conn:
        source_id = add_source(conn)
        add_user(conn, "alice", receiver.url("/hook"))
        users.add_filter(conn, "alice", "python")
        add_listing(conn, source_id, "a", "Python")
    notifier(engine).match(NotifyStats())
    queue = WorkQueue(engine, schema.NOTIFICATIONS_DUE)
    in_flight = queue.claim("slow-sender", 1)
    with engine.begin() as conn:
        assert notifications.requeue_notifications(conn, ids=in_flight.ids) == 1
    late = queue.complete(in_flight, {"status": "dead", "last_error": "an old outcome"})
    assert late.lost == in_flight.ids
    [row] = rows(engine, schema.notifications)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 0, None)


def test_a_fetch_that_outlives_its_lease_keeps_it_while_it_runs(engine, receiver):
    """Waits for the heartbeat to extend a 3 s lease twice while the fetch runs: the
    extension is the product's timer, and what is tested is that it keeps the lease."""
    release = threading.Event()

    def slow(h: Handler) -> None:
        release.wait(120)
        h.reply(200, rss([("a", "A")]), {"Content-Type": "application/rss+xml"})

    receiver.routes["/slow"] = slow
    with engine.begin() as conn:
        source_id = add_source(conn, receiver.url("/slow"))
    c = collector(engine)
    c.settings = Settings(database_url=str(engine.url), http_timeout_seconds=60.0,
                          allow_networks=("127.0.0.1/32",), lease_seconds=3)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(c.run()))
    worker.start()
    other = WorkQueue(engine, schema.SOURCES_DUE, lease_seconds=3)
    try:
        wait_until("the fetch to reach the receiver", lambda: receiver.requests, timeout=60, every=0.1)
        first = rows(engine, schema.sources)[0]["locked_until"]
        extended: list = []

        def extended_twice() -> bool:
            # Meanwhile another worker looks for due work: it must never get this source.
            assert not other.claim("other-worker", 10), "a live fetch was taken over"
            extended.append(rows(engine, schema.sources)[0]["locked_until"])
            return len({stamp for stamp in extended if stamp > first}) >= 2

        # Two extensions past the first lease: the fetch has outlived it, and kept it.
        wait_until("the lease to be extended twice", extended_twice, timeout=60, every=0.2)
    finally:
        release.set()
        worker.join(60)
    [stats] = result
    assert (stats.claimed, stats.succeeded, stats.fenced_out) == (1, 1, 0)
    [row] = rows(engine, schema.sources)
    assert row["id"] == source_id and row["locked_until"] is None and row["last_success_at"]
    started = [e for e in rows(engine, schema.ingestion_events) if e["event"] == "ingestion.started"]
    assert len(started) == 1


def test_a_lease_outlives_a_database_outage_shorter_than_it(pg_databases, caplog):
    """A heartbeat whose extensions fail (the database's sessions ended and refused, as a
    restart or a cut looks to a client) tries again within seconds once it is back: the
    rows it holds are still its own. It waited a whole beat (a third of the lease)
    instead, so two failed beats lost the lease. Each failed beat is one line with the
    database's reason: with its traceback, a worker printed 465 lines of stderr at a
    restart before the one line it ends with. A database of its own (it refuses
    sessions for a while); sessions are allowed again once two extensions have failed:
    a state, not a moment."""
    from pipeline.queue.heartbeat import Heartbeat
    from pipeline.storage import db

    name = pg_databases.migrated()
    engine = db.create_engine(pg_databases.url(name))

    def sessions(allowed: bool) -> None:
        with pg_databases.admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(allowed).lower()}")
            if not allowed:
                conn.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")

    try:
        with engine.begin() as conn:
            add_source(conn)
        queue = WorkQueue(engine, schema.SOURCES_DUE, lease_seconds=9)  # a beat every 3 s
        claim = queue.claim("w", 1)
        assert claim
        sessions(allowed=False)
        with Heartbeat(queue) as heartbeat:
            heartbeat.hold(claim)
            try:
                wait_until("two extensions to fail", lambda: heartbeat.failures >= 2, timeout=60, every=0.05)
            finally:
                sessions(allowed=True)
            wait_until("an extension to get through", lambda: heartbeat.beats > 0, timeout=60, every=0.05)
        # An extension, unlike a completion, finds a lease that ran out (nobody has
        # claimed the row since, but it may already be counted as free).
        assert queue.extend(claim).done == claim.ids, "the lease was lost to a short outage"
        failed = [r for r in caplog.records if r.name == "pipeline.queue.heartbeat"]
        assert len(failed) >= 2 and all(r.exc_info is None and "\n" not in r.getMessage() for r in failed)
        assert "lease extension of sources rows failed: the database cannot be reached:" in failed[0].getMessage()
    finally:
        engine.dispose()
        pg_databases.drop(name)


def test_stale_leases_are_judged_by_the_database_clock(pg_engine):
    """A host whose clock runs an hour ahead of the database must not call a running
    lease stale. The database's clock is made an hour behind this host's for the
    connection (a now() of its own, first on the search path)."""
    from datetime import timedelta

    from pipeline.storage import health

    with pg_engine.begin() as conn:
        source_id = add_source(conn)
        conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source_id).values(
            locked_until=now() - timedelta(minutes=30), claimed_by="w", claim_token="t"))
        conn.exec_driver_sql("CREATE SCHEMA skewed")
        conn.exec_driver_sql(
            "CREATE FUNCTION skewed.now() RETURNS timestamptz LANGUAGE sql"
            " AS $$ SELECT pg_catalog.now() - interval '1 hour' $$"
        )
    with pg_engine.connect() as conn:
        conn.exec_driver_sql("SET search_path = skewed, pg_catalog, public")
        assert conn.exec_driver_sql("SELECT now() < pg_catalog.now()").scalar(), "the skew is in place"
        counts = health.stale_leases(conn, (schema.SOURCES_DUE,), timedelta(minutes=10))
    # By the database's clock the lease runs for another half hour: not stale.
    assert counts == {"sources.due": 0}

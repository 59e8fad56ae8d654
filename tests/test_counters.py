"""The counters of work done (pipeline/storage/counters.py): exact across processes,
nothing for a transaction that rolled back, never falling when retention purges the
telemetry, and in `pipeline metrics` after a real pass of the pipeline."""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor
from pipeline.storage import counters, schema, upkeep
from tests.claim_workers import count
from tests.conftest import conformance
from tests.helpers import (
    add_source,
    holding_session,
    lock_waiters,
    now,
    wait_until,
    worker_processes,
)
from tests.test_cli import run
from tests.test_collector import collector, rss, serve
from tests.test_metrics import samples
from tests.test_notifier import SECRET, notifier


@conformance
def test_processes_adding_at_once_count_exactly_and_a_rollback_counts_nothing(engine, db_url):
    processes, each = 4, 150
    with ProcessPoolExecutor(max_workers=processes, mp_context=worker_processes()) as pool:
        committed = sum(pool.map(count, [db_url] * processes, [each] * processes))
    assert committed == processes * (each - each // 5)
    with engine.connect() as conn:
        found = counters.totals(conn)
        shards = conn.execute(sa.select(sa.func.count()).select_from(schema.metric_counts)).scalar_one()
    assert found[(counters.SOURCES_CLAIMED.name, "")] == committed
    assert found[(counters.FETCH_DURATION.bucket_series, "0.5")] == committed  # 0.3 s: the 0.5 bucket
    assert abs(found[(counters.FETCH_DURATION.sum_series, "")] - 0.3 * committed) < 1e-6
    assert shards <= 3 * counters.SHARDS, "three series, each in at most SHARDS rows"


@conformance
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
def test_two_adds_waiting_on_a_third_that_rolls_back_both_count(backend, engine, monkeypatch):
    """Three transactions add to the same shard of a series never counted before: the
    first holds its add while the other two, on connections of their own, line up behind
    it (the test waits for that state), then rolls back. On MariaDB the two deadlocked
    when the first add had inserted the shard's row (seen in CI); both must commit."""
    monkeypatch.setattr(counters.random, "randrange", lambda n: 3)
    counts = {(counters.SOURCES_CLAIMED.name, ""): 1.0}

    def add() -> None:
        with engine.begin() as conn:
            counters.add(conn, counts)

    with engine.connect() as first, ThreadPoolExecutor(max_workers=2) as pool:
        holder = holding_session(first)
        counters.add(first, counts)
        waiters = [pool.submit(add) for _ in range(2)]
        wait_until("two adds waiting on the first", lambda: lock_waiters(engine, on=holder) == 2, 120, every=0.2)
        first.rollback()
        for waiter in waiters:
            waiter.result(timeout=120)
    with engine.connect() as conn:
        assert counters.totals(conn)[(counters.SOURCES_CLAIMED.name, "")] == 2


@conformance
def test_a_pass_of_the_pipeline_is_counted_and_a_purge_takes_nothing_away(engine, db_url, receiver):
    serve(receiver, "/good", rss([("a", "Python jobs"), ("b", "Rust jobs")]))
    receiver.routes["/broken"] = lambda h: h.reply(500, b"down")
    receiver.routes["/gone"] = lambda h: h.reply(404, b"no")
    receiver.routes["/hook"] = lambda h: h.reply(200)
    with engine.begin() as conn:
        for path in ("/good", "/broken", "/gone"):
            add_source(conn, receiver.url(path))
        users.add_user(conn, "alice", webhook=receiver.url("/hook"), secret=SECRET)
        users.add_filter(conn, "alice", "jobs")
    collected = collector(engine).run()
    assert collected.claimed == 3
    settings = Settings(database_url=db_url, allow_networks=("127.0.0.1/32",))
    processed = Processor(engine, settings, "test-processor").run()
    assert processed.inserted == 2
    with engine.begin() as conn:  # the filter is older than the listings it should match
        conn.execute(sa.update(schema.filters).values(created_at=now() - timedelta(days=1)))
    delivered = notifier(engine).run()
    assert delivered.sent == 2

    def metrics() -> dict:
        result = run("metrics", env={"DATABASE_URL": db_url})
        assert result.returncode == 0, result.stderr
        return samples(result.stdout)

    before = metrics()
    expected = {
        ("pipeline_sources_claimed_total", ()): 3,
        ("pipeline_sources_fetched_total", (("result", "new_items"),)): 1,
        ("pipeline_sources_fetched_total", (("result", "failed"),)): 2,
        ("pipeline_sources_fetched_total", (("result", "not_modified"),)): 0,
        ("pipeline_sources_fetch_errors_total", (("reason", "http_5xx"),)): 1,
        ("pipeline_sources_fetch_errors_total", (("reason", "http_4xx"),)): 1,
        ("pipeline_sources_fetch_errors_total", (("reason", "timeout"),)): 0,
        ("pipeline_sources_fetch_duration_seconds_count", ()): 3,
        ("pipeline_sources_fetch_duration_seconds_bucket", (("le", "+Inf"),)): 3,
        ("pipeline_items_stored_total", ()): 2,
        ("pipeline_raw_rows_processed_total", (("outcome", "inserted"),)): 2,
        ("pipeline_raw_rows_processed_total", (("outcome", "gave_up"),)): 0,
        ("pipeline_listings_matched_total", ()): 2,
        ("pipeline_notifications_created_total", ()): 2,
        ("pipeline_notification_deliveries_total", (("outcome", "sent"),)): 2,
        ("pipeline_notification_deliveries_total", (("outcome", "dead"),)): 0,
        ("pipeline_notification_delivery_latency_seconds_count", ()): 2,
        ("pipeline_notification_delivery_latency_seconds_bucket", (("le", "+Inf"),)): 2,
    }
    assert {key: before.get(key) for key in expected} == expected
    assert before[("pipeline_sources_fetch_duration_seconds_sum", ())] > 0
    # Retention deletes the telemetry and the processed raw rows; the counts stay.
    purged = upkeep.purge(engine, settings, now=now() + timedelta(days=10_000))
    assert purged.events == 6 and purged.raw_rows == 2
    after = metrics()
    assert {key: after.get(key) for key in expected} == expected

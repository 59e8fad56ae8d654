"""Many worker processes, each with its own connection, drain one queue: no row twice."""

from __future__ import annotations

import collections
from concurrent.futures import ProcessPoolExecutor

import pytest
import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.core.kinds import NotificationStatus
from pipeline.storage import counters, schema
from tests.claim_workers import drain, match_alerts
from tests.conftest import conformance
from tests.helpers import (
    add_raw_rows,
    add_source,
    holding_session,
    lock_waiters,
    wait_until,
    worker_processes,
)
from tests.test_notifier import add_listing, add_user

pytestmark = [pytest.mark.slow, conformance]


def run_workers(url: str, processes: int, max_batch: int, strategy: str | None = None):
    context = worker_processes()
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        gate = manager.Barrier(processes)  # every process imported and connected before any claims
        held = manager.Barrier(processes)  # every first claim made while the others hold theirs
        futures = [
            pool.submit(drain, url, strategy, f"worker-{i}", max_batch, gate, seed=i, held=held)
            for i in range(processes)
        ]
        return [f.result(timeout=600) for f in futures]


def assert_claimed_exactly_once(engine: sa.Engine, ids: list[int], logs) -> None:
    claimed = collections.Counter()
    for log in logs:
        for limit, batch, lost in log:
            assert len(batch) <= limit, f"a claim of limit {limit} returned {len(batch)} rows"
            assert not lost, "no lease expired in this test, so nothing may be fenced"
            claimed.update(batch)
    twice = [row_id for row_id, n in claimed.items() if n > 1]
    assert not twice, f"{len(twice)} rows were claimed more than once, e.g. {twice[:10]}"
    assert set(claimed) == set(ids), "every row is claimed"
    # Every worker's first claim ran while all the others held theirs (drain's ``held``),
    # and there were rows for all: a claim that came back empty stopped its worker early.
    idle = [i for i, log in enumerate(logs) if not log]
    assert not idle, f"workers {idle} found no work while rows were left"
    t = schema.listings_raw
    with engine.connect() as conn:
        left = conn.execute(
            sa.select(sa.func.count()).where(t.c.processed_at.is_(None))
        ).scalar_one()
        held = conn.execute(
            sa.select(sa.func.count()).where(t.c.locked_until.is_not(None))
        ).scalar_one()
    assert (left, held) == (0, 0)


def test_eight_processes_drain_20000_rows_each_claimed_once(engine, db_url):
    """Processes: eight workers, each with its own connection, as on several machines."""
    with engine.begin() as conn:
        ids = add_raw_rows(conn, add_source(conn), 20_000)
    logs = run_workers(db_url, processes=8, max_batch=50)
    assert_claimed_exactly_once(engine, ids, logs)


def test_portable_strategy_under_contention(pg_engine):
    """The 1+N fallback for other dialects, checked on PostgreSQL's row locking, by eight
    worker processes."""
    url = pg_engine.url.render_as_string(hide_password=False)
    with pg_engine.begin() as conn:
        ids = add_raw_rows(conn, add_source(conn), 3_000)
    logs = run_workers(url, processes=8, max_batch=20, strategy="portable")
    assert_claimed_exactly_once(pg_engine, ids, logs)


@pytest.mark.parametrize("backend", ["mariadb"], indirect=True)
def test_notifications_claimed_a_few_at_a_time_never_fail_on_mariadb(engine, db_url):
    """Due notifications (pending or failed: two ranges of the queue's index, so MariaDB
    sorts what its locking read found, and holds every row it locked, not only those it
    returns) claimed a few at a time by many processes: InnoDB finds the claims' locks in
    a cycle and kills one with a deadlock error (seen in the three-notifier test), which
    must not reach the worker: the claim is tried again."""
    from pipeline.catalogue import users

    with engine.begin() as conn:
        source = add_source(conn)
        user = users.add_user(conn, "u", webhook="http://127.0.0.1:9/hook", secret="s" * 20).id
        listing_ids = conn.execute(sa.insert(schema.listings).returning(schema.listings.c.id), [
            {"source_id": source, "source_item_id": f"i{i}", "url": f"http://127.0.0.1/{i}",
             "content_hash": str(i)} for i in range(3_000)]).scalars().all()
        ids = conn.execute(sa.insert(schema.notifications).returning(schema.notifications.c.id), [
            {"user_id": user, "listing_id": listing, "cluster_id": listing, "channel": "webhook",
             "status": "failed" if listing % 3 == 0 else "pending"} for listing in listing_ids]).scalars().all()
    context = worker_processes()
    with context.Manager() as manager, ProcessPoolExecutor(max_workers=8, mp_context=context) as pool:
        gate = manager.Barrier(8)
        futures = [pool.submit(drain, db_url, None, f"worker-{i}", 4, gate, seed=i, notifications=True)
                   for i in range(8)]
        logs = [f.result(timeout=600) for f in futures]
    claimed = collections.Counter(row for log in logs for _, batch, _ in log for row in batch)
    assert set(claimed) == set(ids) and max(claimed.values()) == 1


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
def test_a_users_alert_limit_holds_across_notifier_processes(backend, engine, db_url):
    """Processes: three notifiers, each with its own connection, match one user's 90
    new listings at once, a batch the size of the limit each. The test holds the
    matched-listings counter every notifier adds to last in its transaction
    (pipeline/storage/counters.py), so all three have counted the user's alerts and
    written theirs before any commits: the user hears 20 one by one in the window, not
    20 per process (an end-to-end run told 60), and the other 70 wait for the summary,
    none lost. (SQLite begins every transaction IMMEDIATE: one writer at a time.)"""
    limit, processes = 20, 3
    with engine.begin() as conn:
        source = add_source(conn)
        add_user(conn, "alice", "http://127.0.0.1:9/hook")
        users.add_filter(conn, "alice", "python")
        for i in range(90):
            add_listing(conn, source, f"job-{i}", f"Python developer {i}")
        m = schema.metric_counts
        conn.execute(sa.insert(m), [{"name": counters.LISTINGS_MATCHED.name, "label": "", "shard": shard, "value": 0.0}
                                    for shard in range(counters.SHARDS)])
    context = worker_processes()
    with (engine.connect() as holder, context.Manager() as manager,
          ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool):
        holding_session(holder)
        holder.execute(sa.select(m.c.shard).where(m.c.name == counters.LISTINGS_MATCHED.name).with_for_update()).all()
        gate = manager.Barrier(processes)
        futures = [pool.submit(match_alerts, db_url, f"notifier-{i}", limit, limit, gate) for i in range(processes)]
        wait_until("every notifier waiting", lambda: lock_waiters(engine) == processes, 120, every=0.2)
        holder.rollback()
        created = sum(f.result(timeout=600) for f in futures)
    n = schema.notifications
    with engine.connect() as conn:
        by_status = dict(conn.execute(sa.select(n.c.status, sa.func.count()).group_by(n.c.status)).all())
    assert created == 90 and sum(by_status.values()) == 90, by_status
    assert by_status.get(NotificationStatus.PENDING, 0) == limit, by_status
    assert by_status.get(NotificationStatus.HELD, 0) == 90 - limit, by_status

"""The claim primitive's contract, on PostgreSQL, SQLite and MariaDB, for every claim strategy."""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.backends import claiming_for
from pipeline.backends.claim_postgresql import PostgreSQLClaim, dollar_placeholders
from pipeline.backends.claiming import PortableClaim
from pipeline.fetching.politeness import PoliteQueue
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import UNCLAIMED, RowCompletion
from pipeline.storage import db, schema
from tests.conftest import conformance
from tests.helpers import (
    add_raw_rows,
    add_source,
    expire_leases,
    free_port,
    now,
    raw_states,
    round_trips,
    wire_messages,
)

pytestmark = conformance

# Every test runs on each database, with the database's own strategy and with the
# portable default that any other SQLAlchemy dialect would get.
STRATEGIES = ("native", "portable")


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest, engine: sa.Engine) -> type[PortableClaim]:
    if request.param == "portable":
        return PortableClaim
    return claiming_for(engine)


def raw_queue(engine: sa.Engine, strategy: type[PortableClaim], lease_seconds: int = 300) -> WorkQueue:
    return WorkQueue(engine, schema.RAW_UNPROCESSED, lease_seconds=lease_seconds, claiming=strategy)


@pytest.fixture
def source_id(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return add_source(conn)


def test_claim_returns_rows_in_post_claim_state(engine, strategy, source_id):
    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 5)
    queue = raw_queue(engine, strategy)
    before = now()
    claim = queue.claim("worker-a", 3)
    assert len(claim) == 3
    for row in claim.rows:
        assert row["claimed_by"] == "worker-a"
        assert row["claim_token"] == claim.token
        assert row["locked_until"] > before + timedelta(seconds=290)


def test_order_is_honoured_and_limit_never_exceeded(engine, strategy, source_id):
    start = now() - timedelta(hours=1)
    with engine.begin() as conn:
        # Inserted newest first, so insertion order and id order disagree with fetched_at.
        ids = add_raw_rows(conn, source_id, 25, start=start + timedelta(minutes=25),
                           step=-timedelta(minutes=1))
    expected = list(reversed(ids))  # oldest fetched_at first
    queue = raw_queue(engine, strategy)
    taken: list[int] = []
    for limit in (1, 7, 3, 100):
        claim = queue.claim("w", limit)
        assert len(claim) <= limit
        taken.extend(claim.ids)
    assert taken == expected


def test_sources_are_claimed_by_priority_then_next_fetch_at_nulls_first(engine, strategy):
    t0 = now() - timedelta(minutes=5)  # all due within one aging step: priority alone orders
    with engine.begin() as conn:
        late = add_source(conn, "http://127.0.0.1/late", next_fetch_at=t0 + timedelta(minutes=4))
        early = add_source(conn, "http://127.0.0.1/early", next_fetch_at=t0)
        never = add_source(conn, "http://127.0.0.1/never")  # NULL: due now, first
        urgent = add_source(conn, "http://127.0.0.1/urgent", priority=5, next_fetch_at=t0)
        add_source(conn, "http://127.0.0.1/future", next_fetch_at=now() + timedelta(hours=1))
        add_source(conn, "http://127.0.0.1/off", enabled=False)
    queue = WorkQueue(engine, schema.SOURCES_DUE, claiming=strategy)
    # One at a time, and all at once: both follow the design's order.
    assert [queue.claim("w", 1).ids[0] for _ in range(2)] == [urgent, never]
    assert queue.claim("w", 10).ids == [early, late]
    assert not queue.claim("w", 10), "future and disabled sources are not due"


@pytest.mark.parametrize("polite", [False, True], ids=["plain", "polite"])
def test_a_source_due_longer_rises_one_priority_level_per_aging_step(engine, strategy, polite):
    """Aging (schema.PRIORITY_AGING_MINUTES): a priority-0 source due for 2.5 steps ranks
    as priority 2, so it goes before a priority-2 source just due (the tie goes to the
    older due time) and after a priority-3 one."""
    step = timedelta(minutes=schema.PRIORITY_AGING_MINUTES)
    due = {"waited": now() - 2.5 * step, "two": now() - timedelta(seconds=30),
           "three": now() - timedelta(seconds=30), "fresh": None}  # never fetched: due now, not aged
    priority = {"waited": 0, "two": 2, "three": 3, "fresh": 1}
    with engine.begin() as conn:
        ids = {name: add_source(conn, f"http://127.0.0.{i}/{name}", priority=priority[name], next_fetch_at=when)
               for i, (name, when) in enumerate(due.items(), start=1)}
        # Each source is its own politeness group; no spacing, so one claim can take all four.
        conn.execute(sa.update(schema.politeness_groups).values(min_interval_ms=0))
    expected = [ids["three"], ids["waited"], ids["two"], ids["fresh"]]
    queue = PoliteQueue(engine, claiming=strategy) if polite else WorkQueue(engine, schema.SOURCES_DUE, claiming=strategy)
    assert [queue.claim("w", 1).ids[0] for _ in range(4)] == expected
    with engine.begin() as conn:
        for name, source_id in ids.items():
            conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source_id)
                         .values(**UNCLAIMED, next_fetch_at=due[name]))
    assert queue.claim("w", 4).ids == expected, "one claim of four orders them alike"


@pytest.mark.parametrize("polite", [False, True], ids=["plain", "polite"])
def test_claims_take_due_sources_in_the_aged_order_across_many_levels(engine, strategy, polite):
    """PostgreSQL reads the due sources a priority level at a time and merges the levels
    (pipeline/queue/claim.py ``_free_by_level``); every database must hand them out in
    the order of sorting them all by aged priority (``QueueSpec.sort``). 120 sources over
    five levels, due 0-5 aging steps ago (mid-step, so no clock puts one across a step's
    edge) or never: claims of 7 take them in that order."""
    import random

    rng = random.Random(36)
    step = timedelta(minutes=schema.PRIORITY_AGING_MINUTES)
    t0 = now()
    with engine.begin() as conn:
        ids = [add_source(conn, f"http://127.0.0.{1 + i % 50}/{i}", priority=rng.choice([-2, 0, 0, 1, 4]),
                          next_fetch_at=None if i % 9 == 0 else t0 - step * (rng.randrange(6) + 0.2 + 0.6 * rng.random()))
               for i in range(120)]
        conn.execute(sa.update(schema.politeness_groups).values(min_interval_ms=0, max_in_flight=1000))
        found = conn.execute(sa.select(schema.sources).where(schema.sources.c.id.in_(ids))).mappings().all()
    expected = [row["id"] for row in schema.SOURCES_DUE.sort(found)]
    queue = PoliteQueue(engine, claiming=strategy) if polite else WorkQueue(engine, schema.SOURCES_DUE, claiming=strategy)
    taken: list[int] = []
    while claim := queue.claim("w", 7):
        taken.extend(claim.ids)
    assert taken == expected


def test_criteria_are_rechecked_at_claim_time(engine, strategy, source_id):
    """A leased row that meanwhile left the queue is not claimed when its lease expires."""
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 3)
    queue = raw_queue(engine, strategy)
    first = queue.claim("a", 3)
    with engine.begin() as conn:  # someone else finishes row 0 (say, an operator)
        conn.execute(
            sa.update(schema.listings_raw)
            .where(schema.listings_raw.c.id == ids[0])
            .values(processed_at=now())
        )
    expire_leases(engine, schema.listings_raw)
    second = queue.claim("b", 10)
    assert second.ids == ids[1:]
    assert first.token != second.token


def test_release_makes_rows_claimable_at_once(engine, strategy, source_id):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 4)
    queue = raw_queue(engine, strategy)
    claim = queue.claim("a", 4)
    assert not queue.claim("b", 4), "leased rows are not claimable"
    released = queue.release(claim, ids=ids[:2])
    assert released.done == ids[:2] and not released.lost
    assert queue.claim("b", 4).ids == ids[:2]


def test_release_can_write_values(engine, strategy, source_id):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 1)
    queue = raw_queue(engine, strategy)
    claim = queue.claim("a", 1)
    queue.release(claim, {"attempts": 1, "last_error": "boom"})
    with engine.connect() as conn:
        row = raw_states(conn, ids)[ids[0]]
    assert (row["attempts"], row["last_error"], row["claim_token"]) == (1, "boom", None)


def test_expired_lease_is_claimed_again_and_late_completion_is_fenced(
    engine, strategy, source_id, caplog
):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 3)
    queue = raw_queue(engine, strategy)
    stale = queue.claim("slow-worker", 3)
    expire_leases(engine, schema.listings_raw)
    fresh = queue.claim("other-worker", 3)
    assert fresh.ids == ids, "expired leases are claimable again"

    with caplog.at_level(logging.WARNING, logger="pipeline.queue.claim"):
        late = queue.complete(stale, {"processed_at": now()})
        extended = queue.extend(stale)
        released = queue.release(stale)
    assert late.done == [] and late.lost == ids
    assert extended.lost == ids and released.lost == ids
    assert "completion of 3 unprocessed row(s) by slow-worker changed nothing" in caplog.text

    with engine.connect() as conn:
        states = raw_states(conn, ids)
    for row in states.values():
        assert row["processed_at"] is None, "the late completion changed nothing"
        assert (row["claimed_by"], row["claim_token"]) == ("other-worker", fresh.token)

    done = queue.complete(fresh, {"processed_at": now()})
    assert done.done == ids and not done.lost


def test_late_completion_is_accepted_when_nobody_reclaimed(engine, strategy, source_id):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 2)
    queue = raw_queue(engine, strategy)
    claim = queue.claim("a", 2)
    expire_leases(engine, schema.listings_raw)
    assert queue.complete(claim, {"processed_at": now()}).done == ids


def test_extend_keeps_rows_from_other_workers(engine, strategy, source_id):
    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 2)
    queue = raw_queue(engine, strategy, lease_seconds=3600)
    claim = queue.claim("a", 2)
    before = now()
    assert queue.extend(claim, seconds=60).done == claim.ids
    with engine.connect() as conn:
        leases = [row["locked_until"] for row in raw_states(conn, claim.ids).values()]
    assert all(before + timedelta(seconds=50) < until < now() + timedelta(seconds=70) for until in leases), \
        "the lease runs from the extension, for its seconds"
    assert not queue.claim("b", 2), "the extended lease holds"


def test_completion_inside_the_callers_transaction_rolls_back_with_it(
    engine, strategy, source_id
):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 2)
    queue = raw_queue(engine, strategy)
    claim = queue.claim("a", 2)
    with pytest.raises(RuntimeError), engine.begin() as conn:
        assert queue.complete(claim, {"processed_at": now()}, conn=conn).done == ids
        raise RuntimeError("the stage's own write failed")
    with engine.connect() as conn:
        assert all(r["processed_at"] is None for r in raw_states(conn, ids).values())
    assert queue.complete(claim, {"processed_at": now()}).done == ids


def test_a_batch_completes_in_one_statement(engine, strategy, source_id):
    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 51)
    queue = raw_queue(engine, strategy)
    claim = queue.claim("a", 50)
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE"):
            statements.append(statement)

    if strategy is PostgreSQLClaim:  # sent by the driver itself: count on the wire
        warm = queue.claim("b", 1)
        queue.complete(warm, {"processed_at": now()})  # prepares the statement (a round trip)
        with wire_messages(engine) as lines:
            assert len(queue.complete(claim, {"processed_at": now()}).done) == 50
        assert round_trips(lines) == 1
        assert sum(1 for line in lines if line.startswith("F\t") and "\tExecute\t" in line) == 1
        return
    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        assert len(queue.complete(claim, {"processed_at": now()}).done) == 50
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 1


def test_complete_each_writes_each_rows_own_values_and_fences_row_by_row(
    engine, strategy, caplog
):
    t = schema.sources
    with engine.begin() as conn:
        ids = [add_source(conn, f"http://127.0.0.1/{i}") for i in range(5)]
    queue = WorkQueue(engine, schema.SOURCES_DUE, claiming=strategy)
    stale = queue.claim("slow", 2)  # ids[0:2], whose leases run out
    expire_leases(engine, t)
    retaken = queue.claim("fast", 1)  # takes ids[0] over
    rest = queue.claim("fast", 5)  # ids[1] (expired) and ids[2:]
    assert retaken.ids == [ids[0]] and sorted(rest.ids) == ids[1:]
    later = now() + timedelta(hours=1)
    completions = [
        RowCompletion(stale, ids[0], {"next_fetch_at": later, "etag": "lost"}),  # fenced out
        RowCompletion(rest, ids[1], {"next_fetch_at": later, "etag": '"e1"'}),
        RowCompletion(rest, ids[2], {"next_fetch_at": later + timedelta(minutes=1), "etag": None}),
        RowCompletion(rest, ids[3], {"enabled": False, "disabled_reason": "gone",
                                     "config": {"channel_id": "UC1"}}),
        RowCompletion(rest, ids[4], {"consecutive_failures": 3, "last_failure_reason": "timeout",
                                     "next_fetch_at": later}),
    ]
    with caplog.at_level(logging.WARNING, logger="pipeline.queue.claim"), engine.begin() as conn:
        fenced = queue.complete_each(completions, conn=conn)
    assert fenced.done == ids[1:] and fenced.lost == [ids[0]]
    assert "completion of 1 due row(s) changed nothing" in caplog.text
    with engine.connect() as conn:
        rows = {r["id"]: r for r in conn.execute(sa.select(t)).mappings()}
    assert rows[ids[0]]["claimed_by"] == "fast" and rows[ids[0]]["etag"] is None
    assert (rows[ids[1]]["etag"], rows[ids[1]]["next_fetch_at"]) == ('"e1"', later)
    assert rows[ids[2]]["next_fetch_at"] == later + timedelta(minutes=1)
    assert (rows[ids[3]]["enabled"], rows[ids[3]]["config"]) == (False, {"channel_id": "UC1"})
    assert (rows[ids[4]]["consecutive_failures"], rows[ids[4]]["last_failure_reason"]) == (3, "timeout")
    for i in ids[1:]:
        assert (rows[i]["locked_until"], rows[i]["claimed_by"], rows[i]["claim_token"]) == (None, None, None)


def test_complete_each_is_one_statement_per_column_set_on_postgres(pg_engine):
    with pg_engine.begin() as conn:
        for i in range(40):
            add_source(conn, f"http://127.0.0.1/{i}")
    queue = WorkQueue(pg_engine, schema.SOURCES_DUE)
    claim = queue.claim("w", 40)
    later = now() + timedelta(hours=1)
    statements: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    completions = [
        RowCompletion(claim, row_id, {"next_fetch_at": later + timedelta(seconds=n)} if n % 2
                      else {"next_fetch_at": later, "consecutive_failures": n})
        for n, row_id in enumerate(claim.ids)
    ]
    sa.event.listen(pg_engine, "before_cursor_execute", count)
    try:
        with pg_engine.begin() as conn:
            assert len(queue.complete_each(completions, conn=conn).done) == 40
    finally:
        sa.event.remove(pg_engine, "before_cursor_execute", count)
    assert len([s for s in statements if s.lstrip().upper().startswith("UPDATE")]) == 2


def test_postgres_claim_is_one_round_trip(pg_engine):
    engine = pg_engine
    with engine.begin() as conn:
        source_id = add_source(conn)
        add_raw_rows(conn, source_id, 10)
    queue = raw_queue(engine, PostgreSQLClaim)
    with wire_messages(engine) as first:
        queue.claim("warm-up", 1)  # prepares the claim on the server
    with wire_messages(engine) as lines:
        claim = queue.claim("a", 5)
    assert len(claim) == 5
    assert round_trips(lines) == 1, lines
    assert [line.split("\t")[2] for line in lines if line.startswith("F")] == [
        "Bind", "Describe", "Execute", "Sync"], lines  # the prepared statement, no BEGIN
    parse = [line for line in first if "\tParse\t" in line]
    assert len(parse) == 1 and "FOR NO KEY UPDATE SKIP LOCKED" in parse[0] and "RETURNING" in parse[0]
    assert " IN (SELECT" not in parse[0].upper()


def test_complete_and_claim_is_one_round_trip_and_one_transaction(pg_engine):
    """A batch's completion and the next claim go together: one wait for the server,
    one commit; the completion is fenced as ever and the claim takes the next rows."""
    engine = pg_engine
    with engine.begin() as conn:
        ids = add_raw_rows(conn, add_source(conn), 6)
    queue = raw_queue(engine, PostgreSQLClaim)
    first = queue.claim("a", 3)
    stolen = first.ids[0]
    with engine.begin() as conn:  # another worker took one row over
        conn.execute(sa.update(schema.listings_raw).where(schema.listings_raw.c.id == stolen)
                     .values(claim_token="someone-else"))
    with wire_messages(engine) as lines:
        fenced, following = queue.complete_and_claim(first, {"processed_at": now()}, 3)
    assert round_trips(lines) == 1, lines
    sent = [line.split("\t")[2] for line in lines if line.startswith("F")]
    assert sent.count("Execute") == 2 and sent.count("Sync") == 1 and "Query" not in sent, sent
    assert fenced.done == first.ids[1:] and fenced.lost == [stolen]
    assert following.ids == ids[3:] and following.worker == "a" and following.token != first.token
    with engine.connect() as conn:
        states = raw_states(conn, ids)
    assert all(states[i]["processed_at"] is not None for i in first.ids[1:])
    assert all(states[i]["claim_token"] == following.token for i in following.ids)
    fenced, last = queue.complete_and_claim(following, {"processed_at": now()}, 3)
    assert fenced.done == following.ids and not last


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)  # row locks
def test_skip_locked_passes_over_rows_another_transaction_holds(engine):
    """A row locked by a transaction in flight is skipped, then re-checked once it commits."""
    with engine.begin() as conn:
        source_id = add_source(conn)
        ids = add_raw_rows(conn, source_id, 3)
    queue = raw_queue(engine, claiming_for(engine))
    t = schema.listings_raw
    with engine.connect() as holder:
        tx = holder.begin()
        holder.execute(sa.update(t).where(t.c.id == ids[0]).values(processed_at=now()))
        assert queue.claim("a", 1).ids == [ids[1]]  # row 0 is locked: skipped, not waited on
        tx.commit()
    assert queue.claim("a", 5).ids == [ids[2]]  # row 0 is processed now


def test_limit_must_be_positive(engine):
    with pytest.raises(ValueError, match="limit must be at least 1"):
        raw_queue(engine, claiming_for(engine)).claim("a", 0)


def test_every_queue_claims_and_completes(engine, strategy):
    """Every claim queue of the schema works end to end."""
    with engine.begin() as conn:
        sid = add_source(conn)
        add_raw_rows(conn, sid, 1)
        listing = conn.execute(
            sa.insert(schema.listings)
            .values(source_id=sid, source_item_id="x", url="http://127.0.0.1/x", content_hash="h")
            .returning(schema.listings.c.id)
        ).scalar_one()
        user = conn.execute(
            sa.insert(schema.users)
            .values(name="u", channel="webhook", channel_url="http://127.0.0.1/hook")
            .returning(schema.users.c.id)
        ).scalar_one()
        conn.execute(
            sa.insert(schema.notifications).values(
                user_id=user, listing_id=listing, cluster_id=listing, channel="webhook",
                next_attempt_at=now() - timedelta(seconds=1),
            )
        )
        conn.execute(sa.insert(schema.source_alerts).values(
            source_id=sid, user_id=user, event="failing", detail="d", next_attempt_at=now() - timedelta(seconds=1)))
        conn.execute(sa.insert(schema.websub_subscriptions).values(
            source_id=sid, hub="http://127.0.0.1/hub", topic="http://127.0.0.1/f", callback_token="t", secret="s",
            state="requested", requested_at=now(), due_at=now() - timedelta(seconds=1)))
    finish = {
        "due": {"next_fetch_at": now() + timedelta(hours=1)},
        "unprocessed": {"processed_at": now()},
        "unmatched": {"matched_at": now()},
    }
    for spec in schema.QUEUES:
        queue = WorkQueue(engine, spec, claiming=strategy)
        claim = queue.claim("w", 10)
        assert len(claim) == 1, spec.table.name
        values = (
            {"status": "sent", "sent_at": now()}
            if spec.table in (schema.notifications, schema.source_alerts)
            else {"due_at": None} if spec.table is schema.websub_subscriptions
            else finish[spec.name]
        )
        assert queue.complete(claim, values).done == claim.ids
        assert not queue.claim("w", 10), f"{spec.table.name}: completion left the queue"


def test_queues_of_one_kind_share_their_statements_and_other_kinds_do_not(engine, strategy, source_id):
    """A queue is made per pass, and a lingering run makes a pass of each stage a
    second: the second queue of a kind builds and compiles nothing (it did: 2-4 ms of
    CPU a queue on PostgreSQL, bench/RESULTS.md), and a queue whose statements differ
    (its columns, its spec, its database's claim, whether it records started events)
    gets its own."""
    first, second = raw_queue(engine, strategy), raw_queue(engine, strategy, lease_seconds=60)
    assert second._claim_stmt is first._claim_stmt and second._count_stmt is first._count_stmt
    assert second.fenced_statement(("processed_at",)) is first.fenced_statement(("processed_at",))
    if isinstance(first.claiming, PostgreSQLClaim) and isinstance(second.claiming, PostgreSQLClaim):
        assert second.claiming.claim_sql is first.claiming.claim_sql
        assert second.claiming.completion({"processed_at": now()}) is first.claiming.completion({"processed_at": now()})
    others = [
        WorkQueue(engine, schema.RAW_UNPROCESSED, claiming=strategy, columns=("source_id",)),
        WorkQueue(engine, schema.LISTINGS_UNMATCHED, claiming=strategy),
        WorkQueue(engine, schema.RAW_UNPROCESSED, claiming=PortableClaim if strategy is not PortableClaim
                  else claiming_for(engine)),
    ]
    assert len({id(q._claim_stmt) for q in [first, *others]}) == 1 + len(others)
    recording = PoliteQueue(engine, claiming=strategy, record_started=True, run_id="r1")
    assert PoliteQueue(engine, claiming=strategy, record_started=True, run_id="r2")._claim_stmt is recording._claim_stmt
    if recording.claiming.one_statement:  # the started events are written by the claim itself
        assert PoliteQueue(engine, claiming=strategy)._claim_stmt is not recording._claim_stmt
    # Sharing them, each queue claims and fences its own rows, with its own lease.
    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 4)
    a, b = first.claim("a", 2), second.claim("b", 10)
    assert len(a) == 2 and len(b) == 2 and not set(a.ids) & set(b.ids)
    assert all(row["locked_until"] < now() + timedelta(seconds=61) for row in b.rows)
    assert second.complete(b, {"processed_at": now()}).done == b.ids
    assert first.complete(a, {"processed_at": now()}).done == a.ids
    assert not first.claim("a", 10)


def test_claimed_timestamps_are_utc_whatever_the_server_zone(pg_engine):
    engine = pg_engine
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        name = conn.exec_driver_sql("SELECT current_database()").scalar_one()
        conn.exec_driver_sql(f"ALTER DATABASE {name} SET timezone = 'America/New_York'")
    engine.dispose()  # new sessions pick up the database default
    with engine.begin() as conn:
        add_raw_rows(conn, add_source(conn), 1)
        assert conn.exec_driver_sql("SHOW timezone").scalar_one() == "UTC"
    claim = raw_queue(engine, PostgreSQLClaim).claim("a", 1)
    row = claim.rows[0]
    for column in ("fetched_at", "locked_until"):
        assert row[column].utcoffset() == timedelta(0), column
    assert row["raw_json"] == {"title": "item 0"}


def test_a_session_idle_inside_a_transaction_is_ended_by_the_server(pg_engine, pg_databases):
    """The pipeline's sessions carry idle_in_transaction_session_timeout (60 s), so a
    worker cut off in the middle of a transaction does not hold its row locks for as
    long as its silent connection lasts (tests/test_partition.py). A timeout set by the
    server, the role or DATABASE_URL's options is kept."""
    from pipeline.storage import db

    with pg_engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar_one() == "1min"
    name = pg_engine.url.database
    url = db.parse_url(pg_databases.url(name)).update_query_dict(
        {"options": "-c idle_in_transaction_session_timeout=5000"})
    own = db.create_engine(url.render_as_string(hide_password=False))
    with own.connect() as conn:
        assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar_one() == "5s"
    own.dispose()


def test_count_ready_counts_free_and_expired_rows_up_to_a_cap(engine, source_id):
    with engine.begin() as conn:
        ids = add_raw_rows(conn, source_id, 6)
    queue = raw_queue(engine, claiming_for(engine))
    assert queue.count_ready() == 6
    assert queue.count_ready(cap=4) == 4
    claim = queue.claim("a", 2)
    assert queue.count_ready() == 4, "live leases are not ready"
    queue.complete(claim, {"processed_at": now()}, ids=ids[:1])
    expire_leases(engine, schema.listings_raw)
    assert queue.count_ready() == 5, "the expired lease is ready again"


def test_a_pass_that_fails_does_not_wait_for_its_work_in_flight(engine, source_id):
    """A pass ended by an exception (a terminated run's interrupt, a lost database)
    returns at once: the work still running is abandoned, unwritten, and its lease,
    no longer extended, runs out for another claim. It once waited for every job."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 2)
    gate, finished = threading.Event(), threading.Event()

    def work(job):
        claim, row_id = job
        if row_id == min(claim.ids):
            gate.wait(60)  # the slow one: still running when the pass fails
            finished.set()
        return row_id

    def write(results):
        raise RuntimeError("the database went away")

    try:
        with pytest.raises(RuntimeError, match="went away"):
            work_claimed(
                raw_queue(engine, claiming_for(engine)), "w1", threads=2,
                start=lambda claim: [(claim, row_id) for row_id in claim.ids],
                held=lambda job: job, work=work, write=write, write_window=0.0,
            )
        assert not finished.is_set(), "the pass returned while the slow job was still running"
    finally:
        gate.set()


def test_a_start_that_cannot_reach_the_database_lets_the_work_in_flight_finish_and_be_written(engine, source_id):
    """A ``start`` that meets the database gone (the deliverer reading its claimed
    messages during a restart) ends the claiming as a lost claim does: the job already
    running finishes and is written, then the error is raised; the rows whose start
    failed wait out their lease. It once ended the pass at once, and the messages in
    flight, sent and never recorded, were sent again a lease later (72 at the hour's
    restart). The running job adds the second row, which the pass's next look claims
    (within ``look_again``); the error is a real driver's: a connection to a port
    nothing listens on."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 1)
    nowhere = db.create_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/none")
    failed = threading.Event()
    started: list[int] = []
    written: list[int] = []

    def start(claim):
        if started:  # the second claim: the database is gone
            try:
                nowhere.connect()
            finally:
                failed.set()
        started.extend(claim.ids)
        return [(claim, row_id) for row_id in claim.ids]

    def work(job):
        with engine.begin() as conn:  # more work comes due while this job runs
            add_raw_rows(conn, source_id, 1)
        failed.wait(60)  # still running when the start fails
        return job[1]

    try:
        with pytest.raises(sa.exc.OperationalError):
            work_claimed(raw_queue(engine, claiming_for(engine)), "w1", threads=2, batch_size=2,
                         start=start, held=lambda job: job, work=work, write=written.extend, write_window=0.0,
                         look_again=0.05)
    finally:
        failed.set()
        nowhere.dispose()
    assert len(started) == 1
    assert written == started, "the job in flight was written before the error was raised"


def test_a_batch_below_the_free_threads_leaves_no_thread_waiting_for_a_job_to_end(engine, source_id):
    """With batches smaller than the threads (``PIPELINE_CONCURRENCY`` above the
    deliverer's batch), the pass claims again while its first job runs: the second job
    starts before the first ends. It once waited for a job to end before claiming, so
    two threads ran one job at a time."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 2)
    second = threading.Event()
    overlapped: list[bool] = []

    def work(job):
        if second.is_set():
            return job[1]
        second.set()  # the first job: it ends once the second has started (or after 60 s)
        overlapped.append(second_started.wait(60))
        return job[1]

    second_started = threading.Event()

    def start(claim):
        if second.is_set():
            second_started.set()
        return [(claim, row_id) for row_id in claim.ids]

    claimed = work_claimed(raw_queue(engine, claiming_for(engine)), "w1", threads=2, batch_size=1,
                           start=start, held=lambda job: job, work=work, write=lambda results: None,
                           write_window=0.0)
    assert claimed == 2 and overlapped == [True], "the second row waited for the first job to end"


def test_the_pass_goes_on_claiming_and_working_while_a_batch_is_written(engine, source_id):
    """Results are written on a writer thread of their own: while the first batch's
    write is held (a slow database), the loop claims the next rows and works on them.
    It once wrote on the claiming thread, so nothing else moved during a write."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 3)
    second_worked = threading.Event()
    worked: list[int] = []
    written: list[list[int]] = []
    moved_during_first_write: list[bool] = []

    def work(job):
        _claim, row_id = job
        worked.append(row_id)
        if len(worked) == 2:
            second_worked.set()
        return row_id

    def write(results):
        if not written:
            moved_during_first_write.append(second_worked.wait(60))
        written.append(list(results))

    claimed = work_claimed(
        raw_queue(engine, claiming_for(engine)), "w1", threads=1,
        start=lambda claim: [(claim, row_id) for row_id in claim.ids],
        held=lambda job: job, work=work, write=write, write_window=0.0,
    )
    assert moved_during_first_write == [True], "no row was worked on while the first batch was written"
    assert claimed == 3 and sorted(r for batch in written for r in batch) == sorted(worked)
    assert len(worked) == 3


def test_a_free_thread_claims_work_while_long_jobs_hold_the_others(engine, source_id):
    """A claim waits for half the threads to be free, to take a batch; but behind long
    jobs (a slow host; latency's long tail) the free threads idled until one of those
    ended: with 4 threads, 3 jobs held and 1 done, the fifth row waited for the held
    ones. A thread free for ``idle_claim`` claims on its own now. Waits for the fifth
    row to be worked on while the others are held (60 s at most: it never came)."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 5)
    gate, fifth = threading.Event(), threading.Event()
    ids: list[int] = []

    def start(claim):
        ids.extend(claim.ids)
        return [(claim, row_id) for row_id in claim.ids]

    def work(job):
        _claim, row_id = job
        if len(ids) <= 4 and row_id != ids[-1]:
            gate.wait(60)  # three of the first four are long
        if len(ids) == 5 and row_id == ids[-1]:
            fifth.set()
        return row_id

    def watch():
        fifth_in_time.append(fifth.wait(60))
        gate.set()

    fifth_in_time: list[bool] = []
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        claimed = work_claimed(
            raw_queue(engine, claiming_for(engine)), "w1", threads=4, batch_size=4,
            start=start, held=lambda job: job, work=work, write=lambda results: None,
        )
    finally:
        gate.set()
        watcher.join()
    assert claimed == 5
    assert fifth_in_time == [True], "the fifth row waited for the long jobs"


def test_rows_that_come_due_while_work_runs_start_before_it_ends(engine, source_id):
    """A pass whose claim found nothing ready ended once its work in flight did: a row
    that came due meanwhile waited for the slowest job (on the simulated internet, a
    held answer's 20 s: every source due meanwhile started late). It looks again while
    work runs now. Waits (60 s at most) for the second row, added while the first's job
    is held, to be worked on before that job ends."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 1)
    queue = raw_queue(engine, claiming_for(engine))
    found_nothing, second = threading.Event(), threading.Event()
    claim = queue.claim

    def claim_and_tell(worker, limit):
        got = claim(worker, limit)
        if not got:
            found_nothing.set()
        return got

    queue.claim = claim_and_tell  # type: ignore[method-assign]
    worked: list[int] = []

    def work(job):
        _claim, row_id = job
        worked.append(row_id)
        if len(worked) == 1:  # the first row's job: long; a row comes due while it runs
            assert found_nothing.wait(60), "the pass looked for more work"
            with engine.begin() as conn:
                add_raw_rows(conn, source_id, 1)
            second_in_time.append(second.wait(60))
        else:
            second.set()
        return row_id

    second_in_time: list[bool] = []
    claimed = work_claimed(
        queue, "w1", threads=4, batch_size=4, look_again=0.05,
        start=lambda c: [(c, row_id) for row_id in c.ids], held=lambda job: job, work=work,
        write=lambda results: None,
    )
    assert claimed == 2
    assert second_in_time == [True], "the row that came due waited for the job in flight to end"


def test_a_claim_that_lost_a_race_is_tried_again_soon_then_less_often():
    """The pause after short claims in a row that lost a race: short at first (not the
    0.1 s a full group waits), doubling, never past the longest, jittered within half."""
    from pipeline.queue.workpool import _RACE_PAUSE, _race_pause

    first, longest = _RACE_PAUSE
    assert first < 0.01 and longest == 0.1
    for races in range(1, 12):
        nominal = min(longest, first * 2 ** (races - 1))
        pauses = [_race_pause(races) for _ in range(200)]
        assert all(nominal / 2 <= p <= nominal for p in pauses)
        assert len(set(pauses)) > 1, "jittered, so racing workers fall out of step"


def test_driver_errors_reach_the_caller_as_sqlalchemys_and_a_broken_connection_leaves_the_pool(pg_engine):
    """The claim and completion sent by psycopg itself fail as every other statement
    does (sa.exc.DBAPIError, which the stages and retry policies handle), and a
    connection the server dropped is not lent again, nor is any other the pool held then
    (a server restart drops them all)."""
    engine = db.create_engine(pg_engine.url.render_as_string(hide_password=False), pool_size=2)
    try:
        # Two connections in the pool, both dropped by the server: after the driver's
        # error, no statement meets the other one.
        with engine.connect() as first, engine.connect() as second:
            backends = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() for c in (first, second)]
        with pg_engine.connect() as admin:
            for pid in backends:
                admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid})")
        with pytest.raises(sa.exc.OperationalError) as caught:
            raw_queue(engine, PostgreSQLClaim).claim("a", 1)
        assert caught.value.connection_invalidated
        with engine.connect() as first, engine.connect() as second:
            assert not {c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() for c in (first, second)} & set(backends)
        engine.dispose()
        engine = db.create_engine(pg_engine.url.render_as_string(hide_password=False), pool_size=1)
        with engine.begin() as conn:
            add_raw_rows(conn, add_source(conn), 3)
        queue = raw_queue(engine, PostgreSQLClaim)
        claim = queue.claim("a", 1)
        with engine.connect() as conn:  # the pool's only connection: the one the claim used
            backend = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with pg_engine.connect() as admin:
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({backend})")
        with pytest.raises(sa.exc.OperationalError) as caught:
            queue.complete(claim, {"processed_at": now()})
        assert caught.value.connection_invalidated
        assert queue.complete(claim, {"processed_at": now()}).done == claim.ids  # a new connection
        with pytest.raises(sa.exc.DataError):  # the server refuses the value: not a broken link
            queue.claim("a" * 10, 2**40)
        assert queue.claim("a", 1)  # the connection is still good and back in autocommit-off
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one() != backend
    finally:
        engine.dispose()
    # No server at all (a restart in progress): the pool's connect fails the same way.
    nowhere = db.create_engine("postgresql://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(sa.exc.OperationalError):
        raw_queue(nowhere, PostgreSQLClaim).claim("a", 1)
    with pytest.raises(sa.exc.OperationalError):
        raw_queue(nowhere, PostgreSQLClaim).complete_and_claim(claim, {"processed_at": now()}, 1)
    nowhere.dispose()


def test_driver_sql_takes_postgresqls_own_placeholders():
    """The driver's statements are raw queries: each name one $n, however often it is
    used, and a percent sign SQLAlchemy escaped for psycopg's %(name)s style is one again."""
    sql, order = dollar_placeholders("SELECT %(a)s, %(b)s::INTEGER, %(a)s WHERE x LIKE '5%%'")
    assert sql == "SELECT $1, $2::INTEGER, $1 WHERE x LIKE '5%'"
    assert order == ("a", "b")


def test_a_pass_begun_after_its_claim_until_takes_what_is_ready_and_waits_for_nothing(engine, source_id):
    """A lingering run that starts after its linger's end (a loaded machine's slow run
    container) takes every row ready, in full claims, then ends at the first short one
    without asking when more comes due. It once made one claim and ended: 4 sources a
    run of 300 due, and the docker test on a loaded CI ran out of its 5 minutes."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 7)
    asked: list[bool] = []

    def next_start_in() -> float:
        asked.append(True)
        return 0.5

    claimed = work_claimed(raw_queue(engine, claiming_for(engine)), "w1", threads=2, batch_size=2,
                           start=lambda claim: [(claim, row_id) for row_id in claim.ids], held=lambda job: job,
                           work=lambda job: job[1], write=lambda results: None, write_window=0.0,
                           next_start_in=next_start_in, claim_until=time.monotonic() - 1)
    assert claimed == 7 and not asked


def test_a_pass_begun_after_its_claim_until_takes_what_was_ready_then_not_what_comes_due(engine, source_id):
    """A late pass takes the rows ready as it began, not the stream that keeps coming:
    here each of the first 12 jobs makes a new row ready, as fast as the pass takes
    them, so every claim comes back full. The rule "claim on while claims come back full" took
    all 19 (and under a stream with no end, went on until ``max_rows``); the pass now
    ends after the 7 that were ready."""
    from pipeline.queue.workpool import work_claimed

    with engine.begin() as conn:
        add_raw_rows(conn, source_id, 7)
    made = iter(range(12))
    lock = threading.Lock()

    def work(job: tuple[object, int]) -> int:
        with lock:
            more = next(made, None)
        if more is not None:
            with engine.begin() as conn:
                add_raw_rows(conn, source_id, 1)
        return job[1]

    claimed = work_claimed(raw_queue(engine, claiming_for(engine)), "w1", threads=2, batch_size=2,
                           start=lambda claim: [(claim, row_id) for row_id in claim.ids], held=lambda job: job,
                           work=work, write=lambda results: None, write_window=0.0,
                           next_start_in=lambda: 0.5, claim_until=time.monotonic() - 1)
    assert claimed == 7
    with engine.connect() as conn:
        waiting = conn.execute(sa.select(sa.func.count()).select_from(schema.listings_raw)
                               .where(schema.listings_raw.c.claimed_by.is_(None))).scalar_one()
    assert waiting == 7  # the row each job made is left for the next pass

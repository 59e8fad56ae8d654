"""The processor on PostgreSQL and SQLite: raw rows become listings, once."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from datetime import timedelta

import pytest
import sqlalchemy as sa

from pipeline.core import heap
from pipeline.core.settings import Settings
from pipeline.listings.processor import Processor, ProcessStats, _existing
from pipeline.queue.claim import WorkQueue
from pipeline.storage import schema
from tests.claim_workers import process_one_batch
from tests.conftest import conformance
from tests.helpers import (
    add_source,
    expire_leases,
    holding_session,
    lock_waiters,
    locked_against,
    now,
    wait_until,
    worker_processes,
)

_item_hashes = iter(range(10**9))


def add_raw(conn: sa.Connection, source_id: int, item: str, **raw) -> int:
    body = {"title": f"Item {item}", "url": f"http://127.0.0.1/{item}", "summary": "", **raw}
    t = schema.listings_raw
    return int(conn.execute(
        sa.insert(t).values(source_id=source_id, source_item_id=item, url=f"http://127.0.0.1/{item}",
                            raw_json=body, content_hash=str(next(_item_hashes))).returning(t.c.id)
    ).scalar_one())


def processor(engine: sa.Engine, **settings) -> Processor:
    return Processor(engine, Settings(database_url=str(engine.url), **settings), "test-processor")


def listings(engine: sa.Engine) -> dict[str, dict]:
    t = schema.listings
    with engine.connect() as conn:
        return {r["source_item_id"]: dict(r) for r in conn.execute(sa.select(t)).mappings()}


def raw_rows(engine: sa.Engine) -> dict[int, dict]:
    t = schema.listings_raw
    with engine.connect() as conn:
        return {r["id"]: dict(r) for r in conn.execute(sa.select(t)).mappings()}


@pytest.fixture
def source_id(engine):
    with engine.begin() as conn:
        return add_source(conn, "http://127.0.0.1/feed", config={"category": "Remote"})


@conformance
def test_raw_rows_become_listings_and_a_second_run_does_nothing(engine, source_id):
    with engine.begin() as conn:
        add_raw(conn, source_id, "a", title="<b>Python</b> dev", summary="<p>Nice &amp; calm</p>",
                published_at="2026-11-20T10:00:00+01:00", categories=["jobs"])
        add_raw(conn, source_id, "b")
    stats = processor(engine).run()
    assert (stats.claimed, stats.inserted, stats.failed) == (2, 2, 0)
    a = listings(engine)["a"]
    assert (a["title"], a["summary"], a["categories"]) == ("Python dev", "Nice & calm", ["jobs", "Remote"])
    assert a["published_at"].isoformat() == "2026-11-20T09:00:00+00:00" and a["matched_at"] is None
    assert all(r["processed_at"] is not None and r["locked_until"] is None for r in raw_rows(engine).values())
    again = processor(engine).run()
    assert (again.claimed, again.inserted) == (0, 0), "running again processes nothing"


@conformance
def test_every_date_a_feed_gives_is_kept_however_far_off(engine, source_id):
    """feedparser reads dates in any year; each database holds years 1000 to 9999 (MariaDB's
    DATETIME is the narrowest), and every such date is stored as given."""
    dates = {"past 2100": "2150-06-01T12:00:00+00:00", "last": "9999-12-31T23:59:59+00:00",
             "first": "1000-01-01T00:00:00+00:00"}
    with engine.begin() as conn:
        for item, published_at in dates.items():
            add_raw(conn, source_id, item, published_at=published_at)
    assert processor(engine).run().inserted == 3
    stored = {item: row["published_at"].isoformat() for item, row in listings(engine).items()}
    assert stored == dates


@conformance
def test_an_update_keeps_ingested_at_and_resets_matched_at_only_when_content_changes(engine, source_id):
    with engine.begin() as conn:
        add_raw(conn, source_id, "a", title="First")
    processor(engine).run()
    first = listings(engine)["a"]
    matched = now()
    with engine.begin() as conn:  # and an hour old (SQLite's CURRENT_TIMESTAMP counts whole seconds)
        conn.execute(sa.update(schema.listings).values(matched_at=matched, updated_at=matched - timedelta(hours=1)))
    first = listings(engine)["a"]
    with engine.begin() as conn:
        add_raw(conn, source_id, "a", title="First")  # same content, a new raw row
    assert processor(engine).run().unchanged == 1
    assert listings(engine)["a"]["matched_at"] is not None, "unchanged content is not matched again"
    with engine.begin() as conn:
        add_raw(conn, source_id, "a", title="Second")
    assert processor(engine).run().updated == 1
    second = listings(engine)["a"]
    assert second["title"] == "Second" and second["ingested_at"] == first["ingested_at"]
    assert second["updated_at"] > first["updated_at"] and second["matched_at"] is None


@conformance
def test_older_content_never_overwrites_newer(engine, source_id):
    with engine.begin() as conn:
        older = add_raw(conn, source_id, "a", title="Older")
        add_raw(conn, source_id, "a", title="Newer")
    # The older row is held by a slow worker while the newer one is processed.
    queue = WorkQueue(engine, schema.RAW_UNPROCESSED)
    slow = queue.claim("slow", 1)
    assert slow.ids == [older]
    processor(engine).run()
    assert listings(engine)["a"]["title"] == "Newer"
    stats = ProcessStats()
    # The slow worker finishes its batch, after the newer content was stored.
    processor(engine)._process(queue, slow, _existing(engine), stats)
    assert stats.unchanged == 1 and listings(engine)["a"]["title"] == "Newer"


@conformance
def test_a_bad_row_keeps_its_error_is_retried_then_given_up_and_never_blocks_others(engine, source_id):
    with engine.begin() as conn:
        bad = add_raw(conn, source_id, "bad", url=None)
        conn.execute(sa.update(schema.listings_raw).where(schema.listings_raw.c.id == bad).values(url=""))
        add_raw(conn, source_id, "good")
    p = processor(engine, raw_max_attempts=2)
    first = p.run()
    assert (first.inserted, first.failed, first.gave_up) == (1, 1, 0)
    row = raw_rows(engine)[bad]
    assert (row["attempts"], row["processed_at"]) == (1, None) and "no usable url" in row["last_error"]
    assert p.run().claimed == 0, "the failed row waits before its next attempt"
    expire_leases(engine, schema.listings_raw, [bad])  # its wait is over
    second = p.run()
    assert (second.claimed, second.gave_up) == (1, 1)
    row = raw_rows(engine)[bad]
    assert row["processed_at"] is not None and row["attempts"] == 2
    assert row["last_error"].startswith("gave up after 2 attempts: no usable url")
    assert set(listings(engine)) == {"good"}


def test_max_rows_is_never_exceeded(engine, source_id):
    with engine.begin() as conn:
        for i in range(7):
            add_raw(conn, source_id, f"i{i}")
    p = processor(engine)
    p.batch_size = 2
    assert p.run(max_rows=5).claimed == 5
    assert sum(r["processed_at"] is None for r in raw_rows(engine).values()) == 2


def test_pipeline_process_command(engine, db_url, source_id):
    from tests.test_cli import run

    with engine.begin() as conn:
        add_raw(conn, source_id, "a")
    result = run("process", "--json", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inserted"] == 1


@pytest.mark.slow
def test_four_processor_processes_process_each_raw_row_once(engine, db_url, source_id, tmp_path):
    """Processes: four processors at once, as on several machines."""
    import os

    with engine.begin() as conn:
        t = schema.listings_raw
        conn.execute(sa.insert(t), [
            {"source_id": source_id, "source_item_id": f"i{i}", "url": f"http://127.0.0.1/{i}",
             "raw_json": {"title": f"t{i}", "url": f"http://127.0.0.1/{i}"}, "content_hash": str(i),
             "fetched_at": now() - timedelta(seconds=20000 - i)}
            for i in range(20000)
        ])
    env = {**os.environ, "DATABASE_URL": db_url}
    # Every process imports first, says so, and starts claiming once all have: they contend.
    script = (
        "import os, sys, time; from pipeline.cli import main; "
        "open(f'{sys.argv[1]}.{os.getpid()}', 'w').close(); "
        "exec('while not os.path.exists(sys.argv[2]): time.sleep(0.01)'); "
        "sys.exit(main(['process', '--json']))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "ready"), str(tmp_path / "go")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    wait_until("four processes ready", lambda: len(list(tmp_path.glob("ready.*"))) == 4, timeout=120, every=0.05)
    (tmp_path / "go").touch()
    totals = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        totals.append(json.loads(out))
    assert sum(t["claimed"] for t in totals) == 20000, "no raw row was claimed twice"
    assert sum(t["inserted"] for t in totals) == 20000 and sum(t["fenced_out"] for t in totals) == 0
    assert sum(1 for t in totals if t["claimed"]) >= 2, "the processes shared the work"
    assert len(listings(engine)) == 20000


@conformance
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
def test_two_processors_upserting_the_same_items_in_opposite_orders_do_not_deadlock(backend, engine, db_url):
    """A backlog holds two newer versions of items 1 and 2: one batch lists them 1, 2,
    the next 2, 1. Processors upserting in the order of their raw rows lock the listings
    in opposite orders and deadlock (the loser's batch refused and written again row by
    row); in the order of their keys, one waits for the other. The test holds listing 1
    and listing 2 in two transactions of its own while the processors line up behind
    them, lets 2 go (the second processor, if it upserts 2 first, takes it and waits for
    1), then 1."""
    with engine.begin() as conn:
        source = add_source(conn, "http://127.0.0.1/feed")
        for item in ("1", "2"):
            add_raw(conn, source, item, title=f"v1 of {item}")
    processor(engine).run()
    with engine.begin() as conn:
        for version, items in (("v2", ("1", "2")), ("v3", ("2", "1"))):
            for item in items:
                add_raw(conn, source, item, title=f"{version} of {item}")
    context = worker_processes()
    t = schema.listings
    with (engine.connect() as hold_1, engine.connect() as hold_2,
          ProcessPoolExecutor(max_workers=2, mp_context=context) as pool):
        ids = {item: id_ for item, id_ in hold_1.execute(sa.select(t.c.source_item_id, t.c.id))}
        hold_1.rollback()
        holders = {}
        for item, conn in (("1", hold_1), ("2", hold_2)):
            holders[item] = holding_session(conn)  # and the transaction begun, which holds the listing
            conn.execute(sa.select(t.c.id).where(t.c.id == ids[item]).with_for_update()).all()
        first = pool.submit(process_one_batch, db_url, "first", 2)  # claims v2: 1, 2
        wait_until("the first processor waiting", lambda: lock_waiters(engine, on=holders["1"]) == 1, 120)
        second = pool.submit(process_one_batch, db_url, "second", 2)  # claims v3: 2, 1
        wait_until("the second processor waiting", lambda: lock_waiters(engine) == 2, 120)
        hold_2.commit()
        # Both wait for listing 1 now (the second behind the first, or holding listing 2).
        wait_until("no processor waiting for listing 2",
                   lambda: lock_waiters(engine, on=holders["2"]) == 0 and lock_waiters(engine) == 2, 120)
        hold_1.commit()
        results = [first.result(timeout=300), second.result(timeout=300)]
    assert [stats["claimed"] for stats, _ in results] == [2, 2]
    assert [warnings for _, warnings in results] == [[], []], "a batch was refused (a deadlock)"
    with engine.connect() as conn:
        titles = conn.execute(sa.select(t.c.title).order_by(t.c.source_item_id)).scalars().all()
    assert titles == ["v3 of 1", "v3 of 2"]


def test_a_stages_first_pass_settles_the_heap_once(engine):
    """What a process imported before its first pass is moved out of the cycle
    collector's sight (every full collection walked it again: an eighth of the
    processor's CPU a row); once: objects made afterwards are collected as before."""
    processor(engine).run()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    made = [[] for _ in range(1000)]  # tracked by the collector
    heap.settle()
    assert gc.get_freeze_count() == frozen and made


def test_a_run_reads_its_sources_and_their_boilerplate_once_not_once_a_batch(engine, source_id):
    """A source trickling an item or two a batch: its category, url and boilerplate are
    read once in a run (and again after ``PLATES_KEPT``), not once a batch (a query a
    batch each, 27 us a row at batches of 100, bench/RESULTS.md)."""
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.source_words).values(source_id=source_id, words=[" posted by the team "]))
        for i in range(10):
            add_raw(conn, source_id, f"i{i}", summary=f"Story {i} posted by the team")
    reads: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany) -> None:
        text = " ".join(statement.split()).lower()
        if text.startswith("select") and ("from source_words" in text or "from sources" in text):
            reads.append("source_words" if "from source_words" in text else "sources")

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        stats = Processor(engine, Settings(database_url=str(engine.url)), "test-processor", batch_size=2).run()
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert stats.inserted == 10
    assert sorted(reads) == ["source_words", "sources"], reads
    assert {tuple(row["categories"]) for row in listings(engine).values()} == {("Remote",)}


def test_a_database_that_cannot_take_the_write_now_fails_the_pass_and_blames_no_row(engine, db_url, source_id):
    """The database could not write the listings for now (a lock held past its timeout,
    as a restart, a cut connection or a full disk are): the pass fails, to be retried,
    and no raw row is marked refused. Taken for the rows' own data, each row was
    written again alone and marked "the database refused this row's listing", on its
    way to being given up."""
    with engine.begin() as conn:
        raw = [add_raw(conn, source_id, f"i{n}") for n in range(2)]
    with locked_against(engine, db_url, schema.listings) as impatient, \
            pytest.raises(sa.exc.OperationalError, match="lock timeout"):
        processor(impatient).run()
    rows = raw_rows(engine)
    assert [(rows[i]["last_error"], rows[i]["processed_at"]) for i in raw] == [(None, None)] * 2
    assert processor(engine).run().claimed == 0, "the failed pass's rows wait out their lease"

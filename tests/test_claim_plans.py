"""Every claim query is an index range scan on a 100,000-row table, never a table scan.

The SQL explained is captured from a real claim, so the test reads the plan of exactly
what the code sends. On PostgreSQL the generic plan is checked too: psycopg prepares a
statement after a few executions, and a generic plan can only use a partial index whose
predicate the query implies without knowing its parameters.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from datetime import timedelta

import psycopg.sql
import pytest
import sqlalchemy as sa

from pipeline.fetching import politeness
from pipeline.fetching.politeness import PoliteQueue
from pipeline.queue.claim import MARIADB, QueueSpec, WorkQueue
from pipeline.storage import bulk, db, schema
from tests.conftest import ALL_BACKENDS, conformance
from tests.databases import MariaDatabases, PostgresDatabases
from tests.helpers import now

ROWS = 100_000

pytestmark = [pytest.mark.slow, conformance]


def _state(i: int) -> dict:
    """Most rows done; 1% waiting, 0.5% leased, 0.5% with an expired lease. Every row
    names every claim column, so a table's rows can go in one statement."""
    t = now()
    if i % 200 == 1 and _waiting(i):
        return {"locked_until": t + timedelta(minutes=5), "claimed_by": "w", "claim_token": "x"}
    if i % 200 == 2 and _waiting(i):
        return {"locked_until": t - timedelta(minutes=5), "claimed_by": "w", "claim_token": "y"}
    return {"locked_until": None, "claimed_by": None, "claim_token": None}


def _insert(conn: sa.Connection, table: sa.Table, rows: list[dict]) -> None:
    # PostgreSQL: a JSON recordset per 25,000 rows, several times faster than executemany.
    for start in range(0, len(rows), 25_000):
        bulk.insert_rows(conn, table, rows[start : start + 25_000])


def _waiting(i: int) -> bool:
    return i % 100 in (1, 2, 3)


def populate(conn: sa.Connection) -> None:
    t = now()
    s = schema
    sources = [
        {
            "name": f"s{i}",
            "url": f"http://127.0.0.1/{i}",
            "source_type": "rss",
            "enabled": i % 50 != 7,
            "next_fetch_at": t + (timedelta(hours=-1) if _waiting(i) else timedelta(hours=1)),
            **_state(i),
        }
        for i in range(ROWS)
    ]
    _insert(conn, s.sources, sources)
    source_id = conn.execute(sa.select(sa.func.min(s.sources.c.id))).scalar_one()
    raw = [
        {
            "source_id": source_id,
            "source_item_id": str(i),
            "url": "http://127.0.0.1/i",
            "raw_json": {},
            "content_hash": "h",
            "fetched_at": t - timedelta(seconds=ROWS - i),
            "processed_at": None if _waiting(i) else t,
            **_state(i),
        }
        for i in range(ROWS)
    ]
    _insert(conn, s.listings_raw, raw)
    listings = [
        {
            "source_id": source_id,
            "source_item_id": str(i),
            "url": "http://127.0.0.1/i",
            "content_hash": "h",
            "updated_at": t - timedelta(seconds=ROWS - i),
            "matched_at": None if _waiting(i) else t,
            **_state(i),
        }
        for i in range(ROWS)
    ]
    _insert(conn, s.listings, listings)
    user = conn.execute(
        sa.insert(s.users)
        .values(name="u", channel="webhook", channel_url="http://127.0.0.1/h")
        .returning(s.users.c.id)
    ).scalar_one()
    listing_ids = conn.execute(sa.select(s.listings.c.id).order_by(s.listings.c.id)).scalars()
    notifications = [
        {
            "user_id": user,
            "listing_id": listing_id,
            "cluster_id": listing_id,
            "channel": "webhook",
            "status": "pending" if _waiting(i) else "sent",
            "next_attempt_at": t - timedelta(seconds=ROWS - i),
            **_state(i),
        }
        for i, listing_id in enumerate(listing_ids)
    ]
    _insert(conn, s.notifications, notifications)


@pytest.fixture(scope="module", params=ALL_BACKENDS)
def big_engine(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[sa.Engine]:
    """One populated database per backend, shared by this module's read-only plan tests."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("plans") / "big.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        url, drop = f"sqlite:///{path}", None
    elif request.param == "mariadb":
        maria: MariaDatabases = request.getfixturevalue("mariadb_databases")
        name = maria.migrated()
        url, drop = maria.url(name), lambda: maria.drop(name)
    else:
        databases: PostgresDatabases = request.getfixturevalue("pg_databases")
        name = databases.migrated()
        url, drop = databases.url(name), lambda: databases.drop(name)
    engine = db.create_engine(url)
    with engine.begin() as conn:
        populate(conn)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if engine.dialect.name in MARIADB:
            conn.exec_driver_sql("ANALYZE TABLE sources, listings_raw, listings, notifications")
        else:
            conn.exec_driver_sql("ANALYZE")
    yield engine
    engine.dispose()
    if drop:
        drop()


def mariadb_plans(conn: sa.Connection, statements: list[tuple[str, object]]) -> list[dict]:
    """MariaDB's EXPLAIN of each statement, one dict per table access."""
    plans = []
    for statement, parameters in statements:
        result = conn.exec_driver_sql("EXPLAIN " + statement, parameters)
        plans += [dict(zip(result.keys(), row, strict=True)) for row in result]
    return plans


def captured_claim_sql(engine: sa.Engine, spec: QueueSpec) -> tuple[str, object]:
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        claim = "claim_token" in statement and statement.lstrip().upper().startswith(("WITH", "UPDATE"))
        if claim or "SKIP LOCKED" in statement:  # MariaDB: the claim's locking reads too
            seen.append((statement, parameters))

    queue = WorkQueue(engine, spec)
    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        claim = queue.claim("probe", 10)
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    assert claim, f"{spec.table.name}: the populated table has claimable rows"
    if engine.dialect.name == "postgresql":
        # Sent by psycopg itself, past SQLAlchemy's events: the SQL compiled once, with
        # PostgreSQL's $n placeholders (test_claim.py checks on the wire that it is what
        # is sent), and its arguments in their order.
        assert not seen and queue._claim_sql is not None
        return queue._claim_sql.sql, queue._claim_sql.arguments(queue._claim_params("probe", 10)[1])
    if engine.dialect.name in MARIADB:
        return seen  # the locking reads (expired leases, then free rows), and the UPDATE by ids
    assert len(seen) == 1
    return seen[0]


def explain_raw(conn: sa.Connection, explain: str, statement: str, arguments: list) -> list:
    """``explain`` (EXPLAIN and its options) of a statement with $n placeholders, as the
    driver's hot path sends it (``_DriverStatement``): each row of the plan."""
    return psycopg.RawCursor(conn.connection.dbapi_connection).execute(f"{explain} {statement}", arguments).fetchall()


def postgres_plans(conn: sa.Connection, statement: str, arguments: list) -> list[str]:
    """The custom plan (parameters known) and the generic plan (parameters unknown)."""
    custom = [r[0] for r in explain_raw(conn, "EXPLAIN", statement, arguments)]
    raw = conn.connection.dbapi_connection
    conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    psycopg.RawCursor(raw).execute(f"PREPARE claim_probe AS {statement}")
    types = conn.exec_driver_sql(
        "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'claim_probe'"
    ).scalar_one()
    # EXPLAIN EXECUTE takes no bound parameters: spell the values out as literals.
    values = ", ".join(
        f"{psycopg.sql.Literal(value).as_string(raw)}::{t}" for value, t in zip(arguments, types, strict=True)
    )
    generic = [r[0] for r in conn.exec_driver_sql(f"EXPLAIN EXECUTE claim_probe({values})")]
    conn.exec_driver_sql("DEALLOCATE claim_probe")
    return custom + ["-- generic plan --"] + generic


@pytest.mark.parametrize("spec", schema.QUEUES, ids=lambda q: f"{q.table.name}-{q.name}")
def test_claim_uses_the_partial_indexes(big_engine: sa.Engine, spec: QueueSpec) -> None:
    table = spec.table.name
    if big_engine.dialect.name in MARIADB:
        # Both locking reads (a claim that fills up on expired leases sends only the
        # first), explained with the parameters a real claim sent.
        [(_, parameters), *_] = [sp for sp in captured_claim_sql(big_engine, spec) if "SKIP LOCKED" in sp[0]]
        queue = WorkQueue(big_engine, spec)
        assert queue._locking is not None
        statements = [(str(select.compile(dialect=big_engine.dialect)), parameters) for select in queue._locking]
        with big_engine.connect() as conn:
            plan = mariadb_plans(conn, statements)
        text = "\n".join(map(str, plan))
        assert len(plan) == 2, f"both branches read:\n{text}"
        # A range of the queue's index for each branch ("ref" and "range"), never a
        # scan of the table ("ALL") nor of a whole index ("index").
        assert all(p["type"] in ("ref", "range", "ref_or_null") for p in plan), f"a scan:\n{text}"
        assert all(p["key"] == f"ix_{table}_{spec.name}_free" for p in plan), text
        return
    statement, parameters = captured_claim_sql(big_engine, spec)
    with big_engine.connect() as conn:
        if big_engine.dialect.name == "postgresql":
            plan = postgres_plans(conn, statement, parameters)
            scans = [line for line in plan if re.search(rf"Seq Scan on {table}\b", line)]
        else:
            plan = [r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
            scans = [line for line in plan if re.fullmatch(rf"\s*SCAN {table}", line)]
    text = "\n".join(plan)
    assert not scans, f"sequential scan of {table}:\n{text}"
    for index in (f"ix_{table}_{spec.name}_free", f"ix_{table}_{spec.name}_leased"):
        assert index in text, f"{index} unused:\n{text}"
    if big_engine.dialect.name == "postgresql":
        generic = text.split("-- generic plan --")[1]
        assert f"ix_{table}_{spec.name}_free" in generic, f"generic plan:\n{generic}"


def test_the_polite_claim_of_due_sources_is_index_scans_too(big_engine: sa.Engine) -> None:
    """The due-source claim with its politeness conditions (pipeline/fetching/politeness.py):
    every statement it sends reads sources through indexes, including the count of a
    group's fetches in flight (ix_sources_politeness_leased)."""
    with big_engine.begin() as conn:
        politeness.set_limits(conn, politeness.DEFAULT, max_in_flight=100_000, min_interval_seconds=0)
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "sources" in statement and not statement.lstrip().upper().startswith(("INSERT", "BEGIN")):
            seen.append((statement, parameters))

    sa.event.listen(big_engine, "before_cursor_execute", capture)
    queue = PoliteQueue(big_engine, record_started=True)  # as the collector claims
    try:
        claim = queue.claim("probe", 10)
    finally:
        sa.event.remove(big_engine, "before_cursor_execute", capture)
    assert claim, "the populated table has claimable sources"
    if big_engine.dialect.name == "postgresql":
        # Sent by psycopg itself, past SQLAlchemy's events: the SQL compiled once.
        assert not seen and queue._claim_sql is not None
        seen.append((queue._claim_sql.sql, queue._claim_sql.arguments(queue._claim_params("probe", 10)[1])))
    plans = []
    with big_engine.connect() as conn:
        for statement, parameters in seen:
            if big_engine.dialect.name in MARIADB:
                accesses = [p for p in mariadb_plans(conn, [(statement, parameters)]) if p["table"] == "sources"]
                assert all(p["type"] not in ("ALL", "index") for p in accesses), f"a scan of sources:\n{accesses}"
                plans.append("\n".join(str(p["key"]) for p in accesses))
                continue
            if big_engine.dialect.name == "postgresql":
                plan = [r[0] for r in explain_raw(conn, "EXPLAIN", statement, parameters)]
                scans = [line for line in plan if re.search(r"Seq Scan on sources\b", line)]
            else:
                plan = [r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)]
                scans = [line for line in plan if re.fullmatch(r"\s*SCAN sources", line)]
            text = "\n".join(plan)
            assert not scans, f"sequential scan of sources:\n{statement}\n{text}"
            plans.append(text)
    everything = "\n".join(plans)
    assert "ix_sources_due_free" in everything and "ix_sources_politeness_leased" in everything, everything


def test_the_polite_claim_counts_a_groups_fetches_once_not_once_per_due_source(pg_engine: sa.Engine) -> None:
    """Whether a group has room (its fetches in flight under its limit) is the group's,
    not each source's: the polite claim finds the open groups once per statement. Asked
    per due source, PostgreSQL counted every group's fetches in flight for each due
    source whenever its statistics said few were due (taken when they were not, as
    here, or none yet, as on a new table): due sources x groups counts per claim."""
    groups, per_group = 4, 125
    later = now() + timedelta(hours=1)
    with pg_engine.begin() as conn:
        for g in range(groups):
            politeness.set_limits(conn, f"host{g}", max_in_flight=10_000, min_interval_seconds=0)
            bulk.insert_rows(conn, schema.sources, [
                {"name": f"s{g}-{i}", "url": f"http://127.0.0.1/{g}/{i}", "source_type": "rss",
                 "politeness_group": f"host{g}", "next_fetch_at": later} for i in range(per_group)])
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE sources, politeness_groups")  # while none is due
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))  # now every one is
    queue = PoliteQueue(pg_engine, record_started=True)
    assert len(queue.claim("w", 24)) == 24  # fetches in flight, for the count to read
    assert queue._claim_sql is not None
    with pg_engine.connect() as conn:  # EXPLAIN ANALYZE runs the claim: rolled back
        [[plan]] = explain_raw(conn, "EXPLAIN (ANALYZE, FORMAT JSON)", queue._claim_sql.sql,
                               queue._claim_sql.arguments(queue._claim_params("w", 8)[1]))
        conn.rollback()

    def nodes(node: dict) -> Iterator[dict]:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    counts = [n for n in nodes(plan[0]["Plan"]) if n.get("Index Name") == "ix_sources_politeness_leased"]
    assert counts, "the fetches in flight are counted by their index"
    loops = sum(n["Actual Loops"] for n in counts)
    # Once per group (the default's too) to find the open ones, once per locked group to
    # re-check its room.
    assert loops <= 2 * (groups + 1), f"{loops} counts of a group's fetches in flight for {groups} groups"

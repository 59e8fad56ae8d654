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
from datetime import UTC, timedelta

import psycopg.sql
import pytest
import sqlalchemy as sa

from pipeline.backends.mariadb import MARIADB
from pipeline.core import politeness
from pipeline.fetching.politeness import SCAN_FACTOR, PoliteQueue
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import QueueSpec
from pipeline.storage import bulk, db, politeness_groups, schema, status
from tests.conftest import ALL_BACKENDS, conformance
from tests.databases import MariaDatabases, PostgresDatabases
from tests.helpers import now

ROWS = 100_000

# One worker builds the populated databases, once (dev.py runs xdist with --dist loadgroup).
pytestmark = [pytest.mark.slow, conformance, pytest.mark.xdist_group("claim_plans")]


# The rows are made by the database, from a series of integers ``i`` (INSERT ... SELECT):
# most rows done; 1% waiting, 0.5% leased, 0.5% with an expired lease. Building 400,000
# rows in Python and binding them took 30-45 s a database; this takes a few.
WAITING = sa.literal_column("i % 100").in_([1, 2, 3])
LEASED = WAITING & (sa.literal_column("i % 200") == 1)
EXPIRED = WAITING & (sa.literal_column("i % 200") == 2)


def _series(dialect: str) -> sa.Subquery:
    """The integers 0 .. ROWS - 1, as column ``i``, from the database itself."""
    if dialect == "postgresql":
        sql = f"SELECT i FROM generate_series(0, {ROWS - 1}) AS n(i)"
    elif dialect in MARIADB:  # its Sequence engine's tables
        sql = f"SELECT CAST(seq AS SIGNED) AS i FROM seq_0_to_{ROWS - 1}"
    else:
        sql = f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS - 1}) SELECT i FROM n"
    return sa.text(sql).columns(sa.column("i", sa.Integer)).subquery("n")


def _seconds_from(dialect: str, t, seconds: str) -> sa.ColumnElement:
    """``t`` plus ``seconds`` (SQL over ``i``), stored as the dialect stores UTCDateTime."""
    naive = t.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ")
    if dialect == "postgresql":
        return sa.literal_column(f"(TIMESTAMPTZ '{naive}+00' + ({seconds}) * INTERVAL '1 second')")
    if dialect in MARIADB:
        return sa.literal_column(f"TIMESTAMPADD(SECOND, {seconds}, TIMESTAMP '{naive}')")
    return sa.literal_column(f"strftime('%Y-%m-%d %H:%M:%f', '{naive}', ({seconds}) || ' seconds')")


def _claim_state(dialect: str, t) -> dict[str, sa.ColumnElement]:
    return {
        "locked_until": sa.case((LEASED, _seconds_from(dialect, t, "300")), (EXPIRED, _seconds_from(dialect, t, "-300"))),
        "claimed_by": sa.case((LEASED | EXPIRED, sa.literal("w"))),
        "claim_token": sa.case((LEASED, sa.literal("x")), (EXPIRED, sa.literal("y"))),
    }


def _insert_from(conn: sa.Connection, table: sa.Table, columns: dict[str, sa.ColumnElement], source) -> None:
    select = sa.select(*(c.label(name) for name, c in columns.items())).select_from(source)
    conn.execute(sa.insert(table).from_select(list(columns), select))


def populate(conn: sa.Connection) -> None:
    t, dialect, s = now(), conn.dialect.name, schema
    n = _series(dialect)
    i = sa.cast(n.c.i, sa.String)
    before = f"i - {ROWS}"  # ROWS - i seconds before t
    _insert_from(conn, s.sources, {
        "name": sa.literal("s") + i,
        "url": sa.literal("http://127.0.0.1/") + i,
        "source_type": sa.literal("rss"),
        "enabled": sa.literal_column("i % 50") != 7,
        "next_fetch_at": sa.case((WAITING, _seconds_from(dialect, t, "-3600")), else_=_seconds_from(dialect, t, "3600")),
        **_claim_state(dialect, t),
    }, n)
    source_id = conn.execute(sa.select(sa.func.min(s.sources.c.id))).scalar_one()
    _insert_from(conn, s.listings_raw, {
        "source_id": sa.literal(source_id),
        "source_item_id": i,
        "url": sa.literal("http://127.0.0.1/i"),
        "raw_json": sa.literal({}, s.listings_raw.c.raw_json.type),
        "content_hash": sa.literal("h"),
        "fetched_at": _seconds_from(dialect, t, before),
        "processed_at": sa.case((WAITING, sa.null()), else_=_seconds_from(dialect, t, "0")),
        **_claim_state(dialect, t),
    }, n)
    _insert_from(conn, s.listings, {
        "source_id": sa.literal(source_id),
        "source_item_id": i,
        "url": sa.literal("http://127.0.0.1/i"),
        "content_hash": sa.literal("h"),
        "updated_at": _seconds_from(dialect, t, before),
        "matched_at": sa.case((WAITING, sa.null()), else_=_seconds_from(dialect, t, "0")),
        **_claim_state(dialect, t),
    }, n)
    user = conn.execute(
        sa.insert(s.users)
        .values(name="u", channel="webhook", channel_url="http://127.0.0.1/h")
        .returning(s.users.c.id)
    ).scalar_one()
    # The notifications, one per listing: ``i`` is the listing's place among them.
    first = conn.execute(sa.select(sa.func.min(s.listings.c.id))).scalar_one()
    listed = sa.select((s.listings.c.id - first).label("i"), s.listings.c.id.label("listing_id")).subquery("n")
    _insert_from(conn, s.notifications, {
        "user_id": sa.literal(user),
        "listing_id": listed.c.listing_id,
        "cluster_id": listed.c.listing_id,
        "channel": sa.literal("webhook"),
        "status": sa.case((WAITING, sa.literal("pending")), else_=sa.literal("sent")),
        "next_attempt_at": _seconds_from(dialect, t, before),
        **_claim_state(dialect, t),
    }, listed)
    # What sources' owners are told, as many as the other queues hold.
    _insert_from(conn, s.source_alerts, {
        "source_id": sa.literal(source_id),
        "user_id": sa.literal(user),
        "event": sa.literal("failing"),
        "detail": sa.literal("d"),
        "status": sa.case((WAITING, sa.literal("pending")), else_=sa.literal("sent")),
        "next_attempt_at": _seconds_from(dialect, t, before),
        **_claim_state(dialect, t),
    }, n)
    # WebSub subscriptions: the due ones to ask, the rest to renew a day on (of removed
    # sources: no source, so any number of them).
    _insert_from(conn, s.websub_subscriptions, {
        "hub": sa.literal("http://127.0.0.1/hub"),
        "topic": sa.literal("http://127.0.0.1/") + i,
        "callback_token": sa.literal("t") + i,
        "secret": sa.literal("s"),
        "state": sa.literal("active"),
        "requested_at": _seconds_from(dialect, t, before),
        "due_at": sa.case((WAITING, _seconds_from(dialect, t, before)), else_=_seconds_from(dialect, t, "86400")),
        **_claim_state(dialect, t),
    }, n)


@pytest.fixture(scope="session", params=ALL_BACKENDS)
def big_engine(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[sa.Engine]:
    """One populated database per backend, shared by this module's read-only plan tests
    (session-scoped: an xdist worker may run other modules' tests between them, and a
    module-scoped fixture was then built again)."""
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
            conn.exec_driver_sql("ANALYZE TABLE sources, listings_raw, listings, notifications, source_alerts,"
                                  " websub_subscriptions")
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
        assert not seen and queue.claiming.claim_sql is not None
        return queue.claiming.claim_sql.sql, queue.claiming.claim_sql.arguments(queue._claim_params("probe", 10)[1])
    if engine.dialect.name in MARIADB:
        return seen  # the locking reads (expired leases, then free rows), and the UPDATE by ids
    assert len(seen) == 1
    return seen[0]


def explain_raw(conn: sa.Connection, explain: str, statement: str, arguments: list) -> list:
    """``explain`` (EXPLAIN and its options) of a statement with $n placeholders, as the
    driver's hot path sends it (``DriverStatement``): each row of the plan."""
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
        assert queue.claiming.locking is not None
        statements = [(str(select.compile(dialect=big_engine.dialect)), parameters) for select in queue.claiming.locking]
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
    free = _free_index(big_engine, spec)
    for index in (free, f"ix_{table}_{spec.name}_leased"):
        assert index in text, f"{index} unused:\n{text}"
    if big_engine.dialect.name == "postgresql":
        generic = text.split("-- generic plan --")[1]
        assert free in generic, f"generic plan:\n{generic}"


def _free_index(engine: sa.Engine, spec: QueueSpec) -> str:
    """The index a claim reads the queue's free rows from: on PostgreSQL a queue ordered
    by an aged priority reads them a level at a time, from its level index."""
    if engine.dialect.name == "postgresql" and spec.aged is not None:
        return f"ix_{spec.table.name}_{spec.name}_levels"
    return f"ix_{spec.table.name}_{spec.name}_free"


def test_the_polite_claim_of_due_sources_is_index_scans_too(big_engine: sa.Engine) -> None:
    """The due-source claim with its politeness conditions (pipeline/fetching/politeness.py):
    every statement it sends reads sources through indexes, including the count of a
    group's fetches in flight (ix_sources_politeness_leased)."""
    with big_engine.begin() as conn:
        politeness_groups.set_limits(conn, politeness.DEFAULT, max_in_flight=100_000, min_interval_seconds=0)
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
        assert not seen and queue.claiming.claim_sql is not None
        seen.append((queue.claiming.claim_sql.sql, queue.claiming.claim_sql.arguments(queue._claim_params("probe", 10)[1])))
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
    free = _free_index(big_engine, schema.SOURCES_DUE)
    assert free in everything and "ix_sources_politeness_leased" in everything, everything


# SQLite reads every free source here, as its claim of due sources does (the embedded
# default: one machine's sources; docs/deployment.md): its planner takes no partial index
# for "next_fetch_at IS NULL OR next_fetch_at <= ?".
@pytest.mark.parametrize("big_engine", ["postgresql", "mariadb"], indirect=True)
def test_the_wait_for_room_reads_the_due_sources_by_index(big_engine: sa.Engine) -> None:
    """``PoliteQueue.next_start_in`` (asked after every claim that came back short, so
    many times a minute a collector) finds the groups of the due sources through the
    claim's two indexes, never by reading every source. As one ``free or expired``
    condition it was a sequential scan of the table on PostgreSQL: 41 ms with 1,000 of
    200,000 sources due (bench/RESULTS.md), growing with the sources, not the due."""
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if "politeness_groups" in statement and "min(" in statement.lower():
            seen.append((statement, parameters))

    queue = PoliteQueue(big_engine, record_started=True)
    sa.event.listen(big_engine, "before_cursor_execute", capture)
    try:
        assert queue.next_start_in() is not None, "the populated table has due sources"
    finally:
        sa.event.remove(big_engine, "before_cursor_execute", capture)
    [(statement, parameters)] = seen
    with big_engine.connect() as conn:
        if big_engine.dialect.name in MARIADB:
            accesses = [p for p in mariadb_plans(conn, [(statement, parameters)]) if p["table"] == "sources"]
            text = "\n".join(map(str, accesses))
            assert accesses and all(p["type"] not in ("ALL", "index") for p in accesses), f"a scan of sources:\n{text}"
            return
        text = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
    assert not re.search(r"Seq Scan on sources\b", text), f"sequential scan of sources:\n{statement}\n{text}"
    assert "ix_sources_due_free" in text and "ix_sources_due_leased" in text, text


def test_when_the_next_source_comes_due_is_one_round_trip_of_index_probes(pg_engine: sa.Engine) -> None:
    """``next_due_in`` (every look of the due-sources sensor, and of a lingering run
    between its passes) is one statement that reads a few entries of the sources'
    indexes, not all of them. As the min of ``coalesce(next_fetch_at, now())`` it read
    every free source: 40 ms at 200,000 sources (bench/RESULTS.md), an index scan that no
    "Seq Scan" check catches; and it asked for a lease run out in a round trip of its own.
    A database of its own (``pg_engine``): 3,000 sources, none due, none leased."""
    with pg_engine.begin() as conn:
        bulk.insert_rows(conn, schema.sources, [
            {"name": f"s{i}", "url": f"http://127.0.0.1/{i}", "source_type": "rss",
             "next_fetch_at": now() + timedelta(seconds=60 + i)} for i in range(3_000)])
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE sources")
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement, parameters))

    sa.event.listen(pg_engine, "before_cursor_execute", capture)
    try:
        with pg_engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")  # the connection's own first statements, out of the count
            seen.clear()
            assert 50 < status.next_due_in(conn) <= 60
    finally:
        sa.event.remove(pg_engine, "before_cursor_execute", capture)
    [(statement, parameters)] = seen
    with pg_engine.connect() as conn:
        [[plan]] = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).all()
    reads = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "sources"]
    read = sum(n["Actual Loops"] * n["Actual Rows"] for n in reads)
    assert reads and read <= 2, f"{read} sources read for the next due time:\n" + "\n".join(
        f"{n['Node Type']} {n.get('Index Name')} loops={n['Actual Loops']} rows={n['Actual Rows']}" for n in reads)


def _explained_claim_after_stale_statistics(engine: sa.Engine, groups: int, per_group: int) -> dict:
    """``groups`` groups of ``per_group`` sources, statistics taken while none was due,
    then every one due and 24 claimed (fetches in flight): the next polite claim's plan,
    run (EXPLAIN ANALYZE, rolled back)."""
    later = now() + timedelta(hours=1)
    with engine.begin() as conn:
        for g in range(groups):
            politeness_groups.set_limits(conn, f"host{g}", max_in_flight=10_000, min_interval_seconds=0)
            bulk.insert_rows(conn, schema.sources, [
                {"name": f"s{g}-{i}", "url": f"http://127.0.0.1/{g}/{i}", "source_type": "rss",
                 "politeness_group": f"host{g}", "next_fetch_at": later} for i in range(per_group)])
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE sources, politeness_groups")  # while none is due
        conn.execute(sa.update(schema.sources).values(next_fetch_at=None))  # now every one is
    queue = PoliteQueue(engine, record_started=True)
    assert len(queue.claim("w", 24)) == 24  # fetches in flight, for the count to read
    assert queue.claiming.claim_sql is not None
    with engine.connect() as conn:  # EXPLAIN ANALYZE runs the claim: rolled back
        [[plan]] = explain_raw(conn, "EXPLAIN (ANALYZE, FORMAT JSON)", queue.claiming.claim_sql.sql,
                               queue.claiming.claim_sql.arguments(queue._claim_params("w", 8)[1]))
        conn.rollback()
    return plan[0]["Plan"]


def _nodes(node: dict) -> Iterator[dict]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_the_polite_claim_counts_a_groups_fetches_once_not_once_per_due_source(pg_engine: sa.Engine) -> None:
    """Whether a group has room (its fetches in flight under its limit) is the group's,
    not each source's: the polite claim finds the groups with no room once per statement. Asked
    per due source, PostgreSQL counted every group's fetches in flight for each due
    source whenever its statistics said few were due (taken when they were not, as
    here, or none yet, as on a new table): due sources x groups counts per claim."""
    groups = 4
    plan = _explained_claim_after_stale_statistics(pg_engine, groups, 125)
    counts = [n for n in _nodes(plan) if n.get("Index Name") == "ix_sources_politeness_leased"]
    assert counts, "the fetches in flight are counted by their index"
    loops = sum(n["Actual Loops"] for n in counts)
    # Once to find the full groups, once per locked group to re-check its room.
    assert loops <= 1 + groups, f"{loops} counts of a group's fetches in flight for {groups} groups"


def test_the_polite_claim_reads_no_count_per_group(pg_engine: sa.Engine) -> None:
    """The claim's cost does not grow with the groups: the groups with no room are
    found from the few waiting out their spacing and the fetches in flight, and the
    fetches are counted for the candidates' groups only. Looking through every group
    for the open ones counted each one's fetches in flight at every claim: 250 ms a
    claim at 100,000 groups against 11 at 2,000 (bench/polite_claim.py). Here 300
    groups of 2 sources: a claim of 8 looks at 32 due sources (``SCAN_FACTOR``)."""
    groups = 300
    plan = _explained_claim_after_stale_statistics(pg_engine, groups, 2)
    counts = [n for n in _nodes(plan) if n.get("Index Name") == "ix_sources_politeness_leased"]
    loops = sum(n["Actual Loops"] for n in counts)
    assert loops <= 1 + 8 * SCAN_FACTOR, f"{loops} counts of a group's fetches in flight for {groups} groups"


def test_the_polite_claim_looks_a_sources_group_up_not_through_every_open_group(pg_engine: sa.Engine) -> None:
    """Whether a due source's group is open is a lookup, whatever the statistics say.
    As ``IN (SELECT name FROM open_groups)``, PostgreSQL read the open groups again for
    each due source whenever its statistics said few were due: 1,612 due sources x 242
    open groups, claims of 33 ms on the simulated internet (bench/RESULTS.md).
    Here: 60 groups of 10 sources, every one due, statistics from when none was."""
    plan = _explained_claim_after_stale_statistics(pg_engine, 60, 10)
    scans = [n for n in _nodes(plan) if n.get("Node Type") == "CTE Scan" and n.get("CTE Name") == "closed_groups"]
    assert scans, "the groups with no room are a CTE of their own"
    read = sum(n["Actual Loops"] * max(n["Actual Rows"], 1) for n in scans)
    # Once per read (expired leases; free rows: on PostgreSQL the levels' due and
    # never-fetched rows, each read once whatever the levels), not once per due source.
    assert read <= 3, f"the groups with no room read {read} times:\n" + "\n".join(
        f"{n['Node Type']} loops={n['Actual Loops']} rows={n['Actual Rows']}" for n in scans)


@pytest.mark.parametrize("polite", [False, True], ids=["plain", "polite"])
def test_a_claim_of_due_sources_reads_a_few_of_them_however_many_are_due(pg_engine: sa.Engine, polite: bool) -> None:
    """A claim reads the due sources a priority level at a time, each level in its
    index's order, not all of them for a sort by aged priority: that made a claim's cost
    grow with the sources due (a polite claim of 8: 4 ms with 1,000 due, 92 with
    100,000; bench/polite_claim.py), so a backlog drained ever more slowly. Here 3,000
    due over three levels (60 never fetched) and 300 open groups: a claim of 8 reads
    at most two runs of ``claim_scan`` rows a level, not 3,000. A database of its own
    (``pg_engine``): it takes statistics of its rows, which the plan depends on."""
    due = 3_000
    with pg_engine.begin() as conn:
        politeness_groups.ensure_groups(conn, [f"host{g}" for g in range(300)])
        conn.execute(sa.update(schema.politeness_groups).values(max_in_flight=10_000, min_interval_ms=0))
        bulk.insert_rows(conn, schema.sources, [
            {"name": f"s{i}", "url": f"http://127.0.0.1/{i}", "source_type": "rss", "politeness_group": f"host{i % 300}",
             "priority": i % 3, "next_fetch_at": None if i % 50 == 0 else now() - timedelta(seconds=i)}
            for i in range(due)])
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE sources, politeness_groups")
    queue = PoliteQueue(pg_engine, record_started=True) if polite else WorkQueue(pg_engine, schema.SOURCES_DUE)
    assert len(queue.claim("w", 8)) == 8
    assert queue.claiming.claim_sql is not None
    with pg_engine.connect() as conn:  # EXPLAIN ANALYZE runs the claim: rolled back
        [[plan]] = explain_raw(conn, "EXPLAIN (ANALYZE, FORMAT JSON)", queue.claiming.claim_sql.sql,
                               queue.claiming.claim_sql.arguments(queue._claim_params("w", 8)[1]))
        conn.rollback()
    # The reads of free sources: by an index of them, or a scan of the table for them.
    reads = [n for n in _nodes(plan[0]["Plan"]) if n.get("Relation Name") == "sources" and (
        n.get("Index Name") in ("ix_sources_due_free", "ix_sources_due_levels")
        or "locked_until IS NULL" in n.get("Filter", ""))]
    assert reads
    read = sum(n["Actual Loops"] * n["Actual Rows"] for n in reads)
    scan = 8 * SCAN_FACTOR if polite else 8
    assert read <= 3 * 2 * scan + 4, f"{read} due sources read for a claim of 8:\n" + "\n".join(
        f"{n['Node Type']} {n.get('Index Name')} loops={n['Actual Loops']} rows={n['Actual Rows']}" for n in reads)

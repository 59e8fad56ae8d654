"""The production layout on one machine: Dagster's instance from deploy/dagster.yaml
(storage on PostgreSQL, the run queue, run monitoring and retries), a `dagster-daemon`
whose sensor launches collector runs, and two `pipeline collect` processes beside it, all
on one pipeline database on PostgreSQL. Every source is fetched exactly once.

Marked ``deploy``: it starts a Dagster daemon and collector processes (half a minute),
so the default run leaves it out and CI runs it beside the quickstart
(`python3 dev.py test -m "quickstart or deploy"`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.storage import db, schema
from tests.helpers import add_source, wait_until
from tests.http_server import Handler, LocalServer

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

ROOT = Path(__file__).resolve().parent.parent
SOURCES = 60


def feed(h: Handler) -> None:
    item = h.path.split("?", 1)[1]
    h.reply(200, (
        '<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>'
        f"<item><guid>{item}</guid><title>Item {item}</title><link>http://127.0.0.1/{item}</link></item>"
        "</channel></rss>"
    ).encode(), {"Content-Type": "application/rss+xml"})


def test_a_dagster_daemon_and_two_collectors_never_fetch_a_source_twice(pg_databases, tmp_path):
    """Processes and databases of its own: a Dagster daemon (its storage in a database of its own) and two collectors."""
    pipeline_db = pg_databases.url(pg_databases.migrated())
    dagster_db = pg_databases.create()
    engine = db.create_engine(pipeline_db)
    events = schema.ingestion_events

    def claimed(by_dagster: bool) -> int:
        run = events.c.run_id.is_not(None) if by_dagster else events.c.run_id.is_(None)
        with engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(events).where(
                events.c.event == "ingestion.started", run)).scalar_one())

    def overlapping_feed(h: Handler) -> None:
        # Every fetch waits until a collector process has claimed too, so the daemon's run
        # and the collectors overlap however slowly the processes start (a state, not a
        # moment: the fetch once slept 1 s, and on a busy machine the run did all 60).
        wait_until("a collector process's claim", lambda: claimed(by_dagster=False), 120, 0.2, fail=False)
        feed(h)

    server = LocalServer().start()
    server.routes["/feed"] = overlapping_feed
    with engine.begin() as conn:
        for i in range(SOURCES):
            add_source(conn, server.url(f"/feed?{i}"))

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "PIPELINE_"))},
        "DAGSTER_HOME": str(home),
        # dagster-postgres needs its own driver named (deploy/dagster.yaml says why).
        "DAGSTER_POSTGRES_URL": db.parse_url(pg_databases.url(dagster_db)).set(drivername="postgresql+psycopg2")
        .render_as_string(hide_password=False),
        "DATABASE_URL": pipeline_db,
        "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32",
        "PIPELINE_SENSOR_INTERVAL_SECONDS": "5",
        "PIPELINE_CONCURRENCY": "4",
        "PIPELINE_HTTP_TIMEOUT_SECONDS": "180",  # the run's fetches wait for the collectors
    }
    daemon_log = tmp_path / "daemon.log"
    with daemon_log.open("wb") as log:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        try:
            wait_until("a collector run launched by the daemon's sensor", lambda: claimed(by_dagster=True), 150)
        except AssertionError:
            print(daemon_log.read_text(errors="replace")[-5000:])
            raise
        collectors = [
            subprocess.Popen([sys.executable, "-m", "pipeline.cli", "collect", "--json", "--concurrency", "4"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        totals = []
        for collector in collectors:
            out, err = collector.communicate(timeout=120)
            assert collector.returncode == 0, err
            totals.append(json.loads(out.strip().splitlines()[-1]))

        def all_done() -> bool:
            with engine.connect() as conn:
                completed = conn.execute(sa.select(sa.func.count()).select_from(events).where(
                    events.c.event == "ingestion.completed")).scalar_one()
                held = conn.execute(sa.select(sa.func.count()).select_from(schema.sources).where(
                    schema.sources.c.locked_until.is_not(None))).scalar_one()
            return completed >= SOURCES and held == 0

        wait_until("every source fetched and released", all_done, 120)
    finally:
        os.killpg(daemon.pid, signal.SIGINT)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
        server.stop()

    with engine.connect() as conn:
        rows = conn.execute(sa.select(events.c.event, events.c.source_id, events.c.run_id)).all()
        raw = conn.execute(sa.select(schema.listings_raw.c.source_id)).scalars().all()
    engine.dispose()
    completed = Counter(r.source_id for r in rows if r.event == "ingestion.completed")
    started = Counter(r.source_id for r in rows if r.event == "ingestion.started")
    assert set(completed) == set(started) and len(completed) == SOURCES
    assert set(completed.values()) == {1} and set(started.values()) == {1}, "no source fetched twice"
    assert sorted(raw) == sorted(completed), "one item stored per source"
    by_dagster = sum(1 for r in rows if r.event == "ingestion.completed" and r.run_id is not None)
    by_cli = sum(t["claimed"] for t in totals)
    print(f"fetched by Dagster runs: {by_dagster}, by the two collectors: {[t['claimed'] for t in totals]}")
    assert by_dagster > 0 and by_cli > 0 and by_dagster + by_cli == SOURCES
    assert len(server.requests) == SOURCES

"""A partition, not a crash: a collector process cut off from PostgreSQL in the middle of
its batch, its connections left open but silent (tests/fault_proxy.py, on loopback).

While it is cut off, another worker takes its sources after their leases run out and
stores their items. When the link heals, the first worker's completions are refused by
the fencing token and counted as lost (``fenced_out``), or, when it was cut inside a
transaction, the server has ended that session (``idle_in_transaction_session_timeout``,
pipeline/storage/db.py) and nothing of it was kept. Either way every item is stored
once, becomes one listing and is notified once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline.core.settings import Settings
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier
from pipeline.storage import db, schema
from tests.fault_proxy import FaultProxy, postgres_upstream
from tests.helpers import wait_until
from tests.http_server import Handler
from tests.test_chaos import ITEMS, Site, check, seed, wait_done

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SOURCES = 6
LEASE_SECONDS = 3


class HeldSite(Site):
    """The chaos test's feeds and webhook receiver; each feed's first request is held
    until ``release`` is set (the cut-off worker is then in the middle of its batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.requests: dict[int, int] = {}
        self._lock = threading.Lock()

    def feed(self, h: Handler) -> None:
        n = int(h.path.split("?", 1)[1])
        with self._lock:
            self.requests[n] = self.requests.get(n, 0) + 1
        self.release.wait(120)
        super().feed(h)


@pytest.fixture
def site() -> Iterator[HeldSite]:
    s = HeldSite()
    yield s
    s.release.set()
    s.server.stop()


def leases_run_out(engine: sa.Engine) -> bool:
    s = schema.sources
    with engine.connect() as conn:
        held = conn.execute(
            sa.select(sa.func.count()).where(s.c.locked_until > sa.func.now())
        ).scalar_one()
        leased = conn.execute(sa.select(sa.func.count()).where(s.c.claimed_by.is_not(None))).scalar_one()
    return held == 0 and leased == SOURCES


def start_cut_off_worker(db_url: str, proxy: FaultProxy, log: Path) -> subprocess.Popen[bytes]:
    """``pipeline collect --json`` in a process of its own, reaching PostgreSQL only
    through ``proxy``; the server ends its sessions after 2 s idle in a transaction."""
    url = db.parse_url(db_url).set(
        host="127.0.0.1", port=proxy.port,
        query={"options": "-c idle_in_transaction_session_timeout=2000"},
    )
    env = {**os.environ, "DATABASE_URL": url.render_as_string(hide_password=False),
           "PIPELINE_ALLOW_NETWORKS": "127.0.0.1/32", "PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS),
           "PIPELINE_HTTP_TIMEOUT_SECONDS": "60"}
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "collect", "--json"],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err)


def fetching_all(site: HeldSite, worker: subprocess.Popen[bytes], tmp_path: Path) -> bool:
    if worker.poll() is not None:
        pytest.fail(f"the worker ended early: {(tmp_path / 'cut-off.log').read_text()[-3000:]}")
    return len(site.requests) == SOURCES


def take_over_and_finish(engine: sa.Engine, db_url: str, site: HeldSite) -> None:
    """The other worker, on a link that works: it takes the cut-off worker's sources
    once their leases ran out, then the processor and notifier finish the work."""
    settings = Settings(database_url=db_url, allow_networks=("127.0.0.1/32",), lease_seconds=60)
    stats = Collector(engine, settings, worker="other").run()
    assert (stats.succeeded, stats.items_new, stats.fenced_out) == (SOURCES, SOURCES * ITEMS, 0)
    expected = len(site.expected(SOURCES))
    Processor(engine, settings, "processor").run()
    Notifier(engine, settings, "notifier").run()
    wait_done("every listing processed and notified", engine, SOURCES, expected, 60, 0.2)


def attempts(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(schema.sources.c.attempts)).scalars())


def test_a_worker_cut_off_mid_batch_is_fenced_out_when_its_link_heals(pg_databases, site, tmp_path):
    """Cut while its fetches are in flight: its write waits on the silent link; another
    worker takes the sources after the lease and stores them; healed, the first
    worker's completions are refused by the fencing token, all six counted as lost."""
    db_url = pg_databases.url(pg_databases.migrated())
    engine = db.create_engine(db_url)
    seed(engine, site, SOURCES)
    proxy = FaultProxy(postgres_upstream(db_url))
    worker = start_cut_off_worker(db_url, proxy, tmp_path / "cut-off.log")
    try:
        wait_until("the worker fetching every source", lambda: fetching_all(site, worker, tmp_path), 120, 0.05)
        proxy.cut()
        site.release.set()  # its fetches finish; their write waits on the silent link
        wait_until("the cut-off worker's leases running out", lambda: leases_run_out(engine), 60, 0.1)
        assert worker.poll() is None, "the cut-off worker is still there, waiting"
        take_over_and_finish(engine, db_url, site)
        proxy.heal()
        out, _ = worker.communicate(timeout=120)
    finally:
        proxy.close()
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "cut-off.log").read_text()
    assert worker.returncode == 0, log[-3000:]
    totals = json.loads(out)
    print(f"cut-off worker: {totals}; requests per source: {sorted(site.requests.values())}")
    assert totals["claimed"] == SOURCES and totals["fenced_out"] == SOURCES, totals
    assert totals["fetched"] == 0 and totals["items_new"] == 0, "none of its results was kept"
    assert "changed nothing: they are no longer held" in log
    assert sorted(site.requests.values()) == [2] * SOURCES, "each source fetched by both, once each"
    assert attempts(engine) == [0] * SOURCES, "completed: the taking-over worker's fetch counted"
    check(engine, site, SOURCES)  # each item stored once, one listing, notified once
    engine.dispose()


def test_a_worker_cut_off_inside_its_write_transaction_holds_no_rows_for_long(pg_databases, site, tmp_path):
    """Cut just after its write transaction updated the sources (their rows locked,
    nothing committed): the server ends the silent session after its idle timeout,
    which frees the rows, so another worker takes them over after the lease. Without
    the timeout the rows stayed locked as long as the link stayed silent, and no other
    worker could take them (its claim skips locked rows). Healed, the first worker
    finds its session gone: its pass fails, having stored nothing."""
    db_url = pg_databases.url(pg_databases.migrated())
    engine = db.create_engine(db_url)
    seed(engine, site, SOURCES)
    proxy = FaultProxy(postgres_upstream(db_url))
    # The collector's completion of a batch (Collector._write -> WorkQueue.complete_each).
    proxy.cut_after(b"jsonb_to_recordset")
    worker = start_cut_off_worker(db_url, proxy, tmp_path / "cut-off.log")
    try:
        wait_until("the worker fetching every source", lambda: fetching_all(site, worker, tmp_path), 120, 0.05)
        site.release.set()
        wait_until("the link cut inside the worker's write", lambda: proxy.is_cut, 60, 0.05)
        cut_at = datetime.now(UTC)
        wait_until("the cut-off worker's leases running out", lambda: leases_run_out(engine), 60, 0.1)
        take_over_and_finish(engine, db_url, site)
        proxy.heal()
        worker.communicate(timeout=120)
    finally:
        proxy.close()
        if worker.poll() is None:
            worker.kill()
    log = (tmp_path / "cut-off.log").read_text()
    print(f"cut at {cut_at:%H:%M:%S}; cut-off worker exit {worker.returncode}: {log.strip().splitlines()[-1:]}")
    assert worker.returncode != 0, "its session was ended by the server: the pass failed"
    assert sorted(site.requests.values()) == [2] * SOURCES
    check(engine, site, SOURCES)
    engine.dispose()

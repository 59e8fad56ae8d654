"""`pipeline metrics` and `pipeline metrics serve`: the database's state in Prometheus's
text format, parsed back with the client library's own parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from datetime import timedelta

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from pipeline.storage import schema
from tests.conftest import conformance
from tests.helpers import add_raw_rows, add_source, free_port, now, wait_until
from tests.test_cli import assert_one_line_error, run


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def seed(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        overdue = add_source(conn, "http://127.0.0.1/a", next_fetch_at=now() - timedelta(minutes=5))
        add_source(conn, "http://127.0.0.1/b", consecutive_failures=2, last_failure_reason="timeout",
                   next_fetch_at=now() + timedelta(hours=1))
        add_source(conn, "http://127.0.0.1/c", locked_until=now() + timedelta(minutes=5), claimed_by="w",
                   claim_token="t")
        add_source(conn, "http://127.0.0.1/off", enabled=False)
        add_raw_rows(conn, overdue, 3)
        at = now() - timedelta(minutes=2)
        conn.execute(sa.insert(schema.ingestion_events), [
            {"event": schema.EVENT_STARTED, "source_id": overdue, "occurred_at": at,
             "scheduled_at": at - timedelta(seconds=late)} for late in (10, 20, 30)])


@conformance
def test_metrics_prints_each_queue_the_lateness_and_the_sources_once(engine, db_url):
    seed(engine)
    result = run("metrics", env={"DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    found = samples(result.stdout)
    assert found[("pipeline_queue_backlog", (("queue", "sources.due"),))] == 1
    assert 299 <= found[("pipeline_queue_oldest_age_seconds", (("queue", "sources.due"),))] <= 330
    assert found[("pipeline_queue_in_flight", (("queue", "sources.due"),))] == 1
    assert found[("pipeline_queue_backlog", (("queue", "listings_raw.unprocessed"),))] == 3
    assert found[("pipeline_queue_expired_leases", (("queue", "notifications.due"),))] == 0
    assert found[("pipeline_fetch_lateness_seconds", (("quantile", "0.5"),))] == 20
    assert found[("pipeline_fetch_lateness_seconds", (("quantile", "0.95"),))] == pytest.approx(29)
    assert found[("pipeline_fetch_lateness_fetches", ())] == 3
    assert found[("pipeline_sources", (("state", "enabled"),))] == 3
    assert found[("pipeline_sources", (("state", "disabled"),))] == 1
    assert found[("pipeline_sources_failing", (("reason", "timeout"),))] == 1
    assert found[("pipeline_notifications", (("status", "dead"),))] == 0


def test_metrics_serve_answers_scrapes_and_stops_on_ctrl_c(engine, db_url):
    """A process: the server is stopped as a user stops it, with SIGINT."""
    seed(engine)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "metrics", "serve", "--port", str(port)],
        env={**os.environ, "DATABASE_URL": db_url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        def scrape() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    return response.read().decode()
            except OSError:
                assert server.poll() is None, server.communicate()
                return None

        first = samples(wait_until("the metrics endpoint to answer", scrape, 60, every=0.2))
        assert first[("pipeline_queue_backlog", (("queue", "sources.due"),))] == 1
        with engine.begin() as conn:  # each scrape reads the database again
            add_source(conn, "http://127.0.0.1/new")
        assert samples(scrape() or "")[("pipeline_queue_backlog", (("queue", "sources.due"),))] == 2
    finally:
        server.send_signal(signal.SIGINT)
        _, err = server.communicate(timeout=30)
    assert server.returncode == 0, err
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in err


def test_metrics_against_an_unreachable_database_is_one_line(tmp_path):
    result = run("metrics", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert_one_line_error(result)


def _serving() -> int:
    """Threads of the metrics server handling a connection now."""
    import threading

    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def test_idle_connections_cannot_pile_up_threads_and_are_closed_after_the_read_timeout():
    """150 half-sent requests once held 152 threads open with no timeout. Waits for
    states only: the server closing what it refused, its threads ending when their
    clients go, a half-sent request closed after the read timeout (1 s here)."""
    import socket
    import threading

    from pipeline.web.server import serve

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"up 1\n"]

    # A read timeout longer than the test: no slot frees while the 150 connect.
    server = serve("127.0.0.1", 0, app, read_timeout=600.0, max_connections=4)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    idle = []
    try:
        for _ in range(150):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the rest
            idle.append(s)
        wait_until("four connections served", lambda: _serving() == 4, timeout=60, every=0.1)
        for s in idle[4:]:  # closed by the server at once: every slot is taken
            assert s.recv(1024) == b""
        assert _serving() == 4, "never more than four at once"
        for s in idle[:4]:
            s.close()  # their threads end with them
        wait_until("the server's threads to end", lambda: _serving() == 0, timeout=60, every=0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
            assert response.read() == b"up 1\n"
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()

    server = serve("127.0.0.1", 0, app, read_timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=60) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            assert s.recv(1024) == b"", "closed once the rest of the request did not come in time"
        wait_until("the server's threads to end", lambda: _serving() == 0, timeout=60, every=0.1)
    finally:
        server.shutdown()
        server.server_close()

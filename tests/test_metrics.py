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


def test_a_thousand_idle_or_dripping_connections_never_keep_a_request_from_being_answered():
    """`pipeline serve` and `metrics serve` share this server. 64 connections sending a
    header line every 4 s once held every slot of the old one (a thread each, a timeout
    per read); 16 took the metrics down. Here 500 connections send nothing, 500 send a
    request line and then a header byte every 0.2 s (a drip that a per-read timeout
    never cuts), 20 send a body byte by byte: every legitimate request is answered,
    and every dripper is cut at its deadline (2 s here). Waits for states only: each
    answer, and each connection's end. How fast the answers come under this load is
    measured, not asserted: bench/listening.py, bench/RESULTS.md."""
    import resource
    import socket
    import threading
    import time

    from pipeline.web.server import serve

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))

    def app(environ, start_response):
        environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"up 1\n"]

    threads_before = threading.active_count()
    server = serve("127.0.0.1", 0, app, deadline=2.0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    port = server.server_address[1]
    idle, dripping, bodies = [], [], []
    stop = threading.Event()
    try:
        for i in range(1_020):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            if i < 500:
                idle.append(s)
            elif i < 1_000:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: ")
                dripping.append(s)
            else:
                s.sendall(b"POST /websub/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
                bodies.append(s)

        def drip() -> None:
            while not stop.is_set():
                for s in dripping + bodies:
                    try:
                        s.send(b"x")
                    except OSError:
                        pass
                time.sleep(0.2)

        threading.Thread(target=drip, daemon=True).start()
        for _ in range(20):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
                assert response.read() == b"up 1\n"
        assert threading.active_count() - threads_before < 60, "no thread per connection"

        def ended(s: socket.socket) -> bytes:
            """What the server sent before it closed ``s`` (a reset, when our drip was
            unread, is a close too)."""
            data = b""
            try:
                while chunk := s.recv(4096):
                    data += chunk
            except ConnectionResetError:
                pass
            return data

        for s in idle + dripping:  # each waits for its end: the server closes it
            assert ended(s) == b"", "cut at the deadline, however it drips"
        for s in bodies:
            assert ended(s).startswith(b"HTTP/1.1 408 "), "a body that does not come in time: 408"
    finally:
        stop.set()
        for s in idle + dripping + bodies:
            s.close()
        server.shutdown()
        server.server_close()


def test_a_body_counts_against_the_budget_until_the_application_is_done_with_it(monkeypatch):
    """The bodies held at once are bounded (``BODY_BUDGET_BYTES``, 503 past it); a body
    stopped counting once it was read, while the application still held it, so the
    bound held only for bodies on their way in. Waits for a state: the first request
    inside the application."""
    import threading
    import urllib.error

    from pipeline.web import server as web_server

    monkeypatch.setattr(web_server, "BODY_BUDGET_BYTES", 150)
    inside, release = threading.Event(), threading.Event()

    def app(environ, start_response):
        environ["wsgi.input"].read()
        inside.set()
        release.wait(60)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"taken\n"]

    server = web_server.serve("127.0.0.1", 0, app, max_body_bytes=1_000)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/websub/x"
    answers: list[bytes] = []
    first = threading.Thread(target=lambda: answers.append(
        urllib.request.urlopen(urllib.request.Request(url, data=b"x" * 100), timeout=60).read()))
    try:
        first.start()
        assert inside.wait(60), "the first request reached the application"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, data=b"y" * 100), timeout=60)
        assert refused.value.code == 503, "the first body still counts while the application holds it"
        release.set()
        first.join(60)
        assert answers == [b"taken\n"]
        with urllib.request.urlopen(urllib.request.Request(url, data=b"z" * 100), timeout=60) as again:
            assert again.read() == b"taken\n", "counted no more once its request is answered"
    finally:
        release.set()
        server.shutdown()
        server.server_close()

"""The soak's audit (bench/soak.py ``audit``) tells a lost delivery from one the pipeline
refuses by design: the hour at 100,000 sources (bench/soak_stack.py) counted as lost
the items of the simulator's oversized feeds, whose answers are longer than the
pipeline reads (PIPELINE_MAX_RESPONSE_BYTES: the fetch fails as ``too_large``)."""

from __future__ import annotations

import argparse
import json
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.soak import audit, by_stage, start_receiver
from pipeline.core.settings import DEFAULT_MAX_RESPONSE_BYTES
from pipeline.storage import schema

PORT = 18400
FEED = f"http://127.1.0.1:{PORT}/f/0.xml"
LINK = f"{FEED}?item=0"


def run_audit(engine: sa.Engine, tmp_path: Path, answer_bytes: int, cpu: dict[str, float] | None = None) -> dict[str, object]:
    """One item, followed by one user, listed by one 200 answer of ``answer_bytes`` ten
    seconds after it appeared, and never delivered; ``cpu``: the stages' CPU seconds."""
    log = tmp_path / "internet.jsonl"
    log.write_text("\n".join(json.dumps(record) for record in (
        {"kind": "item", "at": 100.0, "feed": FEED, "link": LINK, "guid": "g0", "keywords": ["kw0001"]},
        {"kind": "request", "at": 110.0, "host": "127.1.0.1", "path": "/f/0.xml", "status": 200,
         "latency_ms": 150.0, "bytes": answer_bytes},
    )) + "\n")
    args = argparse.Namespace(port=PORT, hosts=1, feeds_per_host=1, interval=60, minutes=10.0, warmup=0.0)
    plan = {"users": [{"name": "user00000", "keywords": ["kw0001"]}]}
    return audit(engine, args, plan, log, tmp_path / "received.jsonl", (0.0, 600.0, 900.0), cpu or {}, [], {})


def test_an_item_listed_by_an_answer_the_pipeline_reads_and_never_delivered_is_lost_and_traced(
    engine: sa.Engine, tmp_path: Path,
) -> None:
    report = run_audit(engine, tmp_path, answer_bytes=2_000)
    assert report["lost"] == 1 and report["refused_as_too_large"] == 0
    assert report["lost_by_stage"] == {"no raw row (the fetch that listed it stored nothing)": 1}
    json.dumps(report)  # the run writes it as JSON


def test_a_lost_item_stored_raw_and_never_processed_is_traced_to_that_stage_and_the_report_is_json(
    engine: sa.Engine, tmp_path: Path,
) -> None:
    with engine.begin() as conn:
        source = conn.execute(sa.insert(schema.sources).values(
            name="feed", url=FEED, source_type="rss", config={}).returning(schema.sources.c.id)).scalar_one()
        conn.execute(sa.insert(schema.listings_raw).values(
            source_id=source, source_item_id="g0", url=LINK, raw_json={"title": "kw0001", "url": LINK},
            content_hash="h0", fetched_at=datetime(2026, 11, 28, tzinfo=UTC)))
    report = run_audit(engine, tmp_path, answer_bytes=2_000)
    assert report["lost_by_stage"] == {"raw row, no listing": 1}
    assert json.loads(json.dumps(report))["lost_traced"][0][3]["raw"][0]["fetched_at"].startswith("2026-11-28")


@pytest.mark.parametrize("answer_bytes", [DEFAULT_MAX_RESPONSE_BYTES + 1, 20_000_823])
def test_an_item_on_a_feed_whose_answers_are_longer_than_the_pipeline_reads_is_refused_not_lost(
    engine: sa.Engine, tmp_path: Path, answer_bytes: int,
) -> None:
    report = run_audit(engine, tmp_path, answer_bytes)
    assert report["lost"] == 0 and report["refused_as_too_large"] == 1


def test_the_notifiers_cpu_a_delivery_counts_every_message_delivered_in_the_window(
    engine: sa.Engine, tmp_path: Path,
) -> None:
    """The notifier's CPU in the window is spent on every message it delivers then, the
    first fetches' histories included, not only on the window's items: divided by the
    latter, the local soak reported 15.7 ms a message where it spent 3.4."""
    (tmp_path / "received.jsonl").write_text("\n".join(json.dumps(
        {"at": at, "user": "user00001", "id": f"notification-{n}", "links": [f"{FEED}?item=old{n}"]})
        for n, at in enumerate((10.0, 20.0, 30.0, 700.0))) + "\n")
    report = run_audit(engine, tmp_path, answer_bytes=2_000, cpu={"match": 0.01, "deliver": 0.02})
    assert report["messages_in_window"] == 3  # the one at 700 s came after the window
    assert report["notifier_cpu_ms_per_delivery"] == 10.0


def test_fetch_to_delivery_is_split_into_the_stages_it_waited_in(engine: sa.Engine) -> None:
    """The hour's fetch -> delivery p95 (14 s against 10) is only mended once it is known
    where it goes: each delivery's time from its item's first raw row, through its
    processing, its listing's matching and its notification's sending, to the receiver."""
    at = datetime(2026, 11, 28, 12, tzinfo=UTC)
    with engine.begin() as conn:
        source = conn.execute(sa.insert(schema.sources).values(
            name="feed", url=FEED, source_type="rss", config={}).returning(schema.sources.c.id)).scalar_one()
        # Two raw rows of the item (its first fetch, then a change): the first one counts.
        conn.execute(sa.insert(schema.listings_raw), [
            {"source_id": source, "source_item_id": "g0", "url": LINK, "raw_json": {"url": LINK},
             "content_hash": f"h{n}", "fetched_at": at + timedelta(seconds=60 * n),
             "processed_at": at + timedelta(seconds=60 * n + 2)} for n in (1, 0)])
        listing = conn.execute(sa.insert(schema.listings).values(
            source_id=source, source_item_id="g0", url=LINK, content_hash="h0",
            matched_at=at + timedelta(seconds=5)).returning(schema.listings.c.id)).scalar_one()
        user = conn.execute(sa.insert(schema.users).values(
            name="user00000", channel="webhook", channel_url="http://127.0.0.1:1/").returning(schema.users.c.id)
        ).scalar_one()
        conn.execute(sa.insert(schema.notifications).values(
            user_id=user, listing_id=listing, channel="webhook", status="sent", sent_at=at + timedelta(seconds=9)))
    arrived = (at + timedelta(seconds=8.5)).timestamp()
    stages = by_stage(engine, {("user00000", LINK): arrived, ("user00001", LINK): arrived})
    assert stages == {"stored -> processed": [2.0], "processed -> matched": [3.0], "matched -> sent": [4.0],
                      "sent -> received": [-0.5]}


def test_a_webhook_receiver_that_cannot_listen_stops_the_run_naming_the_port_and_why(tmp_path: Path) -> None:
    """A stack run stopped before its teardown left its receiver on the port; the next
    run's receiver died unseen and its deliveries went to the old run's log (an audit
    of nothing delivered). A port already listened on: the run stops, naming it and the
    error. Starts a process: the receiver is one."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit, match=f"127.0.0.1:{port}: OSError: .*[Aa]ddress already in use"):
            start_receiver(port, tmp_path / "received.jsonl")


def test_an_answer_sent_after_the_client_gave_up_is_logged_as_given_up_not_as_listing_its_items() -> None:
    """The simulator logs what the client saw: an answer whose latency outlasted the
    client's deadline reached nobody and is logged as given up (status 0, as a held
    answer is), not as a 200 that listed its feed's items. Logged as a 200, the hour at
    100,000 sources counted lost an item whose only answer after it appeared came in
    21.9 s, past the collector's 20 s deadline (its source then backing off past the
    end). Starts the simulator on a loopback address and waits for its log of each
    request (each answer waits its 1.5 s latency first): a state, not a moment."""
    import asyncio
    import io
    import time

    import httpx

    from bench.internet import Internet, Log, Settings

    with socket.socket() as probe:
        probe.bind(("127.1.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(hosts=1, feeds_per_host=1, port=port, median_ms=1500.0, p99_ms=1501.0, error_rate=0.0,
                        timeout_rate=0.0, limited_hosts=0.0, slow_hosts=0.0, oversized_hosts=0.0, history=2.0)
    log = Log(io.StringIO())

    async def ask(timeout: float) -> int | None:
        """The status the client read (None: it gave up), once the simulator logged it."""
        logged = log.requests
        async with httpx.AsyncClient(timeout=timeout) as client:
            try:
                status: int | None = (await client.get(f"http://127.1.0.1:{port}/f/0.xml")).status_code
            except httpx.TimeoutException:
                status = None
        deadline = time.monotonic() + 60
        while log.requests == logged:
            assert time.monotonic() < deadline, "the simulator never logged the request"
            await asyncio.sleep(0.05)
        return status

    async def scenario() -> tuple[int | None, int | None]:
        internet = Internet(settings, log)
        await internet.start()
        try:
            return await ask(timeout=0.3), await ask(timeout=30.0)
        finally:
            await internet.stop()

    assert asyncio.run(scenario()) == (None, 200)
    records = [json.loads(line) for line in log.out.getvalue().splitlines()]
    assert [r["status"] for r in records if r["kind"] == "request"] == [0, 200]

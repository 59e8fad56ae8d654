"""What a WebSub hub pushes (pipeline/fetching/websub.py), taken in: the callback's
distribution checked against its subscription's secret, read as its source's adapter
reads the source (``Pushable``: a feed, a YouTube channel), and stored as a fetch stores
it (``store_items``: the same item identity, so a pushed item and the next poll are one
item). The processor and the notifier take it from ``listings_raw`` as they take a
fetch's."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.core.errors import FetchError
from pipeline.core.settings import Settings
from pipeline.fetching import websub
from pipeline.fetching.collector import store_items
from pipeline.fetching.registry import push_reader
from pipeline.storage import counters, schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Received:
    """What became of one distribution: ``status`` to answer with, and why."""

    status: int  # 202 taken (or dropped unsigned), 410 no such subscription (any more), 400 unreadable
    reason: str
    stored: int = 0  # new or changed items
    source_id: int | None = None  # whose items they are


def receive(engine: Engine, settings: Settings, token: str, body: bytes, headers: Mapping[str, str]) -> Received:
    """Take a distribution pushed to ``/websub/<token>`` (``headers`` lower-cased)."""
    t, s = schema.websub_subscriptions, schema.sources
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.c.id, t.c.source_id, t.c.topic, t.c.secret, t.c.previous_secret,
                                     t.c.previous_secret_until, t.c.state, s.c.enabled, s.c.source_type)
                           .join(s, s.c.id == t.c.source_id).where(t.c.callback_token == token)).first()
    reader = None if row is None else push_reader(row.source_type)
    if row is None or row.state != websub.ACTIVE or not row.enabled or reader is None:
        # 410: the hub may end the subscription (section 7): no such token, a removed
        # source's (no source), one being ended or never verified.
        refused(engine, "no_subscription")
        return Received(410, "no such subscription")
    now = datetime.now(UTC)
    if not any(websub.signed(secret, body, headers.get("x-hub-signature"))
               for secret in websub.secrets_of(row.secret, row.previous_secret, row.previous_secret_until, now)):
        log.warning("source %s: a push with a bad or missing signature, dropped", row.source_id)
        refused(engine, "bad_signature")
        return Received(202, "bad or missing signature: dropped")
    try:
        items = reader.read_push(body, row.topic, headers.get("content-type"))[: settings.max_items_per_fetch]
    except FetchError as exc:
        log.warning("source %s: a push that is no feed: %s", row.source_id, exc.message)
        refused(engine, "not_a_feed")
        return Received(400, f"not a feed: {exc.message}")
    with engine.begin() as conn:
        if websub.repeated(conn, row.id, body, now):
            again = counters.tally()
            counters.WEBSUB_PUSHES.count(again, value="repeated")
            counters.add(conn, again)
            log.info("source %s: a push already taken, again (a replay or a hub's retry): not stored", row.source_id)
            return Received(202, "already taken: dropped", 0, row.source_id)
        stored = store_items(conn, [(row.source_id, items)]).get(row.source_id, 0)
        conn.execute(sa.update(t).where(t.c.callback_token == token)
                     .values(pushes=t.c.pushes + 1, last_push_at=now))
        taken = counters.tally()
        counters.WEBSUB_PUSHES.count(taken, value="taken")
        counters.ITEMS_STORED.count(taken, stored)
        counters.add(conn, taken)  # last: pipeline/storage/counters.py
    log.info("source %s: a push of %d items, %d new or changed", row.source_id, len(items), stored)
    return Received(202, "taken", stored, row.source_id)


def refused(engine: Engine, outcome: str) -> None:
    """Count a refused push (one of ``counters.PUSH_OUTCOMES``), in a transaction of its own."""
    _count_alone(engine, counters.WEBSUB_PUSHES, outcome)


def verified(engine: Engine, mode: str | None) -> None:
    """Count a hub's verification of intent: ``mode`` the one confirmed (``subscribe``,
    ``unsubscribe``, ``denied``), None when it was refused (404)."""
    outcome = {"subscribe": "subscribed", "unsubscribe": "unsubscribed", "denied": "denied"}.get(mode or "", "refused")
    _count_alone(engine, counters.WEBSUB_VERIFICATIONS, outcome)


def _count_alone(engine: Engine, counter: counters.Counter, value: str) -> None:
    """One of ``counter``'s ``value``, added in a transaction of its own (no work was
    done that a transaction would hold)."""
    counts = counters.tally()
    counter.count(counts, value=value)
    with engine.begin() as conn:
        counters.add(conn, counts)

"""WebSub (the W3C Recommendation): a source whose feed advertises a hub is pushed to,
seconds after it publishes, and polled only as a safety net (docs/runbook.md, "Push").

* **Discovery** (``discover``, section 4): the response's ``Link`` headers, else the
  document's ``<link rel="hub">`` and ``rel="self"`` (Atom's, or RSS's atom:link); the
  topic is ``self``, else the URL fetched.
* **Subscribing** (``ensure``, section 5.1): while ``PIPELINE_WEBSUB_CALLBACK_URL`` is
  set, a fetch that finds a hub asks it, from the fetch's own claim (so never twice at
  once for a source), with a callback ``<base>/websub/<token>`` whose token is 32 random
  bytes, a secret of its own, and the lease asked for (``LEASE``). The row is written
  first: a hub may verify before its answer to the request arrives. It asks again when
  nothing was verified within ``VERIFY_WITHIN``, the hub or topic moved, or the lease
  ends within ``RENEW_BEFORE``.
* **Verification** (``verify``, section 5.3): the callback echoes ``hub.challenge`` only
  for the mode and topic asked for, on that token; anything else is 404.
* **Distribution** (``push``, section 7): a body at most ``max_response_bytes``, whose
  ``X-Hub-Signature`` (sha1, sha256, sha384 or sha512) is the HMAC of the body under the
  subscription's secret, compared in constant time. One with a bad or missing signature
  is acknowledged (202) and dropped, as the Recommendation asks (a forger learns
  nothing). The body is read by the feed adapter and stored by the collector's own
  ``store_items``: a pushed item and the next poll are one item, never two alerts.
* **Safety cadence**: an actively pushed source is polled at most every
  ``PIPELINE_WEBSUB_SAFETY_HOURS`` (6); a lapsed or refused subscription leaves it on its
  own cadence.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urljoin

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.core.errors import FetchError
from pipeline.core.kinds import WebSubState
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher, FetchResult
from pipeline.storage import schema

log = logging.getLogger(__name__)

REQUESTED, ACTIVE, DENIED = WebSubState.REQUESTED, WebSubState.ACTIVE, WebSubState.DENIED
LEASE = timedelta(days=7)  # asked for; the hub's answer (hub.lease_seconds) is what holds
VERIFY_WITHIN = timedelta(hours=1)  # asked, and not verified by then: ask again
RENEW_BEFORE = timedelta(days=1)  # an active lease ending sooner is renewed
ASK_DENIED_AGAIN = timedelta(days=1)
CALLBACK_PATH = "/websub/"
SIGNATURES = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha384": hashlib.sha384, "sha512": hashlib.sha512}
_LINK = re.compile(rb"<(?:atom:)?link\b[^>]*>", re.IGNORECASE)
_ATTRIBUTE = re.compile(rb"""\b(rel|href)\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
_HEAD_BYTES = 65_536  # a feed names its hub near its start


def discover(result: FetchResult) -> tuple[str | None, str | None]:
    """(hub, topic) a fetched document advertises, or (None, None)."""
    hub, topic = result.links.get("hub"), result.links.get("self")
    if hub is None:
        for tag in _LINK.findall(result.body[:_HEAD_BYTES]):
            attributes = {m.group(1).lower(): (m.group(2) or m.group(3) or b"") for m in _ATTRIBUTE.finditer(tag)}
            rels = attributes.get(b"rel", b"").lower().split()
            href = attributes.get(b"href", b"").decode("utf-8", "replace").strip()
            if href and b"hub" in rels and hub is None:
                hub = urljoin(result.url, href)
            if href and b"self" in rels and topic is None:
                topic = urljoin(result.url, href)
    if hub is None or not hub.lower().startswith(("http://", "https://")):
        return None, None
    return hub, topic or result.url


@dataclass(frozen=True)
class Subscription:
    source_id: int
    hub: str
    topic: str
    callback_token: str
    secret: str
    state: str
    requested_at: datetime
    lease_until: datetime | None


def _row(conn: sa.Connection, **where: Any) -> Subscription | None:
    t = schema.websub_subscriptions
    row = conn.execute(sa.select(t.c.source_id, t.c.hub, t.c.topic, t.c.callback_token, t.c.secret, t.c.state,
                                 t.c.requested_at, t.c.lease_until)
                       .where(*(t.c[k] == v for k, v in where.items()))).mappings().first()
    return None if row is None else Subscription(**row)


def due(found: Subscription | None, hub: str, topic: str, now: datetime) -> bool:
    """Whether to ask the hub (again) for this source."""
    if found is None or (found.hub, found.topic) != (hub, topic):
        return True
    if found.state == REQUESTED:
        return now - found.requested_at > VERIFY_WITHIN
    if found.state == DENIED:
        return now - found.requested_at > ASK_DENIED_AGAIN
    if found.lease_until is not None and found.lease_until - now >= RENEW_BEFORE:
        return False
    return now - found.requested_at > VERIFY_WITHIN  # a renewal asked for lately is waited on


def callback_url(settings: Settings, token: str) -> str:
    assert settings.websub_callback_url is not None
    return f"{settings.websub_callback_url.rstrip('/')}{CALLBACK_PATH}{token}"


def ensure(engine: Engine, settings: Settings, fetcher: Fetcher, source_id: int, hub: str | None,
           topic: str | None) -> bool:
    """Ask ``hub`` to push ``topic`` to us if it is due (``due``); whether it was asked.
    ``hub`` None: the source's stored subscription's (a 304 names none), renewed when
    due. A hub that refuses the request is recorded (``last_error``) and asked again later."""
    now = datetime.now(UTC)
    t = schema.websub_subscriptions
    with engine.begin() as conn:
        found = _row(conn, source_id=source_id)
        if hub is None or topic is None:
            if found is None:
                return False
            hub, topic = found.hub, found.topic
        if not due(found, hub, topic, now):
            return False
        moved = found is None or (found.hub, found.topic) != (hub, topic)
        renewal = found is not None and not moved and found.state == ACTIVE
        if renewal:  # the same token and secret: pushes go on while the hub verifies again
            assert found is not None
            token, secret, state = found.callback_token, found.secret, ACTIVE
        else:
            token = secrets.token_urlsafe(32) if found is None or moved else found.callback_token
            secret, state = secrets.token_urlsafe(32), REQUESTED
        values = {"hub": hub, "topic": topic, "callback_token": token, "secret": secret, "state": state,
                  "requested_at": now, "last_error": None}
        if found is None:
            conn.execute(sa.insert(t).values(source_id=source_id, **values))
        else:
            conn.execute(sa.update(t).where(t.c.source_id == source_id).values(**values))
    form = {"hub.mode": "subscribe", "hub.topic": topic, "hub.callback": callback_url(settings, token),
            "hub.secret": secret, "hub.lease_seconds": str(int(LEASE.total_seconds()))}
    try:
        fetcher.post(hub, urlencode(form).encode(), {"Content-Type": "application/x-www-form-urlencoded"})
    except FetchError as exc:
        with engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.source_id == source_id, t.c.callback_token == token)
                         .values(last_error=f"the hub refused the subscription: {exc.message}"[:1000]))
        log.warning("source %s: the hub %s refused the subscription: %s", source_id, hub, exc.message)
    return True


def verify(engine: Engine, token: str, params: Mapping[str, str]) -> str | None:
    """The challenge to echo for a hub's verification of intent on ``token``, or None
    (answer 404): only for a subscription we asked for, of that topic."""
    mode, topic = params.get("hub.mode"), params.get("hub.topic")
    now = datetime.now(UTC)
    t = schema.websub_subscriptions
    with engine.begin() as conn:
        found = _row(conn, callback_token=token)
        if found is None or topic != found.topic:
            return None
        if mode == "denied":
            conn.execute(sa.update(t).where(t.c.callback_token == token)
                         .values(state=DENIED, last_error=f"the hub denied it: {params.get('hub.reason', '')}"[:1000]))
            return ""
        challenge = params.get("hub.challenge")
        if mode != "subscribe" or found.state not in (REQUESTED, ACTIVE) or not challenge:
            return None
        try:
            lease = timedelta(seconds=min(int(params.get("hub.lease_seconds", "")), 10 * 365 * 86400))
        except ValueError:
            lease = LEASE
        conn.execute(sa.update(t).where(t.c.callback_token == token)
                     .values(state=ACTIVE, verified_at=now, lease_until=now + lease, last_error=None))
    return challenge


def signed(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (``X-Hub-Signature: sha256=<hex>``) signs ``body`` under ``secret``."""
    method, _, digest = (header or "").partition("=")
    hashing = SIGNATURES.get(method.strip().lower())
    if hashing is None or not digest:
        return False
    expected = hmac.new(secret.encode(), body, hashing).hexdigest()
    return hmac.compare_digest(expected, digest.strip().lower())


def pushed(conn: sa.Connection, source_ids: Collection[int], now: datetime) -> set[int]:
    """The sources of ``source_ids`` pushed to now (verified, the lease running)."""
    t = schema.websub_subscriptions
    if not source_ids:
        return set()
    return set(conn.execute(sa.select(t.c.source_id).where(
        t.c.source_id.in_(source_ids), t.c.state == ACTIVE, t.c.lease_until > now)).scalars())


def any_subscribed(conn: sa.Connection) -> bool:
    return conn.execute(sa.select(schema.websub_subscriptions.c.source_id).limit(1)).first() is not None

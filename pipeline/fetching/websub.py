"""WebSub (the W3C Recommendation): a source whose feed advertises a hub is pushed to,
seconds after it publishes, and polled only as a safety net (docs/runbook.md, "Push").

* **Discovery** (``discover``, section 4): the response's ``Link`` headers, else the
  document's ``<link rel="hub">`` and ``rel="self"`` (Atom's, or RSS's atom:link); the
  topic is ``self``, else the URL fetched.
* **Subscribing** (``ensure``, section 5.1): while ``PIPELINE_WEBSUB_CALLBACK_URL`` is
  set, a fetch that finds a hub (a YouTube channel's is known: ``youtube.hub_for``) that
  may be given a secret (``trusted``: https, this machine, or any with
  ``PIPELINE_WEBSUB_PLAIN_HTTP_HUBS=on``) makes
  asking it due, with a callback ``<base>/websub/<token>`` whose token is 32 random
  bytes and a secret of its own. What a hub is asked, and when, is a claim queue
  (``WEBSUB_DUE``, ``ask_due``, run by the collector's runs): the first request, a
  renewal before the lease ends (``renew_at``), a retry when nothing was verified
  within ``retry_in``, and, once a source is disabled or removed (``end``), an
  unsubscription. A request is written (fenced) before it is sent: a hub may verify
  before its answer to the request arrives.
* **Verification** (``verify``, section 5.3): the callback echoes ``hub.challenge`` only
  for the mode and topic asked for, on that token (``unsubscribe`` only for an ending we
  asked for); anything else is 404.
* **Distribution** (``push``, section 7): a body at most ``max_response_bytes``, whose
  ``X-Hub-Signature`` (sha1, sha256, sha384 or sha512) is the HMAC of the body under the
  subscription's secret, compared in constant time. One with a bad or missing signature
  is acknowledged (202) and dropped, as the Recommendation asks (a forger learns
  nothing). The body is read by the feed adapter and stored by the collector's own
  ``store_items``: a pushed item and the next poll are one item, never two alerts.
* **Replays** (``secrets_of``, ``repeated``): a push is signed, not dated, so a captured
  one sent again verifies. Each push taken is remembered by its body's SHA-256
  (``websub_pushes``) and one that comes again is a repeat, acknowledged and not
  stored (it put a listing back to its superseded text). Digests are kept only while a
  secret that could sign them is accepted: a renewal gives the subscription a new
  secret, the one it replaced verifying beside it until the hub has verified the
  renewal and ``ROTATION_OVERLAP`` more (pushes it signed before), and the next
  renewal forgets the digests older than the current secret.
* **Push that cannot go silent** (``after_poll``): a source pushed to is
  still polled, every ``SAFETY_CADENCES`` of its own intervals (at most
  ``PIPELINE_WEBSUB_SAFETY_HOURS``). Hubs forget subscriptions (a restart, lost storage,
  a lease dropped early) and say nothing: a poll that finds items no push brought
  counts them (``missed``, ``pipeline_websub_missed_items_total``), asks the hub again
  at once and leaves the source on its own cadence until a push comes back; a
  subscription that has heard no push for ``SILENT_CADENCES`` of its source's
  intervals (a day at least) is asked again too. An expired, unverified, denied or
  missing subscription leaves its source on its own cadence; ``push_health``
  (pipeline/storage/health.py) says which
  (``sources show``, ``status``, the ``push_health`` check, a metric).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Collection, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from urllib.parse import urlencode, urljoin, urlsplit

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import log_failure
from pipeline.core.errors import FetchError
from pipeline.core.kinds import PushHealth, WebSubState
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher, FetchResult
from pipeline.queue.claim import WorkQueue
from pipeline.queue.heartbeat import Heartbeat
from pipeline.queue.spec import UNCLAIMED, Claim
from pipeline.storage import counters, schema
from pipeline.storage.bulk import ANY_UNIQUE_KEY, insert_ignoring_conflicts
from pipeline.storage.health import VERIFY_WITHIN, push_health
from pipeline.storage.rows import SubscriptionRow

log = logging.getLogger(__name__)

REQUESTED, ACTIVE, DENIED, UNSUBSCRIBING = (WebSubState.REQUESTED, WebSubState.ACTIVE, WebSubState.DENIED,
                                            WebSubState.UNSUBSCRIBING)
LEASE = timedelta(days=7)  # asked for; the hub's answer (hub.lease_seconds) is what holds
RENEW_BEFORE = timedelta(days=1)  # a lease is renewed this long before it ends (a fifth of a short one)
ASK_DENIED_AGAIN = timedelta(days=1)  # a denied subscription is asked again; the longest wait
MAX_UNSUBSCRIBE_ATTEMPTS = 5  # a hub that never verifies an ending: the row goes (pushes get 410)
BATCH = 16  # subscriptions claimed at once
# A pushed source is polled every this many of its own intervals (at most
# PIPELINE_WEBSUB_SAFETY_HOURS): a hub that stopped pushing is found out within them.
SAFETY_CADENCES = 4
# A subscription that has heard no push for this many of its source's intervals, and at
# least SILENT_AT_LEAST, is asked of its hub again (a hub that dropped it says nothing).
SILENT_CADENCES, SILENT_AT_LEAST = 8, timedelta(days=1)
# After a hub verifies a renewal (and its new secret), pushes signed with the secret
# it replaced are taken for this long: ones it sent before, or retries of them.
ROTATION_OVERLAP = timedelta(hours=1)
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


def _row(conn: sa.Connection, **where: Any) -> SubscriptionRow | None:
    t = schema.websub_subscriptions
    row = conn.execute(sa.select(t).where(*(t.c[k] == v for k, v in where.items()))).mappings().first()
    return None if row is None else cast(SubscriptionRow, dict(row))


def renew_at(now: datetime, lease: timedelta) -> datetime:
    """When a lease granted ``now`` is renewed: ``RENEW_BEFORE`` ahead of its end, or a
    fifth of it for a short one."""
    return now + lease - min(RENEW_BEFORE, lease / 5)


def retry_in(attempts: int) -> timedelta:
    """How long a request to a hub waits for its verification (or, refused, to be asked
    again): ``VERIFY_WITHIN``, doubling with each try in a row, a day at most."""
    return min(VERIFY_WITHIN * (1 << max(0, attempts - 1)), ASK_DENIED_AGAIN)


def callback_url(settings: Settings, token: str) -> str:
    assert settings.websub_callback_url is not None
    return f"{settings.websub_callback_url.rstrip('/')}{CALLBACK_PATH}{token}"


def trusted(hub: str, settings: Settings) -> bool:
    """Whether ``hub`` may be given a subscription's secret: over https, or plain http to
    this machine (loopback: nothing on the way), or to any plain-http hub when
    PIPELINE_WEBSUB_PLAIN_HTTP_HUBS is on. Over plain http anyone on the way reads the
    secret and can forge pushes (the Recommendation: it SHOULD be sent over https only)."""
    parts = urlsplit(hub)
    if parts.scheme.lower() == "https" or settings.websub_plain_http_hubs:
        return True
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure(engine: Engine, source_id: int, hub: str, topic: str) -> bool:
    """Make asking ``hub`` to push ``topic`` due now (``WEBSUB_DUE``) for a source whose
    fetch found them, unless it is asked for already: a source with no subscription, one
    whose hub or topic moved, or one that was being ended (its source enabled again). A
    new callback token and secret each time. Whether it was made due. Renewals and
    retries are the queue's own (``ask_due``)."""
    now = datetime.now(UTC)
    t = schema.websub_subscriptions
    with engine.begin() as conn:
        found = _row(conn, source_id=source_id)
        if found is not None and (found["hub"], found["topic"]) == (hub, topic) and found["state"] != UNSUBSCRIBING:
            return False
        values = {"hub": hub, "topic": topic, "callback_token": secrets.token_urlsafe(32),
                  "secret": secrets.token_urlsafe(32), "previous_secret": None, "previous_secret_until": None,
                  "secret_since": now, "state": REQUESTED, "requested_at": now, "due_at": now,
                  "attempts": 0, "verified_at": None, "lease_until": None, "last_error": None, **UNCLAIMED}
        if found is None:
            conn.execute(sa.insert(t).values(source_id=source_id, **values))
        else:
            conn.execute(sa.update(t).where(t.c.source_id == source_id).values(**values))
            # No secret that signed them is accepted any more.
            conn.execute(sa.delete(schema.websub_pushes).where(schema.websub_pushes.c.subscription_id == found["id"]))
    return True


def end(conn: sa.Connection, source_ids: Collection[int], *, removed: bool = False) -> None:
    """The subscriptions of sources just disabled (or, ``removed``, about to be deleted)
    are ended: the hub is asked to stop at once (``ask_due``). A removed source's
    subscription keeps no source (its id may be given to another)."""
    if not source_ids:
        return
    t = schema.websub_subscriptions
    values: dict[str, Any] = {"state": UNSUBSCRIBING, "due_at": datetime.now(UTC), "attempts": 0, **UNCLAIMED}
    if removed:
        values["source_id"] = None
    conn.execute(sa.update(t).where(t.c.source_id.in_(list(source_ids))).values(**values))


def ask_due(engine: Engine, settings: Settings, fetcher: Fetcher, worker: str, *, limit: int = 1000) -> int:
    """Ask the hubs what is due of them (``WEBSUB_DUE``: subscribe, renew, unsubscribe),
    claimed as every piece of work is; how many were claimed."""
    queue = WorkQueue(engine, schema.WEBSUB_DUE, lease_seconds=settings.lease_seconds, row=SubscriptionRow)
    taken = 0
    # A claim's rows are asked one after another, each up to a request's timeout: their
    # leases are kept alive until each is written.
    with Heartbeat(queue) as heartbeat:
        while taken < limit and (claim := queue.claim(worker, min(BATCH, limit - taken))):
            taken += len(claim)
            heartbeat.hold(claim)
            for row in claim.rows:
                try:
                    _ask(engine, settings, fetcher, queue, claim, row, heartbeat)
                except Exception as exc:  # noqa: BLE001 (one hub's trouble never stops the others)
                    log_failure(log, exc, "asking the hub %s for subscription %s failed", row["hub"], row["id"])
                finally:
                    heartbeat.drop(claim, [row["id"]])
    return taken


def _ask(engine: Engine, settings: Settings, fetcher: Fetcher, queue: WorkQueue[SubscriptionRow], claim: Claim[SubscriptionRow],
         row: SubscriptionRow, heartbeat: Heartbeat) -> None:
    """One claimed subscription: the request it is due, written (fenced) before it is
    sent, as a hub may verify before its answer arrives."""
    t, s = schema.websub_subscriptions, schema.sources
    now = datetime.now(UTC)
    with engine.begin() as conn:
        enabled = row["source_id"] is not None and bool(conn.execute(
            sa.select(s.c.enabled).where(s.c.id == row["source_id"])).scalar())
        leaving = row["state"] == UNSUBSCRIBING or not enabled
        lease_runs = row["lease_until"] is not None and row["lease_until"] > now
        if leaving and (not lease_runs or queue.spec.exhausted(row, MAX_UNSUBSCRIBE_ATTEMPTS)):
            # Nothing the hub holds (never verified, or lapsed), or a hub that never
            # verifies: the row goes, and a push to its callback is answered 410 Gone.
            queue.complete(claim, {"due_at": None}, ids=[row["id"]], conn=conn)
            conn.execute(sa.delete(t).where(t.c.id == row["id"], t.c.callback_token == row["callback_token"]))
            return
        if not leaving and not trusted(row["hub"], settings):
            # Its secret is not sent in clear (a subscription made before the rule, or
            # with PIPELINE_WEBSUB_PLAIN_HTTP_HUBS since turned off): it is let go, and
            # its source is polled at its own cadence.
            log.info("subscription %s: the hub %s is plain http; its secret is not sent over it", row["id"], row["hub"])
            queue.complete(claim, {"due_at": None}, ids=[row["id"]], conn=conn)
            conn.execute(sa.delete(t).where(t.c.id == row["id"], t.c.callback_token == row["callback_token"]))
            return
        mode = "unsubscribe" if leaving else "subscribe"
        state = UNSUBSCRIBING if leaving else ACTIVE if row["state"] == ACTIVE else REQUESTED  # a renewal stays active
        values: dict[str, Any] = {"state": state, "requested_at": now,
                                  "due_at": now + retry_in(row["attempts"]), "last_error": None}
        secret = row["secret"]
        if state == ACTIVE and not rotating(row["previous_secret"], row["previous_secret_until"]):
            secret = secrets.token_urlsafe(32)
            values |= {"secret": secret, "previous_secret": row["secret"], "previous_secret_until": None,
                       "secret_since": now}
        if not queue.complete(claim, values, ids=[row["id"]], conn=conn).done:
            return  # fenced out: the row was changed (moved, ended) while claimed
        if secret != row["secret"] and row["secret_since"] is not None:
            # The secret before the one now replaced is no longer accepted: what only it
            # could have signed cannot verify again.
            p = schema.websub_pushes
            conn.execute(sa.delete(p).where(p.c.subscription_id == row["id"], p.c.received_at < row["secret_since"]))
    heartbeat.drop(claim, [row["id"]])  # written: its lease is gone, not to be extended
    form = {"hub.mode": mode, "hub.topic": row["topic"], "hub.callback": callback_url(settings, row["callback_token"])}
    if mode == "subscribe":
        form.update({"hub.secret": secret, "hub.lease_seconds": str(int(LEASE.total_seconds()))})
    error = None
    try:
        fetcher.post(row["hub"], urlencode(form).encode(), {"Content-Type": "application/x-www-form-urlencoded"})
    except FetchError as exc:
        error = f"the hub refused to {mode}: {exc.message}"
        log.warning("subscription %s: %s (%s)", row["id"], error, row["hub"])
    counts = counters.tally()
    counters.WEBSUB_HUB_REQUESTS.count(counts, value=mode if error is None else "failed")
    with engine.begin() as conn:  # the outcome and its count, in one transaction
        if error is not None:
            conn.execute(sa.update(t).where(t.c.id == row["id"], t.c.callback_token == row["callback_token"])
                         .values(last_error=error[:1000]))
        counters.add(conn, counts)  # last: pipeline/storage/counters.py


def verify(engine: Engine, token: str, params: Mapping[str, str]) -> str | None:
    """The challenge to echo for a hub's verification of intent on ``token``, or None
    (answer 404): only for a subscription (or an ending) we asked for, of that topic."""
    mode, topic, challenge = params.get("hub.mode"), params.get("hub.topic"), params.get("hub.challenge")
    now = datetime.now(UTC)
    t = schema.websub_subscriptions
    mine = t.c.callback_token == token
    with engine.begin() as conn:
        found = _row(conn, callback_token=token)
        if found is None or topic != found["topic"]:
            return None
        if mode == "denied":
            if found["state"] == UNSUBSCRIBING:
                conn.execute(sa.delete(t).where(mine))
            else:
                conn.execute(sa.update(t).where(mine).values(
                    state=DENIED, due_at=now + ASK_DENIED_AGAIN, **UNCLAIMED,
                    last_error=f"the hub denied it: {params.get('hub.reason', '')}"[:1000]))
            return ""
        if not challenge:
            return None
        if mode == "unsubscribe" and found["state"] == UNSUBSCRIBING:
            conn.execute(sa.delete(t).where(mine))
            return challenge
        if mode != "subscribe" or found["state"] not in (REQUESTED, ACTIVE):
            return None
        try:
            lease = timedelta(seconds=min(max(int(params.get("hub.lease_seconds", "")), 60), 10 * 365 * 86400))
        except ValueError:
            lease = LEASE
        overlap = {"previous_secret_until": now + ROTATION_OVERLAP} if rotating(found["previous_secret"], found["previous_secret_until"]) else {}
        conn.execute(sa.update(t).where(mine).values(
            state=ACTIVE, verified_at=now, lease_until=now + lease, due_at=renew_at(now, lease), attempts=0,
            last_error=None, **overlap, **UNCLAIMED))
    return challenge


def rotating(previous_secret: str | None, previous_secret_until: datetime | None) -> bool:
    """Whether a renewal's new secret waits for its hub's verification (the one it
    replaced verifying pushes meanwhile, with no end set yet)."""
    return previous_secret is not None and previous_secret_until is None


def secrets_of(secret: str, previous: str | None, previous_until: datetime | None, now: datetime) -> list[str]:
    """The secrets a push to a subscription may be signed with: its own, and while a
    renewal's overlap lasts, the one it replaced."""
    return [secret] + ([previous] if previous is not None and (previous_until is None or previous_until > now) else [])


def repeated(conn: sa.Connection, subscription_id: int, body: bytes, now: datetime) -> bool:
    """Whether ``body`` was pushed to the subscription before (a replay, or a hub's
    redelivery); if not, it is remembered, in ``conn``'s transaction (with what it stores)."""
    digest = hashlib.sha256(body).hexdigest()
    return insert_ignoring_conflicts(conn, schema.websub_pushes, [
        {"subscription_id": subscription_id, "digest": digest, "received_at": now}], ANY_UNIQUE_KEY) == 0


def signed(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` (``X-Hub-Signature: sha256=<hex>``) signs ``body`` under ``secret``."""
    method, _, digest = (header or "").partition("=")
    hashing = SIGNATURES.get(method.strip().lower())
    if hashing is None or not digest:
        return False
    expected = hmac.new(secret.encode(), body, hashing).hexdigest()
    # As bytes: compare_digest refuses a str with any non-ASCII character (a hostile
    # header's), and a refusal is a push not signed, never an error.
    return hmac.compare_digest(expected.encode(), digest.strip().lower().encode("utf-8", "replace"))


def safety_poll(cadence: timedelta, safety_hours: int) -> timedelta:
    """How long after a poll a source its hub pushes to is polled again: ``SAFETY_CADENCES``
    of its own interval ``cadence``, at most ``safety_hours``, never less than ``cadence``."""
    return max(cadence, min(cadence * SAFETY_CADENCES, timedelta(hours=safety_hours)))


def after_poll(conn: sa.Connection, cadences: Mapping[int, timedelta], unpushed: Callable[[int], int],
               now: datetime) -> set[int]:
    """Take what good polls of sources (``cadences``: each one's interval, by source id)
    say of their subscriptions; the sources still pushed to, to be polled at the safety
    cadence only. ``unpushed(source_id)``: the items the poll stores that no push
    brought (new or changed), asked of the sources pushed to only. A poll that found
    such items: counted as missed by push, the hub asked again at once, the source left
    on its own cadence until a push comes. A subscription that has heard no push for
    long (``SILENT_CADENCES``): the hub asked again."""
    t = schema.websub_subscriptions
    if not cadences:
        return set()
    rows = conn.execute(sa.select(t.c.id, t.c.source_id, t.c.verified_at, t.c.last_push_at,
                                  push_health(t, now).label("health"))
                        .where(t.c.source_id.in_(list(cadences)))).all()
    pushed, missed, silent = set(), {}, []
    for row in rows:
        if row.health != PushHealth.PUSHED:
            continue
        if n := unpushed(row.source_id):
            missed[row.id] = (row.source_id, n)
            continue
        pushed.add(row.source_id)
        heard = max((when for when in (row.verified_at, row.last_push_at) if when is not None), default=now)
        if now - heard > max(cadences[row.source_id] * SILENT_CADENCES, SILENT_AT_LEAST):
            silent.append(row.id)
    if missed:
        counts = counters.tally()
        for sub_id, (source_id, n) in missed.items():
            log.warning("source %s: a poll found %d items its hub never pushed; asking the hub again and polling"
                        " at the source's own cadence until pushes come back", source_id, n)
            conn.execute(sa.update(t).where(t.c.id == sub_id).values(
                missed=t.c.missed + n, missed_at=now, due_at=now, attempts=0, **UNCLAIMED))
            counters.WEBSUB_MISSED_ITEMS.count(counts, n)
        counters.add(conn, counts)
    if silent:
        log.info("%d subscriptions heard no push for long: asking their hubs again", len(silent))
        conn.execute(sa.update(t).where(t.c.id.in_(silent)).values(due_at=now, attempts=0, **UNCLAIMED))
    return pushed


def pushed(conn: sa.Connection, source_ids: Collection[int], now: datetime) -> set[int]:
    """The sources of ``source_ids`` whose pushes are trusted now (``health``: pushed)."""
    t = schema.websub_subscriptions
    if not source_ids:
        return set()
    return set(conn.execute(sa.select(t.c.source_id).where(
        t.c.source_id.in_(list(source_ids)), push_health(t, now) == PushHealth.PUSHED.value)).scalars())


def any_subscribed(conn: sa.Connection) -> bool:
    return conn.execute(sa.select(schema.websub_subscriptions.c.source_id).limit(1)).first() is not None

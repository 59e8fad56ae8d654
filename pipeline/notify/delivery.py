"""Delivering a notification: the message, its signature, and the channels that send it.

Every message carries an idempotency key made from what it tells (its user, its items'
identities and events: ``Message.idempotency_key``): delivery is at-least-once (a worker
that dies after sending and before recording it lets another worker send again once the
lease runs out; a database restored from a backup sends again what was sent after it),
and a receiver drops a repeat by that key.

* ``webhook``: ``POST`` of the JSON body below, signed as the Standard Webhooks
  specification says (``webhook-id``: the notification's idempotency key, the same on
  every attempt; ``webhook-timestamp``: the attempt's Unix time; ``webhook-signature``:
  ``v1,<base64 HMAC-SHA256 of "id.timestamp.body" under the user's secret>``, one per
  secret during a rotation's overlap), with ``Idempotency-Key`` too, through the run's
  Fetcher (the SSRF guard, timeouts, no redirects). A receiver rejects a timestamp more
  than 5 minutes from its clock, so a captured delivery cannot be replayed later.
* ``apprise``: any Apprise URL (e-mail, chat services, ...) through the apprise library,
  its connections held to the same SSRF guard (``pipeline.net.http.guarded_sockets``).

A failed send raises ``DeliveryError``; pipeline/notify/notifier.py backs it off
(``delivery_retry_at``) and after ``delivery_max_attempts`` marks it dead.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook, WebhookVerificationError

from pipeline.core.backoff import exponential_delay, not_before
from pipeline.core.errors import DeliveryError, FetchError
from pipeline.core.failures import CHANNEL_BUG, CHANNEL_ERROR, FailureReason
from pipeline.core.kinds import ChannelKind, NotificationStatus
from pipeline.core.redact import channel_secrets, channel_url, scrub
from pipeline.net.http import USER_AGENT, AddressGuard, Fetcher, guarded_sockets
from pipeline.notify.schedule import DeliveryPlan
from pipeline.notify.signing import signing_key

ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER = "webhook-id", "webhook-timestamp", "webhook-signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
log = logging.getLogger(__name__)

RETRY_BASE = timedelta(minutes=1)
RETRY_CAP = timedelta(hours=6)
RETRY_JITTER = 0.2


@dataclass(frozen=True)
class Item:
    """One matched listing, as a message tells it."""

    notification_id: int
    filter_id: int | None
    keywords: list[str]
    query: str  # the filter as its user wrote it
    # id, url (None: no link of its own; then site_url, its source's site, or None), title,
    # summary, published_at (ISO 8601), source_id; price if any
    listing: dict[str, Any]
    event: str = "new"  # new, changed or gone (pipeline/storage/watches.py)
    # What the notification tells, whatever its row: the listing's item key
    # (pipeline/core/urls.py) and its full event (``changed:<version>``); its idempotency
    # key is made from it (``Message.idempotency_key``).
    identity: str = ""

    def payload(self) -> dict[str, Any]:
        return {"notification_id": self.notification_id, "event": self.event,
                "filter": {"id": self.filter_id, "keywords": self.keywords, "query": self.query},
                "listing": self.listing}

    @property
    def heading(self) -> str:
        return heading(self.event, str(self.listing.get("title") or "New listing"))


def heading(event: str, title: str) -> str:
    """A message's title for a listing's event: its title, "Changed: ..." or "Gone: ..."."""
    return {"changed": f"Changed: {title}", "gone": f"Gone: {title}"}.get(event, title)


def link_line(listing: dict[str, Any]) -> str:
    """Where a message sends its reader: the listing's link; for one without a link of
    its own, its source's site, saying so (never the feed, where a reader lands on XML)."""
    if listing.get("url"):
        return str(listing["url"])
    site = listing.get("site_url")
    return f"(no link of its own; its source's site: {site})" if site else "(no link of its own)"


def headline(event: str, listing: dict[str, Any]) -> str:
    """A listing's event in one line, as a digest lists it: its heading, and its price
    in brackets when it has one."""
    line = heading(event, str(listing.get("title") or "New listing"))
    return f"{line} ({listing['price']})" if listing.get("price") else line


@dataclass(frozen=True)
class Message:
    """One message as it is sent: one notification's item, or a digest's items (the
    notification that carries the digest first, pipeline/notify/notifier.py)."""

    notification_id: int  # the notification sent, or the one carrying the digest
    user_id: int
    user_name: str
    channel: str
    channel_url: str = field(repr=False)  # Apprise URLs carry tokens and passwords
    secret: str | None = field(repr=False)
    items: tuple[Item, ...]
    # The secret a rotation replaced, while its overlap lasts: both sign (users set --secret-file).
    previous_secret: str | None = field(default=None, repr=False)
    is_digest: bool = False
    plan: DeliveryPlan = field(default_factory=DeliveryPlan, compare=False)
    key: str | None = None  # an idempotency key of its own: a test or a preview, no notification's

    @classmethod
    def to_user(cls, user: Mapping[str, Any], items: tuple[Item, ...], key: str, now: datetime) -> Message:
        """A message of no notification through ``user``'s own channel (a users row by
        name: id, name, channel, channel_url, secret, previous_secret,
        previous_secret_until), signed as theirs, rotation and all: a test's, a source
        owner's alert."""
        return cls(notification_id=0, user_id=user["id"], user_name=user["name"], channel=user["channel"],
                   channel_url=user["channel_url"], secret=user["secret"],
                   previous_secret=overlapping_secret(user["previous_secret"], user["previous_secret_until"], now),
                   items=items, key=key)

    @property
    def listing(self) -> dict[str, Any]:
        return self.items[0].listing

    @property
    def idempotency_key(self) -> str:
        """The same for every send of this message, and never the same for another
        one: made from what it tells (its user and its items' identities), not from the
        notification's row id. Ids are handed out again after the database is restored
        from a backup (its sequences go back with it): a receiver that drops repeats by
        key then dropped a different notification that got a used id, while the
        notifications it had already received came again under new ones."""
        if self.key:
            return self.key
        kind = "digest" if self.is_digest else "notification"
        told = "\n".join(sorted(item.identity or f"notification:{item.notification_id}" for item in self.items))
        return f"{kind}-{self.user_id}-{hashlib.sha256(told.encode()).hexdigest()[:32]}"

    def payload(self) -> dict[str, Any]:
        user = {"id": self.user_id, "name": self.user_name}
        if self.is_digest:
            return {"digest_id": self.notification_id, "idempotency_key": self.idempotency_key, "user": user,
                    "items": [item.payload() for item in self.items]}
        return {"idempotency_key": self.idempotency_key, "user": user, **self.items[0].payload()}

    def body(self) -> bytes:
        """The JSON body: the same bytes on every attempt, so a re-send is byte-identical."""
        return json_body(self.payload())

    def text(self) -> tuple[str, str]:
        """A title and a plain-text body, for channels that are not JSON (Apprise)."""
        if not self.is_digest:
            item = self.items[0]
            listing = item.listing
            body = "\n\n".join(part for part in (
                str(listing.get("summary") or "")[:1000],
                f"Price: {listing['price']}" if listing.get("price") else "", link_line(listing),
                f"Matched: {item.query} ({self.idempotency_key})" if item.query else f"({self.idempotency_key})")
                if part)
            return item.heading, body
        lines = [f"- {headline(i.event, i.listing)}\n  {link_line(i.listing)}" for i in self.items]
        return (f"{len(self.items)} new listings",
                "\n".join(lines) + f"\n\n({self.idempotency_key})")


def json_body(payload: Mapping[str, Any]) -> bytes:
    """A webhook's body: ``payload`` as compact JSON with sorted keys, the same bytes for
    the same payload (a re-send is byte-identical)."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def overlapping_secret(previous: str | None, until: datetime | None, now: datetime) -> str | None:
    """The secret a rotation replaced, while its overlap lasts (it signs beside the new
    one, ``users set --secret-file``); None once the overlap is over."""
    return previous if until is not None and until > now else None


def signed_headers(secrets: Sequence[str], message_id: str, body: bytes, at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of ``body`` sent at ``at``: one ``v1`` signature per
    secret (the current one first; during a rotation's overlap the previous one too)."""
    signatures = " ".join(Webhook(signing_key(secret)).sign(message_id, at, body.decode()) for secret in secrets)
    return {ID_HEADER: message_id, TIMESTAMP_HEADER: str(int(at.timestamp())), SIGNATURE_HEADER: signatures}


def verify(secret: str, body: bytes, headers: Mapping[str, str]) -> bool:
    """What a receiver does (the ``standardwebhooks`` package): one of the signatures is
    the HMAC of ``id.timestamp.body`` under ``secret``, compared in constant time, and
    the timestamp is within 5 minutes of its clock (a replay later fails)."""
    try:
        Webhook(signing_key(secret)).verify(body, dict(headers), json_parse=False)
    except (WebhookVerificationError, EmptyWebhookSecretError, ValueError):
        return False
    return True


class Channel(Protocol):
    def send(self, message: Message) -> None:
        """Deliver ``message`` or raise DeliveryError."""
        ...


class WebhookChannel:
    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher

    def send(self, message: Message) -> None:
        if not message.secret:
            raise DeliveryError("the user's webhook has no secret to sign with", code=FailureReason.INVALID_CONFIG)
        secrets = [message.secret] + ([message.previous_secret] if message.previous_secret else [])
        self.post(message.channel_url, message.body(), message.idempotency_key, secrets)

    def post(self, url: str, body: bytes, key: str, secrets: Sequence[str]) -> None:
        """POST ``body`` to ``url``, signed under each of ``secrets`` with ``key`` as its
        webhook-id and idempotency key; DeliveryError when it was refused."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            IDEMPOTENCY_HEADER: key,
            **signed_headers(secrets, key, body, datetime.now(UTC)),
        }
        try:
            self.fetcher.post(url, body, headers)
        except FetchError as exc:
            # A webhook URL can be a credential (chat services put a token in its path):
            # errors show its scheme and host only, and never a part of its path or query
            # that the receiver echoed back ("404 no route for /hook/TOKEN").
            text = scrub(exc.message.replace(url, channel_url(url)), channel_secrets(url))
            raise DeliveryError(f"{exc.reason}: {text}", code=exc.reason, retry_after=exc.retry_after,
                                http_status=exc.http_status) from None


class AppriseChannel:
    """Any Apprise URL. Apprise does its own networking (requests, smtplib, ...): its
    sends run inside ``guarded_sockets``, so every connection they open, redirect hops
    included, goes to an address the run's SSRF guard allows, as webhooks do."""

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard

    def send(self, message: Message) -> None:
        self.notify(message.channel_url, *message.text())

    def notify(self, url: str, title: str, body: str) -> None:
        """Send plain-text ``title`` and ``body`` to the Apprise ``url``; DeliveryError
        when it was refused."""
        import apprise  # 0.2 s of imports: only where a message goes through Apprise

        # async_mode off: Apprise sends in this thread, where the guard is in force.
        notifier = apprise.Apprise(asset=apprise.AppriseAsset(async_mode=False))
        if not notifier.add(url) or len(notifier) != 1:  # one channel, one URL (users.py checks it when added)
            raise DeliveryError(f"not one usable Apprise URL ({channel_url(url)})", code=FailureReason.INVALID_CONFIG)
        with guarded_sockets(self.guard) as refused:
            # The message is plain text (a listing's "<" is its text): Apprise escapes it
            # for a service that takes HTML, so no listing's text is read as markup.
            sent = notifier.notify(title=title, body=body, body_format=apprise.NotifyFormat.TEXT)
        if refused:
            raise DeliveryError(
                f"{FailureReason.BLOCKED_ADDRESS}: Apprise was refused a connection to"
                f" {', '.join(dict.fromkeys(refused))} by the address guard"
                f" ({channel_url(url)})",
                code=FailureReason.BLOCKED_ADDRESS,
            )
        if not sent:
            raise DeliveryError(
                f"Apprise could not deliver to {channel_url(url)} (its log says why)",
                code=CHANNEL_ERROR,
            )


def send(channels: Mapping[str, Channel], message: Message, what: str) -> DeliveryError | None:
    """Send ``message`` through its channel; None when it was delivered, else the
    DeliveryError that says why not. A channel that raises anything else is a bug of its
    own (CHANNEL_BUG, logged with ``what``, the thing sent): it must not stop the other
    deliveries."""
    try:
        channels[message.channel].send(message)
    except DeliveryError as exc:
        return exc
    except Exception as exc:
        log.exception("delivery of %s crashed", what)
        return DeliveryError(f"unexpected {type(exc).__name__}: {exc}", code=CHANNEL_BUG)
    return None


def channels(fetcher: Fetcher) -> dict[str, Channel]:
    """The channel of each kind, sending through ``fetcher``."""
    return {ChannelKind.WEBHOOK: WebhookChannel(fetcher), ChannelKind.APPRISE: AppriseChannel(fetcher.guard)}


# A receiver that answers 410 Gone says it will never take another (Standard Webhooks:
# "the endpoint should be disabled"): its channel is remembered as gone
# (``gone_channels``), its notifications held unsent, not retried for hours and then
# dead, until the channel is set again (`users channel`, `filters route`) or a day
# has passed, when one is sent to see (a receiver brought back without telling us).
GONE_STATUS = 410
GONE_RETRY = timedelta(days=1)


def gone(error: DeliveryError | None) -> bool:
    """Whether ``error`` is a receiver saying it is gone for good."""
    return error is not None and error.http_status == GONE_STATUS


def attempt_outcome(error: DeliveryError | None, attempts: int, finished: datetime, *, max_attempts: int,
                    u: float, final: bool = False) -> dict[str, Any]:
    """The columns a delivery attempt's outcome sets on its row (a notification's, a source
    alert's): sent; dead when ``final`` (it can never be sent) or ``attempts`` (counting
    this one) reached ``max_attempts``; else failed, tried again at ``delivery_retry_at``."""
    if error is None:
        return {"status": NotificationStatus.SENT, "sent_at": finished, "last_error": None}
    if final or attempts >= max_attempts:
        return {"status": NotificationStatus.DEAD, "last_error": error.message}
    return {"status": NotificationStatus.FAILED, "last_error": error.message,
            "next_attempt_at": delivery_retry_at(attempts, finished, u, error.retry_after)}


def delivery_retry_at(attempts: int, now: datetime, u: float, retry_after: datetime | None) -> datetime:
    """When a failed notification is tried again: the shared exponential formula from 1
    minute up to 6 hours, +-20% jitter, with the receiver's Retry-After as a floor within
    that cap (a receiver cannot park a notification for longer than our backoff would)."""
    at = now + exponential_delay(attempts, base=RETRY_BASE, cap=RETRY_CAP, jitter=RETRY_JITTER, u=u)
    return not_before(at, retry_after, now, RETRY_CAP)

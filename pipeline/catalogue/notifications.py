"""What an operator does to notifications: list them with their last error, requeue dead
(or chosen) ones, fenced against a send in flight; send a user a test message; preview
the digest a user's held notifications will make."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from pipeline.catalogue.known import require_ids
from pipeline.core.errors import UserError
from pipeline.core.kinds import NotificationStatus
from pipeline.core.settings import Settings
from pipeline.net.http import Fetcher
from pipeline.notify.delivery import Item, Message, channels
from pipeline.notify.notifier import load_messages
from pipeline.queue.spec import UNCLAIMED
from pipeline.storage import schema


def requeue_notifications(conn: sa.Connection, *, ids: list[int] | None = None, dead: bool = False) -> int:
    """Make dead (or the given) notifications pending again with a fresh attempt count,
    each on its own (a digest's leave it); sent ones are never requeued. A send in flight is fenced out (``claim.UNCLAIMED``):
    its outcome is not recorded over the requeue. Returns how many. An id that names no
    notification is an error, and nothing is requeued."""
    if not ids and not dead:
        raise UserError("name notifications with --id, or requeue every dead one with --dead")
    t = schema.notifications
    where = [t.c.status != NotificationStatus.SENT]
    if ids:
        require_ids(conn, t, ids, "notification")
        where.append(t.c.id.in_(ids))
    if dead:
        where.append(t.c.status == NotificationStatus.DEAD)
    result = conn.execute(
        sa.update(t).where(*where).values(
            status=NotificationStatus.PENDING, attempts=0, next_attempt_at=sa.func.current_timestamp(), last_error=None,
            digest_id=None,  # out of its digest: sent on its own, never twice
            **UNCLAIMED,
        )
    )
    return int(result.rowcount)


LIST_LIMIT = 50  # notifications `notifications list` shows unless told


def list_notifications(
    conn: sa.Connection, *, user: str | None = None, status: str | None = None,
    since: datetime | None = None, limit: int = LIST_LIMIT,
) -> list[dict[str, Any]]:
    """The latest notifications, newest first: whose, their status, attempts and last
    error, the listing they are about; of one ``user`` (a name or an id), in one
    ``status``, created at or after ``since``, at most ``limit``."""
    from pipeline.catalogue.users import find_user

    n, u, listing = schema.notifications, schema.users, schema.listings
    query = (
        sa.select(n.c.id, u.c.name.label("user"), n.c.status, n.c.event, n.c.attempts, n.c.created_at,
                  n.c.sent_at, n.c.next_attempt_at, n.c.last_error, listing.c.id.label("listing_id"),
                  listing.c.title, listing.c.url)
        .join(u, u.c.id == n.c.user_id).join(listing, listing.c.id == n.c.listing_id)
        .order_by(n.c.id.desc()).limit(limit)
    )
    if user is not None:
        query = query.where(n.c.user_id == find_user(conn, user))
    if status is not None:
        query = query.where(n.c.status == NotificationStatus(status))
    if since is not None:
        query = query.where(n.c.created_at >= since)
    return [dict(r._mapping) for r in conn.execute(query)]


def send_test(engine: sa.Engine, settings: Settings, user: str) -> Message:
    """Send ``user`` (a name or id) a test message through their channel now, as the
    notifier sends one (signed, through the address guard), and return it; DeliveryError
    says why the channel refused it. Nothing is stored. The message's event is "test"
    and its idempotency key ``test-...``, so a receiver tells it from a listing's."""
    from pipeline.catalogue.users import find_user

    u = schema.users
    with engine.connect() as conn:
        row = conn.execute(sa.select(u.c.id, u.c.name, u.c.channel, u.c.channel_url, u.c.secret, u.c.previous_secret,
                                     u.c.previous_secret_until).where(u.c.id == find_user(conn, user))).one()
    now = datetime.now(UTC)
    item = Item(notification_id=0, filter_id=None, keywords=[], query="", event="test", listing={
        "id": None, "url": None, "title": "Test notification",
        "summary": f"Sent by `pipeline users test` at {now:%Y-%m-%d %H:%M:%S} UTC: this channel works.",
        "published_at": now.isoformat(), "source_id": None})
    message = Message.to_user(dict(row._mapping), (item,), f"test-{secrets.token_hex(8)}", now)
    with Fetcher.from_settings(settings) as fetcher:
        channels(fetcher)[row.channel].send(message)
    return message


@dataclass(frozen=True)
class HeldDigest:
    """What a user's next digest holds, as it will read."""

    message: Message | None  # None: nothing is held
    release_at: datetime | None  # when the first of them is released


def preview_digest(engine: sa.Engine, user: str) -> HeldDigest:
    """The notifications held for ``user``'s next digest (or the end of quiet hours) as
    one message, as it will read when it goes out; nothing is changed."""
    from pipeline.catalogue.users import find_user

    n = schema.notifications
    with engine.connect() as conn:
        held = conn.execute(
            sa.select(n.c.id, n.c.next_attempt_at)
            .where(n.c.user_id == find_user(conn, user), n.c.status == NotificationStatus.HELD, n.c.digest_id.is_(None))
            .order_by(n.c.id)
        ).all()
    messages = load_messages(engine, [r.id for r in held])
    if not messages:
        return HeldDigest(None, None)
    by_id = {m.notification_id: m for m in messages}
    first = messages[0]
    items = tuple(by_id[r.id].items[0] for r in held if r.id in by_id)
    digest = replace(first, notification_id=0, items=items, is_digest=True, key="preview")
    return HeldDigest(digest, min(r.next_attempt_at for r in held))

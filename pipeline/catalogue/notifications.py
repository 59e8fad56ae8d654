"""What an operator does to notifications: list them with their last error, requeue dead
(or chosen) ones, fenced against a send in flight."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from pipeline.catalogue.known import require_ids
from pipeline.core.errors import UserError
from pipeline.core.kinds import NotificationStatus
from pipeline.queue.claim import UNCLAIMED
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

"""What an operator does to notifications: requeue dead (or chosen) ones, fenced against a
send in flight."""

from __future__ import annotations

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

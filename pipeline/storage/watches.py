"""Change alerts: a user hears when a listing a filter with ``changes`` notified them of
changes or goes from its source (`filters add --changes`; docs/runbook.md, "Change
alerts"). Once per change, deduplicated as every notification is: by its unique key
(user, listing, event).

* **Watching.** The notification of a new listing by such a filter makes a watch
  (``watch``), holding the listing's *version*: a hash of its title, summary and price
  (a page item's), what a change alert is about (a date or category that moves is not).
* **Changed.** New content of a listing clears its ``matched_at`` (the processor's
  upsert), so the notifier matches it again; it then reads the listing's watches
  (``alerts``): a version other than the watch's is told as ``changed:<version>``.
  Each version is told once: content that comes back to a version told before, or to
  the one first heard of, is not told again.
* **Gone.** After a fetch that listed a source's items, the collector marks a watched
  listing the fetch no longer lists as gone (``mark_gone``: ``gone_at``, and
  ``matched_at`` cleared so the notifier looks at it), told as ``gone:<when>``. From a
  feed only when an item older than it (published before it, or, without dates,
  stored before it) is still listed: an item pushed off the end of a feed's window by
  newer ones has not gone. A page (``http``) lists what is
  there. A fetch that listed nothing (an empty document, a glitch), or was capped,
  tells nothing. A listing listed again loses ``gone_at`` silently; should it go
  again, that is a new ``gone`` alert.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from pipeline.core.kinds import SourceType
from pipeline.queue.claim import UNCLAIMED
from pipeline.storage import schema
from pipeline.storage.bulk import ANY_UNIQUE_KEY, insert_ignoring_conflicts

NEW = "new"  # notifications.event of a new listing's notification
CHANGED, GONE = "changed", "gone"  # the kinds of a change alert's event (``changed:<version>``)


def version(listing: Mapping[str, Any]) -> str:
    """What a change alert compares: a listing's (row's) title, summary and price (a page
    item's; the versions of listings without one are as before prices were kept)."""
    price = listing.get("price")
    text = f"{listing['title']}\n{listing['summary']}" + ("" if price is None else f"\n{price}")
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def event_kind(event: str) -> str:
    """``new``, ``changed`` or ``gone``: an event without its detail."""
    return event.partition(":")[0]


class Alert(NamedTuple):
    """A change alert to create: the user, the listing, the watching filter, the event."""

    user_id: int
    listing_id: int
    filter_id: int | None
    event: str


class Watch(NamedTuple):
    user_id: int
    listing_id: int
    source_id: int
    filter_id: int
    version: str


def watch(conn: sa.Connection, candidates: Sequence[Watch]) -> int:
    """Make the watches of ``candidates`` whose user now has the listing's notification
    (a match left out as the same item or story from another source watches nothing).
    Returns how many were made."""
    if not candidates:
        return 0
    n = schema.notifications
    notified = {tuple(row) for row in conn.execute(
        sa.select(n.c.user_id, n.c.listing_id).where(
            n.c.event == NEW, n.c.listing_id.in_({w.listing_id for w in candidates}),
            n.c.user_id.in_({w.user_id for w in candidates}))
    )}
    rows = [w._asdict() for w in {(w.user_id, w.listing_id): w for w in candidates}.values()
            if (w.user_id, w.listing_id) in notified]
    return insert_ignoring_conflicts(conn, schema.watches, rows, ANY_UNIQUE_KEY)


# The listing columns ``alerts`` reads, besides ``id``: ``version``'s and ``gone_at``.
ALERT_COLUMNS = ("title", "summary", "price", "gone_at")


def alerts(conn: sa.Connection, listings: Sequence[Mapping[str, Any]]) -> list[Alert]:
    """The change alerts the watches of ``listings`` (rows with id and ALERT_COLUMNS)
    call for: gone, or changed since the version watched."""
    if not listings:
        return []
    w = schema.watches
    by_id = {row["id"]: row for row in listings}
    found = []
    for user_id, listing_id, filter_id, watched in conn.execute(
        sa.select(w.c.user_id, w.c.listing_id, w.c.filter_id, w.c.version).where(w.c.listing_id.in_(list(by_id)))
    ):
        row = by_id[listing_id]
        if row["gone_at"] is not None:
            event = f"{GONE}:{int(row['gone_at'].timestamp())}"
        elif (now := version(row)) != watched:
            event = f"{CHANGED}:{now}"
        else:
            continue
        found.append(Alert(user_id, listing_id, filter_id, event))
    return found


def mark_gone(
    conn: sa.Connection, fetched: Iterable[tuple[int, str, Sequence[str]]], now: datetime,
) -> int:
    """For each (source id, source type, the item ids one fetch listed): mark the
    watched listings of the source that went (the module docstring's rule), and clear
    ``gone_at`` of those listed again. Returns how many were marked gone."""
    listed = {source_id: (source_type, set(ids)) for source_id, source_type, ids in fetched if ids}
    if not listed:
        return 0
    w, t = schema.watches, schema.listings
    watched = conn.execute(
        sa.select(t.c.id, t.c.source_id, t.c.source_item_id, t.c.gone_at, t.c.published_at, t.c.ingested_at).distinct()
        .join(w, w.c.listing_id == t.c.id).where(w.c.source_id.in_(list(listed)))
    ).all()
    back = [r.id for r in watched if r.gone_at is not None and r.source_item_id in listed[r.source_id][1]]
    missing = [r for r in watched if r.gone_at is None and r.source_item_id not in listed[r.source_id][1]]
    gone = [r.id for r in missing if listed[r.source_id][0] == SourceType.PAGE
            or _older_still_listed(conn, r, listed[r.source_id][1])]
    if back:
        conn.execute(sa.update(t).where(t.c.id.in_(back)).values(gone_at=None))
    if gone:
        # New content to match, as the processor's upsert leaves it: a notifier holding
        # the listing is fenced out, and the next one tells the watchers.
        conn.execute(sa.update(t).where(t.c.id.in_(gone)).values(gone_at=now, matched_at=None, **UNCLAIMED))
    return len(gone)


def _older_still_listed(conn: sa.Connection, listing: Any, ids: set[str]) -> bool:
    """Whether the fetch listed an item of the listing's source older than it: published
    before it, or, where either has no date, stored before it."""
    t = schema.listings
    older = sa.or_(
        t.c.published_at < listing.published_at if listing.published_at is not None else sa.false(),
        sa.and_(sa.or_(t.c.published_at.is_(None), sa.literal(listing.published_at is None)),
                t.c.ingested_at < listing.ingested_at),
    )
    return conn.execute(
        sa.select(t.c.id).where(t.c.source_id == listing.source_id, t.c.source_item_id.in_(list(ids)), older).limit(1)
    ).first() is not None

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
* **Gone.** After a fetch that listed a source's items, the collector counts each
  watched listing the fetch no longer lists as missed (``mark_gone``: ``missed``); at
  two good fetches in a row without it, it is gone (``gone_at``, and ``matched_at``
  cleared so the notifier looks at it), told as ``gone:<when>``: one odd answer (a
  captcha page whose selectors matched something else, a page served half) is not a
  listing gone. From a feed it is missed only when an item older than it (published
  before it, or, without dates, stored before it) is still listed: an item pushed off
  the end of a feed's window by newer ones has not gone. A page (``http``) lists what
  is there. A failed fetch, one that listed nothing (an empty document, a selector
  that matched nothing) or one that was capped tells nothing and counts nothing. A
  listing listed again loses ``missed`` and ``gone_at`` silently; should it go again,
  that is a new ``gone`` alert.
* **Partial content is no change.** A watched listing whose title is now empty, or
  which had a price when its user last heard of it and now has none (the price
  selector found nothing), is not told as changed: a page served in part is not a
  listing changed.
* **Price conditions.** A watching filter with ``price_drop`` or ``price_below``
  (pipeline/core/prices.py) tells a change only when the price meets one, compared with
  the price its user last heard of (``watches.price``, moved on with each change told),
  at once rather than once a window (the condition bounds them); gone is always told.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from pipeline.core.kinds import SourceType
from pipeline.core.prices import PriceCondition
from pipeline.queue.spec import UNCLAIMED
from pipeline.storage import schema
from pipeline.storage.bulk import ANY_UNIQUE_KEY, insert_ignoring_conflicts

NEW = "new"  # notifications.event of a new listing's notification
CHANGED, GONE = "changed", "gone"  # the kinds of a change alert's event (``changed:<version>``)
GONE_AFTER = 2  # good fetches in a row without a watched listing before it is gone


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
    price: str | None = None  # the listing's price as it is told (``heard`` keeps it)
    # Held to one a window (pipeline/notify/notifier.py ``_spaced_changes``); not a change
    # under a price condition, which bounds them itself (each price lower than the last)
    # and must be told with the price that met it.
    spaced: bool = True


class Watch(NamedTuple):
    user_id: int
    listing_id: int
    source_id: int
    filter_id: int
    version: str
    price: str | None = None  # the price the user heard of with the listing


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
    w, f = schema.watches, schema.filters
    by_id = {row["id"]: row for row in listings}
    found = []
    for watched in conn.execute(
        sa.select(w.c.user_id, w.c.listing_id, w.c.filter_id, w.c.version, w.c.price, f.c.price_drop,
                  f.c.price_below)
        .outerjoin(f, f.c.id == w.c.filter_id).where(w.c.listing_id.in_(list(by_id)))
    ):
        row = by_id[watched.listing_id]
        if row["gone_at"] is not None:
            event = f"{GONE}:{int(row['gone_at'].timestamp())}"
        else:
            now, condition = version(row), PriceCondition(watched.price_drop, watched.price_below)
            if now == watched.version or _partial(row, watched.price) or (
                    condition and not condition.met(watched.price, row["price"])):
                continue
            event = f"{CHANGED}:{now}"
        found.append(Alert(watched.user_id, watched.listing_id, watched.filter_id, event, row["price"],
                           spaced=not PriceCondition(watched.price_drop, watched.price_below)))
    return found


def _partial(row: Mapping[str, Any], heard_price: str | None) -> bool:
    """Whether ``row`` shows only part of its listing: no title, or no price where its
    user heard of one (the module docstring's rule)."""
    return not (row["title"] or "").strip() or (heard_price is not None and row["price"] is None)


def heard(conn: sa.Connection, told: Sequence[Alert]) -> None:
    """The changes ``told`` are what their users heard last: their watches keep the
    price each told, which price conditions compare with from now on."""
    w = schema.watches
    rows = [{"who": a.user_id, "which": a.listing_id, "heard": a.price} for a in told if event_kind(a.event) == CHANGED]
    if rows:  # one statement for the batch's changes, not one round trip each
        conn.execute(sa.update(w).where(w.c.user_id == sa.bindparam("who"), w.c.listing_id == sa.bindparam("which"))
                     .values(price=sa.bindparam("heard")), rows)


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
        sa.select(t.c.id, t.c.source_id, t.c.source_item_id, t.c.gone_at, t.c.missed, t.c.published_at,
                  t.c.ingested_at).distinct()
        .join(w, w.c.listing_id == t.c.id).where(w.c.source_id.in_(list(listed)))
    ).all()
    back = [r.id for r in watched
            if (r.gone_at is not None or r.missed) and r.source_item_id in listed[r.source_id][1]]
    missing = [r for r in watched if r.gone_at is None and r.source_item_id not in listed[r.source_id][1]]
    missed = [r for r in missing if listed[r.source_id][0] == SourceType.PAGE
              or _older_still_listed(conn, r, listed[r.source_id][1])]
    gone = [r.id for r in missed if r.missed + 1 >= GONE_AFTER]
    if back:
        conn.execute(sa.update(t).where(t.c.id.in_(back)).values(gone_at=None, missed=0))
    if once := [r.id for r in missed if r.missed + 1 < GONE_AFTER]:
        conn.execute(sa.update(t).where(t.c.id.in_(once)).values(missed=t.c.missed + 1))
    if gone:
        # New content to match, as the processor's upsert leaves it: a notifier holding
        # the listing is fenced out, and the next one tells the watchers.
        conn.execute(sa.update(t).where(t.c.id.in_(gone)).values(gone_at=now, missed=0, matched_at=None,
                                                                  **UNCLAIMED))
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

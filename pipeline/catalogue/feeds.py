"""Output feeds: a user's matches, or one filter's, as a feed a reader subscribes to
(``pipeline feeds add``; served by ``pipeline serve``, pipeline/web/app.py).

A feed is opened by an unguessable token in its URL (``/feeds/<token>.atom`` and
``.json``). The token is shown once, when it is made; the database keeps its SHA-256
only, so a copy of the database opens no feed, and looking a token up by its hash takes
the same time whatever the token. A revoked token opens nothing, as an unknown one.

What a feed holds is what its user was notified of, newest first (``FEED_ENTRIES``):
each notification one entry, whatever became of its delivery (held for a digest,
sent, failed), since a reader pulls when it likes. A filter's feed holds the user's
notifications whose listing that filter matches, by the matcher's own rules
(pipeline/notify/matching.py), not only those credited to it: a user hears once of a
listing however many of their filters match it, and the notification names the oldest
(pipeline/notify/matching.py ``FilterIndex.matches``), so a newer filter's feed would
otherwise miss what an older one matched first.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.catalogue.users import find_user
from pipeline.core.errors import UserError
from pipeline.core.words import stored_text_words
from pipeline.notify import delivery
from pipeline.notify.matching import FilterIndex, ListingText
from pipeline.notify.notifier import load_filters
from pipeline.notify.query import as_written
from pipeline.storage import schema, watches

FEED_ENTRIES = 50  # the newest notifications a feed holds
# A filter's feed reads the user's newest notifications in pages of this many, at most
# FILTER_SCAN of them, to find its FEED_ENTRIES (a user's busiest filter may crowd out
# a quiet one: then the quiet one's feed holds what it matched among the last FILTER_SCAN).
_PAGE = 500
FILTER_SCAN = 5000
_TOKEN_BYTES = 24  # 192 bits, 32 characters in the URL
_TOKEN = re.compile(r"[A-Za-z0-9_-]{20,64}")


@dataclass(frozen=True)
class NewFeed:
    id: int
    token: str  # shown once: only its hash is stored


@dataclass(frozen=True)
class Scope:
    """What a token opens: one user's notifications, or those one filter matches."""

    feed_id: int
    user_id: int
    user_name: str
    filter_id: int | None
    query: str | None  # the filter as its user wrote it
    created_at: datetime


@dataclass(frozen=True)
class Entry:
    """One notification as a feed shows it."""

    identity: str  # what it tells: the listing's item key and the event, stable across restores
    title: str  # "Changed: ..." and "Gone: ..." for change alerts (delivery.heading)
    link: str | None  # the listing's, else its source's site
    summary: str
    author: str | None
    categories: tuple[str, ...]
    price: str | None
    source: str
    published: datetime  # the listing's publication, else when the user was notified
    updated: datetime  # the later of the notification and the listing's last change


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_feed(conn: sa.Connection, user: str, *, filter_id: int | None = None) -> NewFeed:
    """A new feed of ``user``'s matches (of filter ``filter_id`` only, when given, which
    must be one of the user's); its token, to be put in the URL once."""
    user_id = find_user(conn, user)
    if filter_id is not None:
        f = schema.filters
        owner = conn.execute(sa.select(f.c.user_id).where(f.c.id == filter_id)).scalar()
        if owner is None:
            raise UserError(f"no filter with id {filter_id}")
        if owner != user_id:
            raise UserError(f"filter {filter_id} is not one of {user!r}'s filters")
    token = secrets.token_urlsafe(_TOKEN_BYTES)
    t = schema.feed_tokens
    feed_id = conn.execute(
        sa.insert(t).values(user_id=user_id, filter_id=filter_id, token_hash=token_hash(token)).returning(t.c.id)
    ).scalar_one()
    return NewFeed(int(feed_id), token)


def list_feeds(conn: sa.Connection, user: str | None = None) -> list[dict[str, Any]]:
    """Every feed (of ``user`` only, when given), revoked ones too, oldest first."""
    t, u = schema.feed_tokens, schema.users
    query = (sa.select(t.c.id, u.c.name.label("user"), t.c.filter_id, t.c.created_at, t.c.revoked_at)
             .join(u, u.c.id == t.c.user_id).order_by(t.c.id))
    if user is not None:
        query = query.where(t.c.user_id == find_user(conn, user))
    return [dict(r._mapping) for r in conn.execute(query)]


def revoke_feed(conn: sa.Connection, feed_id: int, *, now: datetime | None = None) -> None:
    """From now on the feed's URL opens nothing (a reader polling it gets 404)."""
    t = schema.feed_tokens
    found = conn.execute(sa.select(t.c.revoked_at).where(t.c.id == feed_id)).first()
    if found is None:
        raise UserError(f"no feed with id {feed_id}")
    if found.revoked_at is None:
        conn.execute(sa.update(t).where(t.c.id == feed_id).values(revoked_at=now or datetime.now(UTC)))


def resolve(conn: sa.Connection, token: str) -> Scope | None:
    """What ``token`` opens; None for a token that is malformed, unknown or revoked."""
    if not _TOKEN.fullmatch(token):
        return None
    t, u, f = schema.feed_tokens, schema.users, schema.filters
    row = conn.execute(
        sa.select(t.c.id, t.c.user_id, u.c.name, t.c.filter_id, f.c.query, f.c.keywords, t.c.created_at)
        .join(u, u.c.id == t.c.user_id).outerjoin(f, f.c.id == t.c.filter_id)
        .where(t.c.token_hash == token_hash(token), t.c.revoked_at.is_(None))
    ).first()
    if row is None:
        return None
    query = as_written(row.query, row.keywords) if row.filter_id is not None else None
    return Scope(row.id, row.user_id, row.name, row.filter_id, query, row.created_at)


def entries(engine: Engine, scope: Scope, *, limit: int = FEED_ENTRIES) -> list[Entry]:
    """The newest ``limit`` notifications ``scope`` shows, newest first."""
    if scope.filter_id is None:
        with engine.connect() as conn:
            return [_entry(r) for r in conn.execute(_notified(scope.user_id).limit(limit))]
    loaded = load_filters(engine, ids=[scope.filter_id], enabled_only=False)
    index = FilterIndex([f for f, _ in loaded])  # empty when its query no longer compiles
    found: list[Entry] = []
    for row in _pages(engine, scope.user_id):
        if row.filter_id == scope.filter_id or index.matching(
                ListingText.of(row._mapping), any_age=True, text_words=stored_text_words(row.words)):
            found.append(_entry(row))
            if len(found) == limit:
                break
    return found


def _notified(user_id: int) -> sa.Select[Any]:
    """A user's notifications, newest first, each with its listing and its source's name
    (served by the index on notifications (user_id, created_at, id): a range, no sort)."""
    n, listings, s = schema.notifications, schema.listings, schema.sources
    return (
        sa.select(n.c.id.label("notification_id"), n.c.created_at.label("notified_at"), n.c.event, n.c.filter_id,
                  listings.c.id, listings.c.source_id, listings.c.item_key, listings.c.url, listings.c.title,
                  listings.c.summary, listings.c.author, listings.c.categories, listings.c.published_at,
                  listings.c.ingested_at, listings.c.updated_at, listings.c.price, listings.c.fields, listings.c.words,
                  s.c.name.label("source"),
                  s.c.site_url)
        .select_from(n.join(listings, listings.c.id == n.c.listing_id).join(s, s.c.id == listings.c.source_id))
        .where(n.c.user_id == user_id)
        .order_by(n.c.created_at.desc(), n.c.id.desc())
    )


def _pages(engine: Engine, user_id: int) -> Iterator[Any]:
    """A user's notifications as ``_notified`` orders them, read ``_PAGE`` at a time
    after the last one seen, at most ``FILTER_SCAN``."""
    n = schema.notifications
    after: tuple[datetime, int] | None = None
    for _ in range(FILTER_SCAN // _PAGE):
        query = _notified(user_id).limit(_PAGE)
        if after is not None:
            query = query.where(sa.or_(n.c.created_at < after[0],
                                       sa.and_(n.c.created_at == after[0], n.c.id < after[1])))
        with engine.connect() as conn:
            rows = conn.execute(query).all()
        yield from rows
        if len(rows) < _PAGE:
            return
        after = (rows[-1].notified_at, rows[-1].notification_id)


def _entry(row: Any) -> Entry:
    event = watches.event_kind(row.event)
    return Entry(
        identity=f"{row.item_key or f'listing:{row.id}'} {row.event}",
        title=delivery.heading(event, row.title or "New listing"),
        link=row.url or row.site_url or None,
        summary=row.summary or "",
        author=row.author or None,
        categories=tuple(str(c) for c in row.categories or ()),
        price=row.price,
        source=row.source,
        published=row.published_at or row.notified_at,
        updated=max(row.notified_at, row.updated_at),
    )

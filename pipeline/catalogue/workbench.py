"""Trying a filter on the listings already stored (``pipeline filters test USER QUERY``):
what it would have matched in the last days, newest first, each with the words and
fields that matched, before anyone is notified of anything.

The matcher's rules decide (pipeline/notify/matching.py), as for every new listing; the
listings' stored keys (``listings.words``, " a:smith c:remote node node.js python ":
pipeline/core/words.py ``word_string``) make it cheap. SQL narrows the window to the
listings holding everything some alternative of the query needs (a word, an author's
word, a category, one of its sources: its ``filings``), found by
pipeline/storage/functions.py ``position``; on a database that compared text without
case or accents this would let more through, never fewer. A query of words alone (with
exclusions and OR) is then decided on the stored words in Python, exactly as the
matcher would, without reading the text; a query with a phrase or a field runs the
matcher itself on the candidates (given their stored words). Only the listings shown
are read whole, to say why they matched. bench/filter_workbench.py measures it at
1,000,000 listings.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.catalogue.users import compile_filter, find_user
from pipeline.core.settings import Settings
from pipeline.core.words import (
    AUTHOR_PREFIX,
    COMPANY_PREFIX,
    LOCATION_PREFIX,
    category_key,
    stored_text_words,
)
from pipeline.notify.matching import Filter, FilterIndex, ListingText, reasons
from pipeline.notify.notifier import Notifier
from pipeline.notify.query import (
    AUTHOR_KEY,
    CATEGORY_KEY,
    COMPANY_KEY,
    LOCATION_KEY,
    SOURCE_KEY,
    Field,
    Query,
)
from pipeline.storage import schema
from pipeline.storage.functions import position

DEFAULT_DAYS = 30
DEFAULT_SHOWN = 20
_CHUNK = 2000  # candidates matched at once
_READ = ("id", "source_id", "url", "title", "summary", "author", "categories", "published_at", "ingested_at",
         "price", "fields")


@dataclass(frozen=True)
class Hit:
    """A listing the query matches, and why."""

    id: int
    source_id: int
    url: str
    title: str
    ingested_at: datetime
    published_at: datetime | None
    reasons: tuple[str, ...]
    notified: bool  # the user already has a notification of it

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "source_id": self.source_id, "url": self.url, "title": self.title,
                "ingested_at": self.ingested_at, "published_at": self.published_at,
                "matched": list(self.reasons), "notified": self.notified}


@dataclass
class Trial:
    """What a query would have matched in a window."""

    query: str
    user_id: int
    since: datetime
    listings: int = 0  # that arrived in the window
    read: int = 0  # of those, what the matcher read (SQL narrowed the rest away)
    matched: int = 0
    hits: list[Hit] = field(default_factory=list)  # the newest, at most as many as asked
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"query": self.query, "user_id": self.user_id, "since": self.since,
                "listings": self.listings, "read": self.read, "matched": self.matched,
                "seconds": round(self.seconds, 3), "hits": [h.as_dict() for h in self.hits]}


def candidates(query: Query) -> sa.ColumnElement[bool] | None:
    """A condition every listing ``query`` matches meets: for some alternative, each thing
    it needs (a word, an author's word, a category, one of its sources) is among the
    listing's stored keys (or is its source). None when some alternative needs nothing
    stored (it cannot be: the language refuses it). A listing stored before its keys
    were (NULL) is always a candidate."""
    t = schema.listings
    alternatives = []
    for clause in query.clauses:
        needs = []
        for filing in clause.filings:  # each: the listing holds one of these keys
            sources = [int(k.removeprefix(SOURCE_KEY)) for k in filing if k.startswith(SOURCE_KEY)]
            held = [position(t.c.words, f" {_stored(k)} ") > 0 for k in filing if not k.startswith(SOURCE_KEY)]
            needs.append(sa.or_(*held, *((t.c.source_id.in_(sources),) if sources else ())))
        named = [c.source_ids for c in clause.checks if c.term.field is Field.SOURCE and not c.negated]
        needs += [t.c.source_id.in_(sorted(ids)) if ids else sa.false() for ids in named]
        if not needs:
            return None
        alternatives.append(sa.and_(*needs))
    return sa.or_(t.c.words.is_(None), *alternatives)


_STORED_PREFIXES = {AUTHOR_KEY: AUTHOR_PREFIX, LOCATION_KEY: LOCATION_PREFIX, COMPANY_KEY: COMPANY_PREFIX}


def _stored(key: str) -> str:
    """A matcher's key (pipeline/notify/query.py) as ``listings.words`` holds it."""
    for prefix, stored in _STORED_PREFIXES.items():
        if key.startswith(prefix):
            return stored + key.removeprefix(prefix)
    if key.startswith(CATEGORY_KEY):
        return category_key(key.removeprefix(CATEGORY_KEY))
    return key


def _by_words(query: Query) -> bool:
    """Whether ``query`` is decided by a listing's words alone (no phrase, no field)."""
    return all(not clause.checks for clause in query.clauses)


def _holds(query: Query, stored: str) -> bool:
    """``query`` (words alone) holds for a listing whose stored words are ``stored``."""
    return any(all(f" {w} " in stored for w in clause.words) and not any(f" {w} " in stored for w in clause.absent)
               for clause in query.clauses)


def try_filter(
    engine: Engine, user: str, text: str, *, days: int = DEFAULT_DAYS, shown: int = DEFAULT_SHOWN,
    now: datetime | None = None,
) -> Trial:
    """What filter ``text`` of ``user`` would have matched among the listings that arrived
    in the last ``days``: every match counted, the newest ``shown`` listed with why."""
    started = time.perf_counter()
    now = now or datetime.now(UTC)
    t = schema.listings
    with engine.connect() as conn:
        user_id = find_user(conn, user)
        query = compile_filter(conn, text)
        trial = Trial(query.text, user_id, now - timedelta(days=days))
        window = t.c.ingested_at >= trial.since
        trial.listings = int(conn.execute(sa.select(sa.func.count()).select_from(t).where(window)).scalar_one())
        narrowed = candidates(query)
        by_words = _by_words(query)
        columns = (t.c.id, t.c.ingested_at, t.c.words) if by_words else (
            t.c.words, *(t.c[name] for name in _READ))
        select = sa.select(*columns).where(window)
        if narrowed is not None:
            select = select.where(narrowed)
        # In no order: an ORDER BY made PostgreSQL walk the whole window by its index
        # (a cursor's plan favours the first rows), 4 s where a scan takes under 1.
        rows = conn.execution_options(yield_per=_CHUNK).execute(select)
        index = FilterIndex([Filter(id=0, user_id=user_id, query=query)])
        newest: list[tuple[datetime, int]] = []  # the newest matches, at most ``shown``: a heap
        unread: list[int] = []  # listings stored before their words were: read whole below
        for chunk in rows.partitions():
            trial.read += len(chunk)
            if by_words:
                unread += [row.id for row in chunk if row.words is None]
                found = [row for row in chunk if row.words is not None and _holds(query, row.words)]
            else:
                found = [row for row in chunk if index.matching(
                    ListingText.of(row._mapping), any_age=True, now=now, text_words=stored_text_words(row.words))]
            _keep(newest, found, shown)
            trial.matched += len(found)
        for start in range(0, len(unread), _CHUNK):
            found = [row for row in _read(conn, unread[start:start + _CHUNK]).values()
                     if index.matching(ListingText.of(row._mapping), any_age=True, now=now)]
            _keep(newest, found, shown)
            trial.matched += len(found)
        ids = [listing_id for _, listing_id in sorted(newest, reverse=True)]
        listings = _read(conn, ids)
        notified = _notified(conn, user_id, ids)
    for listing_id in ids:
        row = listings[listing_id]
        trial.hits.append(Hit(row.id, row.source_id, row.url, row.title, row.ingested_at, row.published_at,
                              reasons(query, ListingText.of(row._mapping), now) or (), row.id in notified))
    trial.seconds = time.perf_counter() - started
    return trial


def backfill_filter(engine: Engine, settings: Settings, filter_id: int, query: str, *, days: int,
                    worker: str, now: datetime | None = None) -> int:
    """Notify filter ``filter_id`` (whose text is ``query``) of what it matches among the
    listings that arrived in the last ``days``, once: each match becomes a notification
    as a new listing's would (at once, or held for the user's digest or quiet hours,
    within their alert limit), never a second one for a listing the user already has.
    Returns how many were made."""
    now = now or datetime.now(UTC)
    with engine.connect() as conn:
        narrowed = candidates(compile_filter(conn, query))
    notifier = Notifier(engine, settings, worker)
    return notifier.rematch(now - timedelta(days=days), now + timedelta(seconds=1), any_age=True,
                            filter_ids=[filter_id], where=narrowed)


def _keep(newest: list[tuple[datetime, int]], rows: Iterable[Any], shown: int) -> None:
    """Keep in the heap ``newest`` the ``shown`` newest of it and ``rows``."""
    for row in rows:
        entry = (row.ingested_at, row.id)
        if len(newest) < shown:
            heapq.heappush(newest, entry)
        elif shown and entry > newest[0]:
            heapq.heapreplace(newest, entry)


def _read(conn: sa.Connection, ids: list[int]) -> dict[int, Any]:
    t = schema.listings
    return {row.id: row for row in conn.execute(sa.select(*(t.c[name] for name in _READ))
                                                .where(t.c.id.in_(ids)))} if ids else {}


def _notified(conn: sa.Connection, user_id: int, listing_ids: Iterable[int]) -> set[int]:
    n = schema.notifications
    ids = list(listing_ids)
    if not ids:
        return set()
    return set(conn.execute(sa.select(n.c.listing_id).where(n.c.user_id == user_id, n.c.listing_id.in_(ids)))
               .scalars())

"""One processor pass: raw rows become listings.

Raw rows are claimed oldest first (``RAW_UNPROCESSED``), normalised (pipeline/listings/normalize.py)
and, per claimed batch, ONE transaction marks them processed (fenced) and upserts their
listings: ``ingested_at`` is set on insert and never changed; a content change moves
``updated_at`` and resets ``matched_at`` so the listing is matched again. A listing
remembers the raw row it shows (``raw_id``) and an upsert never moves it backwards, so
two processors finishing out of order cannot restore older content.

A raw row that cannot be normalised keeps its error (``last_error``, ``attempts``) and is
tried again after ``retry_seconds``; after ``raw_max_attempts`` it is given up: marked
processed with its error kept, visible in `pipeline status` and the asset checks, never
dropped silently and never blocking the rows behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pipeline.backends import backend_for, unreachable
from pipeline.backends.upsert import ForwardUpsert
from pipeline.core import errors, heap
from pipeline.core.errors import NormaliseError
from pipeline.core.settings import Settings
from pipeline.core.urls import item_key
from pipeline.core.words import word_string
from pipeline.listings import stories
from pipeline.listings.boilerplate import Boilerplate, Runs
from pipeline.listings.normalize import Listing, normalise
from pipeline.queue.claim import WorkQueue
from pipeline.queue.heartbeat import Heartbeat
from pipeline.queue.spec import UNCLAIMED, Claim, RowCompletion
from pipeline.storage import counters, schema
from pipeline.storage.rows import RawRow
from pipeline.storage.status import records

log = logging.getLogger("pipeline.listings.processor")

_COLUMNS = (
    "source_id", "source_item_id", "url", "title", "summary", "author", "published_at",
    "categories", "price", "fields", "content_hash", "raw_id", "item_key", "words", "simhash", *schema.STORY_KEYS,
)
# A source's boilerplate as read is used for this long by a run (seconds): one read a
# source, not one a batch; another processor's learning reaches this run's within it.
PLATES_KEPT = 300.0
# What the processor reads of a claimed raw row (besides its id, order and attempts).
_CLAIMED = ("source_id", "source_item_id", "url", "raw_json")
_CONTENT = ("url", "title", "summary", "author", "published_at", "categories", "price", "fields", "content_hash",
            "item_key", "words")


@dataclass
class ProcessStats:
    claimed: int = 0
    inserted: int = 0  # new listings
    updated: int = 0  # listings whose content changed
    unchanged: int = 0  # raw rows that changed no listing (same content, or superseded)
    failed: int = 0  # rows that could not be normalised, to be tried again later
    gave_up: int = 0  # rows that failed raw_max_attempts times: processed, error kept
    fenced_out: int = 0  # rows another worker had taken over
    clustered: int = 0  # new listings that are a story another source brought (stories.py)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class SourceFacts(NamedTuple):
    """What the processor reads of a source once a run."""

    category: str | None  # its own (config.category), added to its listings' categories
    url: str | None


UNKNOWN_SOURCE = SourceFacts(None, None)  # deleted since its rows were claimed


@dataclass
class Processor:
    engine: Engine
    settings: Settings
    worker: str
    batch_size: int = 500
    retry_seconds: int = 300
    # What a run reads of its sources once, by id.
    _sources: dict[int, SourceFacts] = field(default_factory=dict)
    # Each source's boilerplate as last read (None: none stored), and when (monotonic).
    _plates: dict[int, tuple[Runs | None, float]] = field(default_factory=dict)

    @records("processor")
    def run(
        self, *, max_rows: int | None = None, progress: Callable[[int], None] | None = None
    ) -> ProcessStats:
        """Process claimed batches until none is left or ``max_rows`` were claimed;
        ``progress`` is told each batch's size once it is written."""
        heap.settle()  # once per process: what it imported, out of the collector's sight
        stats = ProcessStats()
        queue = WorkQueue(self.engine, schema.RAW_UNPROCESSED, lease_seconds=self.settings.lease_seconds,
                          columns=_CLAIMED, row=RawRow)
        existing = _existing(self.engine)
        isolating = False  # suspects came back: claim one row at a time until they are done
        with Heartbeat(queue) as heartbeat:
            while max_rows is None or stats.claimed < max_rows:
                batch = 1 if isolating else self.batch_size
                limit = min(batch, max_rows - stats.claimed) if max_rows else batch
                whole = queue.claim(self.worker, limit)
                claim = queue.isolate(whole)
                isolating = claim is not whole or (
                    bool(claim) and queue.spec.suspect is not None and queue.spec.suspect(claim.rows[0])
                )
                if not claim:
                    break
                stats.claimed += len(claim)
                heartbeat.hold(claim)
                try:
                    self._process(queue, claim, existing, stats)
                finally:
                    heartbeat.drop(claim)
                if progress is not None:
                    progress(len(claim))
        return stats

    def _process(self, queue: WorkQueue[RawRow], claim: Claim[RawRow], existing: sa.Select[Any], stats: ProcessStats) -> None:
        """Normalise a claimed batch and write it in one transaction. Any error while
        handling one row fails that row only: a row the normaliser (or anything else)
        cannot handle is recorded as failed, and if the database refuses the batch, its
        rows are written one by one so only the refused one fails."""
        now = datetime.now(UTC)
        sources = self._source_facts({row["source_id"] for row in claim.rows})
        good: list[tuple[RawRow, Listing]] = []
        bad: list[tuple[RawRow, str]] = []
        limit = self.settings.raw_max_attempts
        for row in claim.rows:  # oldest first, so a later row of the same item wins
            if queue.spec.exhausted(row, limit):
                stopped = f"claimed {row['attempts']} times without finishing (the worker stopped)"
                bad.append((row, stopped))
                continue
            try:
                listing = normalise(row["raw_json"], fallback_url=row["url"],
                                    source_category=sources.get(row["source_id"], UNKNOWN_SOURCE).category)
            except NormaliseError as exc:
                bad.append((row, str(exc)))
                continue
            except Exception as exc:  # a normaliser bug must not stop the other rows
                log.exception("normalising raw row %s crashed", row["id"])
                bad.append((row, f"unexpected {type(exc).__name__}: {exc}"))
                continue
            good.append((row, listing))
        counted = asdict(stats)
        try:
            with self.engine.begin() as conn:
                self._write(conn, queue, claim, existing, good, now, stats)
                self._record_failures(conn, queue, claim, bad, now, stats)
                _count(conn, counted, stats)
        except sa.exc.StatementError as exc:
            if unreachable(exc):
                # The database is gone or cannot do it now (a restart, a lost connection,
                # a full disk, a lock), not this batch's data: fail the step, blame no row.
                raise
            for name, value in counted.items():  # nothing of the batch was written
                setattr(stats, name, value)
            log.warning("the database refused a batch of %d raw rows; writing them one by one: %s",
                        len(claim), errors.reason(exc))
            for one in good:
                counted = asdict(stats)
                try:
                    with self.engine.begin() as conn:
                        self._write(conn, queue, claim, existing, [one], now, stats)
                        _count(conn, counted, stats)
                except sa.exc.StatementError as one_exc:
                    if unreachable(one_exc):
                        raise
                    for name, value in counted.items():
                        setattr(stats, name, value)
                    reason = errors.reason(one_exc)
                    bad.append((one[0], f"the database refused this row's listing: {reason}"))
            counted = asdict(stats)
            with self.engine.begin() as conn:
                self._record_failures(conn, queue, claim, bad, now, stats)
                _count(conn, counted, stats)

    def _write(
        self, conn: sa.Connection, queue: WorkQueue[RawRow], claim: Claim[RawRow], existing: sa.Select[Any],
        good: Sequence[tuple[RawRow, Listing]], now: datetime, stats: ProcessStats,
    ) -> None:
        """Mark ``good`` processed (fenced) and upsert the listings of the rows still held."""
        if not good:
            return
        latest: dict[tuple[int, str], tuple[RawRow, Listing]] = {}
        for row, listing in good:
            key = (row["source_id"], row["source_item_id"])
            if key in latest:
                stats.unchanged += 1  # superseded within this batch by a newer raw row
            latest[key] = (row, listing)
        ids = [row["id"] for row, _ in good]
        fenced = queue.complete(claim, {"processed_at": now, "last_error": None}, ids=ids, conn=conn)
        done = set(fenced.done)
        stats.fenced_out += len(fenced.lost)
        self._upsert(conn, existing, [pair for pair in latest.values() if pair[0]["id"] in done], stats)

    def _upsert(
        self, conn: sa.Connection, existing: sa.Select[Any], pairs: list[tuple[RawRow, Listing]], stats: ProcessStats,
    ) -> None:
        """Upsert the listings of ``pairs``, then put the new ones in their stories."""
        if not pairs:
            return
        # In the order of their keys: two processors upserting the same listings lock them
        # in one order, so one waits for the other instead of both for each other (a
        # backlog holds newer versions of one item in two batches, in other orders).
        pairs = sorted(pairs, key=lambda pair: (pair[0]["source_id"], pair[0]["source_item_id"]))
        facts = self._sources
        rows = [_listing_row(row, listing, facts.get(row["source_id"], UNKNOWN_SOURCE).url) for row, listing in pairs]
        backend = backend_for(conn)
        keys = [(r["source_id"], r["source_item_id"]) for r in rows]
        stored = {(r.source_id, r.source_item_id): r for r in conn.execute(existing, backend.pairs_params(keys))}
        new: dict[tuple[int, str], stories.Marks] = {}
        # The new listings' words, from which their sources' boilerplate is learned.
        words = {key: stories.Marks.words_of(listing) for key, (_, listing) in zip(keys, pairs, strict=True)
                 if key not in stored}
        by_source: dict[int, list[list[str]]] = {}
        for (source_id, _), these in words.items():
            by_source.setdefault(source_id, []).append(these)
        read_at = time.monotonic()
        plate = Boilerplate.learn(conn, by_source, stories.stored_words, known=self._known_plates(by_source, read_at))
        for r, (_, listing) in zip(rows, pairs, strict=True):
            key = (r["source_id"], r["source_item_id"])
            old = stored.get(key)
            if old is None:
                stats.inserted += 1
                marks = new[key] = stories.Marks.of(listing, self._sources.get(r["source_id"], UNKNOWN_SOURCE).url, words=words[key],
                                                    boilerplate=plate.of(r["source_id"]))
                r.update(marks.columns())
            elif old.content_hash != r["content_hash"] and (old.raw_id is None or old.raw_id <= r["raw_id"]):
                stats.updated += 1
            else:
                stats.unchanged += 1
        plate.save(conn)
        self._plates.update((source_id, (runs, read_at)) for source_id, runs in plate.read.items())
        for source_id in plate.learned:  # read again next time: this transaction may not commit
            self._plates.pop(source_id, None)
        written = backend.upsert_forward(conn, _UPSERT, rows)
        if written is None and new:  # the backend did not hand back the new ones' ids
            written = conn.execute(existing, backend.pairs_params(list(new))).all()
        if new:
            ids = {(r.source_id, r.source_item_id): r.id for r in written or ()}
            stats.clustered += stories.assign(conn, [
                stories.NewListing(ids[key], key[0], marks) for key, marks in new.items()
            ])

    def _record_failures(
        self, conn: sa.Connection, queue: WorkQueue[RawRow], claim: Claim[RawRow],
        bad: Sequence[tuple[RawRow, str]], now: datetime, stats: ProcessStats,
    ) -> None:
        give_up, retry = [], []
        for row, error in bad:
            attempts = row["attempts"]  # this one included: the claim counted it
            log.warning("raw row %s (source %s, item %r) failed attempt %d: %s",
                        row["id"], row["source_id"], row["source_item_id"], attempts, error)
            if attempts >= self.settings.raw_max_attempts:
                values = {"processed_at": now, "last_error": f"gave up after {attempts} attempts: {error}"}
                give_up.append(RowCompletion(claim, row["id"], values))
            else:
                retry.append(RowCompletion(claim, row["id"], {"last_error": error}))
        if give_up:
            stats.gave_up += len(queue.complete_each(give_up, conn=conn).done)
        if retry:
            stats.failed += len(queue.defer_each(retry, seconds=self.retry_seconds, conn=conn).done)

    def _source_facts(self, source_ids: set[int]) -> dict[int, SourceFacts]:
        """Each source's own category (config.category) and url, read once per run (a
        source deleted meanwhile is not there)."""
        missing = source_ids - self._sources.keys()
        if missing:
            t = schema.sources
            with self.engine.connect() as conn:
                for source_id, config, url in conn.execute(
                        sa.select(t.c.id, t.c.config, t.c.url).where(t.c.id.in_(sorted(missing)))):
                    category = (config or {}).get("category")
                    self._sources[source_id] = SourceFacts(category if isinstance(category, str) else None, url)
        return self._sources

    def _known_plates(self, source_ids: Iterable[int], now: float) -> dict[int, Runs | None]:
        """The boilerplate of ``source_ids`` read within ``PLATES_KEPT`` seconds of ``now``
        (monotonic): another processor's learning reaches this one's fingerprints by then."""
        known: dict[int, Runs | None] = {}
        for source_id in source_ids:
            cached = self._plates.get(source_id)
            if cached is not None and now - cached[1] < PLATES_KEPT:
                known[source_id] = cached[0]
        return known


# The counter outcome of each ProcessStats field that counts raw rows finished with.
_OUTCOMES = {"inserted": "inserted", "updated": "updated", "unchanged": "unchanged",
             "failed": "retrying", "gave_up": "gave_up"}


def _count(conn: sa.Connection, before: dict[str, int], stats: ProcessStats) -> None:
    """Add what this transaction did (``stats`` less ``before``) to the counters: the
    transaction's last statement (pipeline/storage/counters.py)."""
    now = asdict(stats)
    tally = counters.tally()
    for field_name, outcome in _OUTCOMES.items():
        counters.RAW_ROWS_PROCESSED.count(tally, now[field_name] - before[field_name], outcome)
    counters.add(conn, tally)


def reopen_window(engine: Engine, start: datetime, end: datetime) -> int:
    """Make the raw rows fetched in [start, end) unprocessed again (a backfill, after a
    normaliser change): the next processor pass normalises them anew. Rows being
    processed right now are left alone; returns how many were reopened. Rows deleted by
    retention (PIPELINE_RAW_RETENTION_DAYS) cannot be reprocessed."""
    t = schema.listings_raw
    with engine.begin() as conn:
        result = conn.execute(
            sa.update(t)
            .where(t.c.fetched_at >= start, t.c.fetched_at < end, t.c.processed_at.is_not(None))
            .values(processed_at=None, attempts=0, last_error=None)
        )
    return int(result.rowcount)


def _listing_row(row: RawRow, listing: Listing, source_url: str | None) -> dict[str, Any]:
    fields = listing.fields or {}
    return {
        "source_id": row["source_id"],
        "source_item_id": row["source_item_id"],
        "url": listing.url,
        "title": listing.title,
        "summary": listing.summary,
        "price": listing.price,
        "fields": listing.fields,
        "author": listing.author,
        "published_at": listing.published_at,
        "categories": listing.categories,
        "content_hash": listing.content_hash,
        "raw_id": row["id"],
        "item_key": item_key(listing.identity_url, row["source_item_id"], canonical=True, source_url=source_url),
        "words": word_string(listing.title, listing.summary, listing.author, listing.categories,
                             location=fields.get("location"), company=fields.get("company")),
        **_NO_MARKS,
    }


# Set for a new listing (its fingerprint and keys are taken once, when first stored).
_NO_MARKS = dict.fromkeys(("simhash", *schema.STORY_KEYS))


# The listings a batch's keys already have, to count inserts, updates and no-ops (and, where
# the upsert does not hand them back, the ids of the new ones), limited to the batch's
# keys by the backend (``where_pairs``): on PostgreSQL one probe of the unique
# (source_id, source_item_id) index per key and the same SQL text for every batch.
_EXISTING = sa.select(*(schema.listings.c[name] for name in ("id", "source_id", "source_item_id", "content_hash", "raw_id")))


def _existing(bind: sa.Engine | sa.Connection) -> sa.Select[Any]:
    """``_EXISTING`` limited to the keys that ``pairs_params`` will bind, as ``bind``'s
    backend limits it (built once per run)."""
    t = schema.listings
    return backend_for(bind).where_pairs(_EXISTING, t.c.source_id, t.c.source_item_id)

# INSERT ... ON CONFLICT (source_id, source_item_id) DO UPDATE, moving only forward: on
# conflict the listing takes the new content when the raw row is not older than the one
# it shows; ``ingested_at`` is never touched; ``updated_at`` moves and ``matched_at`` is
# cleared only when the content hash changed. New content fences out a notifier matching
# the old one (UNCLAIMED): its completion finds the row no longer held, and the new
# content is matched. The backend hands back the ids of the rows it wrote where it can
# (PostgreSQL): the new ones' are needed for their stories.
_UPSERT = ForwardUpsert(
    table=schema.listings, columns=_COLUMNS, keys=("source_id", "source_item_id"), order="raw_id",
    hash="content_hash", content=_CONTENT,
    on_change={"updated_at": sa.func.current_timestamp(), "matched_at": sa.null(),
               **{name: sa.null() for name in UNCLAIMED}},
    returning=("id", "source_id", "source_item_id"),
)

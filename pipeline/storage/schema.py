"""The pipeline's tables as SQLAlchemy Core metadata: the one definition the code queries.

Alembic migrations (migrations/versions) create the same schema; tests/test_migrations.py
fails when the two drift. Names are public: the CLI, the runbook's SQL and operators'
queries use them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from pipeline.backends import backend_for
from pipeline.backends.mariadb import MARIADB
from pipeline.backends.portable import Bind
from pipeline.backends.types import UTCDateTime
from pipeline.core import cadence, politeness
from pipeline.core.inputs import MAX_ITEM_ID_CHARS, NAME_CHARS
from pipeline.core.kinds import (
    ChannelKind,
    NotificationStatus,
    SourceHealth,
    SourceType,
    WebSubState,
    sql_in,
)
from pipeline.queue.spec import AgedTerm, OrderTerm, QueueSpec

_ZERO = timedelta(0)
MIN_FETCH_INTERVAL_MINUTES, MAX_FETCH_INTERVAL_MINUTES = cadence.MIN_INTERVAL_MINUTES, cadence.MAX_INTERVAL_MINUTES
DEFAULT_FETCH_INTERVAL_MINUTES = cadence.DEFAULT_INTERVAL_MINUTES
# A source's priority: due sources are claimed highest first (SOURCES_DUE's order), a
# source's priority rising by one for every PRIORITY_AGING_MINUTES it has been due.
MIN_PRIORITY, MAX_PRIORITY = cadence.MIN_PRIORITY, cadence.MAX_PRIORITY
PRIORITY_AGING_MINUTES = 10

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)




# JSONB on PostgreSQL (indexable, compact); JSON text elsewhere.
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY; BIGINT everywhere else.
IdType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# Text in a primary key or a plain index: MariaDB indexes a bounded VARCHAR only.
NameType = sa.Text().with_variant(sa.String(NAME_CHARS), *MARIADB)
ItemIdType = sa.Text().with_variant(sa.String(MAX_ITEM_ID_CHARS), *MARIADB)


def _id() -> sa.Column[Any]:
    """A table's id, never given twice: once a row is gone its id names nothing (a filter's
    ``source:12``, a receiver's record of a notification or listing id). PostgreSQL's and
    MariaDB's sequences never go back; SQLite's rowid took the largest id plus one, so
    deleting the newest row gave its id to the next (``ID_TABLES``: AUTOINCREMENT)."""
    return sa.Column("id", IdType, primary_key=True, autoincrement=True)


def _claim_columns() -> list[sa.Column[Any]]:
    """The lease and fencing columns every claimable table carries (pipeline/queue/claim.py)."""
    return [
        sa.Column("locked_until", UTCDateTime()),
        sa.Column("claimed_by", sa.Text()),
        sa.Column("claim_token", sa.String(36)),
    ]


def _source_id() -> sa.Column[Any]:
    """The owning source; rows go when their source is deleted."""
    return sa.Column(
        "source_id", IdType, sa.ForeignKey("sources.id", ondelete="CASCADE"), nullable=False
    )


def _now() -> sa.TextClause:
    return sa.text("CURRENT_TIMESTAMP")


def now_sql(bind: Bind, minus: timedelta = _ZERO) -> sa.ColumnElement[datetime]:
    """"Now" (less ``minus``) for reads over these tables, by the clock ``bind``'s backend
    trusts (pipeline/backends/clock.py)."""
    return backend_for(bind).now(UTCDateTime(), minus)


# Politeness groups (the policy: pipeline/core/politeness.py): every source belongs to one (its
# host by default); a group allows at most ``max_in_flight`` fetches at once, across all workers,
# and starts them at least ``min_interval_ms`` apart. NULL limits take those of the group
# named politeness.DEFAULT, which is also the group of a source given none.

politeness_groups = sa.Table(
    "politeness_groups",
    metadata,
    sa.Column("name", NameType, primary_key=True),
    sa.Column("max_in_flight", sa.Integer()),  # NULL: the default group's
    sa.Column("min_interval_ms", sa.Integer()),  # NULL: the default group's
    # No fetch of the group starts before this: the spacing after the last claim, or a
    # Retry-After that deferred the whole group.
    sa.Column("next_request_at", UTCDateTime()),
    sa.Column("deferred_reason", sa.Text()),  # why next_request_at was pushed past spacing
    # Sources of the group ever handed out: every claim adds how many it took, so a
    # claim adds those handed out since its snapshot (the newest row's value less the
    # snapshot's) to its count of fetches in flight (pipeline/fetching/politeness.py, the polite claim).
    sa.Column("claims", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    sa.CheckConstraint("max_in_flight >= 1", name="max_in_flight"),
    sa.CheckConstraint("min_interval_ms >= 0", name="min_interval"),
    # The groups waiting out their spacing or a deferral (``next_request_at`` ahead):
    # the polite claim reads them with every claim, a few rows however many groups
    # there are (migration 0030).
    sa.Index(None, "next_request_at"),
)

sources = sa.Table(
    "sources",
    metadata,
    _id(),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("url", sa.Text(), nullable=False),
    sa.Column("source_type", sa.String(16), nullable=False),
    sa.Column("config", JSONType, nullable=False, server_default=sa.text("'{}'")),
    sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column(
        "fetch_interval_minutes",
        sa.Integer(),
        nullable=False,
        server_default=sa.text(str(DEFAULT_FETCH_INTERVAL_MINUTES)),
    ),
    sa.Column("next_fetch_at", UTCDateTime()),  # NULL = due now
    sa.Column("last_fetched_at", UTCDateTime()),
    sa.Column("last_success_at", UTCDateTime()),
    sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("last_failure_reason", sa.String(32)),
    sa.Column("disabled_reason", sa.Text()),
    sa.Column("priority", sa.Integer(), nullable=False, server_default=sa.text("0")),
    # Adaptive cadence (pipeline/core/cadence.py): fetch_interval_minutes is learned from
    # the source's publishing, within [min_interval_minutes, max_interval_minutes] (NULL:
    # the settings' PIPELINE_ADAPTIVE_MIN_MINUTES / _MAX_MINUTES).
    sa.Column("adaptive_cadence", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("min_interval_minutes", sa.Integer()),
    sa.Column("max_interval_minutes", sa.Integer()),
    sa.Column("etag", sa.Text()),
    sa.Column("last_modified", sa.Text()),
    sa.Column("content_hash", sa.String(64)),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    # The site the source is a feed of (its <link>): where a message about an item
    # without a link of its own sends the reader. Written by each fetch that names one.
    sa.Column("site_url", sa.Text()),
    # Claims since the source's last completed fetch (counted by the claim itself):
    # a fetch that keeps killing its worker ends as a failure instead of looping.
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    # The source's politeness group; its row in politeness_groups must exist (written
    # with the source: pipeline/storage/politeness_groups.py ``ensure_groups``). No foreign key: SQLite
    # cannot add one to an existing table without copying it.
    sa.Column(
        "politeness_group",
        NameType,
        nullable=False,
        server_default=sa.text(f"'{politeness.DEFAULT}'"),
    ),
    *_claim_columns(),
    sa.UniqueConstraint("url"),
    # Fetches in flight per group: the claimed sources of the group (the polite claim
    # counts them). The predicate names ``claimed_by``, which no other query does, so
    # the plain claim's expired-lease branch keeps to its own index (migration 0007).
    sa.Index(
        "ix_sources_politeness_leased", "politeness_group", "locked_until",
        postgresql_where=sa.text("claimed_by IS NOT NULL"),
        sqlite_where=sa.text("claimed_by IS NOT NULL"),
    ),
    sa.CheckConstraint(
        sql_in("source_type", SourceType), name="source_type"
    ),
    sa.CheckConstraint(
        f"fetch_interval_minutes BETWEEN {MIN_FETCH_INTERVAL_MINUTES}"
        f" AND {MAX_FETCH_INTERVAL_MINUTES}",
        name="fetch_interval",
    ),
)

listings_raw = sa.Table(
    "listings_raw",
    metadata,
    _id(),
    _source_id(),
    sa.Column("source_item_id", sa.Text(), nullable=False),
    sa.Column("url", sa.Text(), nullable=False),
    sa.Column("raw_json", JSONType, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),  # hash of raw_json
    sa.Column("fetched_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("processed_at", UTCDateTime()),  # NULL = not yet processed
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("last_error", sa.Text()),
    *_claim_columns(),
    # Rows the processor gave up on: processed_at set, last_error kept (pipeline/listings/processor.py).
    sa.Index(
        "ix_listings_raw_failed", "id",
        postgresql_where=sa.text("last_error IS NOT NULL"),
        sqlite_where=sa.text("last_error IS NOT NULL"),
    ),
    # No unique key here: every index on a queue table is written on each claim and
    # completion (neither is a HOT update), so dedupe lives in source_items below.
    # Deleting a source seq-scans this table (no index on source_id), a rare admin act.
)

# The newest content hash of every item a source has yielded. The collector upserts it
# and inserts a raw row only for items that are new or changed, so an unchanged item is
# never stored twice, even after processed raw rows have been deleted by retention.
source_items = sa.Table(
    "source_items",
    metadata,
    sa.Column(
        "source_id",
        IdType,
        sa.ForeignKey("sources.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("source_item_id", ItemIdType, primary_key=True),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("first_seen_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("changed_at", UTCDateTime(), nullable=False, server_default=_now()),
)

# The columns of a listing's story keys (pipeline/listings/stories.py): its story URL's
# hash, then its fingerprint's four 16-bit bands.
STORY_KEYS = ("story_key", "story_band_0", "story_band_1", "story_band_2", "story_band_3")

listings = sa.Table(
    "listings",
    metadata,
    _id(),
    _source_id(),
    sa.Column("source_item_id", sa.Text(), nullable=False),
    sa.Column("url", sa.Text(), nullable=False),
    sa.Column("title", sa.Text(), nullable=False, server_default=sa.text("''")),
    sa.Column("summary", sa.Text(), nullable=False, server_default=sa.text("''")),
    sa.Column("author", sa.Text()),
    sa.Column("published_at", UTCDateTime()),
    sa.Column("categories", JSONType, nullable=False, server_default=sa.text("'[]'")),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.Column("ingested_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("updated_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("matched_at", UTCDateTime()),  # NULL = not yet matched against filters
    # The raw row whose content this listing shows; an upsert never moves it backwards.
    sa.Column("raw_id", IdType),
    # The item's identity across sources (pipeline/core/urls.py item_key): a user is notified
    # once per key, however many sources carry the item. NULL before revision 0006.
    sa.Column("item_key", sa.String(64)),
    *_claim_columns(),
    # The story it is (pipeline/listings/stories.py): NULL for the first listing of a
    # story, the id of that first listing for a later copy from another source; and the
    # SimHash of its words (signed), by which copies are found. Revision 0013.
    sa.Column("cluster_id", IdType),
    sa.Column("simhash", sa.BigInteger()),
    # When a watched listing was last seen gone from its source (pipeline/storage/watches.py);
    # NULL while it is there. Revision 0014.
    sa.Column("gone_at", UTCDateTime()),
    # The keys its copies from other sources are found by, each with an index: its story
    # URL's hash and its fingerprint's four 16-bit bands (STORY_KEYS). Set when it is
    # first stored, NULL when it has none. Revision 0015.
    sa.Column(STORY_KEYS[0], sa.BigInteger()),
    *(sa.Column(band, sa.Integer()) for band in STORY_KEYS[1:]),
    # A page item's price as the page shows it (its source's ``price`` selector), a part
    # of its content (change alerts); NULL for everything else. Revision 0016.
    sa.Column("price", sa.Text()),
    # What it says of itself beyond its words (pipeline/core/fields.py ``Fields.as_json``:
    # price, currency, salary_min/max a year, salary_currency, area in m², rooms,
    # location, company; amounts as decimal strings), read from its page's structured
    # data, its feed's g:price or its source's selectors; NULL when it says none.
    # Revision 0026.
    sa.Column("fields", JSONType),
    # Its words (pipeline/core/words.py word_string: " node node.js python "), which
    # `pipeline filters test` searches without reading the text again. Revision 0021.
    sa.Column("words", sa.Text()),
    # Good fetches in a row of its source that no longer listed it, while it is watched:
    # at two it is gone (pipeline/storage/watches.py ``mark_gone``). Revision 0023.
    sa.Column("missed", sa.SmallInteger(), nullable=False, server_default=sa.text("0")),
    sa.UniqueConstraint("source_id", "source_item_id"),
    sa.Index(None, "ingested_at"),  # windows for re-matching backfills
    # Copies only (the first of a story has none): `pipeline status` counts them.
    sa.Index(None, "cluster_id", postgresql_where=sa.text("cluster_id IS NOT NULL"),
             sqlite_where=sa.text("cluster_id IS NOT NULL")),
    # Each story key's most recent listings, newest first (MariaDB indexes the NULLs too).
    *(sa.Index(None, key, "id", postgresql_where=sa.text(f"{key} IS NOT NULL"),
               sqlite_where=sa.text(f"{key} IS NOT NULL"))
      for key in STORY_KEYS),
)

# A source's boilerplate (pipeline/listings/boilerplate.py ``Runs``): the runs of words all
# of its new listings had when it last learned them (a JSON list of texts; empty: none),
# taken out of its listings' texts for their fingerprints. Revision 0029.
source_words = sa.Table(
    "source_words",
    metadata,
    sa.Column("source_id", IdType, sa.ForeignKey("sources.id", ondelete="CASCADE"), primary_key=True,
              autoincrement=False),
    sa.Column("words", JSONType, nullable=False),
)

# One row, locked by the part of a processor's transaction that puts new listings in
# clusters: two copies of one story stored at once do not both found one.
story_lock = sa.Table(
    "story_lock",
    metadata,
    sa.Column("id", sa.SmallInteger(), primary_key=True, autoincrement=False),
)

# A user watching a listing they were notified of by a filter with ``changes``
# (pipeline/storage/watches.py), and the version of it they heard of. Revision 0014.
watches = sa.Table(
    "watches",
    metadata,
    sa.Column("user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("listing_id", IdType, sa.ForeignKey("listings.id", ondelete="CASCADE"), primary_key=True),
    _source_id(),
    sa.Column("filter_id", IdType, sa.ForeignKey("filters.id", ondelete="SET NULL")),
    sa.Column("version", sa.String(16), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    # The price the user last heard of (a page item's, as shown), which price conditions
    # compare with. Revision 0023.
    sa.Column("price", sa.Text()),
    sa.Index(None, "listing_id"),
    sa.Index(None, "source_id"),
)

users = sa.Table(
    "users",
    metadata,
    _id(),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("channel", sa.String(16), nullable=False),  # webhook | apprise
    sa.Column("channel_url", sa.Text(), nullable=False),
    sa.Column("secret", sa.Text()),  # HMAC key of the webhook channel
    sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    # When the user hears (pipeline/notify/schedule.py): NULL digest is immediate, NULL
    # quiet hours none, NULL time zone UTC. Revision 0012.
    sa.Column("digest", sa.Text()),
    sa.Column("quiet_hours", sa.Text()),
    sa.Column("timezone", sa.Text()),
    # A rotated webhook secret signs beside the new one until ``previous_secret_until``
    # (`users set --secret-file`, pipeline/notify/delivery.py). Revision 0018.
    sa.Column("previous_secret", sa.Text()),
    sa.Column("previous_secret_until", UTCDateTime()),
    sa.UniqueConstraint("name"),
    sa.CheckConstraint(sql_in("channel", ChannelKind), name="channel"),
)

filters = sa.Table(
    "filters",
    metadata,
    _id(),
    sa.Column(
        "user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    ),
    # The words the filter looks for, case-folded (shown; a filter without a query must
    # find every one), and the expression its user wrote (pipeline/notify/query.py;
    # NULL before revision 0011).
    sa.Column("keywords", JSONType, nullable=False),
    sa.Column("query", sa.Text()),
    sa.Column("source_id", IdType, sa.ForeignKey("sources.id", ondelete="CASCADE")),
    sa.Column("category", sa.Text()),
    sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    # Its user also hears when a listing it notified them of changes or goes
    # (`filters add --changes`, pipeline/storage/watches.py). Revision 0014.
    sa.Column("changes", sa.Boolean(), nullable=False, server_default=sa.false()),
    # Why the notifier last left it out, and when (its query no longer compiles, or
    # matching it raised: pipeline/notify/notifier.py). Revision 0017.
    sa.Column("error", sa.Text()),
    sa.Column("failed_at", UTCDateTime()),
    # Its changes are told only when the price meets one of these (`filters add
    # --price-drop 10 --price-below 1500`): a drop of at least this percent from the price
    # last heard of, or a price below this amount (pipeline/core/prices.py). Revision 0023.
    sa.Column("price_drop", sa.Double()),
    sa.Column("price_below", sa.Double()),
    # Where and when its matches go, when not as its user's (`filters route`): a channel of
    # its own (webhook | apprise, its URL, a webhook's HMAC key) and a mode (instant |
    # digest; pipeline/notify/schedule.py ``filter_digest``). NULL: the user's. Revision 0024.
    sa.Column("channel", sa.String(16)),
    sa.Column("channel_url", sa.Text()),
    sa.Column("secret", sa.Text()),
    sa.Column("mode", sa.String(8)),
    sa.Index(None, "user_id"),
)

notifications = sa.Table(
    "notifications",
    metadata,
    _id(),
    sa.Column(
        "user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column(
        "listing_id", IdType, sa.ForeignKey("listings.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("filter_id", IdType, sa.ForeignKey("filters.id", ondelete="SET NULL")),
    sa.Column("channel", sa.String(16), nullable=False),
    sa.Column("status", sa.String(8), nullable=False, server_default=sa.text(f"'{NotificationStatus.PENDING}'")),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("next_attempt_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("last_error", sa.Text()),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("sent_at", UTCDateTime()),
    sa.Column("item_key", sa.String(64)),  # the listing's, at matching
    # The listing's story (its cluster_id, or its id when it is the first): a user is
    # notified once per story, whichever source brings it first. Revision 0013. NULL for
    # a change alert, as its item key: the user heard of the story already.
    sa.Column("cluster_id", IdType),
    # What it tells (pipeline/storage/watches.py): "new", "changed:<version>" or "gone:<when>".
    # Revision 0014.
    sa.Column("event", sa.String(40), nullable=False, server_default=sa.text("'new'")),
    # The digest this notification went into: the id of the notification that carries it
    # (status held for the others until it is sent). Revision 0012.
    sa.Column("digest_id", IdType),
    *_claim_columns(),
    # A user is never notified twice about one listing, nor about one item that several
    # sources carry (NULL keys, of notifications older than revision 0006, never clash),
    # nor about one story (its copies from other sources).
    sa.Index("uq_notifications_user_id_listing_id_event", "user_id", "listing_id", "event", unique=True),
    sa.Index("uq_notifications_user_id_item_key", "user_id", "item_key", unique=True),
    sa.Index("uq_notifications_user_id_cluster_id", "user_id", "cluster_id", unique=True),
    sa.CheckConstraint(sql_in("status", NotificationStatus), name="status"),
    sa.Index(None, "listing_id"),
    # Dead notifications, for the asset check and `notifications requeue --dead`.
    sa.Index(
        "ix_notifications_dead", "id",
        postgresql_where=sa.text(f"status = '{NotificationStatus.DEAD}'"),
        sqlite_where=sa.text(f"status = '{NotificationStatus.DEAD}'"),
    ),
    # Held notifications not yet in a digest, by when they are released (digests are
    # made of them, pipeline/notify/notifier.py); and a digest's notifications. Not on
    # MariaDB, which has no partial indexes: a whole index on next_attempt_at would draw
    # the delivery claim away from its own (tests/test_claim_plans.py); held rows are
    # found there by the claim's index, whose first column is the status.
    sa.Index(
        "ix_notifications_held", "next_attempt_at",
        postgresql_where=sa.text(f"status = '{NotificationStatus.HELD}' AND digest_id IS NULL"),
        sqlite_where=sa.text(f"status = '{NotificationStatus.HELD}' AND digest_id IS NULL"),
    ).ddl_if(dialect=("postgresql", "sqlite")),  # type: ignore[arg-type]  # a tuple is documented
    sa.Index(None, "digest_id"),
    # A user's notifications of the last window, for their alert limit (pipeline/notify/
    # notifier.py ``AlertLimits``; revision 0019), and newest first, ties by id, for their
    # output feed (pipeline/catalogue/feeds.py; the id since revision 0022).
    sa.Index(None, "user_id", "created_at", "id"),
)

# A user's matches as a feed a reader subscribes to (pipeline/catalogue/feeds.py): all of
# the user's, or one filter's, at /feeds/<token>.atom and .json. Only the token's SHA-256
# is kept: the URL is shown once, and a copy of the database opens no feed. Revision 0022.
feed_tokens = sa.Table(
    "feed_tokens",
    metadata,
    _id(),
    sa.Column("user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("filter_id", IdType, sa.ForeignKey("filters.id", ondelete="CASCADE")),  # NULL: all
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("revoked_at", UTCDateTime()),  # NULL while it opens the feed
    sa.UniqueConstraint("token_hash"),
    sa.Index(None, "user_id"),
)

# A source's owner: the user told when it starts failing and when it recovers
# (pipeline/fetching/decide.py ``owner_alert``). ``alerted_at``: when the owner was last
# told it fails (NULL while it is healthy, or before they were told). A table of its own,
# not columns of ``sources``: SQLite adds no foreign key to an existing table, and the
# claimed source row stays as it is. Revision 0025.
source_owners = sa.Table(
    "source_owners",
    metadata,
    sa.Column("source_id", IdType, sa.ForeignKey("sources.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("alerted_at", UTCDateTime()),
    sa.Index(None, "user_id"),
)

# What a source's owner is told (``SOURCE_ALERTS_DUE``, sent by pipeline/notify/
# source_alerts.py): written in the fetch's fenced completion, so one alert per change of
# health, and delivered with the retries and end of a notification. Revision 0025.
source_alerts = sa.Table(
    "source_alerts",
    metadata,
    _id(),
    _source_id(),
    sa.Column("user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("event", sa.String(16), nullable=False),  # SourceHealth: failing | recovered
    sa.Column("reason", sa.String(32)),  # the failure's code (pipeline/core/failures.py)
    sa.Column("detail", sa.Text(), nullable=False),  # what the owner reads, written when it happened
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("status", sa.String(8), nullable=False, server_default=sa.text(f"'{NotificationStatus.PENDING}'")),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("next_attempt_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("last_error", sa.Text()),
    sa.Column("sent_at", UTCDateTime()),
    *_claim_columns(),
    sa.CheckConstraint(sql_in("status", NotificationStatus), name="status"),  # never held
    sa.CheckConstraint(sql_in("event", SourceHealth), name="event"),
    sa.Index(None, "source_id"),
    sa.Index(None, "user_id"),
)

# A source's WebSub subscription (pipeline/fetching/websub.py): its hub and topic as the
# feed advertised them, the unguessable path token of its callback
# (/websub/<callback_token>) and the secret the hub signs pushes with. ``state``:
# requested (asked, not yet verified), active (verified: pushes are taken until
# ``lease_until``), denied (the hub refused), unsubscribing (its source was disabled or
# removed: the hub is asked to stop). ``due_at`` is when the hub is next asked (to
# subscribe, renew or unsubscribe): a claim queue, ``WEBSUB_DUE``. ``source_id`` is NULL
# once the source is removed, while the hub is told. Revisions 0027, 0028.
websub_subscriptions = sa.Table(
    "websub_subscriptions",
    metadata,
    _id(),
    sa.Column("source_id", IdType, sa.ForeignKey("sources.id", ondelete="SET NULL")),
    sa.Column("hub", sa.Text(), nullable=False),
    sa.Column("topic", sa.Text(), nullable=False),
    sa.Column("callback_token", sa.String(64), nullable=False),
    sa.Column("secret", sa.String(64), nullable=False),
    # A renewal gives the subscription a new secret (websub.py, "Replays"): the one it
    # replaced still verifies pushes until ``previous_secret_until`` (None: until the
    # hub verifies the renewal); ``secret_since``: when the current one was made.
    sa.Column("previous_secret", sa.String(64)),
    sa.Column("previous_secret_until", UTCDateTime()),
    sa.Column("secret_since", UTCDateTime()),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("requested_at", UTCDateTime(), nullable=False),
    sa.Column("verified_at", UTCDateTime()),
    sa.Column("lease_until", UTCDateTime()),
    sa.Column("pushes", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("last_push_at", UTCDateTime()),
    # Items a safety poll found that no push brought, and when last (websub.py).
    sa.Column("missed", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("missed_at", UTCDateTime()),
    sa.Column("last_error", sa.Text()),
    sa.Column("due_at", UTCDateTime()),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    *_claim_columns(),
    sa.UniqueConstraint("source_id"),
    sa.UniqueConstraint("callback_token"),
    sa.CheckConstraint(sql_in("state", WebSubState), name="state"),
)

# The pushes a subscription took, by the SHA-256 of their body, while a secret that
# could have signed them is accepted: a captured push sent again is a repeat, never
# stored (websub.py, "Replays").
websub_pushes = sa.Table(
    "websub_pushes",
    metadata,
    sa.Column("subscription_id", IdType, sa.ForeignKey("websub_subscriptions.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("received_at", UTCDateTime(), nullable=False),
)

# A channel whose receiver answered 410 Gone (pipeline/notify/delivery.py, ``gone``): by
# its URL's SHA-256, never the URL (it can be a credential). Its notifications are held,
# unsent, until the channel is set again or ``GONE_RETRY`` after ``gone_at``; ``user_id``
# is whose notification found it gone (the failing_channels check names them). Revision 0035.
gone_channels = sa.Table(
    "gone_channels",
    metadata,
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("user_id", IdType, sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    sa.Column("gone_at", UTCDateTime(), nullable=False),
    sa.Column("error", sa.Text(), nullable=False),
)

# The events of ingestion_events: a source handed out for a fetch, and its fetch's end.
EVENT_STARTED = "ingestion.started"
EVENT_COMPLETED = "ingestion.completed"

ingestion_events = sa.Table(
    "ingestion_events",
    metadata,
    _id(),
    sa.Column("event", sa.String(32), nullable=False),  # ingestion.started | ingestion.completed
    sa.Column("occurred_at", UTCDateTime(), nullable=False, server_default=_now()),
    sa.Column("source_id", IdType, sa.ForeignKey("sources.id", ondelete="CASCADE")),
    sa.Column("source_type", sa.String(16)),
    sa.Column("run_id", sa.Text()),
    sa.Column("scheduled_at", UTCDateTime()),
    sa.Column("duration_ms", sa.Integer()),
    sa.Column("success", sa.Boolean()),
    sa.Column("failure_reason", sa.String(32)),
    # DOUBLE on MariaDB, by name: a generic Float compiles as FLOAT there, but as FLOAT(32)
    # (a DOUBLE) in any process that imported Dagster's storage, which registers its own
    # MySQL compilation of Float (dagster/_core/storage/sql.py).
    sa.Column("retry_in_minutes", sa.Float().with_variant(mysql.DOUBLE(asdecimal=False), *MARIADB)),
    sa.Column("http_status", sa.Integer()),
    sa.Column("items_seen", sa.Integer()),
    sa.Column("items_new", sa.Integer()),
    sa.Column("details", JSONType),
    sa.Index(None, "source_id", "occurred_at"),
    sa.Index(None, "occurred_at"),
)

# Counters of work done (pipeline/storage/counters.py): a series' total is the sum of its
# shards, each added to by the transaction that did the work. Never purged; its size is
# bounded by (series x shards).
metric_counts = sa.Table(
    "metric_counts",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("label", sa.String(64), primary_key=True),  # the one label's value, or ""
    sa.Column("shard", sa.SmallInteger(), primary_key=True),
    sa.Column("value", sa.Double(), nullable=False),
)

worker_state = sa.Table(
    "worker_state",
    metadata,
    sa.Column("worker_name", NameType, primary_key=True),
    sa.Column("last_run_at", UTCDateTime()),
    sa.Column("last_status", sa.Text()),
    sa.Column("last_error", sa.Text()),
)


# -- Claim queues -------------------------------------------------------------------------
# What each stage claims (pipeline/queue/claim.py). Each spec also defines its two partial
# indexes, from the same predicates, so the claim queries and their indexes cannot drift.


def _due(now: sa.ColumnElement[datetime]) -> sa.ColumnElement[bool]:
    # A source is due when its next fetch time has passed; NULL means due now.
    return sa.or_(sources.c.next_fetch_at.is_(None), sources.c.next_fetch_at <= now)


def _attempt_due(now: sa.ColumnElement[datetime]) -> sa.ColumnElement[bool]:
    return notifications.c.next_attempt_at <= now



# Due sources, highest priority first (aged: one level up for every PRIORITY_AGING_MINUTES
# a source has been due, so none starves), never-fetched first, then longest overdue. The
# free index ranges over next_fetch_at; on PostgreSQL a claim reads the free sources a
# priority level at a time from the level index (pipeline/queue/claim.py
# ``_free_by_level``), a few rows however many are due; SQLite and MariaDB sort the due.
SOURCES_DUE = QueueSpec(
    name="due",
    table=sources,
    pending=sources.c.enabled,
    ready=_due,
    order=(
        AgedTerm(sources.c.priority, descending=True, since=sources.c.next_fetch_at,
                 step=timedelta(minutes=PRIORITY_AGING_MINUTES)),
        OrderTerm(sources.c.next_fetch_at, nulls_first=True),
        OrderTerm(sources.c.id),
    ),
    pending_on=(sources.c.enabled,),
    index_on=(sources.c.next_fetch_at,),
    attempts=sources.c.attempts,
    suspect=lambda row: row["attempts"] > 1,  # reset when a fetch completes
)

# Raw rows not yet processed, oldest first: the free index is read in order.
RAW_UNPROCESSED = QueueSpec(
    name="unprocessed",
    table=listings_raw,
    pending=listings_raw.c.processed_at.is_(None),
    order=(OrderTerm(listings_raw.c.fetched_at), OrderTerm(listings_raw.c.id)),
    pending_on=(listings_raw.c.processed_at,),
    index_on=(listings_raw.c.fetched_at, listings_raw.c.id),
    attempts=listings_raw.c.attempts,
    suspect=lambda row: row["attempts"] > 1,  # a stopped worker, or a failure (rare)
)

# Listings not yet matched against filters (new, or changed since they were matched).
# The notifier claims these instead of scanning by a time cursor, so a listing whose
# transaction committed late is never missed.
LISTINGS_UNMATCHED = QueueSpec(
    name="unmatched",
    table=listings,
    pending=listings.c.matched_at.is_(None),
    order=(OrderTerm(listings.c.updated_at), OrderTerm(listings.c.id)),
    pending_on=(listings.c.matched_at,),
    index_on=(listings.c.updated_at, listings.c.id),
)

# Notifications waiting for a (first or repeated) delivery attempt that is due.
NOTIFICATIONS_DUE = QueueSpec(
    name="due",
    table=notifications,
    # Literals, not bound parameters: a prepared statement's generic plan can only use a
    # partial index whose predicate the query implies without knowing parameter values.
    pending=notifications.c.status.in_(
        [sa.literal_column(f"'{s}'") for s in (NotificationStatus.PENDING, NotificationStatus.FAILED)]
    ),
    ready=_attempt_due,
    order=(OrderTerm(notifications.c.next_attempt_at), OrderTerm(notifications.c.id)),
    pending_on=(notifications.c.status,),
    index_on=(notifications.c.next_attempt_at, notifications.c.id),
    attempts=notifications.c.attempts,
    # Claimed before, and no outcome recorded: a failed send records its error. (A
    # sender that dies after an earlier failure is not told apart from a retry.)
    suspect=lambda row: row["attempts"] > 1 and row["last_error"] is None,
)

# A source's owner's alerts waiting for a (first or repeated) delivery that is due.
SOURCE_ALERTS_DUE = QueueSpec(
    name="due",
    table=source_alerts,
    pending=source_alerts.c.status.in_(
        [sa.literal_column(f"'{s}'") for s in (NotificationStatus.PENDING, NotificationStatus.FAILED)]
    ),
    ready=lambda now: source_alerts.c.next_attempt_at <= now,
    order=(OrderTerm(source_alerts.c.next_attempt_at), OrderTerm(source_alerts.c.id)),
    pending_on=(source_alerts.c.status,),
    index_on=(source_alerts.c.next_attempt_at, source_alerts.c.id),
    attempts=source_alerts.c.attempts,
    suspect=lambda row: row["attempts"] > 1 and row["last_error"] is None,
)

# WebSub subscriptions whose hub is due to be asked (subscribe, renew, unsubscribe:
# pipeline/fetching/websub.py), by the collector's runs.
WEBSUB_DUE = QueueSpec(
    name="due",
    table=websub_subscriptions,
    pending=websub_subscriptions.c.due_at.is_not(None),
    ready=lambda now: websub_subscriptions.c.due_at <= now,
    order=(OrderTerm(websub_subscriptions.c.due_at), OrderTerm(websub_subscriptions.c.id)),
    # MariaDB's one index: (locked_until, due_at, id); due_at leads the order already.
    index_on=(websub_subscriptions.c.due_at, websub_subscriptions.c.id),
    attempts=websub_subscriptions.c.attempts,
    suspect=lambda row: row["attempts"] > 1 and row["last_error"] is None,
)

# Every table with an ``_id()``: on SQLite, AUTOINCREMENT (revision 0034).
ID_TABLES: tuple[sa.Table, ...] = tuple(
    t for t in metadata.sorted_tables if "id" in t.c and t.c.id.primary_key and t.c.id.autoincrement is True)
for _table in ID_TABLES:
    _table.dialect_kwargs["sqlite_autoincrement"] = True

QUEUES: tuple[QueueSpec, ...] = (SOURCES_DUE, RAW_UNPROCESSED, LISTINGS_UNMATCHED, NOTIFICATIONS_DUE,
                                 SOURCE_ALERTS_DUE, WEBSUB_DUE)
for _queue in QUEUES:
    _queue.indexes()
CLAIMABLE_TABLES: tuple[sa.Table, ...] = tuple(q.table for q in QUEUES)

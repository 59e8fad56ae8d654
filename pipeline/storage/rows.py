"""What each queue's claim hands out, by name and type: one TypedDict per queue (and per
set of columns a stage asks its claim for), so that mypy checks every name a stage reads
of a claimed row. A queue made with one (``WorkQueue(..., row=SourceRow)``) checks when
it is made that its keys are the columns its claim returns (ValueError names the
difference), so a column added to a table, or to what a stage asks for, fails at once
until the type says so too. Times are UTC-aware ``datetime`` (UTCDateTime); JSON columns
are what they hold (``Any``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict


class SourceRow(TypedDict):
    """A due source, as the collector's polite claim hands it out (every column)."""

    id: int
    name: str
    url: str
    source_type: str
    config: Any
    enabled: bool
    fetch_interval_minutes: int
    next_fetch_at: datetime | None
    last_fetched_at: datetime | None
    last_success_at: datetime | None
    consecutive_failures: int
    last_failure_reason: str | None
    disabled_reason: str | None
    priority: int
    adaptive_cadence: bool
    min_interval_minutes: int | None
    max_interval_minutes: int | None
    etag: str | None
    last_modified: str | None
    content_hash: str | None
    created_at: datetime
    site_url: str | None
    attempts: int
    politeness_group: str
    locked_until: datetime | None
    claimed_by: str | None
    claim_token: str | None


class RawRow(TypedDict):
    """An unprocessed raw row, as the processor claims it."""

    id: int
    fetched_at: datetime
    attempts: int
    source_id: int
    source_item_id: str
    url: str
    raw_json: Any


class UnmatchedRow(TypedDict):
    """A listing not yet matched, as the notifier's matching claims it."""

    id: int
    updated_at: datetime
    source_id: int
    title: str
    summary: str
    categories: Any
    ingested_at: datetime
    author: str | None
    published_at: datetime | None
    fields: Any
    item_key: str | None
    cluster_id: int | None
    price: str | None
    gone_at: datetime | None


class NotificationRow(TypedDict):
    """A due notification, as the notifier's delivery claims it (every column)."""

    id: int
    user_id: int
    listing_id: int
    filter_id: int | None
    channel: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    sent_at: datetime | None
    item_key: str | None
    cluster_id: int | None
    event: str
    digest_id: int | None
    locked_until: datetime | None
    claimed_by: str | None
    claim_token: str | None


class SourceAlertRow(TypedDict):
    """A due alert to a source's owner (every column)."""

    id: int
    source_id: int
    user_id: int
    event: str
    reason: str | None
    detail: str
    created_at: datetime
    status: str
    attempts: int
    next_attempt_at: datetime
    last_error: str | None
    sent_at: datetime | None
    locked_until: datetime | None
    claimed_by: str | None
    claim_token: str | None


class SubscriptionRow(TypedDict):
    """A WebSub subscription (every column): as the queue of those due to be asked for
    hands it out, and as pipeline/fetching/websub.py reads one by source or token."""

    id: int
    source_id: int | None
    hub: str
    topic: str
    callback_token: str
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    secret_since: datetime | None
    state: str
    requested_at: datetime
    verified_at: datetime | None
    lease_until: datetime | None
    pushes: int
    last_push_at: datetime | None
    missed: int
    missed_at: datetime | None
    last_error: str | None
    due_at: datetime | None
    attempts: int
    locked_until: datetime | None
    claimed_by: str | None
    claim_token: str | None

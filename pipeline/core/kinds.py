"""The closed vocabularies stored in the database: source types, notification statuses
and delivery channels, one ``StrEnum`` each; the tables' check constraints are built from them."""

from __future__ import annotations

from enum import StrEnum


# The formats of a sources file (`sources export`, `sources import`).
EXPORT_FORMATS = ("opml", "yaml", "csv")


class SourceType(StrEnum):
    """How a source is read (``sources.source_type``): the adapter that reads it."""

    RSS = "rss"  # RSS, Atom, RDF or JSON Feed
    PAGE = "http"  # an HTML page read with CSS selectors
    YOUTUBE = "youtube"  # a channel, handle or playlist


class NotificationStatus(StrEnum):
    """Where a notification stands (``notifications.status``)."""

    PENDING = "pending"  # not tried yet
    SENT = "sent"
    FAILED = "failed"  # tried, to be retried at next_attempt_at
    DEAD = "dead"  # attempts used up, or a permanent failure: an operator may requeue it
    # Waiting for its user's digest or the end of quiet hours (next_attempt_at), or, with
    # a digest_id, part of a digest that its first notification carries.
    HELD = "held"


class SourceHealth(StrEnum):
    """What a source's owner is told (``source_alerts.event``, pipeline/fetching/decide.py)."""

    FAILING = "failing"  # its fetches fail (or a site blocks them): someone should look
    RECOVERED = "recovered"  # a fetch succeeded again after the owner was told it fails


class WebSubState(StrEnum):
    """Where a source's WebSub subscription stands (``websub_subscriptions.state``)."""

    REQUESTED = "requested"  # asked of the hub, not yet verified
    ACTIVE = "active"  # verified: pushes are taken until its lease ends
    DENIED = "denied"  # the hub refused it
    UNSUBSCRIBING = "unsubscribing"  # its source was disabled or removed: the hub is asked to stop


class PushHealth(StrEnum):
    """Whether a source's pushes can be trusted (pipeline/storage/health.py ``push_health``)."""

    PUSHED = "pushed"  # verified, its lease running, no poll found what a push did not bring
    MISSED = "missed"  # a poll found items no push brought, no push since: polled at its cadence, asked again
    EXPIRED = "expired"  # verified once, its lease ran out
    REQUESTED = "requested"  # asked of the hub, its verification awaited
    UNVERIFIED = "unverified"  # asked of the hub, not verified within the hour: asked again
    DENIED = "denied"  # the hub refused it
    ENDING = "ending"  # its source was disabled or removed


# The push states that need a person's eye or the machine's repair (the push_health check).
PUSH_TROUBLE = (PushHealth.MISSED, PushHealth.EXPIRED, PushHealth.UNVERIFIED, PushHealth.DENIED)


class ChannelKind(StrEnum):
    """How a user is notified (``users.channel``, ``notifications.channel``)."""

    WEBHOOK = "webhook"  # a signed HTTP POST
    APPRISE = "apprise"  # any Apprise URL: e-mail, Slack, ...


def sql_in(column: str, vocabulary: type[StrEnum]) -> str:
    """``column IN ('a', 'b')`` over every value of ``vocabulary``: a check constraint."""
    return f"{column} IN ({', '.join(repr(str(v)) for v in vocabulary)})"

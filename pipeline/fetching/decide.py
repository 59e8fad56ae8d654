"""What a finished fetch changes on its source: a pure, frozen decision (no database, no clock).

The collector fetches, asks the database the one thing the decision needs (is a permanent
redirect's target already a source?), calls ``decide`` and writes ``values()`` in the
fetch's completion. Tested without a database in tests/test_decide.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.core import cadence
from pipeline.core.backoff import BackoffPolicy, next_fetch_after_success, retry_after_failure
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.kinds import SourceHealth
from pipeline.core.politeness import group_for
from pipeline.fetching.base import Item, Outcome


@dataclass(frozen=True)
class SourceDecision:
    """The source row after one fetch. ``failure`` None means the fetch succeeded."""

    next_fetch_at: datetime
    fetched_at: datetime
    consecutive_failures: int
    failure: FailureReason | None = None
    etag: str | None = None  # success only: the validators for the next conditional GET
    last_modified: str | None = None
    new_url: str | None = None  # a permanent redirect to a URL no other source has
    new_group: str | None = None  # the redirect's host group, for a source in its host's group
    config: Mapping[str, Any] | None = None  # the config with the adapter's updates merged
    disabled_reason: str | None = None  # permanent failures disabled the source
    interval_minutes: int | None = None  # an adaptive cadence's new interval
    site_url: str | None = None  # success only: the site the feed says it is of, when it says

    def values(self) -> dict[str, Any]:
        """The columns the fetch's completion writes."""
        values: dict[str, Any] = {
            "next_fetch_at": self.next_fetch_at,
            "attempts": 0,  # the fetch finished: its claims no longer count against it
            "last_fetched_at": self.fetched_at,
            "consecutive_failures": self.consecutive_failures,
            "last_failure_reason": None if self.failure is None else self.failure.value,
        }
        if self.failure is None:
            values.update(last_success_at=self.fetched_at, etag=self.etag, last_modified=self.last_modified)
        if self.new_url is not None:
            values["url"] = self.new_url
        if self.new_group is not None:
            values["politeness_group"] = self.new_group
        if self.config is not None:
            values["config"] = dict(self.config)
        if self.disabled_reason is not None:
            values.update(enabled=False, disabled_reason=self.disabled_reason)
        if self.interval_minutes is not None:
            values["fetch_interval_minutes"] = self.interval_minutes
        if self.site_url is not None:
            values["site_url"] = self.site_url
        return values


@dataclass(frozen=True)
class Cadence:
    """What an adaptive cadence needs besides the source and its outcome."""

    default_min_minutes: int  # the bounds of a source that sets none (Settings)
    default_max_minutes: int
    group_floor_minutes: float = 0.0  # politeness_groups.cadence_floor_minutes of the source's group
    u: float = 0.5  # uniform in [0, 1): the jitter


def _published(items: Sequence[Item]) -> Iterator[datetime]:
    for item in items:
        stamp = item.raw.get("published_at")
        if isinstance(stamp, str):
            try:
                parsed = datetime.fromisoformat(stamp)
            except ValueError:
                continue
            yield parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _adaptive(source: Mapping[str, Any], outcome: Outcome, finished: datetime, how: Cadence) -> int:
    """The source's next interval by its publishing (pipeline/core/cadence.py)."""
    bounds = cadence.Bounds(
        min_minutes=source["min_interval_minutes"] or how.default_min_minutes,
        max_minutes=source["max_interval_minutes"] or how.default_max_minutes,
        hint_minutes=outcome.refresh_minutes,
        group_floor_minutes=how.group_floor_minutes,
    )
    gap = cadence.publishing_gap(_published(outcome.items), finished)
    return cadence.next_interval(source["fetch_interval_minutes"], gap, bounds, unchanged=outcome.not_modified)


def after_success(
    source: Mapping[str, Any], outcome: Outcome, *, finished: datetime, group_by: str,
    moved_url_taken: bool = False, adaptive: Cadence | None = None,
) -> SourceDecision:
    """The next fetch one interval after this one (for a source with adaptive cadence,
    the interval learned now, jittered: ``adaptive`` must be given); the server's
    validators kept; a permanent redirect followed unless its target is another source
    already."""
    new_url = new_group = None
    if outcome.moved_to and outcome.moved_to != source["url"] and not moved_url_taken:
        new_url = outcome.moved_to
        # A source in its host's group follows its new host; a named group stays.
        if source["politeness_group"] == group_for(source["url"], source["source_type"], by=group_by):
            new_group = group_for(new_url, source["source_type"], by=group_by)
    config = {**(source["config"] or {}), **outcome.config_updates} if outcome.config_updates else None
    interval = None
    next_fetch_at = next_fetch_after_success(finished, source["fetch_interval_minutes"])
    if source.get("adaptive_cadence"):
        if adaptive is None:
            raise ValueError(f"source {source['id']} has an adaptive cadence: its decision needs a Cadence")
        interval = _adaptive(source, outcome, finished, adaptive)
        next_fetch_at = finished + cadence.jittered(interval, adaptive.u)
    return SourceDecision(
        next_fetch_at=next_fetch_at,
        interval_minutes=interval,
        fetched_at=finished,
        consecutive_failures=0,
        etag=outcome.etag,
        last_modified=outcome.last_modified,
        new_url=new_url,
        new_group=new_group,
        config=config,
        site_url=outcome.site_url,
    )


def after_failure(
    source: Mapping[str, Any], error: FetchError, *, finished: datetime, u: float, policy: BackoffPolicy
) -> SourceDecision:
    """Backed off by the failure's code and streak (``u``: uniform in [0, 1), the jitter);
    disabled when permanent failures reach the policy's limit."""
    failures = source["consecutive_failures"] + 1
    retry = retry_after_failure(
        error.reason, failures, now=finished, u=u, retry_after=error.retry_after, policy=policy
    )
    disabled = f"{error.reason.value} {failures} times in a row; last: {error.message}" if retry.disable else None
    return SourceDecision(
        next_fetch_at=retry.at,
        fetched_at=finished,
        consecutive_failures=failures,
        failure=error.reason,
        disabled_reason=disabled,
    )


# A site that refuses the pipeline's reads: its owner is told at the first, whatever the
# failures' count (a block can take days of backoff to reach it), since someone must act.
BLOCKING_STATUSES = frozenset({401, 403})


def blocks(error: FetchError) -> bool:
    """Is ``error`` a site refusing automated reads: a bot challenge, a 429, a 401 or 403?"""
    return error.reason in (FailureReason.BLOCKED, FailureReason.RATE_LIMITED) or (
        error.reason is FailureReason.HTTP_4XX and error.http_status in BLOCKING_STATUSES)


@dataclass(frozen=True)
class OwnerAlert:
    """What a source's owner is told after one fetch (``source_alerts``)."""

    event: SourceHealth
    reason: str | None  # the failure's code; None for a recovery
    detail: str  # one paragraph, written now: what happened and since when


def owner_alert(
    source: Mapping[str, Any], error: FetchError | None, decision: SourceDecision, *, alerted: bool,
    after_failures: int,
) -> OwnerAlert | None:
    """The alert, if any, that this fetch gives an owned source's owner: FAILING when it
    has now failed ``after_failures`` times in a row, was blocked, or was disabled (once:
    ``alerted`` says they were told and not yet of a recovery); RECOVERED at the first
    success after that. A fetch that fails and succeeds between alerts tells nothing."""
    name = source["name"] if source["name"] == source["url"] else f"{source['name']} ({source['url']})"
    if error is None:
        if not alerted:
            return None
        return OwnerAlert(SourceHealth.RECOVERED, None,
                          f"{name} works again: a fetch succeeded (failed fetches in a row before it:"
                          f" {source['consecutive_failures']}).")
    if alerted:
        return None
    failures = decision.consecutive_failures
    if not (failures >= after_failures or blocks(error) or decision.disabled_reason is not None):
        return None
    last = source["last_success_at"]
    since = f"last success {last:%Y-%m-%d %H:%M} UTC" if last else "no success yet"
    said = {FailureReason.BLOCKED: "the site blocks automated reads", FailureReason.RATE_LIMITED:
            "the site limits the pipeline's requests (429)"}.get(error.reason, error.reason.value)
    action = (f" It is disabled: {decision.disabled_reason}. `pipeline sources enable {source['id']}`"
              " once it is fixed." if decision.disabled_reason else
              f" It is retried at {decision.next_fetch_at:%Y-%m-%d %H:%M} UTC.")
    return OwnerAlert(SourceHealth.FAILING, error.reason.value,
                      f"{name} fails: {said}: {error.message}"
                      f" (failed fetches in a row: {failures}; {since}).{action}")

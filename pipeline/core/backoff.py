"""When a source is fetched next: the cadence and the backoff formula, as pure functions.

No I/O and no clock: the caller passes ``now`` and a uniform random number, so every
branch is testable exactly. The formula (documented with a worked example in
docs/runbook.md, "Backoff"):

    n        = consecutive failures, counting this one (1, 2, 3, ...)
    base     = 5 min (transient) or 60 min (permanent: http_4xx, parse_error, ...)
    cap      = 24 h (transient) or 7 days (permanent)
    delay    = min(cap, base * 2 ** (n - 1)) * (1 + jitter * (2 * u - 1))    u in [0, 1)
    retry_at = max(now + delay, min(Retry-After, now + cap))   (a floor, within the cap)
    youtube_quota: retry_at = the next midnight in America/Los_Angeles (+ up to 5 min)
    disable when a permanent failure is the `disable_after`-th (default 10) in a row
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from pipeline.core.failures import PERMANENT, FailureReason

PACIFIC = ZoneInfo("America/Los_Angeles")  # YouTube's quota resets at midnight there


@dataclass(frozen=True)
class BackoffPolicy:
    transient_base: timedelta = timedelta(minutes=5)
    transient_cap: timedelta = timedelta(hours=24)
    permanent_base: timedelta = timedelta(hours=1)
    permanent_cap: timedelta = timedelta(days=7)
    jitter: float = 0.2  # +-20%, so sources that failed together do not retry together
    disable_after: int = 10  # permanent failures in a row

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.disable_after < 1:
            raise ValueError(f"disable_after must be at least 1, got {self.disable_after}")


@dataclass(frozen=True)
class Retry:
    """What to do with a source after a failed fetch."""

    at: datetime  # the new next_fetch_at
    disable: bool  # the source failed permanently too often: disable it


def next_fetch_after_success(finished_at: datetime, interval_minutes: int) -> datetime:
    """The cadence: the next fetch is one interval after this one finished."""
    return finished_at + timedelta(minutes=interval_minutes)


def next_quota_reset(now: datetime) -> datetime:
    """The next midnight in America/Los_Angeles after ``now`` (an aware datetime)."""
    local = now.astimezone(PACIFIC)
    midnight = datetime.combine(local.date() + timedelta(days=1), time(0), tzinfo=PACIFIC)
    return midnight.astimezone(now.tzinfo)


def retry_after_failure(
    reason: FailureReason,
    consecutive_failures: int,
    *,
    now: datetime,
    u: float,
    retry_after: datetime | None = None,
    policy: BackoffPolicy = BackoffPolicy(),
) -> Retry:
    """The backoff formula of the module docstring; ``u`` is uniform in [0, 1)."""
    if consecutive_failures < 1:
        raise ValueError(f"consecutive_failures counts this failure: >= 1, got {consecutive_failures}")
    if not 0 <= u < 1:
        raise ValueError(f"u must be in [0, 1), got {u}")
    permanent = reason in PERMANENT
    base, cap = (
        (policy.permanent_base, policy.permanent_cap) if permanent else (policy.transient_base, policy.transient_cap)
    )
    if reason is FailureReason.YOUTUBE_QUOTA:
        at = next_quota_reset(now) + timedelta(minutes=5) * u
    else:
        at = now + exponential_delay(consecutive_failures, base=base, cap=cap, jitter=policy.jitter, u=u)
    disable = permanent and consecutive_failures >= policy.disable_after
    return Retry(at=not_before(at, retry_after, now, cap), disable=disable)


def clamp_retry_after(
    reason: FailureReason, retry_after: datetime, now: datetime, policy: BackoffPolicy = BackoffPolicy()
) -> datetime:
    """A server's Retry-After, bounded by the backoff's cap for ``reason``: a server
    cannot park a source (or its politeness group) for longer than our own backoff would."""
    cap = policy.permanent_cap if reason in PERMANENT else policy.transient_cap
    return not_before(now, retry_after, now, cap)


def not_before(at: datetime, retry_after: datetime | None, now: datetime, cap: timedelta) -> datetime:
    """``at``, or the server's Retry-After when that is later, but never past ``now + cap``:
    the one Retry-After rule, for sources and for notification deliveries."""
    return at if retry_after is None else max(at, min(retry_after, now + cap))


def exponential_delay(
    attempt: int, *, base: timedelta, cap: timedelta, jitter: float, u: float
) -> timedelta:
    """``min(cap, base * 2 ** (attempt - 1)) * (1 + jitter * (2u - 1))``: the one backoff
    formula, for sources here and for notification deliveries (pipeline/notify/delivery.py)."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # Past the cap more doublings change nothing; bounding them keeps the timedelta
    # arithmetic far from its limits after thousands of failures.
    doublings = min(attempt - 1, 30)
    delay: timedelta = min(cap, base * 2**doublings) * (1 + jitter * (2 * u - 1))
    return delay

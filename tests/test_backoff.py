"""The cadence and backoff formula of pipeline/core/backoff.py: pure, so checked exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.core.backoff import (
    BackoffPolicy,
    next_fetch_after_success,
    next_quota_reset,
    retry_after_failure,
)
from pipeline.core.errors import FetchError
from pipeline.core.failures import PERMANENT, FailureReason

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
MIDDLE = 0.5  # u = 0.5 means no jitter: 1 + 0.2 * (2 * 0.5 - 1) = 1


def minutes(retry, now=NOW) -> float:
    return round((retry.at - now).total_seconds() / 60, 6)


def test_success_schedules_one_interval_after_the_fetch_finished():
    assert next_fetch_after_success(NOW, 60) == NOW + timedelta(hours=1)


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 5), (2, 10), (3, 20), (4, 40), (5, 80), (9, 1280), (10, 1440), (50, 1440), (10_000, 1440)],
)
def test_transient_failures_double_from_5_minutes_up_to_a_day(failures, expected):
    retry = retry_after_failure(FailureReason.TIMEOUT, failures, now=NOW, u=MIDDLE)
    assert minutes(retry) == expected
    assert not retry.disable


@pytest.mark.parametrize(("failures", "expected_hours"), [(1, 1), (2, 2), (4, 8), (8, 128), (9, 168), (40, 168)])
def test_permanent_failures_double_from_an_hour_up_to_a_week(failures, expected_hours):
    retry = retry_after_failure(FailureReason.HTTP_4XX, failures, now=NOW, u=MIDDLE)
    assert minutes(retry) == expected_hours * 60


def test_jitter_spreads_retries_by_at_most_twenty_percent():
    low = retry_after_failure(FailureReason.HTTP_5XX, 3, now=NOW, u=0.0)
    high = retry_after_failure(FailureReason.HTTP_5XX, 3, now=NOW, u=0.999999)
    assert minutes(low) == 16.0  # 20 min - 20%
    assert 23.99 < minutes(high) < 24.0  # 20 min + 20%, exclusive


def test_retry_after_is_a_floor_not_a_ceiling():
    far = NOW + timedelta(hours=3)
    assert retry_after_failure(FailureReason.RATE_LIMITED, 1, now=NOW, u=MIDDLE, retry_after=far).at == far
    near = NOW + timedelta(minutes=1)
    retry = retry_after_failure(FailureReason.RATE_LIMITED, 1, now=NOW, u=MIDDLE, retry_after=near)
    assert minutes(retry) == 5


def test_youtube_quota_waits_for_midnight_in_los_angeles():
    # 12:00 UTC on 22 November is 04:00 PST; the quota resets at 08:00 UTC on the 23rd.
    reset = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    assert next_quota_reset(NOW) == reset
    retry = retry_after_failure(FailureReason.YOUTUBE_QUOTA, 1, now=NOW, u=0.0)
    assert retry.at == reset and not retry.disable
    spread = retry_after_failure(FailureReason.YOUTUBE_QUOTA, 7, now=NOW, u=0.5)
    assert spread.at == reset + timedelta(minutes=2.5)


def test_quota_reset_follows_daylight_saving_time():
    summer = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)  # PDT, UTC-7
    assert next_quota_reset(summer) == datetime(2026, 7, 2, 7, 0, tzinfo=UTC)


def test_permanent_failures_disable_the_source_after_the_configured_run():
    policy = BackoffPolicy(disable_after=3)
    decisions = [
        retry_after_failure(FailureReason.PARSE_ERROR, n, now=NOW, u=MIDDLE, policy=policy).disable
        for n in (1, 2, 3, 4)
    ]
    assert decisions == [False, False, True, True]
    transient = retry_after_failure(FailureReason.NETWORK_ERROR, 100, now=NOW, u=MIDDLE, policy=policy)
    assert not transient.disable, "transient failures never disable a source"


def test_every_failure_code_of_the_design_exists_once():
    """The design's codes, and ``blocked`` (a bot challenge instead of the page or feed,
    issue 38), transient: the site may let the next fetch through."""
    assert {r.value for r in FailureReason} == {
        "network_error", "timeout", "http_4xx", "http_5xx", "rate_limited", "youtube_quota",
        "parse_error", "too_large", "blocked_address", "invalid_config", "blocked",
    }
    assert PERMANENT == {
        FailureReason.HTTP_4XX, FailureReason.PARSE_ERROR, FailureReason.TOO_LARGE,
        FailureReason.BLOCKED_ADDRESS, FailureReason.INVALID_CONFIG,
    }
    error = FetchError(FailureReason.TOO_LARGE, "body passed 15 MiB")
    assert error.permanent and str(error) == "too_large: body passed 15 MiB"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"consecutive_failures": 0, "u": 0.5}, "counts this failure"), ({"consecutive_failures": 1, "u": 1.0}, "u must be")],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        retry_after_failure(FailureReason.TIMEOUT, now=NOW, **kwargs)


def test_policy_is_validated():
    with pytest.raises(ValueError, match="jitter"):
        BackoffPolicy(jitter=1.5)
    with pytest.raises(ValueError, match="disable_after"):
        BackoffPolicy(disable_after=0)

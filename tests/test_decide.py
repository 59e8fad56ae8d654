"""The fetched-source decision (pipeline/fetching/decide.py) is pure: tested here with no
database, no network and no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline.core.backoff import BackoffPolicy
from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.fetching.base import Outcome
from pipeline.fetching.decide import SourceDecision, after_failure, after_success

FINISHED = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def source(**overrides: Any) -> dict[str, Any]:
    row = {
        "id": 7, "url": "https://feeds.example.org/a.xml", "source_type": "rss",
        "politeness_group": "feeds.example.org", "fetch_interval_minutes": 30,
        "consecutive_failures": 2, "config": {"keep": 1},
    }
    return {**row, **overrides}


def test_a_success_schedules_one_interval_later_and_keeps_the_validators() -> None:
    decision = after_success(source(), Outcome(etag='"v2"', last_modified="Tue"), finished=FINISHED, group_by="host")
    assert decision.values() == {
        "next_fetch_at": FINISHED + timedelta(minutes=30), "attempts": 0, "last_fetched_at": FINISHED,
        "consecutive_failures": 0, "last_failure_reason": None, "last_success_at": FINISHED,
        "etag": '"v2"', "last_modified": "Tue",
    }


def test_a_permanent_redirect_moves_the_url_and_the_host_group_with_it() -> None:
    outcome = Outcome(moved_to="https://new.example.net/a.xml")
    decision = after_success(source(), outcome, finished=FINISHED, group_by="host")
    assert (decision.new_url, decision.new_group) == ("https://new.example.net/a.xml", "new.example.net")
    assert decision.values()["url"] == "https://new.example.net/a.xml"


def test_a_named_group_stays_when_the_source_moves() -> None:
    outcome = Outcome(moved_to="https://new.example.net/a.xml")
    decision = after_success(source(politeness_group="substack"), outcome, finished=FINISHED, group_by="host")
    assert decision.new_url == "https://new.example.net/a.xml" and decision.new_group is None
    assert "politeness_group" not in decision.values()


def test_a_redirect_to_another_sources_url_is_not_followed() -> None:
    outcome = Outcome(moved_to="https://new.example.net/a.xml")
    decision = after_success(source(), outcome, finished=FINISHED, group_by="host", moved_url_taken=True)
    assert decision.new_url is None and "url" not in decision.values()


def test_config_updates_merge_into_the_sources_config() -> None:
    outcome = Outcome(config_updates={"channel_id": "UC123"})
    decision = after_success(source(), outcome, finished=FINISHED, group_by="host")
    assert decision.values()["config"] == {"keep": 1, "channel_id": "UC123"}


def test_a_failure_backs_off_by_its_code_and_streak() -> None:
    error = FetchError(FailureReason.HTTP_5XX, "503")
    decision = after_failure(source(), error, finished=FINISHED, u=0.5, policy=BackoffPolicy())
    values = decision.values()
    assert values["consecutive_failures"] == 3 and values["last_failure_reason"] == "http_5xx"
    assert values["next_fetch_at"] > FINISHED and "etag" not in values and "last_success_at" not in values
    assert "enabled" not in values


def test_a_retry_after_is_a_floor_within_the_cap() -> None:
    error = FetchError(FailureReason.RATE_LIMITED, "429", retry_after=FINISHED + timedelta(hours=2))
    decision = after_failure(source(consecutive_failures=0), error, finished=FINISHED, u=0.0, policy=BackoffPolicy())
    assert decision.next_fetch_at == FINISHED + timedelta(hours=2)


def test_permanent_failures_disable_the_source_at_the_policys_limit() -> None:
    policy = BackoffPolicy()
    error = FetchError(FailureReason.HTTP_4XX, "410 Gone")
    before = after_failure(source(consecutive_failures=policy.disable_after - 2), error,
                           finished=FINISHED, u=0.5, policy=policy)
    at = after_failure(source(consecutive_failures=policy.disable_after - 1), error,
                       finished=FINISHED, u=0.5, policy=policy)
    assert before.disabled_reason is None
    assert at.values()["enabled"] is False
    assert at.values()["disabled_reason"] == f"http_4xx {policy.disable_after} times in a row; last: 410 Gone"


def test_the_decision_is_frozen() -> None:
    decision = after_success(source(), Outcome(), finished=FINISHED, group_by="host")
    with pytest.raises(AttributeError):
        decision.next_fetch_at = FINISHED  # type: ignore[misc]
    assert isinstance(decision, SourceDecision)

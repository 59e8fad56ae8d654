"""When a user hears (pipeline/notify/schedule.py), with a clock the tests set: digests
on the user's clock, quiet hours across midnight, time zones and their changes, DST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.errors import UserError
from pipeline.notify.schedule import DeliveryPlan

BERLIN, NEW_YORK = ZoneInfo("Europe/Berlin"), ZoneInfo("America/New_York")


def local(tz, *args: int) -> datetime:
    return datetime(*args, tzinfo=tz)


def test_immediate_without_quiet_hours_sends_at_once():
    assert DeliveryPlan.parse(None, None, None).release_at(datetime(2026, 11, 25, 3, tzinfo=UTC)) is None
    plan = DeliveryPlan.parse("immediate", "off", "UTC")
    assert (plan.every, plan.daily_at, plan.quiet) == (None, None, None)


@pytest.mark.parametrize(
    ("at", "released"),
    [
        ((2026, 11, 25, 21, 59), None),  # before the quiet hours: at once
        ((2026, 11, 25, 22, 0), (2026, 11, 26, 7, 0)),  # the start is quiet
        ((2026, 11, 25, 23, 30), (2026, 11, 26, 7, 0)),  # the evening part ends tomorrow
        ((2026, 11, 26, 0, 0), (2026, 11, 26, 7, 0)),  # midnight itself
        ((2026, 11, 26, 3, 0), (2026, 11, 26, 7, 0)),  # the morning part ends today
        ((2026, 11, 26, 6, 59), (2026, 11, 26, 7, 0)),
        ((2026, 11, 26, 7, 0), None),  # the end is not quiet
    ],
)
def test_quiet_hours_that_span_midnight_hold_until_they_end(at, released):
    plan = DeliveryPlan.parse("immediate", "22:00-07:00", "Europe/Berlin")
    got = plan.release_at(local(BERLIN, *at))
    assert got == (None if released is None else local(BERLIN, *released))


def test_quiet_hours_within_a_day():
    plan = DeliveryPlan.parse(None, "12:00-13:30", "UTC")
    assert plan.release_at(datetime(2026, 1, 1, 12, 45, tzinfo=UTC)) == datetime(2026, 1, 1, 13, 30, tzinfo=UTC)
    assert plan.release_at(datetime(2026, 1, 1, 11, 0, tzinfo=UTC)) is None


def test_a_digest_every_two_hours_goes_out_on_the_users_clock():
    plan = DeliveryPlan.parse("2h", None, "Europe/Berlin")
    assert plan.release_at(local(BERLIN, 2026, 11, 25, 9, 15)) == local(BERLIN, 2026, 11, 25, 10, 0)
    assert plan.release_at(local(BERLIN, 2026, 11, 25, 10, 0)) == local(BERLIN, 2026, 11, 25, 12, 0)
    assert plan.release_at(local(BERLIN, 2026, 11, 25, 23, 1)) == local(BERLIN, 2026, 11, 26, 0, 0)


def test_a_daily_digest_at_a_time_moves_to_the_end_of_quiet_hours():
    plan = DeliveryPlan.parse("daily@06:30", "22:00-07:00", "America/New_York")
    # 06:30 is quiet: the digest waits for 07:00.
    assert plan.release_at(local(NEW_YORK, 2026, 11, 25, 12, 0)) == local(NEW_YORK, 2026, 11, 26, 7, 0)
    assert DeliveryPlan.parse("daily", None, None).release_at(datetime(2026, 11, 25, 9, tzinfo=UTC)) == \
        datetime(2026, 11, 26, 8, tzinfo=UTC)  # daily is 08:00


def test_a_change_of_time_zone_moves_the_release():
    """The same moment and settings, in the old zone and the new one (``users set --tz``
    re-times what waits by the new plan: tests/test_notifier.py)."""
    now = datetime(2026, 11, 25, 20, 0, tzinfo=UTC)  # 21:00 in Berlin, 15:00 in New York
    berlin = DeliveryPlan.parse("daily@22:00", None, "Europe/Berlin").release_at(now)
    new_york = DeliveryPlan.parse("daily@22:00", None, "America/New_York").release_at(now)
    assert berlin == datetime(2026, 11, 25, 21, 0, tzinfo=UTC)
    assert new_york == datetime(2026, 11, 26, 3, 0, tzinfo=UTC)


def test_daylight_saving_changes():
    # Spring forward in Berlin, 2026-03-29: 02:00-03:00 does not exist; 02:30 is 03:30.
    plan = DeliveryPlan.parse("daily@02:30", None, "Europe/Berlin")
    assert plan.release_at(datetime(2026, 3, 28, 23, 0, tzinfo=UTC)) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    hourly = DeliveryPlan.parse("1h", None, "Europe/Berlin")
    moments, now = [], datetime(2026, 3, 28, 22, 30, tzinfo=UTC)
    for _ in range(6):
        now = hourly.release_at(now)
        moments.append(now)
    assert moments == sorted(set(moments)), "each digest after the one before, none twice"
    # Fall back, 2026-10-25: 02:00-03:00 comes twice; a daily 02:30 is the first.
    assert plan.release_at(datetime(2026, 10, 24, 23, 0, tzinfo=UTC)) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


# (zone, the local day the clock falls back, a wall time it reads twice, one in the hour
# it springs forward over) for zones that shift by an hour at 03:00, at 02:00, by half an
# hour (Lord Howe), and at midnight (Havana springs from 00:00 to 01:00).
FALL_BACK = [
    ("Europe/Berlin", "2026-10-25", "02:30"),
    ("America/New_York", "2026-11-01", "01:30"),
    ("Australia/Lord_Howe", "2026-04-05", "01:45"),
    ("America/Havana", "2026-11-01", "00:30"),
]
SPRING_FORWARD = [
    ("Europe/Berlin", "2026-03-29", "02:30"),
    ("America/New_York", "2026-03-08", "02:30"),
    ("Australia/Lord_Howe", "2026-10-04", "02:15"),
    ("America/Havana", "2026-03-08", "00:30"),
]


def _local(zone: str, day: str, clock: str, fold: int = 0) -> datetime:
    return datetime.fromisoformat(f"{day}T{clock}").replace(tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


@pytest.mark.parametrize(("zone", "day", "end"), FALL_BACK)
def test_quiet_hours_on_a_fall_back_night_end_at_their_wall_clock_end(zone, day, end):
    """The reproduction: 22:00-02:30 in Berlin; at 02:10 after the clocks went back (the
    first 02:30 already past) a message was released at once, inside the quiet hours."""
    plan = DeliveryPlan.parse(None, f"21:00-{end}", zone)
    ending = datetime.fromisoformat(f"{day}T{end}")
    second_time = _local(zone, day, (ending - timedelta(minutes=10)).strftime("%H:%M"), fold=1)
    assert plan.release_at(second_time) == _local(zone, day, end, fold=1) > second_time
    first_time = _local(zone, day, (ending - timedelta(minutes=10)).strftime("%H:%M"), fold=0)
    assert plan.release_at(first_time) == _local(zone, day, end, fold=0) > first_time
    assert plan.release_at(_local(zone, day, end, fold=0)) is None, "the first time it reads the end, they end"


@pytest.mark.parametrize(("zone", "day", "end"), SPRING_FORWARD)
def test_quiet_hours_ending_in_the_skipped_hour_end_when_the_clock_jumps(zone, day, end):
    plan = DeliveryPlan.parse(None, f"21:00-{end}", zone)
    tz = ZoneInfo(zone)
    night = datetime.fromisoformat(f"{day}T00:00").replace(tzinfo=tz).astimezone(UTC) - timedelta(hours=2)
    released = plan.release_at(night)
    wall = datetime.fromisoformat(f"{day}T{end}")
    assert released.astimezone(tz).replace(tzinfo=None) >= wall, "never before the wall clock passes the end"
    just_before = (released - timedelta(microseconds=1)).astimezone(tz).replace(tzinfo=None)
    assert just_before < wall, "the first moment it does: the jump"
    assert released.astimezone(tz).replace(tzinfo=None) - wall < timedelta(hours=1)


@pytest.mark.parametrize("zone", ["localtime", "Factory", "posixrules", "../../etc/passwd", "/etc/localtime",
                                  "a" * 5000, "Europe/", "europe/berlin", "", "UTC\x00"])
def test_only_iana_zone_names_are_time_zones(zone):
    if not zone:
        assert DeliveryPlan.parse(None, None, zone).tz is UTC
        return
    with pytest.raises(UserError, match="is not an IANA time zone name"):
        DeliveryPlan.parse(None, None, zone)


@pytest.mark.parametrize(
    ("digest", "quiet", "tz", "message"),
    [
        ("weekly", None, None, "digest 'weekly' is not one of"),
        ("0m", None, None, "out of range"),
        ("25h", None, None, "out of range"),
        ("daily@25:00", None, None, "digest time '25:00' is not a time of day"),
        (None, "22:00", None, "quiet hours '22:00' are not START-END"),
        (None, "22:00-22:00", None, "start and end at the same time"),
        (None, None, "Mars/Olympus", "time zone 'Mars/Olympus' is not an IANA time zone"),
    ],
)
def test_malformed_settings_are_named(digest, quiet, tz, message):
    with pytest.raises(UserError, match=message):
        DeliveryPlan.parse(digest, quiet, tz)


plans = st.builds(
    DeliveryPlan.parse,
    st.sampled_from([None, "15m", "45m", "2h", "5h", "daily", "daily@00:00", "daily@23:59"]),
    st.sampled_from([None, "22:00-07:00", "00:00-06:00", "12:00-12:01", "23:30-00:30"]),
    st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]),
)
moments = st.datetimes(datetime(2025, 1, 1), datetime(2028, 1, 1)).map(lambda d: d.replace(tzinfo=UTC))


@settings(max_examples=500, deadline=None)
@given(plans, moments)
def test_a_release_is_later_never_in_quiet_hours_and_within_two_days(plan, now):
    released = plan.release_at(now)
    if released is None:
        assert plan.every is None and plan.daily_at is None and plan.quiet_end(now) is None
        return
    assert now < released <= now + timedelta(days=2)
    assert plan.quiet_end(released) is None, "nothing goes out in quiet hours"

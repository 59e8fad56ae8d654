"""When a user hears about a match: at once, or in a digest, and never in quiet hours
(docs/runbook.md, Digests and quiet hours). Pure: the
clock is an argument.

A user's delivery plan is three settings, each written as the CLI takes it:

* ``digest``: ``immediate`` (one message per match, the default), ``30m`` / ``2h`` (a
  digest every N minutes or hours, on the user's clock from midnight: ``2h`` goes out at
  00:00, 02:00, ...), or ``daily@08:00`` (once a day at that time);
* ``quiet``: ``22:00-07:00`` (local, start included, end not; it may span midnight):
  nothing goes out then; what waits goes out as one digest when it ends;
* ``timezone``: an IANA name (``Europe/Berlin``); UTC when unset.

``release_at(now)`` answers for a match made at ``now``: ``None`` to send it now, one by
one; else the moment the digest it waits for goes out.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, available_timezones

from pipeline.core.errors import UserError

IMMEDIATE = "immediate"
_EVERY = re.compile(r"(\d{1,4})([mh])")
_DAILY = re.compile(r"daily(?:@(\d{1,2}:\d{2}))?")
_QUIET = re.compile(r"(\d{1,2}:\d{2})-(\d{1,2}:\d{2})")
DAILY_DEFAULT = time(8, 0)
MAX_EVERY = timedelta(days=1)
# A filter's own mode (`filters route --mode`): its matches at once, or in a digest,
# whatever its user's digest setting; quiet hours stay the user's. NULL: the user's.
INSTANT, DIGEST = "instant", "digest"
FILTER_MODES = (INSTANT, DIGEST)


def filter_digest(mode: str | None, user_digest: str | None) -> str | None:
    """The digest setting a filter's matches follow: its user's, none for an ``instant``
    filter, and for a ``digest`` one the user's digest, or daily when they have none."""
    if mode == INSTANT:
        return None
    if mode == DIGEST and (user_digest or IMMEDIATE).strip().lower() == IMMEDIATE:
        return "daily"
    return user_digest


def _clock(text: str, what: str) -> time:
    try:
        hours, minutes = (int(part) for part in text.split(":"))
        return time(hours, minutes)
    except ValueError:
        raise UserError(f"{what} {text!r} is not a time of day (HH:MM, 00:00 to 23:59)") from None


@functools.cache
def zone_names() -> frozenset[str]:
    """The IANA time zone names: those of the zone database, less the files in it that
    are not zones (``Factory``; ``localtime`` and ``posixrules``, the host's own)."""
    return frozenset(available_timezones()) - {"Factory", "localtime", "posixrules"}


def parse_timezone(name: str | None) -> tzinfo:
    if not name:
        return UTC
    if name not in zone_names():  # never a path: ZoneInfo would open whatever it names
        shown = name if len(name) <= 60 else f"{name[:57]}..."
        raise UserError(f"time zone {shown!r} is not an IANA time zone name (such as Europe/Berlin or UTC)")
    return ZoneInfo(name)


@dataclass(frozen=True)
class DeliveryPlan:
    tz: tzinfo = UTC
    every: timedelta | None = None  # a digest every so often, from local midnight
    daily_at: time | None = None  # a digest once a day at this local time
    quiet: tuple[time, time] | None = None  # [start, end), local

    @classmethod
    def parse(cls, digest: str | None, quiet: str | None, timezone: str | None) -> DeliveryPlan:
        """The plan the settings write; UserError naming the one that is malformed."""
        every = daily_at = None
        spec = (digest or IMMEDIATE).strip().lower()
        if (m := _EVERY.fullmatch(spec)) is not None:
            every = timedelta(minutes=int(m.group(1))) * (60 if m.group(2) == "h" else 1)
            if not timedelta(minutes=1) <= every <= MAX_EVERY:
                raise UserError(f"digest every {spec} is out of range (1m to 24h)")
        elif (m := _DAILY.fullmatch(spec)) is not None:
            daily_at = _clock(m.group(1), "digest time") if m.group(1) else DAILY_DEFAULT
        elif spec != IMMEDIATE:
            raise UserError(f"digest {digest!r} is not one of: immediate, 30m, 2h, daily, daily@08:00")
        window = None
        if quiet and quiet.strip().lower() not in ("", "off"):
            m = _QUIET.fullmatch(quiet.strip())
            if m is None:
                raise UserError(f"quiet hours {quiet!r} are not START-END, such as 22:00-07:00 (or off)")
            window = (_clock(m.group(1), "quiet hours start"), _clock(m.group(2), "quiet hours end"))
            if window[0] == window[1]:
                raise UserError(f"quiet hours {quiet!r} start and end at the same time")
        return cls(parse_timezone(timezone), every, daily_at, window)

    def release_at(self, now: datetime) -> datetime | None:
        """``None``: send a match made at ``now`` at once, on its own. Else when the
        digest it joins goes out: the next digest time after ``now``, moved to the end of
        quiet hours if it falls in them."""
        if self.every is None and self.daily_at is None:
            return self.quiet_end(now)
        at = self._next_digest(now)
        return self.quiet_end(at) or at

    def quiet_end(self, moment: datetime) -> datetime | None:
        """The end of the quiet hours ``moment`` falls in; None outside them."""
        if self.quiet is None:
            return None
        start, end = self.quiet
        local = moment.astimezone(self.tz)
        clock = local.time().replace(tzinfo=None)
        if start < end:
            inside, end_day = start <= clock < end, local.date()
        else:  # spans midnight: the evening part ends tomorrow, the morning part today
            inside = clock >= start or clock < end
            end_day = local.date() + timedelta(days=1) if clock >= start else local.date()
        return self._wall_clock_end(end_day, end, moment) if inside else None

    def _next_digest(self, now: datetime) -> datetime:
        local = now.astimezone(self.tz)
        if self.daily_at is not None:
            for day in (local.date() - timedelta(days=1), local.date(), local.date() + timedelta(days=1)):
                if (at := self._at(day, self.daily_at)) > now:
                    return at
        assert self.every is not None
        # Wall-clock steps from local midnight, so 2h is 00:00, 02:00, ... whatever the
        # offset (the step across a DST change is an hour longer or shorter): the first
        # step after now, starting a step early because of such a change.
        for day in (local.date() - timedelta(days=1), local.date(), local.date() + timedelta(days=1)):
            midnight = datetime.combine(day, time())
            wall = local.replace(tzinfo=None)
            k = max(0, int((wall - midnight) / self.every) - 1)
            while (step := midnight + k * self.every).date() == day:
                if (at := self._at(day, step.time())) > now:
                    return at
                k += 1
        raise AssertionError("unreachable: a digest falls within two days")  # pragma: no cover

    def _wall_clock_end(self, day: date, clock: time, moment: datetime) -> datetime:
        """The first moment after ``moment`` at which the wall clock on local ``day``
        reads ``clock`` or later: when the clock falls back and reads it twice, the
        second time if the first is past (at 02:10 after the fall-back, quiet hours to
        02:30 end at the 02:30 still to come); when it springs forward over it, the
        moment of the jump (quiet hours to 02:30 end when 02:00 becomes 03:00)."""
        wall = datetime.combine(day, clock)
        first = wall.replace(tzinfo=self.tz).astimezone(UTC)
        second = wall.replace(tzinfo=self.tz, fold=1).astimezone(UTC)
        if second < first:  # a gap: the wall clock skips ``clock``; find the jump
            before, after = second, first
            while after - before > timedelta(microseconds=1):
                middle = before + (after - before) / 2
                if middle.astimezone(self.tz).replace(tzinfo=None) >= wall:
                    after = middle
                else:
                    before = middle
            return after
        return first if first > moment else second

    def _at(self, day: date, clock: time) -> datetime:
        """``clock`` on local ``day`` as a UTC moment: a time a DST gap skips counts as
        that wall time after the jump (02:30 is 03:30), a time that comes twice counts the
        first time."""
        return datetime.combine(day, clock, tzinfo=self.tz).astimezone(UTC)

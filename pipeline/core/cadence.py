"""Adaptive cadence: how often to fetch a source that publishes at its own pace.

A source with adaptive cadence learns its interval from what each successful fetch
shows (docs/runbook.md, "Adaptive cadence", has the formula with a worked example):

1. **The publishing gap**: of the items the document carries, those published in the
   last ``WINDOW`` (7 days) are counted. When the document reaches back further than the
   window it covers all of it, and the gap is ``WINDOW / count``; when it holds only its
   newest items (a busy feed truncated to 20), the gap is ``(now - oldest) / (count - 1)``
   (exact for a regular pace when the newest is now, longer as silence follows it). No
   dated item in the window: nothing published lately, the target is the source's
   maximum. No dated item at all (a page, a feed without dates): a 304 (nothing new)
   doubles the target; a 200 keeps it.
2. **Gradually**: the new interval is halfway, in log terms, from the current one to
   the target (``sqrt(current x target)``), and never more than double or less than half
   of it: one burst or one quiet day moves it, it does not swing it.
3. **Bounds**: the source's minimum and maximum; the publisher's own ``refresh`` hint
   (RSS ``<ttl>``, ``sy:updatePeriod``/``sy:updateFrequency``, ``Cache-Control: max-age``,
   ``Expires``) is a floor, under the maximum; and never faster than the source's
   politeness group can serve all its sources (``group_floor``), whatever the maximum.
4. **Jitter**: the next fetch is the interval times a factor in [0.9, 1.1), so sources
   added together do not stay in step.

Pure: no clock, no database, no randomness (``u`` is given).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

WINDOW = timedelta(days=7)
STEP = 2.0  # the interval at most doubles or halves in one fetch
JITTER = 0.1  # the next fetch is the interval x [1 - JITTER, 1 + JITTER)
# Any source's interval (sources.fetch_interval_minutes' CHECK): a minute to a week.
MIN_INTERVAL_MINUTES, MAX_INTERVAL_MINUTES = 1, 10080
DEFAULT_INTERVAL_MINUTES = 60  # a source added with no interval of its own
# A source's priority: due sources are claimed highest first (SOURCES_DUE's order).
MIN_PRIORITY, MAX_PRIORITY = -100, 100


@dataclass(frozen=True)
class Bounds:
    """A source's limits, in minutes. ``hint``: the publisher's "not sooner than";
    ``group_floor``: its politeness group's spacing times the group's sources."""

    min_minutes: float
    max_minutes: float
    hint_minutes: float | None = None
    group_floor_minutes: float = 0.0


def publishing_gap(published: Iterable[datetime], now: datetime) -> float | None:
    """Minutes between publications lately (see the module's docstring); None when the
    document dates nothing."""
    dated = sorted(min(p, now) for p in published)  # a date in the future is "now"
    if not dated:
        return None
    recent = [p for p in dated if now - p < WINDOW]
    if not recent:
        return math.inf  # nothing in the window: the caller's maximum
    if dated[0] < now - WINDOW:  # the document reaches past the window: all of it is here
        return WINDOW.total_seconds() / 60 / len(recent)
    if len(recent) < 2:
        return None  # one item of a truncated document says nothing of a pace
    return (now - recent[0]).total_seconds() / 60 / (len(recent) - 1)


def next_interval(current: float, gap: float | None, bounds: Bounds, *, unchanged: bool) -> int:
    """The source's next interval in whole minutes (see the module's docstring)."""
    current = max(float(current), MIN_INTERVAL_MINUTES)
    if gap is None:
        target = current * STEP if unchanged else current
    else:
        target = max(min(gap, bounds.max_minutes), MIN_INTERVAL_MINUTES)
    stepped = min(max(math.sqrt(current * target), current / STEP), current * STEP)
    # Rounded toward the target, so whole minutes never stall a short interval.
    whole = math.ceil(stepped) if target > current else math.floor(stepped)
    low = max(bounds.min_minutes, bounds.hint_minutes or 0.0)
    whole = min(max(whole, math.ceil(low)), math.floor(bounds.max_minutes))
    whole = max(whole, math.ceil(bounds.group_floor_minutes), MIN_INTERVAL_MINUTES)
    return min(whole, MAX_INTERVAL_MINUTES)


def jittered(interval_minutes: float, u: float) -> timedelta:
    """The wait before the next fetch: the interval times [1 - JITTER, 1 + JITTER) by ``u``."""
    return timedelta(minutes=interval_minutes * (1 + JITTER * (2 * u - 1)))

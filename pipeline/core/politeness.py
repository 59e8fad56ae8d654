"""Politeness as policy, without a database: which group a source belongs to, a new
group's limits, and which due sources a claim may hand out given each group's room.

Every source belongs to a politeness group (``group_for``: its host by default, all
YouTube sources in one, or a name given when it is added). A group allows at most
``max_in_flight`` fetches at once across every worker, and starts them at least
``min_interval_ms`` apart; NULL limits take those of the group named ``DEFAULT``. The
groups' rows are administered in pipeline/storage/politeness_groups.py; the claim that
enforces the limits is pipeline/fetching/politeness.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.core.kinds import SourceType
from pipeline.core.urls import registrable_domain, url_host

# The group whose limits are every other group's defaults, and the group of a source
# given none.
DEFAULT = "*"  # seeded by the migrations with 2 fetches at once, 1 s apart
YOUTUBE_GROUP = "youtube"  # a named provider: every YouTube fetch goes to Google

GROUP_BY = ("host", "domain")  # the values of PIPELINE_POLITENESS_GROUP_BY


def group_for(url: str, source_type: str, named: str | None = None, *, by: str = "host") -> str:
    """The politeness group of a source: ``named`` when given, ``youtube`` for YouTube
    sources, else the URL's host (lower case, without port: one machine, one group), or
    with ``by="domain"`` its registrable domain (``a.blog.example.co.uk`` and
    ``b.blog.example.co.uk`` are both ``example.co.uk``, by the Public Suffix List)."""
    if by not in GROUP_BY:
        raise ValueError(f"politeness groups are by {' or '.join(GROUP_BY)}, not {by!r}")
    if named and named.strip():
        return named.strip().lower()
    if source_type == SourceType.YOUTUBE:
        return YOUTUBE_GROUP
    host = url_host(url)
    if by == "domain" and host:
        return registrable_domain(host)
    return host or DEFAULT


# A loopback host is the operator's own machine, with nobody to be polite to: its group
# starts with no spacing and this many fetches at once (the workers' threads bound them
# first). `pipeline politeness set` changes it like any other group.
LOOPBACK_MAX_IN_FLIGHT = 256


def initial_limits(name: str) -> dict[str, int | None]:
    """A new group's limits: NULL (the default group's), or a loopback host's own."""
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name == "localhost" or name.endswith(".localhost")
    if loopback:
        return {"max_in_flight": LOOPBACK_MAX_IN_FLIGHT, "min_interval_ms": 0}
    return {"max_in_flight": None, "min_interval_ms": None}


def spacing_allows_per_minute(min_interval_ms: int | None) -> float | None:
    """How many fetches a minute a group's spacing lets it start; None for a group
    without spacing (its fetches in flight bound it, by how long each takes)."""
    return 60_000 / min_interval_ms if min_interval_ms else None


def over_capacity(asks_per_minute: float, min_interval_ms: int | None) -> bool:
    """A group whose enabled sources ask for more fetches a minute (each its
    ``fetch_interval_minutes``) than its spacing lets it start: however many collectors
    run, a fixed-cadence source of it starts late by up to a round of the group (its
    sources times its spacing), and every due source of it waits in the claim's way
    (bench/RESULTS.md). Adaptive sources slow to the group's pace (the politeness floor,
    pipeline/core/cadence.py); more room (`pipeline politeness set`) or longer intervals
    mend it."""
    allows = spacing_allows_per_minute(min_interval_ms)
    return allows is not None and asks_per_minute > allows


Candidate = Mapping[str, Any]


def pick(
    candidates: Sequence[Candidate], groups: Sequence[Mapping[str, Any]], in_flight: Mapping[str, int],
    sort: Callable[[Sequence[Candidate]], Sequence[Candidate]], limit: int,
) -> list[Candidate]:
    """The candidates to lease (each with ``politeness_group`` and ``branch``: 0 for an
    expired lease, 1 for a free source): expired leases first, then the queue's order
    (``sort``); per open group (``groups``: name, max_in_flight, interval_ms; a group not
    there is closed) no more than its room over its fetches in flight, and one only when
    the group is spaced."""
    limits = {grp["name"]: grp for grp in groups}
    taken: dict[str, int] = {}
    picked: list[Candidate] = []
    expired = [row for row in candidates if row["branch"] == 0]
    free = [row for row in candidates if row["branch"] == 1]
    for row in [*sort(expired), *sort(free)]:
        grp = limits.get(row["politeness_group"])
        if grp is None:
            continue  # closed (spacing, deferral), or no row: not now
        n = taken.get(grp["name"], 0)
        room = grp["max_in_flight"] - in_flight.get(grp["name"], 0)
        if n >= room or (grp["interval_ms"] > 0 and n >= 1):
            continue
        taken[grp["name"]] = n + 1
        picked.append(row)
        if len(picked) == limit:
            break
    return picked

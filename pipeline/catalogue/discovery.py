"""``sources add --check``: fetch a new source once, before anything is stored, and say
what was found; a page given where a feed was meant is replaced by the feed it advertises.

The feed a page advertises is its ``<link rel="alternate" type="application/rss+xml" href=...>``.

Every request goes through the run's Fetcher (the SSRF guard, the caps, the deadline).
Nothing here writes to the database: the caller adds the spec it is given back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import urljoin

from bs4 import BeautifulSoup

from pipeline.catalogue.sources import SourceSpec, make_spec
from pipeline.core.errors import FetchError, SourceError
from pipeline.core.kinds import SourceType
from pipeline.core.politeness import group_for
from pipeline.fetching.jsonfeed import looks_like_json
from pipeline.fetching.registry import fetch_source
from pipeline.net.http import Fetcher

FEED_TYPES = (
    "application/rss+xml", "application/atom+xml", "application/feed+json", "application/json",
    "application/rdf+xml", "application/xml", "text/xml",
)


@dataclass(frozen=True)
class Checked:
    spec: SourceSpec  # the source to add (its URL the discovered feed's, if one was)
    items: int
    found_from: str | None = None  # the page the feed was found on


def advertised_feeds(body: bytes, page_url: str) -> list[str]:
    """The feeds an HTML page names in ``<link rel="alternate">``, absolute, in order,
    without repeats."""
    soup = BeautifulSoup(body, "html.parser")
    found: list[str] = []
    for link in soup.find_all("link", href=True):
        rel: object = link.get("rel") or []
        rels = {str(r).lower() for r in (rel if isinstance(rel, list) else str(rel).split())}
        kind = str(link.get("type") or "").split(";")[0].strip().lower()
        if "alternate" in rels and kind in FEED_TYPES:
            url = urljoin(page_url, str(link["href"]).strip())
            if url not in found:
                found.append(url)
    return found


def _is_html(body: bytes, content_type: str | None) -> bool:
    if looks_like_json(body):
        return False
    head = body[:512].lstrip().lower()
    return (content_type or "").split(";")[0].strip().lower() == "text/html" or head.startswith(
        (b"<!doctype html", b"<html")
    )


def check(spec: SourceSpec, fetcher: Fetcher, group_by: str) -> Checked:
    """Fetch ``spec`` once; a feed's page is swapped for its feed (``respec``, its
    options kept). SourceError, naming what was found, when it will not work."""
    found_from = None
    if spec.source_type == SourceType.RSS:
        try:
            page = fetcher.fetch(spec.url)
        except FetchError as exc:
            raise SourceError(f"{spec.url}: the check failed: {exc}") from None
        if _is_html(page.body, page.content_type):
            feeds = advertised_feeds(page.body, page.url)
            if not feeds:
                raise SourceError(
                    f"{spec.url} is an HTML page that names no feed: give the feed's URL, or"
                    " --type http with CSS selectors to read the page itself"
                )
            if len(feeds) > 1:
                raise SourceError(
                    f"{spec.url} names {len(feeds)} feeds; add the one you mean: " + ", ".join(feeds)
                )
            found_from, spec = spec.url, respec(spec, feeds[0], group_by)
    row = {**spec.row(), "id": None, "etag": None, "last_modified": None}
    try:
        outcome = fetch_source(row, fetcher)
    except FetchError as exc:
        raise SourceError(f"{spec.url}: the check failed: {exc}") from None
    if outcome.config_updates:  # a YouTube @handle resolved once: kept
        spec = dataclasses.replace(spec, config={**spec.config, **outcome.config_updates})
    return Checked(spec=spec, items=len(outcome.items), found_from=found_from)



def respec(spec: SourceSpec, url: str, group_by: str) -> SourceSpec:
    """``spec`` for another URL (the feed a page advertises), its options kept: a name
    or a politeness group that was given stays; one that came from the old URL follows."""
    named = spec.politeness_group != group_for(spec.url, spec.source_type, by=group_by)
    return make_spec(
        url, source_type=spec.source_type, name=None if spec.name == spec.url else spec.name,
        interval=spec.interval_minutes, category=spec.category, config=spec.config,
        politeness_group=spec.politeness_group if named else None, group_by=group_by,
        priority=spec.priority, adaptive=spec.adaptive, min_interval=spec.min_interval_minutes,
        max_interval=spec.max_interval_minutes,
    )


def check_all(specs: list[SourceSpec], fetcher: Fetcher, group_by: str, file: str) -> list[Checked]:
    """``check`` every entry of an import file; SourceError naming every entry that will
    not work (the file is then imported not at all, as for any bad entry)."""
    checked, problems = [], []
    for number, spec in enumerate(specs, 1):
        try:
            checked.append(check(spec, fetcher, group_by))
        except SourceError as exc:
            problems.append(f"entry {number}: {exc}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise SourceError(f"{file}: nothing imported: " + "; ".join(problems[:5]) + more)
    return checked

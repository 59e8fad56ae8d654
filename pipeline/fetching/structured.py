"""A page's structured data as a listing's fields (pipeline/core/fields.py): schema.org
JSON-LD and microdata and OpenGraph, read with ``extruct``.

* A page without an item selector (one listing: a product, a job, a flat) takes the
  fields of its first listing-like thing (``LISTING_TYPES``: not the site's Organization
  or its breadcrumbs), then OpenGraph's price.
* With an item selector, each item takes the microdata inside its own element, then the
  JSON-LD thing whose ``url`` is the item's link; what the source's own selectors pick
  comes first (pipeline/fetching/page.py).

Only what a page marks up is read: ``extruct`` runs when the page holds a JSON-LD
script, an ``itemscope`` or an OpenGraph property, and a page whose data it cannot
read has no fields, never a failed fetch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urljoin

from pipeline.core.fields import (
    Fields,
    from_open_graph,
    from_schema_org,
    location,
    place_text,
    things,
    types,
)
from pipeline.core.urls import web_urls

log = logging.getLogger(__name__)

LISTING_TYPES = frozenset({
    "JobPosting", "Product", "IndividualProduct", "ProductModel", "SomeProducts", "Offer", "AggregateOffer",
    "Vehicle", "Car", "Accommodation", "Apartment", "House", "SingleFamilyResidence", "Residence", "Room",
    "Suite", "RealEstateListing", "Event", "Book",
})
_MARKERS = {"json-ld": b"application/ld+json", "microdata": b"itemscope", "opengraph": b'property="og:'}
_PRODUCT_OG = b'property="product:'


def syntaxes(body: bytes) -> list[str]:
    """The kinds of structured data ``body`` may hold (a cheap look at its bytes)."""
    found = [name for name, marker in _MARKERS.items() if marker in body]
    if "opengraph" not in found and _PRODUCT_OG in body:
        found.append("opengraph")
    return found


def extract(html: str | bytes, url: str, kinds: Iterable[str], scripts: Iterable[str | None] = ()) -> dict[str, list[Any]]:
    """The page's JSON-LD (``scripts``: the text of each of its JSON-LD scripts) and
    ``extruct``'s microdata and OpenGraph of ``kinds`` (uniform: microdata in JSON-LD's
    shape). Each script and each kind on its own: one that cannot be read has no data,
    and takes none of the others' with it (extruct drops all of a kind for one bad script)."""
    data: dict[str, list[Any]] = {"json-ld": []}
    for script in scripts:
        try:
            found = json.loads(script or "", strict=False)
        except RecursionError:  # nested past the interpreter's stack: no data, never a failed fetch
            log.debug("a JSON-LD script of %s is nested too deep to read", url)
            continue
        except ValueError:
            found = _lenient_json_ld(script or "", url)
        data["json-ld"].extend(found if isinstance(found, list) else [found])
    kinds = [kind for kind in kinds if kind != "json-ld"]
    if kinds:
        import extruct  # 0.5 s of imports: only where a page holds structured data

        for kind in kinds:
            try:
                data.update(extruct.extract(html, base_url=url, syntaxes=[kind], uniform=True))
            except Exception as exc:  # a page's broken data is no failed fetch: it has no fields
                log.debug("the %s of %s is unreadable: %s", kind, url, exc)
    # What reads the data walks it recursively: a thing nested deeper than any page's
    # real data is dropped, so no hostile page can make that walk run out of stack.
    return {kind: [thing for thing in found if _nested_at_most(thing, MAX_DEPTH)] for kind, found in data.items()}


MAX_DEPTH = 64  # levels of objects and lists in one thing of a page's structured data


def _nested_at_most(value: Any, limit: int) -> bool:
    """Whether ``value``'s lists and objects nest at most ``limit`` levels (an iterative
    walk: it takes no stack, however deep the value)."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return False
        pending.extend((child, depth + 1) for child in children)
    return True


def _lenient_json_ld(script: str, url: str) -> list[Any]:
    """A script that is not strict JSON, read as extruct reads JSON-LD (comments and
    trailing commas, which shops' templates leave, are forgiven); [] when it cannot be."""
    from extruct.jsonld import JsonLdExtractor

    try:
        # The text of one script element: it holds no "</script>", so it is put back whole.
        return list(JsonLdExtractor().extract(f'<script type="application/ld+json">{script}</script>'))
    except Exception as exc:
        log.debug("a JSON-LD script of %s is unreadable: %s", url, exc)
        return []


def _every_thing(data: Mapping[str, list[Any]]) -> list[Mapping[str, Any]]:
    """Every thing of extracted JSON-LD and microdata, in page order."""
    return [*things(data.get("json-ld", [])), *things(data.get("microdata", []))]


def _listing_like(thing: Mapping[str, Any]) -> bool:
    return bool(types(thing) & LISTING_TYPES) or any(name.endswith("Event") for name in types(thing))


def listing_things(data: Mapping[str, list[Any]]) -> list[Mapping[str, Any]]:
    """The listing-like things of extracted JSON-LD and microdata, in page order."""
    return [t for t in _every_thing(data) if _listing_like(t)]


def page_fields(data: Mapping[str, list[Any]]) -> Fields:
    """A one-listing page's fields: its first listing-like thing's, then the next's where
    that one says nothing, then OpenGraph's price; with no location yet, the address of a
    place it marks up as such (a ``Place``: an event's venue written beside its offer;
    never an organisation's address, which is the site's)."""
    found = Fields()
    every = _every_thing(data)
    for thing in filter(_listing_like, every):
        found = found.merged(from_schema_org(thing))
    if found.location is None:
        for place in (t for t in every if types(t) & {"Place", "EventVenue"}):
            found = found.merged(location(place_text(place)))
    for properties in data.get("opengraph", []):
        if isinstance(properties, Mapping):
            found = found.merged(from_open_graph(properties))
    return found


def by_link(data: Mapping[str, list[Any]], page_url: str) -> dict[str, Fields]:
    """The fields of each listing-like thing that names its URL (relative to the page's),
    by that URL's canonical spelling (pipeline/core/urls.py), for the item linking to it."""
    found: dict[str, Fields] = {}
    for thing in listing_things(data):
        for url in _urls(thing.get("url")):
            canonical = web_urls(urljoin(page_url, url))
            if canonical is not None and canonical[1] not in found:
                found[canonical[1]] = from_schema_org(thing)
    return found


def _urls(value: object) -> Iterable[str]:
    for v in value if isinstance(value, list) else [value]:
        if isinstance(v, str):
            yield v
        elif isinstance(v, Mapping) and isinstance(v.get("@id"), str):
            yield v["@id"]

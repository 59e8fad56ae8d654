"""The ``http`` adapter: an HTML page, read with Beautiful Soup.

With CSS selectors in the source's config (``item``, and optionally ``title``, ``link``,
``summary`` and ``price`` relative to each item), one item per element matching
``item``; a ``price`` is the text of its element, and a change of it is a change of the
item (change alerts, pipeline/storage/watches.py). Without
them, the page is a change detector: one item per distinct page text, identified by
the hash of that text, so a change to the page yields a new item and an unchanged page
yields nothing new.

A listing's fields (price, salary, area, rooms, location, company: pipeline/core/fields.py)
come from the selectors ``rooms``, ``area``, ``salary``, ``location`` and ``company``
inside an item, and from the page's structured data (schema.org JSON-LD and microdata,
OpenGraph: pipeline/fetching/structured.py), in that order.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import soupsieve
from bs4 import BeautifulSoup, Tag
from bs4.element import CData, NavigableString, PageElement
from soupsieve import SelectorSyntaxError

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.core.fields import Fields, from_selected
from pipeline.core.urls import web_urls
from pipeline.fetching import structured
from pipeline.fetching.base import Item, Outcome, challenge, fetch_and_parse, markup
from pipeline.net.http import Fetcher

SUMMARY_CHARS = 2000
# A parsed element costs Beautiful Soup about a kilobyte and tens of microseconds, so the
# byte cap alone does not bound a page: 6 MB of tiny elements took 816 MiB and 19 s. No
# page worth watching has more elements than this; one that does is refused unparsed.
MAX_ELEMENTS = 50_000
# Nor more than this deep (real pages nest 20 to 60): the CSS matcher reads each item's
# ancestors, so a page of thousands of nested items (unclosed tags) cost minutes of a
# pass; at this depth the page's every item costs its ancestors' count at most.
MAX_DEPTH = 256
_START_TAG = re.compile(rb"<[a-zA-Z]")
SELECTOR_KEYS = ("item", "title", "link", "summary", "price")
# Selectors of a listing's fields, inside an item, read from their element's text
# (pipeline/core/fields.py ``from_selected``): "3 rooms", "75 m²", "€60,000 a year".
FIELD_KEYS = ("rooms", "area", "salary", "location", "company")
_NOT_TEXT = ("script", "style", "noscript", "template", "head")


def _text(node: Tag) -> str:
    return " ".join(node.get_text(" ").split())


def _nested_deeper(soup: Tag, limit: int) -> bool:
    """Whether any element of ``soup`` lies more than ``limit`` elements deep (one
    iterative walk)."""
    pending = [(soup, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in node.children if isinstance(child, Tag))
    return False


def _holding_items(soup: Tag, chosen: set[int]) -> set[int]:
    """The ids of the item elements (``chosen``, by id) that hold others of them (item
    elements nested, as unclosed tags on a sloppy page, or a hostile one, leave them):
    one walk of the page."""
    holding: set[int] = set()
    pending: list[tuple[Tag, Tag | None]] = [(soup, None)]  # (node, the nearest item above it)
    while pending:
        node, above = pending.pop()
        if id(node) in chosen:
            if above is not None:
                holding.add(id(above))
            above = node
        pending.extend((child, above) for child in node.children if isinstance(child, Tag))
    return holding


def own_text(element: Tag, chosen: set[int]) -> str:
    """``element``'s text without that of the item elements (``chosen``, by id) nested in
    it: each item reads its own text once, however deep they nest (reading each one's
    whole subtree took a pass minutes on a page of 8,000 nested items), and an item's
    text is not its followers'."""
    parts: list[str] = []
    pending: list[PageElement] = [element]
    while pending:
        node = pending.pop()
        if isinstance(node, Tag):
            if node is element or id(node) not in chosen:
                pending.extend(reversed(node.contents))
        elif type(node) in (NavigableString, CData):  # what get_text reads
            parts.append(str(node))
    return " ".join(" ".join(parts).split())


def _select_one(node: Tag, selector: str | None) -> Tag | None:
    return node.select_one(selector) if selector else None


def _count_elements(body: bytes, limit: int) -> int:
    """Start tags in ``body``, counted up to ``limit + 1``."""
    count = 0
    for _ in _START_TAG.finditer(body):
        count += 1
        if count > limit:
            break
    return count


def parse_page(body: bytes, url: str, config: Mapping[str, Any]) -> list[Item]:
    if _count_elements(body, MAX_ELEMENTS) > MAX_ELEMENTS:
        raise FetchError(
            FailureReason.TOO_LARGE,
            f"the page has more than {MAX_ELEMENTS:,} elements; larger pages are not parsed",
        )
    soup = BeautifulSoup(body, "html.parser")
    if _nested_deeper(soup, MAX_DEPTH):
        raise FetchError(
            FailureReason.TOO_LARGE,
            f"the page nests elements more than {MAX_DEPTH} deep; deeper pages are not parsed",
        )
    title = _text(soup.title) if soup.title else ""
    if found := challenge(title, body):
        raise FetchError(FailureReason.BLOCKED, f"the site answered with a bot challenge ({found}), not the page")
    kinds = structured.syntaxes(body)
    selector = config.get("item")
    # The page's JSON-LD and OpenGraph, read before the scripts go; an item's microdata
    # is read from its own element.
    data = structured.extract(body, url, [k for k in kinds if k != "microdata" or not selector],
                              [tag.string for tag in soup.find_all("script", type="application/ld+json")])
    for tag in soup(_NOT_TEXT):
        tag.decompose()
    if not selector:
        text = _text(soup.body or soup)
        if not text:
            raise FetchError(FailureReason.PARSE_ERROR, "the page has no text")
        digest = hashlib.sha256(text.encode()).hexdigest()
        raw: dict[str, Any] = {"title": markup(title or url), "url": url, "summary": markup(text[:SUMMARY_CHARS]),
               "published_at": None, "author": None, "categories": []}
        _add_fields(raw, structured.page_fields(data))
        return [Item(source_item_id=f"sha256:{digest}", url=url, raw=raw)]
    linked = structured.by_link(data, url)
    try:
        elements = soup.select(selector)
        chosen = {id(element) for element in elements}
        holding = _holding_items(soup, chosen)
        items = [_selected_item(element, url, config, linked, "microdata" in kinds,
                                own_text(element, chosen) if id(element) in holding else None)
                 for element in elements]
    except SelectorSyntaxError as exc:
        raise FetchError(FailureReason.INVALID_CONFIG, f"bad CSS selector: {exc}".splitlines()[0]) from None
    if not items:
        # Most often the page's layout changed under the selector: say so, loudly.
        raise FetchError(FailureReason.PARSE_ERROR, f"the item selector {selector!r} matched nothing")
    return items


def _add_fields(raw: dict[str, Any], found: Fields) -> None:
    """The item's fields, and its price as text when no selector gave one (so that a
    marked-up price's change is a change of the item, as a selected one's is)."""
    if not found:
        return
    raw["fields"] = found.as_json()
    if "price" not in raw and found.price is not None:
        raw["price"] = markup(" ".join(str(part) for part in (found.price, found.currency) if part))


def _item_fields(element: Tag, page_url: str, link: str, config: Mapping[str, Any],
                 linked: Mapping[str, Fields], microdata: bool) -> Fields:
    """What the source's field selectors pick in ``element``, then the microdata inside
    it, then the page's JSON-LD thing at the item's link."""
    selected = {key: _text(node) for key in FIELD_KEYS if (node := _select_one(element, config.get(key)))}
    found = from_selected(selected)
    if microdata and (element.has_attr("itemscope") or element.select_one("[itemscope]") is not None):
        found = found.merged(structured.page_fields(structured.extract(str(element), page_url, ["microdata"])))
    if link and (canonical := web_urls(link)) is not None and canonical[1] in linked:
        found = found.merged(linked[canonical[1]])
    return found


def _selected_item(element: Tag, page_url: str, config: Mapping[str, Any],
                   linked: Mapping[str, Fields] | None = None, microdata: bool = False,
                   text: str | None = None) -> Item:
    """The item of ``element``; ``text`` its own text when other items nest in it."""
    title_node = _select_one(element, config.get("title"))
    link_node = _select_one(element, config.get("link")) or (
        element if element.name == "a" else element.find("a", href=True)
    )
    summary_node = _select_one(element, config.get("summary"))
    price_node = _select_one(element, config.get("price"))
    href = link_node.get("href") if isinstance(link_node, Tag) else None
    link = urljoin(page_url, str(href)) if href else ""
    if text is None:
        text = _text(element)
    raw: dict[str, Any] = {
        "title": markup(_text(title_node) if title_node else text[:200]),
        "url": link or page_url,
        "summary": markup((_text(summary_node) if summary_node else text)[:SUMMARY_CHARS]),
        "published_at": None,
        "author": None,
        "categories": [],
    }
    price = _text(price_node)[:SUMMARY_CHARS] if price_node is not None else ""
    if price_node is not None:
        raw["price"] = markup(price)  # the normaliser bounds it further
    # Without a link, the item is its text, less its price: a new price is a change of
    # the item, not another item.
    own_text = text.replace(price, "", 1) if price else text
    identity = link or f"sha256:{hashlib.sha256(own_text.encode()).hexdigest()}"
    _add_fields(raw, _item_fields(element, page_url, link, config, linked or {}, microdata))
    return Item(source_item_id=identity, url=link or page_url, raw=raw)


class PageAdapter:
    def check_config(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - {*SELECTOR_KEYS, *FIELD_KEYS, "category"}
        if unknown:
            raise ValueError(f"unknown http config keys {sorted(unknown)}: use {[*SELECTOR_KEYS, *FIELD_KEYS]}")
        for key in (*SELECTOR_KEYS, *FIELD_KEYS):
            if key not in config:
                continue
            if not isinstance(config[key], str) or not config[key].strip():
                raise ValueError(f"http config {key!r} must be a CSS selector (a non-empty string)")
            try:
                soupsieve.compile(config[key])
            except SelectorSyntaxError as exc:
                raise ValueError(f"http config {key!r}: bad CSS selector: {exc}".splitlines()[0]) from None
        if any(key in config for key in (*SELECTOR_KEYS[1:], *FIELD_KEYS)) and "item" not in config:
            raise ValueError(f"http config: {', '.join((*SELECTOR_KEYS[1:], *FIELD_KEYS))} select inside an"
                             " 'item'; set 'item' too")

    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        config = source.get("config") or {}  # checked by registry.fetch_source
        return fetch_and_parse(source, fetcher, lambda result: parse_page(result.body, result.url, config))

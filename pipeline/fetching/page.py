"""The ``http`` adapter: an HTML page, read with Beautiful Soup.

With CSS selectors in the source's config (``item``, and optionally ``title``, ``link``,
``summary`` and ``price`` relative to each item), one item per element matching
``item``; a ``price`` is the text of its element, and a change of it is a change of the
item (change alerts, pipeline/storage/watches.py). Without
them, the page is a change detector: one item per distinct page text, identified by
the hash of that text, so a change to the page yields a new item and an unchanged page
yields nothing new.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

import soupsieve
from bs4 import BeautifulSoup, Tag
from soupsieve import SelectorSyntaxError

from pipeline.core.errors import FetchError
from pipeline.core.failures import FailureReason
from pipeline.fetching.base import Item, Outcome, challenge, fetch_and_parse, markup
from pipeline.net.http import Fetcher

SUMMARY_CHARS = 2000
# A parsed element costs Beautiful Soup about a kilobyte and tens of microseconds, so the
# byte cap alone does not bound a page: 6 MB of tiny elements took 816 MiB and 19 s. No
# page worth watching has more elements than this; one that does is refused unparsed.
MAX_ELEMENTS = 50_000
_START_TAG = re.compile(rb"<[a-zA-Z]")
SELECTOR_KEYS = ("item", "title", "link", "summary", "price")
_NOT_TEXT = ("script", "style", "noscript", "template", "head")


def _text(node: Tag) -> str:
    return " ".join(node.get_text(" ").split())


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
    title = _text(soup.title) if soup.title else ""
    if found := challenge(title, body):
        raise FetchError(FailureReason.BLOCKED, f"the site answered with a bot challenge ({found}), not the page")
    for tag in soup(_NOT_TEXT):
        tag.decompose()
    selector = config.get("item")
    if not selector:
        text = _text(soup.body or soup)
        if not text:
            raise FetchError(FailureReason.PARSE_ERROR, "the page has no text")
        digest = hashlib.sha256(text.encode()).hexdigest()
        raw: dict[str, Any] = {"title": markup(title or url), "url": url, "summary": markup(text[:SUMMARY_CHARS]),
               "published_at": None, "author": None, "categories": []}
        return [Item(source_item_id=f"sha256:{digest}", url=url, raw=raw)]
    try:
        elements = soup.select(selector)
        items = [_selected_item(element, url, config) for element in elements]
    except SelectorSyntaxError as exc:
        raise FetchError(FailureReason.INVALID_CONFIG, f"bad CSS selector: {exc}".splitlines()[0]) from None
    if not items:
        # Most often the page's layout changed under the selector: say so, loudly.
        raise FetchError(FailureReason.PARSE_ERROR, f"the item selector {selector!r} matched nothing")
    return items


def _selected_item(element: Tag, page_url: str, config: Mapping[str, Any]) -> Item:
    title_node = _select_one(element, config.get("title"))
    link_node = _select_one(element, config.get("link")) or (
        element if element.name == "a" else element.find("a", href=True)
    )
    summary_node = _select_one(element, config.get("summary"))
    price_node = _select_one(element, config.get("price"))
    href = link_node.get("href") if isinstance(link_node, Tag) else None
    link = urljoin(page_url, str(href)) if href else ""
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
    return Item(source_item_id=identity, url=link or page_url, raw=raw)


class PageAdapter:
    def check_config(self, config: Mapping[str, Any]) -> None:
        unknown = set(config) - {*SELECTOR_KEYS, "category"}
        if unknown:
            raise ValueError(f"unknown http config keys {sorted(unknown)}: use {list(SELECTOR_KEYS)}")
        for key in SELECTOR_KEYS:
            if key not in config:
                continue
            if not isinstance(config[key], str) or not config[key].strip():
                raise ValueError(f"http config {key!r} must be a CSS selector (a non-empty string)")
            try:
                soupsieve.compile(config[key])
            except SelectorSyntaxError as exc:
                raise ValueError(f"http config {key!r}: bad CSS selector: {exc}".splitlines()[0]) from None
        if any(key in config for key in SELECTOR_KEYS[1:]) and "item" not in config:
            raise ValueError("http config: title, link, summary and price select inside an 'item'; set 'item' too")

    def fetch(self, source: Mapping[str, Any], fetcher: Fetcher) -> Outcome:
        config = source.get("config") or {}
        if not isinstance(config, Mapping):
            raise FetchError(FailureReason.INVALID_CONFIG, "config must be a JSON object")
        return fetch_and_parse(source, fetcher, lambda result: parse_page(result.body, result.url, config))

"""Which filters match a listing (DESIGN.md "Filters and delivery"), set-based.

A filter matches a listing when every keyword appears, case-insensitively, as a whole
word in its title or summary (plain text already: pipeline/listings/normalize.py), its source
restriction names the listing's source, and its category restriction is one of the
listing's categories. By default a filter applies only to listings that arrived after
it (``ingested_at >= created_at``): a new filter does not flood its user with history.

Set-based: ``FilterIndex`` files every filter under one of its keywords, once, when the
filter joins the index, so a listing is compared only with the filters filed under one of
its own words, never with every filter; the time to match a batch does not grow with the
number of filters that cannot match it (bench/match_throughput.py). A filter is filed
under its rarest keyword by the document frequencies the index has learned from the
listings it matched (``WordRarity``); unknown words count as rarest, and a tie goes to the
longest word (longer words are rarer).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

# A word: letters and digits, joined by inner punctuation ("node.js", "e-mail"), with an
# optional tail of + or # ("c++", "c#"). A compound word also counts as each of its
# parts, as a whole-word search would find them: "node.js" contains "node" and "js".
WORD = re.compile(r"\w+(?:[.+#'-]+\w+)*[+#]*")
_PART = re.compile(r"\w+")
MAX_KEYWORDS = 20
MAX_KEYWORD_CHARS = 100


def words(text: str) -> set[str]:
    """The words of ``text``, case-folded; compound words also as their parts."""
    found = {word.casefold() for word in set(WORD.findall(text))}
    for word in [w for w in found if not w.isalnum()]:
        found.update(_PART.findall(word))
    return found


def parse_keywords(text: str) -> tuple[str, ...]:
    """Keywords separated by spaces or commas, case-folded; ValueError naming a bad one."""
    keywords: list[str] = []
    for piece in re.split(r"[\s,]+", text.strip()):
        if not piece:
            continue
        keyword = piece.casefold()
        if len(keyword) > MAX_KEYWORD_CHARS or not WORD.fullmatch(keyword):
            raise ValueError(
                f"keyword {piece!r} is not a word (letters and digits, optionally joined by"
                " . + # ' - as in node.js or c++)"
            )
        if keyword not in keywords:
            keywords.append(keyword)
    if not keywords:
        raise ValueError("a filter needs at least one keyword")
    if len(keywords) > MAX_KEYWORDS:
        raise ValueError(f"a filter takes at most {MAX_KEYWORDS} keywords, got {len(keywords)}")
    return tuple(keywords)


@dataclass(frozen=True)
class Filter:
    id: int
    user_id: int
    keywords: tuple[str, ...]
    source_id: int | None = None
    category: str | None = None  # case-folded
    created_at: datetime | None = None


@dataclass(frozen=True)
class ListingText:
    id: int
    source_id: int
    title: str
    summary: str
    categories: Sequence[str] = ()
    ingested_at: datetime | None = None


class Match(NamedTuple):
    """One (user, listing) pair to notify, and the filter that matched. A tuple, not a
    dataclass: a batch makes tens of thousands, and a frozen dataclass's constructor
    was most of the matcher's time (bench/RESULTS.md, matching)."""

    user_id: int
    listing_id: int
    filter_id: int


class WordRarity:
    """In how many listings each word was seen: the index's measure of rarity, learned
    from the batches it matched. Bounded: past ``max_words`` words, those seen once are
    forgotten (they are the long tail; a forgotten word counts as rare again)."""

    def __init__(self, max_words: int = 500_000) -> None:
        self.seen: Counter[str] = Counter()
        self.max_words = max_words

    def observe(self, listing_words: Iterable[set[str]]) -> None:
        seen = self.seen
        for text_words in listing_words:
            seen.update(text_words)
        if len(seen) > self.max_words:
            self.seen = Counter({word: n for word, n in seen.items() if n > 1})

    def rarest(self, keywords: Sequence[str]) -> str:
        seen = self.seen
        return min(keywords, key=lambda k: (seen[k], -len(k)))


class FilterIndex:
    """Filters filed by one keyword each: a listing meets only the filters filed under one
    of its own words. A filter can only match a listing that holds all its keywords, so
    filing it under any one of them loses nothing; filing it under a rare one means few
    listings ever look at it. Filing happens once per filter (``add``); matching a batch
    touches only the filters filed under the batch's words."""

    def __init__(self, filters: Iterable[Filter] = (), *, rarity: WordRarity | None = None) -> None:
        self.rarity = rarity if rarity is not None else WordRarity()
        self._by_word: dict[str, list[Filter]] = {}
        self._ids: set[int] = set()
        self.add(filters)

    @property
    def size(self) -> int:
        return len(self._ids)

    def add(self, filters: Iterable[Filter]) -> None:
        """File ``filters`` in the index; a filter already in it (by id) is skipped."""
        for f in filters:
            if f.id not in self._ids:
                self._ids.add(f.id)
                self._by_word.setdefault(self.rarity.rarest(f.keywords), []).append(f)

    def matching(self, listing: ListingText, *, any_age: bool = False) -> list[Filter]:
        """The filters that match ``listing``; ``any_age`` also applies filters created
        after the listing arrived (a backfill asked to)."""
        return _matching(self._by_word, listing, words(f"{listing.title} {listing.summary}"), any_age)

    def matches(self, listings: Iterable[ListingText], *, any_age: bool = False) -> list[Match]:
        """One match per (user, listing): a user hears once about a listing however many
        of their filters match it; the filter named is the oldest (lowest id). The
        batch's words teach the index which words are common (``WordRarity``), for the
        filters filed from now on."""
        texts = [(listing, words(f"{listing.title} {listing.summary}")) for listing in listings]
        self.rarity.observe(text_words for _, text_words in texts)
        result: list[Match] = []
        for listing, text_words in texts:
            best: dict[int, int] = {}  # user -> their lowest matching filter id
            for f in _matching(self._by_word, listing, text_words, any_age):
                if f.id < best.get(f.user_id, f.id + 1):
                    best[f.user_id] = f.id
            listing_id = listing.id
            result.extend(Match(user_id, listing_id, filter_id) for user_id, filter_id in sorted(best.items()))
        return result


def _matching(
    by_word: dict[str, list[Filter]], listing: ListingText, text_words: set[str], any_age: bool
) -> list[Filter]:
    """The filters filed in ``by_word`` that match ``listing``, whose words are ``text_words``."""
    categories: set[str] | None = None
    found = []
    for word in text_words:
        for f in by_word.get(word, ()):
            if f.source_id is not None and f.source_id != listing.source_id:
                continue
            if not any_age and f.created_at and listing.ingested_at and listing.ingested_at < f.created_at:
                continue
            if f.category is not None:
                if categories is None:
                    categories = {c.casefold() for c in listing.categories}
                if f.category not in categories:
                    continue
            if all(k in text_words for k in f.keywords):
                found.append(f)
    return found

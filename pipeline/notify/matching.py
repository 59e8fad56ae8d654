"""Which filters match a listing (DESIGN.md "Filters and delivery"), set-based.

A filter matches a listing when every keyword appears, case-insensitively, as a whole
word in its title or summary (plain text already: pipeline/listings/normalize.py), its source
restriction names the listing's source, and its category restriction is one of the
listing's categories. By default a filter applies only to listings that arrived after
it (``ingested_at >= created_at``): a new filter does not flood its user with history.

Set-based: ``FilterIndex`` files every filter under one of its keywords (for a batch, the
one the fewest of the batch's listings hold), so a listing is compared only with the
filters filed under one of its own words, never with every filter
(bench/match_throughput.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

# A word: letters and digits, joined by inner punctuation ("node.js", "e-mail"), with an
# optional tail of + or # ("c++", "c#"). A compound word also counts as each of its
# parts, as a whole-word search would find them: "node.js" contains "node" and "js".
WORD = re.compile(r"\w+(?:[.+#'-]+\w+)*[+#]*")
_PART = re.compile(r"\w+")
MAX_KEYWORDS = 20
MAX_KEYWORD_CHARS = 100


def words(text: str) -> set[str]:
    """The words of ``text``, case-folded; compound words also as their parts."""
    found: set[str] = set()
    for match in WORD.finditer(text):
        word = match.group().casefold()
        found.add(word)
        if not word.isalnum():
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


@dataclass(frozen=True)
class Match:
    user_id: int
    listing_id: int
    filter_id: int


class FilterIndex:
    """Filters filed by one keyword each: a listing meets only the filters filed under one
    of its own words. A filter can only match a listing that holds all its keywords, so
    filing it under any one of them loses nothing; filing it under a rare one means few
    listings ever look at it."""

    def __init__(self, filters: Iterable[Filter]) -> None:
        self._filters = sorted(filters, key=lambda f: f.id)
        self.size = len(self._filters)
        self._by_longest: dict[str, list[Filter]] | None = None

    def _filed(self, key: Callable[[tuple[str, ...]], str]) -> dict[str, list[Filter]]:
        by_word: dict[str, list[Filter]] = {}
        for f in self._filters:
            by_word.setdefault(key(f.keywords), []).append(f)
        return by_word

    def matching(self, listing: ListingText, *, any_age: bool = False) -> list[Filter]:
        """The filters that match ``listing``; ``any_age`` also applies filters created
        after the listing arrived (a backfill asked to). Filed by the longest keyword
        (longer words are rarer), for lack of a batch to count words in."""
        if self._by_longest is None:
            self._by_longest = self._filed(lambda keywords: max(keywords, key=len))
        return _matching(self._by_longest, listing, words(f"{listing.title} {listing.summary}"), any_age)

    def matches(self, listings: Iterable[ListingText], *, any_age: bool = False) -> list[Match]:
        """One match per (user, listing): a user hears once about a listing however many
        of their filters match it; the filter named is the oldest (lowest id).

        The batch's words are counted first and each filter is filed under its keyword
        that the fewest of these listings hold (one that none holds makes the filter cost
        nothing): measured, not guessed, rarity (bench/match_throughput.py).
        """
        texts = [(listing, words(f"{listing.title} {listing.summary}")) for listing in listings]
        held_by = Counter(word for _, text_words in texts for word in text_words)
        by_word = self._filed(lambda keywords: min(keywords, key=lambda k: (held_by[k], -len(k))))
        result: list[Match] = []
        for listing, text_words in texts:
            best: dict[int, Filter] = {}
            for f in _matching(by_word, listing, text_words, any_age):
                if f.user_id not in best or f.id < best[f.user_id].id:
                    best[f.user_id] = f
            result.extend(Match(user_id, listing.id, f.id) for user_id, f in sorted(best.items()))
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

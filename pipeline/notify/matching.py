"""Which filters match a listing, set-based.

A filter matches a listing when its expression (pipeline/notify/query.py) holds for it:
by default every word appears, case-insensitively, as a whole word in its title or
summary (plain text already: pipeline/listings/normalize.py). Its source restriction
names the listing's source, and its category restriction is one of the listing's
categories. By default a filter applies only to listings that arrived after
it (``ingested_at >= created_at``): a new filter does not flood its user with history.

Set-based: ``FilterIndex`` files each alternative of every filter under one of the things
it needs (a word; an author's word, a category or a source, under keys of their own),
once, when the filter joins the index, so a listing is compared only with the
alternatives filed under one of its own keys, never with every filter; the time to
match a batch does not grow with the number of filters that cannot match it
(bench/match_throughput.py). An alternative is filed under its rarest key by the document frequencies the index has learned from the
listings it matched (``WordRarity``); unknown words count as rarest, and a tie goes to the
longest word (longer words are rarer).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pipeline.core.fields import Fields
from pipeline.core.prices import Amount, parse_price
from pipeline.core.words import folded, listing_text, phrase_tokens, words
from pipeline.notify.query import (
    AMOUNT_FIELDS,
    CATEGORY_KEY,
    SOURCE_KEY,
    WORD_KEYS,
    Clause,
    Condition,
    Field,
    Query,
    Term,
    plain,
)

__all__ = ["Filter", "FilterIndex", "ListingText", "Match", "WordRarity", "reasons", "words"]


@dataclass(frozen=True)
class Filter:
    """A user's filter. ``query`` is its expression compiled (pipeline/notify/query.py);
    without one, ``keywords`` must all appear (filters from before the language, and
    tests). ``source_id`` and ``category`` restrict it further (``filters add --source
    --category``)."""

    id: int
    user_id: int
    keywords: tuple[str, ...] = ()
    source_id: int | None = None
    category: str | None = None  # folded (pipeline/core/words.py), as `category:` compares
    created_at: datetime | None = None
    query: Query | None = None
    changes: bool = False  # its user also hears of changes (pipeline/storage/watches.py)

    @property
    def clauses(self) -> tuple[Clause, ...]:
        return (self.query or plain(self.keywords)).clauses


@dataclass(frozen=True)
class ListingText:
    id: int
    source_id: int
    title: str
    summary: str
    categories: Sequence[str] = ()
    ingested_at: datetime | None = None
    author: str | None = None
    published_at: datetime | None = None
    price: str | None = None  # as the page shows it (``price:`` reads its amount)
    fields: Fields = Fields()  # what it says of itself beyond its words (pipeline/core/fields.py)

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> ListingText:
        """A listings row's text (a mapping of those columns: a claim's row, or a result
        row's ``_mapping``)."""
        return cls(id=row["id"], source_id=row["source_id"], title=row["title"], summary=row["summary"],
                   categories=row["categories"] or (), ingested_at=row["ingested_at"], author=row["author"],
                   published_at=row["published_at"], price=row["price"], fields=Fields.from_json(row["fields"]))

    def field_text(self, fld: Field) -> str:
        """The text a field's words are taken from (``author:``, ``location:``, ...)."""
        return {Field.TITLE: self.title, Field.SUMMARY: self.summary, Field.AUTHOR: self.author,
                Field.LOCATION: self.fields.location, Field.COMPANY: self.fields.company}.get(fld) or ""


class Match(NamedTuple):
    """One (user, listing) pair to notify, and the filter that matched. A tuple, not a
    dataclass: a batch makes tens of thousands, and a frozen dataclass's constructor
    was most of the matcher's time (bench/RESULTS.md, matching)."""

    user_id: int
    listing_id: int
    filter_id: int


class WordRarity:
    """In how many listings each word (or other key) was seen: the index's measure of
    rarity, learned from the batches it matched. Bounded: past ``max_words`` words, those
    seen once are forgotten (they are the long tail; a forgotten word counts as rare
    again)."""

    def __init__(self, max_words: int = 500_000) -> None:
        self.seen: Counter[str] = Counter()
        self.max_words = max_words

    def observe(self, listing_words: Iterable[Iterable[str]]) -> None:
        seen = self.seen
        for text_words in listing_words:
            seen.update(text_words)
        if len(seen) > self.max_words:
            self.seen = Counter({word: n for word, n in seen.items() if n > 1})

    def rarest_word(self, words: Sequence[str]) -> str:
        """The word seen least; a tie goes to the longest (longer words are rarer)."""
        seen = self.seen
        return min(words, key=lambda k: (seen[k], -len(k)))

    def rarest(self, filings: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
        """Of the key sets a clause may be filed under, the one seen least (a set by its
        most common key); a tie goes to the longest key, as ``rarest_word``."""
        seen = self.seen
        return min(filings, key=lambda keys: (max(seen[k] for k in keys), -min(len(k) for k in keys)))


# Filed under a key: the filter, the words its alternative needs among the listing's
# words, those it must not find there, and the alternative's other conditions.
_Entry = tuple["Filter", tuple[str, ...], tuple[str, ...], tuple[Condition, ...]]


class FilterIndex:
    """Filters' alternatives filed by one key each: a listing meets only the alternatives
    filed under one of its own keys. An alternative can only match a listing that holds
    all the keys it needs, so filing it under any one of them loses nothing; filing it
    under a rare one means few listings ever look at it. Filing happens once per filter
    (``add``); matching a batch touches only what is filed under the batch's keys."""

    def __init__(self, filters: Iterable[Filter] = (), *, rarity: WordRarity | None = None) -> None:
        self.rarity = rarity if rarity is not None else WordRarity()
        self._by_key: dict[str, list[_Entry]] = {}
        self._ids: set[int] = set()
        self._prefixes: set[str] = set()  # the kinds of keys other than words filed
        # Filters whose matching raised, by id, with what it raised: each is skipped
        # for that listing, every other filter is matched (``take_failures``).
        self.failures: dict[int, str] = {}
        self.add(filters)

    @property
    def size(self) -> int:
        return len(self._ids)

    def add(self, filters: Iterable[Filter]) -> None:
        """File ``filters`` in the index; a filter already in it (by id) is skipped. An
        alternative with nothing to file it under (a ``source:`` naming no source any
        more) can match nothing and is left out."""
        by_key = self._by_key
        for f in filters:
            if f.id in self._ids:
                continue
            self._ids.add(f.id)
            if f.query is None:  # every keyword must appear: filed under the rarest
                by_key.setdefault(self.rarity.rarest_word(f.keywords), []).append((f, f.keywords, (), ()))
                continue
            for clause in f.query.clauses:
                if not clause.filings:
                    continue
                entry = (f, clause.words, clause.absent, clause.checks)
                for key in self.rarity.rarest(clause.filings):
                    by_key.setdefault(key, []).append(entry)
                    if key.startswith("\x00"):
                        self._prefixes.add(key[:3])

    def matching(
        self, listing: ListingText, *, any_age: bool = False, now: datetime | None = None,
        text_words: set[str] | None = None,
    ) -> list[Filter]:
        """The filters that match ``listing``; ``any_age`` also applies filters created
        after the listing arrived (a backfill asked to); ``now`` is the moment
        ``published:7d`` reaches back from; ``text_words``: the listing's words, where they
        are known already (its stored words: pipeline/core/words.py ``word_string``)."""
        if text_words is None:
            text_words = words(listing_text(listing.title, listing.summary))
        found = self._matching(listing, text_words, self._keys(listing, text_words), any_age, now or _now())
        return list({f.id: f for f in found}.values())

    def matches(
        self, listings: Iterable[ListingText], *, any_age: bool = False, now: datetime | None = None,
    ) -> list[Match]:
        """One match per (user, listing): a user hears once about a listing however many
        of their filters match it; the filter named is the oldest (lowest id) of those
        that watch for changes (``changes``: the match then makes the watch), else the
        oldest. The batch's keys teach the index which are common (``WordRarity``), for
        the filters filed from now on."""
        texts = []
        for listing in listings:
            text_words = words(listing_text(listing.title, listing.summary))
            texts.append((listing, text_words, self._keys(listing, text_words)))
        self.rarity.observe(keys for _, _, keys in texts)
        now = now or _now()
        result: list[Match] = []
        for listing, text_words, keys in texts:
            best: dict[int, tuple[bool, int]] = {}  # user -> (not watching, id) of their first filter
            for f in self._matching(listing, text_words, keys, any_age, now):
                rank = (not f.changes, f.id)
                if rank < best.get(f.user_id, (True, f.id + 1)):
                    best[f.user_id] = rank
            listing_id = listing.id
            result.extend(Match(user_id, listing_id, filter_id) for user_id, (_, filter_id) in sorted(best.items()))
        return result

    def _keys(self, listing: ListingText, text_words: set[str]) -> Collection[str]:
        """The listing's keys: its words, and its author's words, categories and source
        where some filter is filed under such keys."""
        if not self._prefixes:
            return text_words
        extra: list[str] = []
        for fld, prefix in WORD_KEYS.items():
            if prefix in self._prefixes and (text := listing.field_text(fld)):
                extra.extend(prefix + w for w in words(text))
        if CATEGORY_KEY in self._prefixes:
            extra.extend(dict.fromkeys(CATEGORY_KEY + folded(c) for c in listing.categories))
        if SOURCE_KEY in self._prefixes:
            extra.append(SOURCE_KEY + str(listing.source_id))
        return [*text_words, *extra]

    def _matching(
        self, listing: ListingText, text_words: set[str], keys: Collection[str], any_age: bool, now: datetime,
    ) -> list[Filter]:
        """The filters filed under ``keys`` that match ``listing`` (whose words are
        ``text_words``); a filter can come twice, by two of its alternatives."""
        by_key = self._by_key
        categories: set[str] | None = None
        fields: _Fields | None = None
        found = []
        for key in keys:
            for f, need, absent, checks in by_key.get(key, ()):
                if f.source_id is not None and f.source_id != listing.source_id:
                    continue
                if not any_age and f.created_at and listing.ingested_at and listing.ingested_at < f.created_at:
                    continue
                if f.category is not None:
                    if categories is None:
                        categories = {folded(c) for c in listing.categories}
                    if f.category not in categories:
                        continue
                if not all(k in text_words for k in need):
                    continue
                if absent and any(k in text_words for k in absent):
                    continue
                if checks:
                    if fields is None:
                        fields = _Fields(listing, text_words, now)
                    try:
                        if not all(fields.holds(c) for c in checks):
                            continue
                    except Exception as exc:  # one filter's failure is its own: the others match on
                        self.failures.setdefault(f.id, f"{type(exc).__name__}: {exc}")
                        continue
                found.append(f)
        return found

    def take_failures(self) -> dict[int, str]:
        """The filters whose matching raised since the last call, with what it raised."""
        failures, self.failures = self.failures, {}
        return failures


def _now() -> datetime:
    return datetime.now(UTC)


def reasons(query: Query, listing: ListingText, now: datetime | None = None) -> tuple[str, ...] | None:
    """Why ``query`` matches ``listing``, for people (``pipeline filters test``): the
    conditions of the first alternative that holds, each as written with where it was
    found (``python (title, summary)``, ``"machine learning" (summary)``,
    ``category:remote``, ``without senior``); None when no alternative holds."""
    text_words = words(listing_text(listing.title, listing.summary))
    fields = _Fields(listing, text_words, now or _now())
    for clause in query.clauses:
        if not all(w in text_words for w in clause.words) or any(w in text_words for w in clause.absent):
            continue
        if not all(fields.holds(c) for c in clause.checks):
            continue
        scoped = {w for c in clause.checks if not c.negated for w in c.term.words}
        found = [f"{w} ({_where(fields, w)})" for w in clause.words if w not in scoped]
        found += [_written(c, fields) for c in clause.checks]
        return (*found, *(f"without {w}" for w in clause.absent))
    return None


def _where(fields: _Fields, word: str) -> str:
    return ", ".join(f for f in (Field.TITLE, Field.SUMMARY) if word in fields.words(f))


def _written(condition: Condition, fields: _Fields) -> str:
    term = condition.term
    if term.field is Field.PUBLISHED:
        published = fields.listing.published_at
        text = f"published {published:%Y-%m-%d}" if published else "published"
    elif term.field is Field.PRICE:
        text = f"price {fields.listing.price}" if fields.price and not condition.negated else f"price:{term.bounds}"
    elif term.field in AMOUNT_FIELDS:
        text = (f"{term.field}:{term.bounds}" if condition.negated
                else _amount_written(term.field, fields.listing.fields))
    elif term.words:
        what = f'"{" ".join(term.words)}"' if term.phrase else term.words[0]
        if term.field is Field.TEXT and not condition.negated:
            text = f"{what} ({_phrase_where(fields, term) if term.phrase else _where(fields, term.words[0])})"
        elif term.field is Field.TEXT:
            text = what
        else:
            text = f"{term.field}:{what}"
    else:
        text = f"{term.field}:{term.value}"
    return f"without {text}" if condition.negated else text


def _amount_written(fld: Field, stored: Fields) -> str:
    """A listing's amount as the workbench shows what matched: "salary 70000..90000 EUR a year"."""
    if fld is Field.SALARY:
        low, high = stored.salary_min, stored.salary_max
        span = f"{low:f}" if low == high else f"{low:f}..{high:f}"
        return f"salary {span}{' ' + stored.salary_currency if stored.salary_currency else ''} a year"
    value = stored.area if fld is Field.AREA else stored.rooms
    return f"{fld} {value:f}" + (" m²" if fld is Field.AREA else "")


def _phrase_where(fields: _Fields, term: Term) -> str:
    return ", ".join(f for f in (Field.TITLE, Field.SUMMARY) if fields.has_phrase(f, term.words))


class _Fields:
    """What a listing's conditions look at, each worked out once and only when asked."""

    def __init__(self, listing: ListingText, text_words: set[str], now: datetime) -> None:
        self.listing, self.now = listing, now
        self._words: dict[Field, set[str]] = {Field.TEXT: text_words}
        self._tokens: dict[Field, tuple[str, ...]] = {}
        self._categories: set[str] | None = None

    @functools.cached_property
    def price(self) -> Amount | None:
        """Its fields' price; for a listing stored before it had fields, its price's text read."""
        stored = self.listing.fields
        return Amount(stored.price, stored.currency) if stored.price is not None else parse_price(self.listing.price)

    def words(self, fld: Field) -> set[str]:
        if fld not in self._words:
            self._words[fld] = words(self.listing.field_text(fld))
        return self._words[fld]

    def has_phrase(self, fld: Field, phrase: tuple[str, ...]) -> bool:
        if fld is Field.TEXT:  # in the title or in the summary, not across the two
            return self.has_phrase(Field.TITLE, phrase) or self.has_phrase(Field.SUMMARY, phrase)
        if fld not in self._tokens:
            self._tokens[fld] = phrase_tokens(self.listing.field_text(fld))
        tokens, n = self._tokens[fld], len(phrase)
        first = phrase[0]
        return any(tokens[i:i + n] == phrase for i, t in enumerate(tokens) if t == first)

    def holds(self, condition: Condition) -> bool:
        term, listing = condition.term, self.listing
        if term.field is Field.CATEGORY:
            if self._categories is None:
                self._categories = {folded(c) for c in listing.categories}
            found = term.value in self._categories
        elif term.field is Field.SOURCE:
            found = listing.source_id in condition.source_ids
        elif term.field is Field.PUBLISHED:
            assert term.window is not None
            found = term.window.holds(listing.published_at, self.now)
        elif term.field is Field.PRICE:
            assert term.bounds is not None
            found = term.bounds.holds(self.price.value if self.price else None)
        elif term.field is Field.CURRENCY:
            found = self.price is not None and self.price.currency == term.value
        elif term.field is Field.SALARY:
            assert term.bounds is not None
            found = term.bounds.reaches(listing.fields.salary_min, listing.fields.salary_max)
        elif term.field in (Field.AREA, Field.ROOMS):
            assert term.bounds is not None
            found = term.bounds.holds(listing.fields.area if term.field is Field.AREA else listing.fields.rooms)
        elif term.phrase:
            found = self.has_phrase(term.field, term.words)
        else:
            found = term.words[0] in self.words(term.field)
        return found is not condition.negated

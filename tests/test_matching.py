"""The matcher's semantics, and that the index finds exactly what a naive loop finds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.notify.matching import Filter, FilterIndex, ListingText, Match, words
from pipeline.notify.query import QueryError, compile_query

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def listing(title: str, summary: str = "", *, id: int = 1, source_id: int = 1,
            categories: tuple[str, ...] = (), ingested_at: datetime = T0) -> ListingText:
    return ListingText(id, source_id, title, summary, categories, ingested_at)


def matched(filters: list[Filter], item: ListingText, **kwargs) -> list[int]:
    return sorted(f.id for f in FilterIndex(filters).matching(item, **kwargs))


def test_words_are_case_folded_and_compounds_count_as_their_parts():
    assert words("Senior C++ / Node.js dev, e-mail: Python3. C#!") >= {
        "senior", "c++", "c", "node.js", "node", "js", "dev", "e-mail", "e", "mail", "python3", "c#",
    }


def test_keywords_parse_and_bad_ones_are_named():
    assert compile_query(" Python,  Remote node.js C++ python ").words == ("python", "remote", "node.js", "c++")
    with pytest.raises(QueryError, match="at position 5: 'data!' is not a word"):
        compile_query("big data!")
    with pytest.raises(QueryError, match="at least one word"):
        compile_query(" , ")


@pytest.mark.parametrize(
    ("keywords", "title", "summary", "hit"),
    [
        ("python", "Python developer", "", True),
        ("python", "PYTHON developer", "", True),  # case-insensitive
        ("python remote", "Python developer", "fully remote", True),  # title or summary
        ("python remote", "Python developer", "on site", False),  # every keyword
        ("python", "Python3 developer", "", False),  # whole words only
        ("py", "Python developer", "", False),
        ("node.js", "Node.js engineer", "", True),
        ("node", "Node.js engineer", "", True),  # a part of a compound is a whole word
        ("c++", "C++ and Rust", "", True),
        ("c++", "C and Rust", "", False),
        ("straße", "STRASSE cleaning", "", True),  # Unicode case folding: ß folds to ss
    ],
)
def test_every_keyword_as_a_whole_word_case_insensitively(keywords, title, summary, hit):
    f = Filter(1, 1, query=compile_query(keywords))
    assert matched([f], listing(title, summary)) == ([1] if hit else [])


def test_source_and_category_restrictions():
    filters = [
        Filter(1, 1, ("python",), source_id=2),
        Filter(2, 1, ("python",), category="remote"),
        Filter(3, 1, ("python",)),
    ]
    assert matched(filters, listing("Python", source_id=2)) == [1, 3]
    assert matched(filters, listing("Python", source_id=3, categories=("Remote",))) == [2, 3]


def test_a_filter_applies_to_listings_that_arrive_after_it_unless_asked():
    f = Filter(1, 1, ("python",), created_at=T0)
    assert matched([f], listing("Python", ingested_at=T0 - timedelta(seconds=1))) == []
    assert matched([f], listing("Python", ingested_at=T0)) == [1]
    assert matched([f], listing("Python", ingested_at=T0 - timedelta(days=9)), any_age=True) == [1]


def test_one_match_per_user_and_listing_naming_the_oldest_filter():
    filters = [Filter(5, 1, ("python",)), Filter(2, 1, ("developer",)), Filter(3, 2, ("python",))]
    assert FilterIndex(filters).matches([listing("Python developer", id=9)]) == [
        Match(user_id=1, listing_id=9, filter_id=2), Match(user_id=2, listing_id=9, filter_id=3),
    ]


def naive(filters: list[Filter], items: list[ListingText]) -> set[tuple[int, int]]:
    """The reference: every filter against every listing, the semantics spelled out."""
    pairs = set()
    for item in items:
        text = words(f"{item.title} {item.summary}")
        for f in filters:
            if (all(k in text for k in f.keywords)
                    and (f.source_id is None or f.source_id == item.source_id)
                    and (f.category is None or f.category in {c.casefold() for c in item.categories})):
                pairs.add((f.id, item.id))
    return pairs


def test_the_index_finds_exactly_what_the_naive_loop_finds():
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(60)] + ["c++", "node.js", "Python", "e-mail"]
    filters = [
        Filter(i, i % 7, tuple({w.casefold() for w in rng.sample(vocabulary, rng.randint(1, 3))}),
               source_id=rng.choice([None, None, 1, 2]), category=rng.choice([None, None, "jobs"]))
        for i in range(300)
    ]
    items = [
        listing(" ".join(rng.sample(vocabulary, 6)), " ".join(rng.sample(vocabulary, 8)), id=i,
                source_id=rng.choice([1, 2]), categories=rng.choice([(), ("Jobs",)]))
        for i in range(300)
    ]
    index = FilterIndex(filters)
    found = {(f.id, item.id) for item in items for f in index.matching(item)}
    assert found == naive(filters, items) and len(found) > 100


class _Counted(Filter):
    """A filter that counts every read of its fields once ``reads`` is armed."""

    reads: list[int] | None = None

    def __getattribute__(self, name: str):
        counter = type(self).reads
        if counter is not None and name in ("keywords", "source_id", "category", "created_at", "user_id"):
            counter.append(object.__getattribute__(self, "id"))
        return object.__getattribute__(self, name)


def test_a_batch_never_touches_the_filters_that_cannot_match_it():
    """The cost of matching a batch does not grow with the filters it cannot match:
    they are filed once, when added, and a batch reads only the filters filed under its
    own words (the index once filed every filter again for every batch)."""
    near = [Filter(i, i, ("python", "remote")) for i in range(1, 4)]
    far = [_Counted(100 + i, 5, (f"zz{i}", "python")) for i in range(2_000)]
    index = FilterIndex()
    index.rarity.observe([{"python", "remote", "developer"}])  # words seen before: common
    index.add(far)  # each filed under its word no listing held yet
    index.add(near)
    _Counted.reads = []
    try:
        found = index.matches([listing("Python developer", "remote", id=1), listing("Rust", id=2)])
        assert _Counted.reads == [], f"{len(_Counted.reads)} reads of filters that cannot match"
    finally:
        _Counted.reads = None
    assert [(m.user_id, m.listing_id) for m in found] == [(1, 1), (2, 1), (3, 1)]
    index.add(near)  # a filter read again (the catalogue's overlapping reads) is filed once
    assert index.size == len(near) + len(far)

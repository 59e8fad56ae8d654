"""The filter language (pipeline/notify/query.py): what each form means, the errors that
name a position, and a property test that the compiled, set-based matcher agrees with a
straightforward evaluator of the expression on random filters and listings."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.core.words import phrase_tokens, words
from pipeline.notify.matching import Filter, FilterIndex, ListingText
from pipeline.notify.query import (
    MAX_CHARS,
    MAX_CLAUSES,
    MAX_DEPTH,
    QueryError,
    compile_query,
    parse,
)

NOW = datetime(2026, 11, 25, 12, tzinfo=UTC)
SOURCES = {"hn": frozenset({1}), "jobs board": frozenset({2})}


def listing(title: str, summary: str = "", *, id: int = 1, source_id: int = 1, categories: tuple[str, ...] = (),
            author: str | None = None, published_at: datetime | None = None, price: str | None = None) -> ListingText:
    return ListingText(id, source_id, title, summary, categories, NOW, author, published_at, price)


def hits(query: str, *items: ListingText) -> list[int]:
    index = FilterIndex([Filter(1, 1, query=compile_query(query, SOURCES))])
    return [m.listing_id for m in index.matches(items, now=NOW)]


DEV = listing("Senior Python developer", "Machine learning, fully remote", id=1, author="Jane Smith",
              categories=("Remote", "Full  Time"), published_at=NOW - timedelta(days=2))
RUST = listing("Rust engineer", "On site in Berlin; learning machine", id=2, source_id=2,
               categories=("jobs",), published_at=datetime(2026, 10, 1, tzinfo=UTC))
UNDATED = listing("Go developer", "remote; node.js and c++", id=3, author="Bob")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("python remote", [1]),  # every word, title or summary
        ("PYTHON", [1]),
        ("developer", [1, 3]),
        ('"machine learning"', [1]),  # a phrase: its words in a row (2 has them reversed)
        ('"learning machine"', [2]),
        ('"developer machine"', []),  # not across the title and the summary
        ("developer -senior", [3]),
        ('developer -"senior python"', [3]),
        ("rust OR go", [2, 3]),
        ("(rust OR go) remote", [3]),
        ("rust OR go remote", [2, 3]),  # AND binds tighter than OR
        ("rust OR (go berlin)", [2]),
        ("developer AND remote", [1, 3]),
        ("title:remote", []),
        ("summary:remote", [1, 3]),
        ("title:(rust OR go)", [2, 3]),
        ('summary:"fully remote"', [1]),
        ("author:smith", [1]),
        ('author:"jane smith" remote', [1]),
        ("category:remote", [1]),
        ('category:"full time"', [1]),  # whole, case-insensitive, spaces collapsed
        ("category:full", []),
        ("source:2", [2]),
        ('source:"Jobs Board"', [2]),
        ("source:hn -category:remote", [3]),
        ("developer published:7d", [1]),  # the undated listing is in no window
        ("published:2026-10-01 rust", [2]),
        ("(published:2026-09-01..2026-10-01 OR published:..2026-09-01) engineer", [2]),
        ("engineer published:2026-10-02..", []),
        ("developer -published:7d", [3]),
        ("node", [3]),  # a part of a compound word is a whole word
        ("c++ node.js", [3]),
        ('"node.js and c++"', [3]),
    ],
)
def test_what_each_form_matches(query, expected):
    assert hits(query, DEV, RUST, UNDATED) == expected


def test_a_date_far_ahead_is_in_no_window_of_the_last_days():
    """A listing dated years ahead keeps its date (a feed's mistake, or a scheduled event)
    but is not "published in the last 7 days"; a day ahead is a clock's skew, and is."""
    ahead = listing("Python developer", id=1, published_at=datetime(2150, 1, 1, tzinfo=UTC))
    skewed = listing("Python developer", id=2, published_at=NOW + timedelta(hours=20))
    assert hits("python published:7d", ahead, skewed) == [2]
    assert hits("python published:2150-01-01", ahead, skewed) == [1]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("python (remote", "at position 8: this ( is never closed"),
        ("python remote)", "at position 14: this ) has no ( before it"),
        ('python "remote', 'at position 8: this " is never closed'),
        ("OR python", "at position 1: 'OR' needs a condition before it"),
        ("python OR", "at position 10: OR needs a condition after it"),
        ("python OR OR go", "at position 11: OR needs a condition after it"),
        ("python ()", "at position 8: empty parentheses"),
        ("python - go", "at position 8: - must stand right before"),
        ("python colour:red", "at position 8: unknown field 'colour'"),
        ("title: python", "at position 1: title: needs a value right after the colon"),
        ("title:(go author:bob)", "at position 11: author: inside title:( )"),
        ("big data!", "at position 5: 'data!' is not a word"),
        ('python ""', "at position 8: a phrase needs at least one word"),
        ("python published:yesterday", "at position 18: 'yesterday' is not a date"),
        ("python published:2026-02-01..2026-01-01", "at position 18: published:2026-02-01..2026-01-01 ends before"),
        ("python published:..", "at position 18: published:.. needs a date"),
        ("-python", "at position 2: nothing here must appear"),
        ("python OR -go", "at position 12: nothing here must appear"),
        ("published:7d", "at position 1: nothing here must appear"),
        ("python -python", "can never match"),
        (" , ", "at least one word"),
        ("category:", "at position 1: category: needs a value"),
    ],
)
def test_a_malformed_filter_is_refused_naming_the_position(query, message):
    with pytest.raises(QueryError) as error:
        compile_query(query, SOURCES)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("developer and remote", [1, 3]),  # operators in any case
        ("rust or go", [2, 3]),
        ("rust Or go", [2, 3]),
        ("developer AND NOT senior", [3]),
        ("developer not senior", [3]),
        ("developer NOT (senior OR bob)", [3]),
        ("NOT senior developer", [3]),
        ('developer "not"', []),  # quoted: the word itself
    ],
)
def test_and_or_and_not_are_operators_in_any_case(query, expected):
    assert hits(query, DEV, RUST, UNDATED) == expected


def test_the_words_and_or_and_not_are_found_when_quoted():
    item = listing("To be or not to be", "and that is the question")
    assert hits('"or" "not" "and" question', item) == [1]
    assert hits("question or nothing", item) == [1]  # "or" an operator: question, or nothing


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("python NOT", "at position 8: NOT needs a word, phrase or ( after it"),
        ("python NOT OR go", "at position 8: NOT needs"),
        ("python AND", "at position 11: AND needs a condition after it"),
        ("python and or go", "at position 12: AND needs a condition after it"),
    ],
)
def test_a_dangling_operator_is_refused_naming_its_position(query, message):
    with pytest.raises(QueryError) as error:
        compile_query(query, SOURCES)
    assert message in str(error.value)


def test_a_filter_nested_past_the_limit_is_refused_at_parse_not_by_a_recursion_error():
    """The reproduction: 196 groups of -( around a word, as `filters add` once accepted."""
    deep = "python " + "-(" * 196 + "x" + ")" * 196
    with pytest.raises(QueryError, match=f"at position 25: parentheses nest at most {MAX_DEPTH} deep"):  # the ninth (
        compile_query(deep)
    for depth in range(1, MAX_DEPTH + 1):  # up to the limit, it compiles
        compile_query("python " + "(x OR " * depth + "y" + ")" * depth)
    with pytest.raises(QueryError, match=f"nest at most {MAX_DEPTH} deep"):
        parse("(" * (MAX_DEPTH + 1) + "x" + ")" * (MAX_DEPTH + 1))
    with pytest.raises(QueryError, match=f"at most {MAX_CHARS:,} characters; this one has"):
        compile_query("python " + "a" * MAX_CHARS)
    with pytest.raises(QueryError, match="at most 40 conditions"):
        compile_query(" OR ".join(f"w{i}" for i in range(41)))


@pytest.mark.parametrize(
    ("written", "item", "expected"),
    [
        ("python published:9999-12-31", listing("python", published_at=datetime(9999, 12, 31, 5, tzinfo=UTC)), [1]),
        ("python published:2026-01-01..9999-12-31", listing("python", published_at=NOW), [1]),
        ("python published:..9999-12-31", listing("python", published_at=NOW), [1]),
        ("python published:0001-01-01", listing("python", published_at=NOW), []),
        ("python published:99999w", listing("python", published_at=NOW), [1]),
    ],
)
def test_dates_at_the_ends_of_the_calendar_compile_and_match(written, item, expected):
    """`published:9999-12-31` once ended in an OverflowError traceback (its end, the next
    day, is past what a datetime holds): the window is then open-ended."""
    assert hits(written, item) == expected


@pytest.mark.parametrize(
    "hidden",
    ["sc\u00adam", "sc\u200bam", "sc\u2060am", "\uff53\uff43\uff41\uff4d", "SC\u00adAM", "s\ufeffcam"],
)
def test_format_characters_and_compatibility_forms_do_not_slip_past_an_exclusion(hidden):
    item = listing(f"Crypto {hidden} giveaway")
    assert hits("crypto -scam", item) == []
    assert hits("crypto scam", item) == [1]


@pytest.mark.parametrize("written", ["\uff30\uff59\uff54\uff48\uff4f\uff4e", "Py\u200bthon", "Py\u00adthon",
                                     "PY\u2060THON"])
def test_a_word_written_with_hidden_or_wide_characters_is_the_word(written):
    title = written + " developer"
    assert hits("python developer", listing(title)) == [1]
    assert hits('"python developer"', listing(title)) == [1]


def test_a_filter_is_normalised_by_the_same_rule_as_the_text():
    full_width = "\uff50\uff59\uff54\uff48\uff4f\uff4e"
    assert hits(f"{full_width} -sc\u00adam", listing("Python jobs")) == [1]
    assert hits(f"{full_width} -sc\u00adam", listing("Python scam")) == []
    assert hits("category:Ｒｅｍｏｔｅ", DEV) == [1]


def test_parentheses_that_multiply_out_too_far_are_refused():
    query = " ".join(f"(a{i} OR b{i})" for i in range(6))  # 2**6 alternatives
    with pytest.raises(QueryError, match=f"over {MAX_CLAUSES} alternatives"):
        compile_query(query)
    assert len(compile_query(" ".join(f"(a{i} OR b{i})" for i in range(5))).clauses) == 32


def test_a_filter_of_other_fields_is_filed_under_them_never_read_by_other_listings():
    """An author, category or source is a key of its own: a listing without it never
    looks at the filter (the set-based matcher, not a loop over filters)."""
    index = FilterIndex([Filter(1, 1, query=compile_query("author:smith")),
                         Filter(2, 2, query=compile_query("category:remote -python")),
                         Filter(3, 3, query=compile_query("source:hn", SOURCES))])
    assert sorted(index._by_key) == ["\x00a:smith", "\x00c:remote", "\x00s:1"]
    assert [(m.user_id, m.listing_id) for m in index.matches([DEV, RUST, UNDATED], now=NOW)] == [
        (1, 1), (3, 1), (3, 3)]


def test_a_source_named_by_no_source_matches_nothing():
    index = FilterIndex([Filter(1, 1, query=compile_query("source:gone python", {}))])
    assert index.matches([DEV], now=NOW) == []


# -- the property test: the compiled matcher against a straightforward evaluator -------------

VOCABULARY = ["python", "rust", "go", "c++", "node.js", "node", "js", "remote", "data", "engineer"]
AUTHORS = [None, "Jane Smith", "Bob", "smith-jones"]
CATEGORIES = [(), ("Remote",), ("full  time", "jobs"), ("REMOTE", "Data")]
NAMES = {1: "HN", 2: "Jobs board"}
DATES = [None, NOW - timedelta(hours=5), NOW - timedelta(days=2), datetime(2026, 11, 20, 23, tzinfo=UTC),
         datetime(2026, 11, 21, tzinfo=UTC), datetime(2026, 11, 24, 23, 59, tzinfo=UTC),
         # on the edges: a window's first moment is in it, its end is not
         datetime(2026, 11, 22, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC), NOW - timedelta(days=1)]
WINDOWS = {  # as written, and the same window spelt out for the evaluator
    "1d": (NOW - timedelta(days=1), None),
    "3d": (NOW - timedelta(days=3), None),
    "2026-11-21": (datetime(2026, 11, 21, tzinfo=UTC), datetime(2026, 11, 22, tzinfo=UTC)),
    "2026-11-20..2026-11-24": (datetime(2026, 11, 20, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC)),
    "..2026-11-21": (None, datetime(2026, 11, 22, tzinfo=UTC)),
    "2026-11-23..": (datetime(2026, 11, 23, tzinfo=UTC), None),
}


# Prices as pages show them, each with its amount and currency spelt out for the evaluator.
PRICED = {"€999": (999, "EUR"), "€1,000": (1000, "EUR"), "1.000,00 EUR": (1000, "EUR"), "$ 1000": (1000, "$"),
          "€2,500": (2500, "EUR"), "call us": None, None: None}
PRICE_TESTS = {  # as written, and what it means
    "<1000": lambda a: a < 1000, "<=1000": lambda a: a <= 1000, ">1000": lambda a: a > 1000,
    ">=1000": lambda a: a >= 1000, "1000": lambda a: a == 1000, "999..2500": lambda a: 999 <= a <= 2500,
    "..999": lambda a: a <= 999, "1001..": lambda a: a >= 1001,
}
CURRENCIES = {"EUR": "EUR", "eur": "EUR", "€": "EUR", "$": "$"}


@dataclass(frozen=True)
class T:  # a term: field ("" for title or summary), the value as written
    field: str
    value: str
    phrase: bool = False


@dataclass(frozen=True)
class N:  # not
    node: object


@dataclass(frozen=True)
class A:  # and
    nodes: tuple


@dataclass(frozen=True)
class O:  # or
    nodes: tuple


def quoted(value: str) -> str:
    return f'"{value}"'


def render(node) -> str:
    if isinstance(node, T):
        value = quoted(node.value) if node.phrase or " " in node.value else node.value
        return f"{node.field}:{value}" if node.field else value
    if isinstance(node, N):
        return "-" + (render(node.node) if isinstance(node.node, T) else f"({render(node.node)})")
    if isinstance(node, A):
        return " ".join(f"({render(n)})" if isinstance(n, O) else render(n) for n in node.nodes)
    return " OR ".join(render(n) for n in node.nodes)


def field_texts(field: str, item: ListingText) -> list[str]:
    return {"": [item.title, item.summary], "title": [item.title], "summary": [item.summary],
            "author": [item.author or ""]}[field]


def evaluate(node, item: ListingText) -> bool:
    """The expression, evaluated as the README states it, straight on the listing."""
    if isinstance(node, N):
        return not evaluate(node.node, item)
    if isinstance(node, A):
        return all(evaluate(n, item) for n in node.nodes)
    if isinstance(node, O):
        return any(evaluate(n, item) for n in node.nodes)
    if node.field == "category":
        return any(" ".join(c.split()).casefold() == node.value.casefold() for c in item.categories)
    if node.field == "source":
        return node.value.casefold() in (str(item.source_id), NAMES[item.source_id].casefold())
    if node.field == "price":
        priced = PRICED[item.price]
        return priced is not None and PRICE_TESTS[node.value](priced[0])
    if node.field == "currency":
        priced = PRICED[item.price]
        return priced is not None and priced[1] == CURRENCIES[node.value]
    if node.field == "published":
        start, end = WINDOWS[node.value]
        return item.published_at is not None and (start is None or item.published_at >= start) and (
            end is None or item.published_at < end)
    if node.phrase:
        wanted = " " + " ".join(phrase_tokens(node.value)) + " "
        return any(wanted in " " + " ".join(phrase_tokens(text)) + " " for text in field_texts(node.field, item))
    return any(node.value.casefold() in words(text) for text in field_texts(node.field, item))


words_st = st.sampled_from(VOCABULARY)
plain_words = st.builds(T, st.just(""), words_st)
terms = st.one_of(
    plain_words, plain_words, plain_words,  # the default form, the most written
    st.builds(T, st.sampled_from(["title", "summary"]), words_st),
    st.builds(T, st.sampled_from(["", "title", "summary"]),
              st.lists(words_st, min_size=1, max_size=3).map(" ".join), st.just(True)),
    st.builds(T, st.just("author"), st.sampled_from(["smith", "jane", "bob", "jones"])),
    st.builds(T, st.just("author"), st.just("jane smith"), st.just(True)),
    st.builds(T, st.just("category"), st.sampled_from(["remote", "jobs", "full time", "Data"])),
    st.builds(T, st.just("source"), st.sampled_from(["1", "2", "hn", "Jobs board"])),
    st.builds(T, st.just("published"), st.sampled_from(sorted(WINDOWS))),
    st.builds(T, st.just("price"), st.sampled_from(sorted(PRICE_TESTS))),
    st.builds(T, st.just("currency"), st.sampled_from(sorted(CURRENCIES))),
)
expressions = st.recursive(
    terms,
    lambda inner: st.one_of(
        st.builds(N, inner),
        st.lists(inner, min_size=2, max_size=3).map(lambda ns: A(tuple(ns))),
        st.lists(inner, min_size=2, max_size=3).map(lambda ns: O(tuple(ns))),
    ),
    max_leaves=6,
)
listings = st.builds(
    lambda i, title, summary, source, categories, author, published, price: listing(
        " ".join(title).title(), ", ".join(summary), id=i, source_id=source, categories=categories,
        author=author, published_at=published, price=price),
    st.integers(1, 10**6), st.lists(words_st, max_size=6), st.lists(words_st, max_size=8),
    st.sampled_from([1, 2]), st.sampled_from(CATEGORIES), st.sampled_from(AUTHORS), st.sampled_from(DATES),
    st.sampled_from(list(PRICED)),
)


def compiled(expression) -> Filter | None:
    """The filter the expression's text compiles to; None where the language refuses it
    (nothing that must appear; then some listing of the draw should show why)."""
    try:
        return Filter(1, 1, query=compile_query(render(expression), SOURCES))
    except QueryError as exc:
        assert "nothing here must appear" in str(exc) or "can never match" in str(exc) or "alternatives" in str(exc)
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expressions, st.lists(listings, min_size=1, max_size=12, unique_by=lambda item: item.id))
def test_the_compiled_matcher_agrees_with_evaluating_the_expression(expression, items):
    f = compiled(expression)
    assume(f is not None)
    found = {m.listing_id for m in FilterIndex([f]).matches(items, now=NOW)}
    assert found == {item.id for item in items if evaluate(expression, item)}, render(expression)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(expressions, min_size=1, max_size=15), st.lists(listings, min_size=1, max_size=10,
                                                                 unique_by=lambda item: item.id))
def test_many_filters_in_one_index_each_match_what_their_expression_says(expressions_, items):
    filters = [Filter(i, i, query=f.query) for i, e in enumerate(expressions_, 1) if (f := compiled(e)) is not None]
    assume(filters)
    by_id = dict(enumerate(expressions_, 1))
    found = {(m.user_id, m.listing_id) for m in FilterIndex(filters).matches(items, now=NOW)}
    assert found == {(f.id, item.id) for f in filters for item in items if evaluate(by_id[f.id], item)}


def test_a_refused_expression_is_one_a_listing_shows_is_unmatchable_or_unbounded():
    """What the language refuses as "can never match" indeed matches nothing."""
    expression = A((T("", "python"), N(T("", "python"))))
    assert compiled(expression) is None
    assert not evaluate(expression, listing("Python", "python"))


FLAT = ListingText(11, 1, "Flat in Berlin", "two rooms", (), NOW, None, None, price="€1,250")
LOFT = ListingText(12, 1, "Loft in Berlin", "big", (), NOW, None, None, price="1.999,00 EUR")
HOUSE = ListingText(13, 1, "House in Berlin", "garden", (), NOW, None, None, price="$ 900")
ASK = ListingText(14, 1, "Room in Berlin", "ask", (), NOW, None, None, price="call us")
NONE = ListingText(15, 1, "Studio in Berlin", "", (), NOW, None, None)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("berlin price:<1500", [11, 13]),
        ("berlin price:<1250", [13]),
        ("berlin price:<=1250", [11, 13]),
        ("berlin price:>1250", [12]),
        ("berlin price:>=1250", [11, 12]),
        ("berlin price:1250", [11]),
        ("berlin price:1000..2000", [11, 12]),  # both ends included
        ("berlin price:1250..1999", [11, 12]),
        ("berlin price:..1000", [13]),
        ("berlin price:1999.5..", []),
        ("berlin currency:EUR", [11, 12]),
        ("berlin currency:€ price:<1500", [11]),  # a symbol that names one currency is its code
        ("berlin currency:$", [13]),
        ("berlin -price:<1500", [12, 14, 15]),  # without a usable price: never under any bound
        ("(flat OR loft) price:<1500 OR house", [11, 13]),
        ("berlin NOT currency:eur", [13, 14, 15]),
    ],
)
def test_price_conditions_compare_the_amount_a_page_shows(query, expected):
    assert hits(query, FLAT, LOFT, HOUSE, ASK, NONE) == expected


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("flat price:cheap", "at position 12: price:cheap is not an amount condition"),
        ("flat price:<", "price:< is not an amount condition"),
        ("flat price:€1500", "no currency"),
        ("flat price:2000..1000", "price:2000..1000 ends below where it starts"),
        ("flat price:..", "is not an amount condition"),
        ("flat price:<1,500", "at position 12: price:<1, ...: write the amount without a thousands separator"),
        ("flat price:1" + "0" * 20, "is not an amount condition"),
        ("price:<1500", "at position 1: nothing here must appear (only exclusions, a published window or amounts)"),
        ("currency:EUR", "nothing here must appear"),
        ("flat currency:", "currency: needs a value right after the colon"),
    ],
)
def test_a_malformed_price_condition_is_refused_naming_the_position(query, message):
    with pytest.raises(QueryError) as error:
        compile_query(query, SOURCES)
    assert message in str(error.value)


def test_a_price_condition_says_why_it_matched():
    from pipeline.notify.matching import reasons

    assert reasons(compile_query("berlin price:<1500"), FLAT, NOW) == ("berlin (title)", "price €1,250")
    assert reasons(compile_query("berlin -price:<1000"), FLAT, NOW) == ("berlin (title)", "without price:<1000")

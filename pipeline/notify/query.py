"""The filter language (README, "Filters"): parsed once, at ``filters add``
and when the notifier loads filters, and compiled to clauses the set-based matcher files
by one of their words (pipeline/notify/matching.py).

    python remote                  every word, whole word, case-insensitive (the default)
    "machine learning"             an exact phrase: its words in a row
    -senior  -"full time"          a word or phrase that must not appear
    NOT senior  NOT (php OR perl)  the same as -
    rust OR go   (rust OR go) remote   alternatives; AND binds tighter than OR
    title:python  summary:"data engineer"  author:smith  title:(rust OR go)
    category:remote  source:12  source:"Hacker News"
    published:7d  published:24h  published:2026-01-01..2026-01-31  published:2026-03-01..
    price:<1500  price:<=1500  price:>1000  price:1000..2000  currency:EUR  currency:€
    salary:>=80000  area:>=60  rooms:3..4  location:berlin  company:"acme corp"

Words and phrases without a field look in the title and the summary (a phrase in one of
them, not across the two). ``category:`` is one of the listing's categories, whole and
case-insensitive; ``source:`` a source's id or name; ``published:`` a window of the
listing's publication time (UTC days, both ends included; ``7d``/``24h``/``2w`` reach back
from the moment of matching), which a listing without a date is never in; ``price:`` its
price's amount (pipeline/core/prices.py: "€1,299" is 1299; both ends of ``a..b``
included; write 1500, not 1,500) and ``currency:`` its currency (€ is EUR), which a
listing without a price that reads as an amount never has. A listing's fields
(pipeline/core/fields.py, from its page's structured data or its source's selectors):
``salary:`` a year's salary, holding when its range reaches into the bounds (70000..90000
meets ``salary:>=80000``); ``area:`` square metres; ``rooms:``; ``location:`` and
``company:`` words of them (as ``author:``); a listing without the field never meets it.
``AND``,
``OR`` and ``NOT`` are operators in any case ("python or rust"; juxtaposition already
means AND): to look for one of those words, quote it (``"or"``); commas
separate like spaces. Every alternative needs something that must appear (a word, a
phrase, an author, a category, a source, a location or a company): that is what it is
filed under, and a filter
of exclusions (or of windows and prices) alone would match nearly everything. A filter is at most ``MAX_CHARS``
characters, ``MAX_TERMS`` conditions and ``MAX_DEPTH`` nested parentheses.

Compiling turns the expression into alternatives of plain conditions (negations pushed
inward, parentheses multiplied out, at most ``MAX_CLAUSES``); a listing matches when
every condition of one alternative holds.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from itertools import product

from pipeline.core.errors import QueryError
from pipeline.core.inputs import as_id
from pipeline.core.prices import currency_code
from pipeline.core.words import WORD, folded, normalised, phrase_tokens

__all__ = ["Clause", "Condition", "Query", "QueryError", "as_written", "compile_query", "parse", "plain",
           "source_terms"]

MAX_CHARS = 1000  # a filter as written
MAX_TERMS = 40  # conditions written in one filter
MAX_DEPTH = 8  # parentheses inside parentheses
MAX_CLAUSES = 32  # alternatives after multiplying out parentheses
MAX_TERM_CHARS = 200
MAX_KEYWORD_CHARS = 100


class Field(StrEnum):
    TEXT = "text"  # title or summary: no field written
    TITLE = "title"
    SUMMARY = "summary"
    AUTHOR = "author"
    CATEGORY = "category"
    SOURCE = "source"
    PUBLISHED = "published"
    PRICE = "price"
    CURRENCY = "currency"
    SALARY = "salary"
    AREA = "area"
    ROOMS = "rooms"
    LOCATION = "location"
    COMPANY = "company"


WRITTEN_FIELDS = tuple(f for f in Field if f is not Field.TEXT)
# Conditions on an amount (``Bounds``).
AMOUNT_FIELDS = (Field.PRICE, Field.SALARY, Field.AREA, Field.ROOMS)


# -- the expression ---------------------------------------------------------------------

@dataclass(frozen=True)
class Term:
    """One condition as written: ``words`` for a text field (one word, or a phrase's
    words), ``value`` for a category, a source or a currency, ``window`` for published,
    ``bounds`` for a price."""

    field: Field
    position: int
    words: tuple[str, ...] = ()
    phrase: bool = False
    value: str = ""
    window: Window | None = None
    bounds: Bounds | None = None


# How far ahead of the moment of matching a publication time may be and still count as
# "within the last 7d" (a publisher's clock or time zone a little off). Dates further
# ahead are stored as given (pipeline/listings/normalize.py) but are in no such window.
CLOCK_SKEW = timedelta(days=1)


@dataclass(frozen=True)
class Window:
    """Published at or after ``start`` and before ``end`` (either open); or within the
    last ``back`` of the moment of matching."""

    start: datetime | None = None
    end: datetime | None = None
    back: timedelta | None = None

    def holds(self, published_at: datetime | None, now: datetime) -> bool:
        if published_at is None:
            return False
        if self.back is not None:  # the last ``back``: a date further ahead than a clock's skew is not in it
            return now - self.back <= published_at <= now + CLOCK_SKEW
        return (self.start is None or published_at >= self.start) and (self.end is None or published_at < self.end)


@dataclass(frozen=True)
class Bounds:
    """An amount from ``low`` to ``high`` (either open-ended), each end included unless
    ``*_excluded`` (``<`` and ``>``)."""

    low: Decimal | None = None
    high: Decimal | None = None
    low_excluded: bool = False
    high_excluded: bool = False

    def holds(self, amount: Decimal | None) -> bool:
        if amount is None:
            return False
        if self.low is not None and (amount < self.low or (self.low_excluded and amount == self.low)):
            return False
        return self.high is None or not (amount > self.high or (self.high_excluded and amount == self.high))

    def reaches(self, low: Decimal | None, high: Decimal | None) -> bool:
        """Does some amount from ``low`` to ``high`` hold (a salary's range reaching into
        the bounds)?"""
        if low is None or high is None:
            return False
        return (replace(self, high=None, high_excluded=False).holds(high)
                and replace(self, low=None, low_excluded=False).holds(low))

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low}..{self.high}" if self.low != self.high else str(self.low)
        if self.low is not None:
            return f"{'>' if self.low_excluded else '>='}{self.low}"
        return f"{'<' if self.high_excluded else '<='}{self.high}"


@dataclass(frozen=True)
class Not:
    node: Node


@dataclass(frozen=True)
class And:
    nodes: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    nodes: tuple[Node, ...]


Node = Term | Not | And | Or


# -- parsing ----------------------------------------------------------------------------

_TOKEN = re.compile(
    r'(?P<space>[\s,]+)|(?P<open>\()|(?P<close>\))|(?P<quote>"[^"]*"?)'
    r'|(?P<bare>[^\s,()"]+)'
)
OPERATORS = ("AND", "OR", "NOT")  # in any case: quote one to look for the word
_FIELD = re.compile(r"([A-Za-z]+):(.*)", re.DOTALL)
_BACK = re.compile(r"(\d{1,5})([hdw])")
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}


@dataclass
class _Tok:
    kind: str  # open close quote bare or and minus
    text: str
    position: int  # 1-based


def _tokens(text: str) -> list[_Tok]:
    found: list[_Tok] = []
    for m in _TOKEN.finditer(text):
        kind, value, pos = m.lastgroup or "", m.group(), m.start() + 1
        if kind == "space":
            continue
        if kind == "quote" and (len(value) < 2 or not value.endswith('"')):
            raise QueryError('this " is never closed', pos)
        if kind == "bare" and value.upper() in OPERATORS:
            kind = value.lower()
        elif kind == "bare" and value.startswith("-"):
            found.append(_Tok("minus", "-", pos))
            value, pos = value[1:], pos + 1
            if not value:  # "-(" or '-"': the term follows as a token of its own
                if text[m.end():m.end() + 1] in ("", ")") or text[m.end()].isspace() or text[m.end()] == ",":
                    raise QueryError("- must stand right before the word, phrase or ( it excludes", pos - 1)
                continue
        found.append(_Tok(kind, value, pos))
    return found


@dataclass
class _Parser:
    text: str
    toks: list[_Tok]
    at: int = 0
    terms: int = 0
    depth: int = 0  # parentheses open around the token read
    sources: list[Term] = field(default_factory=list)

    def peek(self) -> _Tok | None:
        return self.toks[self.at] if self.at < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.toks[self.at]
        self.at += 1
        return tok

    def end_position(self) -> int:
        return len(self.text.rstrip()) + 1

    def expression(self, scope: Field | None) -> Node:
        alternatives = [self.conjunction(scope)]
        while (tok := self.peek()) is not None and tok.kind == "or":
            self.take()
            nxt = self.peek()
            if nxt is None or nxt.kind in ("or", "close"):
                raise QueryError("OR needs a condition after it", nxt.position if nxt else self.end_position())
            alternatives.append(self.conjunction(scope))
        return alternatives[0] if len(alternatives) == 1 else Or(tuple(alternatives))

    def conjunction(self, scope: Field | None) -> Node:
        parts: list[Node] = []
        while (tok := self.peek()) is not None and tok.kind not in ("or", "close"):
            if tok.kind == "and":
                self.take()
                nxt = self.peek()
                if nxt is None or nxt.kind in ("or", "and", "close"):
                    raise QueryError("AND needs a condition after it", nxt.position if nxt else self.end_position())
                continue
            parts.append(self.unary(scope))
        if not parts:
            tok = self.peek()
            if tok is None:
                raise QueryError("a condition is missing here", self.end_position())
            raise QueryError(f"{tok.text!r} needs a condition before it", tok.position)
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def unary(self, scope: Field | None) -> Node:
        tok = self.peek()
        if tok is not None and tok.kind in ("minus", "not"):
            self.take()
            nxt = self.peek()
            if nxt is None or nxt.kind in ("or", "and", "close", "minus", "not"):
                raise QueryError("NOT needs a word, phrase or ( after it" if tok.kind == "not"
                                 else "- must stand right before the word, phrase or ( it excludes", tok.position)
            return Not(self.atom(scope))
        return self.atom(scope)

    def atom(self, scope: Field | None) -> Node:
        tok = self.take()
        if tok.kind == "open":
            return self.group(tok, scope)
        if tok.kind == "close":
            raise QueryError("this ) has no ( before it", tok.position)
        if tok.kind == "quote":
            return self.term(scope or Field.TEXT, tok.text[1:-1], tok.position, quoted=True)
        m = _FIELD.fullmatch(tok.text)
        if m is None:
            return self.term(scope or Field.TEXT, tok.text, tok.position, quoted=False)
        name, value = m.group(1).lower(), m.group(2)
        if name not in WRITTEN_FIELDS:
            raise QueryError(
                f"unknown field {m.group(1)!r} (fields: {', '.join(WRITTEN_FIELDS)})", tok.position)
        if scope is not None:
            raise QueryError(f"{name}: inside {scope}:( ) (one field per group)", tok.position)
        fld, value_at = Field(name), tok.position + len(name) + 1
        if value:
            return self.term(fld, value, value_at, quoted=False, start=tok.position)
        nxt = self.peek()
        if nxt is None or nxt.position != value_at or nxt.kind not in ("quote", "open"):
            raise QueryError(f"{name}: needs a value right after the colon", tok.position)
        self.take()
        if nxt.kind == "open":
            return self.group(nxt, fld)
        return self.term(fld, nxt.text[1:-1], nxt.position, quoted=True, start=tok.position)

    def group(self, opening: _Tok, scope: Field | None) -> Node:
        if (tok := self.peek()) is None or tok.kind == "close":
            raise QueryError("empty parentheses" if tok else "this ( is never closed", opening.position)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise QueryError(f"parentheses nest at most {MAX_DEPTH} deep", opening.position)
        node = self.expression(scope)
        self.depth -= 1
        tok = self.peek()
        if tok is None or tok.kind != "close":
            raise QueryError("this ( is never closed", opening.position)
        self.take()
        return node

    def term(self, fld: Field, value: str, position: int, *, quoted: bool, start: int | None = None) -> Term:
        """The term of ``value`` (at ``position``), written from ``start`` (its field)."""
        at = start or position
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise QueryError(f"a filter takes at most {MAX_TERMS} conditions", position)
        if len(value) > MAX_TERM_CHARS:
            raise QueryError(f"a condition is at most {MAX_TERM_CHARS} characters", position)
        if fld is Field.PUBLISHED:
            return Term(fld, at, window=_window(value, position))
        if fld in AMOUNT_FIELDS:
            after = position - 1 + len(value)  # positions count from 1
            if not quoted and self.text[after:after + 1] == ",":
                raise QueryError(f"{fld}:{value}, ...: write the amount without a thousands separator"
                                 " (1500, not 1,500)", position)
            return Term(fld, at, bounds=_bounds(fld, value, position))
        if fld is Field.CURRENCY:
            code = currency_code(value.strip())
            if not code or len(code) > 8:
                raise QueryError(f"currency:{value} is not a currency (EUR, USD, €, ...)", position)
            return Term(fld, at, value=code)
        if fld in (Field.CATEGORY, Field.SOURCE):
            value = folded(value)
            if not value:
                raise QueryError(f"{fld}: needs a value", position)
            term = Term(fld, at, value=value)
            if fld is Field.SOURCE:
                self.sources.append(term)
            return term
        if quoted:
            tokens = phrase_tokens(value)
            if not tokens:
                raise QueryError("a phrase needs at least one word", position)
            return Term(fld, at, words=tokens, phrase=True)
        keyword = normalised(value)
        if len(keyword) > MAX_KEYWORD_CHARS or not WORD.fullmatch(keyword):
            raise QueryError(
                f"{value!r} is not a word (letters and digits, optionally joined by . + # ' -"
                ' as in node.js or c++; quote a phrase: "..." )', position)
        return Term(fld, at, words=(keyword,))


def _day(text: str, position: int) -> datetime:
    try:
        return datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
    except ValueError:
        raise QueryError(f"{text!r} is not a date (YYYY-MM-DD)", position) from None


def _window(value: str, position: int) -> Window:
    if m := _BACK.fullmatch(value):
        return Window(back=int(m.group(1)) * _UNITS[m.group(2)])
    if ".." in value:
        first, _, last = value.partition("..")
        if not first and not last:
            raise QueryError("published:.. needs a date on at least one side", position)
        start = _day(first, position) if first else None
        end = _day_after(_day(last, position + len(first) + 2)) if last else None
        if start and end and end <= start:
            raise QueryError(f"published:{value} ends before it starts", position)
        return Window(start=start, end=end)
    start = _day(value, position)
    return Window(start=start, end=_day_after(start))


_AMOUNT = r"\d{1,15}(?:\.\d{1,4})?"
_COMPARED = re.compile(rf"(<=|>=|<|>|=)?({_AMOUNT})")
_BETWEEN = re.compile(rf"({_AMOUNT})?\.\.({_AMOUNT})?")


def _bounds(fld: Field, value: str, position: int) -> Bounds:
    if m := _COMPARED.fullmatch(value):
        sign, amount = m.group(1) or "=", Decimal(m.group(2))
        return {
            "<": Bounds(high=amount, high_excluded=True), "<=": Bounds(high=amount),
            ">": Bounds(low=amount, low_excluded=True), ">=": Bounds(low=amount), "=": Bounds(amount, amount),
        }[sign]
    if (m := _BETWEEN.fullmatch(value)) and (m.group(1) or m.group(2)):
        low, high = (Decimal(g) if g else None for g in m.groups())
        if low is not None and high is not None and high < low:
            raise QueryError(f"{fld}:{value} ends below where it starts", position)
        return Bounds(low, high)
    raise QueryError(
        f"{fld}:{value} is not an amount condition (<1500, <=1500, >1000, >=1000, 1000..2000, 1500;"
        " digits and a decimal point, no currency or unit)", position)


def _day_after(day: datetime) -> datetime | None:
    """The start of the next day; None (no end) after the last day a datetime holds."""
    return None if day.date() == date.max else day + timedelta(days=1)


def parse(text: str) -> Node:
    """The expression ``text`` writes; QueryError naming the position of what is wrong.
    Bounded (``MAX_CHARS``, ``MAX_TERMS``, ``MAX_DEPTH``): compiling and matching what
    parses never recurse deeper than the parentheses allowed."""
    if len(text) > MAX_CHARS:
        raise QueryError(f"a filter is at most {MAX_CHARS:,} characters; this one has {len(text):,}")
    parser = _Parser(text, _tokens(text))
    if not parser.toks:
        raise QueryError("a filter needs at least one word")
    node = parser.expression(None)
    if (tok := parser.peek()) is not None:  # only a stray ) stops an expression early
        raise QueryError("this ) has no ( before it", tok.position)
    return node


def source_terms(node: Node) -> list[Term]:
    """The ``source:`` conditions of ``node``, for checking that each names a source."""
    if isinstance(node, Term):
        return [node] if node.field is Field.SOURCE else []
    if isinstance(node, Not):
        return source_terms(node.node)
    return [t for n in node.nodes for t in source_terms(n)]


# -- compiling --------------------------------------------------------------------------

@dataclass(frozen=True)
class Condition:
    """A term of one alternative, possibly negated, with what it is compared with
    resolved: a source's names become ids."""

    term: Term
    negated: bool
    source_ids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Clause:
    """One alternative: ``words`` must all be among the listing's words (title and
    summary; all a plain filter needs, and for a phrase or a title word the cheap test
    that comes first), none of ``absent`` may be, and every one of ``checks`` must hold.
    ``filings``: the key sets the clause may be filed under (a listing that matches holds
    every key of each set), one per condition that must appear."""

    words: tuple[str, ...]
    absent: tuple[str, ...]
    checks: tuple[Condition, ...]
    filings: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Query:
    text: str
    clauses: tuple[Clause, ...]

    @property
    def words(self) -> tuple[str, ...]:
        """The words and phrase words that must appear somewhere, for display."""
        seen: dict[str, None] = {}
        for clause in self.clauses:
            seen.update(dict.fromkeys(clause.words))
            for c in clause.checks:
                if not c.negated:
                    seen.update(dict.fromkeys(c.term.words))
        return tuple(seen)


# Index keys: a word of the title and summary is its own key; the other fields' keys carry
# a prefix no word can hold.
AUTHOR_KEY, CATEGORY_KEY, SOURCE_KEY = "\x00a:", "\x00c:", "\x00s:"
LOCATION_KEY, COMPANY_KEY = "\x00l:", "\x00o:"
WORD_KEYS = {Field.AUTHOR: AUTHOR_KEY, Field.LOCATION: LOCATION_KEY, Field.COMPANY: COMPANY_KEY}


def _nnf(node: Node, negated: bool = False) -> Node:
    """``node`` with every negation pushed onto a term (De Morgan)."""
    if isinstance(node, Not):
        return _nnf(node.node, not negated)
    if isinstance(node, Term):
        return Not(node) if negated else node
    parts = tuple(_nnf(n, negated) for n in node.nodes)
    return (Or(parts) if isinstance(node, And) else And(parts)) if negated else type(node)(parts)


def _dnf(node: Node) -> list[list[tuple[Term, bool]]]:
    """Alternatives of (term, negated), for a node in negation normal form."""
    if isinstance(node, Term):
        return [[(node, False)]]
    if isinstance(node, Not):
        assert isinstance(node.node, Term)
        return [[(node.node, True)]]
    if isinstance(node, Or):
        return [alt for n in node.nodes for alt in _dnf(n)]
    result: list[list[tuple[Term, bool]]] = [[]]
    for n in node.nodes:
        options = _dnf(n)
        if len(result) * len(options) > MAX_CLAUSES:
            raise QueryError(
                f"over {MAX_CLAUSES} alternatives once the parentheses are multiplied out;"
                " split it into several filters")
        result = [a + b for a, b in product(result, options)]
    return result


def _key(term: Term, word: str) -> str:
    return WORD_KEYS.get(term.field, "") + word


def _clause(alternative: list[tuple[Term, bool]], sources: Mapping[str, frozenset[int]]) -> Clause | None:
    """The clause of one alternative; None when it contradicts itself (x and -x)."""
    unique: dict[tuple[object, ...], tuple[Term, bool]] = {}
    signs: dict[tuple[object, ...], bool] = {}
    for t, neg in alternative:  # the first of each, in the order written
        what = (t.field, t.words, t.phrase, t.value, t.window, t.bounds)
        if signs.setdefault(what, neg) != neg:
            return None
        unique.setdefault((*what, neg), (t, neg))
    words: list[str] = []
    absent: list[str] = []
    checks: list[Condition] = []
    filings: list[tuple[str, ...]] = []
    for term, neg in sorted(unique.values(), key=lambda tn: tn[0].position):
        plain_word = term.field is Field.TEXT and not term.phrase
        if plain_word:  # a word of the title or summary: no check beyond the set of words
            (absent if neg else words).append(term.words[0])
            if not neg:
                filings.append(term.words)
            continue
        if not neg and term.field in (Field.TEXT, Field.TITLE, Field.SUMMARY):
            words.extend(term.words)  # needed among the words before the phrase or field is read
        ids: frozenset[int] = frozenset()
        if term.field is Field.SOURCE:
            ids = sources.get(term.value, frozenset())
            if (source_id := as_id(term.value)) is not None:
                ids |= {source_id}
        checks.append(Condition(term, neg, ids))
        if neg:
            continue
        if term.words:  # a phrase or a scoped word: every word of it is a key
            filings.extend((_key(term, w),) for w in dict.fromkeys(term.words))
        elif term.field is Field.CATEGORY:
            filings.append((CATEGORY_KEY + term.value,))
        elif term.field is Field.SOURCE and ids:  # one of them: filed under each
            filings.append(tuple(SOURCE_KEY + str(i) for i in sorted(ids)))
    if not filings and not any(c.term.field is Field.SOURCE and not c.negated for c in checks):
        first = min(t.position for t, _ in alternative)
        raise QueryError(
            "nothing here must appear (only exclusions, a published window or amounts), so it would match"
            " nearly every listing: add a word, phrase, author, category, source, location or company", first)
    return Clause(tuple(dict.fromkeys(words)), tuple(absent), tuple(checks), tuple(filings))


def only_from(query: Query, source_ids: Collection[int]) -> bool:
    """Whether every listing ``query`` can match comes from one of ``source_ids``, named
    by id: each alternative needs a ``source:12`` (a number; resolved, every source it
    names) among them. A filter that is (``sources remove``) ends with them; one naming
    them by name only, or beside other alternatives, does not."""
    gone = frozenset(source_ids)
    return all(
        any(c.term.field is Field.SOURCE and not c.negated and as_id(c.term.value) is not None
            and c.source_ids <= gone for c in clause.checks)
        for clause in query.clauses
    )


def compile_query(text: str, sources: Mapping[str, frozenset[int]] | None = None) -> Query:
    """``text`` compiled to clauses. ``sources`` maps a source's name, case-folded, to the
    ids of the sources of that name (``source:`` by name); a ``source:`` that names no
    source matches nothing."""
    alternatives = _dnf(_nnf(parse(text)))
    clauses = [c for alt in alternatives if (c := _clause(alt, sources or {})) is not None]
    if not clauses:
        raise QueryError("this filter can never match (it asks for a condition and its exclusion)")
    return Query(text.strip(), tuple(dict.fromkeys(clauses)))


def as_written(query: str | None, keywords: Sequence[str] | None) -> str:
    """A stored filter as its user reads it: its query, or for a filter from before the
    language (no query) its keywords, which mean the same."""
    return query or " ".join(keywords or ())


def plain(keywords: Sequence[str]) -> Query:
    """The query of a filter of keywords alone (every one must appear), as filters were
    before the language; their words are already checked and case-folded."""
    return Query(" ".join(keywords), (Clause(tuple(keywords), (), (), tuple((k,) for k in keywords)),))

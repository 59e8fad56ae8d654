"""One alert per story across sources: which new listings are a story another source
already brought, and the clusters they form (docs/runbook.md, "One alert per story").

Two listings **from different sources** are the same story when

* their links name the same story (``story_url``, pipeline/core/urls.py: the canonical
  URL less tracking parameters such as ``utm_*``; never a site's home page), except
  that an item on its link's own site never joins a story an off-site item began (a
  source linking another site's article first, under its own title, would title it),
  and two off-site items' titles must overlap (``titles_overlap``: the link is either
  one's claim), or
* their texts are near-identical: the 64-bit SimHash (Charikar 2002; the thresholds of
  Manku, Jain and Das Sarma 2007) of the distinct words of title and summary, less the
  phrases their source repeats in every item (pipeline/listings/boilerplate.py), differ
  in at most ``MAX_DISTANCE`` bits. A text of fewer than ``MIN_WORDS`` distinct words has
  no fingerprint (too short to tell a copy from a namesake): only its link can join it.

Listings of one source are never joined by these rules: a source's own item identity
(its ids, pipeline/core/urls.py ``item_key``) says what its items are, and two job ads of
one board that differ in a salary are two jobs.

A cluster is named by the id of its first listing; that listing keeps ``cluster_id``
NULL ("its own story", the common case, costs no write) and each later member records
the cluster in ``cluster_id``: the earliest cluster any of its matches belongs to.
Membership is decided once, when the listing is first stored, and never moves: a
cluster is not split when a title is edited, nor merged when a later listing resembles
two. The notifier notifies a user once per cluster (``notifications.cluster_id``).

Finding matches: each listing has keys, columns of its own row with an index each
(``schema.STORY_KEYS``): its story URL's hash and its fingerprint's four 16-bit bands
(two fingerprints within 3 bits of each other agree on at least one band: pigeonhole),
so candidates are found by index, never by a scan.

Two processors storing two copies of one story at once must not both found a cluster:
the part of a batch's transaction that looks for matches and records them holds the
one row of ``story_lock`` (FOR UPDATE) until it commits, so the second sees the first's
listings. (Per-key locks would be finer, but a batch of hundreds of listings has keys
in nearly every band: they would serialise the same.) SQLite has one writer at a
time, which the batch already is.
"""

from __future__ import annotations

import functools
import hashlib
import string
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.backends.recent import Asking, RecentPerKey
from pipeline.core.urls import offsite, story_url
from pipeline.core.words import normalised
from pipeline.listings.boilerplate import NONE, Runs, without
from pipeline.listings.normalize import Listing
from pipeline.storage import schema

BITS = 64
MAX_DISTANCE = 3  # bits of 64 in which two near-identical texts' fingerprints may differ
BANDS = 4  # MAX_DISTANCE + 1 bands: two fingerprints within the distance share one
BAND_BITS = BITS // BANDS
MIN_WORDS = 8  # distinct words a text needs to have a fingerprint
# Copies are looked for among the most recent listings filed under each key: a bound on
# the work a key shared by very many listings (a template, a flood) can cause.
RECENT_PER_KEY = 20
MAX_WORDS = 255  # the first distinct words counted: a count per bit fits a byte
assert len(schema.STORY_KEYS) == 1 + BANDS  # the link's key, then the bands


# What separates words for a fingerprint: white space and punctuation. (Cheaper than
# the filters' whole-word rule, pipeline/core/words.py, and a fingerprint needs no
# compound words: a copy splits them the same way.)
_SEPARATORS = str.maketrans(dict.fromkeys(string.punctuation + "\u2018\u2019\u201c\u201d\u00ab\u00bb\u2013\u2014\u2026\u00b7\u2022", " "))


def fingerprint(title: str, summary: str, *, boilerplate: Runs = NONE) -> int | None:
    """The ``simhash`` of the words of ``title`` and ``summary``, less its source's
    ``boilerplate`` (pipeline/listings/boilerplate.py)."""
    return simhash(without(text_words(f"{title} {summary}"), boilerplate))


def simhash(words: Sequence[str]) -> int | None:
    """The SimHash of the distinct ``words`` (case-folded, in order, the first
    ``MAX_WORDS``): bit i is set when more than half of the words' hashes have bit i
    set. None for fewer than ``MIN_WORDS`` distinct words."""
    distinct = list(dict.fromkeys(words))[:MAX_WORDS]
    if len(distinct) < MIN_WORDS:
        return None
    # Each word's hash spread one bit to a byte; summing them counts, per bit, how many
    # words set it (at most 255: no byte overflows into the next).
    counts = sum(map(_spread, distinct)).to_bytes(BITS, "little")
    return int(counts.translate(_MAJORITY[len(distinct)])[::-1], 2)


@functools.lru_cache(maxsize=1 << 16)
def _spread(word: str) -> int:
    """``word``'s 64-bit hash with bit i moved to bit 8 * i (one byte per bit)."""
    digest = hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(b"".join(_BYTE_BITS[b] for b in digest), "little")


# _BYTE_BITS[b]: the 8 bits of b, low first, one byte each (0 or 1).
_BYTE_BITS = [bytes((b >> i) & 1 for i in range(8)) for b in range(256)]
# _MAJORITY[n]: maps a count of n words to the character "1" when it is more than half.
_MAJORITY = [bytes(ord("1") if 2 * count > n else ord("0") for count in range(256)) for n in range(MAX_WORDS + 1)]


def distance(a: int, b: int) -> int:
    """How many bits two fingerprints differ in."""
    return (a ^ b).bit_count()


def to_signed(value: int) -> int:
    """A 64-bit fingerprint as the signed BIGINT a database stores."""
    return value - (1 << BITS) if value >= 1 << (BITS - 1) else value


def from_signed(value: int) -> int:
    return value & ((1 << BITS) - 1)


def url_key(canonical_url: str | None) -> int | None:
    """The key of a listing's story URL (None when it has no link, or its link names no
    story): 62 bits of its hash (a BIGINT, and revision 0015 carried the older keys over)."""
    story = story_url(canonical_url) if canonical_url else None
    if story is None:
        return None
    return int.from_bytes(hashlib.sha256(story.encode("utf-8", "surrogatepass")).digest()[:8], "big") >> 2


def bands(print_: int) -> tuple[int, ...]:
    """The fingerprint's ``BANDS`` bands of ``BAND_BITS`` bits, lowest first."""
    mask = (1 << BAND_BITS) - 1
    return tuple((print_ >> (band * BAND_BITS)) & mask for band in range(BANDS))


@dataclass(frozen=True)
class Marks:
    """What tells a listing's story: its link's key, its text's fingerprint, its title."""

    url_key: int | None
    fingerprint: int | None  # unsigned
    title_words: frozenset[str]  # of its own title (none when the title is its link)
    # Its link is on another site than its source's (an aggregator's item, or a hostile
    # source's linking a real article under its own title): the link's own site's item
    # never joins its story by that link (``same_story``).
    offsite: bool = False

    @classmethod
    def of(cls, listing: Listing, source_url: str | None = None, *,
           words: Sequence[str] | None = None, boilerplate: Runs = NONE) -> Marks:
        """A listing's marks, taken from its content; ``source_url``: its source's;
        ``words``: its ``words_of`` where the caller has them; ``boilerplate``: its
        source's (pipeline/listings/boilerplate.py), left out of its fingerprint."""
        title = own_title(listing.title, listing.url)
        text = cls.words_of(listing) if words is None else words
        return cls(url_key(listing.canonical_url), simhash(without(text, boilerplate)), frozenset(text_words(title)),
                   offsite(listing.canonical_url, source_url, canonical=True))

    @staticmethod
    def words_of(listing: Listing) -> list[str]:
        """The words of ``listing``'s title and summary, in order, as ``of`` takes them."""
        return stored_words(listing.title, listing.summary, listing.url)

    @classmethod
    def stored(cls, story_key: int | None, simhash: int | None, title: str, url: str,
               source_url: str | None = None) -> Marks:
        """A stored listing's marks, from its row (and its source's URL)."""
        return cls(story_key, None if simhash is None else from_signed(simhash),
                   frozenset(text_words(own_title(title, url))), offsite(url, source_url))

    @functools.cached_property
    def keys(self) -> dict[str, int]:
        """Its story keys, column (``schema.STORY_KEYS``) -> value, those it has."""
        keys = {} if self.url_key is None else {schema.STORY_KEYS[0]: self.url_key}
        if self.fingerprint is not None:
            keys.update(zip(schema.STORY_KEYS[1:], bands(self.fingerprint), strict=True))
        return keys

    def columns(self) -> dict[str, int | None]:
        """Its fingerprint and keys, as the listing's row stores them."""
        return {"simhash": None if self.fingerprint is None else to_signed(self.fingerprint),
                **dict.fromkeys(schema.STORY_KEYS), **self.keys}


@dataclass(frozen=True)
class NewListing:
    """A listing just inserted (or, in ``_candidates``, stored before), with what
    clustering needs of it."""

    id: int
    source_id: int
    marks: Marks
    cluster: int | None = None  # a stored listing's cluster: its cluster_id, or its id


def same_story(a: NewListing, b: NewListing) -> bool:
    """Whether ``a`` is the story of ``b``, stored before it (the module docstring's
    rules). By link, unless ``a`` is on its link's own site and ``b`` is not: a story an
    off-site item began is never the one its link's own site's item joins, so a source
    linking someone's article first, under a title of its own, cannot title it."""
    if a.source_id == b.source_id:
        return False
    x, y = a.marks, b.marks
    if (x.url_key is not None and x.url_key == y.url_key and (x.offsite or not y.offsite)
            and (not (x.offsite and y.offsite) or titles_overlap(x.title_words, y.title_words))):
        return True
    return (x.fingerprint is not None and y.fingerprint is not None
            and distance(x.fingerprint, y.fingerprint) <= MAX_DISTANCE and titles_agree(x.title_words, y.title_words))


def stored_words(title: str, summary: str, url: str) -> list[str]:
    """The words of a listing's title and summary, in order (``Marks.words_of``), from its
    stored columns."""
    return text_words(f"{own_title(title, url)} {summary}")


def own_title(title: str, url: str) -> str:
    """A listing's title, or "" when it is its link (the normaliser's stand-in)."""
    return "" if title == url else title


def titles_overlap(x: frozenset[str], y: frozenset[str]) -> bool:
    """Whether two off-site items' titles say one story: at least half the words of the
    shorter are in the other. Neither item is on its link's site, so the link alone is
    anyone's claim: an aggregator carrying another site's story URL under a text of its
    own, stored first, took in a later aggregator's honest item and told it in its
    words. Two aggregators' headlines of one story share its names ("PostgreSQL 18 is
    out", "PostgreSQL 18 released"); a title of no words of its own says nothing."""
    if not x or not y:
        return False
    shorter, longer = (x, y) if len(x) <= len(y) else (y, x)
    return 2 * len(shorter & longer) >= len(shorter)


def titles_agree(x: frozenset[str], y: frozenset[str]) -> bool:
    """Whether two titles can be one story's: every word of the shorter is in the other
    (the same words in another case or punctuation, an outlet's name or a prefix
    added), or one has no title of its own. Items of one template have near-identical
    texts under titles apart: a boilerplate summary under "BondiBlock" and
    "SynthaBlock", "Release 3.14" and "Release 3.15"; an edited title is missed rather
    than a story wrongly joined (a repeat, not a lost alert)."""
    return not x or not y or x <= y or y <= x


def text_words(text: str) -> list[str]:
    """The words of ``text`` as fingerprints and titles count them: normalised as the
    filters' words are (pipeline/core/words.py), split at white space and punctuation."""
    return normalised(text).translate(_SEPARATORS).split()


def assign(conn: sa.Connection, new: Sequence[NewListing]) -> int:
    """Record, for each of ``new`` (listings inserted in this transaction, their keys
    stored with them (``Marks.columns``), in the order they were stored) that is a story
    already seen from another source, its cluster. Returns how many joined a cluster."""
    keyed = [listing for listing in new if listing.marks.keys]
    if not keyed:
        return 0
    conn.execute(backend_for(conn).serialising_lock(schema.story_lock))  # held until commit
    # Per key, its most recent listings (``RECENT_PER_KEY``), oldest first: those stored
    # before, then this batch's in order, each with its cluster. Most keys are asked by
    # one listing and hold none: a key gets its list when it first gets a listing.
    recent: dict[tuple[str, int], list[tuple[NewListing, int]]] = {}
    for key, stored in _candidates(conn, keyed):
        _remember(recent, key, recent.get(key), (stored, stored.cluster or stored.id))
    joined: dict[int, int] = {}  # listing id -> its cluster
    for listing in keyed:
        keys = listing.marks.keys.items()
        lists = [recent.get(key) for key in keys]
        clusters = []
        if any(lists):
            # Each listing once, though it shares several keys (a near copy shares bands).
            others = {other.id: (other, cluster) for kept in lists if kept for other, cluster in kept}
            clusters = [cluster for other, cluster in others.values() if same_story(listing, other)]
        if clusters:
            joined[listing.id] = min(clusters)
        entry = (listing, joined.get(listing.id, listing.id))
        for key, kept in zip(keys, lists, strict=True):
            _remember(recent, key, kept, entry)
    if joined:
        t = schema.listings
        conn.execute(
            sa.update(t).where(t.c.id == sa.bindparam("listing")).values(cluster_id=sa.bindparam("cluster")),
            [{"listing": listing, "cluster": cluster} for listing, cluster in joined.items()],
        )
    return len(joined)


def _remember(recent: dict[tuple[str, int], list[tuple[NewListing, int]]], key: tuple[str, int],
              kept: list[tuple[NewListing, int]] | None, entry: tuple[NewListing, int]) -> None:
    """Add ``entry`` to ``key``'s most recent listings (``kept``: ``recent[key]`` as
    read), keeping ``RECENT_PER_KEY``; most keys hold none and get their list now."""
    if kept is None:
        recent[key] = [entry]
        return
    kept.append(entry)
    if len(kept) > RECENT_PER_KEY:
        del kept[0]


def _candidates(conn: sa.Connection, keyed: Sequence[NewListing]) -> list[tuple[tuple[str, int], NewListing]]:
    """The listings stored before ``keyed`` that share a key with one of them: each key's
    ``RECENT_PER_KEY`` most recent, oldest first, with the key (column, value).

    A backend may leave out a band key's listings whose fingerprint is not within
    ``MAX_DISTANCE`` of one asking (``same_story`` would refuse them): PostgreSQL does, a
    far smaller answer when bands are crowded. Elsewhere ``same_story`` alone tells."""
    # Per key column: the values asked, and (value, fingerprint) for those with a print.
    values: dict[str, set[int]] = {column: set() for column in schema.STORY_KEYS}
    prints: dict[str, list[tuple[int, int]]] = {column: [] for column in schema.STORY_KEYS}
    for listing in keyed:
        signed = None if listing.marks.fingerprint is None else to_signed(listing.marks.fingerprint)
        for column, value in listing.marks.keys.items():
            values[column].add(value)
            if signed is not None:
                prints[column].append((value, signed))
    asking = Asking(
        values=[sorted(values[column]) for column in schema.STORY_KEYS],
        prints=[prints[column] for column in schema.STORY_KEYS],  # a band's, with their value of it
        exclude=[listing.id for listing in keyed],
    )
    found = {(row.key_number, row.key_value, row.id): row
             for row in backend_for(conn).recent_per_key(conn, _RECENT, asking)}
    s = schema.sources
    sources = {row.source_id for row in found.values()}
    source_urls = dict(conn.execute(sa.select(s.c.id, s.c.url).where(s.c.id.in_(sorted(sources)))).all()) if sources else {}
    return [
        ((schema.STORY_KEYS[number], value), NewListing(
            row.id, row.source_id,
            Marks.stored(row.story_key, row.simhash, row.title, row.url, source_urls.get(row.source_id)), row.cluster_id))
        for (number, value, _), row in sorted(found.items())
    ]


# Per story key column, the ``RECENT_PER_KEY`` most recent listings under each value
# asked, leaving out the batch's own (pipeline/backends/recent.py).
_RECENT = RecentPerKey(
    table=schema.listings, keys=tuple(schema.STORY_KEYS),
    columns=("id", "source_id", "cluster_id", "simhash", "story_key", "title", "url"),
    per_key=RECENT_PER_KEY, fingerprint="simhash", max_distance=MAX_DISTANCE,
)

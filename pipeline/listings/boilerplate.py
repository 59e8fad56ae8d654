"""A source's boilerplate: the runs of words every one of its items has, left out of
their fingerprints (pipeline/listings/stories.py).

Why: the items of one template (a job board's standard ad, "submitted by ... [link]
[comments]", a blog's "Continue reading") share most of their words, so their
fingerprints are near one another and share band keys. Each new listing's band lookup
then reads the most recent listings under its keys, only to find its own source's
siblings, which are never its story (two items of one source are two stories). Without
its source's template, a listing's fingerprint is made of its own text: a template's
items scatter over the bands.

What is left out is the template's **runs of words where they occur**, never a word
wherever it is: the runs made of phrases (``PHRASE`` words in a row) that all of a
sample of the source's items have. A language's common words ("the", "and") are in
every item too, but each in a phrase of its own, so they stay; and a word of a template
that the story's own text also has ("by" in "submitted by") stays where the story has
it. So a story's own words count the same in every source that carries it, whatever
template each wraps it in (leaving words out wherever they were set copies apart:
bench/RESULTS.md).

How it is learned, at no cost per listing in the steady state: when one processor batch
brings at least ``SAMPLE`` new listings of a source (its first fetch brings its feed's
whole window; a busy source brings several at a time), and the source has none learned
yet, or one of those listings lacks a run learned before (the template changed), or
they are ``2 * SAMPLE`` or more (a template that grew), its boilerplate is learned from
them, and their fingerprints already leave it out. A source with none learned yet whose
batch brings fewer (a small feed, whose items come one or two at a time from its first
fetch on) is learned from them and its most recent listings stored before, once it has
``SAMPLE`` in all: before, such a source never learned its template. It is kept (table
``source_words``, an empty list for "none") and written only when it changed; a
source's listings arriving one or two at a time use what was learned last (a processor's
run reads it once and uses it for up to ``processor.PLATES_KEPT`` seconds). Two
processors learning one source's at once each learn it from a sample of its listings:
whichever write lands last is as good. One source's boilerplate changes no other
source's fingerprints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.storage import schema

SAMPLE = 4  # new listings of a source in one batch from which its boilerplate is learned
PHRASE = 3  # words in a row that make a phrase

# A source's boilerplate: runs of words (each a phrase or longer), each with a space on
# either side, so that a run matches whole words only.
Runs = tuple[str, ...]
NONE: Runs = ()


@dataclass
class Boilerplate:
    """Some sources' boilerplate, as stored and as one batch learns it."""

    runs: dict[int, Runs]  # source id -> its boilerplate
    learned: dict[int, Runs]  # what this batch learned, where it differs from what was stored
    read: dict[int, Runs | None] = field(default_factory=dict)  # read from the table (None: no row)

    @classmethod
    def learn(cls, conn: sa.Connection, new: Mapping[int, Sequence[Sequence[str]]],
              words_of: Callable[[str, str, str], Sequence[str]],
              known: Mapping[int, Runs | None] | None = None) -> Boilerplate:
        """The boilerplate of the sources of ``new`` (source id -> the words of each of its
        new listings, in order: ``stories.Marks.words_of``): learned from them (and, for a
        source with none learned yet, its listings stored before) where the module
        docstring says, else as stored. ``words_of(title, summary, url)``: a stored
        listing's words, as its new ones' were taken (``stories.stored_words``).
        ``known``: what the caller read of the table before (None: no row), not read again."""
        t = schema.source_words
        known = known or {}
        unknown = sorted(new.keys() - known.keys())
        read: dict[int, Runs | None] = dict.fromkeys(unknown)
        if unknown:
            read.update((source_id, tuple(runs)) for source_id, runs in conn.execute(
                sa.select(t.c.source_id, t.c.words).where(t.c.source_id.in_(unknown))))
        found = {**known, **read}
        stored: dict[int, Runs] = {source_id: runs for source_id in new if (runs := found[source_id]) is not None}
        samples = {source_id: list(texts) for source_id, texts in new.items()
                   if source_id not in stored or len(texts) >= 2 * SAMPLE
                   or (len(texts) >= SAMPLE and not all(has(words, stored[source_id]) for words in texts))}
        for source_id, earlier in _recent(conn, [source_id for source_id, texts in samples.items()
                                                 if len(texts) < SAMPLE], words_of).items():
            samples[source_id] += earlier[:SAMPLE - len(samples[source_id])]
        learned = {source_id: common(texts) for source_id, texts in samples.items() if len(texts) >= SAMPLE}
        changed = {source_id: runs for source_id, runs in learned.items() if runs != stored.get(source_id)}
        return cls({**stored, **learned}, changed, read)

    def of(self, source_id: int) -> Runs:
        """The runs ``source_id``'s listings leave out of their fingerprints."""
        return self.runs.get(source_id, NONE)

    def save(self, conn: sa.Connection) -> None:
        """Keep what was learned where it changed (in source order)."""
        rows = [{"source_id": source_id, "words": list(self.learned[source_id])} for source_id in sorted(self.learned)]
        backend_for(conn).upsert(conn, schema.source_words, rows, ["source_id"])


def _recent(conn: sa.Connection, source_ids: Sequence[int],
            words_of: Callable[[str, str, str], Sequence[str]]) -> dict[int, list[Sequence[str]]]:
    """The words of each of ``source_ids``' ``SAMPLE`` most recent listings stored, newest
    first, for those that have ``SAMPLE``; only sources with no boilerplate learned yet
    ask (once each, when it is learned; a source with fewer listings asks again with its
    next batch, and reads those few)."""
    if not source_ids:
        return {}
    t = schema.listings
    ranked = sa.select(
        t.c.source_id, t.c.title, t.c.summary, t.c.url,
        sa.func.row_number().over(partition_by=t.c.source_id, order_by=t.c.id.desc()).label("n"),
    ).where(t.c.source_id.in_(sorted(source_ids))).subquery()
    found: dict[int, list[Sequence[str]]] = {}
    for source_id, title, summary, url in conn.execute(
        sa.select(ranked.c.source_id, ranked.c.title, ranked.c.summary, ranked.c.url)
        .where(ranked.c.n <= SAMPLE).order_by(ranked.c.source_id, ranked.c.n)
    ):
        found.setdefault(source_id, []).append(words_of(title, summary or "", url))
    return found


def _phrases(words: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """Each run of ``PHRASE`` words in a row of ``words``, in order (one starts at each
    word but the last ``PHRASE - 1``)."""
    return zip(*(words[i:] for i in range(PHRASE)), strict=False)


def _spaced(words: Sequence[str]) -> str:
    """``words`` as one text with a space on either side, as ``Runs`` are written."""
    return f" {' '.join(words)} "


def phrases_of(words: Sequence[str]) -> set[tuple[str, ...]]:
    """Each run of ``PHRASE`` words in a row of ``words``."""
    return set(_phrases(words))


def common(texts: Sequence[Sequence[str]]) -> Runs:
    """The runs of words of the first of ``texts`` (each its words in order) made of
    phrases every one of them has, that every one of them has, longest first."""
    shared = set.intersection(*map(phrases_of, texts)) if texts else set()
    if not shared:
        return NONE
    first = texts[0]
    covered = bytearray(len(first) + 1)  # a zero after the last word ends the last run
    for at, phrase in enumerate(_phrases(first)):
        if phrase in shared:
            covered[at:at + PHRASE] = b"\x01" * PHRASE
    runs: list[str] = []
    begun: int | None = None
    for i, inside in enumerate(covered):
        if inside and begun is None:
            begun = i
        elif not inside and begun is not None:
            runs.append(_spaced(first[begun:i]))
            begun = None
    others = [_spaced(words) for words in texts[1:]]
    # Longest first: ``without`` takes a run out before a shorter one inside it can break it.
    return tuple(sorted((run for run in dict.fromkeys(runs) if all(run in text for text in others)), key=len, reverse=True))


def has(words: Sequence[str], runs: Runs) -> bool:
    """Whether ``words`` has every one of ``runs``."""
    text = _spaced(words)
    return all(run in text for run in runs)


def without(words: Sequence[str], runs: Runs) -> Sequence[str]:
    """``words`` less every occurrence of ``runs`` (in their order: ``common``'s, longest first)."""
    if not runs:
        return words
    text = _spaced(words)
    for run in runs:
        while run in text:  # an occurrence right after another lost its leading space to it
            text = text.replace(run, " ")
    return text.split()

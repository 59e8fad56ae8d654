"""A source's boilerplate: the phrases every one of its items has, left out of their
fingerprints (pipeline/listings/stories.py).

Why: the items of one template (a job board's standard ad, "submitted by ... [link]
[comments]", a blog's "Continue reading") share most of their words, so their
fingerprints are near one another and share band keys. Each new listing's band lookup
then reads the most recent listings under its keys, only to find its own source's
siblings, which are never its story (two items of one source are two stories). Without
its source's template, a listing's fingerprint is made of its own text: a template's
items scatter over the bands.

What is left out is the template's **phrases where they occur**, never a word wherever
it is: every run of ``PHRASE`` words in a row that all of a sample of the source's items
have. A language's common words ("the", "and") are in every item too, but each in a
phrase of its own, so they stay; and a word of a template that the story's own text
also has ("by" in "submitted by") stays where the story has it. So a story's own words
count the same in every source that carries it, whatever template each wraps it in:
leaving words out wherever they were set copies apart (bench/RESULTS.md).

How it is learned, at no cost per listing in the steady state: when one processor batch
brings at least ``SAMPLE`` new listings of a source (its first fetch brings its feed's
whole window; a busy source brings several at a time), its boilerplate is the phrases
all of them have, and those listings' fingerprints already leave them out. The phrases
are kept (table ``source_words``) and written only when they changed; a source's
listings arriving one or two at a time use the phrases last learned. A source that
never brought ``SAMPLE`` at once has none. Two processors learning one source's
phrases at once each learn them from a sample of its listings: whichever write lands
last is as good. One source's boilerplate changes no other source's fingerprints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from pipeline.backends import backend_for
from pipeline.storage import schema

SAMPLE = 4  # new listings of a source in one batch from which its boilerplate is learned
PHRASE = 3  # words in a row that make a phrase

Phrases = frozenset[tuple[str, ...]]
NONE: Phrases = frozenset()


@dataclass
class Boilerplate:
    """Some sources' boilerplate, as stored and as one batch learns it."""

    phrases: dict[int, Phrases]  # source id -> its boilerplate
    learned: dict[int, Phrases]  # what this batch learned, where it differs from what was stored

    @classmethod
    def learn(cls, conn: sa.Connection, new: Mapping[int, Sequence[Sequence[str]]]) -> Boilerplate:
        """The boilerplate of the sources of ``new`` (source id -> the words of each of its
        new listings, in order: ``stories.Marks.words_of``): learned from them where there
        are ``SAMPLE`` or more, else as stored."""
        t = schema.source_words
        ids = sorted(new)
        stored = {source_id: frozenset(map(tuple, phrases)) for source_id, phrases in conn.execute(
            sa.select(t.c.source_id, t.c.words).where(t.c.source_id.in_(ids)))} if ids else {}
        learned = {source_id: common(texts) for source_id, texts in new.items() if len(texts) >= SAMPLE}
        changed = {source_id: phrases for source_id, phrases in learned.items() if phrases != stored.get(source_id, NONE)}
        return cls({**stored, **learned}, changed)

    def of(self, source_id: int) -> Phrases:
        """The phrases ``source_id``'s listings leave out of their fingerprints."""
        return self.phrases.get(source_id, NONE)

    def save(self, conn: sa.Connection) -> None:
        """Keep what was learned where it changed (in source order)."""
        rows = [{"source_id": source_id, "words": sorted(map(list, self.learned[source_id]))}
                for source_id in sorted(self.learned)]
        backend_for(conn).upsert(conn, schema.source_words, rows, ["source_id"])


def phrases_of(words: Sequence[str]) -> set[tuple[str, ...]]:
    """Each run of ``PHRASE`` words in a row of ``words``."""
    return set(zip(*(words[i:] for i in range(PHRASE)), strict=False))


def common(texts: Iterable[Sequence[str]]) -> Phrases:
    """The phrases every one of ``texts`` (each its words in order) has."""
    shared: set[tuple[str, ...]] | None = None
    for words in texts:
        shared = phrases_of(words) if shared is None else shared & phrases_of(words)
        if not shared:
            return NONE
    return frozenset(shared or ())


def without(words: Sequence[str], phrases: Phrases) -> Sequence[str]:
    """``words`` less every occurrence of ``phrases`` (overlapping ones too)."""
    if not phrases or len(words) < PHRASE:
        return words
    covered = bytearray(len(words))
    for start, phrase in enumerate(zip(*(words[i:] for i in range(PHRASE)), strict=False)):
        if phrase in phrases:
            covered[start:start + PHRASE] = b"\x01" * PHRASE
    return [word for word, out in zip(words, covered, strict=True) if not out]

"""The three private functions of feedparser the fast path (pipeline/fetching/quickfeed.py)
applies, so that it gives exactly the entries feedparser gives: wrapped here, once.

feedparser has no public name for them: its date parser (every registered date format,
RFC 822 to Korean), its windows-1252 repair table and its URL join (which mends a scheme
written with one slash, ``http:/host``, and gives "" for a URL urllib refuses). Copying
them would drift from feedparser; calling them under these names keeps one place to
change when feedparser does. pyproject.toml pins feedparser below 7 for them, and
tests/test_feedparser_private.py checks each against what ``feedparser.parse`` itself
gives for a feed, so a feedparser that renames or changes one fails that test by name.
"""

from __future__ import annotations

import time

from feedparser.datetimes import _parse_date
from feedparser.html import _cp1252
from feedparser.urls import _urljoin

__all__ = ["parse_date", "repair_cp1252", "urljoin"]


def parse_date(value: str) -> time.struct_time | None:
    """A feed's date as feedparser reads it (``entry.published_parsed``), UTC; None when
    no format it knows reads it."""
    parsed: time.struct_time | None = _parse_date(value)
    return parsed


def repair_cp1252(value: str) -> str:
    """``value`` with the C1 control characters a windows-1252 document sent as Latin-1
    leaves (``\\x93`` for a curly quote) turned into the characters they stand for, as
    feedparser does to text it keeps."""
    return value.translate(_cp1252)


def urljoin(base: str, url: str) -> str:
    """``url`` resolved against ``base`` as feedparser resolves links and permalink guids."""
    joined: str = _urljoin(base, url)
    return joined

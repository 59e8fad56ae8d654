"""What an operator's input may hold, before the database sees it: one rule for the
command line and for import files.

PostgreSQL refuses a NUL in text, and its error quotes the bound value it refused (an
API key, say) in a context line; a huge value can overflow an index. So text fields are
checked here, with an error naming the field, and never reach the database otherwise.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from pipeline.core.errors import UserError

TEXT_CHARS = 1000  # a name, a category, a filter's words
URL_CHARS = 2048  # what browsers and servers commonly accept
# Text that is a key (a politeness group's name, a worker's): MariaDB's InnoDB indexes
# at most 3072 bytes, 255 utf8mb4 characters of a name with room to spare.
NAME_CHARS = 255
# A source's item id (source_items' key with the source's id): a longer one is stored
# as its SHA-256 (pipeline/fetching/base.py). 760 utf8mb4 characters and a BIGINT are
# 3048 bytes, within MariaDB's 3072; it was 1000 before MariaDB (migration 0010).
MAX_ITEM_ID_CHARS = 760
# C0 control characters except tab, line feed and carriage return, DEL, the C1 controls
# (U+0080-U+009F: NEL, U+0085, ends a line wherever Python splits lines, so an error
# quoting it was two lines) and the line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")
MAX_ID = 2**63 - 1  # ids are 64-bit
_ID = re.compile(r"[0-9]{1,19}")


def as_id(text: str) -> int | None:
    """``text`` as a row id when it writes one (ASCII digits, 1 to ``MAX_ID``), else None:
    a name that is a number too large for an id is a name, never an overflow."""
    if not _ID.fullmatch(text):
        return None
    value = int(text)
    return value if 1 <= value <= MAX_ID else None


def text_problem(text: str, field: str, limit: int = TEXT_CHARS) -> str | None:
    """What is wrong with ``text`` as the value of ``field``, or None."""
    if len(text) > limit:
        return f"{field} is {len(text):,} characters long; at most {limit:,}"
    if _CONTROL.search(text):
        return f"{field} contains a control character (such as NUL)"
    return None


# How an operator writes a time of a backfill's window (UTC): a day, or a day and a time.
WHEN_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


def moment(text: str, field: str) -> datetime:
    """``text`` as a UTC time written in one of WHEN_FORMATS; UserError naming ``field``."""
    for form in WHEN_FORMATS:
        try:
            return datetime.strptime(text.strip(), form).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise UserError(f"{field} {text!r} is not a time: write 2026-11-19 or 2026-11-19T08:00 (UTC)")


def utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive time (as SQLite returns them, as an operator types them)
    is UTC already."""
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def window(since: datetime, until: datetime | None) -> tuple[datetime, datetime]:
    """A backfill's window: from ``since`` to ``until`` (default: now), both UTC (a naive
    time is UTC); UserError unless since comes first."""
    start, end = utc(since), datetime.now(UTC) if until is None else utc(until)
    if start >= end:
        raise UserError(f"since {start:%Y-%m-%d %H:%M} is not before until {end:%Y-%m-%d %H:%M}")
    return start, end

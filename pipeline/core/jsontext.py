"""JSON as the pipeline moves it to and from its database: orjson's speed, json's answers.

What the driver reads from JSON columns (a claimed raw row's ``raw_json``) and the rows a
backend sends as one JSON parameter (pipeline/backends/recordset.py) are parsed and
written by orjson, several times faster than the standard library (bench/RESULTS.md,
"JSON through orjson"). Where orjson refuses what json takes (a number past a double's
range, NaN, a lone surrogate's escape, an integer past 64 bits to write) or reads it
otherwise (an integer past 64 bits, which it reads as a float), json does the work: nothing
is refused for speed's sake, and what is read is what json would have read.

Only for text no one hashes or reads: an item's stored text and content hash
(pipeline/fetching/base.py), a listing's content hash and a webhook's body keep json's own
spelling, which orjson's (compact, no escapes) is not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import orjson

# Times go to the caller's ``default``, as json sends them: it says how a time is spelt
# (and refuses a naive one).
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME
_LONG_DIGITS_TEXT = re.compile("[0-9]{20}")
_LONG_DIGITS_BYTES = re.compile(b"[0-9]{20}")


def loads(text: str | bytes) -> Any:
    """The value of a JSON document, as ``json.loads`` reads it."""
    # orjson reads an integer past 64 bits as a float, silently: a document with 20
    # digits in a row (in a number or, rarely, a string) is json's.
    long_digits = _LONG_DIGITS_TEXT.search(text) if isinstance(text, str) else _LONG_DIGITS_BYTES.search(text)
    if long_digits:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any, *, default: Callable[[Any], Any]) -> str:
    """A JSON document of ``value``, non-ASCII text as it is; ``default`` turns what JSON
    has no type for (times included) into what it has, or raises. (A float NaN or
    infinity is written null, where json writes a literal PostgreSQL refuses.)"""
    try:
        return orjson.dumps(value, default=default, option=_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default, ensure_ascii=False)

"""JSON as the pipeline sends it to its database: orjson's speed, json's document.

The rows a backend sends as one JSON parameter (pipeline/backends/recordset.py: the
listing upsert, the fenced writes, the bulk inserts) are written by orjson, about twenty
times faster than ``json.dumps`` with a ``default`` (bench/RESULTS.md, "JSON through
orjson"). Where orjson refuses what json writes (an integer past 64 bits, a value the
caller's ``default`` refuses), json does the work, so nothing is refused for speed's sake.

Reading stays json's (the driver's default): orjson reads an integer past 64 bits as a
float, and guarding against that cost more than the read saved. Texts that are hashed or
shown (an item's stored text and content hash, pipeline/fetching/base.py; a listing's
content hash; a webhook's body) keep json's own spelling, which orjson's (compact, no
escapes) is not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson

# Times go to the caller's ``default``, as json sends them: it says how a time is spelt
# (and refuses a naive one).
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME


def dumps(value: Any, *, default: Callable[[Any], Any]) -> str:
    """A JSON document of ``value``, non-ASCII text as it is; ``default`` turns what JSON
    has no type for (times included) into what it has, or raises. (A float NaN or
    infinity is written null, where json writes a literal PostgreSQL refuses.)"""
    try:
        return orjson.dumps(value, default=default, option=_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value, default=default, ensure_ascii=False)

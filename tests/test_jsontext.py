"""JSON to and from the database through orjson reads and writes what json would."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pipeline.backends.recordset import json_rows
from pipeline.core import jsontext

# Documents json takes and orjson refuses, and ones both take.
DOCUMENTS = [
    '{"title": "caf\\u00e9 \\ud83d\\ude00", "n": 1, "f": 1.5, "none": null, "list": [true, false]}',
    '{"big": 123456789012345678901234567890}',  # past 64 bits
    '{"huge": 1e400, "nan": NaN, "inf": -Infinity}',  # past a double; json's literals
    '{"lone": "\\ud800 surrogate"}',
    '{"twice": 1, "twice": 2}',  # the last wins, as in json
    '{"deep": ' + "[" * 600 + "]" * 600 + "}",
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_loads_reads_what_json_reads(text):
    read = jsontext.loads(text)
    expected = json.loads(text)
    # NaN is not equal to itself: compare the spelling json gives both.
    assert json.dumps(read) == json.dumps(expected)
    assert jsontext.loads(text.encode("utf-8", "surrogatepass")) == read or "lone" in text


def test_loads_refuses_what_json_refuses():
    with pytest.raises(ValueError, match="Expecting"):
        jsontext.loads('{"title": ')


def encode_time(value):
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive")
        return value.astimezone(UTC).isoformat()
    raise TypeError(f"cannot send {type(value).__name__}")


@pytest.mark.parametrize("value", [
    [{"title": "caf\u00e9 \U0001f600 </script> \u2028", "n": 2**63 - 1, "neg": -(2**63), "f": 0.1,
      "nested": {"list": [None, True, "x"]}}],
    [{"big": 2**64 + 1}],  # past 64 bits: json writes it
    [{"at": datetime(2026, 11, 29, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))}],
])
def test_dumps_writes_what_json_reads_back_the_same(value):
    written = jsontext.dumps(value, default=encode_time)
    assert json.loads(written) == json.loads(json.dumps(value, default=encode_time, ensure_ascii=False))


def test_a_time_is_spelt_by_the_callers_default_and_a_naive_one_refused():
    at = datetime(2026, 11, 29, 16, 0, tzinfo=timezone(timedelta(hours=2)))
    assert json.loads(json_rows([{"at": at}])) == [{"at": "2026-11-29T14:00:00+00:00"}]
    with pytest.raises(ValueError, match="naive datetime"):
        json_rows([{"at": datetime(2026, 11, 29, 14, 0)}])
    with pytest.raises(TypeError, match="cannot send set"):
        json_rows([{"odd": {1, 2}}])

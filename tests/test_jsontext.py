"""JSON sent to the database through orjson: the document json would send."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from pipeline.backends.recordset import json_rows
from pipeline.core import jsontext


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

"""What each queue's claim hands out is typed by name (pipeline/storage/rows.py): a queue
made with a row type checks that its keys are the columns its claim returns, and mypy
then checks every name a stage reads of a claimed row."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict

import pytest
import sqlalchemy as sa

from pipeline.listings.processor import _CLAIMED
from pipeline.queue.claim import WorkQueue
from pipeline.storage import schema
from pipeline.storage.rows import RawRow

ROOT = Path(__file__).resolve().parent.parent
_ENGINE = sa.create_engine("sqlite://")  # never connects: a queue's statements are built, not run


class _Stale(TypedDict):  # RawRow before a column was added to what the processor claims
    id: int
    fetched_at: datetime
    attempts: int
    source_id: int
    source_item_id: str
    url: str
    raw_jsn: Any


def test_a_row_type_that_is_not_what_the_claim_returns_is_refused_by_name() -> None:
    WorkQueue(_ENGINE, schema.RAW_UNPROCESSED, columns=_CLAIMED, row=RawRow)  # the processor's: fine
    with pytest.raises(ValueError, match=r"_Stale is not what a claim of listings_raw.unprocessed returns:"
                                         r" it lacks raw_json; it has raw_jsn, which the claim does not return"):
        WorkQueue(_ENGINE, schema.RAW_UNPROCESSED, columns=_CLAIMED, row=_Stale)
    with pytest.raises(ValueError, match="it lacks .*claim_token"):  # every column, when none is named
        WorkQueue(_ENGINE, schema.RAW_UNPROCESSED, row=RawRow)


@pytest.mark.xdist_group("mypy")  # one mypy at a time writes the cache they share
def test_mypy_refuses_a_misspelt_column_of_a_claimed_row(tmp_path: Path) -> None:
    """A stage that reads a column its claim does not return fails the type check (the
    package's own check is tests/test_layout.py). It starts mypy on a small module that
    imports the package (about 15 s of one core without mypy's cache)."""
    module = tmp_path / "stage.py"
    module.write_text(textwrap.dedent("""
        import sqlalchemy as sa
        from pipeline.queue.claim import WorkQueue
        from pipeline.storage import schema
        from pipeline.storage.rows import RawRow

        queue = WorkQueue(sa.create_engine("sqlite://"), schema.RAW_UNPROCESSED, row=RawRow)
        for row in queue.claim("w", 10).rows:
            url: str = row["url"]
            source: int = row["sourceid"]
    """))
    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(ROOT / ".mypy_cache"), str(module)],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert found.returncode == 1, found.stdout
    assert 'TypedDict "RawRow" has no key "sourceid"' in found.stdout, found.stdout
    assert found.stdout.count("error:") == 1, found.stdout  # the misspelt name alone

"""The Dagster layer: the definitions load and validate, and the shared resource claims work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from pipeline.core.errors import SchemaMismatch
from pipeline.definitions import defs
from pipeline.storage import schema
from resources import PipelineDatabase
from tests.helpers import add_raw_rows, add_source, now

ROOT = Path(__file__).resolve().parent.parent


def test_dagster_definitions_validate_passes():
    """A process: Dagster's own command loads the code location as the UI would."""
    dagster = Path(sys.executable).parent / "dagster"
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_the_definitions_share_one_database_resource():
    assert isinstance(defs.resources["database"], PipelineDatabase)


@dg.asset
def drain_raw_rows(database: PipelineDatabase) -> dg.MaterializeResult:
    queue = database.queue(schema.RAW_UNPROCESSED)
    completed = 0
    while claim := queue.claim("test-asset", 2):
        completed += len(queue.complete(claim, {"processed_at": now()}).done)
    return dg.MaterializeResult(metadata={"completed": completed})


def test_an_asset_claims_through_the_resource(engine, db_url):
    with engine.begin() as conn:
        add_raw_rows(conn, add_source(conn), 5)
    result = dg.materialize(
        [drain_raw_rows], resources={"database": PipelineDatabase(database_url=db_url)}
    )
    assert result.success
    [materialization] = result.asset_materializations_for_node("drain_raw_rows")
    assert materialization.metadata["completed"].value == 5
    t = schema.listings_raw
    with engine.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).where(t.c.processed_at.is_(None)))
        assert left.scalar_one() == 0


def test_the_resource_refuses_an_unmigrated_database(empty_db_url):
    with pytest.raises(dg.DagsterResourceFunctionError) as failure:
        dg.materialize(
            [drain_raw_rows],
            resources={"database": PipelineDatabase(database_url=empty_db_url)},
            raise_on_error=True,
        )
    assert isinstance(failure.value.__cause__, SchemaMismatch)
    assert "run `pipeline db upgrade`" in str(failure.value.__cause__)

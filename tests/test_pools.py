"""sensors/pools.py: the stage assets' pools get their limits in Dagster's storage on
PostgreSQL before any run starts, so runs starting together do not race to create them."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from pipeline.storage import db
from sensors import pools

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


@pytest.fixture
def instance(pg_databases, tmp_path, monkeypatch):
    url = db.parse_url(pg_databases.url(pg_databases.create())).set(drivername="postgresql+psycopg2")
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", url.render_as_string(hide_password=False))
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        yield instance


def test_every_stage_pool_is_created_with_the_default_limit_and_a_set_one_is_kept(instance):
    storage = instance.event_log_storage
    assert pools.pools() == ["stages"]
    assert storage.get_concurrency_keys() == set()
    assert pools.create_missing(instance) == {"stages": 10}
    assert pools.create_missing(instance) == {}, "a second call changes nothing"
    storage.set_concurrency_slots("stages", 7)  # an operator's own limit
    assert pools.create_missing(instance) == {}
    assert storage.get_concurrency_info("stages").slot_count == 7

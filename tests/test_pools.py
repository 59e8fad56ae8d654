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


def test_a_slot_left_by_a_run_that_ended_without_freeing_it_is_freed_by_run_monitoring(instance, tmp_path):
    """A run worker killed (or a stalled run ended through run monitoring: sensors/runs.py)
    never frees its step's slot in the pool, and Dagster frees such slots only when told
    to (``free_slots_after_run_end_seconds``; its default is never): each took one of the
    pool's 10 for good, and the eleventh stopped every stage. Both instances the project
    writes set it, and run monitoring that reads it is on."""
    import dev

    home = tmp_path / "dev"
    home.mkdir()
    (home / "dagster.yaml").write_text(dev.dev_instance(home))
    with dg.DagsterInstance.from_config(str(home)) as dev_instance:
        for each in (instance, dev_instance):
            assert each.run_monitoring_enabled
            assert 0 < each.run_monitoring_settings["free_slots_after_run_end_seconds"] <= 300

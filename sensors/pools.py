"""``python -m sensors.pools``: give the assets' pools their limits in Dagster's storage
before any run starts (the image's daemon runs it first: deploy/docker-compose.yaml).

Left alone, Dagster writes a pool's row on the first run that uses it, with an INSERT
that fails on PostgreSQL when two runs start at once and both try (dagster-io/dagster
issue 33552: "duplicate key value violates unique constraint
concurrency_limits_concurrency_key_key"); the run fails and is retried. Seen in
tests/test_docker.py: 2 of 8 runs, the first time three started together. Each pool
that has no row yet gets the instance's ``concurrency.pools.default_limit``; a pool an
operator already set (``dagster instance concurrency set``, the UI) keeps its limit.
"""

from __future__ import annotations

import sys

import dagster as dg

from assets import ASSETS


def pools() -> list[str]:
    """The pools the assets' steps run in (declared on each)."""
    return sorted({str(asset.op.pool) for asset in ASSETS if asset.op.pool})


def create_missing(instance: dg.DagsterInstance) -> dict[str, int]:
    """Set each pool without a row to the default limit; the pools set, with their limits."""
    limit = instance.global_op_concurrency_default_limit
    if limit is None:
        return {}  # no default: Dagster then leaves pools unlimited and writes no rows
    storage = instance.event_log_storage
    existing = storage.get_concurrency_keys()
    created = {}
    for pool in pools():
        if pool not in existing:
            storage.set_concurrency_slots(pool, limit)
            created[pool] = limit
    return created


def main() -> int:
    with dg.DagsterInstance.get() as instance:
        created = create_missing(instance)
    print(f"pools created: {created}" if created else "pools: every pool has its limit already", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``listings_raw`` asset: one collector pass (pipeline/fetching/collector.py) per run."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.


import dagster as dg

from assets.policies import STEP_RETRY
from pipeline.fetching.collector import Collector
from pipeline.storage.status import recorded
from resources import PipelineDatabase


class CollectConfig(dg.Config):
    max_sources: int | None = None  # claim at most this many sources in this run
    concurrency: int | None = None  # fetches at once; default PIPELINE_CONCURRENCY


@dg.asset(
    name="listings_raw",
    group_name="pipeline",
    pool="collector",
    retry_policy=STEP_RETRY,
    description="Raw items of due sources: fetches every due source once, stores new and "
    "changed items, reschedules each source (cadence or backoff).",
)
def listings_raw(
    context: dg.AssetExecutionContext, config: CollectConfig, database: PipelineDatabase
) -> dg.MaterializeResult[None]:
    run_id = context.run.run_id
    with recorded(database.engine, "collector"):
        stats = Collector(
            database.engine, database.settings(), worker=f"dagster:{run_id}", run_id=run_id
        ).run(max_sources=config.max_sources, concurrency=config.concurrency)
    totals = stats.as_dict()
    context.log.info(f"collector totals: {totals}")
    metadata = {k: v for k, v in totals.items() if v is not None and k != "failed_by_reason"}
    metadata.update({f"failed_{reason}": n for reason, n in stats.failed.items()})
    return dg.MaterializeResult(metadata=metadata)

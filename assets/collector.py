"""The ``listings_raw`` asset: one collector pass (pipeline/fetching/collector.py) per run."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Iterator

import dagster as dg

from assets.policies import STEP_RETRY, by_code, ends_when_terminated, pass_result, run_worker
from pipeline.core.failures import FailureReason
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
    output_required=False,
    kinds={"python", "postgres"},
    owners=["team:pipeline"],
    description="Raw items of due sources: fetches every due source once, stores new and "
    "changed items, reschedules each source (cadence or backoff). A pass that claims no "
    "source records an observation, not a materialisation.",
)
def listings_raw(
    context: dg.AssetExecutionContext, config: CollectConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    run_id = context.run.run_id
    with ends_when_terminated(), recorded(database.engine, "collector"):
        stats = Collector(
            database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id
        ).run(max_sources=config.max_sources, concurrency=config.concurrency)
    totals = stats.as_dict()
    context.log.info(f"collector totals: {totals}")
    metadata = {k: v for k, v in totals.items() if v is not None and k != "failed_by_reason"}
    metadata.update(by_code("failed_", stats.failed, (reason.value for reason in FailureReason)))
    yield from pass_result(context, metadata, worked=stats.claimed > 0)

"""The ``listings`` asset: one processor pass (pipeline/listings/processor.py) per run."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Iterator

import dagster as dg

from assets import passes
from assets.policies import STEP_RETRY, ends_when_terminated, stage_kinds
from resources import PipelineDatabase


class ProcessConfig(dg.Config):
    max_rows: int | None = None  # claim at most this many raw rows in this run


@dg.asset(
    name="listings",
    deps=["listings_raw"],
    group_name="pipeline",
    pool="processor",
    retry_policy=STEP_RETRY,
    output_required=False,
    kinds=stage_kinds(),
    owners=["team:pipeline"],
    description="Listings normalised from raw rows: claims unprocessed raw rows oldest first, "
    "upserts their listings and marks them processed, batch by batch. A pass that claims no "
    "row records an observation, not a materialisation.",
)
def listings(
    context: dg.AssetExecutionContext, config: ProcessConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    with ends_when_terminated():
        done = passes.process(database, context.run.run_id, max_rows=config.max_rows)
    yield from passes.result(context, done, database)

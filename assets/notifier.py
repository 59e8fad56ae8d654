"""The ``notifications`` asset: one notifier pass (pipeline/notify/notifier.py) per run."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Iterator

import dagster as dg

from assets import passes
from assets.policies import STEP_RETRY, ends_when_terminated, stage_kinds
from resources import PipelineDatabase


class NotifyConfig(dg.Config):
    max_listings: int | None = None  # match at most this many listings in this run
    max_notifications: int | None = None  # deliver at most this many notifications


@dg.asset(
    name="notifications",
    deps=["listings"],
    group_name="pipeline",
    pool="notifier",
    retry_policy=STEP_RETRY,
    output_required=False,
    kinds=stage_kinds(),
    owners=["team:pipeline"],
    description="Notifications of matching listings: matches listings not matched yet against "
    "every enabled filter (one per user and listing), then delivers the due ones. A pass "
    "that matches and delivers nothing records an observation, not a materialisation.",
)
def notifications(
    context: dg.AssetExecutionContext, config: NotifyConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    with ends_when_terminated():
        done = passes.notify(database, context.run.run_id, max_listings=config.max_listings,
                             max_notifications=config.max_notifications)
    yield from passes.result(context, done, database)

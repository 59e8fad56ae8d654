"""The ``notifications`` asset: one notifier pass (pipeline/notify/notifier.py) per run."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Iterator

import dagster as dg

from assets.policies import STEP_RETRY, by_code, ends_when_terminated, pass_result, run_worker
from assets.processor import listings
from pipeline.core.failures import DELIVERY_CODES
from pipeline.notify.notifier import Notifier
from pipeline.storage.status import recorded
from resources import PipelineDatabase


class NotifyConfig(dg.Config):
    max_listings: int | None = None  # match at most this many listings in this run
    max_notifications: int | None = None  # deliver at most this many notifications


@dg.asset(
    name="notifications",
    deps=[listings],
    group_name="pipeline",
    pool="notifier",
    retry_policy=STEP_RETRY,
    output_required=False,
    kinds={"python", "postgres"},
    owners=["team:pipeline"],
    description="Notifications of matching listings: matches listings not matched yet against "
    "every enabled filter (one per user and listing), then delivers the due ones. A pass "
    "that matches and delivers nothing records an observation, not a materialisation.",
)
def notifications(
    context: dg.AssetExecutionContext, config: NotifyConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    run_id = context.run.run_id
    with ends_when_terminated(), recorded(database.engine, "notifier"):
        stats = Notifier(database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id).run(
            max_listings=config.max_listings, max_notifications=config.max_notifications
        )
    totals = stats.as_dict()
    context.log.info(f"notifier totals: {totals}")
    metadata = {k: v for k, v in totals.items() if k != "errors"}
    metadata.update(by_code("errors_", stats.errors, DELIVERY_CODES))
    yield from pass_result(context, metadata, worked=stats.listings_matched + stats.claimed > 0)

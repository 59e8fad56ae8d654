"""Each stage's pass as a run records it: the pass itself (pipeline/), its totals as
metadata (failure codes zero-filled, so plots have no gaps) and whether it did work.

The assets record one pass each; a lingering ``ingest`` run (assets/collector.py)
records many, each as soon as it ends.
"""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg

from assets.checks import ASSET_CHECKS
from assets.policies import by_code, run_worker
from pipeline.core.failures import DELIVERY_CODES, FailureReason
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import Notifier
from pipeline.storage.status import recorded
from resources import PipelineDatabase


@dataclass(frozen=True)
class Pass:
    asset: dg.AssetKey
    metadata: dict[str, Any]
    worked: bool  # claimed something: a materialisation; else an observation


def collect(
    database: PipelineDatabase, run_id: str, *, max_sources: int | None = None, concurrency: int | None = None
) -> Pass:
    with recorded(database.engine, "collector"):
        stats = Collector(database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id).run(
            max_sources=max_sources, concurrency=concurrency
        )
    totals = stats.as_dict()
    metadata = {k: v for k, v in totals.items() if v is not None and k != "failed_by_reason"}
    metadata.update(by_code("failed_", stats.failed, (reason.value for reason in FailureReason)))
    return Pass(dg.AssetKey("listings_raw"), metadata, worked=stats.claimed > 0)


def process(database: PipelineDatabase, run_id: str, *, max_rows: int | None = None) -> Pass:
    with recorded(database.engine, "processor"):
        stats = Processor(database.engine, database.settings(), worker=run_worker(run_id)).run(max_rows=max_rows)
    return Pass(dg.AssetKey("listings"), stats.as_dict(), worked=stats.claimed > 0)


def notify(
    database: PipelineDatabase, run_id: str, *,
    max_listings: int | None = None, max_notifications: int | None = None,
) -> Pass:
    with recorded(database.engine, "notifier"):
        stats = Notifier(database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id).run(
            max_listings=max_listings, max_notifications=max_notifications
        )
    metadata = {k: v for k, v in stats.as_dict().items() if k != "errors"}
    metadata.update(by_code("errors_", stats.errors, DELIVERY_CODES))
    return Pass(dg.AssetKey("notifications"), metadata, worked=stats.listings_matched + stats.claimed > 0)


def result(
    context: dg.AssetExecutionContext, done: Pass, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    """The step's own record of its pass: a pass that did work materialises the asset
    (and its checks are evaluated after it); an empty one records an observation
    instead, so the asset's history shows work done and its plots still get a point per
    run (the asset is ``output_required=False``)."""
    context.log.info(f"{done.asset.to_user_string()} pass: {done.metadata}")
    if done.worked:
        yield dg.MaterializeResult(metadata=dict(done.metadata))
        evaluate_checks(context, database, done.asset)
    else:
        log(context, done, database)


def log(context: dg.AssetExecutionContext, done: Pass, database: PipelineDatabase) -> None:
    """A pass recorded as an event of the run (a lingering run's passes before its last,
    and the passes it makes of the stages after it): the same record as ``result``."""
    event = dg.AssetMaterialization if done.worked else dg.AssetObservation
    context.log_event(event(asset_key=done.asset, metadata=dict(done.metadata)))
    if done.worked:
        evaluate_checks(context, database, done.asset)


# A run evaluates an asset's checks after it materialises the asset, and again after a
# later materialisation once this long has passed (a lingering run materialises often).
CHECKS_EVERY_SECONDS = 60.0
_evaluated: dict[tuple[str, dg.AssetKey], float] = {}  # (run id, asset) -> when, monotonic


def evaluate_checks(context: dg.AssetExecutionContext, database: PipelineDatabase, asset: dg.AssetKey) -> None:
    """``asset``'s checks, evaluated in this run after its materialisation: Dagster's UI
    shows a check's result for the latest materialisation only when it was evaluated in
    the same run or after it, so checks evaluated only by ``health_checks`` every 15
    minutes read "Not evaluated" beside each new materialisation. Each check is one
    cheap query (assets/checks.py); one that raises is logged and left to
    ``health_checks``, never failing the stage's step."""
    key, now = (context.run.run_id, asset), time.monotonic()
    if key in _evaluated and now - _evaluated[key] < CHECKS_EVERY_SECONDS:
        return
    if len(_evaluated) > 1000:  # a code server's process outlives many runs
        _evaluated.clear()
    _evaluated[key] = now
    for definition in ASSET_CHECKS:
        for check in definition.check_keys:
            if check.asset_key != asset:
                continue
            try:
                found = definition(database=database)
            except Exception as exc:  # noqa: BLE001 (a check's failure is logged, the pass stands)
                context.log.warning(f"check {check.name} of {asset.to_user_string()} not evaluated: {exc}")
                continue
            context.log_event(dg.AssetCheckEvaluation(
                asset_key=asset, check_name=check.name, passed=found.passed, severity=found.severity,
                description=found.description, metadata=found.metadata,
            ))

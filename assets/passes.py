"""Each stage's pass as a run records it: the pass itself (pipeline/), its totals as
metadata (failure codes zero-filled, so plots have no gaps) and whether it did work.

A run records one pass per stage it runs; a lingering ``ingest`` run (assets/stages.py)
records many, each as soon as it ends.
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import dagster as dg

from assets.checks import ASSET_CHECKS
from assets.policies import by_code, run_worker
from pipeline.core import errors
from pipeline.core.failures import DELIVERY_CODES, FailureReason
from pipeline.fetching.collector import Collector
from pipeline.listings.processor import Processor
from pipeline.notify.notifier import FilterCatalogue, Notifier
from resources import PipelineDatabase


@dataclass(frozen=True)
class Pass:
    asset: dg.AssetKey
    metadata: dict[str, Any]
    worked: bool  # claimed something
    # Changed its asset: the collector stored items; the processor and the notifier
    # changed theirs whenever they worked (claimed rows are processed or matched).
    changed: bool


def materialises(chain: Sequence[Pass]) -> list[bool]:
    """Which passes of ``chain`` (stages run one after another in a run, in pipeline
    order) record a materialisation, the others an observation: one that changed its
    asset, and every one after it in the chain, which has just taken that change in
    (the processor after a collection that stored items, whatever it claimed). So an
    asset is never older than the one upstream of it unless work is waiting for it:
    a collector pass that stored nothing (fetched, unchanged) made the UI call
    ``listings`` "Unsynced" until the next new item.
    """
    taken_in, marks = False, []
    for done in chain:
        taken_in = taken_in or done.changed
        marks.append(taken_in)
    return marks


def collect(
    database: PipelineDatabase, run_id: str, *, max_sources: int | None = None, concurrency: int | None = None,
    claim_until: float | None = None,
) -> Pass:
    stats = Collector(database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id).run(
        max_sources=max_sources, concurrency=concurrency, claim_until=claim_until
    )
    totals = stats.as_dict()
    metadata = {k: v for k, v in totals.items() if v is not None and k != "failed_by_reason"}
    metadata.update(by_code("failed_", stats.failed, (reason.value for reason in FailureReason)))
    return Pass(dg.AssetKey("listings_raw"), metadata, worked=stats.claimed > 0, changed=stats.items_new > 0)


def process(database: PipelineDatabase, run_id: str, *, max_rows: int | None = None) -> Pass:
    stats = Processor(database.engine, database.settings(), worker=run_worker(run_id)).run(max_rows=max_rows)
    return Pass(dg.AssetKey("listings"), stats.as_dict(), worked=stats.claimed > 0, changed=stats.claimed > 0)


def notify(
    database: PipelineDatabase, run_id: str, *,
    max_listings: int | None = None, max_notifications: int | None = None,
    catalogue: FilterCatalogue | None = None, matching: bool = True, delivering: bool = True,
) -> Pass:
    """A notifier pass (its matching or its delivering only, when the other is turned
    off); ``catalogue``: the run's filters, kept between its passes."""
    stats = Notifier(database.engine, database.settings(), worker=run_worker(run_id), run_id=run_id,
                     catalogue=catalogue).run(max_listings=max_listings, max_notifications=max_notifications,
                                              matching=matching, delivering=delivering)
    metadata = {k: v for k, v in stats.as_dict().items() if k != "errors"}
    metadata.update(by_code("errors_", stats.errors, DELIVERY_CODES))
    worked = stats.listings_matched + stats.claimed > 0
    return Pass(dg.AssetKey("notifications"), metadata, worked=worked, changed=worked)


def merged(made: Sequence[Pass]) -> Pass:
    """Passes of one stage as one: their counts added (every stage's metadata is counts),
    worked or changed if any did."""
    metadata: dict[str, Any] = {}
    for done in made:
        for key, value in done.metadata.items():
            metadata[key] = metadata.get(key, 0) + value
    return Pass(made[-1].asset, metadata, worked=any(d.worked for d in made), changed=any(d.changed for d in made))


def results(
    context: dg.AssetExecutionContext, chain: Sequence[Pass], database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    """The step's own record of its last passes (``chain``, in pipeline order): each
    that ``materialises`` is the step's result for its asset (its checks evaluated after
    it); the others record an observation instead, so the asset's history shows what
    changed it and its plots still get a point per run (the assets are skippable)."""
    for done, materialised in zip(chain, materialises(chain), strict=True):
        context.log.info(f"{done.asset.to_user_string()} pass: {done.metadata}")
        if materialised:
            yield dg.MaterializeResult(asset_key=done.asset, metadata=dict(done.metadata))
            evaluate_checks(context, database, done.asset)
        else:
            context.log_event(dg.AssetObservation(asset_key=done.asset, metadata=dict(done.metadata)))


def log(context: dg.AssetExecutionContext, chain: Sequence[Pass], database: PipelineDatabase) -> None:
    """Passes recorded as events of the run (a lingering run's passes before its last):
    the same records as ``results``, but a pass that neither worked nor materialises is
    left out (a lingering run makes many)."""
    for done, materialised in zip(chain, materialises(chain), strict=True):
        if materialised:
            context.log_event(dg.AssetMaterialization(asset_key=done.asset, metadata=dict(done.metadata)))
            evaluate_checks(context, database, done.asset)
        elif done.worked:
            context.log_event(dg.AssetObservation(asset_key=done.asset, metadata=dict(done.metadata)))


def evaluate_checks(context: dg.AssetExecutionContext, database: PipelineDatabase, asset: dg.AssetKey) -> None:
    """``asset``'s checks, evaluated in this run after each of its materialisations:
    Dagster's UI shows a check's result beside the latest materialisation only when it
    was evaluated after it, so an asset whose checks were left out of one (a lingering
    run evaluated them at most once a minute) showed green with "0 / N Passed" while
    its latest result was failing. Each check is one cheap query (assets/checks.py);
    one that raises is recorded failed, saying why (it could not say all is well),
    never failing the stage's step."""
    for definition in ASSET_CHECKS:
        for check in definition.check_keys:
            if check.asset_key != asset:
                continue
            try:
                found = cast(dg.AssetCheckResult, definition(database=database))
            except Exception as exc:  # noqa: BLE001 (a check that cannot run fails; the pass stands)
                context.log.warning(f"check {check.name} of {asset.to_user_string()} could not run: {exc}")
                found = dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.WARN,
                                            description=f"could not run: {errors.reason(exc)}")
            context.log_event(dg.AssetCheckEvaluation(
                asset_key=asset, check_name=check.name, passed=found.passed, severity=found.severity,
                description=found.description, metadata=found.metadata,
            ))

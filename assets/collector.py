"""The ``listings_raw`` asset: a collector pass (pipeline/fetching/collector.py) per run,
or, in an ingest run that lingers, a pass each time sources come due."""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TypeVar

import dagster as dg

from assets import passes
from assets.policies import LINGER_TAG, STEP_RETRY, ends_when_terminated, stage_kinds
from pipeline.storage.status import next_due_in
from resources import PipelineDatabase

# A lingering run looks for due sources at least this often (one refreshed by hand).
POLL_SECONDS = 5.0


class CollectConfig(dg.Config):
    max_sources: int | None = None  # claim at most this many sources in a pass
    concurrency: int | None = None  # fetches at once; default PIPELINE_CONCURRENCY
    # Keep taking sources as they come due for this long (ingest runs the sensor starts:
    # PIPELINE_INGEST_LINGER_SECONDS), processing and notifying after each pass.
    linger_seconds: int = 0


@dg.asset(
    name="listings_raw",
    group_name="pipeline",
    pool="collector",
    retry_policy=STEP_RETRY,
    output_required=False,
    kinds=stage_kinds(),
    owners=["team:pipeline"],
    description="Raw items of due sources: fetches every due source once, stores new and "
    "changed items, reschedules each source (cadence or backoff). A pass that claims no "
    "source records an observation, not a materialisation. An ingest run lingers: while "
    "a source comes due within its linger, it processes and notifies what it collected, "
    "waits for that source and collects again, one run instead of one per fetch.",
)
def listings_raw(
    context: dg.AssetExecutionContext, config: CollectConfig, database: PipelineDatabase
) -> Iterator[dg.MaterializeResult[None]]:
    run_id = context.run.run_id
    deadline = time.monotonic() + config.linger_seconds
    if until := context.run.tags.get(LINGER_TAG):
        # Requested by the sensor: linger no longer than the tag it reads says.
        deadline = min(deadline, time.monotonic() + datetime.fromisoformat(until).timestamp() - time.time())

    def collect() -> passes.Pass:
        return passes.collect(database, run_id, max_sources=config.max_sources, concurrency=config.concurrency)

    with ends_when_terminated():
        done: passes.Pass | None = collect()
        try:
            while config.linger_seconds > 0 and (wait := _between_passes(
                    lambda: _due_within(database, deadline))) is not None:
                if done is not None:
                    # Lingering: this pass's items go through now, as the steps after this
                    # one would take them, before the run waits for the next source.
                    passes.log(context, done, database)
                    for follow in (passes.process(database, run_id), passes.notify(database, run_id)):
                        if follow.worked:
                            passes.log(context, follow, database)
                    done = None
                    if wait > 0:
                        context.log.info(f"lingering: the next source is due in {wait:.0f} s")
                if wait > 0:
                    _between_passes(lambda: time.sleep(min(wait, POLL_SECONDS)))
                    continue
                done = collect()
                if not done.worked:  # it was due, but another worker took it first
                    _between_passes(lambda: time.sleep(POLL_SECONDS))
        except TerminatedBetweenPasses:
            context.log.info("terminated while lingering between passes: the run ends here, its work done")
    if done is not None:
        # The last pass is the step's own result; the steps after it process and notify it.
        yield from passes.result(context, done, database)


class TerminatedBetweenPasses(Exception):
    """A lingering run was terminated while it waited, with no pass in hand."""


T = TypeVar("T")


def _between_passes(wait: Callable[[], T]) -> T:
    """``wait()`` (a sleep, or a look at when the next source is due); a termination
    meanwhile (the UI's Terminate, dev.py's Ctrl-C) raises TerminatedBetweenPasses: with
    nothing in hand, the run ends cleanly, with no failure event and no red run. A
    termination within a pass still ends the step failed (``ends_when_terminated``)."""
    try:
        return wait()
    except dg.DagsterExecutionInterruptedError:
        raise TerminatedBetweenPasses from None


def _due_within(database: PipelineDatabase, deadline: float) -> float | None:
    """Seconds until the next source comes due, when that is before ``deadline``
    (monotonic); None when none comes due before it."""
    with database.engine.connect() as conn:
        due_in = next_due_in(conn)
    return due_in if due_in is not None and due_in <= deadline - time.monotonic() else None

"""What the stage sensors share: is there room in the stage's worker pool, and is there work.

Room: fewer active runs tagged with the stage than PIPELINE_<STAGE>_MAX_RUNS (default 2).
Work: a capped count over the claim queues' own partial indexes (``WorkQueue.count_ready``),
so a tick costs the same whatever the size of the tables. One request per tick at most:
the cursor counts the ticks that asked, and the run_key makes a retried tick a no-op.
"""
# No "from __future__ import annotations": Dagster reads these annotations at runtime.

from collections.abc import Callable

import dagster as dg

from assets.policies import STAGE_TAG
from pipeline.core.settings import Settings

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
COUNT_CAP = 1000


def sensor_interval() -> int:
    """Seconds between a stage sensor's looks (Settings: PIPELINE_SENSOR_INTERVAL_SECONDS).
    Read when the definitions load; each look is one capped, indexed count."""
    return Settings.from_env().sensor_interval_seconds


def max_runs(stage: str) -> int:
    """Runs of ``stage`` in flight at once (Settings: PIPELINE_<STAGE>_MAX_RUNS)."""
    return Settings.from_env().max_runs(stage)


def request_if_work(
    context: dg.SensorEvaluationContext, *, stage: str, work: str, count: Callable[[], int],
    run_key_prefix: str, count_tag: str,
) -> dg.RunRequest | dg.SkipReason:
    active = context.instance.get_runs_count(dg.RunsFilter(statuses=ACTIVE, tags={STAGE_TAG: stage}))
    limit = max_runs(stage)
    if active >= limit:
        return dg.SkipReason(f"{active} {stage} runs active, the limit is {limit}")
    ready = count()
    if ready == 0:
        return dg.SkipReason(f"no {work}")
    tick = int(context.cursor or "0") + 1
    context.update_cursor(str(tick))
    return dg.RunRequest(
        run_key=f"{run_key_prefix}-{tick}",
        tags={STAGE_TAG: stage, count_tag: str(ready) + ("+" if ready >= COUNT_CAP else "")},
    )

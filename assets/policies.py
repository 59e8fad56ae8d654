"""What every stage's runs share: the step retry policy, the tags that name a run's stage
(the sensors count a stage's active runs by it) and how long an ingest run lingers, the
worker name its claims carry, and how a terminated pass ends."""

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import dagster as dg
import sqlalchemy as sa

from pipeline.core.errors import PipelineError
from pipeline.core.settings import Settings

# A step that fails as a whole (database gone, process killed) is retried, with
# exponential backoff and jitter; a failing source, row or notification is not a failing
# step: the stage records it and carries on.
STEP_RETRY = dg.RetryPolicy(
    max_retries=3, delay=15, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)

STAGE_TAG = "pipeline/stage"
# On an ingest run the due sources sensor starts: when (ISO 8601, UTC) it stops taking
# sources as they come due (PIPELINE_INGEST_LINGER_SECONDS after its request).
LINGER_TAG = "pipeline/linger_until"


def stage_kinds() -> set[str]:
    """The kinds a stage's asset shows in the UI: Python, and the database this code
    location is configured for (DATABASE_URL, else the embedded SQLite), read when the
    definitions load: "postgres", "sqlite" or "mariadb", never one it does not use."""
    try:
        backend = sa.engine.make_url(Settings.from_env().database_url).get_backend_name()
    except (PipelineError, sa.exc.ArgumentError):
        return {"python"}  # the stage's own commands say what is wrong with the setting
    return {"python", {"postgresql": "postgres", "mysql": "mariadb"}.get(backend, backend)}


def run_worker(run_id: str) -> str:
    """The worker name a run's claims carry (``claimed_by``): the sensors ask whether a
    run still holds live leases by it."""
    return f"dagster:{run_id}"


@contextmanager
def ends_when_terminated() -> Iterator[None]:
    """A stage pass interrupted by a termination (the UI's Terminate, dev.py's Ctrl-C) ends
    the step at once, failed without a retry, so the run ends CANCELED: Dagster applies
    the step's retry policy to interruptions too, which kept a terminated run waiting to
    retry until its process was killed. The pass's claims come back when their lease
    runs out; the rows it finished are stored. (A lingering run terminated between passes
    has nothing under way and ends cleanly instead: assets/stages.py.)"""
    try:
        yield
    except dg.DagsterExecutionInterruptedError as interrupted:
        raise dg.Failure("interrupted: the run was terminated", allow_retries=False) from interrupted


def by_code(prefix: str, counts: Mapping[str, int], codes: Iterable[str]) -> dict[str, int]:
    """``counts`` as metadata keyed by code, every code present (0 when none), so a plot
    of any code has a point at every run."""
    return {f"{prefix}{code}": int(counts.get(code, 0)) for code in codes}

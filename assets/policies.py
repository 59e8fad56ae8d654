"""What every stage's runs share: the step retry policy, and the tag that names a run's stage
(the sensors count a stage's active runs by it)."""

import dagster as dg

# A step that fails as a whole (database gone, process killed) is retried, with
# exponential backoff and jitter; a failing source, row or notification is not a failing
# step: the stage records it and carries on.
STEP_RETRY = dg.RetryPolicy(
    max_retries=3, delay=15, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)

STAGE_TAG = "pipeline/stage"

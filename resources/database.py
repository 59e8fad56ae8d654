"""The database/claims resource every asset shares."""

from __future__ import annotations

import dataclasses

import dagster as dg
from pydantic import Field, PrivateAttr
from sqlalchemy.engine import Engine

from pipeline.core.settings import DEFAULT_LEASE_SECONDS, Settings
from pipeline.queue.claim import WorkQueue
from pipeline.queue.spec import QueueSpec
from pipeline.storage import db, migrate


class PipelineDatabase(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The pipeline database and its claim queues.

    Unset fields fall back to the environment (DATABASE_URL, PIPELINE_LEASE_SECONDS), and
    DATABASE_URL unset means the embedded SQLite file, so the same definitions run on a
    laptop with nothing configured and in production with the variables set.
    """

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the pipeline database; default: DATABASE_URL, else the "
        "embedded SQLite file in the project's .state/ folder.",
    )
    lease_seconds: int | None = Field(
        default=None,
        description=f"Claim lease; default: PIPELINE_LEASE_SECONDS, else {DEFAULT_LEASE_SECONDS}.",
    )

    _engine: Engine | None = PrivateAttr(default=None)

    def settings(self) -> Settings:
        env = Settings.from_env()
        return dataclasses.replace(
            env,
            database_url=self.database_url or env.database_url,
            lease_seconds=self.lease_seconds or env.lease_seconds,
        )

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        engine = db.create_engine(self.settings().database_url)
        # Fail the step (and let its RetryPolicy act) before any work is claimed.
        migrate.check_schema(engine)
        self._engine = engine

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("PipelineDatabase is used outside a Dagster execution")
        return self._engine

    def queue(self, spec: QueueSpec) -> WorkQueue:
        return WorkQueue(self.engine, spec, lease_seconds=self.settings().lease_seconds)

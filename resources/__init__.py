"""Dagster resources: thin wrappers that hand the core (``pipeline``) its settings."""

from resources.database import PipelineDatabase

__all__ = ["PipelineDatabase"]

"""Alembic migrations of the pipeline schema; applied by `pipeline db upgrade`."""
